// The pool's state shared by many schedulers through etcd v3, in the style of Omega
// (docs/ARCHITECTURE.md, "Many hosts, one pool"): every scheduler keeps a cache of the whole
// pool fed by a watch, places with the same `Pool` code as a one-host scheduler, and
// commits each decision as one transaction that compares the revisions of what it read.
//
// Keys, under the options' prefix (values are JSON, checked where they are read):
//   config                 {"blockTflops": 1}: set by the first scheduler, matched by the rest
//   next                   the next free block number ("1" before any node)
//   nodes/NAME             a node's cards, host and numbers ({"first", "blocks", "cards", "host"});
//                          kept for good, so a node that returns gets its numbers back
//   online/NAME            under the node's own lease: it is online while that lives
//   cards/NODE/INDEX       a card's version: rewritten by every allocation on the card
//   hosts/NODE             its host's version: rewritten by every allocation with host needs there
//   schedulers/NAME        under the scheduler's lease: it is alive ({"lease", "address": where
//                          netaccels reach it, once it has advertised one})
//   holds/SCHEDULER/VACCEL under the scheduler's lease: who holds which blocks
//                          ({"vm", "priority", "ranges", "host", "cardMilli", "program"})
//   preempt/SCHEDULER/VACCEL/BY/FOR
//                          under the lease of scheduler BY: its vaccel FOR (of {"vm"}, at pool
//                          priority {"priority"}) needs the blocks of SCHEDULER's VACCEL, which
//                          SCHEDULER suspends when that priority is above the victim's
//   leader                 under the lease of the scheduler it names ({"scheduler"}): the one
//                          that plans compaction; the first to create it while it is absent
//   moves/SCHEDULER/VACCEL under the leader's lease: the leader's plan moves SCHEDULER's
//                          VACCEL ({"by", "from": its ranges, "to": one range}); SCHEDULER
//                          moves it (its data with it) and deletes the request
//   actions/SCHEDULER/VACCEL
//                          under the asker's lease: an operator on another host asks SCHEDULER
//                          to preempt or resume its VACCEL ({"action", "by"})
//   usage/SCHEDULER/VM     under the scheduler's lease: tenant VM's usage there
//                          ({"used": decayed block-seconds as of "at", "at", "blocks" held})
//   vms/SCHEDULER/VM       under the scheduler's lease: a VM it serves, with its policy as
//                          raccelctl set-policy's settings ({"settings": {KEY: VALUE}})
//   unplaced/SCHEDULER/VACCEL
//                          under the scheduler's lease: its vaccel that holds no blocks now,
//                          waiting or suspended ({"vm", "priority", "program", "state", "why",
//                          "blocks": what it asks})
//   drains/NODE            for good, until undone: an operator on scheduler {"by"} drains the
//                          node; no scheduler places there, each moves its vaccels off
//   policies/VM            for good: the operators' settings for VM ({"by", "settings"}),
//                          over what each host configures for it
//
// Why no block is ever held twice: an allocation's transaction compares the version of
// every card it takes blocks of with the version its cache read, and rewrites them. Any
// allocation on those cards committed since the cache's view changes a version, so the
// transaction fails and the scheduler re-reads; releases only free blocks, so a cache
// that has not seen one yet is merely cautious. Host needs are charged per node, so an
// allocation with host needs also compares and rewrites its node's host version.
//
// A scheduler's holdings live under its lease: when it dies they return to the pool as
// the lease expires. Values that do not parse or break an invariant (blocks past the
// numbering, a holding that overlaps an older one) are refused, logged and counted;
// they never crash the cache, and what came first keeps its blocks.
//
// Thread-safe: the watch thread feeds the cache, any thread may place and commit.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common/error.h"
#include "scheduler/etcd/etcd_client.h"
#include "scheduler/pool.h"

