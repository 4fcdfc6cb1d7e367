#include "scheduler/etcd/shared_pool.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>
#include <set>
#include <thread>
#include <tuple>

#include "common/limits.h"
#include "common/log.h"
#include "scheduler/admission.h"

namespace raccel::scheduler {
namespace {

using json = nlohmann::json;
namespace pb = etcd::pb;

constexpr size_t kMaxValueBytes = 1 << 20;   // a node of 1024 cards fits with room to spare
constexpr size_t kMaxRangesPerHolding = 4096;
constexpr size_t kMaxWhyBytes = 512;             // an unplaced vaccel's why, as the consoles show it
// A call etcd lost (a member died, its leader changed, or the client's connections are
// all still in their reconnect backoff) is tried again, 100 ms apart and more, for up to
// this long before the loss is reported. What it waits for: a restarted member found
// again (gRPC's reconnect backoff, 1 s here, then its connect) and a new leader elected
// (etcd's election timeout, 1 s by default), with room for a loaded machine; a fixed
// count of tries (about 1.5 s) ran out while a busy machine's member reconnected.
constexpr int64_t kLostCallBudgetMs = 6000;

// Paces the retries of one lost call: again() sleeps and says yes until the budget is spent.
class LostCall {
 public:
  bool again() {
    const auto now = std::chrono::steady_clock::now();
    if (now - start_ >= std::chrono::milliseconds(kLostCallBudgetMs)) return false;
    pauseMs_ = std::min<int64_t>(pauseMs_ + 100, 500);
    std::this_thread::sleep_for(std::chrono::milliseconds(pauseMs_));
    return true;
  }

