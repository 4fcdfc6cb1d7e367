// Durable state (docs/ARCHITECTURE.md, "State that survives a restart"): what the scheduler writes
// to its state database, how it comes back after a restart, and how the pieces that
// outlived the old process (netaccel contexts, guests behind raccel-guestd) rejoin it.
//
// After a restart:
//   1. nodes come back offline at their old block numbers, raccelctl's policies over the
//      configured ones, tenant usage, and every placed vaccel: a suspended one with its
//      saved buffers (it resumes as blocks free), a running one `recovering` on exactly
//      its old blocks, detached from any guest;
//   2. a netaccel registers with the contexts it kept: those of recovering vaccels are
//      adopted (their replies made meanwhile follow), the rest closed. A vaccel whose
//      netaccels are all back runs again;
//   3. raccel-guestd re-attaches each program's session (hello with resume, the token
//      of its welcome); the welcome says after which instruction to resend, replies that
//      waited are delivered, and the program carries on.
// A vaccel whose netaccel or guest is not back within resume_grace_ms is given up:
// unavailable (with the reason), or ended and its blocks released.

#include <capnp/serialize.h>

#include <cmath>

#include "common/limits.h"
#include "common/log.h"
#include "scheduler/state.h"
#include "scheduler/store.h"
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

Result<std::vector<CardSpec>> cardSpecsOf(capnp::List<wire::CardInfo>::Reader list) {
  std::vector<CardSpec> cards;
  for (auto c : list) {
    if (!transport::validKind(c.getKind()))
      return fail(Code::invalidArgument, "card " + std::to_string(c.getIndex()) + " has an unknown kind");
    // Numbers and sizes are checked by Pool::checkNode (common/limits.h), for every source.
    std::vector<ProgramKind> programs;
    for (auto k : c.getProgramKinds())
      if (transport::validProgramKind(k)) programs.push_back(transport::fromWire(k));
    cards.push_back(CardSpec{c.getIndex(), transport::fromWire(c.getKind()), c.getModel(), c.getBackend(), c.getTflops(),
                             c.getMemoryBytes(), programs, c.getComputeUnits(), c.getMaxWorkGroupSize(),
                             c.getLocalMemBytes(), c.getOpenclExtensions(), c.getDoubleFpConfig(),
                             transport::imageLimitsFrom(c.getImages())});
  }
  return cards;
}

// ---------------------------------------------------------------------------------
// Writing

