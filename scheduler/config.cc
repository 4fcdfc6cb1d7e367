#include "scheduler/config.h"

#include "common/limits.h"
#include "transport/connection.h"

#include <cmath>
#include <unistd.h>
#include <algorithm>
#include <set>
#include <tuple>
#include <sstream>

namespace raccel::scheduler {
Result<VmPolicy> parseVmSection(const ConfigSection& s, char listSeparator) {
  auto unknown = s.unknownKeys({"name", "socket", "attach", "tflops", "priority", "kinds", "memory_quota", "host_cpu",
                                 "host_memory", "failover", "lineage_bytes"});
  if (!unknown.empty()) return fail(Code::invalidArgument, "unknown vm setting '" + unknown[0] + "'");
  VmPolicy vm;
  auto name = s.getString("name");
  if (!name || name->empty()) return fail(Code::invalidArgument, "a vm needs a name");
  vm.name = *name;
  auto socket = s.getString("socket");
  if (!socket || socket->empty()) return fail(Code::invalidArgument, "vm '" + vm.name + "' needs a socket path");
  vm.socket = *socket;
  auto attach = s.getString("attach", "listen");
  if (attach == "connect") vm.attach = VmPolicy::Attach::connect;
  else if (attach != "listen")
    return fail(Code::invalidArgument, "vm '" + vm.name + "': attach must be listen or connect, not '" + attach + "'");
  if (auto ok = limits::checkName("vm name", vm.name); !ok) return fail(ok.error());
  auto tflops = s.getDouble("tflops", vm.tflops, 0, kMaxVmTflops);
  if (!tflops) return fail(tflops.error());
  if (*tflops <= 0) return fail(Code::invalidArgument, "vm '" + vm.name + "': tflops must be positive");
  vm.tflops = *tflops;
  auto priority = s.getInt("priority", 0, limits::kMinPriority, limits::kMaxPriority);
  if (!priority) return fail(priority.error());
  vm.priority = static_cast<int>(*priority);
  auto quota = s.getBytes("memory_quota", vm.memoryQuota);
  if (!quota) return fail(quota.error());
  vm.memoryQuota = *quota;
  auto cpu = s.getDouble("host_cpu", 0, 0, limits::kMaxHostCpuMilli / 1000.0);
  if (!cpu) return fail(Code::invalidArgument, "vm '" + vm.name + "': " + cpu.error().message);
  vm.hostCpuMilli = static_cast<uint64_t>(std::ceil(*cpu * 1000 - 1e-9));
  auto memory = s.getBytes("host_memory", 0);
  if (!memory) return fail(Code::invalidArgument, "vm '" + vm.name + "': " + memory.error().message);
  if (*memory > (limits::kMaxHostMemoryMib << 20))
    return fail(Code::invalidArgument, "vm '" + vm.name + "': host_memory is at most " +
                                           std::to_string(limits::kMaxHostMemoryMib >> 20) + " TiB");
  vm.hostMemoryMib = (*memory + (1ull << 20) - 1) >> 20;
  auto failover = s.getString("failover", "on");
  if (failover != "on" && failover != "off")
    return fail(Code::invalidArgument, "vm '" + vm.name + "': failover must be on or off, not '" + limits::clip(failover, 32) + "'");
  vm.failover = failover == "on";
  auto lineage = s.getBytes("lineage_bytes", vm.lineageBytes);
  if (!lineage) return fail(Code::invalidArgument, "vm '" + vm.name + "': " + lineage.error().message);
  if (*lineage < (1ull << 20) || *lineage > (4ull << 30))
    return fail(Code::invalidArgument, "vm '" + vm.name + "': lineage_bytes must be from 1MiB to 4GiB");
  vm.lineageBytes = *lineage;
  if (s.has("kinds")) {
    vm.kinds = 0;
    std::stringstream in(s.getString("kinds", ""));
    std::string k;
    while (std::getline(in, k, listSeparator)) {
      if (k.empty()) continue;
      auto kind = parseKind(k);
      if (!kind) return fail(Code::invalidArgument, "vm '" + vm.name + "': " + kind.error().message);
      vm.kinds |= maskOf(*kind);
    }
    if (vm.kinds == 0) return fail(Code::invalidArgument, "vm '" + vm.name + "': kinds is empty");
  }
  return vm;
}

std::string kindsToString(KindMask kinds) {
  std::string out;
  for (auto k : {CardKind::gpu, CardKind::npu, CardKind::fpga, CardKind::cpu})
    if (kinds & maskOf(k)) out += std::string(out.empty() ? "" : ",") + kindName(k);
  return out;
}

std::map<std::string, std::string> policySettings(const VmPolicy& p) {
  return {{"tflops", std::to_string(p.tflops)},
          {"priority", std::to_string(p.priority)},
          {"memory_quota", std::to_string(p.memoryQuota)},
          {"host_cpu", std::to_string(p.hostCpuMilli / 1000) + "." + std::to_string(1000 + p.hostCpuMilli % 1000).substr(1)},
          {"host_memory", std::to_string(p.hostMemoryMib << 20)},
          {"failover", p.failover ? "on" : "off"},
          {"lineage_bytes", std::to_string(p.lineageBytes)},
          {"kinds", kindsToString(p.kinds)}};
}

Result<VmPolicy> policyElsewhere(const std::string& name, const std::map<std::string, std::string>& settings) {
  VmPolicy base;
  base.name = name;
  base.socket = "/served/elsewhere";  // not this host's to attach
  return withSettings(base, settings);
}

Result<VmPolicy> withSettings(const VmPolicy& p, const std::map<std::string, std::string>& settings) {
  // The current policy as a section, the changes on top, parsed as any config is.
  ConfigSection section("vm", 0);
  section.nameKeysAs(ConfigSection::KeyForm::bare);
  section.set("name", p.name);
  section.set("socket", p.socket);
  section.set("attach", p.attach == VmPolicy::Attach::connect ? "connect" : "listen");
  for (auto& [key, value] : policySettings(p)) {
    std::string v = value;
    if (key == "kinds") std::replace(v.begin(), v.end(), ',', '|');
    section.set(key, v);
  }
  for (auto& [key, value] : settings) {
    static const std::set<std::string> settable = {"tflops",   "priority", "kinds",        "memory_quota",
                                                   "host_cpu", "host_memory", "failover", "lineage_bytes"};
    if (!settable.contains(key))
      return fail(Code::invalidArgument, "'" + key + "' is not a policy setting (" + kPolicySettingKeys + ")");
    std::string v = value;
    if (key == "kinds") std::replace(v.begin(), v.end(), ',', '|');
    section.set(key, v);
  }
  auto parsed = parseVmSection(section, '|');
  if (!parsed) return parsed;
  static const std::string kSetBy = ", set by raccelctl";
  parsed->source = p.source.ends_with(kSetBy) ? p.source : p.source + kSetBy;
  return parsed;
}

Result<VmPolicy> parseVmSpec(const std::string& spec) {
  auto s = ConfigSection::fromSpec("vm", spec);
  if (!s) return fail(Code::invalidArgument, "--vm " + spec + ": " + s.error().message);
  auto vm = parseVmSection(*s, '|');
  if (!vm) return fail(vm.error().code, "--vm " + spec + ": " + vm.error().message);
  vm->source = "--vm";
  return vm;
}

namespace {
// Where the scheduler listens and what it names itself (and its state, etcd, libvirt).
Status endpointsFrom(const Config& config, SchedulerConfig& out) {
  auto& top = config.top();
  out.nodeListen = top.getString("node_listen", out.nodeListen);
  out.nodeAdvertise = top.getString("node_advertise", "");
  if (!out.nodeAdvertise.empty()) {
    auto advertised = transport::parseAddress(out.nodeAdvertise);
    if (!advertised || advertised->isUnix || advertised->port == 0)
      return fail(Code::invalidArgument, config.origin() + ": node_advertise '" + limits::clip(out.nodeAdvertise, 64) +
                                             "' must be host:port, the address netaccels reach this scheduler at");
  }
  out.console = top.getString("console", out.console);
  out.laneSocket = top.getString("lane_socket", "");
  if (out.laneSocket != "off" && !out.laneSocket.empty() && out.laneSocket[0] != '/')
    return fail(Code::invalidArgument, config.origin() + ": lane_socket '" + limits::clip(out.laneSocket, 64) +
                                           "' must be an absolute path, or off");
  out.httpListen = top.getString("http_listen", out.httpListen);
  out.httpTokenFile = top.getString("http_token_file", "");
  out.libvirtUri = top.getString("libvirt", "");
  out.stateDir = top.getString("state_dir", "");
  auto etcd = parseEtcdSettings(top);
  if (!etcd) return fail(etcd.error().code, config.origin() + ": " + etcd.error().message);
  out.etcd = *etcd;
  out.name = top.getString("name", "");
  if (out.name.empty()) {
    char host[256] = {};
    gethostname(host, sizeof host - 1);
    out.name = host;
  }
  if (auto ok = limits::checkKeyName("name", out.name); !ok) return fail(ok.error().code, config.origin() + ": " + ok.error().message);
  return {};
}

// How blocks are sized, placed, split and moved.
Status placementFrom(const ConfigSection& top, SchedulerConfig& out) {
  auto bt = top.getDouble("block_tflops", 1, 0.001, 1e6);
  if (!bt) return fail(bt.error());
  out.blockTflops = *bt;
  auto scale = top.getDouble("policy_clock_scale", 1, 1, 1e6);
  if (!scale) return fail(scale.error());
  out.policyClockScale = *scale;
  auto split = top.getDouble("split_min_mflop", out.splitMinMflop, 0, 1e15);
  if (!split) return fail(split.error());
  out.splitMinMflop = *split;
  for (auto [key, flag] : {std::pair{"defrag_on_release", &out.defragOnRelease}, std::pair{"defrag_on_demand", &out.defragOnDemand}}) {
    auto v = top.getBool(key, *flag);
    if (!v) return fail(v.error());
    *flag = *v;
  }
  auto moveBytes = top.getBytes("defrag_max_move_bytes", out.defragMaxMoveBytes);
  if (!moveBytes) return fail(moveBytes.error());
  out.defragMaxMoveBytes = *moveBytes;
  auto slack = top.getInt("span_slack_nodes", out.spanSlackNodes);
  if (!slack) return fail(slack.error());
  if (*slack < -1 || *slack > 1000) return fail(Code::invalidArgument, "span_slack_nodes must be -1 (any) or 0..1000");
  out.spanSlackNodes = static_cast<int>(*slack);
  return {};
}

// The [vm] sections: names and sockets unique.
Status vmsFrom(const Config& config, SchedulerConfig& out) {
  std::set<std::string> names, sockets;
  for (auto* s : config.sections("vm")) {
    auto vm = parseVmSection(*s, ',');
    std::string where = config.origin() + ":" + std::to_string(s->line());
    if (!vm) return fail(vm.error().code, where + ": " + vm.error().message);
    vm->source = where;
    if (!names.insert(vm->name).second || !sockets.insert(vm->socket).second)
      return fail(Code::invalidArgument, config.origin() + ":" + std::to_string(s->line()) + ": vm '" + vm->name +
                                             "' repeats another vm's name or socket");
    out.vms.push_back(*vm);
  }
  return {};
}
}  // namespace

Result<SchedulerConfig> parseConfig(const Config& config) {
  SchedulerConfig out;
  auto& top = config.top();
  std::vector<std::string> known = {"node_listen", "node_advertise", "console", "lane_socket", "block_tflops", "heartbeat_timeout_ms", "request_timeout_ms",
                                    "split_min_mflop", "libvirt", "defrag_on_release", "defrag_on_demand",
                                    "defrag_moves_per_minute", "defrag_max_move_bytes", "state_dir", "resume_grace_ms", "startup_grace_ms",
                                    "span_slack_nodes", "max_node_links", "register_timeout_ms", "max_vm_links", "http_listen", "http_token_file", "http_client_timeout_s",
                                    "forget_offline_ms", "name", "policy_clock_scale"};
  known.insert(known.end(), std::begin(kEtcdKeys), std::end(kEtcdKeys));
  known.insert(known.end(), transport::kLinkSecurityKeys.begin(), transport::kLinkSecurityKeys.end());
  auto unknown = top.unknownKeys(known);
  if (!unknown.empty()) return fail(Code::invalidArgument, config.origin() + ": unknown setting '" + unknown[0] + "'");
  auto security = transport::linkSecurityFrom(top);
  if (!security) return fail(security.error());
  out.security = *security;
  // Counts and times: [key, target, lo, hi].
  for (auto [key, target, lo, hi] : {std::tuple{"max_node_links", &out.maxNodeLinks, 1ll, 100000ll},
                                     std::tuple{"register_timeout_ms", &out.registerTimeoutMs, 100ll, 3600000ll},
                                     std::tuple{"max_vm_links", &out.maxVmLinks, 1ll, 1024ll},
                                     std::tuple{"http_client_timeout_s", &out.httpClientTimeoutS, 1ll, 3600ll},
                                     std::tuple{"resume_grace_ms", &out.resumeGraceMs, 0ll, 86400000ll},
                                     std::tuple{"startup_grace_ms", &out.startupGraceMs, 0ll, 3600000ll},
                                     std::tuple{"heartbeat_timeout_ms", &out.heartbeatTimeoutMs, 50ll, 3600000ll},
                                     std::tuple{"request_timeout_ms", &out.requestTimeoutMs, 10ll, 86400000ll},
                                     std::tuple{"defrag_moves_per_minute", &out.defragMovesPerMinute, 0ll, 100000ll}}) {
    auto v = top.getInt(key, *target, lo, hi);
    if (!v) return fail(v.error());
    *target = static_cast<unsigned>(*v);
  }
  auto forget = top.getInt("forget_offline_ms", static_cast<long long>(out.forgetOfflineMs), 0, 1ll << 50);
  if (!forget) return fail(forget.error());
  out.forgetOfflineMs = static_cast<uint64_t>(*forget);
  if (auto ok = endpointsFrom(config, out); !ok) return fail(ok.error());
  if (auto ok = placementFrom(top, out); !ok) return fail(ok.error());
  if (auto ok = vmsFrom(config, out); !ok) return fail(ok.error());
  return out;
}

}  // namespace raccel::scheduler