namespace raccel::scheduler {

struct SharedPoolOptions {
  std::string prefix = "/raccel/";
  std::string scheduler;           // this scheduler's name: unique among the pool's schedulers
  int64_t leaseTtlSeconds = 5;     // its holdings outlive it by at most this
  uint32_t maxAttempts = 16;       // per decision, before the conflict is reported
  double blockTflops = 1.0;        // must match the pool's
  bool keepAlive = true;           // a thread keeps the lease alive (off: tests let it lapse)
  // Called (from the watch's thread, no lock held) after the view changed.
  std::function<void()> onChange;
  // Called (from the keep-alive's thread) when etcd let this scheduler's lease expire:
  // its holdings are gone from the pool; rejoin() and claim() them back.
  std::function<void()> onLeaseLost;
};

// A holding as the pool records it.
struct SharedHolding {
  std::string scheduler;
  uint64_t vaccel = 0;
  std::string vm;
  int priority = 0;  // the pool priority: priority and service class (scheduler/admission.h)
  std::vector<BlockRange> ranges;
  HostVector host;
  uint32_t cardMilli = 0;
  int64_t createRevision = 0;
  std::string program;  // the guest program's name, as told (any bytes, shown clipped)
};

// A request of one scheduler (`by`, for its vaccel `forVaccel` of `vm`, at pool priority
// `priority`) that another (`victimScheduler`) suspend its vaccel `victim`: a preemption
// across hosts. It lives under the requester's lease.
struct SharedPreemption {
  std::string victimScheduler;
  uint64_t victim = 0;
  std::string by;
  uint64_t forVaccel = 0;
  int priority = 0;
  std::string vm;
};

// A move the leader planned (compaction) for another scheduler's vaccel.
struct SharedMove {
  std::string scheduler;  // the vaccel's
  uint64_t vaccel = 0;
  std::string by;  // the leader that planned it
  std::vector<BlockRange> from;
  BlockRange to;
};

// An operator's action on another host's vaccel, asked of the scheduler that serves it.
struct SharedAction {
  std::string scheduler;  // the vaccel's
  uint64_t vaccel = 0;
  std::string by;         // the scheduler whose console was asked
  bool preempt = true;    // else resume
};

// A tenant's usage on one scheduler: decayed block-seconds `used` as of `at` (seconds on
// the policy clock), and the blocks it holds there.
struct SharedUsage {
  std::string scheduler;
  std::string vm;
  double used = 0, at = 0;
  uint32_t blocks = 0;
};

// A VM a scheduler serves, with its policy as raccelctl set-policy's KEY=VALUE settings.
struct SharedVm {
  std::string scheduler;
  std::string vm;
  std::map<std::string, std::string> settings;
};

// A vaccel of a scheduler that holds no blocks now: waiting to be placed, or suspended
// (its buffers kept on its own host).
struct SharedUnplaced {
  std::string scheduler;
  uint64_t vaccel = 0;
  std::string vm;
  int priority = 0;  // as the program asked, capped by its VM's policy
  std::string program;
  std::string state;  // "waiting" or "suspended"
  std::string why;
  uint32_t blocks = 0;  // what it asks of the pool
  bool operator==(const SharedUnplaced&) const = default;
};

// An operator's drain of a node, asked on scheduler `by`: kept until undone (no lease),
// so it outlives the scheduler that was asked.
struct SharedDrain {
  std::string node;
  std::string by;
};

// The operators' raccelctl set-policy settings for a VM, on whatever host they were
// given: kept for good (no lease), applied by every scheduler that serves the VM over
// what that host configures for it. Their meaning is checked by the schedulers; the
// pool checks only their shape.
struct SharedPolicy {
  std::string vm;
  std::string by;
  std::map<std::string, std::string> settings;
};

// A node's registration: its blocks, and the revision that committed it.
struct SharedNode {
  BlockRange blocks;
  int64_t revision = 0;
};
// Registers a netaccel's node in the shared pool under `prefix`, online while `lease`
// lives. A new node gets the next numbers; a known one must bring the same cards (a new
// layout needs a new name). Needs no view: a netaccel calls it with its own lease.
// `unavailable` until a scheduler has set the pool's block size.
Result<SharedNode> registerSharedNode(etcd::Client& client, const std::string& prefix, const std::string& name,
                                      const std::vector<CardSpec>& cards, HostVector host, int64_t lease);

class SharedPool {
 public:
  // Joins the pool: checks (or sets) its block size, takes a lease and registers this
  // scheduler under it (refused when a live scheduler has the name), reads the whole
  // pool and starts the watch.
  static Result<std::unique_ptr<SharedPool>> open(etcd::Client& client, SharedPoolOptions options);
  ~SharedPool();  // stops the watch and the keep-alive; the lease is left to expire
  // Ends this scheduler's membership now: its lease is revoked, its holdings freed.
  Status leave();

  // A netaccel's node, online while `lease` lives. It gets the next numbers when it is
  // new; a known node must bring the same cards (else refused: a new layout is a new
  // node name). Returns the node's blocks.
  Result<BlockRange> registerNode(const std::string& name, const std::vector<CardSpec>& cards, HostVector host,
                                  int64_t lease);