Status Scheduler::openStore() {
  if (config_.stateDir.empty()) {
    if (config_.etcd.enabled()) return {};  // a shared pool's holdings end with the lease
    RLOG_WARN("scheduler") << "no state directory (--state-dir or state_dir): allocations and policies set with "
                              "raccelctl do not survive a restart";
    return {};
  }
  auto store = Store::open(config_.stateDir);
  if (!store) return fail(store.error().code, store.error().message + " (--state-dir)");
  store_ = std::move(*store);
  restoreState();
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

void Scheduler::persist(Session& s, bool withSaved) {
  // Recovering from a lost card (lineage.cc): its lineage is in this process's memory
  // only, so the record from before the loss stands.
  if (!store_ || s.lineage.recovering) return;
  bool off = withSaved || s.phase == Phase::suspended;
  // In between (waiting, or saving/restoring for a move), the last record stands.
  if (!off && s.phase != Phase::running && s.phase != Phase::recovering) return;
  capnp::MallocMessageBuilder m;
  auto r = m.initRoot<wire::VaccelRecord>();
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
  if (!off) {
    auto blocks = r.initBlocks(s.blocks.size());
    for (size_t i = 0; i < s.blocks.size(); ++i) {
      blocks[i].setFirst(s.blocks[i].first);
      blocks[i].setCount(s.blocks[i].count);
    }
    auto members = r.initMembers(s.members.size());
    for (size_t i = 0; i < s.members.size(); ++i) {
      const Member& mb = s.members[i];
      members[i].setNode(pool().nodes()[pool().cards()[mb.card].node].name);
      members[i].setCard(static_cast<uint32_t>(mb.card));
      members[i].setContext(mb.context);
      members[i].setBlocks(mb.blocks);
    }
  } else {
    auto buffers = r.initBuffers(s.buffers.size());
    size_t i = 0;
    for (auto& [handle, bytes] : s.buffers) {
      buffers[i].setHandle(handle);
      buffers[i++].setBytes(bytes);
    }
    r.setAppliedThrough(s.appliedThrough);
  }
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
  store_->begin();
  store_->put("vaccel", idKey(s.id), toBlob(m));
  if (withSaved) {
    store_->dropSaved(s.id);
    for (auto& [handle, bytes] : s.saved) store_->putSaved(s.id, handle, bytes);
  } else if (!off) {
    store_->dropSaved(s.id);
  }
  store_->setCounter("next_vaccel", nextVaccel_);
  store_->commit();
}

void Scheduler::forget(Session& s) {
  if (!store_) return;
  store_->begin();
  store_->drop("vaccel", idKey(s.id));
  store_->dropSaved(s.id);
  store_->commit();
}

void Scheduler::persistNode(size_t poolIndex, wire::Register::Reader reg) {
  if (!store_) return;
  capnp::MallocMessageBuilder m;
  auto r = m.initRoot<wire::NodeRecord>();
  r.setName(reg.getName());
  r.setFirstBlock(pool().nodes()[poolIndex].blocks.first);
  r.setCards(reg.getCards());
  r.setHostCpuMilli(reg.getHostCpuMilli());
  r.setHostMemoryMib(reg.getHostMemoryMib());
  store_->put("node", reg.getName(), toBlob(m));
}

void Scheduler::persistPolicy(const std::string& vm) {
  if (!store_) return;
  std::string text;
  for (auto& [key, value] : policyOverrides_[vm]) text += key + "=" + value + "\n";
  store_->put("vm_policy", vm, text);
}

void Scheduler::persistUsage(const Vm& vm) {
  if (!store_) return;
  store_->put("tenant_usage", vm.policy.name, std::to_string(vm.kernelNsEnded));
}

// ---------------------------------------------------------------------------------
// Reading it back

void Scheduler::restoreState() {
  nextVaccel_ = std::max<VaccelId>(nextVaccel_, store_->counter("next_vaccel", 1));
  restoredAtMs_ = nowMs();

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
    auto index = state_->addNode(k.name, k.cards, k.host);
    if (!index) continue;
    if (pool().nodes()[*index].blocks.first != k.first)
      RLOG_ERROR("scheduler") << "state database: node '" << k.name << "' was at block " << k.first << ", now at "
                              << pool().nodes()[*index].blocks.first << " (the block size changed?)";
    state_->removeNode(*index);
  }

  for (auto& [vm, text] : store_->all("vm_policy")) {
    auto& settings = policyOverrides_[vm];
    size_t at = 0;
    while (at < text.size()) {
      size_t nl = text.find('\n', at);
      std::string line = text.substr(at, nl == std::string::npos ? std::string::npos : nl - at);
      at = nl == std::string::npos ? text.size() : nl + 1;
      auto eq = line.find('=');
      if (eq != std::string::npos) settings[line.substr(0, eq)] = line.substr(eq + 1);
    }
  }
  for (auto& [vm, ns] : store_->all("tenant_usage")) vmNamed(vm).kernelNsEnded = std::strtoull(ns.c_str(), nullptr, 10);

  size_t running = 0, suspended = 0;
  for (auto& [key, blob] : store_->all("vaccel")) {
    std::unique_ptr<Session> session;
    auto status = transport::decodeGuard([&] {
      BlobReader in(blob);
      auto r = in.reader->getRoot<wire::VaccelRecord>();
      VaccelId id = r.getId();
      session = makeSession(id);
      Session& s = *session;
      s.vm = &vmNamed(r.getVm());
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
      s.service = serviceOf(r, policyNow());
      if (!r.getSuspended()) s.ranSince = s.accruedAt = policyNow();  // the time down is no service
      s.detachedSinceMs = nowMs();
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
        for (auto& [handle, bytes] : store_->saved(id)) s.saved[handle] = std::move(bytes);
        if (s.why.empty()) s.why = "suspended when the scheduler stopped";
        return;
      }
      for (auto b : r.getBlocks()) s.blocks.push_back({b.getFirst(), b.getCount()});
      if (auto assigned = state_->assign(id, s.vm->policy.name, s.blocks, s.rank(), s.host); !assigned)
        throw std::runtime_error("its blocks " + blocksText(s.blocks) + " cannot be given back: " + assigned.error().message);
      for (auto mr : r.getMembers()) {
        if (mr.getCard() >= pool().cards().size() || pool().nodes()[pool().cards()[mr.getCard()].node].name != mr.getNode().cStr()) {
          state_->release(id);
          throw std::runtime_error("card " + std::to_string(mr.getCard()) + " of netaccel '" + std::string(mr.getNode().cStr()) +
                                   "' is not in the pool");
        }
        s.members.push_back(Member{nullptr, mr.getCard(), mr.getContext(), mr.getBlocks()});
      }
      s.phase = Phase::recovering;
      s.why = "waiting for its netaccels after the scheduler restarted";
    });
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
      holdBlocks(*s.vm, s.want);
      for (auto& m : s.members) sessionByContext_[contextKey(m.card, m.context)] = &s;
      ++running;
    } else {
      ++suspended;
    }
    event("restored", labelOf(s), std::string(phaseName(s.phase)) + " from the state database; waiting for its guest to re-attach");
    sessions_[s.id] = std::move(session);
  }
  RLOG_INFO("scheduler") << "state from " << store_->path() << ": " << known.size() << " netaccel layout(s), "
                         << policyOverrides_.size() << " VM policy override(s), " << running << " vaccel(s) to recover, "
                         << suspended << " suspended";
}

