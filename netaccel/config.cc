#include "netaccel/config.h"

#include "common/etcd_settings.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <set>
#include <thread>

#include <unistd.h>

#include "common/limits.h"
#include "hal/backends.h"

namespace raccel::netaccel {
namespace {
// pocl_device = auto takes PoCL's basic device on hosts of this many cores or fewer: on
// two cores its pthread workers' wake-ups cost a CNN step ~15% (docs/BENCHMARKS.md).
constexpr unsigned kPoclBasicCores = 2;

std::string builtList() {
  std::string out;
  for (auto& b : hal::builtBackends()) out += (out.empty() ? "" : ", ") + b;
  return out;
}

// "a,b,,c" -> a, b, "", c (every item, empty ones too: "" is one empty item).
std::vector<std::string> commaItems(const std::string& text) {
  std::vector<std::string> out;
  for (size_t start = 0; start <= text.size();) {
    size_t end = text.find(',', start);
    if (end == std::string::npos) end = text.size();
    out.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

Result<CardConfig> cardFrom(const ConfigSection& s) {
  auto unknown = s.unknownKeys({"backend", "device", "kind", "model", "tflops", "memory", "threads", "paced", "async", "images"});
  if (!unknown.empty()) return fail(Code::invalidArgument, "unknown card setting '" + unknown[0] + "'");
  CardConfig c;
  c.backend = s.getString("backend", "cpu");
  auto built = hal::builtBackends();
  if (std::find(built.begin(), built.end(), c.backend) == built.end())
    return fail(Code::unimplemented, "card backend '" + c.backend + "' is not built into this netaccel (built: " + builtList() + ")");
  bool cpu = c.backend == "cpu";
  if (s.has("device")) {
    if (cpu) return fail(Code::invalidArgument, "device= names a discovered device; cpu cards are declared");
    auto d = s.getInt("device", 0);
    if (!d) return fail(d.error());
    if (*d < 0 || *d > 1024) return fail(Code::invalidArgument, "device must be 0..1024");
    c.device = static_cast<unsigned>(*d);
  } else if (!cpu) {
    c.device = 0;
  }
  if (s.has("kind")) {
    auto kind = parseKind(s.getString("kind", ""));
    if (!kind) return fail(kind.error());
    c.kind = *kind;
  }
  if (s.has("model")) c.model = s.getString("model", "");
  if (s.has("tflops")) {
    auto tflops = s.getDouble("tflops", 1, 0, 65536);  // the scheduler's per-card limit at 1 TFLOPS a block
    if (!tflops) return fail(tflops.error());
    if (!(*tflops > 0)) return fail(Code::invalidArgument, "card tflops must be positive");
    c.tflops = *tflops;
  }
  if (s.has("memory")) {
    auto memory = s.getBytes("memory", 0);
    if (!memory) return fail(memory.error());
    if (*memory == 0) return fail(Code::invalidArgument, "card memory must be positive");
    c.memoryBytes = *memory;
  }
  auto threads = s.getInt("threads", 0);
  if (!threads) return fail(threads.error());
  if (*threads < 0 || *threads > 1024) return fail(Code::invalidArgument, "card threads must be 0..1024");
  if (*threads && !cpu) return fail(Code::invalidArgument, "threads= applies to cpu cards only");
  c.threads = static_cast<unsigned>(*threads);
  std::string paced = s.getString("paced", "false");
  if (paced != "true" && paced != "false" && paced != "1" && paced != "0")
    return fail(Code::invalidArgument, "paced must be true or false");
  c.paced = paced == "true" || paced == "1";
  if (c.paced && !cpu) return fail(Code::invalidArgument, "paced= applies to simulated (cpu backend) cards only");
  auto async = s.getBool("async", false);
  if (!async) return fail(async.error());
  c.async = *async;
  if (c.async && !cpu) return fail(Code::invalidArgument, "async= applies to simulated (cpu backend) cards only");
  auto images = s.getBool("images", true);
  if (!images) return fail(images.error());
  c.noImages = !*images;
  return c;
}
}  // namespace

Result<std::vector<std::string>> parseDiscover(const std::string& text) {
  auto built = hal::builtBackends();
  std::vector<std::string> out;
  if (text == "none") return out;
  if (text == "all") {
    for (auto& b : built)
      if (b != "cpu") out.push_back(b);
    return out;
  }
  for (auto& name : commaItems(text)) {
    if (name == "cpu" || std::find(built.begin(), built.end(), name) == built.end())
      return fail(Code::invalidArgument, "discover: '" + name + "' is not a discoverable backend of this netaccel (use all, none, or of: " +
                                             builtList() + " but cpu)");
    out.push_back(name);
  }
  return out;
}

std::string poclDevicesFor(const std::string& choice, const char* environment, unsigned cores) {
  if (choice != "auto") return choice;
  if (environment && *environment) return "";  // the operator chose already
  return cores > 0 && cores <= kPoclBasicCores ? "basic" : "";
}

std::string applyPoclDevice(const NetaccelConfig& config) {
  std::string value = poclDevicesFor(config.poclDevice, std::getenv("POCL_DEVICES"), std::thread::hardware_concurrency());
  if (!value.empty()) ::setenv("POCL_DEVICES", value.c_str(), 1);
  return value;
}

Result<CardConfig> parseCardSpec(const std::string& spec) {
  auto s = ConfigSection::fromSpec("card", spec);
  if (!s) return fail(Code::invalidArgument, "--card " + spec + ": " + s.error().message);
  auto c = cardFrom(*s);
  if (!c) return fail(c.error().code, "--card " + spec + ": " + c.error().message);
  return c;
}

Status checkSchedulers(const NetaccelConfig& config) {
  if (config.scheduler == kSchedulersFromEtcd && config.etcd.endpoints.empty())
    return fail(Code::invalidArgument, "scheduler = etcd finds the schedulers in the shared pool: it needs etcd = ENDPOINTS");
  return {};
}

Result<std::vector<transport::Address>> schedulerAddresses(const std::string& text) {
  std::vector<transport::Address> out;
  if (text == kSchedulersFromEtcd) return out;  // found in etcd as they come
  std::set<std::string> seen;
  size_t at = 0;
  while (at <= text.size()) {
    size_t comma = text.find(',', at);
    std::string one = text.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
    one.erase(0, one.find_first_not_of(" \t"));
    one.erase(one.find_last_not_of(" \t") + 1);
    auto address = transport::parseAddress(one);
    if (!address || address->isUnix)
      return fail(Code::invalidArgument, "scheduler address '" + limits::clip(one, 64) + "' must be host:port");
    if (!seen.insert(address->toString()).second)
      return fail(Code::invalidArgument, "scheduler address '" + limits::clip(one, 64) + "' is given twice");
    if (out.size() == kMaxSchedulerLinks)
      return fail(Code::invalidArgument, "at most " + std::to_string(kMaxSchedulerLinks) + " scheduler addresses");
    out.push_back(*address);
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  return out;
}

namespace {
// The sandboxes' settings (sandbox, sandbox_*).
Status sandboxFrom(const ConfigSection& top, SandboxConfig& out) {
  auto sandbox = top.getBool("sandbox", out.enabled);
  if (!sandbox) return fail(sandbox.error());
  out.enabled = *sandbox;
  auto warm = top.getInt("sandbox_warm", out.warm, 0, 64);
  if (!warm) return fail(warm.error());
  out.warm = static_cast<unsigned>(*warm);
  auto hostMemory = top.getBytes("sandbox_host_memory", out.hostMemoryBytes);
  if (!hostMemory) return fail(hostMemory.error());
  if (*hostMemory < (64ull << 20)) return fail(Code::invalidArgument, "sandbox_host_memory must be at least 64MiB");
  out.hostMemoryBytes = *hostMemory;
  out.dir = top.getString("sandbox_dir", out.dir);
  auto callTimeout = top.getInt("sandbox_call_timeout_ms", out.callTimeoutMs, 100, 24ll * 3600 * 1000);
  if (!callTimeout) return fail(callTimeout.error());
  out.callTimeoutMs = static_cast<unsigned>(*callTimeout);
  // More paths its sandboxes may read, comma-separated (absolute).
  for (auto& path : commaItems(top.getString("sandbox_read", ""))) {
    if (path.empty()) continue;
    if (path[0] != '/') return fail(Code::invalidArgument, "sandbox_read: '" + path + "' is not an absolute path");
    out.readable.push_back(path);
  }
  return {};
}

// How the cards' work is run: shares, slices, queue depths, PoCL's device.
Status cardWorkFrom(const ConfigSection& top, NetaccelConfig& out) {
  auto halfLife = top.getDouble("fair_half_life_ms", out.fairHalfLifeMs);
  if (!halfLife) return fail(halfLife.error());
  if (!(*halfLife > 0)) return fail(Code::invalidArgument, "fair_half_life_ms must be positive");
  out.fairHalfLifeMs = *halfLife;
  auto slice = top.getDouble("slice_ms", out.sliceMs, 0.1, 10000);
  if (!slice) return fail(slice.error());
  out.sliceMs = *slice;
  auto maxOp = top.getDouble("max_op_seconds", out.maxOpSeconds, 0.001, 365.0 * 24 * 3600);
  if (!maxOp) return fail(maxOp.error());
  out.maxOpSeconds = *maxOp;
  auto depth = top.getInt("device_queue_depth", out.queueDepth, 1, 1024);
  if (!depth) return fail(depth.error());
  out.queueDepth = static_cast<unsigned>(*depth);
  auto alone = top.getInt("device_queue_depth_alone", std::max<long long>(out.aloneQueueDepth, out.queueDepth), out.queueDepth, 4096);
  if (!alone) return fail(alone.error());
  out.aloneQueueDepth = static_cast<unsigned>(*alone);
  out.poclDevice = top.getString("pocl_device", out.poclDevice);
  if (out.poclDevice != "auto" && out.poclDevice != "basic" && out.poclDevice != "pthread")
    return fail(Code::invalidArgument, "pocl_device must be auto, basic or pthread, not '" + limits::clip(out.poclDevice, 32) + "'");
  return {};
}

// The host's CPU and memory that vaccels may be given (host_cpu, host_memory).
Status hostResourcesFrom(const ConfigSection& top, NetaccelConfig& out) {
  if (top.getString("host_cpu", "auto") == "auto") {
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    out.hostCpuMilli = cores > 0 ? static_cast<uint64_t>(cores) * 1000 : 0;
  } else {
    auto cpu = top.getDouble("host_cpu", 0, 0, limits::kMaxHostCpuMilli / 1000.0);
    if (!cpu) return fail(Code::invalidArgument, cpu.error().message + " (or auto)");
    out.hostCpuMilli = static_cast<uint64_t>(std::floor(*cpu * 1000 + 1e-9));
  }
  if (top.getString("host_memory", "auto") == "auto") {
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    out.hostMemoryMib = pages > 0 && page > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page) >> 20 : 0;
  } else {
    auto memory = top.getBytes("host_memory", 0);
    if (!memory) return fail(Code::invalidArgument, memory.error().message + " (or auto)");
    if (*memory > (limits::kMaxHostMemoryMib << 20))
      return fail(Code::invalidArgument, "host_memory is at most " + std::to_string(limits::kMaxHostMemoryMib >> 20) + " TiB");
    out.hostMemoryMib = *memory >> 20;
  }
  out.hostCpuMilli = std::min<uint64_t>(out.hostCpuMilli, limits::kMaxHostCpuMilli);
  out.hostMemoryMib = std::min<uint64_t>(out.hostMemoryMib, limits::kMaxHostMemoryMib);
  return {};
}

const std::vector<std::string>& knownKeys() {
  static const std::vector<std::string> known = [] {
    std::vector<std::string> k = {"name", "scheduler", "heartbeat_ms", "discover", "fair_half_life_ms", "context_grace_ms",
                                  "sandbox", "same_host_lane", "sandbox_warm", "sandbox_host_memory", "sandbox_dir",
                                  "sandbox_call_timeout_ms", "device_queue_depth", "device_queue_depth_alone", "sandbox_read",
                                  "slice_ms", "max_op_seconds", "http_listen", "host_cpu", "host_memory", "pocl_device"};
    k.insert(k.end(), std::begin(kEtcdKeys), std::end(kEtcdKeys));
    k.insert(k.end(), transport::kLinkSecurityKeys.begin(), transport::kLinkSecurityKeys.end());
    return k;
  }();
  return known;
}
}  // namespace

Result<NetaccelConfig> parseConfig(const Config& config) {
  NetaccelConfig out;
  auto& top = config.top();
  if (top.has("sandbox_hide"))
    return fail(Code::invalidArgument, config.origin() + ": sandbox_hide is gone: a sandbox now reads only its driver's "
                                                         "and compiler's files and its own folder; add paths it needs with "
                                                         "sandbox_read");
  auto unknown = top.unknownKeys(knownKeys());
  if (!unknown.empty()) return fail(Code::invalidArgument, config.origin() + ": unknown setting '" + unknown[0] + "'");
  auto security = transport::linkSecurityFrom(top);
  if (!security) return fail(security.error());
  out.security = *security;
  out.name = top.getString("name", "");
  out.scheduler = top.getString("scheduler", out.scheduler);
  if (auto addresses = schedulerAddresses(out.scheduler); !addresses)
    return fail(addresses.error().code, config.origin() + ": " + addresses.error().message);
  out.httpListen = top.getString("http_listen", out.httpListen);
  auto etcd = parseEtcdSettings(top);
  if (!etcd) return fail(etcd.error().code, config.origin() + ": " + etcd.error().message);
  out.etcd = *etcd;
  if (auto ok = checkSchedulers(out); !ok) return fail(ok.error().code, config.origin() + ": " + ok.error().message);
  auto hb = top.getInt("heartbeat_ms", 1000);
  if (!hb) return fail(hb.error());
  if (*hb < 10) return fail(Code::invalidArgument, "heartbeat_ms must be at least 10");
  out.heartbeatMs = static_cast<unsigned>(*hb);
  auto grace = top.getInt("context_grace_ms", out.contextGraceMs);
  if (!grace) return fail(grace.error());
  if (*grace < 0) return fail(Code::invalidArgument, "context_grace_ms must not be negative");
  out.contextGraceMs = static_cast<unsigned>(*grace);
  auto lane = top.getBool("same_host_lane", out.sameHostLane);
  if (!lane) return fail(lane.error());
  out.sameHostLane = *lane;
  if (auto ok = sandboxFrom(top, out.sandbox); !ok) return fail(ok.error());
  if (auto ok = cardWorkFrom(top, out); !ok) return fail(ok.error());
  if (auto ok = hostResourcesFrom(top, out); !ok) return fail(ok.error());
  auto discover = parseDiscover(top.getString("discover", "all"));
  if (!discover) return fail(discover.error().code, config.origin() + ": " + discover.error().message);
  out.discover = *discover;
  for (auto* s : config.sections("card")) {
    auto c = cardFrom(*s);
    if (!c) return fail(c.error().code, config.origin() + ":" + std::to_string(s->line()) + ": " + c.error().message);
    out.cards.push_back(*c);
  }
  return out;
}

}  // namespace raccel::netaccel
