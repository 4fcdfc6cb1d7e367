#!/usr/bin/env bash
# scripts/get-traces.sh --from, offline: from checkouts of the three upstream repositories
# as they stand (alibaba/clusterdata, hkust-adsl/kubernetes-scheduler-simulator,
# stanford-futuredata/gavel), several --from at once, every file copied to its place
# unchanged; a file none of them has is named with both paths it was looked for at, and
# the run fails; a --from folder that does not exist is refused at once.
set -euo pipefail
script="$(cd "$(dirname "$0")/.." && pwd)/scripts/get-traces.sh"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

alibaba=$work/clusterdata/cluster-trace-gpu-v2023/csv
fgd=$work/fgd/experiments/analysis/expected_results
gavel=$work/gavel/scheduler/traces/msr/seed=0
mkdir -p "$alibaba" "$fgd" "$gavel"
for f in openb_node_list_gpu_node openb_pod_list_default openb_pod_list_gpushare100; do echo "$f,1,2,3" > "$alibaba/$f.csv"; done
for f in analysis_allo_discrete analysis_frag_ratio_discrete; do echo "$f,0.5" > "$fgd/$f.csv"; done
for vc in 0e4a51 103959 11cb48 23dbec 2869ce 51b7ef 6214e9 6c71a0 795a4c 7f04ca 925e2b b436b2 e13805 ed69ec ee9e8c; do
  printf '%s\t1\t2\n' "$vc" > "$gavel/$vc.trace"
done

out=$work/out
bash "$script" --dest "$out" --from "$work/clusterdata" --from "$work/fgd" --from "$work/gavel" > "$work/log" 2>&1 ||
  fail "copying from the three checkouts: $(cat "$work/log")"
grep -q "all 20 file(s) in $out" "$work/log" || fail "not all 20 files: $(cat "$work/log")"
cmp -s "$alibaba/openb_pod_list_gpushare100.csv" "$out/openb/openb_pod_list_gpushare100.csv" || fail "pod list changed"
cmp -s "$fgd/analysis_allo_discrete.csv" "$out/openb/fgd-expected/analysis_allo_discrete.csv" || fail "FGD figures changed"
cmp -s "$gavel/ee9e8c.trace" "$out/philly-vc/ee9e8c.trace" || fail "Philly trace changed"

# A folder laid out as the tools read it works as --from too (the output of the run above).
bash "$script" --dest "$work/again" --from "$out" > "$work/log" 2>&1 || fail "from a traces/ folder: $(cat "$work/log")"

# One missing: named, with both paths; the others still copied; the run fails.
rm "$gavel/6214e9.trace"
if bash "$script" --dest "$work/partial" --from "$work/clusterdata" --from "$work/fgd" --from "$work/gavel" > "$work/log" 2>&1; then
  fail "a missing file did not fail the run"
fi
grep -q "philly-vc/6214e9.trace: not in .* (as philly-vc/6214e9.trace or scheduler/traces/msr/seed=0/6214e9.trace)" "$work/log" ||
  fail "the missing file is not named with both paths: $(cat "$work/log")"
grep -q "19 of 20 file(s)" "$work/log" || fail "the others were not copied: $(cat "$work/log")"

# A --from folder that does not exist.
set +e
bash "$script" --dest "$work/none" --from "$work/nowhere" > "$work/log" 2>&1
rc=$?
set -e
[ "$rc" -eq 2 ] || fail "--from a missing folder exited $rc"
grep -q "no such folder" "$work/log" || fail "--from a missing folder: $(cat "$work/log")"
echo "get-traces.sh --from: ok"
