#!/usr/bin/env bash
# PyOpenCL's own test suite through the raccel platform and through local PoCL, file by
# file, and the pass/fail/skip counts of both side by side.
#
#   scripts/pyopencl-suite.sh TEST_DIR [FILE...]
#
# TEST_DIR is the test/ folder of PyOpenCL's source at the version Debian ships
# (2022.3.1: `git archive v2022.3.1 test` of github.com/inducer/pyopencl). Needs Debian's
# python3-pyopencl and python3-pytest, and a running pool: RACCEL_SOCKET names the
# raccel-guestd socket (default /run/raccel/guestd.sock), OCL_ICD_VENDORS a folder with
# raccel.icd (default build/icd), RACCEL_TFLOPS the size of each test's vaccel. Every
# test's context is a vaccel: give the pool blocks for dozens at once (a card of 64
# TFLOPS, RACCEL_TFLOPS=1), and its netaccel `sandbox_call_timeout_ms = 120000`:
# test_array's 2 GiB float64 kernels take 25-31 s on a 2-core machine, past the default
# 30 s after which a tenant's sandbox whose kernels make no progress is stopped.
set -euo pipefail
if [ $# -lt 1 ] || [ "$1" = "--help" ]; then
  sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'
  exit $([ $# -lt 1 ] && echo 2 || echo 0)
fi
cd "$(dirname "$0")/.."
tests=$(cd "$1" && pwd)
shift
files=("$@")
[ ${#files[@]} -gt 0 ] || files=(test_wrapper.py test_enqueue_copy.py test_arrays_in_structs.py test_clmath.py test_clrandom.py
                                  test_algorithm.py test_array.py)
vendors=${OCL_ICD_VENDORS:-$PWD/build/icd}
out=$(mktemp -d /tmp/pyopencl-suite-XXXXXX)
export PYOPENCL_NO_CACHE=1 POCL_CACHE_DIR="$out/pocl-cache"
counts() {  # pytest's last line, as "passed failed skipped"
  local line=$1
  for what in passed failed skipped; do
    n=$(grep -o "[0-9]* $what" <<<"$line" | cut -d' ' -f1 || true)
    printf '%s ' "${n:-0}"
  done
}
printf '%-28s %-24s %-24s\n' file "local PoCL (pass fail skip)" "raccel (pass fail skip)"
for f in "${files[@]}"; do
  (cd "$tests" && PYOPENCL_TEST=portable timeout 1800 /usr/bin/python3 -m pytest -q -p no:cacheprovider -rfE "$f" \
    >"$out/pocl-$f.log" 2>&1) || true
  (cd "$tests" && OCL_ICD_VENDORS=$vendors PYOPENCL_TEST=raccel timeout 1800 /usr/bin/python3 -m pytest -q -p no:cacheprovider \
    -rfE "$f" >"$out/raccel-$f.log" 2>&1) || true
  printf '%-28s %-24s %-24s\n' "$f" "$(counts "$(tail -1 "$out/pocl-$f.log")")" "$(counts "$(tail -1 "$out/raccel-$f.log")")"
done
echo "logs: $out (each file's failures are listed at the end of its log)"
