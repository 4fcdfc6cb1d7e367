// raccel-scheduler's configuration. Parsed once in main(); plain values afterwards.
//
//   node_listen = 127.0.0.1:7700          # netaccels connect here (TCP)
//   node_advertise = HOST:PORT            # a pool shared through etcd: where netaccels that
//                                         #   find schedulers in etcd (scheduler = etcd) reach
//                                         #   this one (default: node_listen's host, its port)
//   console = /run/raccel/console.sock    # raccelctl (unix socket, mode 0600)
//   lane_socket = /run/raccel/lanes.sock  # netaccels on this host hand their same-host lanes
//                                         #   (shared memory for big frames) here; default:
//                                         #   lanes.sock beside the console socket; off = none
//   http_listen = 127.0.0.1:7780          # /metrics (Prometheus) and the web console; off = none
//   http_token_file = /etc/raccel/console.token  # the bearer token the web console's actions
//                                         #   need (16+ characters); none: read-only web console
//   http_client_timeout_s = 10            # an HTTP client must send its request within this
//   block_tflops = 1
//   heartbeat_timeout_ms = 5000           # a silent netaccel is declared lost after this
//   request_timeout_ms = 600000           # a read/fence unanswered this long fails
//   split_min_mflop = 8                   # built-in ops smaller than this run on one card
//   defrag_on_release = true              # compact (live-migrate vaccels) after a release
//   defrag_on_demand = true               # ... and when a request would be fragmented
//   defrag_moves_per_minute = 60          # rate limit for both and for raccelctl defrag
//   defrag_max_move_bytes = 1GiB          # vaccels with more buffer bytes are not moved
//   span_slack_nodes = -1                 # a vaccel waits rather than span more nodes than
//                                         #   the fewest that could hold it plus this; -1 = any
//   state_dir = /var/lib/raccel           # the state database (raccel.db, SQLite WAL): VM
//                                         #   policies, allocations, suspended vaccels, usage;
//                                         #   empty (the default) = nothing survives a restart
//   resume_grace_ms = 60000               # after a restart, how long a vaccel waits for its
//                                         #   netaccels and its guest to come back
//   startup_grace_ms = 5000               # after start, until a netaccel joins (or this
//                                         #   passes), a request the empty pool cannot hold
//                                         #   waits instead of being refused as "never"
//   tls_ca = /etc/raccel/ca.pem           # netaccel links: mutual TLS 1.3; a netaccel is admitted
//   tls_cert = /etc/raccel/scheduler.pem  #   only with a certificate of this CA, and its node name
//   tls_key = /etc/raccel/scheduler.key   #   is the certificate's (scripts/raccel-certs.sh)
//   insecure = false                      # true: plain TCP instead (loopback development only)
//   max_node_links = 256                  # connections on the node port at once
//   register_timeout_ms = 10000           # one that has not registered by then is closed
//   max_vm_links = 8                      # connections on one VM's socket at once
//   forget_offline_ms = 86400000          # an offline netaccel with nothing suspended or
//                                         #   recoverable on it is forgotten after this;
//                                         #   until then a request only it could hold waits
//   policy_clock_scale = 1                # the admission policy's clock runs this many times
//                                         #   faster than the wall clock (1 to 1e6; tests, demos)
//   name = host-a                         # this scheduler's name in a shared pool (default: the
//                                         #   host name; unique among the pool's schedulers)
//   etcd = 10.0.0.1:2379,10.0.0.2:2379    # join the pool shared through etcd with the schedulers
//                                         #   of other VM hosts (README "Many hosts, one pool");
//                                         #   empty (the default): this host's pool alone
//   etcd_prefix, etcd_lease_ttl, etcd_ca, etcd_cert, etcd_key   # common/etcd_settings.h
//   libvirt = qemu:///system              # follow this libvirt's domains: each one with
//                                         #   raccel metadata is a VM (vm-images/README.md)
//   [vm]                                  # one per VM; identity = its socket
//   name = vm1
//   socket = /run/raccel/vm/vm1.sock      # the VM's virtio-serial chardev socket
//   attach = listen                       # listen: the scheduler binds the socket and QEMU
//                                         #   connects (libvirt <source mode='connect'>);
//                                         # connect: QEMU binds it and the scheduler connects,
//                                         #   retrying while it is absent (mode='bind')
//   tflops = 16                           # most the VM's programs may hold together
//   priority = 0                          # highest priority its programs may ask for
//   kinds = gpu,npu,fpga,cpu              # card kinds it may use
//   memory_quota = 2GiB                   # device memory its programs may hold together
//   host_cpu = 0                          # CPU cores of a card's node each of its vaccels
//                                         #   needs (e.g. 1.5; 0 = none): it goes only to a
//                                         #   node whose host (netaccel host_cpu) has them left
//   host_memory = 0                       # and host memory (bytes, e.g. 8GiB; 0 = none)
//   failover = on                         # on: its vaccels survive a lost netaccel, rebuilt
//                                         #   on other cards from their lineage (README,
//                                         #   "What survives what"); off: they end unavailable
//   lineage_bytes = 64MiB                 # instruction bytes kept per vaccel between
//                                         #   checkpoints (1MiB to 4GiB)
#pragma once

