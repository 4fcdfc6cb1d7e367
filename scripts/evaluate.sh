#!/usr/bin/env bash
# The scheduler's trace-driven evaluation (issue 6): sets up and builds like the demo,
# then runs raccel-sim report over ../shared/traces (openb packing, Philly VCs) and
# writes report.md, a CSV of every figure and SVG plots into sim-report/ (or $1).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
out=${1:-sim-report}
traces=${RACCEL_TRACES:-../shared/traces}
if [ ! -d "$traces/openb" ] || [ ! -d "$traces/philly-vc" ]; then
  echo "evaluate.sh: no traces at $traces (set RACCEL_TRACES to the folder holding openb/ and philly-vc/)" >&2
  exit 2
fi
build/bin/raccel-sim report --out "$out" --openb "$traces/openb" --traces "$traces/philly-vc"
echo "== evaluation written to $out/ (start with $out/report.md)"
