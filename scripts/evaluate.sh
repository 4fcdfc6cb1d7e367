#!/usr/bin/env bash
# The scheduler's trace-driven evaluation (issue 6): sets up and builds like the demo,
# fetches the traces (scripts/get-traces.sh; into traces/ or $RACCEL_TRACES), then runs
# raccel-sim report over them (openb packing, Philly VCs) and
# writes report.md, a CSV of every figure and SVG plots into sim-report/ (or $1).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
out=${1:-sim-report}
traces=${RACCEL_TRACES:-traces}
if ! bash scripts/get-traces.sh --dest "$traces"; then
  echo "evaluate.sh: the traces are not all at $traces (see scripts/get-traces.sh --help)" >&2
  exit 2
fi
build/bin/raccel-sim report --out "$out" --openb "$traces/openb" --traces "$traces/philly-vc"
echo "== evaluation written to $out/ (start with $out/report.md)"