// ---------------------------------------------------------------------------------
// Rejoining

void Scheduler::adoptContexts(NodeLink& node, capnp::List<wire::HeldContext>::Reader held) {
  auto send = [&](auto fill) {
    capnp::MallocMessageBuilder m;
    fill(m.initRoot<wire::SchedulerMessage>());
    node.connection->send(transport::kControlChannel, 0, m);
  };
  size_t adopted = 0, closed = 0;
  for (auto hc : held) {
    // Adopted only if this scheduler persisted that very context on this very node and
    // card (sessionByContext_ holds restored ones under their node); the netaccel's word
    // alone moves nothing, not even the node's id counter.
    uint32_t ctx = hc.getContext();
    auto it = sessionByContext_.find(contextKeyOnNode(static_cast<size_t>(node.poolIndex), ctx));
    Session* s = it == sessionByContext_.end() ? nullptr : it->second;
    size_t index = SIZE_MAX;
    if (s && s->phase == Phase::recovering)
      for (size_t i = 0; i < s->members.size(); ++i) {
        const Member& m = s->members[i];
        const Card& card = pool().cards()[m.card];
        if (m.context == ctx && !m.node && static_cast<long>(card.node) == node.poolIndex && card.spec.index == hc.getCard())
          index = i;
      }
    if (index == SIZE_MAX) {
      send([&](wire::SchedulerMessage::Builder b) { b.setCloseContext(ctx); });
      ++closed;
      continue;
    }
    Member& m = s->members[index];
    m.node = &node;
    node.nextContext = std::max<uint64_t>(node.nextContext, uint64_t{ctx} + 1);
    ++node.contexts;
    send([&](wire::SchedulerMessage::Builder b) { b.setAdoptContext(ctx); });
    ++adopted;
    for (auto b : hc.getBuffers()) {
      if (b.getHandle() >= kSchedulerHandles) {
        sendFree(*s, index, b.getHandle());  // a scratch copy of the old process's
      } else if (index == 0 && !s->buffers.count(b.getHandle())) {
        // The netaccel's count: charged, but never past 2^64 (a VM over its quota after
        // a restart only has its next allocations refused).
        s->buffers[b.getHandle()] = b.getBytes();
        s->memoryUsed = limits::satAdd(s->memoryUsed, b.getBytes());
        s->vm->memoryUsed = limits::satAdd(s->vm->memoryUsed, b.getBytes());
      }
    }
    if (index == 0) s->appliedThrough = hc.getLastSequence();
  }
  if (adopted || closed)
    RLOG_INFO("scheduler") << "netaccel '" << node.name << "' kept " << held.size() << " context(s): " << adopted
                           << " adopted, " << closed << " closed";
  // Vaccels that had a context there which did not survive, and those now complete.
  std::vector<Session*> done;
  for (Session* s : allSessions()) {
    if (s->phase != Phase::recovering) continue;
    bool complete = true;
    for (auto& m : s->members) {
      if (m.node) continue;
      if (static_cast<long>(pool().cards()[m.card].node) == node.poolIndex && s->unavailable.empty())
        s->unavailable = "its context on netaccel '" + node.name + "' did not survive the scheduler's restart; its buffers are gone";
      complete = complete && !s->unavailable.empty();
    }
    if (complete) done.push_back(s);
  }
  for (Session* s : done) recovered(*s);
}

