// raccel-scheduler: the host daemon that pools accelerator cards into blocks and
// serves virtual accelerators to VMs.
#include <chrono>
#include <cstdio>
#include <memory>
#include <thread>

#include "common/flags.h"
#include "common/log.h"
#include "scheduler/etcd/etcd_pool_state.h"
#include "scheduler/scheduler.h"
#ifdef RACCEL_HAVE_LIBVIRT
#include "scheduler/libvirt_watcher.h"
#endif
#include "transport/signals.h"

using namespace raccel;

namespace {
int die(const std::string& message) {
  std::fprintf(stderr, "raccel-scheduler: %s\n", message.c_str());
  return 2;
}

void declareFlags(Flags& flags) {
  flags.value("config", "FILE", "configuration file (see scheduler/config.h for the format)");
  flags.value("node-listen", "HOST:PORT", "where netaccels connect (default 127.0.0.1:7700)");
  flags.value("node-advertise", "HOST:PORT",
              "with --etcd: where netaccels that find schedulers in etcd reach this one (default: node-listen's)");
  flags.value("console", "PATH", "raccelctl's unix socket (default /run/raccel/console.sock)");
  flags.value("lane-socket", "PATH", "where netaccels on this host hand over their same-host lanes (shared memory for big "
                                     "frames; default: lanes.sock beside the console socket; off = none)");
  flags.value("vm", "SPEC", "serve a VM: name=vm1,socket=/path,attach=listen|connect,tflops=8,priority=0,kinds=gpu|cpu,"
                            "memory_quota=1GiB,host_cpu=2,host_memory=8GiB (host_*: of a card's node, per vaccel; "
                            "default none)",
              true);
  flags.value("libvirt", "URI", "follow this libvirt's domains (e.g. qemu:///system): a domain with raccel metadata "
                                "is a VM, attached while it runs (vm-images/README.md)");
  flags.value("http-listen", "HOST:PORT", "serve /metrics (Prometheus) and the web console here (default "
                                         "127.0.0.1:7780; off = no HTTP)");
  flags.value("http-token-file", "FILE", "the bearer token (16+ characters) the web console's actions need; without "
                                         "it the web console is read-only");
  flags.value("state-dir", "DIR", "keep the state database here (VM policies, allocations, suspended vaccels), so a "
                                 "restart loses no allocation; default: none");
  flags.value("etcd", "ENDPOINTS", "join the pool shared through etcd with other hosts' schedulers (host:port, "
                                  "comma-separated; see also --name and the etcd_* settings)");
  flags.value("name", "NAME", "this scheduler's name in a shared pool (default: the host name)");
  flags.value("set", "KEY=VALUE", "a top-level configuration setting, over the file's (e.g. defrag_on_release=false)", true);
  flags.value("block-tflops", "T", "TFLOPS per block (default 1)");
  flags.value("split-min-mflop", "M", "split built-in ops across a vaccel's cards from M MFLOP of work up (default 8; 0 = always)");
  flags.value("heartbeat-timeout-ms", "MS", "declare a silent netaccel lost after this (default 5000)");
  flags.value("tls-ca", "FILE", "the pool CA (PEM): netaccels must present a certificate it issued");
  flags.value("tls-cert", "FILE", "the scheduler's certificate (PEM; scripts/raccel-certs.sh scheduler DIR)");
  flags.value("tls-key", "FILE", "its private key (PEM)");
  flags.boolean("insecure", "netaccel links in plain TCP with no authentication (loopback development only)");
  flags.value("tls-crypto-thread", "auto|on|off", "each TLS node link's cipher work on a thread of its own (default auto: "
                                                  "on with 4 cores or more)");
  flags.value("log-level", "LEVEL", "debug, info, warn or error (default info)");
}

// The configuration file's settings, --set over them, then the flags.
Result<scheduler::SchedulerConfig> configOf(const Flags& flags) {
  auto file = flags.has("config") ? Config::load(flags.get("config")) : Config::parse("", "--set");
  if (!file) return fail(file.error());
  for (auto& setting : flags.getAll("set")) {
    auto eq = setting.find('=');
    if (eq == std::string::npos || eq == 0) return fail(Code::invalidArgument, "--set " + setting + ": give KEY=VALUE");
    file->top().set(setting.substr(0, eq), setting.substr(eq + 1));
  }
  // Flags that name a setting go through the same parser (and its checks) as the file.
  for (auto [flag, key] : {std::pair{"block-tflops", "block_tflops"}, std::pair{"split-min-mflop", "split_min_mflop"},
                           std::pair{"heartbeat-timeout-ms", "heartbeat_timeout_ms"}, std::pair{"tls-ca", "tls_ca"},
                           std::pair{"tls-cert", "tls_cert"}, std::pair{"tls-key", "tls_key"},
                           std::pair{"tls-crypto-thread", "tls_crypto_thread"}, std::pair{"http-listen", "http_listen"}, std::pair{"http-token-file", "http_token_file"},
                           std::pair{"etcd", "etcd"}, std::pair{"name", "name"},
                           std::pair{"lane-socket", "lane_socket"}})
    if (flags.has(flag)) file->top().set(key, flags.get(flag));
  if (flags.has("insecure")) file->top().set("insecure", "true");
  auto parsed = scheduler::parseConfig(*file);
  if (!parsed) return fail(parsed.error());
  scheduler::SchedulerConfig config = *parsed;
  if (flags.has("libvirt")) config.libvirtUri = flags.get("libvirt");
  if (flags.has("node-listen")) config.nodeListen = flags.get("node-listen");
  if (flags.has("node-advertise")) config.nodeAdvertise = flags.get("node-advertise");
  if (flags.has("console")) config.console = flags.get("console");
  if (flags.has("state-dir")) config.stateDir = flags.get("state-dir");
  for (auto& spec : flags.getAll("vm")) {
    auto vm = scheduler::parseVmSpec(spec);
    if (!vm) return fail(vm.error());
    config.vms.push_back(*vm);
  }
  if (config.vms.empty() && config.libvirtUri.empty())
    return fail(Code::invalidArgument, "no VM to serve: give --vm, [vm] sections in --config, or --libvirt URI");
  return config;
}

// The pool shared through etcd, once etcd answers: while it cannot be reached (starting
// beside this scheduler, or down a while) this waits, saying so every 5 s; what etcd
// refused (the block size, a live namesake) ends here. None (and no error) when a stop
// was asked for meanwhile.
Result<std::unique_ptr<scheduler::PoolState>> sharedPool(uv_loop_t* loop, const scheduler::SchedulerConfig& config) {
  if (!config.stateDir.empty())
    return fail(Code::invalidArgument, "state_dir and etcd together are not supported yet: in a shared pool a scheduler's "
                                       "holdings end with its etcd lease, so there is nothing to restore them into");
  auto shared = scheduler::EtcdPoolState::open(loop, config.etcd, config.name, config.blockTflops);
  for (unsigned waitedMs = 0; !shared && shared.error().code == Code::unavailable; waitedMs += 500) {
    uv_run(loop, UV_RUN_DEFAULT);  // the failed attempt's handles close
    if (transport::stopPending()) {
      RLOG_INFO("scheduler") << "stopped while waiting for etcd";
      return std::unique_ptr<scheduler::PoolState>();
    }
    if (waitedMs % 5000 == 0) RLOG_WARN("scheduler") << shared.error().message << "; waiting for etcd (tried every 0.5 s)";
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    shared = scheduler::EtcdPoolState::open(loop, config.etcd, config.name, config.blockTflops);
  }
  if (!shared) {
    uv_run(loop, UV_RUN_DEFAULT);
    return fail(shared.error());
  }
  return std::unique_ptr<scheduler::PoolState>(std::move(*shared));
}

// Serves the VMs until a signal (and follows libvirt's domains where asked).
int serve(uv_loop_t* loop, const scheduler::SchedulerConfig& config, std::unique_ptr<scheduler::PoolState> pool) {
  scheduler::Scheduler daemon(loop, config, std::move(pool));
  if (auto s = daemon.start(); !s) {
    daemon.stop();
    uv_run(loop, UV_RUN_DEFAULT);
    return die(s.error().message);
  }
#ifdef RACCEL_HAVE_LIBVIRT
  std::unique_ptr<scheduler::LibvirtWatcher> watcher;
  if (!config.libvirtUri.empty()) {
    watcher = std::make_unique<scheduler::LibvirtWatcher>(loop, daemon, config.libvirtUri);
    if (auto s = watcher->start(); !s) {
      daemon.stop();
      uv_run(loop, UV_RUN_DEFAULT);
      return die(s.error().message);
    }
  }
#else
  if (!config.libvirtUri.empty()) {
    daemon.stop();
    uv_run(loop, UV_RUN_DEFAULT);
    return die("this raccel-scheduler was built without libvirt (apt-get install libvirt-dev, then rebuild)");
  }
#endif
  transport::runUntilSignalled(loop, [&] {
#ifdef RACCEL_HAVE_LIBVIRT
    if (watcher) watcher->stop();
#endif
    daemon.stop();
  });
  return 0;
}
}  // namespace

int main(int argc, char** argv) {
  transport::holdStopSignals();  // a stop asked for while starting waits for the loop (before any thread)
  Flags flags("raccel-scheduler",
              "Pools the cards of registered netaccels into numbered compute blocks and serves each VM's programs a "
              "virtual accelerator over the VM's socket.");
  declareFlags(flags);
  int code = 0;
  if (!parseFlagsOrExit(flags, argc, argv, &code)) return code;
  auto config = configOf(flags);
  if (!config) return die(config.error().message);
  uv_loop_t* loop = uv_default_loop();
  std::unique_ptr<scheduler::PoolState> pool;  // null: this host's pool alone
  if (config->etcd.enabled()) {
    auto shared = sharedPool(loop, *config);
    if (!shared) return die(shared.error().message);
    if (!*shared) return 0;  // stopped while waiting for etcd
    pool = std::move(*shared);
  }
  return serve(loop, *config, std::move(pool));
}
