#!/bin/sh
# /init of the raccel test guest (vm-images/build.sh puts it in the initramfs).
#
# Mounts the kernel's file systems, loads the virtio modules, starts raccel-guestd on
# the port named org.raccel.vaccel.0, then runs the job given on the kernel command line:
# raccel.job=BASE64 (what boot.sh passes: any shell text), or else the words after "--"
# (the kernel hands those to init as arguments, at most 32), e.g.
#   -append "console=ttyS0 -- raccel-run --size 128 --opencl"
# The job is run by sh, so "a && b" works. The job's output and a final line
#   raccel-guest: exit CODE
# go to the serial console; then the guest powers off.
/bin/busybox --install -s /bin
export PATH=/bin
# Shared libraries of the OpenCL programs (build.sh copies them where the host has them).
export LD_LIBRARY_PATH=/lib/x86_64-linux-gnu:/usr/lib/x86_64-linux-gnu
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mount -t tmpfs tmpfs /run
mkdir -p /run/raccel /tmp
echo 1 > /proc/sys/kernel/printk 2>/dev/null

for m in virtio_ring virtio virtio_pci_modern_dev virtio_pci_legacy_dev virtio_pci virtio_console; do
  insmod /lib/modules/$m.ko || echo "raccel-guest: insmod $m failed"
done

# A folder of the host shared over virtio-9p (boot.sh --share): mounted read-only at
# /host, with its own /run (where raccel-guestd's socket is bound), /proc and /dev, so a
# job can `chroot /host` and run the host's programs (python3 and torch) as the guest's.
# The host's /tmp stays visible: a checkout or build folder there is reachable.
if grep -q raccel.share=1 /proc/cmdline; then
  for m in netfs fscache 9pnet 9pnet_virtio 9p; do
    [ -f /lib/modules/$m.ko ] && { insmod /lib/modules/$m.ko 2>/dev/null || echo "raccel-guest: insmod $m failed"; }
  done
  mkdir -p /host
  if mount -t 9p -o trans=virtio,version=9p2000.L,ro,cache=loose,msize=512000 hostroot /host; then
    mount -t tmpfs tmpfs /host/run && mkdir -p /host/run/raccel && mount --bind /run/raccel /host/run/raccel
    mount -t proc proc /host/proc
    mount --bind /dev /host/dev
  else
    echo "raccel-guest: the shared folder could not be mounted"
  fi
fi

# The port appears once virtio_console has probed the device.
port=""
for i in $(seq 1 50); do
  for d in /sys/class/virtio-ports/*; do
    [ -r "$d/name" ] && [ "$(cat "$d/name")" = org.raccel.vaccel.0 ] && port=/dev/$(basename "$d")
  done
  [ -n "$port" ] && [ -e "$port" ] && break
  sleep 0.1
done
if [ -z "$port" ]; then
  echo "raccel-guest: no virtio port named org.raccel.vaccel.0 (ports: $(ls /sys/class/virtio-ports 2>/dev/null))"
  echo "raccel-guest: exit 3"
  poweroff -f
fi
echo "raccel-guest: port org.raccel.vaccel.0 is $port"

raccel-guestd --log-level "${RACCEL_GUESTD_LOG:-warn}" &
for i in $(seq 1 50); do
  [ -S /run/raccel/guestd.sock ] && break
  sleep 0.1
done

job="$*"
for word in $(cat /proc/cmdline); do
  case "$word" in
    raccel.job=*) job=$(echo "${word#raccel.job=}" | base64 -d) ;;
  esac
done

if [ -z "$job" ]; then
  echo "raccel-guest: no job on the kernel command line (after --); starting a shell"
  setsid cttyhack sh
  code=0
else
  echo "raccel-guest: running: $job"
  sh -c "$job"
  code=$?
fi
echo "raccel-guest: exit $code"
sync
poweroff -f
