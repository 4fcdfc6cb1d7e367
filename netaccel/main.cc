// raccel-netaccel: serves this server's cards to a raccel scheduler.
#include <cstdio>
#include <optional>
#include <sys/prctl.h>
#include <unistd.h>

#include "common/flags.h"
#include "common/log.h"
#include "hal/backends.h"
#include "netaccel/etcd_presence.h"
#include "netaccel/scheduler_watch.h"
#include "netaccel/netaccel.h"
#include "transport/signals.h"

using namespace raccel;

namespace {

// The cards as the shared pool records them.
std::vector<scheduler::CardSpec> cardSpecs(const std::vector<std::unique_ptr<hal::Device>>& devices) {
  std::vector<scheduler::CardSpec> out;
  for (size_t i = 0; i < devices.size(); ++i) {
    auto& caps = devices[i]->capabilities();
    scheduler::CardSpec c;
    c.index = static_cast<uint32_t>(i);
    c.kind = caps.kind;
    c.model = caps.model;
    c.backend = caps.backend;
    c.tflops = caps.tflops;
    c.memoryBytes = caps.memoryBytes;
    c.programKinds = caps.programKinds;
    out.push_back(std::move(c));
  }
  return out;
}

void declareFlags(Flags& flags) {
  flags.value("config", "FILE", "configuration file (see netaccel/config.h for the format)");
  flags.value("name", "NAME", "node name, unique in the pool (default: the host name)");
  flags.value("scheduler", "HOST:PORT[,...]|etcd", "the scheduler's netaccel address (default 127.0.0.1:7700); several, "
                                              "comma-separated: each scheduler of a shared pool; etcd: every scheduler "
                                              "of the pool shared through --etcd, as they come and go");
  flags.value("card", "SPEC",
              "add a card: backend=cpu,kind=gpu,tflops=8,memory=1GiB,model=M,threads=N,paced=true (a cpu or "
              "simulated card) or backend=opencl,device=0[,kind=..,tflops=..,memory=..] (a discovered device, overridden)",
              true);
  flags.value("etcd", "ENDPOINTS", "also register in the pool shared through etcd (host:port, comma-separated)");
  flags.value("discover", "LIST", "backends to enumerate at start: all (default), none, or e.g. opencl,cuda");
  flags.boolean("list-devices", "print the cards this netaccel would serve, then exit");
  flags.boolean("no-sandbox", "run guest code (OpenCL, CUDA, XRT cards) inside this process, not in a sandbox process "
                              "per tenant: one tenant's faulting kernel then takes every tenant here down (for comparison)");
  flags.value("context-grace-ms", "MS", "when the scheduler goes away, keep its contexts MS for it to come back "
                                         "(default 60000; 0 = drop them at once)");
  flags.value("fair-half-life-ms", "MS", "sharing a card: past kernel time counts half after MS (default 2000)");
  flags.value("slice-ms", "MS", "ops are cut into slices of about MS of a card's speed (its own where faster than its "
                                "tflops); sharing, preemption and cancelling act between slices (default 10)");
  flags.value("max-op-seconds", "S", "an op worth more than S seconds of its card is refused (default 120)");
  flags.value("tls-ca", "FILE", "the pool CA (PEM): the scheduler must present a certificate it issued");
  flags.value("tls-cert", "FILE", "this node's certificate (PEM; its common name is the node's name; "
                                  "scripts/raccel-certs.sh node DIR NAME)");
  flags.value("tls-key", "FILE", "its private key (PEM)");
  flags.boolean("insecure", "plain TCP to the scheduler, no authentication (loopback development only)");
  flags.value("tls-crypto-thread", "auto|on|off", "the TLS link's cipher work on a thread of its own (default auto: on "
                                                  "with 4 cores or more)");
  flags.boolean("no-same-host-lane", "send every frame over the node link, even to a scheduler on this host that offers "
                                     "shared memory for big frames");
  flags.value("http-listen", "HOST:PORT", "serve /metrics (Prometheus) here (default 127.0.0.1:7781; off = none; "
                                         "give each netaccel of a host its own)");
  flags.value("host-cpu", "CORES", "this host's CPU cores vaccels may be given (a VM's host_cpu): auto (default: the "
                                   "online cores), a number, or 0 = not counted");
  flags.value("host-memory", "BYTES", "this host's memory vaccels may be given (a VM's host_memory): auto (default: "
                                      "physical memory), e.g. 64GiB, or 0 = not counted");
  flags.value("pocl-device", "auto|basic|pthread", "PoCL's CPU device for OpenCL cards, here and in the sandboxes: basic "
                                                  "runs kernels in the calling thread, pthread on worker threads (default "
                                                  "auto: basic on hosts of 2 cores or fewer, unless POCL_DEVICES is set)");
  flags.value("log-level", "LEVEL", "debug, info, warn or error (default info)");
  flags.epilog("Serves the configured cards, then every device the discovered backends see (TFLOPS from the device's "
               "properties or a short calibration run). With neither, one cpu card of 4 TFLOPS and 1 GiB.");
}

// The configuration file's settings with the flags over them; a message naming what is
// wrong otherwise.
Result<netaccel::NetaccelConfig> configOf(const Flags& flags) {
  auto file = flags.has("config") ? Config::load(flags.get("config")) : Config::parse("", "flags");
  if (!file) return fail(file.error());
  for (auto [flag, key] : {std::pair{"tls-ca", "tls_ca"}, std::pair{"tls-cert", "tls_cert"}, std::pair{"tls-key", "tls_key"},
                           std::pair{"tls-crypto-thread", "tls_crypto_thread"}})
    if (flags.has(flag)) file->top().set(key, flags.get(flag));
  if (flags.has("insecure")) file->top().set("insecure", "true");
  if (flags.has("no-sandbox")) file->top().set("sandbox", "false");
  if (flags.has("no-same-host-lane")) file->top().set("same_host_lane", "false");
  if (flags.has("http-listen")) file->top().set("http_listen", flags.get("http-listen"));
  if (flags.has("etcd")) file->top().set("etcd", flags.get("etcd"));
  if (flags.has("host-cpu")) file->top().set("host_cpu", flags.get("host-cpu"));
  if (flags.has("host-memory")) file->top().set("host_memory", flags.get("host-memory"));
  if (flags.has("slice-ms")) file->top().set("slice_ms", flags.get("slice-ms"));
  if (flags.has("max-op-seconds")) file->top().set("max_op_seconds", flags.get("max-op-seconds"));
  if (flags.has("pocl-device")) file->top().set("pocl_device", flags.get("pocl-device"));
  // --list-devices needs no link to the scheduler.
  if (flags.has("list-devices") && !file->top().has("tls_ca")) file->top().set("insecure", "true");
  auto parsed = netaccel::parseConfig(*file);
  if (!parsed) return fail(parsed.error());
  netaccel::NetaccelConfig config = *parsed;
  if (flags.has("name")) config.name = flags.get("name");
  if (flags.has("scheduler")) config.scheduler = flags.get("scheduler");
  if (auto ok = netaccel::checkSchedulers(config); !ok) return fail(ok.error());
  if (flags.has("context-grace-ms")) {
    const std::string text = flags.get("context-grace-ms");  // outlives `end`, which points into it
    char* end = nullptr;
    long long ms = std::strtoll(text.c_str(), &end, 10);
    if (text.empty() || !end || *end || ms < 0 || ms > 86400000)
      return fail(Code::invalidArgument, "--context-grace-ms must be a number of milliseconds from 0 to 86400000");
    config.contextGraceMs = static_cast<unsigned>(ms);
  }
  if (flags.has("fair-half-life-ms")) {
    config.fairHalfLifeMs = std::atof(flags.get("fair-half-life-ms").c_str());
    if (!(config.fairHalfLifeMs > 0)) return fail(Code::invalidArgument, "--fair-half-life-ms must be a positive number");
  }
  for (auto& spec : flags.getAll("card")) {
    auto card = netaccel::parseCardSpec(spec);
    if (!card) return fail(card.error());
    config.cards.push_back(*card);
  }
  if (flags.has("discover")) {
    auto d = netaccel::parseDiscover(flags.get("discover"));
    if (!d) return fail(Code::invalidArgument, "--discover: " + d.error().message);
    config.discover = *d;
  } else if (!flags.has("config")) {
    config.discover = *netaccel::parseDiscover("all");
  }
  return config;
}

// The link's TLS context (none for --list-devices); the node's name is its certificate's,
// else --name, else the host name.
Result<std::shared_ptr<transport::TlsContext>> linkTls(const Flags& flags, netaccel::NetaccelConfig& config) {
  std::shared_ptr<transport::TlsContext> tls;
  if (!flags.has("list-devices")) {
    auto made = transport::tlsFor(transport::TlsContext::Role::client, config.security, "the link to the scheduler");
    if (!made) return fail(made.error());
    tls = *made;
  }
  if (tls) {
    if (!config.name.empty() && config.name != tls->ownName())
      return fail(Code::invalidArgument, "--name " + config.name + ", but the certificate " + config.security.files.cert +
                                             " is for node '" + tls->ownName() + "'");
    config.name = tls->ownName();
  }
  if (config.name.empty()) {
    char host[256] = "netaccel";
    gethostname(host, sizeof host - 1);
    config.name = host;
  }
  if (auto a = netaccel::schedulerAddresses(config.scheduler); !a)
    return fail(Code::invalidArgument, "--scheduler: " + a.error().message);
  return tls;
}

// --list-devices: the cards this netaccel would serve, and what discovery said.
void printDevices(const std::vector<std::unique_ptr<hal::Device>>& devices, const std::vector<std::string>& notes,
                  const netaccel::NetaccelConfig& config) {
  std::printf("%-5s %-8s %-5s %-28s %10s %12s  %s\n", "CARD", "BACKEND", "KIND", "MODEL", "TFLOPS", "MEMORY", "PROGRAMS");
  for (size_t i = 0; i < devices.size(); ++i) {
    auto& c = devices[i]->capabilities();
    std::string programs;
    for (auto k : c.programKinds) programs += (programs.empty() ? "" : ",") + std::string(programKindName(k));
    std::printf("%-5zu %-8s %-5s %-28s %10.4f %12s  %s\n", i, c.backend.c_str(), kindName(c.kind), c.model.c_str(),
                c.tflops, formatBytes(c.memoryBytes).c_str(), programs.c_str());
  }
  std::string built;
  for (auto& b : hal::builtBackends()) built += (built.empty() ? "" : ", ") + b;
  std::printf("backends built: %s\n", built.c_str());
  for (auto& n : notes) std::printf("discovery: %s\n", n.c_str());
  if (config.discover.empty()) std::printf("discovery: off\n");
}

// Serves the cards until a signal: registered in etcd and watching the pool's schedulers
// where the pool is shared. 2 when it cannot start.
int serve(const netaccel::NetaccelConfig& config, std::shared_ptr<transport::TlsContext> tls,
          std::vector<std::unique_ptr<hal::Device>> devices) {
  std::unique_ptr<netaccel::EtcdPresence> presence;
  std::optional<etcd::Options> etcdOptions;
  if (!config.etcd.endpoints.empty()) {
    auto options = etcd::optionsFrom(config.etcd);
    if (!options) {
      std::fprintf(stderr, "raccel-netaccel: %s\n", options.error().message.c_str());
      return 2;
    }
    etcdOptions = *options;
    netaccel::EtcdPresence::Settings settings;
    settings.etcd = *options;
    settings.prefix = config.etcd.prefix;
    settings.leaseTtlSeconds = config.etcd.leaseTtlSeconds;
    presence = std::make_unique<netaccel::EtcdPresence>(settings, config.name, cardSpecs(devices),
                                                        scheduler::HostVector{config.hostCpuMilli, config.hostMemoryMib});
  }
  uv_loop_t* loop = uv_default_loop();
  netaccel::Netaccel daemon(loop, config, std::move(devices));
  daemon.useTls(tls);
  // Declared after the daemon: stopped (its thread joined) before the daemon goes.
  std::unique_ptr<netaccel::SchedulerWatch> schedulers;
  if (etcdOptions) {
    netaccel::SchedulerWatch::Found found;  // scheduler = etcd: each scheduler as it advertises itself
    if (config.scheduler == netaccel::kSchedulersFromEtcd)
      found = [&daemon](const std::string& name, const std::string& address) { daemon.schedulerFound(name, address); };
    schedulers = std::make_unique<netaccel::SchedulerWatch>(
        *etcdOptions, config.etcd.prefix, [&daemon](const std::string& name) { daemon.schedulerGone(name); }, found);
    daemon.useSchedulerLiveness([w = schedulers.get()](const std::string& name) { return w->live(name); });
  }
  if (auto started = daemon.start(); !started) {
    daemon.stop();
    uv_run(loop, UV_RUN_DEFAULT);
    std::fprintf(stderr, "raccel-netaccel: %s\n", started.error().message.c_str());
    return 2;
  }
  transport::runUntilSignalled(loop, [&] { daemon.stop(); });
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Flags flags("raccel-netaccel", "Joins a raccel scheduler and runs the instructions it forwards on this server's cards.");
  declareFlags(flags);
  int code = 0;
  if (!parseFlagsOrExit(flags, argc, argv, &code)) return code;
  auto config = configOf(flags);
  auto tls = config ? linkTls(flags, *config) : Result<std::shared_ptr<transport::TlsContext>>(fail(config.error()));
  if (!tls) {
    std::fprintf(stderr, "raccel-netaccel: %s\n", tls.error().message.c_str());
    return 2;
  }
  std::vector<std::string> notes;
  if (auto pocl = netaccel::applyPoclDevice(*config); !pocl.empty()) notes.push_back("PoCL device: " + pocl);
  auto devices = netaccel::openCards(*config, &notes);
  if (!devices) {
    std::fprintf(stderr, "raccel-netaccel: %s\n", devices.error().message.c_str());
    return 2;
  }
  if (flags.has("list-devices")) {
    printDevices(*devices, notes, *config);
    return 0;
  }
  for (auto& n : notes) RLOG_INFO("netaccel") << "discovery: " << n;
  // Its sandboxes run guest code as the same user: they may not read this process's
  // memory, environment or open files through /proc (nor may anyone else but root).
  prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
  return serve(*config, *tls, std::move(*devices));
}
