// The pool's state of a scheduler in the pool shared through etcd (raccel-scheduler
// with etcd = ENDPOINTS): PoolState (scheduler/pool_state.h) over a SharedPool.
//
// What the scheduler sees (view()) is a copy of the shared pool's view, kept on the
// loop thread and brought up to date whenever etcd's watch brings a change:
//   - every node of the shared pool, at its shared numbers; online here only while it
//     is online in etcd and linked to this scheduler (the data path is this host's);
//   - every holding: this scheduler's vaccels under their own ids, other schedulers'
//     under ids from SharedPool::kForeignIds up, at their pool priorities.
//
// Compaction is planned by one elected leader: the first scheduler to create the pool's
// `leader` key under its lease (sought again by all whenever it is gone). The leader
// moves its own vaccels, and asks the others' schedulers (moves/SCHEDULER/VACCEL) to
// move theirs; each checks the request came from the leader and still matches its
// vaccel's blocks, moves it with its data, and ends the request.
//
// Tenant usage is global: each scheduler publishes its tenants' decayed block-seconds
// (usage/SCHEDULER/VM, under its lease) when their holdings change and at least every
// 10 s, and orders its admissions by its own usage of a tenant plus the others'.
//
// Preemption across hosts: when the scheduler's plan takes other schedulers' vaccels,
// preemptElsewhere records a request per victim in etcd, under this scheduler's lease.
// The victim's scheduler checks that the request's priority is above its vaccel's and
// suspends it (`preempted`); until the request is taken back (its vaccel placed or gone,
// or its lease ended) it places nothing of a lower priority (`heldBack`), so the blocks
// it freed wait for the work they were freed for. A dead victim's scheduler answers
// through its lease: its holdings end with it.
//
// Allocations are committed on the loop thread (the guest's admission waits for it,
// at most etcd's call timeout); releases and priority changes are committed by a
// thread of its own, retried until etcd takes them (a release not yet committed only
// makes the other schedulers cautious). While etcd cannot be reached, allocations are
// refused at once with an error that names etcd, and running vaccels go on.
//
// When etcd lets this scheduler's lease lapse (it was cut off from etcd for longer than
// the lease while others were not), its holdings vanish from the pool: it stops placing,
// joins again under a new lease and claims its vaccels' blocks back; a vaccel whose
// blocks another scheduler took meanwhile is reported through `lost` (the scheduler
// suspends it: its buffers are saved, and it resumes when blocks free).
//
// Operators' drains and VM policies are the pool's, not one host's: setDraining records
// the drain in etcd and recordPolicy the settings; every other scheduler is told through
// drainAsked and policyAsked when the watch brings them (and of those standing when it
// joins). Each scheduler publishes its VMs and unplaced vaccels (publish, from its tick)
// for the other hosts' consoles.
//
// Not yet in a shared pool: restoring allocations after a restart (the holdings end with
// the scheduler's lease).
#pragma once

#include <uv.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>

#include "common/etcd_settings.h"
#include "scheduler/etcd/shared_pool.h"
#include "scheduler/pool_state.h"

namespace raccel::scheduler {

class EtcdPoolState final : public PoolState {
 public:
  // Joins the shared pool as scheduler `name`: unavailable when etcd cannot be reached,
  // invalidArgument when the block size differs or a live scheduler has the name.
  static Result<std::unique_ptr<EtcdPoolState>> open(uv_loop_t* loop, const EtcdSettings& settings, const std::string& name,
                                                     double blockTflops);
  ~EtcdPoolState() override;

  const Pool& view() const override { return mirror_; }
  Result<size_t> addNode(const std::string& name, const std::vector<CardSpec>& cards, HostVector host) override;
  std::vector<VaccelId> removeNode(size_t node) override;
  bool forgetNode(size_t) override { return false; }  // a shared node's record is kept for good
  void setDraining(size_t node, bool draining) override;
  Result<std::vector<BlockRange>> allocate(VaccelId owner, const std::string& vm, const Pool::Request& request) override;
  Status assign(VaccelId owner, const std::string& vm, const std::vector<BlockRange>& ranges, int priority,
                HostVector host) override;
  void release(VaccelId owner) override;
  void setPriority(VaccelId owner, int priority) override;
  bool movesAllowed() const override { return shared_ && shared_->leads(); }
  Status applyMove(const Pool::Move& move) override;
  void stop() override;
  std::string holderElsewhere(VaccelId owner) const override;
  void preemptElsewhere(VaccelId forWhom, const std::string& vm, int priority, const std::vector<VaccelId>& victims) override;
  std::string heldBack(int priority) const override;
  void reportUsage(const std::string& vm, double used, double now, uint32_t blocks) override;
  double usageElsewhere(const std::string& vm, double now) const override;
  Result<std::string> actElsewhere(const std::string& host, uint64_t id, bool preempt) override;
  std::vector<Elsewhere> vaccelsElsewhere() const override;
  void nameProgram(VaccelId owner, const std::string& program) override { shared_->nameProgram(owner, program); }
  bool shared() const override { return true; }
  void advertise(const std::string& address) override;
  Result<std::map<std::string, std::string>> recordPolicy(const std::string& vm,
                                                          const std::map<std::string, std::string>& changes) override;
  void publish(const std::map<std::string, Settings>& vms, const std::vector<Unplaced>& unplaced) override;
  std::vector<VmElsewhere> vmsElsewhere() const override;
  std::vector<UnplacedElsewhere> unplacedElsewhere() const override;

