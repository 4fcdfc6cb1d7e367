// After a restart (docs/ARCHITECTURE.md, "State that survives a restart"): how the pieces that
// outlived the old process (netaccel contexts, guests behind raccel-guestd) rejoin the
// scheduler. What was written, and read back, is the Persistence's (persist/persistence.h).
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

#include "common/limits.h"
#include "common/log.h"
#include "scheduler/links/node_links.h"
#include "scheduler/persist/persistence.h"
#include "scheduler/relocate/relocator.h"
#include "scheduler/state.h"

namespace raccel::scheduler {

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
    // card (the context table holds restored ones under their node); the netaccel's word
    // alone moves nothing, not even the node's id counter.
    uint32_t ctx = hc.getContext();
    Session* s = links_->sessionOf(static_cast<size_t>(node.poolIndex), ctx);
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
    if (!m.node) unbindContext(m);
  persistence_->vaccel(s);
  RLOG_INFO("scheduler") << labelOf(s) << " recovered on blocks " << blocksText(s.blocks)
                         << (s.unavailable.empty() ? "" : "; unavailable: " + s.unavailable);
  event("recovered", labelOf(s), s.unavailable.empty() ? "running on blocks " + blocksText(s.blocks) : s.unavailable);
  if (s.link && s.resumePending) sendResumed(s);
  protectAfterRestart(s);
  runHeld(s);
  relocator_->requestPlacement();
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
  if (!persistence_->enabled()) return;
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