  // Places `request` for this scheduler's `vaccel` (of `vm`) on the current view and
  // commits it; on a conflict, re-reads and places again, up to maxAttempts times, then
  // refuses with `unavailable` naming the conflicts. resourceExhausted as Pool::allocate
  // when the pool cannot hold it now or ever; an unreachable etcd is `unavailable`
  // naming etcd.
  // `usable` (when given): the nodes it may place on (a scheduler's own links).
  Result<std::vector<BlockRange>> allocate(uint64_t vaccel, const std::string& vm, const Pool::Request& request,
                                           const std::set<std::string>* usable = nullptr);
  // Returns this scheduler's `vaccel`'s blocks to the pool (nothing when it holds none).
  Status release(uint64_t vaccel);
  // The program name recorded with this scheduler's `vaccel`'s holding from its next
  // allocation or claim on ("" forgets it: the vaccel ended).
  void nameProgram(uint64_t vaccel, const std::string& program);
  // Records a new priority for this scheduler's `vaccel` (nothing when it holds none).
  Status setPriority(uint64_t vaccel, int priority);
  // Makes exactly `ranges` this scheduler's `vaccel`'s (replacing what it held), when
  // every block is free or already its own: a scheduler that lost its lease taking its
  // running vaccels' blocks back. resourceExhausted naming the block someone else holds.
  Status claim(uint64_t vaccel, const std::string& vm, const std::vector<BlockRange>& ranges, int priority,
               HostVector host);
  // Asks `p.victimScheduler` to suspend its `p.victim` (p.by must be this scheduler),
  // and takes the request back. Both may be repeated.
  Status requestPreemption(const SharedPreemption& p);
  Status withdrawPreemption(const SharedPreemption& p);
  // Records this scheduler's usage of tenant `u.vm` (u.scheduler is this one's).
  Status publishUsage(const SharedUsage& u);
  // The leader asks for a move of another scheduler's vaccel (m.by is this one, which
  // must lead); the vaccel's scheduler ends the request once it moved it, or refused.
  Status requestMove(const SharedMove& m);
  Status endMove(const std::string& scheduler, uint64_t vaccel);
  // An operator's action on another scheduler's vaccel (a.by is this one), and its end.
  Status requestAction(const SharedAction& a);
  Status endAction(const std::string& scheduler, uint64_t vaccel);
  // The VMs this scheduler serves, each with its policy as settings: every record of its
  // that differs is written, and its records of VMs not listed are deleted.
  Status publishVms(const std::map<std::string, std::map<std::string, std::string>>& vms);
  // This scheduler's vaccels that hold no blocks: written and deleted the same way.
  Status publishUnplaced(const std::vector<SharedUnplaced>& unplaced);
  // An operator's drain of `node` (by this scheduler's console), or its end.
  Status drain(const std::string& node, bool undo);
  // Adds `changes` to the operators' settings for `vm` (one transaction that compares
  // the record it read, retried on a conflict): the settings as they now stand.
  Result<std::map<std::string, std::string>> setPolicy(const std::string& vm,
                                                       const std::map<std::string, std::string>& changes);
  // Where netaccels reach this scheduler (host:port), kept in its schedulers/ record
  // (also when it joins again under a new lease).
  Status advertise(const std::string& address);
  // Whether a scheduler of this name is alive in the pool (in the view).
  bool alive(const std::string& scheduler);

  // Leadership (the one scheduler that plans moves): becomes the leader when there is
  // none (a transaction that creates `leader` under this scheduler's lease only while it
  // is absent: at most one leader at any revision). Returns whether this one leads.
  Result<bool> campaign();
  // The leader in the view ("" when none), and whether it is this scheduler.
  std::string leader();  // "" also when the key names no live scheduler
  bool leads();

  // After the lease was lost: a new lease, and this scheduler's name registered under it
  // again (unavailable while etcd cannot be reached).
  Status rejoin();
  bool leaseLost() const { return leaseLost_; }

