#!/usr/bin/env bash
# The checks that need an NVIDIA GPU, on a machine that has one. Build here, then pack
# the build for it (scripts/gpu-checks.sh --pack: build-gpu/ holds the programs, their
# libraries, libraccel.so with the static libraries it links, and run.sh, which puts
# them on PATH and LD_LIBRARY_PATH there). On the GPU machine, from the repository root:
#   bash build-gpu/run.sh bash scripts/gpu-checks.sh
# In order, each step with its own time limit and all within GPU_CHECKS_SECONDS (540);
# a failed step does not stop the later ones:
#   1. raccel-bench --only cuda: gemm beside cuBLAS called directly, 1 GiB through both
#      hops beside a page-locked copy and the node link's own figure, the sync round
#      trip, fair share on the GPU;
#   2. hal_cuda_test: the hal's conformance suite (buffers, built-ins, tensor kernels
#      against the CPU's reference) on the GPU;
#   3. PyTorch (the machine's python3, when it has torch): raccel.torch built against
#      that torch, a scheduler and a netaccel serving the GPU, the three reference
#      scripts (tests/torch) with --compare on the CUDA card (losses against the CPU's),
#      each op against the CPU (op_coverage.py), state dicts and round trips
#      (round_trips.py), then each step timed through raccel and through PyTorch's own
#      CUDA device;
#   4. isolation_test, failover_test and sandbox_test on the CUDA card (*/cuda cases).
# usage: bash scripts/gpu-checks.sh [--pack | --skip-torch | --only-torch]
# GPU_CHECKS_PYTHON and GPU_CHECKS_CARD name another interpreter and card for step 3
# (a dry run of it without a GPU). Logs go to $OUT (or /tmp/gpu-checks); a summary last.
set -uo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
  --help | -h) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
  --pack) exec bash scripts/gpu-pack.sh ;;
  --skip-torch | --only-torch | "") ;;
  *) echo "gpu-checks: unknown argument '$1' (try --help)" >&2; exit 2 ;;
esac
logs=${OUT:-/tmp/gpu-checks}
mkdir -p "$logs"
summary=()
fails=0
deadline=${GPU_CHECKS_SECONDS:-540}  # all steps together (the device tool's call has 600 s)
step() {  # step NAME SECONDS COMMAND...: at most SECONDS, and never past the deadline
  local name=$1 limit=$2
  shift 2
  local t0=$SECONDS verdict
  ((limit > deadline - SECONDS)) && limit=$((deadline - SECONDS))
  if ((limit < 20)); then
    verdict="SKIP  $name: no time left (GPU_CHECKS_SECONDS=$deadline)"
    echo "$verdict"
    summary+=("$verdict")
    fails=$((fails + 1))
    return
  fi
  if timeout "$limit" "$@" >"$logs/$name.log" 2>&1; then verdict="ok    $name ($((SECONDS - t0)) s)"
  else
    verdict="FAIL  $name ($((SECONDS - t0)) s, rc $?): $(grep -aE 'FAILED|Failure|rror|FAIL' "$logs/$name.log" | head -3 | tr '\n' ' ' | cut -c1-300)"
    fails=$((fails + 1))
  fi
  echo "$verdict"
  summary+=("$verdict")
}

if [[ ${1:-} != --only-torch ]]; then
  step bench_cuda 150 raccel-bench --only cuda
  grep -aE '^(cuda_|fair_share_error_cuda)' "$logs/bench_cuda.log" | sed 's/^/bench  /'
  step hal_cuda_test 90 hal_cuda_test
fi

