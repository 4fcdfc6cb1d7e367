// A vaccel's life on the pool's cards: placing it (at once, after waiting for blocks, or
// after preempting lower priorities), suspending it (its buffers saved to host memory,
// its cards released), resuming it, and moving it to other cards (compaction, drain).
//
// The contract. The Relocator decides where and when vaccels run; the scheduler carries
// the sessions. It owns the placement pass (one at a time, soon after requestPlacement),
// the admission policy's clock, the suspensions under way (their freed blocks are promised
// to the work they were started for), compaction's rate limit, and which netaccels drain.
// It changes blocks only through the pool's state (PoolState), and a session's contexts
// and messages only through the scheduler (openMembers, closeMembers, sendWelcome,
// runHeld, sendRemote, persistence). Operator actions that move vaccels are its own
// (preempt, resume, defrag, drain) and say what came of them.
//
// Saving and restoring are scheduler jobs (RemoteJob with `finished`) on the session's
// own contexts, so they are ordered after everything the guest sent before: saving
// reads every buffer after the guest's in-flight instructions have run; restoring
// reloads its programs, re-creates its buffers and writes the saved bytes before any
// instruction that waited meanwhile. While a vaccel is off its cards its instructions
// wait in `held` (docs/ARCHITECTURE.md, "The pool"); the guest sees latency, not an error,
// unless it said noWait. Loop thread only.
#pragma once

#include <uv.h>

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "scheduler/admission.h"
#include "scheduler/config.h"
#include "scheduler/pool.h"
#include "scheduler/scheduler.h"

namespace raccel::scheduler {

class Relocator {
 public:
  using Session = Scheduler::Session;
  using Vm = Scheduler::Vm;

  Relocator(uv_loop_t* loop, const SchedulerConfig& config, Scheduler& scheduler);
  ~Relocator();
  void start();  // the placement pass's timer
  void stop();

  // A placement pass soon (after the current callback): waiting vaccels placed,
  // suspended ones resumed, highest priority first, preempting for new ones.
  void requestPlacement();
  // What a session asks of the pool: its blocks, kinds, priority, host needs and node
  // limit (span_slack_nodes); for placing it and for planning preemption alike.
  Pool::Request placementRequest(const Session& s) const;
  Result<std::vector<BlockRange>> allocateFor(Session& s);  // compacts first when it would be fragmented
  void refuseWaiting(Session& s, const Error& error);
  // The admission policy's clock (admission.h), in seconds: the wall clock (sped up by
  // policy_clock_scale from this scheduler's start), so that the waiting times kept in
  // the state database mean the same after a restart.
  double policyNow() const;
  // Counts running vaccels' service up to `now` (their class follows it): whether a
  // running one changed class.
  bool accrueService(double now);

  void whenIdle(Session& s, std::function<void()> then);
  // Reads every buffer into s.saved after what the guest sent before, then closes its
  // contexts and runs `then` (also on failure: then s.unavailable says why).
  void save(Session& s, std::function<void()> then);
  // On the contexts of s.members: reloads its programs, re-creates its buffers from
  // s.saved, then runs what waited. `what` names the event (resumed, migrated).
  void restore(Session& s, const std::string& what);
  void suspend(Session& s, const std::string& why, bool byOperator);
  // Its blocks go back to the pool, and its service stops counting (off its cards).
  void leaveBlocks(Session& s);
  // A suspending vaccel ended (or was lost) before its suspension finished.
  void suspensionEnded() {
    if (suspending_) --suspending_;
  }
  // Gives a running vaccel the blocks `to` (already its own in the pool); its buffers
  // follow when the cards change.
  void move(Session& s, std::vector<BlockRange> to, const std::string& why);
  // Plans and starts compaction moves within the rate limit; returns how many.
  size_t compact(size_t maxMoves, uint64_t maxMoveBytes, const std::string& why);
  // One planned move of a running vaccel of this scheduler no larger than maxMoveBytes:
  // its blocks through the pool's state, then its data (false: not moved).
  bool moveIfIdle(const Pool::Move& mv, uint64_t maxMoveBytes, const std::string& why);

  // Operator actions: what came of each.
  Result<std::string> preemptByOperator(VaccelId id);
  Status resumeByOperator(VaccelId id);
  Result<std::string> defrag(uint32_t maxMoves, uint64_t maxMoveBytes);
  // raccelctl drain: the node takes no new blocks (on every host of a shared pool) and
  // this scheduler's vaccels move off it (evacuate: what came of it; `askedOn`: the host
  // whose operator drained it, when another).
  Result<std::string> drainNode(const std::string& name, bool undo);
  std::string evacuate(size_t node, const std::string& askedOn = "");
  void endDrain(const std::string& name, const std::string& how);

 private:
  void placeWaiting();
  // The admission order of the unplaced vaccels: over-share flags from every VM's demand
  // and holding, service classes (promoted once starved) and waiting times.
  std::vector<Waiting> admissionQueue(double now);
  // Whether an unplaced request waits for the pool itself (settling, or netaccels
  // expected back), can never be held, or is an ordinary request.
  enum class PoolWait { no, yes, never };
  PoolWait waitForThePool(Session& s);
  using Refusals = std::vector<std::pair<VaccelId, Error>>;  // refused after the pass (by id)
  // A waiting or suspended vaccel that was given `blocks`: it starts, or resumes.
  void startPlaced(Session& s, const std::vector<BlockRange>& blocks, double now);
  // Whether a vaccel that does not fit waits on the pool rather than on other vaccels
  // (recovering while the lost netaccel may come back, the pool settling), or can never
  // fit (added to `refused`).
  bool waitsOnThePool(Session& s, Refusals& refused);
  // Suspends the lower-priority vaccels that would make room for `s` (true: the pass
  // stops, their blocks promised to it), or says why it waits (`unplaced`: why it did
  // not fit).
  bool preemptFor(Session& s, const Error& unplaced, Refusals& refused);
  void reportDrained();  // draining netaccels that nothing runs on any more, once each

  uv_loop_t* loop_;
  const SchedulerConfig& config_;
  Scheduler& s_;
  uv_timer_t* placer_ = nullptr;
  double startedWallSeconds_ = 0;
  unsigned suspending_ = 0;  // suspensions under way
  uint64_t moveWindowStartMs_ = 0;
  size_t movesInWindow_ = 0;
  std::map<std::string, bool> draining_;  // netaccel -> reported drained
};

}  // namespace raccel::scheduler
