#include "scheduler/relocate/relocator.h"

#include <capnp/message.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include "common/log.h"
#include "schema/frame.capnp.h"
#include "schema/node.capnp.h"
#include "scheduler/console/console.h"
#include "scheduler/links/node_links.h"
#include "scheduler/persist/persistence.h"
#include "scheduler/state.h"
#include "transport/wire_types.h"

namespace raccel::scheduler {

Relocator::Relocator(uv_loop_t* loop, const SchedulerConfig& config, Scheduler& scheduler)
    : loop_(loop), config_(config), s_(scheduler) {
  startedWallSeconds_ = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

Relocator::~Relocator() = default;

void Relocator::start() {
  placer_ = new uv_timer_t;
  uv_timer_init(loop_, placer_);
  placer_->data = this;
}

void Relocator::stop() {
  if (!placer_) return;
  uv_close(reinterpret_cast<uv_handle_t*>(placer_), [](uv_handle_t* h) { delete reinterpret_cast<uv_timer_t*>(h); });
  placer_ = nullptr;
}

void Relocator::requestPlacement() {
  if (s_.stopping_ || !placer_ || uv_is_active(reinterpret_cast<uv_handle_t*>(placer_))) return;
  uv_timer_start(placer_, [](uv_timer_t* t) { static_cast<Relocator*>(t->data)->placeWaiting(); }, 0, 0);
}

Pool::Request Relocator::placementRequest(const Session& s) const {
  Pool::Request request{s.want, s.kinds, s.rank()};
  request.host = s.host;
  if (config_.spanSlackNodes >= 0)
    request.maxNodes = s_.pool().fewestNodesFor(s.want, s.kinds) + static_cast<uint32_t>(config_.spanSlackNodes);
  return request;
}

Result<std::vector<BlockRange>> Relocator::allocateFor(Session& s) {
  Pool::Request request = placementRequest(s);
  auto placed = s_.state_->allocate(s.id, s.vm->policy.name, request);
  if (!placed || placed->size() == 1 || !config_.defragOnDemand || !s_.state_->movesAllowed()) return placed;
  // Only fragmented: compact, then place again (docs/ARCHITECTURE.md's 10-block fixture).
  s_.state_->release(s.id);
  compact(0, 0, "to place " + s_.labelOf(s) + " in one range");
  return s_.state_->allocate(s.id, s.vm->policy.name, request);
}

void Relocator::placeWaiting() {
  // Highest priority first, then the VM with the least block usage over its TFLOPS cap,
  // then arrival order (ids are given in arrival order).
  const double now = policyNow();
  accrueService(now);
  std::vector<Waiting> order = admissionQueue(now);
  // By id: placing one may end another (a held instruction that closes its session).
  Refusals refused;
  for (auto& w : order) {
    Session* s = s_.sessionById(w.id);
    if (!s) continue;
    // Another host preempted vaccels here for work of a higher priority: what they freed
    // is that work's (a suspended vaccel keeps the why of its preemption).
    if (std::string held = s_.state_->heldBack(s->rank()); !held.empty()) {
      if (s->phase != Phase::waiting) continue;
      s->why = held;
      if (s->waitDeadlineMs == 0) refused.emplace_back(s->id, Error{Code::resourceExhausted, held});
      continue;
    }
    auto placed = allocateFor(*s);
    if (placed) {
      startPlaced(*s, *placed, now);
      continue;
    }
    if (waitsOnThePool(*s, refused)) continue;
    // While suspensions are under way their blocks are promised to the one they were
    // started for: nobody behind it takes them.
    if (suspending_ > 0) break;
    // A suspended vaccel resumes into free blocks only, until it has starved.
    // (One recovering from a loss may, as new work would.)
    if (!mayPreempt(s->phase == Phase::suspended && !s->lineage.recovering, w.waitedSeconds)) continue;
    if (preemptFor(*s, placed.error(), refused)) break;
  }
  for (auto& [id, error] : refused)
    if (Session* s = s_.sessionById(id)) s->lineage.recovering ? s_.failRecovery(*s, error) : refuseWaiting(*s, error);
  reportDrained();
}

void Relocator::startPlaced(Session& s, const std::vector<BlockRange>& blocks, double now) {
  s.blocks = blocks;
  s_.holdBlocks(*s.vm, s.want);
  s.ranSince = s.accruedAt = now;
  s.why.clear();
  s_.openMembers(s);
  if (s.phase == Phase::waiting) {
    s.phase = Phase::running;
    s_.sendWelcome(s);
    s_.runHeld(s);
  } else {
    s.phase = Phase::resuming;
    restore(s, s.lineage.recovering ? "restored" : "resumed");
  }
}

bool Relocator::waitsOnThePool(Session& s, Refusals& refused) {
  // It may be the pool that is not all here yet rather than other vaccels' blocks: then
  // it waits for the pool, or is refused if it never could fit. A vaccel recovering from
  // a loss waits while only netaccels expected back (the lost one among them) could hold
  // it, and ends unavailable, saying so, once none could.
  if (s.lineage.recovering) {
    if (auto ever = s_.couldEverHold(s.want, s.kinds, *s.vm); !ever) {
      refused.emplace_back(s.id, ever.error());
      return true;
    }
    if (auto away = s_.pool().shortfall(s.want, s.kinds); away && away->expectedBack) {
      s.why = "recovering: " + s.lineage.lost + "; " + away->why;
      return true;
    }
  }
  auto wait = waitForThePool(s);
  if (wait == PoolWait::never) refused.emplace_back(s.id, s_.couldEverHold(s.want, s.kinds, *s.vm).error());
  return wait != PoolWait::no;
}

bool Relocator::preemptFor(Session& s, const Error& unplaced, Refusals& refused) {
  auto victims = s_.pool().planPreemption(placementRequest(s));
  if (victims && !victims->empty()) {
    // Other hosts' vaccels (a shared pool) are suspended by their own schedulers.
    std::vector<VaccelId> elsewhere;
    for (VaccelId v : *victims) {
      if (Session* victim = s_.sessionById(v))
        suspend(*victim, "preempted by " + s_.labelOf(s) + " (priority " + std::to_string(s.priority) + ")", false);
      else elsewhere.push_back(v);
    }
    s_.state_->preemptElsewhere(s.id, s.vm->policy.name, s.rank(), elsewhere);
    s.why = "waiting for " + std::to_string(victims->size()) + " lower-priority vaccel(s) to be suspended" +
            (elsewhere.empty() ? std::string() : " (" + std::to_string(elsewhere.size()) + " by other hosts)");
    return true;
  }
  s_.state_->preemptElsewhere(s.id, s.vm->policy.name, s.rank(), {});
  s.why = victims ? unplaced.message : victims.error().message;
  if (s.waitDeadlineMs == 0) refused.emplace_back(s.id, Error{Code::resourceExhausted, s.why});
  else if (!s.queuedEventSent) {
    s.queuedEventSent = true;
    s_.event("queued", s_.labelOf(s), s.why);
  }
  return false;
}

void Relocator::reportDrained() {
  for (auto& [name, reported] : draining_) {
    if (reported) continue;
    bool busy = false;
    for (Session* s : s_.allSessions())
      for (auto& m : s->members) busy = busy || (m.node && m.node->name == name);
    if (busy) continue;
    reported = true;
    s_.event("node-drained", name, "nothing runs there now; nothing new is placed there until `raccelctl drain " + name + " --undo`");
  }
}

double Relocator::policyNow() const {
  const double wall = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  return startedWallSeconds_ + (wall - startedWallSeconds_) * config_.policyClockScale;
}

bool Relocator::accrueService(double now) {
  bool changed = false;
  for (auto& [id, s] : s_.sessions_) {
    if (s->ranSince < 0 || now <= s->accruedAt) continue;
    s->service.ran(now - s->accruedAt, s->want);
    s->accruedAt = now;
    if (!s->service.reclassify() || s->blocks.empty()) continue;
    s_.state_->setPriority(s->id, s->rank());
    const std::string detail = "service class " + std::to_string(s->service.serviceClass) + " after " +
                               std::to_string(static_cast<long long>(s->service.attained / 3600)) +
                               " block-hours: fresh work of its priority goes first";
    RLOG_INFO("scheduler") << s_.labelOf(*s) << " demoted: " << detail;
    s_.event("demoted", s_.labelOf(*s), detail);
    changed = true;
  }
  return changed;
}

std::vector<Waiting> Relocator::admissionQueue(double now) {
  std::vector<Session*> unplaced;
  for (Session* s : s_.allSessions())
    if (!s->operatorHold && (s->phase == Phase::waiting || (s->phase == Phase::suspended && s->unavailable.empty())))
      unplaced.push_back(s);
  // Each VM's demand (held and waiting blocks) and holding: who is over its fair share.
  std::vector<double> demand(s_.vms_.size(), 0), have(s_.vms_.size(), 0);
  for (size_t i = 0; i < s_.vms_.size(); ++i) demand[i] = have[i] = s_.vms_[i]->blocksHeld;
  auto vmIndex = [&](const Vm* vm) {
    for (size_t i = 0; i < s_.vms_.size(); ++i)
      if (s_.vms_[i].get() == vm) return i;
    return s_.vms_.size();
  };
  for (Session* s : unplaced)
    if (size_t i = vmIndex(s->vm); i < s_.vms_.size()) demand[i] += s->want;
  auto over = overFairShare(demand, have, s_.pool().total());
  const double usageNow = now;  // TenantUsage counts on the policy clock too (holdBlocks)
  std::vector<Waiting> order;
  for (Session* s : unplaced) {
    if (s->phase == Phase::suspended) s->service.promote(now);
    size_t i = vmIndex(s->vm);
    const double elsewhere = s_.state_->usageElsewhere(s->vm->policy.name, usageNow);  // a shared pool's other hosts
    order.push_back({s->id, s->priority, s->vm->usage.score(usageNow, s->vm->policy.tflops, elsewhere), s->id, s->service.serviceClass,
                     i < over.size() && over[i], s->service.waited(now)});
  }
  orderForAdmission(order);
  return order;
}

// Before any netaccel has joined, the pool may yet hold a request: it waits (no
// preemption, no refusal) until the pool settles. Later, a request that only netaccels
// expected back (offline, not drained: after a restart, or a link briefly lost) could
// hold waits for them, whatever its own deadline, which bounds a wait for busy blocks.
// It is refused when no pool this size, those counted, could ever hold it (as when the
// netaccel it waits for is forgotten); a draining one is not waited for.
Relocator::PoolWait Relocator::waitForThePool(Session& s) {
  if (s.phase != Phase::waiting) return PoolWait::no;
  if (s.settlingWait) {
    if (s_.settling()) return PoolWait::yes;
    s.settlingWait = false;
    s.waitDeadlineMs = s.ownWaitDeadlineMs;
  }
  if (!s_.couldEverHold(s.want, s.kinds, *s.vm)) return PoolWait::never;
  auto away = s_.pool().shortfall(s.want, s.kinds);
  if (!away || !away->expectedBack) return PoolWait::no;
  s.why = away->why;
  if (!s.queuedEventSent) {
    s.queuedEventSent = true;
    s_.event("queued", s_.labelOf(s), s.why);
  }
  return PoolWait::yes;
}

void Relocator::refuseWaiting(Session& s, const Error& error) {
  s_.refuseHello(*s.link, s.channel, s.helloSequence, s_.labelOf(s), error);
  s.refused = true;
  s_.endSession(s);
}

void Relocator::whenIdle(Session& s, std::function<void()> then) {
  if (!s.job) {
    then();
    return;
  }
  s.idle = std::move(then);  // finishJob runs it
}

void Relocator::save(Session& s, std::function<void()> then) {
  whenIdle(s, [this, &s, then = std::move(then)] {
    bool cardsThere = !s.members.empty() && std::all_of(s.members.begin(), s.members.end(), [](auto& m) { return m.node; });
    if (!cardsThere || !s.unavailable.empty()) {
      s_.closeMembers(s);
      then();
      return;
    }
    s.job = std::make_unique<RemoteJob>();
    s.job->finished = [this, &s, then](std::optional<Error> error) {
      if (error) {
        s.unavailable = "its buffers could not be saved: " + error->message;
        s.saved.clear();
        RLOG_ERROR("scheduler") << s_.labelOf(s) << ": " << s.unavailable;
      } else {
        // Durable before its contexts close: a restart from here on finds it suspended.
        s.appliedThrough = s.lastForwarded;
        s_.persistence_->vaccel(s, true);
        s_.savedIsCheckpoint(s);
      }
      s_.closeMembers(s);
      then();
    };
    s_.readBuffers(s, s.saved);
    s_.settle(s);
  });
}

void Relocator::restore(Session& s, const std::string& what) {
  // After a loss, from the lineage's checkpoint (kept: a second loss starts from it again).
  const bool recovering = s.lineage.recovering;
  auto& data = recovering ? s.lineage.checkpoint(s.saved) : s.saved;
  s.job = std::make_unique<RemoteJob>();
  s.job->finished = [this, &s, what, recovering, &data](std::optional<Error> error) {
    uint64_t bytes = 0;
    for (auto& [h, d] : data) bytes += d.size();
    if (s.lineage.on && s.lineage.baseInSaved) {
      s.lineage.base = std::move(s.saved);  // the checkpoint stays
      s.lineage.baseInSaved = false;
    }
    s.saved.clear();
    s.saved.rehash(0);
    if (recovering) s.lineage.recovering = false;
    if (error) {
      s.unavailable = "it could not be restored on its new cards: " + error->message;
      RLOG_ERROR("scheduler") << s_.labelOf(s) << ": " << s.unavailable;
      if (recovering) s.lineage.replayLeft = 0;
    }
    s.phase = Phase::running;
    s_.persistence_->vaccel(s);
    if (!s.lineage.on && !error) s_.protectAfterRestart(s);  // (suspended when the scheduler restarted)
    std::string detail = std::to_string(bytes) + " bytes of buffers restored on blocks " + blocksText(s.blocks) +
                         (error ? "; FAILED: " + error->message : "");
    RLOG_INFO("scheduler") << s_.labelOf(s) << " " << what << ": " << detail;
    s_.event(what, s_.labelOf(s), detail);
    if (recovering && !error && !s.lineage.replayLeft)  // (lost before anything reached its log)
      s_.event("recovered", s_.labelOf(s), "nothing to run again after " + s.lineage.lost + "; " +
                                         std::to_string((uv_hrtime() - s.lineage.lostAtNs) / 1000000) + " ms after the loss");
    s_.runHeld(s);
    requestPlacement();
  };
  // Programs first (the guest's kernels take buffers loaded after them too), on the
  // card that runs their kind.
  for (auto& [handle, message] : s.programs) {
    auto kind = transport::fromWire(message->getRoot<wire::Instruction>().asReader().getLoadProgram().getKind());
    size_t home = 0;
    if (!s_.pool().cards()[s.primary().card].spec.runs(kind))
      for (size_t i = 1; i < s.members.size(); ++i)
        if (s_.pool().cards()[s.members[i].card].spec.runs(kind)) {
          home = i;
          break;
        }
    if (home) s.programHome[handle] = home;
    s_.sendRemote(s, home, *message);
  }
  for (auto& [handle, failure] : s.failed) s_.sendPoison(s, handle, failure.first, failure.second, false);
  for (auto& [handle, bytes] : data) {
    capnp::MallocMessageBuilder a;
    auto alloc = a.initRoot<wire::Instruction>().initAlloc();
    alloc.setHandle(handle);
    alloc.setSize(bytes.size());
    s_.sendRemote(s, 0, a);
    for (uint64_t off = 0; off < bytes.size(); off += wire::CHUNK_BYTES) {
      const uint64_t n = std::min<uint64_t>(wire::CHUNK_BYTES, bytes.size() - off);
      if (bytes.zeros(off, n)) continue;  // (the alloc's zeros)
      capnp::MallocMessageBuilder w;
      auto write = w.initRoot<wire::Instruction>().initWrite();
      write.setBuffer(handle);
      write.setOffset(off);
      auto data = write.initData(static_cast<unsigned>(n));
      bytes.copyOut(off, {reinterpret_cast<std::byte*>(data.begin()), data.size()});
      s_.sendRemote(s, 0, w);
    }
  }
  s_.settle(s);
}

void Relocator::suspend(Session& s, const std::string& why, bool byOperator) {
  if (byOperator) s.operatorHold = true;
  if (s.phase != Phase::running) return;  // waiting, moving or already off its cards
  s.phase = Phase::suspending;
  s.why = why;
  ++suspending_;
  RLOG_INFO("scheduler") << s_.labelOf(s) << " suspended: " << why;
  s_.event("preempted", s_.labelOf(s), why + "; saving " + std::to_string(s.memoryUsed) + " bytes of buffers");
  save(s, [this, &s] {
    leaveBlocks(s);
    s.phase = Phase::suspended;
    s_.persistence_->vaccel(s);
    --suspending_;
    requestPlacement();
  });
}

void Relocator::leaveBlocks(Session& s) {
  s_.state_->release(s.id);
  s_.holdBlocks(*s.vm, -static_cast<int64_t>(s.want));
  s.blocks.clear();
  const double now = policyNow();
  accrueService(now);
  s.service.stopped(now, s.ranSince);
  s.ranSince = -1;
}

Status Relocator::resumeByOperator(VaccelId id) {
  Session* s = s_.sessionById(id);
  if (!s) return fail(Code::notFound, "no vaccel #" + std::to_string(id));
  if (!s->operatorHold)
    return fail(Code::invalidArgument, "vaccel #" + std::to_string(id) + " was not suspended by the operator (it is " +
                                              phaseName(s->phase) + ")");
  s->operatorHold = false;
  s_.persistence_->vaccel(*s);
  requestPlacement();
  return {};
}

void Relocator::move(Session& s, std::vector<BlockRange> to, const std::string& why) {
  std::vector<size_t> before, after;
  for (auto& share : s_.pool().cardsOf(s.blocks)) before.push_back(share.card);
  auto shares = s_.pool().cardsOf(to);
  for (auto& share : shares) after.push_back(share.card);
  std::sort(before.begin(), before.end());
  std::sort(after.begin(), after.end());
  s.blocks = std::move(to);
  if (before == after) {
    // Same cards: only the numbers change; the buffers stay where they are.
    for (auto& m : s.members)
      for (auto& share : shares)
        if (share.card == m.card) m.blocks = share.blocks;
    s_.persistence_->vaccel(s);
    s_.event("migrated", s_.labelOf(s), "to blocks " + blocksText(s.blocks) + " (" + why + "; same cards, nothing copied)");
    return;
  }
  s.phase = Phase::moving;
  s.why = why;
  RLOG_INFO("scheduler") << s_.labelOf(s) << " moving to blocks " << blocksText(s.blocks) << ": " << why;
  save(s, [this, &s] {
    if (!s.unavailable.empty()) {
      s.phase = Phase::running;
      s_.runHeld(s);
      return;
    }
    s_.openMembers(s);
    s.phase = Phase::resuming;
    restore(s, "migrated");
  });
}

size_t Relocator::compact(size_t maxMoves, uint64_t maxMoveBytes, const std::string& why) {
  // The rate limit: moves per minute, in a window that restarts every minute.
  if (s_.nowMs() - moveWindowStartMs_ >= 60000) {
    moveWindowStartMs_ = s_.nowMs();
    movesInWindow_ = 0;
  }
  size_t budget = config_.defragMovesPerMinute > movesInWindow_ ? config_.defragMovesPerMinute - movesInWindow_ : 0;
  if (maxMoves) budget = std::min<size_t>(budget, maxMoves);
  if (!maxMoveBytes) maxMoveBytes = config_.defragMaxMoveBytes;
  if (budget == 0) return 0;
  size_t done = 0;
  for (auto& mv : s_.pool().planCompaction()) {
    if (done == budget) break;
    // Another host's vaccel (a shared pool): its scheduler is asked to move it.
    if (!s_.sessionById(mv.owner) && !s_.state_->holderElsewhere(mv.owner).empty()) (void)s_.state_->applyMove(mv);
    // A vaccel busy elsewhere (off its cards, or moving), too big to move or another
    // host's ends the plan: later moves count on this one having happened.
    if (!moveIfIdle(mv, maxMoveBytes, why)) break;
    ++done;
    ++movesInWindow_;
  }
  return done;
}

bool Relocator::moveIfIdle(const Pool::Move& mv, uint64_t maxMoveBytes, const std::string& why) {
  Session* s = s_.sessionById(mv.owner);
  if (!s || s->phase != Phase::running || s->memoryUsed > maxMoveBytes) return false;
  if (!s_.state_->applyMove(mv)) return false;
  move(*s, {mv.to}, why);
  return true;
}

Result<std::string> Relocator::preemptByOperator(VaccelId id) {
  Session* s = s_.sessionById(id);
  if (!s) return fail(Code::notFound, "no vaccel #" + std::to_string(id));
  bool wasRunning = s->phase == Phase::running;
  suspend(*s, "suspended by the operator", true);
  return s_.labelOf(*s) + (wasRunning ? " is being suspended (its buffers saved to host memory); `raccelctl resume " +
                                         std::to_string(s->id) + "` lets it run again"
                                   : std::string(" is ") + phaseName(s->phase) + "; it stays off its cards until resumed");
}

Result<std::string> Relocator::defrag(uint32_t maxMoves, uint64_t maxMoveBytes) {
  size_t planned = s_.pool().planCompaction().size();
  size_t moves = compact(maxMoves, maxMoveBytes, "raccelctl defrag");
  // What held the rest back, named as the operator gave it.
  std::string rest;
  if (moves < planned && maxMoves > 0 && moves >= maxMoves)
    rest = " (--max-moves " + std::to_string(maxMoves) + " stopped it; run it again for the rest)";
  else if (moves < planned)
    rest = std::string(" (the rest wait for defrag_moves_per_minute, ") + (maxMoveBytes ? "--max-bytes" : "defrag_max_move_bytes") +
           ", or vaccels busy off their cards)";
  return std::to_string(moves) + " move(s) started of " + std::to_string(planned) + " planned" + rest;
}

Result<std::string> Relocator::drainNode(const std::string& name, bool undo) {
  size_t index = s_.pool().nodeIndex(name);
  if (index == SIZE_MAX) return fail(Code::notFound, "no netaccel named '" + name + "'");
  const std::string everywhere = s_.state_->shared() ? " (on every host of the shared pool)" : "";
  if (undo) {
    s_.state_->setDraining(index, false);
    endDrain(name, "ended");
    return "netaccel '" + name + "' takes new work again" + everywhere;
  }
  s_.state_->setDraining(index, true);
  return "draining netaccel '" + name + "'" + everywhere + ": " + evacuate(index);
}

void Relocator::endDrain(const std::string& name, const std::string& how) {
  draining_.erase(name);
  s_.event("node-draining", name, how + ": blocks are placed here again");
  requestPlacement();
}

std::string Relocator::evacuate(size_t index, const std::string& askedOn) {
  const std::string name = s_.pool().nodes()[index].name;  // a copy: placing below may rebuild the view
  const std::string why = "netaccel '" + name + "' is draining" + (askedOn.empty() ? "" : " (asked on host " + askedOn + ")");
  draining_[name] = false;
  size_t moved = 0, suspended = 0;
  const BlockRange range = s_.pool().nodes()[index].blocks;
  for (Session* s : s_.allSessions()) {
    bool there = std::any_of(s->blocks.begin(), s->blocks.end(),
                             [&](const BlockRange& r) { return r.first < range.end() && range.first < r.end(); });
    if (!there || s->phase != Phase::running) continue;
    s_.state_->release(s->id);  // its blocks here stay out of the pool: the node is draining
    auto to = s_.state_->allocate(s->id, s->vm->policy.name, {s->want, s->kinds, s->rank()});
    if (to) {
      ++moved;
      move(*s, *to, why);
      continue;
    }
    // No room elsewhere: saved to host memory; it resumes when blocks free.
    ++suspended;
    suspend(*s, why + " and no other cards are free", false);
  }
  std::string detail = std::to_string(moved) + " vaccel(s) moving elsewhere, " + std::to_string(suspended) +
                       " suspended for want of room";
  s_.event("node-draining", name, detail + (askedOn.empty() ? "" : " (" + why + ")"));
  requestPlacement();  // reports it drained once nothing is left there
  return detail;
}

}  // namespace raccel::scheduler