 private:
  EtcdPoolState(uv_loop_t* loop, std::string describe);
  void sync();                     // loop thread: the view from the shared pool's
  struct Job {
    std::function<Status()> commit;
    std::string what;           // for the log
    VaccelId released = kNoOwner;  // a release: the view stops hiding it once committed
  };
  void post(Job job);  // to the committing thread
  void run();                      // that thread: jobs, and re-reading etcd after it was lost
  Error etcdLost() const;

  uv_loop_t* loop_;
  std::string describe_;  // "etcd (ENDPOINTS) PREFIX as NAME"
  std::unique_ptr<etcd::Client> client_;
  std::unique_ptr<SharedPool> shared_;
  uv_async_t* async_ = nullptr;  // the watch brought a change
  Pool mirror_;
  std::map<VaccelId, SharedHolding> foreign_;  // other schedulers' vaccels in mirror_, by their ids there
  std::set<std::string> linked_;    // nodes whose netaccel is linked to this scheduler
  // Drains (loop thread): the nodes drained in the pool, by whom, as the view has them
  // with this scheduler's own drains and undos not yet in it on top; the intents
  // (node -> draining) not yet in the view; the drains the scheduler was told of.
  std::map<std::string, std::string> draining_;
  std::map<std::string, bool> drainIntents_;
  std::map<std::string, std::string> drainsAnswered_;
  void answerDrains();
  // Operators' VM policies (loop thread): as the view has them, and as the scheduler was
  // told of them (or recorded them itself).
  std::vector<SharedPolicy> policies_;
  std::map<std::string, Settings> policiesAnswered_;
  void answerPolicies();
  // The other schedulers' VMs and unplaced vaccels (loop thread, from the view); this
  // one's as last handed to the committing thread, and the newest waiting for it
  // (under mutex_: one job publishes the newest, so a long loss of etcd queues no more).
  std::vector<SharedVm> vmsElsewhere_;
  std::vector<SharedUnplaced> unplacedElsewhere_;
  std::map<std::string, Settings> lastVms_;
  std::vector<Unplaced> lastUnplaced_;
  using Records = std::pair<std::map<std::string, Settings>, std::vector<SharedUnplaced>>;
  std::optional<Records> toPublish_;  // under mutex_
  bool publishQueued_ = false;        // under mutex_: a job is on its way
  std::atomic<bool> republish_{false};  // what was published is gone (a new lease, a job given up)
  Status publishRecords();              // the committing thread
  std::atomic<bool> reachable_{true};

  std::mutex mutex_;  // what the committing thread shares with the loop
  std::condition_variable wake_;
  std::deque<Job> jobs_;
  std::set<VaccelId> releasing_;  // released here, not yet in etcd
  // This scheduler's holdings as it placed them (what it releases, and claims back when
  // its lease lapsed); the view may lag behind them.
  struct Owned {
    std::string vm;
    std::vector<BlockRange> ranges;
    int priority = 0;
    HostVector host;
  };
  std::map<VaccelId, Owned> owned_;
  std::vector<std::pair<VaccelId, std::string>> lostVaccels_;  // for the loop: lost()
  void rejoin();  // the committing thread, after the lease lapsed

  // Preemption across hosts (loop thread). Requests this scheduler made, by the vaccel
  // they are for; requests against this scheduler's vaccels that stand; the vaccels it
  // suspended for them (their freed blocks are promised while a request names them).
  std::map<VaccelId, std::vector<SharedPreemption>> requested_;
  bool requestsLapsed_ = false;  // under mutex_: the lease that kept them ended
  std::vector<SharedPreemption> against_;
  std::set<VaccelId> yielded_;
  std::set<std::string> refusedRequests_;  // logged once each
  void answerPreemptions();

  // Tenant usage across hosts. The other schedulers' records (from the view, loop
  // thread); this one's, as last published per tenant (loop thread), and those waiting
  // for the committing thread (under mutex_: one job publishes all, so a long loss of
  // etcd queues one record per tenant, never more).
  std::vector<SharedUsage> usageElsewhere_;
  struct Published {
    uint32_t blocks = 0;
    uint64_t atMs = 0;
  };
  std::map<std::string, Published> published_;
  std::map<std::string, SharedUsage> unpublished_;
  Status publishUsage();  // the committing thread

  // Moves (loop thread). The leader's requests of this scheduler's vaccels, from the
  // view; those answered (their requests are being ended); the moves this scheduler,
  // leading, asked of others that still stand. Leadership is sought whenever the pool
  // has no leader (one campaign at a time).
  std::vector<SharedMove> movesAsked_;
  std::set<std::string> movesAnswered_;
  std::set<std::pair<std::string, uint64_t>> movesAskedOfOthers_;
  std::atomic<bool> campaigning_{false};
  void campaignIfLeaderless();
  void answerMoves();

  // Operators' actions asked of this scheduler (from the view), and those answered (their
  // requests are being ended).
  std::vector<SharedAction> actionsAsked_;
  std::set<std::string> actionsAnswered_;
  void answerActions();
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace raccel::scheduler