  // In the view's Pool, this scheduler's vaccels hold blocks under their own ids (1 to
  // kForeignIds - 1); other schedulers' holdings (and refused values' quarantined
  // blocks) under ids from kForeignIds up.
  static constexpr VaccelId kForeignIds = VaccelId{1} << 62;
  // A copy of the view's Pool, the revision it is current to, and the other schedulers'
  // holdings by the ids they have in that Pool.
  // The standing preemption requests whose requester is alive (its scheduler key lives).
  struct PoolCopy {
    Pool pool;
    int64_t revision = 0;
    std::map<VaccelId, SharedHolding> foreign;
    std::vector<SharedPreemption> preemptions;
    std::vector<SharedUsage> usage;  // of live schedulers, this one's included
    std::vector<SharedMove> moves;   // asked by a live scheduler
    std::vector<SharedAction> actions;  // asked by a live scheduler
    std::vector<SharedVm> vms;          // served by a live scheduler, this one's included
    std::vector<SharedUnplaced> unplaced;  // of live schedulers, this one's included
    std::vector<SharedDrain> drains;
    std::vector<SharedPolicy> policies;
  };
  PoolCopy poolCopy();
  // Whether the watch runs (false after etcd was lost, until refresh() re-reads).
  bool watching();

  // Snapshot of the view: nodes, cards, free blocks, who holds what.
  struct View {
    int64_t revision = 0;
    uint32_t total = 0, free = 0, highest = 0;
    std::vector<Node> nodes;
    std::vector<SharedHolding> holdings;
  };
  View view();
  // Re-reads the pool and watches it again when the watch broke (etcd lost for a
  // while); otherwise nothing. Decisions and views call it first.
  Status refresh();
  // Waits until the view has caught up with `revision` (false after `timeoutMs`).
  bool waitForRevision(int64_t revision, uint32_t timeoutMs);

  struct Stats {
    uint64_t commits = 0;    // decisions committed
    uint64_t conflicts = 0;  // transactions that failed on a changed version
    uint64_t refusedValues = 0;  // values in etcd refused while reading
  };
  Stats stats();
  int64_t lease() const { return lease_; }
  const std::string& name() const { return options_.scheduler; }
  const std::string& prefix() const { return options_.prefix; }

  // Parsing, exposed for tests and the audit. Each refuses what breaks the format.
  static Result<SharedHolding> parseHolding(const std::string& key, const std::string& value,
                                            const std::string& prefix);
  static std::string holdingValue(const SharedHolding& h);
  static Result<SharedPreemption> parsePreemption(const std::string& key, const std::string& value,
                                                  const std::string& prefix);
  static std::string preemptionKey(const SharedPreemption& p);  // without the prefix
  static Result<SharedUsage> parseUsage(const std::string& key, const std::string& value, const std::string& prefix);
  static Result<SharedMove> parseMove(const std::string& key, const std::string& value, const std::string& prefix);
  static Result<SharedAction> parseAction(const std::string& key, const std::string& value, const std::string& prefix);
  static Result<SharedVm> parseVm(const std::string& key, const std::string& value, const std::string& prefix);
  static Result<SharedUnplaced> parseUnplaced(const std::string& key, const std::string& value, const std::string& prefix);
  static Result<SharedDrain> parseDrain(const std::string& key, const std::string& value, const std::string& prefix);
  static Result<SharedPolicy> parsePolicy(const std::string& key, const std::string& value, const std::string& prefix);
  // A policy's settings: at most this many, each KEY of lower-case letters and '_' and a
  // VALUE of printable ASCII, each at most kMaxSettingBytes.
  static constexpr size_t kMaxSettings = 16, kMaxSettingBytes = 64;
  // At most this many standing preemption requests, and as many usage records, are
  // read; the rest are refused.
  static constexpr size_t kMaxRecords = 4096;

