// raccel-scheduler's configuration. Parsed once in main(); plain values afterwards.
//
//   node_listen = 127.0.0.1:7700          # netaccels connect here (TCP)
//   console = /run/raccel/console.sock    # raccelctl (unix socket, mode 0600)
//   block_tflops = 1
//   heartbeat_timeout_ms = 5000           # a silent netaccel is declared lost after this
//   request_timeout_ms = 600000           # a read/fence unanswered this long fails
//   split_min_mflop = 8                   # built-in ops smaller than this run on one card
//   [vm]                                  # one per VM; identity = its socket
//   name = vm1
//   socket = /run/raccel/vm/vm1.sock      # QEMU's virtio-serial chardev connects here
//   tflops = 16                           # most the VM's programs may hold together
//   priority = 0                          # highest priority its programs may ask for
//   kinds = gpu,npu,fpga,cpu              # card kinds it may use
//   memory_quota = 2GiB                   # device memory its programs may hold together
#pragma once

#include <string>
#include <vector>

#include "common/config.h"
#include "scheduler/pool.h"

namespace raccel::scheduler {

struct VmPolicy {
  std::string name;
  std::string socket;
  double tflops = 16;
  int priority = 0;
  KindMask kinds = kAllKinds;
  unsigned long long memoryQuota = 2ull << 30;
};

struct SchedulerConfig {
  std::string nodeListen = "127.0.0.1:7700";
  std::string console = "/run/raccel/console.sock";
  double blockTflops = 1;
  unsigned heartbeatTimeoutMs = 5000;
  unsigned requestTimeoutMs = 600000;
  // A built-in op on a multi-card vaccel is split across its cards only from this much
  // work up (gemm 2mnk, axpy 2n, vadd and reduceSum n); below it the copies and fences
  // cost more than the cards save, and the op runs whole on the primary.
  double splitMinMflop = 8;
  std::vector<VmPolicy> vms;
};

Result<SchedulerConfig> parseConfig(const Config& config);
// A VM from a one-line spec "name=vm1,socket=/path,tflops=8,priority=1,kinds=gpu|cpu,memory_quota=1GiB".
Result<VmPolicy> parseVmSpec(const std::string& spec);
std::string kindsToString(KindMask kinds);

}  // namespace raccel::scheduler