 private:
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  int64_t pauseMs_ = 0;
};

// A name that becomes one segment of a key.
// An unsigned JSON number within [0, max], or an error naming `field`.
Result<uint64_t> number(const json& j, const char* field, uint64_t max) {
  auto it = j.find(field);
  if (it == j.end() || !it->is_number_unsigned()) return fail(Code::invalidArgument, std::string(field) + " is not a count");
  uint64_t v = it->get<uint64_t>();
  if (v > max) return fail(Code::invalidArgument, std::string(field) + " " + std::to_string(v) + " is past " + std::to_string(max));
  return v;
}

Result<json> parseJson(const std::string& value) {
  if (value.size() > kMaxValueBytes) return fail(Code::invalidArgument, "a value of " + std::to_string(value.size()) + " bytes");
  json j = json::parse(value, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return fail(Code::invalidArgument, "not a JSON object");
  return j;
}

// The pool's block size from its config value.
Result<double> parseBlockTflops(const std::string& value) {
  auto j = parseJson(value);
  if (!j || !j->contains("blockTflops") || !(*j)["blockTflops"].is_number() || !((*j)["blockTflops"].get<double>() > 0))
    return fail(Code::invalidArgument, "not a block size");
  return (*j)["blockTflops"].get<double>();
}

json hostJson(const HostVector& h) { return {{"cpuMilli", h.cpuMilli}, {"memoryMib", h.memoryMib}}; }

Result<HostVector> parseHost(const json& j) {
  auto it = j.find("host");
  if (it == j.end()) return HostVector{};
  if (!it->is_object()) return fail(Code::invalidArgument, "host is not an object");
  auto cpu = number(*it, "cpuMilli", limits::kMaxHostCpuMilli);
  if (!cpu) return fail(cpu.error());
  auto mem = number(*it, "memoryMib", limits::kMaxHostMemoryMib);
  if (!mem) return fail(mem.error());
  return HostVector{*cpu, *mem};
}

json cardJson(const CardSpec& c) {
  json programs = json::array();
  for (auto p : c.programKinds) programs.push_back(programKindName(p));
  return {{"index", c.index}, {"kind", kindName(c.kind)}, {"model", c.model}, {"backend", c.backend},
          {"tflops", c.tflops}, {"memoryBytes", c.memoryBytes}, {"programs", programs}};
}

Result<ProgramKind> parseProgramKind(const std::string& name) {
  for (int k = 0; k <= static_cast<int>(ProgramKind::openclUnits); ++k)
    if (name == programKindName(static_cast<ProgramKind>(k))) return static_cast<ProgramKind>(k);
  return fail(Code::invalidArgument, "unknown program kind '" + limits::clip(name, 64) + "'");
}

Result<CardSpec> parseCard(const json& j) {
  if (!j.is_object()) return fail(Code::invalidArgument, "a card is not an object");
  CardSpec c;
  auto index = number(j, "index", UINT32_MAX);
  if (!index) return fail(index.error());
  c.index = static_cast<uint32_t>(*index);
  auto memory = number(j, "memoryBytes", limits::kMaxCardMemoryBytes);
  if (!memory) return fail(memory.error());
  c.memoryBytes = *memory;
  if (!j.contains("kind") || !j["kind"].is_string()) return fail(Code::invalidArgument, "a card has no kind");
  auto kind = parseKind(j["kind"].get<std::string>());
  if (!kind) return fail(kind.error());
  c.kind = *kind;
  if (!j.contains("tflops") || !j["tflops"].is_number()) return fail(Code::invalidArgument, "a card has no tflops");
  c.tflops = j["tflops"].get<double>();  // range-checked by Pool::checkNode
  for (const char* field : {"model", "backend"}) {
    auto it = j.find(field);
    if (it != j.end() && !it->is_string()) return fail(Code::invalidArgument, std::string(field) + " is not text");
  }
  c.model = j.value("model", "");
  c.backend = j.value("backend", "");
  auto programs = j.find("programs");
  if (programs != j.end()) {
    if (!programs->is_array() || programs->size() > 16) return fail(Code::invalidArgument, "programs is not a short list");
    for (auto& p : *programs) {
      if (!p.is_string()) return fail(Code::invalidArgument, "a program kind is not text");
      auto kind = parseProgramKind(p.get<std::string>());
      if (!kind) return fail(kind.error());
      c.programKinds.push_back(*kind);
    }
  }
  return c;
}

struct NodeRecord {
  uint32_t first = 0, blocks = 0;
  std::vector<CardSpec> cards;
  HostVector host;
};

Result<NodeRecord> parseNode(const std::string& value) {
  auto j = parseJson(value);
  if (!j) return fail(j.error());
  NodeRecord n;
  auto first = number(*j, "first", limits::kMaxPoolBlocks);
  if (!first) return fail(first.error());
  auto blocks = number(*j, "blocks", limits::kMaxBlocksPerNode);
  if (!blocks) return fail(blocks.error());
  if (*first == 0) return fail(Code::invalidArgument, "first block 0 (blocks count from 1)");
  n.first = static_cast<uint32_t>(*first);
  n.blocks = static_cast<uint32_t>(*blocks);
  auto host = parseHost(*j);
  if (!host) return fail(host.error());
  n.host = *host;
  auto cards = j->find("cards");
  if (cards == j->end() || !cards->is_array() || cards->size() > limits::kMaxCardsPerNode)
    return fail(Code::invalidArgument, "cards is not a list of at most " + std::to_string(limits::kMaxCardsPerNode));
  for (auto& c : *cards) {
    auto card = parseCard(c);
    if (!card) return fail(card.error());
    n.cards.push_back(std::move(*card));
  }
  return n;
}

std::string nodeValue(const NodeRecord& n) {
  json cards = json::array();
  for (auto& c : n.cards) cards.push_back(cardJson(c));
  return json{{"first", n.first}, {"blocks", n.blocks}, {"cards", cards}, {"host", hostJson(n.host)}}.dump();
}

// What a node of these cards holds, numbered by a pool of this block size.
Result<uint32_t> blocksOf(const std::string& name, const std::vector<CardSpec>& cards, HostVector host, double blockTflops) {
  Pool trial(blockTflops);
  auto index = trial.addNode(name, cards, host);
  if (!index) return fail(index.error());
  return trial.nodes()[*index].blocks.count;
}

void compareMod(pb::TxnRequest& txn, const std::string& key, int64_t mod) {
  auto* c = txn.add_compare();
  c->set_key(key);
  c->set_target(pb::Compare::MOD);
  c->set_result(pb::Compare::EQUAL);
  c->set_mod_revision(mod);
}

void put(pb::TxnRequest& txn, const std::string& key, const std::string& value, int64_t lease = 0) {
  auto* p = txn.add_success()->mutable_request_put();
  p->set_key(key);
  p->set_value(value);
  p->set_lease(lease);
}

// On failure, the whole prefix: the view is reloaded from it.
void readAllOnFailure(pb::TxnRequest& txn, const std::string& prefix) {
  auto* r = txn.add_failure()->mutable_request_range();
  r->set_key(prefix);
  r->set_range_end(etcd::prefixEnd(prefix));
}

const pb::RangeResponse* failureRange(const pb::TxnResponse& response) {
  for (auto& r : response.responses())
    if (r.has_response_range()) return &r.response_range();
  return nullptr;
}

// The `count` segments of a key PREFIX DIR/A/B/..., or an error naming `shape`.
Result<std::vector<std::string>> keySegments(const std::string& key, const std::string& prefix, const std::string& dir,
                                             size_t count, const char* shape) {
  const std::string head = prefix + dir;
  if (!key.starts_with(head)) return fail(Code::invalidArgument, std::string("not ") + shape);
  std::vector<std::string> parts;
  for (size_t at = head.size(); parts.size() <= count;) {
    size_t slash = key.find('/', at);
    parts.push_back(key.substr(at, slash == std::string::npos ? std::string::npos : slash - at));
    if (slash == std::string::npos) break;
    at = slash + 1;
  }
  if (parts.size() != count) return fail(Code::invalidArgument, std::string("not ") + shape);
  return parts;
}

// A scheduler's name in the value's "by".
Result<std::string> byOf(const json& j) {
  if (!j.contains("by") || !j["by"].is_string()) return fail(Code::invalidArgument, "by is not text");
  std::string by = j["by"].get<std::string>();
  if (auto ok = limits::checkKeyName("scheduler", by); !ok) return fail(ok.error());
  return by;
}

// A request about one scheduler's vaccel from another: key PREFIX DIR SCHEDULER/VACCEL,
// value a JSON object naming the asker in "by".
struct VaccelRequest {
  std::string scheduler;
  uint64_t vaccel = 0;
  std::string by;
  json value;
};
Result<uint64_t> parseVaccelId(const std::string& id);
Result<VaccelRequest> parseVaccelRequest(const std::string& key, const std::string& value, const std::string& prefix,
                                         const std::string& dir) {
  auto parts = keySegments(key, prefix, dir, 2, (dir + "SCHEDULER/VACCEL").c_str());
  if (!parts) return fail(parts.error());
  VaccelRequest r;
  r.scheduler = (*parts)[0];
  if (auto ok = limits::checkKeyName("scheduler", r.scheduler); !ok) return fail(ok.error());
  auto vaccel = parseVaccelId((*parts)[1]);
  if (!vaccel) return fail(vaccel.error());
  r.vaccel = *vaccel;
  auto j = parseJson(value);
  if (!j) return fail(j.error());
  auto by = byOf(*j);
  if (!by) return fail(by.error());
  r.by = *by;
  r.value = std::move(*j);
  return r;
}

json rangesJson(const std::vector<BlockRange>& ranges) {
  json out = json::array();
  for (auto& r : ranges) out.push_back({r.first, r.count});
  return out;
}

// `field`: a list of 1 to kMaxRangesPerHolding [first, count] within the pool's numbers.
Result<std::vector<BlockRange>> parseRanges(const json& j, const char* field) {
  auto ranges = j.find(field);
  if (ranges == j.end() || !ranges->is_array() || ranges->empty() || ranges->size() > kMaxRangesPerHolding)
    return fail(Code::invalidArgument, std::string(field) + " is not a list of 1 to " + std::to_string(kMaxRangesPerHolding));
  std::vector<BlockRange> out;
  for (auto& r : *ranges) {
    if (!r.is_array() || r.size() != 2 || !r[0].is_number_unsigned() || !r[1].is_number_unsigned())
      return fail(Code::invalidArgument, "a range is not [first, count]");
    uint64_t first = r[0].get<uint64_t>(), count = r[1].get<uint64_t>();
    if (first == 0 || count == 0 || first > limits::kMaxPoolBlocks || count > limits::kMaxPoolBlocks ||
        first + count > limits::kMaxPoolBlocks + 1)
      return fail(Code::invalidArgument, "range [" + std::to_string(first) + ", " + std::to_string(count) +
                                             "] is not within the pool's numbers");
    out.push_back({static_cast<uint32_t>(first), static_cast<uint32_t>(count)});
  }
  return out;
}

// A vaccel's id as a key segment: a decimal number from 1, below kForeignIds.
Result<uint64_t> parseVaccelId(const std::string& id) {
  if (id.empty() || id.size() > 19 || id.find_first_not_of("0123456789") != std::string::npos || id[0] == '0' ||
      std::stoull(id) >= SharedPool::kForeignIds)
    return fail(Code::invalidArgument, "vaccel '" + limits::clip(id, 32) + "' is not a number from 1 to 2^62 - 1");
  return std::stoull(id);
}

Result<std::string> vmOf(const json& j) {
  if (!j.contains("vm") || !j["vm"].is_string()) return fail(Code::invalidArgument, "vm is not text");
  std::string vm = j["vm"].get<std::string>();
  if (auto ok = limits::checkName("vm", vm); !ok) return fail(ok.error());
  return vm;
}

// The pool priority: a vaccel's priority and its service class (admission.h).
Result<int> poolPriorityOf(const json& j) {
  static const long long lowest = poolPriority(limits::kMinPriority, kServiceClasses - 1),
                         highest = poolPriority(limits::kMaxPriority, 0);
  auto it = j.find("priority");
  if (it == j.end() || !it->is_number_integer() || it->get<long long>() < lowest || it->get<long long>() > highest)
    return fail(Code::invalidArgument, "priority is not a pool priority from " + std::to_string(lowest) + " to " +
                                           std::to_string(highest));
  return static_cast<int>(it->get<long long>());
}

// A policy's settings ({"settings": {KEY: VALUE}}) within SharedPool's bounds.
Result<std::map<std::string, std::string>> settingsOf(const json& j) {
  auto it = j.find("settings");
  if (it == j.end() || !it->is_object() || it->size() > SharedPool::kMaxSettings)
    return fail(Code::invalidArgument, "settings is not an object of at most " + std::to_string(SharedPool::kMaxSettings) +
                                           " KEY: VALUE");
  std::map<std::string, std::string> out;
  for (auto& [key, value] : it->items()) {
    if (key.empty() || key.size() > SharedPool::kMaxSettingBytes ||
        key.find_first_not_of("abcdefghijklmnopqrstuvwxyz_") != std::string::npos)
      return fail(Code::invalidArgument, "setting '" + limits::clip(key, 40) + "' is not a key of lower-case letters and '_'");
    const std::string text = value.is_string() ? value.get<std::string>() : std::string();
    if (text.empty() || text.size() > SharedPool::kMaxSettingBytes ||
        std::any_of(text.begin(), text.end(), [](char c) { return c < 0x20 || c > 0x7e; }))
      return fail(Code::invalidArgument, "setting " + key + " is not text of 1 to " +
                                             std::to_string(SharedPool::kMaxSettingBytes) + " printable bytes");
    out[key] = text;
  }
  return out;
}


}  // namespace

Result<SharedPreemption> SharedPool::parsePreemption(const std::string& key, const std::string& value,
                                                     const std::string& prefix) {
  auto parts = keySegments(key, prefix, "preempt/", 4, "preempt/SCHEDULER/VACCEL/BY/FOR");
  if (!parts) return fail(parts.error());
  SharedPreemption p;
  p.victimScheduler = (*parts)[0];
  p.by = (*parts)[2];
  if (auto ok = limits::checkKeyName("scheduler", p.victimScheduler); !ok) return fail(ok.error());
  if (auto ok = limits::checkKeyName("scheduler", p.by); !ok) return fail(ok.error());
  if (p.by == p.victimScheduler) return fail(Code::invalidArgument, "a scheduler preempts its own vaccels itself");
  auto victim = parseVaccelId((*parts)[1]);
  if (!victim) return fail(victim.error());
  auto forVaccel = parseVaccelId((*parts)[3]);
  if (!forVaccel) return fail(forVaccel.error());
  p.victim = *victim;
  p.forVaccel = *forVaccel;
  auto j = parseJson(value);
  if (!j) return fail(j.error());
  auto vm = vmOf(*j);
  if (!vm) return fail(vm.error());
  p.vm = *vm;
  auto priority = poolPriorityOf(*j);
  if (!priority) return fail(priority.error());
  p.priority = *priority;
  return p;
}

Result<SharedUsage> SharedPool::parseUsage(const std::string& key, const std::string& value, const std::string& prefix) {
  auto parts = keySegments(key, prefix, "usage/", 2, "usage/SCHEDULER/VM");
  if (!parts) return fail(parts.error());
  SharedUsage u;
  u.scheduler = (*parts)[0];
  u.vm = (*parts)[1];
  if (auto ok = limits::checkKeyName("scheduler", u.scheduler); !ok) return fail(ok.error());
  if (auto ok = limits::checkKeyName("vm", u.vm); !ok) return fail(ok.error());
  auto j = parseJson(value);
  if (!j) return fail(j.error());
  // Block-seconds: the whole pool for a century stays far below 1e18; times are seconds
  // since the epoch on the policy clock (which may run faster than the wall).
  constexpr double kMaxUsed = 1e18, kMaxAt = 1e15;
  for (auto [field, max, out] : {std::tuple{"used", kMaxUsed, &u.used}, std::tuple{"at", kMaxAt, &u.at}}) {
    auto it = j->find(field);
    if (it == j->end() || !it->is_number() || !std::isfinite(it->get<double>()) || it->get<double>() < 0 || it->get<double>() > max)
      return fail(Code::invalidArgument, std::string(field) + " is not a number from 0 to " + std::to_string(max));
    *out = it->get<double>();
  }
  auto blocks = number(*j, "blocks", limits::kMaxPoolBlocks);
  if (!blocks) return fail(blocks.error());
  u.blocks = static_cast<uint32_t>(*blocks);
  return u;
}

Result<SharedMove> SharedPool::parseMove(const std::string& key, const std::string& value, const std::string& prefix) {
  auto r = parseVaccelRequest(key, value, prefix, "moves/");
  if (!r) return fail(r.error());
  SharedMove m{r->scheduler, r->vaccel, r->by, {}, {}};
  const json* j = &r->value;
  auto from = parseRanges(*j, "from");
  if (!from) return fail(from.error());
  auto to = parseRanges(*j, "to");
  if (!to) return fail(to.error());
  if (to->size() != 1) return fail(Code::invalidArgument, "to is not one range");
  m.from = std::move(*from);
  m.to = (*to)[0];
  return m;
}

Result<SharedAction> SharedPool::parseAction(const std::string& key, const std::string& value, const std::string& prefix) {
  auto r = parseVaccelRequest(key, value, prefix, "actions/");
  if (!r) return fail(r.error());
  SharedAction a{r->scheduler, r->vaccel, r->by, true};
  const json* j = &r->value;
  const std::string action = j->contains("action") && (*j)["action"].is_string() ? (*j)["action"].get<std::string>() : "";
  if (action != "preempt" && action != "resume") return fail(Code::invalidArgument, "action is not preempt or resume");
  a.preempt = action == "preempt";
  return a;
}

Result<SharedVm> SharedPool::parseVm(const std::string& key, const std::string& value, const std::string& prefix) {
  auto parts = keySegments(key, prefix, "vms/", 2, "vms/SCHEDULER/VM");
  if (!parts) return fail(parts.error());
  SharedVm v{(*parts)[0], (*parts)[1], {}};
  if (auto ok = limits::checkKeyName("scheduler", v.scheduler); !ok) return fail(ok.error());
  if (auto ok = limits::checkKeyName("vm", v.vm); !ok) return fail(ok.error());
  auto j = parseJson(value);
  if (!j) return fail(j.error());
  auto settings = settingsOf(*j);
  if (!settings) return fail(settings.error());
  v.settings = std::move(*settings);
  return v;
}

Result<SharedUnplaced> SharedPool::parseUnplaced(const std::string& key, const std::string& value, const std::string& prefix) {
  auto parts = keySegments(key, prefix, "unplaced/", 2, "unplaced/SCHEDULER/VACCEL");
  if (!parts) return fail(parts.error());
  SharedUnplaced u;
  u.scheduler = (*parts)[0];
  if (auto ok = limits::checkKeyName("scheduler", u.scheduler); !ok) return fail(ok.error());
  auto id = parseVaccelId((*parts)[1]);
  if (!id) return fail(id.error());
  u.vaccel = *id;
  auto j = parseJson(value);
  if (!j) return fail(j.error());
  auto vm = vmOf(*j);
  if (!vm) return fail(vm.error());
  u.vm = *vm;
  auto priority = j->find("priority");
  if (priority == j->end() || !priority->is_number_integer() || priority->get<long long>() < limits::kMinPriority ||
      priority->get<long long>() > limits::kMaxPriority)
    return fail(Code::invalidArgument, "priority is not a priority from " + std::to_string(limits::kMinPriority) + " to " +
                                           std::to_string(limits::kMaxPriority));
  u.priority = static_cast<int>(priority->get<long long>());
  auto text = [&](const char* field, size_t max, std::string& out) -> Status {
    auto it = j->find(field);
    if (it == j->end()) return {};
    if (!it->is_string() || it->get<std::string>().size() > max)
      return fail(Code::invalidArgument, std::string(field) + " is not text of at most " + std::to_string(max) + " bytes");
    out = it->get<std::string>();
    return {};
  };
  if (auto ok = text("program", limits::kMaxNameBytes, u.program); !ok) return fail(ok.error());
  if (auto ok = text("why", kMaxWhyBytes, u.why); !ok) return fail(ok.error());
  if (auto ok = text("state", 16, u.state); !ok) return fail(ok.error());
  if (u.state != "waiting" && u.state != "suspended") return fail(Code::invalidArgument, "state is not waiting or suspended");
  auto blocks = number(*j, "blocks", limits::kMaxPoolBlocks);
  if (!blocks) return fail(blocks.error());
  u.blocks = static_cast<uint32_t>(*blocks);
  return u;
}

Result<SharedDrain> SharedPool::parseDrain(const std::string& key, const std::string& value, const std::string& prefix) {
  auto parts = keySegments(key, prefix, "drains/", 1, "drains/NODE");
  if (!parts) return fail(parts.error());
  SharedDrain d{(*parts)[0], {}};
  if (auto ok = limits::checkKeyName("netaccel", d.node); !ok) return fail(ok.error());
  auto j = parseJson(value);
  if (!j) return fail(j.error());
  auto by = byOf(*j);
  if (!by) return fail(by.error());
  d.by = *by;
  return d;
}

Result<SharedPolicy> SharedPool::parsePolicy(const std::string& key, const std::string& value, const std::string& prefix) {
  auto parts = keySegments(key, prefix, "policies/", 1, "policies/VM");
  if (!parts) return fail(parts.error());
  SharedPolicy p{(*parts)[0], {}, {}};
  if (auto ok = limits::checkKeyName("vm", p.vm); !ok) return fail(ok.error());
  auto j = parseJson(value);
  if (!j) return fail(j.error());
  auto by = byOf(*j);
  if (!by) return fail(by.error());
  p.by = *by;
  auto settings = settingsOf(*j);
  if (!settings) return fail(settings.error());
  p.settings = std::move(*settings);
  return p;
}

std::string SharedPool::preemptionKey(const SharedPreemption& p) {
  return "preempt/" + p.victimScheduler + "/" + std::to_string(p.victim) + "/" + p.by + "/" + std::to_string(p.forVaccel);
}

Result<SharedHolding> SharedPool::parseHolding(const std::string& key, const std::string& value, const std::string& prefix) {
  auto parts = keySegments(key, prefix, "holds/", 2, "holds/SCHEDULER/VACCEL");
  if (!parts) return fail(parts.error());
  SharedHolding h;
  h.scheduler = (*parts)[0];
  if (auto ok = limits::checkKeyName("scheduler", h.scheduler); !ok) return fail(ok.error());
  auto id = parseVaccelId((*parts)[1]);
  if (!id) return fail(id.error());
  h.vaccel = *id;
  auto j = parseJson(value);
  if (!j) return fail(j.error());
  auto vm = vmOf(*j);
  if (!vm) return fail(vm.error());
  h.vm = *vm;
  auto priority = poolPriorityOf(*j);
  if (!priority) return fail(priority.error());
  h.priority = *priority;
  if (j->contains("cardMilli")) {
    auto milli = number(*j, "cardMilli", 1000);
    if (!milli) return fail(milli.error());
    h.cardMilli = static_cast<uint32_t>(*milli);
  }
  auto host = parseHost(*j);
  if (!host) return fail(host.error());
  h.host = *host;
  auto ranges = parseRanges(*j, "ranges");
  if (!ranges) return fail(ranges.error());
  h.ranges = std::move(*ranges);
  if (auto it = j->find("program"); it != j->end()) {
    if (!it->is_string() || it->get<std::string>().size() > limits::kMaxNameBytes)
      return fail(Code::invalidArgument, "program is not a name of at most " + std::to_string(limits::kMaxNameBytes) + " bytes");
    h.program = it->get<std::string>();
  }
  return h;
}

std::string SharedPool::holdingValue(const SharedHolding& h) {
  json value{{"vm", h.vm}, {"priority", h.priority}, {"ranges", rangesJson(h.ranges)}, {"host", hostJson(h.host)},
             {"cardMilli", h.cardMilli}};
  if (!h.program.empty()) value["program"] = h.program;
  // A guest's program name may be any bytes: what is not UTF-8 is replaced, not thrown on.
  return value.dump(-1, ' ', false, json::error_handler_t::replace);
}

void SharedPool::nameProgram(uint64_t vaccel, const std::string& program) {
  std::lock_guard lock(mutex_);
  if (program.empty()) programs_.erase(vaccel);
  else programs_[vaccel] = program.substr(0, limits::kMaxNameBytes);
}

Result<std::unique_ptr<SharedPool>> SharedPool::open(etcd::Client& client, SharedPoolOptions options) {
  if (auto ok = limits::checkKeyName("scheduler name", options.scheduler); !ok) return fail(ok.error());
  if (options.prefix.empty() || options.prefix.back() != '/' || options.prefix.size() > 256)
    return fail(Code::invalidArgument, "the etcd prefix must end in '/' (got '" + limits::clip(options.prefix, 64) + "')");
  if (options.leaseTtlSeconds < 1 || options.leaseTtlSeconds > 3600)
    return fail(Code::invalidArgument, "the lease TTL must be 1 to 3600 seconds");
  if (options.maxAttempts < 1) options.maxAttempts = 1;
  // The block size: the first scheduler sets it, the others must match.
  std::string configKey = options.prefix + "config";
  std::string config = json{{"blockTflops", options.blockTflops}}.dump();
  pb::TxnRequest set;
  compareMod(set, configKey, 0);  // absent
  put(set, configKey, config);
  auto* read = set.add_failure()->mutable_request_range();
  read->set_key(configKey);
  auto answer = client.txn(set);
  if (!answer) return fail(answer.error());
  if (!answer->succeeded()) {
    auto* r = failureRange(*answer);
    auto theirs = parseBlockTflops(r && r->kvs_size() == 1 ? r->kvs(0).value() : "");
    if (!theirs) return fail(Code::internal, client.describe() + ": " + configKey + " does not parse; fix or remove it");
    if (std::abs(*theirs - options.blockTflops) > 1e-9)
      return fail(Code::invalidArgument, "the shared pool's blocks are " + std::to_string(*theirs) +
                                             " TFLOPS; this scheduler's block_tflops must match");
  }
  auto lease = client.grantLease(options.leaseTtlSeconds);
  if (!lease) return fail(lease.error());
  // This scheduler's name, under its lease: refused while another live one has it.
  std::string self = options.prefix + "schedulers/" + options.scheduler;
  pb::TxnRequest join;
  compareMod(join, self, 0);  // absent
  put(join, self, json{{"lease", *lease}}.dump(), *lease);
  auto joined = client.txn(join);
  if (!joined) return fail(joined.error());
  if (!joined->succeeded()) {
    (void)client.revokeLease(*lease);
    return fail(Code::invalidArgument, "a live scheduler named '" + options.scheduler + "' is already in the pool at " +
                                           client.describe() + " (names are unique; wait for its lease to expire)");
  }
  std::unique_ptr<SharedPool> shared(new SharedPool(client, std::move(options), *lease));
  if (auto ok = shared->load(); !ok) return fail(ok.error());
  return shared;
}

SharedPool::SharedPool(etcd::Client& client, SharedPoolOptions options, int64_t lease)
    : client_(client), options_(std::move(options)), lease_(lease), pool_(options_.blockTflops) {
  startKeeper();
}

void SharedPool::startKeeper() {
  if (!options_.keepAlive) return;
  keeper_ = std::make_unique<etcd::LeaseKeeper>(client_, lease_, options_.leaseTtlSeconds, [this] {
    RLOG_ERROR("shared-pool") << "scheduler " << options_.scheduler << " lost its etcd lease: its holdings were freed";
    leaseLost_ = true;
    if (options_.onLeaseLost) options_.onLeaseLost();
  });
}

Status SharedPool::rejoin() {
  keeper_.reset();
  auto lease = client_.grantLease(options_.leaseTtlSeconds);
  if (!lease) return fail(lease.error());
  std::string self = options_.prefix + "schedulers/" + options_.scheduler;
  pb::TxnRequest join;
  compareMod(join, self, 0);  // absent: the old registration went with the old lease
  put(join, self, selfValue(*lease), *lease);
  auto joined = client_.txn(join);
  if (!joined || !joined->succeeded()) {
    (void)client_.revokeLease(*lease);
    return joined ? fail(Code::unavailable, "scheduler '" + options_.scheduler + "' is registered again by someone else")
                  : fail(joined.error());
  }
  lease_ = *lease;
  leaseLost_ = false;
  publishedVms_.clear();  // they ended with the old lease
  publishedUnplaced_.clear();
  startKeeper();
  RLOG_INFO("shared-pool") << "scheduler " << options_.scheduler << " rejoined the pool under a new lease";
  return {};
}

Status SharedPool::claim(uint64_t vaccel, const std::string& vm, const std::vector<BlockRange>& ranges, int priority,
                         HostVector host) {
  if (vaccel == 0 || vaccel >= kForeignIds) return fail(Code::invalidArgument, "vaccel ids are 1 to 2^62 - 1");
  std::string holdKey = "holds/" + options_.scheduler + "/" + std::to_string(vaccel);
  SharedHolding h{options_.scheduler, vaccel, vm, priority, ranges, host, 0};
  {
    std::lock_guard lock(mutex_);
    if (auto it = programs_.find(vaccel); it != programs_.end()) h.program = it->second;
  }
  for (uint32_t attempt = 0; attempt < options_.maxAttempts; ++attempt) {
    pb::TxnRequest txn;
    {
      std::lock_guard lock(mutex_);
      rebuild();
      VaccelId mine = localId(options_.scheduler, vaccel);
      for (auto& r : ranges)
        for (uint32_t b = r.first; b < r.end(); ++b) {
          if (b == 0 || b > pool_.highestBlock() || pool_.cardOf(b) < 0)
            return fail(Code::invalidArgument, "block " + std::to_string(b) + " is not in the pool");
          if (pool_.ownerOf(b) != kNoOwner && pool_.ownerOf(b) != mine)
            return fail(Code::resourceExhausted, "block " + std::to_string(b) + " is held by another vaccel now");
        }
      compareVersions(txn, ranges, host, vaccel);
      compareMod(txn, options_.prefix + holdKey, modOf(holdKey));
    }
    put(txn, options_.prefix + holdKey, holdingValue(h), lease_);
    auto committed = commit(txn);
    if (!committed) return fail(committed.error());
    if (*committed) return {};
  }
  return fail(Code::unavailable, "vaccel " + std::to_string(vaccel) + "'s blocks could not be claimed: the pool kept changing");
}

SharedPool::~SharedPool() {
  watcher_.reset();
  keeper_.reset();
}

Result<bool> SharedPool::campaign() {
  // The leader key names a live scheduler: it leads. Absent, or naming none that lives
  // (written by hand, or without a lease), it is taken: the transaction compares the
  // revision read, so two campaigns never both win.
  int64_t mod = 0;
  std::string stale;
  {
    std::lock_guard lock(mutex_);
    auto it = keys_.find("leader");
    if (it != keys_.end()) {
      std::string name = leaderNamed(it->second.value);
      if (!name.empty() && keys_.count("schedulers/" + name)) return name == options_.scheduler && !leaseLost_;
      mod = it->second.modRevision;
      stale = limits::clip(it->second.value, 64);
    }
  }
  const std::string key = options_.prefix + "leader";
  pb::TxnRequest txn;
  compareMod(txn, key, mod);
  put(txn, key, json{{"scheduler", options_.scheduler}}.dump(), lease_);
  auto answer = client_.txn(txn);
  if (!answer) return fail(answer.error());
  std::unique_lock lock(mutex_);
  catchUp(lock, answer->header().revision());
  lock.unlock();
  if (answer->succeeded())
    RLOG_INFO("shared-pool") << "scheduler " << options_.scheduler << " leads the pool (it plans the moves)"
                             << (stale.empty() ? "" : "; the leader key named no live scheduler: " + stale);
  return answer->succeeded() || leads();
}

std::string SharedPool::leaderNamed(const std::string& value) {
  auto j = parseJson(value);
  if (!j || !j->contains("scheduler") || !(*j)["scheduler"].is_string()) return {};
  std::string name = (*j)["scheduler"].get<std::string>();
  return limits::checkKeyName("scheduler", name) ? name : std::string();
}

std::string SharedPool::leader() {
  std::lock_guard lock(mutex_);
  auto it = keys_.find("leader");
  if (it == keys_.end()) return {};
  std::string name = leaderNamed(it->second.value);
  return keys_.count("schedulers/" + name) ? name : std::string();
}

bool SharedPool::leads() { return !leaseLost_ && leader() == options_.scheduler; }

Status SharedPool::leave() {
  keeper_.reset();
  return client_.revokeLease(lease_);
}

Status SharedPool::load() {
  auto all = client_.range(options_.prefix);
  for (LostCall lost; !all && all.error().code == Code::unavailable && lost.again();) all = client_.range(options_.prefix);
  if (!all) return fail(all.error());
  {
    std::lock_guard lock(mutex_);
    loadFrom(*all);
  }
  startWatch(all->header().revision() + 1);
  if (options_.onChange) options_.onChange();
  return {};
}

void SharedPool::startWatch(int64_t fromRevision) {
  watcher_.reset();  // joins its thread (ended, or stopped now)
  {
    std::lock_guard lock(mutex_);
    watchBroken_ = false;
  }
  watcher_ = std::make_unique<etcd::Watcher>(
      client_, options_.prefix, fromRevision, false,
      [this](std::vector<mvccpb::Event> events, int64_t revision) {
        apply(events, revision);
        if (options_.onChange && !events.empty()) options_.onChange();
      },
      [this](Error error) {
        RLOG_WARN("shared-pool") << error.message << " (the view is re-read at the next decision)";
        std::lock_guard lock(mutex_);
        watchBroken_ = true;
      });
}

void SharedPool::loadFrom(const pb::RangeResponse& r) {
  // A transaction's answer can be older than what the watch has brought since: the
  // view is then newer than it, and stays (replacing it would lose those events).
  if (r.header().revision() < revision_) return;
  keys_.clear();
  for (auto& kv : r.kvs())
    if (kv.key().starts_with(options_.prefix))
      keys_[kv.key().substr(options_.prefix.size())] = Key{kv.value(), kv.mod_revision(), kv.create_revision()};
  revision_ = std::max(revision_, r.header().revision());
  loadedAt_ = r.header().revision();
  dirty_ = true;
  advanced_.notify_all();
}

void SharedPool::apply(const std::vector<mvccpb::Event>& events, int64_t revision) {
  std::lock_guard lock(mutex_);
  for (auto& e : events) {
    const auto& kv = e.kv();
    // Older than the last full read: already in it (and a put from before it of a key
    // since deleted must not come back).
    if (!kv.key().starts_with(options_.prefix) || kv.mod_revision() <= loadedAt_) continue;
    std::string key = kv.key().substr(options_.prefix.size());
    auto it = keys_.find(key);
    if (e.type() == mvccpb::Event::PUT) {
      if (it != keys_.end() && it->second.modRevision >= kv.mod_revision()) continue;  // already seen
      keys_[key] = Key{kv.value(), kv.mod_revision(), kv.create_revision()};
    } else {
      if (it == keys_.end() || it->second.modRevision >= kv.mod_revision()) continue;
      keys_.erase(it);
    }
    dirty_ = true;
    revision_ = std::max(revision_, kv.mod_revision());
  }
  if (events.empty()) revision_ = std::max(revision_, revision);  // a progress report
  advanced_.notify_all();
}

void SharedPool::catchUp(std::unique_lock<std::mutex>& lock, int64_t revision) {
  // The view stays a prefix of the pool's history: a decision shows in it when the
  // watch brings it, in order with everyone else's.
  if (!advanced_.wait_for(lock, std::chrono::milliseconds(client_.callTimeoutMs()),
                          [&] { return revision_ >= revision || watchBroken_; }) ||
      watchBroken_)
    watchBroken_ = true;  // the next decision re-reads
}

bool SharedPool::waitForRevision(int64_t revision, uint32_t timeoutMs) {
  std::unique_lock lock(mutex_);
  return advanced_.wait_for(lock, std::chrono::milliseconds(timeoutMs), [&] { return revision_ >= revision; });
}

VaccelId SharedPool::localId(const std::string& scheduler, uint64_t vaccel) {
  if (scheduler == options_.scheduler && vaccel < kForeignIds) return vaccel;
  auto [it, added] = localIds_.try_emplace({scheduler, vaccel}, nextForeign_);
  if (added) ++nextForeign_;
  return it->second;
}

bool SharedPool::addNodeRecord(const std::string& name, const std::string& value) {
  auto refuse = [&](const std::string& why) {
    noteRefused("nodes/" + name, why);
    return false;
  };
  if (auto ok = limits::checkKeyName("node name", name); !ok) return refuse(ok.error().message);
  auto record = parseNode(value);
  if (!record) return refuse(record.error().message);
  if (record->first != pool_.highestBlock() + 1)
    return refuse("its numbers start at " + std::to_string(record->first) + ", not at the next free number " +
                  std::to_string(pool_.highestBlock() + 1));
  auto index = pool_.addNode(name, record->cards, record->host);
  if (!index) return refuse(index.error().message);
  if (pool_.nodes()[*index].blocks.count != record->blocks) {
    // Numbers already given cannot be taken back: the rest of the numbering would move.
    return refuse("its cards make " + std::to_string(pool_.nodes()[*index].blocks.count) + " blocks, not the " +
                  std::to_string(record->blocks) + " it claims (the nodes numbered after it may be refused)");
  }
  return true;
}

void SharedPool::holdGap(uint32_t first) {
  const uint64_t next = uint64_t{pool_.highestBlock()} + 1;
  if (first <= next) return;
  const uint64_t gap = first - next;
  if (gap > limits::kMaxBlocksPerNode) return;  // the node after it is refused, and the rest with it
  std::vector<CardSpec> cards;
  for (uint64_t left = gap; left > 0;) {
    uint64_t n = std::min<uint64_t>(left, limits::kMaxBlocksPerCard);
    CardSpec c;
    c.kind = CardKind::cpu;
    c.index = static_cast<uint32_t>(cards.size());
    c.tflops = static_cast<double>(n) * options_.blockTflops;
    c.model = "numbers of a refused node record";
    cards.push_back(c);
    left -= n;
  }
  if (auto index = pool_.addNode(kGapPrefix + std::to_string(next), cards, {})) pool_.removeNode(*index);
}

void SharedPool::rebuild() {
  if (!dirty_) return;
  pool_ = Pool(options_.blockTflops);
  holdings_.clear();
  // Nodes in their numbering order; each must start where the last ended.
  std::vector<std::pair<uint32_t, std::string>> order;
  for (auto it = keys_.lower_bound("nodes/"); it != keys_.end() && it->first.starts_with("nodes/"); ++it) {
    auto j = parseJson(it->second.value);
    uint64_t first = j && j->contains("first") && (*j)["first"].is_number_unsigned() ? (*j)["first"].get<uint64_t>() : 0;
    order.push_back({static_cast<uint32_t>(std::min<uint64_t>(first, UINT32_MAX)), it->first.substr(6)});
  }
  std::sort(order.begin(), order.end());
  for (auto& [first, name] : order) {
    holdGap(first);
    addNodeRecord(name, keys_["nodes/" + name].value);
  }
  for (size_t i = 0; i < pool_.nodes().size(); ++i)
    if (pool_.nodes()[i].online && (pool_.nodes()[i].name.starts_with(kGapPrefix) || !keys_.count("online/" + pool_.nodes()[i].name)))
      pool_.removeNode(i);
  // Holdings in the order they were first committed: an overlap loses to what came first.
  std::vector<std::pair<int64_t, std::string>> holds;
  for (auto it = keys_.lower_bound("holds/"); it != keys_.end() && it->first.starts_with("holds/"); ++it)
    holds.push_back({it->second.createRevision, it->first});
  std::sort(holds.begin(), holds.end());
  for (auto& [created, key] : holds) {
    auto h = parseHolding(options_.prefix + key, keys_[key].value, options_.prefix);
    Status placed = h ? pool_.assign(localId(h->scheduler, h->vaccel), h->ranges, h->priority, h->host, h->cardMilli)
                      : Status(fail(h.error()));
    if (!placed) {
      noteRefused(key, placed.error().message);
      if (h) quarantine(h->ranges, created);
      continue;
    }
    h->createRevision = created;
    holdings_.push_back(std::move(*h));
  }
  readRecords("preempt/", "preemption requests", &SharedPool::parsePreemption, &SharedPreemption::by, preemptions_);
  readRecords("usage/", "usage records", &SharedPool::parseUsage, &SharedUsage::scheduler, usage_);
  readRecords("moves/", "move requests", &SharedPool::parseMove, &SharedMove::by, moves_);
  readRecords("actions/", "operators' actions", &SharedPool::parseAction, &SharedAction::by, actions_);
  readRecords("vms/", "VM records", &SharedPool::parseVm, &SharedVm::scheduler, vms_);
  readRecords("unplaced/", "unplaced vaccels", &SharedPool::parseUnplaced, &SharedUnplaced::scheduler, unplaced_);
  // Operators' drains and policies outlive whoever was asked: no scheduler to check.
  readRecords("drains/", "drains", &SharedPool::parseDrain, static_cast<std::string SharedDrain::*>(nullptr), drains_);
  readRecords("policies/", "VM policies", &SharedPool::parsePolicy, static_cast<std::string SharedPolicy::*>(nullptr), policies_);
  // Ids of holdings that are gone are dropped (bounded by what the pool holds now).
  if (localIds_.size() > 2 * holdings_.size() + 64)
    std::erase_if(localIds_, [&](const auto& entry) { return pool_.held(entry.second).empty(); });
  dirty_ = false;
}

template <typename Record>
void SharedPool::readRecords(const std::string& dir, const char* what,
                             Result<Record> (*parse)(const std::string&, const std::string&, const std::string&),
                             std::string Record::*scheduler, std::vector<Record>& out) {
  out.clear();
  for (auto it = keys_.lower_bound(dir); it != keys_.end() && it->first.starts_with(dir); ++it) {
    auto record = parse(options_.prefix + it->first, it->second.value, options_.prefix);
    if (!record) {
      noteRefused(it->first, record.error().message);
      continue;
    }
    // Only a live scheduler's record stands: one its lease did not end (written without
    // one) must not hold anyone back, or count, for good.
    if (scheduler && !keys_.count("schedulers/" + (*record).*scheduler)) {
      noteRefused(it->first, "scheduler '" + (*record).*scheduler + "' is not in the pool");
      continue;
    }
    if (out.size() >= kMaxRecords) {
      noteRefused(it->first, "more than " + std::to_string(kMaxRecords) + " " + what);
      continue;
    }
    out.push_back(std::move(*record));
  }
}

void SharedPool::noteRefused(const std::string& key, const std::string& why) {
  // Once per value: the view is rebuilt often, the log should not repeat itself.
  auto it = keys_.find(key);
  if (refusedSeen_.size() >= 4096) refusedSeen_.clear();  // bounded: a flood is logged again, never held
  if (!refusedSeen_.insert({key, it == keys_.end() ? 0 : it->second.modRevision}).second) return;
  ++stats_.refusedValues;
  RLOG_WARN("shared-pool") << "refused " << options_.prefix << limits::clip(key, 128) << ": " << limits::clip(why);
}

void SharedPool::quarantine(const std::vector<BlockRange>& ranges, int64_t created) {
  // A refused holding may still be someone's: its blocks that nobody else holds are
  // kept from placement, so a bad value can never lead to a block held twice.
  std::vector<BlockRange> free;
  for (auto& r : ranges)
    for (uint32_t b = r.first; b < r.end() && b <= pool_.highestBlock(); ++b)
      if (pool_.ownerOf(b) == kNoOwner && pool_.cardOf(b) >= 0) {
        if (!free.empty() && free.back().end() == b) ++free.back().count;
        else free.push_back({b, 1});
      }
  if (!free.empty()) (void)pool_.assign(localId("#refused", static_cast<uint64_t>(created)), free, limits::kMaxPriority);
}

std::string SharedPool::cardKey(size_t card) const {
  const Card& c = pool_.cards()[card];
  return "cards/" + pool_.nodes()[c.node].name + "/" + std::to_string(c.spec.index);
}

void SharedPool::compareVersions(pb::TxnRequest& txn, const std::vector<BlockRange>& ranges, const HostVector& host,
                                 uint64_t vaccel) const {
  // The versions the view read: of every card the ranges take, and with host needs of
  // their node's host. The transaction compares and rewrites each.
  std::set<std::string> versioned;
  for (auto& share : pool_.cardsOf(ranges)) versioned.insert(cardKey(share.card));
  if (!host.empty() && !ranges.empty())
    versioned.insert("hosts/" + pool_.nodes()[pool_.cards()[static_cast<size_t>(pool_.cardOf(ranges[0].first))].node].name);
  for (const std::string& key : versioned) {
    compareMod(txn, options_.prefix + key, modOf(key));
    put(txn, options_.prefix + key, std::to_string(vaccel));
  }
}

int64_t SharedPool::modOf(const std::string& key) const {
  auto it = keys_.find(key);
  return it == keys_.end() ? 0 : it->second.modRevision;
}

Result<std::optional<std::vector<BlockRange>>> SharedPool::tryAllocate(uint64_t vaccel, const std::string& vm,
                                                                       const Pool::Request& request,
                                                                       const std::set<std::string>* usable) {
  pb::TxnRequest txn;
  SharedHolding h{options_.scheduler, vaccel, vm, request.priority, {}, request.host,
                  request.shape == Pool::Shape::oneCard ? request.cardMilli : 0u};
  std::string holdKey = "holds/" + options_.scheduler + "/" + std::to_string(vaccel);
  VaccelId local;
  {
    std::lock_guard lock(mutex_);
    rebuild();
    if (keys_.count(holdKey)) return fail(Code::invalidArgument, "vaccel " + std::to_string(vaccel) + " already holds blocks");
    if (auto it = programs_.find(vaccel); it != programs_.end()) h.program = it->second;
    local = localId(options_.scheduler, vaccel);
    // Nodes it may not use are closed to this placement (drained for its length).
    std::vector<size_t> closed;
    if (usable)
      for (size_t i = 0; i < pool_.nodes().size(); ++i)
        if (pool_.nodes()[i].placeable() && !usable->count(pool_.nodes()[i].name)) {
          pool_.setDraining(i, true);
          closed.push_back(i);
        }
    auto ranges = pool_.allocate(local, request);
    for (size_t i : closed) pool_.setDraining(i, false);
    if (!ranges) return fail(ranges.error());
    h.ranges = *ranges;
    compareVersions(txn, h.ranges, request.host, vaccel);
    pool_.release(local);  // the view changes when etcd says so
  }
  put(txn, options_.prefix + holdKey, holdingValue(h), lease_);
  auto committed = commit(txn);
  if (!committed) return fail(committed.error());
  if (!*committed) return std::optional<std::vector<BlockRange>>();
  return std::optional<std::vector<BlockRange>>(h.ranges);
}

Result<bool> SharedPool::commit(pb::TxnRequest& txn) {
  readAllOnFailure(txn, options_.prefix);
  auto answer = client_.txn(txn);
  if (!answer) return fail(answer.error());
  std::unique_lock lock(mutex_);
  if (!answer->succeeded()) {
    ++stats_.conflicts;
    if (auto* r = failureRange(*answer)) loadFrom(*r);
    return false;
  }
  ++stats_.commits;
  catchUp(lock, answer->header().revision());
  return true;
}

Status SharedPool::refresh() {
  std::lock_guard once(refreshMutex_);  // one re-read at a time
  {
    std::lock_guard lock(mutex_);
    if (!watchBroken_ && watcher_) return {};
  }
  return load();
}

Result<std::optional<std::vector<BlockRange>>> SharedPool::committedHolding(uint64_t vaccel) {
  {
    std::lock_guard once(refreshMutex_);
    if (auto ok = load(); !ok) return fail(ok.error());
  }
  std::lock_guard lock(mutex_);
  std::string key = "holds/" + options_.scheduler + "/" + std::to_string(vaccel);
  auto it = keys_.find(key);
  if (it == keys_.end()) return std::optional<std::vector<BlockRange>>();
  auto h = parseHolding(options_.prefix + key, it->second.value, options_.prefix);
  if (!h) return fail(Code::internal, options_.prefix + key + " does not parse: " + h.error().message);
  return std::optional<std::vector<BlockRange>>(h->ranges);
}

Result<std::vector<BlockRange>> SharedPool::allocate(uint64_t vaccel, const std::string& vm, const Pool::Request& request,
                                                     const std::set<std::string>* usable) {
  if (vaccel == 0 || vaccel >= kForeignIds) return fail(Code::invalidArgument, "vaccel ids are 1 to 2^62 - 1");
  if (auto ok = refresh(); !ok) return fail(ok.error());
  std::optional<LostCall> lost;  // (lost calls are paced by their own budget, not counted as conflicts)
  for (uint32_t attempt = 0; attempt < options_.maxAttempts;) {
    auto placed = tryAllocate(vaccel, vm, request, usable);
    if (placed && *placed) return std::move(**placed);
    if (placed) {  // a conflict: placed again on the view it re-read
      ++attempt;
      continue;
    }
    if (placed.error().code != Code::unavailable) return fail(placed.error());
    if (!lost) lost.emplace();
    if (!lost->again()) return fail(placed.error());
    // etcd lost the call (a member died, its leader changed) and may have committed it:
    // the holding under this vaccel's key is then ours.
    auto mine = committedHolding(vaccel);
    if (mine && *mine) return std::move(**mine);
  }
  return fail(Code::unavailable, "the shared pool changed under " + std::to_string(options_.maxAttempts) +
                                     " placements in a row (other schedulers took the same cards); try again");
}

Status SharedPool::release(uint64_t vaccel) {
  std::string key = options_.prefix + "holds/" + options_.scheduler + "/" + std::to_string(vaccel);
  pb::TxnRequest txn;
  auto* d = txn.add_success()->mutable_request_delete_range();
  d->set_key(key);
  auto answer = client_.txn(txn);
  // A delete may be repeated: a call etcd lost is simply made again.
  for (LostCall lost; !answer && answer.error().code == Code::unavailable && lost.again();) answer = client_.txn(txn);
  if (!answer) return fail(answer.error());
  std::unique_lock lock(mutex_);
  ++stats_.commits;
  catchUp(lock, answer->header().revision());
  return {};
}

Status SharedPool::setPriority(uint64_t vaccel, int priority) {
  std::string key = "holds/" + options_.scheduler + "/" + std::to_string(vaccel);
  for (uint32_t attempt = 0; attempt < options_.maxAttempts; ++attempt) {
    pb::TxnRequest txn;
    {
      std::lock_guard lock(mutex_);
      auto it = keys_.find(key);
      if (it == keys_.end()) return {};
      auto h = parseHolding(options_.prefix + key, it->second.value, options_.prefix);
      if (!h) return fail(Code::internal, options_.prefix + key + " does not parse: " + h.error().message);
      h->priority = priority;
      compareMod(txn, options_.prefix + key, it->second.modRevision);
      put(txn, options_.prefix + key, holdingValue(*h), lease_);
    }
    auto committed = commit(txn);
    if (!committed) return fail(committed.error());
    if (*committed) return {};
  }
  return fail(Code::unavailable, "the priority of vaccel " + std::to_string(vaccel) + " could not be recorded: its holding kept changing");
}

Status SharedPool::requestPreemption(const SharedPreemption& p) {
  if (p.by != options_.scheduler) return fail(Code::invalidArgument, "a preemption is requested by its own scheduler");
  return putUnderLease(preemptionKey(p), json{{"vm", p.vm}, {"priority", p.priority}}.dump());
}

Status SharedPool::publishUsage(const SharedUsage& u) {
  if (u.scheduler != options_.scheduler) return fail(Code::invalidArgument, "a usage record is written by its own scheduler");
  if (auto ok = limits::checkKeyName("vm", u.vm); !ok) return fail(ok.error());
  return putUnderLease("usage/" + u.scheduler + "/" + u.vm, json{{"used", u.used}, {"at", u.at}, {"blocks", u.blocks}}.dump());
}

Status SharedPool::requestMove(const SharedMove& m) {
  if (m.by != options_.scheduler || !leads()) return fail(Code::invalidArgument, "only the pool's leader asks for moves");
  return putUnderLease("moves/" + m.scheduler + "/" + std::to_string(m.vaccel),
                       json{{"by", m.by}, {"from", rangesJson(m.from)}, {"to", rangesJson({m.to})}}.dump());
}

Status SharedPool::endMove(const std::string& scheduler, uint64_t vaccel) {
  return removeKey("moves/" + scheduler + "/" + std::to_string(vaccel));
}

Status SharedPool::requestAction(const SharedAction& a) {
  if (a.by != options_.scheduler) return fail(Code::invalidArgument, "an action is asked by its own scheduler");
  return putUnderLease("actions/" + a.scheduler + "/" + std::to_string(a.vaccel),
                       json{{"action", a.preempt ? "preempt" : "resume"}, {"by", a.by}}.dump());
}

Status SharedPool::endAction(const std::string& scheduler, uint64_t vaccel) {
  return removeKey("actions/" + scheduler + "/" + std::to_string(vaccel));
}

Status SharedPool::publishSet(const std::string& dir, const std::map<std::string, std::string>& want,
                              std::map<std::string, std::string>& published) {
  // etcd takes at most 128 operations in one transaction: a long list goes in several.
  constexpr size_t kOpsPerTxn = 64;
  std::vector<std::pair<std::string, const std::string*>> ops;  // key, value (null: delete)
  for (auto& [key, value] : want)
    if (auto it = published.find(key); it == published.end() || it->second != value) ops.push_back({key, &value});
  for (auto& [key, value] : published)
    if (!want.count(key)) ops.push_back({key, nullptr});
  for (size_t at = 0; at < ops.size(); at += kOpsPerTxn) {
    pb::TxnRequest txn;
    for (size_t i = at; i < std::min(ops.size(), at + kOpsPerTxn); ++i) {
      const std::string key = options_.prefix + dir + ops[i].first;
      if (ops[i].second) put(txn, key, *ops[i].second, lease_);
      else txn.add_success()->mutable_request_delete_range()->set_key(key);
    }
    auto answer = client_.txn(txn);
    if (!answer) return fail(answer.error());
    for (size_t i = at; i < std::min(ops.size(), at + kOpsPerTxn); ++i) {
      if (ops[i].second) published[ops[i].first] = *ops[i].second;
      else published.erase(ops[i].first);
    }
  }
  return {};
}

Status SharedPool::publishVms(const std::map<std::string, std::map<std::string, std::string>>& vms) {
  std::map<std::string, std::string> want;
  for (auto& [vm, settings] : vms) {
    if (!limits::checkKeyName("vm", vm)) continue;  // a name that cannot be one key segment
    want[options_.scheduler + "/" + vm] = json{{"settings", settings}}.dump();
  }
  return publishSet("vms/", want, publishedVms_);
}

Status SharedPool::publishUnplaced(const std::vector<SharedUnplaced>& unplaced) {
  std::map<std::string, std::string> want;
  for (auto& u : unplaced) {
    if (!limits::checkKeyName("vm", u.vm)) continue;
    json value{{"vm", u.vm}, {"priority", u.priority}, {"program", u.program.substr(0, limits::kMaxNameBytes)},
               {"state", u.state}, {"why", u.why.substr(0, kMaxWhyBytes)}, {"blocks", u.blocks}};
    want[options_.scheduler + "/" + std::to_string(u.vaccel)] = value.dump(-1, ' ', false, json::error_handler_t::replace);
  }
  return publishSet("unplaced/", want, publishedUnplaced_);
}

Status SharedPool::drain(const std::string& node, bool undo) {
  if (auto ok = limits::checkKeyName("netaccel", node); !ok) return fail(ok.error());
  if (undo) return removeKey("drains/" + node);
  return putKey("drains/" + node, json{{"by", options_.scheduler}}.dump(), 0);  // no lease: for good
}

Result<std::map<std::string, std::string>> SharedPool::setPolicy(const std::string& vm,
                                                                 const std::map<std::string, std::string>& changes) {
  if (auto ok = limits::checkKeyName("vm", vm); !ok) return fail(ok.error());
  const std::string key = options_.prefix + "policies/" + vm;
  for (uint32_t attempt = 0; attempt < options_.maxAttempts; ++attempt) {
    auto read = client_.range(key);
    if (!read) return fail(read.error());
    int64_t mod = 0;
    std::map<std::string, std::string> settings;
    for (auto& kv : read->kvs()) {
      if (kv.key() != key) continue;  // a longer name under the same prefix
      mod = kv.mod_revision();
      if (auto had = parsePolicy(key, kv.value(), options_.prefix)) settings = had->settings;
      else RLOG_WARN("shared-pool") << "replacing " << limits::clip(key, 128) << ", which was refused: " << had.error().message;
    }
    for (auto& [k, v] : changes) settings[k] = v;
    json value{{"by", options_.scheduler}, {"settings", settings}};
    if (!parsePolicy(key, value.dump(), options_.prefix))
      return fail(Code::invalidArgument, "vm '" + vm + "': the settings would break the shared pool's format (at most " +
                                             std::to_string(kMaxSettings) + ", each at most " +
                                             std::to_string(kMaxSettingBytes) + " printable bytes)");
    pb::TxnRequest txn;
    compareMod(txn, key, mod);
    put(txn, key, value.dump());  // no lease: for good
    auto answer = client_.txn(txn);
    if (!answer) return fail(answer.error());
    if (!answer->succeeded()) continue;  // another host's settings came first: read again
    std::unique_lock lock(mutex_);
    catchUp(lock, answer->header().revision());
    return settings;
  }
  return fail(Code::unavailable, "vm '" + vm + "': its policy record kept changing under " +
                                     std::to_string(options_.maxAttempts) + " attempts");
}

Status SharedPool::advertise(const std::string& address) {
  address_ = address;
  return putUnderLease("schedulers/" + options_.scheduler, selfValue(lease_));
}

std::string SharedPool::selfValue(int64_t lease) const {
  json value{{"lease", lease}};
  if (!address_.empty()) value["address"] = address_;
  return value.dump();
}

bool SharedPool::alive(const std::string& scheduler) {
  std::lock_guard lock(mutex_);
  return keys_.count("schedulers/" + scheduler) > 0;
}

Status SharedPool::putUnderLease(const std::string& key, const std::string& value) { return putKey(key, value, lease_); }

Status SharedPool::putKey(const std::string& key, const std::string& value, int64_t lease) {
  pb::TxnRequest txn;
  put(txn, options_.prefix + key, value, lease);
  auto answer = client_.txn(txn);
  if (!answer) return fail(answer.error());
  std::unique_lock lock(mutex_);
  catchUp(lock, answer->header().revision());
  return {};
}

Status SharedPool::removeKey(const std::string& key) {
  pb::TxnRequest txn;
  txn.add_success()->mutable_request_delete_range()->set_key(options_.prefix + key);
  auto answer = client_.txn(txn);
  if (!answer) return fail(answer.error());
  std::unique_lock lock(mutex_);
  catchUp(lock, answer->header().revision());
  return {};
}

Status SharedPool::withdrawPreemption(const SharedPreemption& p) { return removeKey(preemptionKey(p)); }

SharedPool::PoolCopy SharedPool::poolCopy() {
  std::lock_guard lock(mutex_);
  rebuild();
  PoolCopy copy{pool_, revision_, {}, preemptions_, usage_, moves_, actions_, vms_, unplaced_, drains_, policies_};
  for (auto& h : holdings_)
    if (h.scheduler != options_.scheduler)
      copy.foreign[localId(h.scheduler, h.vaccel)] = h;
  return copy;
}

bool SharedPool::watching() {
  std::lock_guard lock(mutex_);
  return watcher_ && !watchBroken_;
}

namespace {

// One attempt at a node's registration, on a consistent read of the keys it needs.
// nullopt when `next` or the node's record changed in between (read again).
Result<std::optional<SharedNode>> tryRegister(etcd::Client& client, const std::string& prefix, const std::string& name,
                                              const std::vector<CardSpec>& cards, HostVector host, int64_t lease) {
  const std::string nodeKey = prefix + "nodes/" + name, nextKey = prefix + "next", configKey = prefix + "config";
  pb::TxnRequest read;  // no compares: the ranges run on one revision
  for (const std::string* key : {&nodeKey, &nextKey, &configKey})
    read.add_success()->mutable_request_range()->set_key(*key);
  auto snapshot = client.txn(read);
  if (!snapshot) return fail(snapshot.error());
  auto valueOf = [&](int i) -> const mvccpb::KeyValue* {
    const auto& r = snapshot->responses(i).response_range();
    return r.kvs_size() == 1 ? &r.kvs(0) : nullptr;
  };
  auto blockTflops = parseBlockTflops(valueOf(2) ? valueOf(2)->value() : "");
  if (!blockTflops)
    return fail(Code::unavailable, "the shared pool at " + client.describe() + " " + prefix +
                                       " has no block size yet: a scheduler sets it when it joins");
  auto blocks = blocksOf(name, cards, host, *blockTflops);
  if (!blocks) return fail(blocks.error());
  pb::TxnRequest txn;
  SharedNode node;
  if (const auto* known = valueOf(0)) {
    auto record = parseNode(known->value());
    if (!record) return fail(Code::internal, nodeKey + " does not parse: " + record.error().message);
    if (record->blocks != *blocks || nodeValue(*record) != nodeValue({record->first, *blocks, cards, host}))
      return fail(Code::invalidArgument, "node '" + name + "' is known to the pool with other cards; a new layout needs a new name");
    node.blocks = {record->first, record->blocks};
    compareMod(txn, nodeKey, known->mod_revision());
  } else {
    uint64_t first = 1;
    if (const auto* next = valueOf(1)) {
      const std::string& v = next->value();
      if (v.empty() || v.size() > 9 || v.find_first_not_of("0123456789") != std::string::npos)
        return fail(Code::internal, nextKey + " is not a block number; fix it");
      first = std::stoull(v);
    }
    if (first == 0 || first + *blocks > limits::kMaxPoolBlocks + 1)
      return fail(Code::resourceExhausted, "the pool has no numbers left for node '" + name + "'");
    node.blocks = {static_cast<uint32_t>(first), *blocks};
    compareMod(txn, nextKey, valueOf(1) ? valueOf(1)->mod_revision() : 0);
    compareMod(txn, nodeKey, 0);
    put(txn, nodeKey, nodeValue({node.blocks.first, node.blocks.count, cards, host}));
    put(txn, nextKey, std::to_string(node.blocks.end()));
  }
  put(txn, prefix + "online/" + name, "{}", lease);
  auto answer = client.txn(txn);
  if (!answer) return fail(answer.error());
  if (!answer->succeeded()) return std::optional<SharedNode>();
  node.revision = answer->header().revision();
  return std::optional<SharedNode>(node);
}

}  // namespace

Result<SharedNode> registerSharedNode(etcd::Client& client, const std::string& prefix, const std::string& name,
                                      const std::vector<CardSpec>& cards, HostVector host, int64_t lease) {
  if (auto ok = limits::checkKeyName("node name", name); !ok) return fail(ok.error());
  constexpr int kAttempts = 16;
  for (int attempt = 0; attempt < kAttempts; ++attempt) {
    auto done = tryRegister(client, prefix, name, cards, host, lease);
    if (!done) return fail(done.error());
    if (*done) return **done;
  }
  return fail(Code::unavailable, "node '" + name + "' could not register: the pool's numbering kept changing");
}

Result<BlockRange> SharedPool::registerNode(const std::string& name, const std::vector<CardSpec>& cards, HostVector host,
                                            int64_t lease) {
  if (auto ok = refresh(); !ok) return fail(ok.error());
  auto node = registerSharedNode(client_, options_.prefix, name, cards, host, lease);
  if (!node) return fail(node.error());
  std::unique_lock lock(mutex_);
  catchUp(lock, node->revision);
  return node->blocks;
}

SharedPool::View SharedPool::view() {
  if (auto ok = refresh(); !ok) RLOG_WARN("shared-pool") << ok.error().message << " (the view may be stale)";
  std::lock_guard lock(mutex_);
  rebuild();
  View v;
  v.revision = revision_;
  v.total = pool_.total();
  v.free = pool_.freeBlocks();
  v.highest = pool_.highestBlock();
  v.nodes = pool_.nodes();
  v.holdings = holdings_;
  return v;
}

SharedPool::Stats SharedPool::stats() {
  std::lock_guard lock(mutex_);
  return stats_;
}

}  // namespace raccel::scheduler
