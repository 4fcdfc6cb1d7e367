// raccel-netaccel's configuration: which scheduler to join and which cards to serve.
// Parsed once in main(); plain values afterwards.
//
//   name = node0                 # unique in the pool
//   scheduler = 127.0.0.1:7700   # or several, comma-separated: every scheduler of a pool
//                                #   shared by many VM hosts (each owns its own contexts);
//                                #   or `etcd` (with etcd = ...): every scheduler of the
//                                #   shared pool, as each advertises itself there, joining
//                                #   the new ones as they come and leaving those whose
//                                #   lease ended
//   discover = all               # all, none, or a list: opencl,cuda,xrt
//   fair_half_life_ms = 2000     # sharing a card: past kernel time counts half after this
//   context_grace_ms = 60000     # scheduler gone: keep its contexts (and their buffers and
//                                #   replies) this long for it to come back; 0 = drop at once
//   tls_ca = /etc/raccel/ca.pem  # mutual TLS to the scheduler: the pool CA, this node's
//   tls_cert = /etc/raccel/node0.pem  # certificate (its common name is the node's name)
//   tls_key = /etc/raccel/node0.key   # and key (scripts/raccel-certs.sh node DIR NAME)
//   insecure = false             # true: plain TCP (loopback development only)
//   same_host_lane = true        # a scheduler on this host that offers its lane socket
//                                #   gets big frames through shared memory (transport/lane.h)
//   sandbox = true               # run guest code (opencl, cuda, xrt cards) in sandbox
//                                #   processes, one per tenant (VM) per card
//   sandbox_warm = 1             # sandboxes started ahead per card (device context open,
//                                #   raccel's tensor kernels built)
//   sandbox_host_memory = 16GiB  # a sandbox's data-segment rlimit (RLIMIT_DATA)
//   sandbox_dir = /tmp/raccel-sandbox   # each sandbox works in its own folder below it;
//                                #   kernel-template/ holds each OpenCL card's compiled
//                                #   tensor kernels, built once (kernel_template.h)
//   sandbox_read = /opt/mylib,/srv/models   # more paths sandboxes may read (and run): a
//                                #   sandbox sees only its driver's and compiler's files, its
//                                #   card's /dev nodes, its own folder and these (sandbox.h)
//   sandbox_call_timeout_ms = 30000     # a sandbox that answers no call (or whose kernels
//                                #   make no progress) this long is stopped
//   device_queue_depth = 2       # asynchronous cards: kernels in flight on a card at once
//                                #   while tenants share it (each dispatch the fairest)
//   device_queue_depth_alone = 64  # ... while one tenant alone has work there (at least
//                                #   device_queue_depth)
//   slice_ms = 10                # ops are cut into slices of about this much of a card's
//                                #   speed (its own, from its properties or calibration,
//                                #   where faster than its tflops); sharing and cancelling
//                                #   act between slices
//   max_op_seconds = 120         # an op worth more of its card than this is refused
//   http_listen = 127.0.0.1:7781 # /metrics (Prometheus); off = none
//   host_cpu = auto              # this host's CPU cores that vaccels may be given (a VM's
//                                #   host_cpu); auto = the online cores, 0 = not counted
//   host_memory = auto           # and its memory (bytes; auto = physical memory)
//   pocl_device = auto           # PoCL's CPU device for OpenCL cards: basic runs kernels
//                                #   in the calling thread, pthread on worker threads; auto
//                                #   = basic on hosts of 2 cores or fewer, where waking the
//                                #   workers for each run costs more than they give, unless
//                                #   POCL_DEVICES is set in the environment (see
//                                #   docs/BENCHMARKS.md). The netaccel and its sandboxes
//                                #   open the same one
//   etcd = 10.0.0.1:2379,10.0.0.2:2379  # also register in the pool shared through etcd
//                                #   (many VM hosts, one pool), online under its own lease
//   etcd_prefix = /raccel/       # the shared pool's keys
//   etcd_lease_ttl = 5           # seconds: the node goes offline this long after it dies
//   etcd_ca = ..., etcd_cert = ..., etcd_key = ...   # etcd's TLS (https endpoints)
//
//   [card]                       # override a discovered device
//   backend = opencl             # opencl, cuda or xrt
//   device = 0                   # its index within the backend
//   kind = fpga                  # e.g. an FPGA that presents itself to OpenCL
//   tflops = 12                  # instead of the device's properties or calibration
//   memory = 8GiB                # at most what the device has
//   images = false               # offer no images and samplers (default: what it has)
//
//   [card]                       # a cpu card, or a simulated card of a kind this host lacks
//   backend = cpu
//   kind = gpu
//   model = sim-gpu
//   tflops = 18
//   memory = 4GiB
//   threads = 2
//   paced = true                 # ops take as long as a card of `tflops` would need
//   async = false                # true: ops queue on the card's own thread, timed there
//
// Served cards: the [card] sections in order, then every discovered device that no
// section names. With nothing configured and nothing discovered, one cpu card.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "common/config.h"
#include "common/etcd_settings.h"
#include "common/kinds.h"
#include "netaccel/sandbox.h"
#include "transport/connection.h"
#include "transport/tls.h"