#include <map>
#include <string>
#include <vector>

#include "common/config.h"
#include "common/etcd_settings.h"
#include "scheduler/pool.h"
#include "transport/tls.h"

namespace raccel::scheduler {

// A VM's TFLOPS may be set up to this (a pool holds at most limits::kMaxPoolBlocks).
constexpr double kMaxVmTflops = 1e9;

struct VmPolicy {
  enum class Attach { listen, connect };
  std::string name;
  std::string socket;
  Attach attach = Attach::listen;
  std::string source;  // where the policy came from: "--vm", "FILE:LINE", "libvirt URI"
  double tflops = 16;
  int priority = 0;
  KindMask kinds = kAllKinds;
  unsigned long long memoryQuota = 2ull << 30;
  // Host resources of a card's node that each of its vaccels needs (host_cpu in cores,
  // host_memory in bytes; 0 = none): a vaccel then goes only to a node with that room.
  uint64_t hostCpuMilli = 0;
  uint64_t hostMemoryMib = 0;
  // Failover (scheduler/lineage.h): its vaccels survive a lost netaccel, rebuilt from a
  // checkpoint and the instructions since, kept up to lineageBytes between checkpoints.
  bool failover = true;
  unsigned long long lineageBytes = 64ull << 20;
  bool operator==(const VmPolicy&) const = default;
};

struct SchedulerConfig {
  std::string nodeListen = "127.0.0.1:7700";
  std::string nodeAdvertise;  // empty: node_listen's host and the port it bound
  std::string console = "/run/raccel/console.sock";
  std::string laneSocket;  // "": lanes.sock beside the console socket; "off": no lanes
  // Where the lane socket goes ("" when off).
  std::string laneSocketPath() const {
    if (laneSocket == "off") return "";
    if (!laneSocket.empty()) return laneSocket;
    auto slash = console.rfind('/');
    return (slash == std::string::npos ? std::string(".") : console.substr(0, slash)) + "/lanes.sock";
  }
  std::string httpListen = "127.0.0.1:7780";  // "off": no HTTP
  std::string httpTokenFile;
  unsigned httpClientTimeoutS = 10;
  double blockTflops = 1;
  unsigned heartbeatTimeoutMs = 5000;
  unsigned requestTimeoutMs = 600000;
  // A built-in op on a multi-card vaccel is split across its cards only from this much
  // work up (gemm 2mnk, axpy 2n, vadd and reduceSum n); below it the copies and fences
  // cost more than the cards save, and the op runs whole on the primary.
  double splitMinMflop = 8;
  std::string libvirtUri;  // empty: no libvirt watcher
  // Compaction (live migration): after a release, and when a request would only be
  // served fragmented; at most this many moves a minute, of vaccels with at most this
  // many bytes of buffers.
  bool defragOnRelease = true;
  bool defragOnDemand = true;
  int spanSlackNodes = -1;
  unsigned defragMovesPerMinute = 60;
  unsigned long long defragMaxMoveBytes = 1ull << 30;
  // Durable state: empty = none (a restart ends every session).
  std::string stateDir;
  unsigned resumeGraceMs = 60000;
  unsigned startupGraceMs = 5000;
  // Bounds on what peers can make the scheduler hold (connections, silence, offline nodes).
  transport::LinkSecurity security;
  unsigned maxNodeLinks = 256;
  unsigned registerTimeoutMs = 10000;
  unsigned maxVmLinks = 8;
  uint64_t forgetOfflineMs = 86400000;
  // How many times faster than the wall clock the admission policy's clock runs (its
  // service classes and starvation guard count hours and days): for tests and demos.
  double policyClockScale = 1;
  std::string name;   // in a shared pool
  EtcdSettings etcd;  // empty endpoints: this host's pool alone
  std::vector<VmPolicy> vms;
};

Result<SchedulerConfig> parseConfig(const Config& config);
// A VM from a section's keys (name, socket, attach, tflops, priority, kinds,
// memory_quota); `listSeparator` separates kinds. Errors name the VM and the key.
Result<VmPolicy> parseVmSection(const ConfigSection& section, char listSeparator);
// A VM from a one-line spec "name=vm1,socket=/path,tflops=8,priority=1,kinds=gpu|cpu,memory_quota=1GiB".
Result<VmPolicy> parseVmSpec(const std::string& spec);
// `p` with raccelctl set-policy's KEY=VALUE settings (kPolicySettingKeys) on top, parsed
// as any configuration is.
inline constexpr const char* kPolicySettingKeys = "tflops, priority, kinds, memory_quota, host_cpu, host_memory, failover, lineage_bytes";
Result<VmPolicy> withSettings(const VmPolicy& p, const std::map<std::string, std::string>& settings);
// `p`'s settable part as those settings (withSettings(any, policySettings(p)) gives p's).
std::map<std::string, std::string> policySettings(const VmPolicy& p);
// The policy of a VM that another host of a shared pool serves, from its settings alone.
Result<VmPolicy> policyElsewhere(const std::string& name, const std::map<std::string, std::string>& settings);
std::string kindsToString(KindMask kinds);

}  // namespace raccel::scheduler