 private:
  SharedPool(etcd::Client& client, SharedPoolOptions options, int64_t lease);
  struct Key {
    std::string value;
    int64_t modRevision = 0, createRevision = 0;
  };
  Status load();                                    // the whole prefix, then the view rebuilt
  void loadFrom(const etcd::pb::RangeResponse& r);  // under mutex_
  void apply(const std::vector<mvccpb::Event>& events, int64_t revision);
  void startWatch(int64_t fromRevision);
  // Waits (mutex_ held through `lock`) until the watch has brought `revision`.
  void catchUp(std::unique_lock<std::mutex>& lock, int64_t revision);
  void rebuild();  // the view from keys_, under mutex_
  Status removeKey(const std::string& key);  // deletes PREFIX key; the view catches up
  Status putUnderLease(const std::string& key, const std::string& value);  // PREFIX key, this scheduler's
  Status putKey(const std::string& key, const std::string& value, int64_t lease);  // PREFIX key (lease 0: for good)
  static std::string leaderNamed(const std::string& value);  // "" when it names none
  void noteRefused(const std::string& key, const std::string& why);  // logged and counted once
  void quarantine(const std::vector<BlockRange>& ranges, int64_t created);
  // A gap in the numbering before `first` (a node record refused or removed) is held by
  // an offline node of that many blocks named kGapPrefix + its first number, so that the
  // nodes after it keep their numbers. It never comes online.
  void holdGap(uint32_t first);
  static constexpr const char* kGapPrefix = "~gap@";
  bool addNodeRecord(const std::string& name, const std::string& value);
  VaccelId localId(const std::string& scheduler, uint64_t vaccel);
  std::string cardKey(size_t card) const;
  int64_t modOf(const std::string& key) const;
  // Adds to a decision's transaction the compare and rewrite of every version it read
  // (under mutex_, on the view it placed on).
  void compareVersions(etcd::pb::TxnRequest& txn, const std::vector<BlockRange>& ranges, const HostVector& host,
                       uint64_t vaccel) const;
  // One attempt: the transaction of an allocation placed on the view; nullopt when it
  // conflicted (the view is then reloaded from the failure's answer).
  Result<std::optional<std::vector<BlockRange>>> tryAllocate(uint64_t vaccel, const std::string& vm,
                                                              const Pool::Request& request, const std::set<std::string>* usable);
  // Commits a decision's transaction: true, with the view caught up to it; false when
  // a version it compared had changed (the view is then reloaded from the answer).
  Result<bool> commit(etcd::pb::TxnRequest& txn);
  // Re-reads the pool: the ranges this scheduler's `vaccel` holds there, if any.
  Result<std::optional<std::vector<BlockRange>>> committedHolding(uint64_t vaccel);

  etcd::Client& client_;
  SharedPoolOptions options_;
  std::atomic<int64_t> lease_;
  std::atomic<bool> leaseLost_{false};
  std::unique_ptr<etcd::LeaseKeeper> keeper_;
  void startKeeper();
  std::unique_ptr<etcd::Watcher> watcher_;

  std::mutex refreshMutex_;  // held while the pool is re-read and the watch restarted
  std::mutex mutex_;          // the view below
  std::condition_variable advanced_;
  std::map<std::string, Key> keys_;  // the prefix as the view has it (key without prefix)
  int64_t revision_ = 0;             // the view is current to this revision
  int64_t loadedAt_ = 0;             // of the last full read
  bool dirty_ = true;
  Pool pool_;
  std::map<std::pair<std::string, uint64_t>, VaccelId> localIds_;
  std::map<uint64_t, std::string> programs_;  // nameProgram's, by this scheduler's vaccel
  VaccelId nextForeign_ = kForeignIds;
  std::vector<SharedHolding> holdings_;  // as placed in pool_ (refused ones left out)
  std::vector<SharedPreemption> preemptions_;  // standing requests of live schedulers
  std::vector<SharedUsage> usage_;              // tenants' usage records of live schedulers
  std::vector<SharedMove> moves_;               // move requests of live schedulers
  std::vector<SharedAction> actions_;           // operators' actions asked by live schedulers
  std::vector<SharedVm> vms_;                   // VMs of live schedulers
  std::vector<SharedUnplaced> unplaced_;        // unplaced vaccels of live schedulers
  std::vector<SharedDrain> drains_;
  std::vector<SharedPolicy> policies_;
  // This scheduler's vms/ and unplaced/ records as last written (the committing thread's).
  std::map<std::string, std::string> publishedVms_, publishedUnplaced_;
  std::string address_;  // advertise()'s (the committing thread's); empty until then
  std::string selfValue(int64_t lease) const;  // this scheduler's schedulers/ record
  // Makes this scheduler's records under `dir` exactly `want` (key below dir -> value).
  Status publishSet(const std::string& dir, const std::map<std::string, std::string>& want,
                    std::map<std::string, std::string>& published);
  // Under mutex_, by rebuild(): the records under `dir` that parse and (when `scheduler`
  // names the field) whose scheduler is alive, at most kMaxRecords.
  template <typename Record>
  void readRecords(const std::string& dir, const char* what,
                   Result<Record> (*parse)(const std::string&, const std::string&, const std::string&),
                   std::string Record::*scheduler, std::vector<Record>& out);
  Stats stats_;
  std::set<std::pair<std::string, int64_t>> refusedSeen_;  // (key, its revision) refused so far
  bool watchBroken_ = false;
};

}  // namespace raccel::scheduler
