// The pool's state as a scheduler owns it: one interface, two implementations.
//
//   LocalPoolState  one host's pool, in memory (the embedded default; persisted by the
//                   scheduler's SQLite store).
//   EtcdPoolState   the shared pool of many hosts (scheduler/etcd/etcd_pool_state.h):
//                   a view fed by etcd's watch, every decision committed as a transaction.
//
// The contract. `view()` is the pool to read and to plan on (placement, preemption,
// compaction, the console): nodes, cards, free blocks and every holder, including, in a
// shared pool, the holders of other schedulers. Nothing but the calls below changes the
// blocks, and each of them either takes effect or changes nothing and says why. Called
// on the scheduler's loop thread only; `changed` is called there too, when the view
// changed by something other than these calls (another host's decision).
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "common/error.h"
#include "scheduler/pool.h"

namespace raccel::scheduler {

class PoolState {
 public:
  virtual ~PoolState() = default;

  virtual const Pool& view() const = 0;

  // A netaccel that registered over its link: its cards join (or a known node returns
  // online). Returns its node index in view().
  virtual Result<size_t> addNode(const std::string& name, const std::vector<CardSpec>& cards, HostVector host) = 0;
  // Its link is gone: the node goes offline here. Returns the vaccels holding blocks there.
  virtual std::vector<VaccelId> removeNode(size_t node) = 0;
  // An offline node nobody holds is forgotten (false: it is kept).
  virtual bool forgetNode(size_t node) = 0;
  virtual void setDraining(size_t node, bool draining) = 0;

  // Places `request` for `owner` (a vaccel of `vm`) and makes it that vaccel's.
  virtual Result<std::vector<BlockRange>> allocate(VaccelId owner, const std::string& vm, const Pool::Request& request) = 0;
  // Makes exactly `ranges` the vaccel's (restoring after a restart).
  virtual Status assign(VaccelId owner, const std::string& vm, const std::vector<BlockRange>& ranges, int priority,
                        HostVector host) = 0;
  virtual void release(VaccelId owner) = 0;
  virtual void setPriority(VaccelId owner, int priority) = 0;
  // Compaction: whether this state may plan moves itself, and one move. In a shared
  // pool only the elected leader plans; a move of another scheduler's vaccel is asked of
  // that scheduler (unavailable here: it moves the vaccel itself, through moveAsked).
  virtual bool movesAllowed() const = 0;
  virtual Status applyMove(const Pool::Move& move) = 0;
  // The scheduler stops (on its loop, which then runs until its handles are closed).
  virtual void stop() {}
  // A holder in view() that is not this scheduler's ("SCHEDULER/VM#VACCEL"), or "".
  virtual std::string holderElsewhere(VaccelId) const { return {}; }
  // The vaccels of a shared pool that other schedulers serve, as this one sees them.
  struct Elsewhere {
    std::string scheduler;
    uint64_t vaccel = 0;  // its id on that scheduler
    std::string vm;
    int priority = 0;
    std::vector<BlockRange> ranges;
    std::string program;
  };
  virtual std::vector<Elsewhere> vaccelsElsewhere() const { return {}; }
  // The program a vaccel of this scheduler serves, for the other hosts' consoles.
  virtual void nameProgram(VaccelId, const std::string& /*program*/) {}

  // Preemption across hosts (a shared pool). Asks the schedulers that serve `victims`
  // (holders in view() that are not this scheduler's) to suspend them for this
  // scheduler's `forWhom` (of `vm`, at pool priority `priority`); its earlier requests
  // that are not among them are taken back, so an empty list takes back all.
  virtual void preemptElsewhere(VaccelId /*forWhom*/, const std::string& /*vm*/, int /*priority*/,
                                const std::vector<VaccelId>& /*victims*/) {}
  // Why a placement here at pool priority `priority` must wait, or "": another scheduler
  // has preempted vaccels of this one for work of a higher priority, and the blocks they
  // freed are promised to that work until it is placed.
  virtual std::string heldBack(int /*priority*/) const { return {}; }

  // Tenant usage across hosts (a shared pool): this scheduler's record of tenant `vm`
  // (decayed block-seconds `used` as of `now` on the policy clock, `blocks` held now),
  // and the other schedulers' records of it, decayed to `now`.
  virtual void reportUsage(const std::string& /*vm*/, double /*used*/, double /*now*/, uint32_t /*blocks*/) {}
  virtual double usageElsewhere(const std::string& /*vm*/, double /*now*/) const { return 0; }

  // An operator's preempt or resume of vaccel `id` of another scheduler `host` (a shared
  // pool): asked of that scheduler; what the console is told.
  virtual Result<std::string> actElsewhere(const std::string& /*host*/, uint64_t /*id*/, bool /*preempt*/) {
    return fail(Code::invalidArgument, "this scheduler's pool is its own (no --etcd): a vaccel is named by its id alone");
  }

