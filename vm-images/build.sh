#!/bin/bash
# Builds the raccel test guest: the Debian kernel installed on this host and a busybox
# initramfs that carries the virtio modules, a static raccel-guestd and the sample
# programs (raccel-run). Boots in a few seconds under QEMU TCG (vm-images/boot.sh).
#
#   vm-images/build.sh [--build DIR] [--out DIR] [--kernel VERSION] [--if-possible]
#
# --if-possible: when the kernel or busybox-static is missing, write the reason to
# OUT/MISSING and succeed (the build then has no guest, and the VM tests skip saying why).
#
# Needs (Debian packages): linux-image-amd64, busybox-static, cpio, binutils; and the static
# programs from the CMake build (targets raccel-guestd-static, raccel-run-static).
# Writes OUT/initramfs.cpio.gz and OUT/kernel (a copy of /boot/vmlinuz-VERSION).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
build="$here/../build"
out=""
kver=""
if_possible=0
usage() { sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --kernel) kver="$2"; shift 2 ;;
    --if-possible) if_possible=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "build.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
build=$(cd "$build" && pwd)
out=${out:-$build/vm}
mkdir -p "$out"
rm -f "$out/MISSING"
die() { echo "build.sh: $*" >&2; exit 1; }
# A missing prerequisite of the host (not a fault of the build).
missing() {
  if [ "$if_possible" = 1 ]; then
    echo "$*" > "$out/MISSING"
    echo "build.sh: no guest image: $*" >&2
    exit 0
  fi
  die "$*"
}

if [ -z "$kver" ]; then
  kver=$(ls /boot/vmlinuz-* 2>/dev/null | sed 's|/boot/vmlinuz-||' | sort -V | tail -1)
  [ -n "$kver" ] || missing "no kernel in /boot: apt-get install linux-image-amd64"
fi
[ -r "/boot/vmlinuz-$kver" ] || die "/boot/vmlinuz-$kver is missing or unreadable"
moddir="/lib/modules/$kver"
[ -d "$moddir" ] || missing "$moddir is missing (the kernel's modules)"
busybox=$(command -v busybox || ls /bin/busybox 2>/dev/null || true)
[ -n "$busybox" ] && ! readelf -l "$busybox" 2>/dev/null | grep -q "program interpreter" ||
  missing "need a statically linked busybox: apt-get install busybox-static"
for p in raccel-guestd-static raccel-run-static; do
  [ -x "$build/bin/$p" ] || die "$build/bin/$p is missing: cmake --build $build --target $p"
done

root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
mkdir -p "$root"/{bin,dev,proc,sys,run/raccel,tmp,lib/modules}
cp "$busybox" "$root/bin/busybox"
ln -s busybox "$root/bin/sh"
# Copies kernel module $1 into the image, uncompressed; returns 1 when the kernel has none.
copy_module() {
  local f
  f=$(find "$moddir" -name "$1.ko*" | head -1)
  [ -n "$f" ] || return 1
  case "$f" in
    *.ko.xz) xz -dc "$f" > "$root/lib/modules/$1.ko" ;;
    *.ko.zst) zstd -dqc "$f" > "$root/lib/modules/$1.ko" ;;
    *.ko.gz) gzip -dc "$f" > "$root/lib/modules/$1.ko" ;;
    *) cp "$f" "$root/lib/modules/$1.ko" ;;
  esac
}
for m in virtio_ring virtio virtio_pci_modern_dev virtio_pci_legacy_dev virtio_pci virtio_console; do
  copy_module "$m" || die "module $m not found under $moddir"
done
# 9p over virtio, for a guest that runs programs from the host's root (boot.sh --share):
# optional, copied where the kernel has them.
for m in netfs fscache 9pnet 9pnet_virtio 9p; do
  copy_module "$m" || echo "build.sh: no $m module; the guest cannot mount a shared folder" >&2
done
strip -o "$root/bin/raccel-guestd" "$build/bin/raccel-guestd-static"
strip -o "$root/bin/raccel-run" "$build/bin/raccel-run-static"
install -m 0755 "$here/guest-init.sh" "$root/init"

# Unmodified OpenCL programs: the raccel ICD, Debian's ICD loader (ocl-icd), clinfo and
# ocl_smoke (a plain -lOpenCL program), with every shared library they load and the
# dynamic linker. The loader finds the ICD through /etc/OpenCL/vendors/raccel.icd.
icd="$build/lib/libraccel-opencl.so"
if [ -f "$icd" ] && [ -x "$build/bin/ocl_smoke" ]; then
  mkdir -p "$root/usr/lib/raccel" "$root/etc/OpenCL/vendors"
  cp "$icd" "$root/usr/lib/raccel/"
  echo /usr/lib/raccel/libraccel-opencl.so > "$root/etc/OpenCL/vendors/raccel.icd"
  strip -o "$root/bin/ocl_smoke" "$build/bin/ocl_smoke"
  programs=("$icd" "$build/bin/ocl_smoke")
  if command -v clinfo > /dev/null; then
    cp "$(command -v clinfo)" "$root/bin/clinfo"
    programs+=("$(command -v clinfo)")
  fi
  # ldd's lines "NAME => PATH (0x...)" and "PATH (0x...)", read whole: a path may hold
  # spaces (a checkout under a folder with one).
  while IFS= read -r lib; do
    mkdir -p "$root$(dirname "$lib")"
    cp -L "$lib" "$root$lib"
  done < <(ldd "${programs[@]}" 2>/dev/null |
           sed -n -e 's/^[[:space:]]*[^[:space:]]* => \(\/.*\) (0x[0-9a-f]*)$/\1/p' -e 's/^[[:space:]]*\(\/.*\) (0x[0-9a-f]*)$/\1/p' |
           sort -u)
  # Not every dynamic linker path ldd prints is the one the programs ask for.
  mkdir -p "$root/lib64"
  cp -L /lib64/ld-linux-x86-64.so.2 "$root/lib64/" 2>/dev/null || true
fi

(cd "$root" && find . | LC_ALL=C sort | cpio -o -H newc --quiet) | gzip -1 > "$out/initramfs.cpio.gz.tmp"
mv "$out/initramfs.cpio.gz.tmp" "$out/initramfs.cpio.gz"
cp "/boot/vmlinuz-$kver" "$out/kernel"
echo "build.sh: guest for kernel $kver in $out ($(du -h "$out/initramfs.cpio.gz" | cut -f1) initramfs)"
