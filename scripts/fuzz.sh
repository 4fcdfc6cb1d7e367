#!/usr/bin/env bash
# Fuzzes raccel's trust boundaries with libFuzzer (tests/fuzz/): the frame reader, a
# real scheduler + netaccel fed raw bytes on a VM socket, the node port and the console,
# and the hal's checks of a guest's tensor ops and launches (run on a CPU device), and
# the byte form of OpenCL compilation units.
# Builds build-fuzz/ (AddressSanitizer + UndefinedBehaviorSanitizer, coverage for
# libFuzzer), then runs each target for a bounded time, starting from the seed corpus
# in tests/fuzz/corpus (new inputs go to build-fuzz/corpus/, the repository is not
# touched). Prints each target's execution count; exits 1 on the first crash, leak or
# sanitizer report, naming the input that caused it.
#
#   scripts/fuzz.sh [--seconds N] [--runs N] [TARGET...]
#     --seconds N   time per target (default 300)
#     --runs N      stop a target after N executions (default: time only)
#     TARGET        frames, guest, node, console, tensor, launch, units (default: all seven)
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=300 runs=-1 targets=()
while (($#)); do
  case "$1" in
    --seconds) seconds=$2; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    -h|--help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    frames|guest|node|console|tensor|launch|units) targets+=("$1"); shift ;;
    *) echo "fuzz.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
((${#targets[@]})) || targets=(frames guest node console tensor launch units)

bash scripts/setup.sh >/dev/null  # packages (libclang-rt-14-dev holds libFuzzer) and the normal build
cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DRACCEL_SANITIZE=ON -DRACCEL_FUZZ_COVERAGE=ON >/dev/null
cmake --build build-fuzz -j "$(nproc)" --target $(printf 'fuzz_%s ' "${targets[@]}")
export POCL_CACHE_DIR="$PWD/build-fuzz/pocl-cache"
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"

status=0
for t in "${targets[@]}"; do
  work="build-fuzz/corpus/$t" artifacts="build-fuzz/artifacts/$t/"
  mkdir -p "$work" "$artifacts"
  log="build-fuzz/fuzz-$t.log"
  echo "== fuzz_$t for ${seconds}s (log: $log)"
  set +e
  build-fuzz/bin/fuzz_$t "$work" "tests/fuzz/corpus/$t" -max_total_time="$seconds" -runs="$runs" \
    -timeout=60 -rss_limit_mb=4096 -max_len=16384 -print_final_stats=1 -artifact_prefix="$artifacts" >"$log" 2>&1
  rc=$?
  set -e
  execs=$(grep -h "stat::number_of_executed_units" "$log" | awk '{s += $2} END {print s + 0}')
  echo "fuzz_$t: $execs executions, exit $rc"
  if ((rc != 0)); then
    grep -m1 -E "ERROR: (AddressSanitizer|libFuzzer|UndefinedBehaviorSanitizer)|runtime error|Test unit written" "$log" || true
    ls "$artifacts" 2>/dev/null | sed 's/^/  input: /'
    status=1
  fi
done
exit $status
