// Sessions on their cards: finding them, opening and closing their contexts, running
// what they held, their welcome and description, and the VM's block accounting. Where
// and when they run is the Relocator's (relocate/relocator.h).
#include <capnp/message.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include "common/log.h"
#include "schema/frame.capnp.h"
#include "schema/node.capnp.h"
#include "scheduler/scheduler.h"
#include "scheduler/console/console.h"
#include "scheduler/links/node_links.h"
#include "scheduler/persist/persistence.h"
#include "scheduler/relocate/relocator.h"
#include "scheduler/state.h"
#include "transport/wire_types.h"

namespace raccel::scheduler {

const char* phaseName(Phase phase) {
  switch (phase) {
    case Phase::waiting: return "waiting";
    case Phase::running: return "running";
    case Phase::suspending: return "suspending";
    case Phase::suspended: return "suspended";
    case Phase::moving: return "moving";
    case Phase::resuming: return "resuming";
    case Phase::recovering: return "recovering";
  }
  return "?";
}

std::string Scheduler::labelOf(const Session& s) const {
  return s.vm->policy.name + "/" + (s.program.empty() ? "?" : s.program) + "#" + std::to_string(s.id);
}

std::vector<Scheduler::Session*> Scheduler::allSessions() {
  std::vector<Session*> out;
  out.reserve(sessions_.size());
  for (auto& [id, s] : sessions_) out.push_back(s.get());  // by id
  return out;
}

Scheduler::Session* Scheduler::sessionById(VaccelId id) {
  auto it = sessions_.find(id);
  return it == sessions_.end() ? nullptr : it->second.get();
}

// ---------------------------------------------------------------------------------
// Contexts

void Scheduler::openMembers(Session& s) {
  // Members, the primary (most blocks) first; the rest in block order.
  auto shares = pool().cardsOf(s.blocks);
  std::stable_sort(shares.begin(), shares.end(), [](auto& a, auto& b) { return a.blocks > b.blocks; });
  for (auto& share : shares) {
    const Card& card = pool().cards()[share.card];
    NodeLink* node = links_->at(card.node);
    // Ids are the node link's own and never repeat on it: a link that has used every id
    // below the lane's reserved channels is closed (its netaccel reconnects with a fresh
    // count) rather than wrap.
    Member member{node, share.card, static_cast<uint32_t>(node->nextContext++), share.blocks};
    if (node->nextContext >= transport::kFirstReservedChannel && node->lostReason.empty()) {
      node->lostReason = "it used every context id of its link; it must reconnect";
      node->connection->close();
    }
    capnp::MallocMessageBuilder open;
    auto o = open.initRoot<wire::SchedulerMessage>().initOpenContext();
    o.setContext(member.context);
    o.setCard(card.spec.index);
    o.setMemoryQuota(s.vm->policy.memoryQuota);
    o.setLabel(labelOf(s));
    o.setBlocks(share.blocks);
    o.setTenant(s.vm->policy.name);
    o.setPriority(s.priority);
    member.node->connection->send(transport::kControlChannel, 0, open);
    ++member.node->contexts;
    bindContext(member, s);
    s.members.push_back(member);
  }
}

void Scheduler::closeMembers(Session& s) {
  s.kernelNsBefore = s.kernelNs();
  for (auto& member : s.members) {
    if (member.node) {
      // Its card reports the context's final kernel time with its next heartbeat.
      closedContexts_[contextKey(member.card, member.context)] = {s.id, s.vm, member.kernelNs, nowMs()};
      capnp::MallocMessageBuilder m;
      m.initRoot<wire::SchedulerMessage>().setCloseContext(member.context);
      member.node->connection->send(transport::kControlChannel, 0, m);
      --member.node->contexts;
    }
    unbindContext(member);
  }
  s.members.clear();
  s.programHome.clear();
  s.replicas.clear();  // scratch copies die with their contexts
  s.remoteReplies.clear();
  s.lineage.abandonReads();  // its reads die with them too
}

bool Scheduler::Session::mustHold() const {
  return job || phase != Phase::running || lineage.overBound() || owedTooMuch() || (link && link->backedUp());
}

void Scheduler::Session::asked(uint64_t sequence, uint64_t deadlineMs, uint64_t readBytes) {
  if (pending.contains(sequence)) return;  // (a sequence the guest used twice: the first stands)
  pending.add(sequence, sequence, deadlineMs);
  if (readBytes == 0) return;
  readLeft[sequence] = readBytes;
  readBytesLeft = readBytes > UINT64_MAX - readBytesLeft ? UINT64_MAX : readBytesLeft + readBytes;
}

void Scheduler::Session::answered(uint64_t sequence, uint64_t bytes, bool whole) {
  if (auto it = readLeft.find(sequence); it != readLeft.end() && !whole) {
    const uint64_t n = std::min(bytes, it->second);
    it->second -= n;
    readBytesLeft -= std::min(readBytesLeft, n);
    return;
  }
  pending.complete(sequence);
  forgetRead(sequence);
}

void Scheduler::Session::forgetRead(uint64_t sequence) {
  auto it = readLeft.find(sequence);
  if (it == readLeft.end()) return;
  readBytesLeft -= std::min(readBytesLeft, it->second);
  readLeft.erase(it);
  if (readLeft.empty()) readBytesLeft = 0;  // (exact again after a sum that saturated)
}

// A guest link backed up with answers its guest has not read: its sessions' next
// instructions wait (mustHold), and go on once it drains. The node links go on being
// read, so the other tenants of their netaccels get their answers meanwhile; what a
// backed-up session's cards still owe it is bounded (kReadAheadBytes).
void Scheduler::awaitDrain(VmLink& link) {
  if (link.drainAwaited || !link.backedUp()) return;
  link.drainAwaited = true;
  transport::Connection* c = link.connection.get();
  link.connection->whenDrained([this, c] {
    auto it = vmLinks_.find(c);
    if (it == vmLinks_.end()) return;
    VmLink& drained = *it->second;
    drained.drainAwaited = false;
    if (c->closed()) return;
    std::vector<VaccelId> ids;
    for (auto& [channel, s] : drained.sessions)
      if (!s->held.empty()) ids.push_back(s->id);
    for (VaccelId id : ids)
      if (Session* s = sessionById(id); s && !s->mustHold()) runHeld(*s);
  });
}

void Scheduler::runHeld(Session& s) {
  // An instruction that waited may end its own session (one that fails to decode closes
  // it): the session is looked up again after each, never used once it is gone.
  const VaccelId id = s.id;
  // What waited goes out as one write a connection, as a read's frames do (called from a
  // fold's end or a link's drain there is no read's cork: a write a frame otherwise).
  transport::Connection::Cork cork;
  while (s.link && !s.held.empty() && !mustHoldNow(s)) {
    auto [h, body] = std::move(s.held.front());
    s.held.pop_front();
    s.heldBytes -= std::min(s.heldBytes, body.size());
    forward(*s.link, s, h, std::move(body));
    if (!sessionById(id)) return;  // ended; endSession resumed its link's reading
  }
  if (s.link && !s.heldOverLimit()) s.link->connection->resumeReading();
}

// ---------------------------------------------------------------------------------
// Blocks and welcomes

void Scheduler::holdBlocks(Vm& vm, int64_t delta) {
  const double now = relocator_->policyNow();
  vm.usage.hold(now, delta);
  vm.blocksHeld = static_cast<uint32_t>(static_cast<int64_t>(vm.blocksHeld) + delta);
  state_->reportUsage(vm.policy.name, vm.usage.used(now), now, vm.usage.blocks());
}

void Scheduler::writeWelcome(Session& s, uint64_t sequence, uint64_t resumedAfter) {
  capnp::MallocMessageBuilder m;
  auto welcome = m.initRoot<wire::Reply>().initWelcome();
  welcome.setVersionMajor(wire::PROTOCOL_MAJOR);
  welcome.setVersionMinor(wire::PROTOCOL_MINOR);
  welcome.setMaxFrameBytes(s.maxFrame);
  welcome.setToken(s.token);
  welcome.setResumedAfter(resumedAfter);
  writeVaccel(s, welcome.initVaccel());
  s.link->connection->send(s.channel, sequence, m);
}

void Scheduler::writeVaccel(Session& s, wire::VaccelInfo::Builder info) {
  info.setId(s.id);
  info.setBlockTflops(pool().blockTflops());
  info.setMemoryQuota(s.vm->policy.memoryQuota);
  writePlacement(info, s.blocks);
}

void Scheduler::describeVaccel(Session& s, uint64_t sequence) {
  if (!s.link) return;
  capnp::MallocMessageBuilder m;
  writeVaccel(s, m.initRoot<wire::Reply>().initVaccel());
  s.link->connection->send(s.channel, sequence, m);
}

void Scheduler::sendWelcome(Session& s) {
  writeWelcome(s, s.helloSequence, 0);
  if (s.helloNs) console_->observeAdmission(static_cast<double>(uv_hrtime() - s.helloNs) / 1e9);
  s.helloNs = 0;
  const Card& card = pool().cards()[s.primary().card];
  std::string placed = std::to_string(s.want) + " block(s) from " + std::to_string(s.blocks.front().first) +
                       ", priority " + std::to_string(s.priority) + ", " + std::to_string(s.members.size()) + " card(s)";
  RLOG_INFO("scheduler") << "admitted " << labelOf(s) << ": " << placed << ", primary " << s.primary().node->name << "/"
                         << card.spec.index << " (" << kindName(card.spec.kind) << ")";
  event("admitted", labelOf(s), placed);
  persistence_->vaccel(s);
}

// ---------------------------------------------------------------------------------
// Nodes

void Scheduler::creditClosed(uint64_t key, uint64_t kernelNs) {
  auto it = closedContexts_.find(key);
  if (it == closedContexts_.end()) return;  // not one of ours, or credited already
  ClosedContext c = it->second;
  closedContexts_.erase(it);
  if (kernelNs <= c.kernelNsCredited) return;
  uint64_t tail = std::min<uint64_t>(kernelNs - c.kernelNsCredited, 3600ull * 1000000000ull);  // a card's claim, bounded
  if (Session* s = sessionById(c.vaccel)) s->kernelNsBefore += tail;
  else c.vm->kernelNsEnded += tail;
  persistence_->usage(*c.vm);
}

}  // namespace raccel::scheduler