torch_checks() {
  set -o pipefail
  local py=${GPU_CHECKS_PYTHON:-python3} pkg=/tmp/raccel-py/raccel run=/tmp/raccel-gpu-run
  local card=${GPU_CHECKS_CARD:-backend=cuda,device=0,kind=gpu}
  $py -c 'import torch' || { echo "gpu-checks: no torch in $py"; return 1; }
  rm -rf "$run" "$pkg"
  mkdir -p "$pkg" "$run"
  cp vmfrontend/python/raccel/*.py "$pkg/"
  cp build-gpu/python/libraccel.so "$pkg/"
  local pyinc tinc tlib abi ext
  pyinc=$($py -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
  tinc=$($py -c 'from torch.utils.cpp_extension import include_paths as i; print(" ".join("-I" + p for p in i()))')
  tlib=$($py -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')
  abi=$($py -c 'import torch; print(int(torch._C._GLIBCXX_USE_CXX11_ABI))')
  ext=$($py -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
  $py -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.is_available() and torch.cuda.get_device_name(0))'
  local cxx=(g++ -std=c++23 -O2 -fPIC -shared -D_GLIBCXX_USE_CXX11_ABI="$abi" -I. -I"$pyinc" $tinc -Wno-unused-parameter)
  # Linked as the build links them (vmfrontend/python/CMakeLists.txt): libraccel.so, then
  # the static libraries beneath it and the system libraries packed beside the build.
  local sys=/tmp/raccel-gpu-syslib/syslib
  local libs=(-L"$pkg" -lraccel build-gpu/python/libraccel_transport.a build-gpu/python/libraccel_common.a
    build-gpu/python/libraccel_schema.a "$sys"/libcapnp-0.9.2.so "$sys"/libkj-0.9.2.so "$sys"/libuv.so.1
    "$sys"/libssl.so.3 "$sys"/libcrypto.so.3 -Wl,-rpath,'$ORIGIN')
  "${cxx[@]}" vmfrontend/python/module.cc -o "$pkg/_raccel$ext" "${libs[@]}" || return 1
  "${cxx[@]}" vmfrontend/python/torch_*.cc -o "$pkg/_torch$ext" -L"$tlib" -ltorch -ltorch_cpu -lc10 -ltorch_python \
    -Wl,-rpath,"$tlib" "${libs[@]}" || return 1
  PYTHONPATH=/tmp/raccel-py $py -c 'import raccel.torch' || return 1
  local port=$((20000 + RANDOM % 10000))
  raccel-scheduler --insecure --node-listen 127.0.0.1:$port --console "$run/console.sock" --state-dir "$run/state" \
    --vm "name=gpu-vm,socket=$run/vm.sock,tflops=64,priority=1,memory_quota=16GiB" >"$logs/torch_scheduler.log" 2>&1 &
  local sched=$!
  raccel-netaccel --insecure --name gpu0 --scheduler 127.0.0.1:$port --discover none \
    --card "$card,tflops=32,memory=16GiB" >"$logs/torch_netaccel.log" 2>&1 &
  local node=$!
  for _ in $(seq 100); do
    raccelctl --socket "$run/console.sock" pool --json 2>/dev/null | grep -q '"total":32' && break
    sleep 0.1
  done
  export PYTHONPATH=/tmp/raccel-py RACCEL_SOCKET=$run/vm.sock RACCEL_TORCH_FALLBACKS=1
  local status=0 s
  for s in mlp cnn transformer; do
    echo "== $s --compare on the CUDA card"
    timeout 120 $py tests/torch/${s}_train.py --compare 2>&1 | grep -avE '^raccel.torch: fell back' | tail -8 || status=1
  done
  for s in op_coverage round_trips; do
    echo "== $s on the CUDA card"
    timeout 90 $py tests/torch/$s.py 2>&1 | tail -4 || status=1
  done
  local mlp_args=(--features 256 --hidden 512 --classes 10 --batch 256 --time 50)
  echo "== step times: raccel's CUDA card, then PyTorch's own CUDA device"
  timeout 120 $py tests/torch/mlp_train.py --device raccel "${mlp_args[@]}" 2>&1 | tail -2
  timeout 120 $py tests/torch/mlp_train.py --device cuda "${mlp_args[@]}" 2>&1 | tail -2
  for s in cnn transformer; do
    timeout 120 $py tests/torch/${s}_train.py --time 50 2>&1 | tail -3 | sed "s/^/$s /"
    timeout 120 $py tests/torch/${s}_train.py --device cuda --time 50 2>&1 | tail -2 | sed "s/^/$s /"
  done
  kill $node $sched 2>/dev/null
  wait 2>/dev/null
  return $status
}
if [[ ${1:-} != --skip-torch ]]; then
  export -f torch_checks
  export logs
  step torch 240 bash -c torch_checks
  sed 's/^/torch  /' "$logs/torch.log" | tail -40
fi

if [[ ${1:-} != --only-torch ]]; then
  step isolation_cuda 90 isolation_test --gtest_filter='*/cuda'
  step failover_cuda 90 failover_test --gtest_filter='*/cuda'
  step sandbox_cuda 90 sandbox_test --gtest_filter='*cuda*:*Cuda*'
fi

echo "== gpu checks: $fails failed; logs in $logs"
printf '%s\n' "${summary[@]}"
exit $((fails > 0))
