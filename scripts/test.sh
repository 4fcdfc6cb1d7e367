#!/usr/bin/env bash
# Sets up, builds and runs every test (unit, cross-process integration, bench smoke).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
ctest --test-dir build --output-on-failure -j "$(nproc)" --timeout 300
