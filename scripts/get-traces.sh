#!/usr/bin/env bash
# Fetches the public cluster traces the scheduler's evaluation (raccel-sim, sim_test,
# scripts/evaluate.sh) reads, into traces/ of this checkout (or $RACCEL_TRACES, or
# --dest DIR), laid out as:
#   openb/openb_node_list_gpu_node.csv, openb/openb_pod_list_NAME.csv
#       Alibaba's cluster-trace-gpu-v2023 (github.com/alibaba/clusterdata)
#   openb/fgd-expected/analysis_{allo,frag_ratio}_discrete.csv
#       FGD's published figures (github.com/hkust-adsl/kubernetes-scheduler-simulator)
#   philly-vc/VC.trace
#       Microsoft Philly jobs per virtual cluster as Gavel prepared them, seed 0
#       (github.com/stanford-futuredata/gavel)
# From a local copy when there is one (--from DIR, or ../shared/traces beside the
# checkout), else downloaded with curl. A --from folder is laid out as above, or is a
# checkout of one of the three repositories as it stands (a file is looked for at its
# path in its repository too); --from may be given several times. Files already there
# are kept.
set -euo pipefail
cd "$(dirname "$0")/.."

usage() {
  cat <<'USAGE'
usage: scripts/get-traces.sh [--dest DIR] [--from DIR] [--all-lists]
  --dest DIR    where to put them (default: $RACCEL_TRACES, else traces/ here)
  --from DIR    copy from a folder laid out as above, or from a checkout of
                alibaba/clusterdata, hkust-adsl/kubernetes-scheduler-simulator or
                stanford-futuredata/gavel, instead of downloading (may be repeated)
  --all-lists   every openb pod list (24) rather than default and gpushare100
The tools read traces/ (or $RACCEL_TRACES) by default.
USAGE
}

dest=${RACCEL_TRACES:-traces}
from=()
lists="default gpushare100"
while [ $# -gt 0 ]; do
  case "$1" in
    --help|-h) usage; exit 0 ;;
    --dest) dest=${2:?--dest needs a folder}; shift 2 ;;
    --from)
      [ -d "${2:?--from needs a folder}" ] || { echo "get-traces.sh: --from $2: no such folder" >&2; exit 2; }
      from+=("$2"); shift 2 ;;
    --all-lists)
      lists="default gpushare20 gpushare40 gpushare60 gpushare80 gpushare100 multigpu20 multigpu30 multigpu40 multigpu50
             gpuspec05 gpuspec10 gpuspec20 gpuspec25 gpuspec33 cpu0 cpu037 cpu050 cpu072 cpu100 cpu200 cpu235 cpu250 cpu300"
      shift ;;
    *) echo "get-traces.sh: unknown argument $1" >&2; usage >&2; exit 2 ;;
  esac
done
if [ ${#from[@]} -eq 0 ] && [ -d ../shared/traces/openb ]; then from=(../shared/traces); fi

alibaba=https://raw.githubusercontent.com/alibaba/clusterdata/master/cluster-trace-gpu-v2023/csv
fgd=https://raw.githubusercontent.com/hkust-adsl/kubernetes-scheduler-simulator/master/experiments/analysis/expected_results
gavel=https://raw.githubusercontent.com/stanford-futuredata/gavel/master/scheduler/traces/msr/seed=0
vcs="0e4a51 103959 11cb48 23dbec 2869ce 51b7ef 6214e9 6c71a0 795a4c 7f04ca 925e2b b436b2 e13805 ed69ec ee9e8c"

# The files wanted: "path-under-dest url".
wanted() {
  echo "openb/openb_node_list_gpu_node.csv $alibaba/openb_node_list_gpu_node.csv"
  for l in $lists; do echo "openb/openb_pod_list_$l.csv $alibaba/openb_pod_list_$l.csv"; done
  for f in analysis_allo_discrete analysis_frag_ratio_discrete; do echo "openb/fgd-expected/$f.csv $fgd/$f.csv"; done
  for vc in $vcs; do echo "philly-vc/$vc.trace $gavel/$vc.trace"; done
}

mkdir -p "$dest/openb/fgd-expected" "$dest/philly-vc"
total=$(wanted | wc -l)
n=0 got=0 failed=0
while read -r path url; do
  n=$((n + 1))
  if [ -s "$dest/$path" ]; then
    got=$((got + 1))
    continue
  fi
  if [ ${#from[@]} -gt 0 ]; then
    # Its path here, or in its own repository (the URL's path after the branch).
    upstream=${url#https://raw.githubusercontent.com/*/*/master/}
    source=""
    for dir in "${from[@]}"; do
      for candidate in "$dir/$path" "$dir/$upstream"; do
        if [ -z "$source" ] && [ -s "$candidate" ]; then source=$candidate; fi
      done
    done
    if [ -n "$source" ]; then
      cp "$source" "$dest/$path.part" && mv "$dest/$path.part" "$dest/$path"
      echo "[$n/$total] $path (copied from $source)"
      got=$((got + 1))
    else
      echo "[$n/$total] $path: not in ${from[*]} (as $path or $upstream)" >&2
      failed=$((failed + 1))
    fi
    continue
  fi
  if ! command -v curl > /dev/null; then
    echo "get-traces.sh: curl is needed to download (apt-get install curl), or give --from DIR" >&2
    exit 2
  fi
  if curl -fsSL --connect-timeout 10 --max-time 300 -o "$dest/$path.part" "$url" && [ -s "$dest/$path.part" ]; then
    mv "$dest/$path.part" "$dest/$path"
    echo "[$n/$total] $path ($(wc -c < "$dest/$path") bytes from $url)"
    got=$((got + 1))
  else
    rm -f "$dest/$path.part"
    echo "[$n/$total] $path: could not download $url" >&2
    failed=$((failed + 1))
  fi
done < <(wanted)
# No empty folders left behind: a folder of traces is there when it holds them.
rmdir "$dest/openb/fgd-expected" "$dest/philly-vc" 2>/dev/null || true
rmdir "$dest/openb" "$dest" 2>/dev/null || true
if [ "$failed" -eq 0 ]; then
  echo "get-traces.sh: all $total file(s) in $dest"
else
  echo "get-traces.sh: $got of $total file(s) in $dest; $failed missing (no network? give --from DIR)" >&2
fi
[ "$failed" -eq 0 ]
