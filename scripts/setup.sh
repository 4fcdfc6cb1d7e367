#!/usr/bin/env bash
# Installs what raccel needs on Debian 12 (apt-get, as root or through sudo) and builds
# it into ./build. Safe to run again: it only installs what is missing and rebuilds
# what changed.
set -euo pipefail
cd "$(dirname "$0")/.."

# Backends: OpenCL (ICD loader, headers, PoCL as a real CPU device), XRT for FPGA cards.
# CUDA is used when its toolkit is at /usr/local/cuda (not a Debian package).
# VMs: QEMU, the Debian kernel and busybox-static for the test guest (vm-images/), and
# libvirt for the scheduler's libvirt watcher (its tests use test:///default, no daemon).
# SQLite: the scheduler's state database.
# PyTorch (Debian's 1.13) and pybind11: the Python binding and the torch device (vmfrontend/python).
# gperftools' tcmalloc (libgoogle-perftools-dev): the sandbox's malloc (netaccel/CMakeLists.txt).
# Many hosts, one pool: etcd (etcd-server, and etcd-client's etcdctl for operators), its
# .proto files (golang-etcd-server-dev) compiled with protobuf and gRPC C++.
# HTTP: libmicrohttpd (the daemons' /metrics and web console), nlohmann-json (the console's
# JSON); for tests, cpp-httplib (client), Prometheus (a real scraper, promtool), Chromium
# with chromedriver and Selenium (the web console in a real browser).
packages=(cmake ninja-build g++ pkg-config capnproto libcapnp-dev libuv1-dev libgtest-dev
  libsqlite3-dev libssl-dev openssl libseccomp-dev ocl-icd-opencl-dev opencl-headers pocl-opencl-icd libxrt-dev uuid-dev
  qemu-system-x86 linux-image-amd64 busybox-static cpio libvirt-dev libvirt-clients libclang-rt-14-dev python3
  clinfo python3-pyopencl python3-numpy python3-torch libtorch-dev pybind11-dev python3-pybind11
  libgoogle-perftools-dev libmicrohttpd-dev nlohmann-json3-dev libcpp-httplib-dev prometheus chromium chromium-driver python3-selenium
  etcd-server etcd-client golang-etcd-server-dev libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "setup: installing ${missing[*]}"
  $sudo apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# RACCEL_CMAKE_ARGS: more cmake arguments for ./build (scripts/test.sh passes some).
# shellcheck disable=SC2086
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo ${RACCEL_CMAKE_ARGS:-} > build-configure.log 2>&1 || {
  cat build-configure.log
  exit 1
}
rm -f build-configure.log
cmake --build build -j "$(nproc)"

# The Python package (raccel, raccel.torch) where Debian's python3 finds it.
if [ -d build/python/raccel ]; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo cmake --install build --component python > /dev/null
fi
