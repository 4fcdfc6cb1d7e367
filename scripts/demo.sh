#!/usr/bin/env bash
# The main job, on one machine: a scheduler, two netaccels (node0: this machine's
# OpenCL device, found by discovery (PoCL's CPU device here), and a simulated GPU;
# node1: a CPU card), raccel-guestd standing in for a VM's guest side, and raccel-run
# programs that run gemms, the other built-ins and an OpenCL C kernel through it and
# check them; one spans all three cards, so its ops are split across them. Then the same
# program from inside a real VM: the test guest (vm-images/) booted under QEMU, its
# raccel-guestd on a virtio-serial port. Shows the console's view, then stops everything.
#
# RACCEL_SKIP_SETUP=1 skips the setup (the test Demo.TheMainJobRunsAndSaysOk, after
# scripts/test.sh has set up); RACCEL_BUILD names the build to run (default build).
set -euo pipefail
cd "$(dirname "$0")/.."
[ "${RACCEL_SKIP_SETUP:-0}" = 1 ] || bash scripts/setup.sh
build=${RACCEL_BUILD:-build}
bin="$build/bin"
run=$(mktemp -d /tmp/raccel-demo-XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$run"
}
trap cleanup EXIT
port=$((20000 + RANDOM % 12000))  # below the kernel's ephemeral ports (32768 and up), which outgoing connections take
http=$((port + 1))  # the scheduler's web console and /metrics; the netaccels' /metrics on the next two

echo "== the pool CA and certificates for the scheduler, node0 and node1 (mutual TLS on the node links)"
bash scripts/raccel-certs.sh all "$run/certs" node0 node1
tls() { echo --tls-ca "$run/certs/ca.pem" --tls-cert "$run/certs/$1.pem" --tls-key "$run/certs/$1.key"; }

echo "== starting raccel-scheduler (logs in $run)"
"$bin"/raccel-scheduler --node-listen 127.0.0.1:$port --console "$run/console.sock" --state-dir "$run/state" $(tls scheduler) \
  --http-listen 127.0.0.1:$http \
  --vm "name=demo-vm,socket=$run/demo-vm.sock,tflops=20,priority=1,memory_quota=2GiB" >"$run/scheduler.log" 2>&1 &
pids+=($!)
for _ in $(seq 50); do [ -S "$run/console.sock" ] && break; sleep 0.1; done

export POCL_CACHE_DIR="$(realpath "$build")/pocl-cache"
echo "== this machine's cards, as discovery sees them"
"$bin"/raccel-netaccel --list-devices
echo "== starting two raccel-netaccels"
# node0 serves the discovered OpenCL device, rated 4 TFLOPS (PoCL's measured rate is a
# fraction of one block) and a simulated GPU; node1 (same host) a CPU card and no discovery.
"$bin"/raccel-netaccel --name node0 --scheduler 127.0.0.1:$port $(tls node0) --http-listen 127.0.0.1:$((http + 1)) \
  --card kind=gpu,model=sim-gpu,tflops=8,memory=1GiB --card backend=opencl,tflops=4,memory=1GiB >"$run/node0.log" 2>&1 &
pids+=($!)
"$bin"/raccel-netaccel --name node1 --scheduler 127.0.0.1:$port $(tls node1) --http-listen 127.0.0.1:$((http + 2)) --discover none --card kind=cpu,tflops=8,memory=1GiB \
  >"$run/node1.log" 2>&1 &
pids+=($!)
for _ in $(seq 50); do
  "$bin"/raccelctl --socket "$run/console.sock" pool --json 2>/dev/null | grep -q '"total":20' && break
  sleep 0.1
done

echo "== starting raccel-guestd (the guest side of demo-vm)"
"$bin"/raccel-guestd --port "$run/demo-vm.sock" --listen "$run/guestd.sock" >"$run/guestd.log" 2>&1 &
pids+=($!)
for _ in $(seq 50); do [ -S "$run/guestd.sock" ] && break; sleep 0.1; done

"$bin"/raccelctl --socket "$run/console.sock" nodes
"$bin"/raccelctl --socket "$run/console.sock" cards

echo "== running guest programs"
"$bin"/raccel-run --socket "$run/guestd.sock" --size 640 --iterations 40 --tflops 6 --name long-gemm &
long=$!
sleep 0.5
"$bin"/raccelctl --socket "$run/console.sock" vaccels
"$bin"/raccelctl --socket "$run/console.sock" pool
status=0
"$bin"/raccel-run --socket "$run/guestd.sock" --size 256 --ops --tflops 2 --name ops || status=1
wait $long || status=1
echo "== one program over all three cards: split built-ins and an OpenCL C kernel routed to the OpenCL card"
"$bin"/raccel-run --socket "$run/guestd.sock" --size 384 --ops --opencl --tflops 20 --name wide || status=1
echo "== the same program inside a QEMU guest (virtio-serial port org.raccel.vaccel.0 -> demo-vm's socket)"
if [ -r "$build/vm/initramfs.cpio.gz" ]; then
  bash vm-images/boot.sh --image "$build/vm" --socket "$run/demo-vm.sock" --mode connect --timeout 180 \
    -- raccel-run --size 128 --ops --opencl --tflops 12 --name in-vm | grep -E "raccel-(run|guest):" || status=1
  "$bin"/raccelctl --socket "$run/console.sock" vms
else
  echo "(no guest image: $(cat "$build/vm/MISSING" 2>/dev/null || echo "$build/vm is empty"); skipped)"
fi
if [ $status -eq 0 ]; then echo "== demo OK"; else echo "== demo FAILED; logs:"; tail -n 20 "$run"/*.log; fi
exit $status