void Scheduler::recovered(Session& s) {
  s.phase = Phase::running;
  s.why.clear();
  for (auto& m : s.members)
    if (!m.node) sessionByContext_.erase(contextKey(m.card, m.context));
  persist(s);
  RLOG_INFO("scheduler") << labelOf(s) << " recovered on blocks " << blocksText(s.blocks)
                         << (s.unavailable.empty() ? "" : "; unavailable: " + s.unavailable);
  event("recovered", labelOf(s), s.unavailable.empty() ? "running on blocks " + blocksText(s.blocks) : s.unavailable);
  if (s.link && s.resumePending) sendResumed(s);
  protectAfterRestart(s);
  runHeld(s);
  requestPlacement();
}

void Scheduler::resumeSession(VmLink& link, uint32_t channel, uint64_t sequence, wire::Resume::Reader resume) {
  Session* s = sessionById(resume.getVaccel());
  std::string subject = link.vm->policy.name + "/#" + std::to_string(resume.getVaccel());
  if (!s || s->vm != link.vm || s->token != resume.getToken()) {
    refuseHello(link, channel, sequence, subject,
                Error{Code::notFound, "vaccel #" + std::to_string(resume.getVaccel()) +
                                          " cannot be resumed here: it ended, or it is not this VM's"});
    return;
  }
  if (s->link) {
    refuseHello(link, channel, sequence, subject,
                Error{Code::invalidArgument, "vaccel #" + std::to_string(s->id) + " is attached to a program already"});
    return;
  }
  s->link = &link;
  s->channel = channel;
  s->detachedSinceMs = 0;
  s->resumeHello = sequence;
  s->resumePending = true;
  link.sessions[channel] = s;
  if (s->phase != Phase::recovering) sendResumed(*s);
}

void Scheduler::sendResumed(Session& s) {
  s.resumePending = false;
  writeWelcome(s, s.resumeHello, s.appliedThrough);
  size_t waited = s.undelivered.size();
  for (auto& [seq, body] : s.undelivered) s.link->connection->sendBody(s.channel, seq, std::move(body));
  s.undelivered.clear();
  std::string detail = std::string(phaseName(s.phase)) + ", resending after instruction " + std::to_string(s.appliedThrough) +
                       ", " + std::to_string(waited) + " repl" + (waited == 1 ? "y" : "ies") + " delivered";
  RLOG_INFO("scheduler") << labelOf(s) << " re-attached: " << detail;
  event("reattached", labelOf(s), detail);
}

void Scheduler::expireDetached() {
  if (!store_) return;
  uint64_t now = nowMs();
  std::vector<Session*> gone, late;
  for (Session* s : allSessions()) {
    if (s->phase == Phase::recovering && now - restoredAtMs_ >= config_.resumeGraceMs) late.push_back(s);
    else if (!s->link && s->detachedSinceMs && now - s->detachedSinceMs >= config_.resumeGraceMs) gone.push_back(s);
  }
  for (Session* s : late) {
    for (auto& m : s->members)
      if (!m.node && s->unavailable.empty())
        s->unavailable = "netaccel '" + pool().nodes()[pool().cards()[m.card].node].name + "' did not come back within " +
                         std::to_string(config_.resumeGraceMs) + " ms of the scheduler's restart; its buffers are gone";
    recovered(*s);
  }
  for (Session* s : gone) {
    RLOG_WARN("scheduler") << labelOf(*s) << ": its guest did not re-attach within " << config_.resumeGraceMs
                           << " ms of the scheduler's restart; ending it";
    endSession(*s);
  }
}

}  // namespace raccel::scheduler