namespace raccel::netaccel {

struct CardConfig {
  std::string backend = "cpu";
  std::optional<unsigned> device;  // real backends: which device (default 0)
  std::optional<CardKind> kind;
  std::optional<std::string> model;
  std::optional<double> tflops;
  std::optional<unsigned long long> memoryBytes;
  unsigned threads = 0;
  bool paced = false;
  bool async = false;
  bool noImages = false;  // images = false: offer no images (an OpenCL card)
};

// Sandbox processes for the cards that run guest code (netaccel/sandbox.h).
struct SandboxConfig : SandboxSettings {  // readable: sandbox_read
  bool enabled = true;
};

struct NetaccelConfig {
  std::string name;
  std::string scheduler = "127.0.0.1:7700";
  unsigned heartbeatMs = 1000;
  // Sharing a card: past kernel time counts half as much after this long.
  double fairHalfLifeMs = 2000;
  unsigned contextGraceMs = 60000;
  SandboxConfig sandbox;
  // Asynchronous cards: kernels in flight on one card at once (the granularity of shares).
  unsigned queueDepth = 2;
  unsigned aloneQueueDepth = 64;
  // Bounded work (hal/slicing.h): slices of this much of a card's speed, and the
  // most one op may be worth.
  double sliceMs = 10;
  double maxOpSeconds = 120;
  std::vector<std::string> discover;  // backends to enumerate at start
  std::string httpListen = "127.0.0.1:7781";  // /metrics; "off": no HTTP
  // Host resources reported to the scheduler (0 = not counted).
  uint64_t hostCpuMilli = 0;
  uint64_t hostMemoryMib = 0;
  transport::LinkSecurity security;
  bool sameHostLane = true;  // take a same-host lane when a scheduler offers one
  std::string poclDevice = "auto";  // auto, basic or pthread (applyPoclDevice)
  std::vector<CardConfig> cards;
  EtcdSettings etcd;  // the pool shared through etcd (common/etcd_settings.h; empty endpoints: none)
};

Result<NetaccelConfig> parseConfig(const Config& config);
// `scheduler`'s value: one host:port or several, comma-separated (a netaccel of a pool
// shared by many hosts links to each host's scheduler). At most kMaxSchedulerLinks.
constexpr size_t kMaxSchedulerLinks = 64;
Result<std::vector<transport::Address>> schedulerAddresses(const std::string& text);
// `scheduler = etcd`: the schedulers are found in the shared pool (netaccel/scheduler_watch.h).
inline constexpr const char* kSchedulersFromEtcd = "etcd";
// What the `scheduler` setting and the etcd settings say together: an error when
// `scheduler = etcd` has no etcd to find them in.
Status checkSchedulers(const struct NetaccelConfig& config);
// A card from a one-line spec "backend=cpu,kind=gpu,tflops=8,memory=1GiB,model=x,threads=1".
Result<CardConfig> parseCardSpec(const std::string& spec);
// What POCL_DEVICES should be for `pocl_device = choice` on a host of `cores` cores where
// the environment has `environment` (null: unset): the value to set, or "" to leave the
// environment as it is.
std::string poclDevicesFor(const std::string& choice, const char* environment, unsigned cores);
// Sets POCL_DEVICES for this process and the sandboxes it starts (they inherit its
// environment), before any OpenCL call; returns what it chose, "" when it left it.
std::string applyPoclDevice(const NetaccelConfig& config);
// "all", "none" or a comma-separated list of backend names built into this binary.
Result<std::vector<std::string>> parseDiscover(const std::string& text);

}  // namespace raccel::netaccel
