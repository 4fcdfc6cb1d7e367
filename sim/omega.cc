#include "sim/omega.h"

#include <algorithm>
#include <functional>
#include <memory>
#include <queue>
#include <random>
#include <set>

namespace raccel::sim {
namespace {

using scheduler::BlockRange;
using scheduler::HostVector;
using scheduler::VaccelId;

// One committed change, as the watch brings it to every view.
struct Commit {
  uint64_t index = 0;
  bool allocation = true;
  VaccelId owner = 0;
  std::vector<BlockRange> ranges;
  HostVector host;
  uint32_t cardMilli = 0;
  std::vector<size_t> cards;  // whose versions it set (allocations): cards, then nodes' hosts
};

struct Pending {  // a transaction on its way
  uint32_t scheduler = 0;
  Commit change;
  std::vector<uint64_t> versionsRead;  // of change.cards, in the view
};

struct View {
  Pool pool;
  std::vector<uint64_t> version;  // per card: the commit that last set it, as seen
  uint64_t loadedAt = 0;          // a full read at this commit: older deliveries skipped
};

struct Scheduler {
  View view;
  std::deque<std::pair<size_t, double>> queue;  // (pod, arrival time)
  bool busy = false;
  uint32_t attempts = 0;
};

class Omega {
 public:
  Omega(const Cluster& cluster, const std::vector<Pod>& pods, const OmegaOptions& o)
      : o_(o), pods_(pods), truth_(cluster.pool), rng_(o.seed) {
    trueVersion_.assign(truth_.cards().size() + truth_.nodes().size(), 0);  // cards, then hosts
    for (uint32_t s = 0; s < o.schedulers; ++s)
      schedulers_.push_back(std::make_unique<Scheduler>(Scheduler{{cluster.pool, trueVersion_, 0}, {}, false, 0}));
    for (size_t i = 0; i < pods.size(); ++i)
      if (pods[i].numGpu > 0) gpuPods_.push_back(i);
    double meanGpus = 0;
    for (size_t i : gpuPods_) meanGpus += pods[i].gpus();
    meanGpus /= std::max<size_t>(1, gpuPods_.size());
    double totalRate = o.ratePerScheduler * o.schedulers;
    meanLifetime_ = o.load * cluster.cards / (totalRate * std::max(1e-9, meanGpus));
  }

  Result<OmegaRun> run() {
    if (gpuPods_.empty()) return fail(Code::invalidArgument, "the pod list has no GPU pods");
    std::exponential_distribution<double> gap(o_.ratePerScheduler * o_.schedulers);
    std::uniform_int_distribution<size_t> pick(0, gpuPods_.size() - 1);
    std::uniform_int_distribution<uint32_t> who(0, o_.schedulers - 1);
    double t = 0;
    for (uint32_t i = 0; i < o_.pods; ++i) {
      t += gap(rng_);
      size_t pod = gpuPods_[pick(rng_)];
      uint32_t s = who(rng_);
      at(t, [this, pod, s, t] { arrive(s, pod, t); });
    }
    while (!events_.empty()) {
      auto e = events_.top();
      events_.pop();
      now_ = e.time;
      e.run();
    }
    run_.arrived = o_.pods;
    run_.conflictRate = run_.transactions ? double(run_.conflicts) / double(run_.transactions) : 0;
    std::sort(latencies_.begin(), latencies_.end());
    auto pct = [&](double p) {
      return latencies_.empty() ? 0 : latencies_[std::min(latencies_.size() - 1, size_t(p * double(latencies_.size())))];
    };
    run_.latencyP50Ms = pct(0.5) * 1000;
    run_.latencyP99Ms = pct(0.99) * 1000;
    // Rates over the arrival window (departures go on after it).
    run_.simulatedSeconds = t;
    run_.admittedPerS = t > 0 ? double(run_.admitted) / t : 0;
    run_.etcdUtilization = t > 0 ? std::min(1.0, etcdBusy_ / now_) : 0;
    return run_;
  }

 private:
  struct Event {
    double time;
    uint64_t order;
    std::function<void()> run;
    bool operator>(const Event& other) const { return std::tie(time, order) > std::tie(other.time, other.order); }
  };
  void at(double time, std::function<void()> fn) { events_.push({time, nextOrder_++, std::move(fn)}); }

  void arrive(uint32_t s, size_t pod, double time) {
    Scheduler& sc = *schedulers_[s];
    sc.queue.push_back({pod, time});
    if (!sc.busy) decide(s);
  }

  // The versions a placement's transaction compares (SharedPool::tryAllocate): of the
  // cards it takes, and with host needs of its node's host (numbered after the cards).
  std::vector<size_t> cardsOf(const Pool& pool, const std::vector<BlockRange>& ranges, const HostVector& host) {
    std::set<size_t> versioned;
    for (auto& share : pool.cardsOf(ranges)) versioned.insert(share.card);
    if (!host.empty() && !ranges.empty())
      versioned.insert(pool.cards().size() + pool.cards()[size_t(pool.cardOf(ranges[0].first))].node);
    return {versioned.begin(), versioned.end()};
  }

