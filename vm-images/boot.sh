#!/bin/bash
# Boots the raccel test guest (vm-images/build.sh) under QEMU with a virtio-serial port
# named org.raccel.vaccel.0 whose host side is a unix socket.
#
#   vm-images/boot.sh --socket PATH [--mode bind|connect] [--log FILE] [--image DIR]
#                     [--memory MiB] [--timeout S] [-- JOB...]
#
#   --mode bind     QEMU creates the socket and the scheduler connects to it (the VM's
#                   [vm] section says attach = connect; libvirt's <source mode='bind'>).
#                   The default.
#   --mode connect  the scheduler listens on the socket and QEMU connects, retrying
#                   every second ([vm] attach = listen; libvirt's <source mode='connect'>).
#   JOB             run in the guest after raccel-guestd is up, e.g. raccel-run --opencl
#   --log FILE      the serial console (default: standard output)
#   --timeout S     kill QEMU after S seconds (default 300)
#   --share DIR     DIR (e.g. /) read-only over virtio-9p, mounted at /host in the guest
#                   with raccel-guestd's socket at /host/run/raccel/guestd.sock, so a
#                   job can `chroot /host` and run the host's programs
#
# Uses TCG: /dev/kvm may exist, but guests hang under it on the build machines. Set
# RACCEL_QEMU_ACCEL=kvm where KVM really works. The exit status is the job's (from the
# "raccel-guest: exit N" line), 124 on timeout, 125 when the guest printed no verdict.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
image="$here/../build/vm"
socket=""
mode=bind
log=""
memory=256
timeout=300
share=""
usage() { sed -n '2,23p' "$0" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
  case "$1" in
    --socket) socket="$2"; shift 2 ;;
    --mode) mode="$2"; shift 2 ;;
    --log) log="$2"; shift 2 ;;
    --image) image="$2"; shift 2 ;;
    --memory) memory="$2"; shift 2 ;;
    --timeout) timeout="$2"; shift 2 ;;
    --share) share="$2"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    --) shift; break ;;
    *) echo "boot.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[ -n "$socket" ] || { echo "boot.sh: --socket PATH is required (see --help)" >&2; exit 2; }
case "$mode" in
  bind) chardev="socket,id=raccel,path=$socket,server=on,wait=off" ;;
  connect) chardev="socket,id=raccel,path=$socket,server=off,reconnect=1" ;;
  *) echo "boot.sh: --mode must be bind or connect" >&2; exit 2 ;;
esac
for f in kernel initramfs.cpio.gz; do
  [ -r "$image/$f" ] || { echo "boot.sh: $image/$f is missing: run vm-images/build.sh first" >&2; exit 2; }
done
qemu=$(command -v qemu-system-x86_64 || true)
[ -n "$qemu" ] || { echo "boot.sh: qemu-system-x86_64 not found: apt-get install qemu-system-x86" >&2; exit 2; }

console=$(mktemp)
append="console=ttyS0 quiet panic=-1"
# The job travels base64-encoded in one kernel parameter: the kernel hands init at most
# 32 words, and would read '=' and quotes itself.
[ $# -gt 0 ] && append="$append raccel.job=$(printf '%s' "$*" | base64 -w0)"
extra=()
if [ -n "$share" ]; then
  append="$append raccel.share=1"
  extra=(-cpu max -virtfs "local,path=$share,mount_tag=hostroot,security_model=none,readonly=on")
fi
set +e
timeout --foreground -k 5 "$timeout" "$qemu" -accel "${RACCEL_QEMU_ACCEL:-tcg}" -m "$memory" -smp 1 \
  -kernel "$image/kernel" -initrd "$image/initramfs.cpio.gz" -append "$append" \
  -display none -monitor none -no-reboot -serial "file:$console" \
  -device virtio-serial-pci,id=vser -chardev "$chardev" \
  -device virtserialport,bus=vser.0,chardev=raccel,name=org.raccel.vaccel.0 "${extra[@]}" &
qpid=$!
trap 'kill $qpid ${tpid:-} 2>/dev/null || true; rm -f "$console"' EXIT
trap 'exit 143' TERM INT
if [ -n "$log" ]; then : > "$log"; tail -q -F "$console" 2>/dev/null >> "$log" & tpid=$!
else tail -q -F "$console" 2>/dev/null & tpid=$!; fi
wait $qpid
qrc=$?
sleep 0.3
kill $tpid 2>/dev/null
set -e
[ $qrc -eq 124 ] && { echo "boot.sh: the guest ran past ${timeout}s" >&2; exit 124; }
code=$(sed -n 's/^raccel-guest: exit \([0-9]*\).*/\1/p' "$console" | tail -1)
[ -n "$code" ] || { echo "boot.sh: the guest printed no verdict (QEMU exit $qrc)" >&2; exit 125; }
exit "$code"
