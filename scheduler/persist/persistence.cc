#include "scheduler/persist/persistence.h"

#include <capnp/serialize.h>

#include <cmath>

#include "common/limits.h"
#include "common/log.h"
#include "scheduler/relocate/relocator.h"
#include "scheduler/state.h"
#include "scheduler/persist/store.h"
#include "schema/frame.capnp.h"
#include "schema/state.capnp.h"

namespace raccel::scheduler {

namespace {

std::string toBlob(capnp::MessageBuilder& m) {
  auto words = capnp::messageToFlatArray(m);
  auto bytes = words.asBytes();
  return std::string(reinterpret_cast<const char*>(bytes.begin()), bytes.size());
}

// A reader over a blob (copied into aligned words).
struct BlobReader {
  kj::Array<capnp::word> words;
  std::unique_ptr<capnp::FlatArrayMessageReader> reader;
  explicit BlobReader(const std::string& blob) : words(kj::heapArray<capnp::word>((blob.size() + 7) / 8)) {
    std::memcpy(words.begin(), blob.data(), blob.size());
    capnp::ReaderOptions options;
    options.traversalLimitInWords = 1ull << 40;
    reader = std::make_unique<capnp::FlatArrayMessageReader>(words.asPtr(), options);
  }
};

std::string idKey(uint64_t id) {
  // Zero-padded, so the table's key order is id order.
  char buf[24];
  std::snprintf(buf, sizeof buf, "%020llu", static_cast<unsigned long long>(id));
  return buf;
}

}  // namespace

// ---------------------------------------------------------------------------------
// Writing

Persistence::Persistence(const SchedulerConfig& config, Scheduler& scheduler) : config_(config), s_(scheduler) {}

Persistence::~Persistence() = default;

void Persistence::dropNode(const std::string& name) {
  if (store_) store_->drop("node", name);
}

Status Persistence::open() {
  if (config_.stateDir.empty()) {
    if (config_.etcd.enabled()) return {};  // a shared pool's holdings end with the lease
    RLOG_WARN("scheduler") << "no state directory (--state-dir or state_dir): allocations and policies set with "
                              "raccelctl do not survive a restart";
    return {};
  }
  auto store = Store::open(config_.stateDir);
  if (!store) return fail(store.error().code, store.error().message + " (--state-dir)");
  store_ = std::move(*store);
  restore();
  return {};
}


namespace {
// A record's service numbers, checked (a record is a file like any other). A record
// written before they were kept has none: its wait starts now.
Service serviceOf(wire::VaccelRecord::Reader r, double now) {
  const double attained = r.getAttainedBlockSeconds(), lastRun = r.getLastRunSeconds(), since = r.getWaitingSince();
  for (double v : {attained, lastRun, since})
    if (!std::isfinite(v) || v < 0) throw std::runtime_error("service numbers out of range");
  if (r.getServiceClass() >= kServiceClasses) throw std::runtime_error("service class out of range");
  return Service{attained, r.getServiceClass(), lastRun, since > 0 ? std::min(since, now) : now};
}
}  // namespace

void Persistence::vaccel(Session& s, bool withSaved) {
  // Recovering from a lost card (lineage.cc): its lineage is in this process's memory
  // only, so the record from before the loss stands.
  if (!store_ || s.lineage.recovering) return;
  bool off = withSaved || s.phase == Phase::suspended;
  // In between (waiting, or saving/restoring for a move), the last record stands.
  if (!off && s.phase != Phase::running && s.phase != Phase::recovering) return;
  capnp::MallocMessageBuilder m;
  auto r = m.initRoot<wire::VaccelRecord>();
  writeAsked(s, off, r);
  if (off) writeBuffers(s, r);
  else writePlacement(s, r);
  writeProgramsAndFailures(s, r);
  store_->begin();
  store_->put("vaccel", idKey(s.id), toBlob(m));
  if (withSaved) {
    store_->dropSaved(s.id);
    for (auto& [handle, bytes] : s.saved) store_->putSaved(s.id, handle, bytes.flatten());
  } else if (!off) {
    store_->dropSaved(s.id);
  }
  store_->setCounter("next_vaccel", s_.nextVaccel_);
  store_->commit();
}

// What the vaccel is and asked for, its state (`off`: suspended) and its service so far.
void Persistence::writeAsked(const Session& s, bool off, wire::VaccelRecord::Builder r) {
  r.setId(s.id);
  r.setVm(s.vm->policy.name);
  r.setProgram(s.program);
  r.setPriority(s.priority);
  r.setAskedPriority(s.askedPriority);
  r.setWant(s.want);
  r.setKinds(s.kinds);
  r.setHostCpuMilli(s.host.cpuMilli);
  r.setHostMemoryMib(s.host.memoryMib);
  r.setNoWait(s.noWait);
  r.setToken(s.token);
  r.setMaxFrame(s.maxFrame);
  r.setSuspended(off);
  r.setOperatorHold(s.operatorHold);
  r.setWhy(s.why);
  r.setKernelNs(off ? s.kernelNs() : s.kernelNsBefore);
  r.setAttainedBlockSeconds(s.service.attained);
  r.setServiceClass(static_cast<uint8_t>(s.service.serviceClass));
  r.setLastRunSeconds(s.service.lastRun);
  r.setWaitingSince(s.service.waitingSince);
}

// A running vaccel's blocks and its cards (node, card, context, blocks).
void Persistence::writePlacement(const Session& s, wire::VaccelRecord::Builder r) {
  auto blocks = r.initBlocks(s.blocks.size());
  for (size_t i = 0; i < s.blocks.size(); ++i) {
    blocks[i].setFirst(s.blocks[i].first);
    blocks[i].setCount(s.blocks[i].count);
  }
  auto members = r.initMembers(s.members.size());
  for (size_t i = 0; i < s.members.size(); ++i) {
    const Member& mb = s.members[i];
    members[i].setNode(s_.pool().nodes()[s_.pool().cards()[mb.card].node].name);
    members[i].setCard(static_cast<uint32_t>(mb.card));
    members[i].setContext(mb.context);
    members[i].setBlocks(mb.blocks);
  }
}

// A suspended vaccel's buffers (their bytes are saved beside the record) and the last
// instruction they reflect.
void Persistence::writeBuffers(const Session& s, wire::VaccelRecord::Builder r) {
  auto buffers = r.initBuffers(s.buffers.size());
  size_t i = 0;
  for (auto& [handle, bytes] : s.buffers) {
    buffers[i].setHandle(handle);
    buffers[i++].setBytes(bytes);
  }
  r.setAppliedThrough(s.appliedThrough);
}

// Its programs (each load instruction as the guest sent it) and the handles that failed.
void Persistence::writeProgramsAndFailures(const Session& s, wire::VaccelRecord::Builder r) {
  auto programs = r.initPrograms(s.programs.size());
  size_t i = 0;
  for (auto& [handle, message] : s.programs) {
    std::string blob = toBlob(*message);
    programs.set(i++, capnp::Data::Reader(reinterpret_cast<const capnp::byte*>(blob.data()), blob.size()));
  }
  auto failed = r.initFailed(s.failed.size());
  i = 0;
  for (auto& [handle, failure] : s.failed) {
    failed[i].setHandle(handle);
    failed[i].setSequence(failure.first);
    transport::setError(failed[i++].initError(), failure.second);
  }
}

void Persistence::forget(Session& s) {
  if (!store_) return;
  store_->begin();
  store_->drop("vaccel", idKey(s.id));
  store_->dropSaved(s.id);
  store_->commit();
}

void Persistence::node(size_t poolIndex, wire::Register::Reader reg) {
  if (!store_) return;
  capnp::MallocMessageBuilder m;
  auto r = m.initRoot<wire::NodeRecord>();
  r.setName(reg.getName());
  r.setFirstBlock(s_.pool().nodes()[poolIndex].blocks.first);
  r.setCards(reg.getCards());
  r.setHostCpuMilli(reg.getHostCpuMilli());
  r.setHostMemoryMib(reg.getHostMemoryMib());
  store_->put("node", reg.getName(), toBlob(m));
}

void Persistence::policy(const std::string& vm, const std::map<std::string, std::string>& settings) {
  if (!store_) return;
  std::string text;
  for (auto& [key, value] : settings) text += key + "=" + value + "\n";
  store_->put("vm_policy", vm, text);
}

void Persistence::usage(const Vm& vm) {
  if (!store_) return;
  store_->put("tenant_usage", vm.policy.name, std::to_string(vm.kernelNsEnded));
}

// ---------------------------------------------------------------------------------
// Reading it back

void Persistence::restore() {
  s_.nextVaccel_ = std::max<VaccelId>(s_.nextVaccel_, store_->counter("next_vaccel", 1));
  s_.restoredAtMs_ = s_.nowMs();
  const size_t layouts = restoreNodes();
  restorePolicies();
  size_t running = 0, suspended = 0;
  restoreVaccels(running, suspended);
  RLOG_INFO("scheduler") << "state from " << store_->path() << ": " << layouts << " netaccel layout(s), "
                         << s_.policyOverrides_.size() << " VM policy override(s), " << running << " vaccel(s) to recover, "
                         << suspended << " suspended";
}

size_t Persistence::restoreNodes() {
  // Nodes, in block order, so each gets its old numbers; offline until it registers.
  struct Known {
    uint32_t first;
    std::string name;
    std::vector<CardSpec> cards;
    HostVector host;
  };
  std::vector<Known> known;
  for (auto& [name, blob] : store_->all("node")) {
    auto status = transport::decodeGuard([&] {
      BlobReader in(blob);
      auto r = in.reader->getRoot<wire::NodeRecord>();
      auto cards = cardSpecsOf(r.getCards());
      if (!cards) throw std::runtime_error(cards.error().message);
      HostVector host{r.getHostCpuMilli(), r.getHostMemoryMib()};
      if (!host.inBounds()) throw std::runtime_error("host resources out of range");
      known.push_back({r.getFirstBlock(), r.getName(), *cards, host});
    });
    if (!status) RLOG_ERROR("scheduler") << "state database: node '" << name << "' unreadable: " << status.error().message;
  }
  std::sort(known.begin(), known.end(), [](auto& a, auto& b) { return a.first < b.first; });
  for (auto& k : known) {
    auto index = s_.state_->addNode(k.name, k.cards, k.host);
    if (!index) continue;
    if (s_.pool().nodes()[*index].blocks.first != k.first)
      RLOG_ERROR("scheduler") << "state database: node '" << k.name << "' was at block " << k.first << ", now at "
                              << s_.pool().nodes()[*index].blocks.first << " (the block size changed?)";
    s_.state_->removeNode(*index);
  }

  return known.size();
}

void Persistence::restorePolicies() {
  for (auto& [vm, text] : store_->all("vm_policy")) {
    auto& settings = s_.policyOverrides_[vm];
    size_t at = 0;
    while (at < text.size()) {
      size_t nl = text.find('\n', at);
      std::string line = text.substr(at, nl == std::string::npos ? std::string::npos : nl - at);
      at = nl == std::string::npos ? text.size() : nl + 1;
      auto eq = line.find('=');
      if (eq != std::string::npos) settings[line.substr(0, eq)] = line.substr(eq + 1);
    }
  }
  for (auto& [vm, ns] : store_->all("tenant_usage")) s_.vmNamed(vm).kernelNsEnded = std::strtoull(ns.c_str(), nullptr, 10);
}

void Persistence::restoreVaccels(size_t& running, size_t& suspended) {
  for (auto& [key, blob] : store_->all("vaccel")) {
    std::unique_ptr<Session> session;
    auto status = transport::decodeGuard([&] { readVaccel(blob, session); });
    if (!status || !session) {
      RLOG_ERROR("scheduler") << "state database: vaccel " << key << " not restored: "
                              << (status ? std::string("empty record") : status.error().message);
      store_->drop("vaccel", key);
      continue;
    }
    Session& s = *session;
    s.vm->blocksClaimed += s.want;
    s.vm->memoryUsed += s.memoryUsed;
    if (s.phase == Phase::recovering) {
      s_.holdBlocks(*s.vm, s.want);
      for (auto& m : s.members) s_.bindContext(m, s);
      ++running;
    } else {
      ++suspended;
    }
    s_.event("restored", s_.labelOf(s), std::string(phaseName(s.phase)) + " from the state database; waiting for its guest to re-attach");
    s_.sessions_[s.id] = std::move(session);
  }
}

// A vaccel's record into a session (throwing what is wrong with it): a suspended one
// with its saved buffers, a running one back on its blocks, waiting for its netaccels.
void Persistence::readVaccel(const std::string& blob, std::unique_ptr<Session>& session) {
  BlobReader in(blob);
  auto r = in.reader->getRoot<wire::VaccelRecord>();
  VaccelId id = r.getId();
  session = s_.makeSession(id);
  Session& s = *session;
  s.vm = &s_.vmNamed(r.getVm());
  s.program = r.getProgram();
  s.priority = r.getPriority();
  s.askedPriority = r.getAskedPriority();
  s.want = r.getWant();
  s.kinds = r.getKinds();
  // Its own database: still checked (a record is a file like any other).
  s.host = {r.getHostCpuMilli(), r.getHostMemoryMib()};
  if (!s.host.inBounds()) throw std::runtime_error("host needs out of range");
  s.noWait = r.getNoWait();
  s.token = r.getToken();
  s.maxFrame = r.getMaxFrame();
  s.operatorHold = r.getOperatorHold();
  s.why = r.getWhy();
  s.kernelNsBefore = r.getKernelNs();
  s.service = serviceOf(r, s_.relocator_->policyNow());
  if (!r.getSuspended()) s.ranSince = s.accruedAt = s_.relocator_->policyNow();  // the time down is no service
  s.detachedSinceMs = s_.nowMs();
  for (auto p : r.getPrograms()) {
    BlobReader program(std::string(reinterpret_cast<const char*>(p.begin()), p.size()));
    auto kept = std::make_shared<capnp::MallocMessageBuilder>();
    auto instruction = program.reader->getRoot<wire::Instruction>();
    kept->setRoot(instruction);
    s.programs[instruction.getLoadProgram().getHandle()] = std::move(kept);
  }
  for (auto f : r.getFailed()) s.failed[f.getHandle()] = {f.getSequence(), transport::errorFrom(f.getError())};
  if (r.getSuspended()) {
    s.phase = Phase::suspended;
    s.appliedThrough = r.getAppliedThrough();
    for (auto b : r.getBuffers()) {
      s.buffers[b.getHandle()] = b.getBytes();
      s.memoryUsed += b.getBytes();
    }
    for (auto& [handle, bytes] : store_->saved(id))
      s.saved[handle] = KeptBytes(std::as_bytes(std::span<const char>(bytes.data(), bytes.size())));
    if (s.why.empty()) s.why = "suspended when the scheduler stopped";
    return;
  }
  for (auto b : r.getBlocks()) s.blocks.push_back({b.getFirst(), b.getCount()});
  if (auto assigned = s_.state_->assign(id, s.vm->policy.name, s.blocks, s.rank(), s.host); !assigned)
    throw std::runtime_error("its blocks " + blocksText(s.blocks) + " cannot be given back: " + assigned.error().message);
  for (auto mr : r.getMembers()) {
    if (mr.getCard() >= s_.pool().cards().size() || s_.pool().nodes()[s_.pool().cards()[mr.getCard()].node].name != mr.getNode().cStr()) {
      s_.state_->release(id);
      throw std::runtime_error("card " + std::to_string(mr.getCard()) + " of netaccel '" + std::string(mr.getNode().cStr()) +
                               "' is not in the pool");
    }
    s.members.push_back(Member{nullptr, mr.getCard(), mr.getContext(), mr.getBlocks()});
  }
  s.phase = Phase::recovering;
  s.why = "waiting for its netaccels after the scheduler restarted";
}

}  // namespace raccel::scheduler