  void decide(uint32_t s) {
    Scheduler& sc = *schedulers_[s];
    if (sc.queue.empty()) {
      sc.busy = false;
      return;
    }
    sc.busy = true;
    ++sc.attempts;
    const Pod& pod = pods_[sc.queue.front().first];
    Pool::Request request = requestFor(pod, o_.policy);
    VaccelId owner = nextOwner_;
    auto got = sc.view.pool.allocate(owner, request);
    double decided = now_ + o_.decisionMs / 1000;
    if (!got) {  // the pool cannot hold it now: refused (the trace's pods do not wait)
      ++run_.refused;
      finishPod(s);
      at(decided, [this, s] { decide(s); });
      return;
    }
    ++nextOwner_;
    Pending p;
    p.scheduler = s;
    p.change.owner = owner;
    p.change.ranges = *got;
    p.change.host = request.host;
    p.change.cardMilli = request.shape == Pool::Shape::oneCard ? request.cardMilli : 0;
    p.change.cards = cardsOf(sc.view.pool, *got, request.host);
    for (size_t c : p.change.cards) p.versionsRead.push_back(sc.view.version[c]);
    sc.view.pool.release(owner);  // the view changes when the watch brings the commit
    at(decided + o_.rttMs / 2000, [this, p = std::move(p)]() mutable { toEtcd(std::move(p)); });
  }

  // etcd applies transactions one at a time at its capacity; each commits commitMs later.
  void toEtcd(Pending p) {
    double start = std::max(now_, etcdFreeAt_);
    etcdFreeAt_ = start + 1.0 / o_.etcdTxnPerS;
    etcdBusy_ += 1.0 / o_.etcdTxnPerS;
    at(start + o_.commitMs / 1000, [this, p = std::move(p)]() mutable { commit(std::move(p)); });
  }

  void commit(Pending p) {
    if (!p.change.allocation) {
      truth_.release(p.change.owner);
      p.change.index = ++commitIndex_;
      deliver(std::move(p.change));
      return;
    }
    ++run_.transactions;
    bool unchanged = true;
    for (size_t i = 0; i < p.change.cards.size(); ++i)
      unchanged = unchanged && trueVersion_[p.change.cards[i]] == p.versionsRead[i];
    uint32_t s = p.scheduler;
    if (!unchanged) {
      ++run_.conflicts;
      // The failure's answer: the whole pool as of now.
      auto snapshot = std::make_shared<View>(View{truth_, trueVersion_, commitIndex_});
      at(now_ + o_.rttMs / 2000, [this, s, snapshot] { conflicted(s, *snapshot); });
      return;
    }
    if (!truth_.assign(p.change.owner, p.change.ranges, 0, p.change.host, p.change.cardMilli)) ++run_.doubleHeld;
    p.change.index = ++commitIndex_;
    for (size_t c : p.change.cards) trueVersion_[c] = p.change.index;
    VaccelId owner = p.change.owner;
    deliver(p.change);
    double lifetime = std::exponential_distribution<double>(1.0 / meanLifetime_)(rng_);
    at(now_ + lifetime, [this, owner] { leave(owner); });
    at(now_ + o_.rttMs / 2000, [this, s] { committed(s); });
  }

  // Every view gets the change half a round trip after its commit, in commit order.
  void deliver(Commit change) {
    auto c = std::make_shared<Commit>(std::move(change));
    at(now_ + o_.rttMs / 2000, [this, c] {
      for (auto& sc : schedulers_) {
        View& v = sc->view;
        if (c->index <= v.loadedAt) continue;
        if (!c->allocation) {
          v.pool.release(c->owner);
          continue;
        }
        (void)v.pool.assign(c->owner, c->ranges, 0, c->host, c->cardMilli);
        for (size_t card : c->cards) v.version[card] = c->index;
      }
    });
  }

  void leave(VaccelId owner) {
    Pending p;
    p.change.allocation = false;
    p.change.owner = owner;
    at(now_ + o_.rttMs / 2000, [this, p = std::move(p)]() mutable { toEtcd(std::move(p)); });
  }

  void committed(uint32_t s) {
    Scheduler& sc = *schedulers_[s];
    latencies_.push_back(now_ - sc.queue.front().second);
    ++run_.admitted;
    finishPod(s);
    decide(s);
  }

  void conflicted(uint32_t s, const View& snapshot) {
    Scheduler& sc = *schedulers_[s];
    if (snapshot.loadedAt >= sc.view.loadedAt) sc.view = snapshot;
    if (sc.attempts >= o_.maxAttempts) {
      ++run_.gaveUp;
      finishPod(s);
    }
    decide(s);
  }

  void finishPod(uint32_t s) {
    schedulers_[s]->queue.pop_front();
    schedulers_[s]->attempts = 0;
  }

  const OmegaOptions& o_;
  const std::vector<Pod>& pods_;
  std::vector<size_t> gpuPods_;
  Pool truth_;  // etcd's state
  std::vector<uint64_t> trueVersion_;
  uint64_t commitIndex_ = 0;
  std::vector<std::unique_ptr<Scheduler>> schedulers_;
  std::priority_queue<Event, std::vector<Event>, std::greater<Event>> events_;
  uint64_t nextOrder_ = 0;
  VaccelId nextOwner_ = 1;
  double now_ = 0, etcdFreeAt_ = 0, etcdBusy_ = 0, meanLifetime_ = 1;
  std::mt19937_64 rng_;
  std::vector<double> latencies_;
  OmegaRun run_;
};

}  // namespace

Result<OmegaRun> runOmega(const Cluster& cluster, const std::vector<Pod>& pods, const OmegaOptions& options) {
  if (options.schedulers == 0 || options.schedulers > 1024) return fail(Code::invalidArgument, "--schedulers: 1 to 1024");
  if (!(options.ratePerScheduler > 0) || !(options.etcdTxnPerS > 0) || options.commitMs < 0 || options.rttMs < 0 ||
      options.decisionMs < 0 || !(options.load > 0) || options.load > 1)
    return fail(Code::invalidArgument, "rates must be > 0, latencies >= 0, load in (0, 1]");
  Omega omega(cluster, pods, options);
  return omega.run();
}

}  // namespace raccel::sim