  // What an operator's raccelctl drain and set-policy reach (a shared pool: every host).
  // setDraining records the drain for every scheduler; the others are told through
  // `drainAsked`. recordPolicy adds an operator's settings for `vm` to what every
  // scheduler that serves it applies: the settings as they now stand (the others are
  // told through `policyAsked`). One host's pool has no one else to tell.
  virtual bool shared() const { return false; }
  // A shared pool: the address netaccels reach this scheduler at, published for those
  // that find the pool's schedulers in etcd (a netaccel with scheduler = etcd).
  virtual void advertise(const std::string& /*address*/) {}
  virtual Result<std::map<std::string, std::string>> recordPolicy(const std::string& /*vm*/,
                                                                  const std::map<std::string, std::string>& changes) {
    return changes;
  }
  // The VMs this scheduler serves, each with its policy as set-policy settings, and its
  // vaccels that hold no blocks (waiting or suspended): for the other hosts' consoles.
  struct Unplaced {
    uint64_t vaccel = 0;
    std::string vm;
    int priority = 0;
    std::string program, state, why;
    uint32_t blocks = 0;
    bool operator==(const Unplaced&) const = default;
  };
  using Settings = std::map<std::string, std::string>;
  virtual void publish(const std::map<std::string, Settings>& /*vms*/, const std::vector<Unplaced>& /*unplaced*/) {}
  // The other schedulers' VMs and unplaced vaccels, as this one sees them.
  struct VmElsewhere {
    std::string scheduler, vm;
    Settings settings;
  };
  virtual std::vector<VmElsewhere> vmsElsewhere() const { return {}; }
  struct UnplacedElsewhere {
    std::string scheduler;
    Unplaced vaccel;
  };
  virtual std::vector<UnplacedElsewhere> unplacedElsewhere() const { return {}; }

  // The view changed under the scheduler (set by the scheduler, called on its loop).
  std::function<void()> changed;
  // Another scheduler asks that this one's vaccel be suspended (a shared pool's
  // preemption across hosts, its priority already checked): true when it is being
  // suspended or is off its cards already (called on its loop).
  std::function<bool(VaccelId, const std::string& why)> preempted;
  // The shared pool's leader planned a move of this scheduler's vaccel: true when the
  // scheduler moved it (through applyMove, its data with it); called on its loop.
  std::function<bool(const Pool::Move&, const std::string& why)> moveAsked;
  // An operator on scheduler `by` preempts (or resumes) this scheduler's vaccel: what
  // came of it (called on its loop).
  std::function<Status(VaccelId, bool preempt, const std::string& by)> actionAsked;
  // An operator on scheduler `by` drained node `name` (or ended its drain): the scheduler
  // moves its vaccels off it (called on its loop; also for the drains standing when it
  // joins the pool).
  std::function<void(const std::string& name, bool draining, const std::string& by)> drainAsked;
  // The operators' settings for `vm` changed (given on scheduler `by`): the scheduler
  // applies them if it serves `vm` (called on its loop; also for those standing when it
  // joins the pool).
  std::function<void(const std::string& vm, const Settings& settings, const std::string& by)> policyAsked;
  // A vaccel's blocks are no longer its own (a shared pool's lease lapsed and another
  // scheduler took them meanwhile): the scheduler takes it off them (called on its loop).
  std::function<void(VaccelId, const std::string& why)> lost;
};

// One host's pool: exactly the Pool, owned by the scheduler.
class LocalPoolState final : public PoolState {
 public:
  explicit LocalPoolState(double blockTflops) : pool_(blockTflops) {}

  const Pool& view() const override { return pool_; }
  Result<size_t> addNode(const std::string& name, const std::vector<CardSpec>& cards, HostVector host) override {
    return pool_.addNode(name, cards, host);
  }
  std::vector<VaccelId> removeNode(size_t node) override { return pool_.removeNode(node); }
  bool forgetNode(size_t node) override { return pool_.forgetNode(node); }
  void setDraining(size_t node, bool draining) override { pool_.setDraining(node, draining); }
  Result<std::vector<BlockRange>> allocate(VaccelId owner, const std::string&, const Pool::Request& request) override {
    return pool_.allocate(owner, request);
  }
  Status assign(VaccelId owner, const std::string&, const std::vector<BlockRange>& ranges, int priority,
                HostVector host) override {
    return pool_.assign(owner, ranges, priority, host);
  }
  void release(VaccelId owner) override { pool_.release(owner); }
  void setPriority(VaccelId owner, int priority) override { pool_.setPriority(owner, priority); }
  bool movesAllowed() const override { return true; }
  Status applyMove(const Pool::Move& move) override { return pool_.applyMove(move); }

 private:
  Pool pool_;
};

}  // namespace raccel::scheduler
