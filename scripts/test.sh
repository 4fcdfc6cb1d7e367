#!/usr/bin/env bash
# Sets up, builds and runs every test (unit, cross-process integration, bench smoke),
# then builds the whole suite again with AddressSanitizer and UndefinedBehaviorSanitizer
# (build-asan/) and runs it there too, with the fuzz targets over their seed corpus.
# RACCEL_SKIP_SANITIZERS=1 runs the first half only.
set -euo pipefail
cd "$(dirname "$0")/.."
# The suite's build keeps line tables only (RACCEL_DEBUG_INFO=lines, -g1): failures still
# print file:line, and on 2 cores it compiles a third faster than with full -g.
RACCEL_CMAKE_ARGS=-DRACCEL_DEBUG_INFO=lines bash scripts/setup.sh
# The trace-driven tests read traces/ (scripts/get-traces.sh); without them they skip.
bash scripts/get-traces.sh > get-traces.log 2>&1 || echo "== no traces (see get-traces.log): the trace-driven tests skip"
ctest --test-dir build --output-on-failure -j "$(nproc)" --timeout 300
[ "${RACCEL_SKIP_SANITIZERS:-0}" = 1 ] && exit 0

echo "== the same suite under AddressSanitizer + UndefinedBehaviorSanitizer (build-asan/)"
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DRACCEL_SANITIZE=ON > build-asan-configure.log 2>&1 || {
  cat build-asan-configure.log
  exit 1
}
rm -f build-asan-configure.log
cmake --build build-asan -j "$(nproc)"
# Paths quoted: the sanitizers' option parser splits at spaces (a checkout's path may hold one).
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:suppressions='$PWD/tests/fuzz/asan.supp'"
export LSAN_OPTIONS="suppressions='$PWD/tests/fuzz/lsan.supp':print_suppressions=0"
# The tests whose own process opens PoCL (see below).
POCL_IN_PROCESS='sandboxed_opencl|/opencl0|^Backends\.Opencl|^PoclBasic\.|^Sandbox\.'
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
ctest --test-dir build-asan --output-on-failure -j "$(nproc)" --timeout 600 -E "$POCL_IN_PROCESS"
# The conformance suite through a PoCL card, sandboxed or in the test's own process: a
# test process that opened PoCL may, at exit, have LeakSanitizer's thread-suspending
# tracer crash reading a bogus dynamic-TLS range ("Tracer caught signal 11" after the
# test passed): every sandboxed one did under a PoCL cache of the build's own, and an
# in-process one (TensorElementwiseOps.../opencl0) once in a CI run on 2026-11-30, and
# Backends.OpenclDevicesOpen... and Backends.OpenclImagesOfBuffers... every time in the
# CI run of 2026-12-01 morning, once the kernel source had grown (a DTLS block of
# 0xcc8-0x800001dca in the tracer's log), and PoclBasic.PostedKernels... in the CI run of
# 2026-12-01 evening (POCL_DEVICES=basic: sandbox_test's own process opens PoCL to
# discover its devices, so every Sandbox.* test goes here). These run without scanning
# thread-local storage (use_tls=0), which can only report more leaks, never hide one; lsan-notls.supp adds the
# few glibc keeps there.
LSAN_OPTIONS="suppressions='$PWD/tests/fuzz/lsan-notls.supp':print_suppressions=0:use_tls=0" \
  ctest --test-dir build-asan --output-on-failure -j "$(nproc)" --timeout 600 -R "$POCL_IN_PROCESS"
