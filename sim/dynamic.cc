#include "sim/dynamic.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <set>

#include "scheduler/admission.h"
#include "sim/audit.h"
#include "sim/csv.h"

namespace raccel::sim {

using scheduler::Pool;
using scheduler::TenantUsage;
using scheduler::VaccelId;

std::map<std::string, double> defaultStepSeconds() {
  return {{"ResNet-18", 0.01}, {"ResNet-50", 0.02}, {"Transformer", 0.01}, {"LM", 0.01},
          {"Recommendation", 0.005}, {"CycleGAN", 0.03}, {"A3C", 0.005}};
}

Result<Workload> loadPhilly(const std::string& dir, const std::map<std::string, double>& stepSeconds, size_t maxJobsPerTenant) {
  std::error_code ec;
  std::vector<std::filesystem::path> files;
  for (auto& entry : std::filesystem::directory_iterator(dir, ec))
    if (entry.path().extension() == ".trace") files.push_back(entry.path());
  if (ec) return fail(Code::notFound, "cannot read the Philly trace folder " + dir + ": " + ec.message());
  if (files.empty()) return fail(Code::notFound, dir + ": no *.trace files");
  std::sort(files.begin(), files.end());
  Workload w;
  for (auto& file : files) {
    auto rows = RowReader::open(file.string(), "the trace", '\t');
    if (!rows) return fail(rows.error());
    uint32_t tenant = static_cast<uint32_t>(w.tenants.size());
    w.tenants.push_back(file.stem().string());
    std::vector<std::string> f;
    size_t taken = 0;
    while (rows->next(f)) {
      if (maxJobsPerTenant && taken >= maxJobsPerTenant) break;
      std::string where = rows->where();
      if (f.size() != 7) return fail(Code::invalidArgument, where + ": expected 7 tab-separated fields, found " + std::to_string(f.size()));
      std::string family = f[0].substr(0, f[0].find(" ("));
      auto step = stepSeconds.find(family);
      if (step == stepSeconds.end()) return fail(Code::invalidArgument, where + ": no step time for model '" + family + "'");
      auto steps = parseCount(f[4], where + " total_steps");
      auto arrival = parseReal(f[5], where + " arrival_time_s");
      auto gpus = parseCount(f[6], where + " num_gpus");
      if (!steps) return fail(steps.error());
      if (!arrival) return fail(arrival.error());
      if (!gpus) return fail(gpus.error());
      if (*gpus == 0 || *arrival < 0) return fail(Code::invalidArgument, where + ": num_gpus >= 1 and arrival_time_s >= 0");
      Job job;
      job.tenant = tenant;
      job.model = f[0];
      job.arrival = *arrival;
      job.seconds = std::max(1.0, static_cast<double>(*steps) * step->second);
      job.gpus = static_cast<uint32_t>(*gpus);
      w.jobs.push_back(std::move(job));
      ++taken;
    }
  }
  std::stable_sort(w.jobs.begin(), w.jobs.end(), [](const Job& a, const Job& b) { return a.arrival < b.arrival; });
  for (size_t i = 0; i < w.jobs.size(); ++i) w.jobs[i].id = static_cast<uint32_t>(i);
  if (w.jobs.empty()) return fail(Code::invalidArgument, dir + ": no jobs");
  return w;
}

Cluster phillyCluster() {
  auto c = parseClusterConfig("[node]\nname = v100\ncount = 40\ncards = gpu:V100:15.7x8\n", "philly-cluster");
  return std::move(*c);
}

namespace {

enum class Phase { pending, waiting, running, suspended, done, refused };

struct JobState {
  Phase phase = Phase::pending;
  double remaining = 0;  // work seconds left (at rate 1)
  double rate = 1;
  double start = -1, finish = -1;
  int priority = 0;
  uint32_t blocks = 0;
  std::vector<VaccelId> owners;
  scheduler::Service service;  // attained service, class, last run, waiting since
  double ranSince = -1;        // start of the current run
};

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t i = static_cast<size_t>(std::ceil(p * v.size())) - 1;
  return v[std::min(i, v.size() - 1)];
}

// One run of a workload through one policy, event by event: arrivals, completions,
// attained service crossing a class, a Gandiva round, a waiting job's guard, a sample.
class DynamicSim {
 public:
  DynamicSim(const Cluster& base, const Workload& w, const DynamicOptions& o)
      : c_(base), pool_(c_.pool), w_(w), o_(o), raccel_(o.policy == Policy::raccel),
        lasOrdered_(raccel_ || o.policy == Policy::tiresias), n_(w.jobs.size()), js_(n_), usage_(w.tenants.size()),
        shareSum_(w.tenants.size(), 0), entSum_(w.tenants.size(), 0), samples_(w.tenants.size(), 0) {
    pool_.setFit(fitOf(o.policy), o.seed);
    // A GPU's worth of blocks, and the most cards a node has (a gang part's size).
    std::map<uint32_t, uint32_t> sizes;
    for (auto& card : pool_.cards()) ++sizes[card.blocks.count];
    for (auto& [size, count] : sizes)
      if (!blocksPerGpu_ || count > sizes[blocksPerGpu_]) blocksPerGpu_ = size;
    for (auto& node : pool_.nodes()) cardsPerNode_ = std::max<uint32_t>(cardsPerNode_, static_cast<uint32_t>(node.cards.size()));
    totalBlocks_ = pool_.total();
    std::mt19937_64 rng(o.seed);
    std::bernoulli_distribution tag(std::clamp(o.highFraction, 0.0, 1.0));
    run_.jobs = n_;
    run_.high.resize(n_);
    for (size_t i = 0; i < n_; ++i) {
      js_[i].remaining = w.jobs[i].seconds;
      js_[i].blocks = w.jobs[i].gpus * blocksPerGpu_;
      js_[i].priority = (o.highFraction > 0 && tag(rng)) ? 1 : w.jobs[i].priority;
      run_.high[i] = js_[i].priority > 0;
    }
    run_.shareSeries.resize(w.tenants.size());
  }

  Result<DynamicRun> run() {
    while (settled_ < n_) {
      auto next = nextEvent();
      if (!next) return fail(next.error());
      advance(*next);
      if (t_ == nextSample_) sample();
      bool changed = t_ == tWaiting_, released = false;
      if (lasOrdered_) changed = reclassify() || changed;
      if (o_.policy == Policy::gandiva && t_ >= nextRound_) {
        nextRound_ = t_ + o_.roundSeconds;
        if (!queued_.empty()) gandivaRound();
      }
      if (finishDone()) changed = released = true;
      changed = admitArrivals() || changed;
      if (raccel_ && released) compact();
      if (changed)
        if (auto st = pass(); !st) return fail(st.error());
      if (running_.empty() && nextArrival_ == n_ && !queued_.empty()) {
        for (size_t i : queued_) js_[i].phase = Phase::refused, ++settled_;  // fits nowhere, even in an empty cluster
        queued_.clear();
      }
      if (o_.audit)
        if (auto st = auditPool(pool_, holders_); !st) return fail(Code::internal, "t=" + std::to_string(t_) + "s: " + st.error().message);
    }
    figures();
    return std::move(run_);
  }

 private:
  double arrivalOf(size_t i) const { return w_.jobs[i].arrival / o_.rate; }

  // ---- Events ----
  // The time of the next event (tWaiting_ noted: a waiting job's guard or promotion).
  Result<double> nextEvent() {
    const double never = std::numeric_limits<double>::infinity();
    double tArrival = nextArrival_ < n_ ? arrivalOf(nextArrival_) : never;
    double tDone = never;
    for (size_t i : running_) tDone = std::min(tDone, t_ + js_[i].remaining / js_[i].rate);
    // Attained service crossing a class threshold (raccel and Tiresias order by it).
    double tClass = never;
    if (lasOrdered_)
      for (size_t i : running_) tClass = std::min(tClass, t_ + js_[i].service.secondsToNextClass(js_[i].blocks));
    double tRound = o_.policy == Policy::gandiva && !queued_.empty() ? nextRound_ : never;
    // raccel: waiting alone passing the starvation guard or a promotion (as the
    // scheduler's tick does).
    tWaiting_ = never;
    if (raccel_)
      for (size_t i : queued_) tWaiting_ = std::min(tWaiting_, js_[i].service.nextWaitingChange(t_, o_.promoteKnob));
    double tNext = std::min({tArrival, tDone, nextSample_, tClass, tRound, tWaiting_});
    if (!std::isfinite(tNext)) return fail(Code::internal, "jobs wait that nothing can ever run");
    return tNext;
  }
  // The running jobs' work and service up to tNext.
  void advance(double tNext) {
    double held = 0;
    for (size_t i : running_) {
      js_[i].remaining -= (tNext - t_) * js_[i].rate;
      js_[i].service.ran(tNext - t_, js_[i].blocks);
      held += js_[i].blocks;
    }
    busy_ += held * (tNext - t_);
    t_ = tNext;
  }
  void sample() {
    std::vector<double> demand, have;
    auto fair = tenantDemand(demand, have);
    run_.sampleTimes.push_back(t_ / 3600);
    for (size_t k = 0; k < w_.tenants.size(); ++k) {
      run_.shareSeries[k].push_back(100 * have[k] / totalBlocks_);
      if (demand[k] <= 0) continue;
      shareSum_[k] += 100 * have[k] / totalBlocks_;
      entSum_[k] += 100 * fair[k] / totalBlocks_;
      ++samples_[k];
    }
    nextSample_ += o_.sampleSeconds;
  }
  // Demotion as attained service grows; promotion of work starved for longer than
  // promoteKnob x its last run (Tiresias' guard). True when either happened.
  bool reclassify() {
    bool changed = false;
    for (size_t i : running_) {
      if (!js_[i].service.reclassify()) continue;
      decide("demote", i);
      for (VaccelId v : js_[i].owners) pool_.setPriority(v, scheduler::poolPriority(js_[i].priority, js_[i].service.serviceClass));
      changed = true;
    }
    for (size_t i : queued_) changed = js_[i].service.promote(t_, o_.promoteKnob) || changed;
    return changed;
  }
  // The jobs whose work is done stop; true when one did.
  bool finishDone() {
    bool any = false;
    for (size_t k = 0; k < running_.size();) {
      size_t i = running_[k];
      if (js_[i].remaining <= 1e-6 * std::max(1.0, w_.jobs[i].seconds)) {
        decide("finish", i);
        stop(i, Phase::done);
        js_[i].finish = t_;
        ++settled_;
        any = true;
      } else {
        ++k;
      }
    }
    return any;
  }
  // The jobs arrived by now wait (or are refused: larger than the cluster); true when one waits.
  bool admitArrivals() {
    bool any = false;
    while (nextArrival_ < n_ && arrivalOf(nextArrival_) <= t_) {
      size_t i = nextArrival_++;
      if (w_.jobs[i].gpus * blocksPerGpu_ > pool_.total()) {
        js_[i].phase = Phase::refused;  // can never run here
        ++settled_;
        continue;
      }
      js_[i].phase = Phase::waiting;
      js_[i].service.waitingSince = t_;
      queued_.insert(i);
      any = true;
    }
    return any;
  }

  // ---- Jobs on the pool ----
  size_t nodesSpanned(const JobState& s) const {
    std::set<size_t> nodes;
    for (VaccelId owner : s.owners)
      for (auto& share : pool_.cardsOf(pool_.held(owner))) nodes.insert(pool_.cards()[share.card].node);
    return std::max<size_t>(1, nodes.size());
  }
  // A job's speed where it is placed now (the span penalty).
  double rateOf(const JobState& s) const { return 1.0 / (1.0 + o_.spanPenalty * (nodesSpanned(s) - 1)); }
  void decide(const char* what, size_t i) {
    if (o_.logDecisions) run_.decisions.push_back(std::string(what) + " j" + std::to_string(i));
  }
  void start(size_t i) {
    JobState& s = js_[i];
    decide(s.start < 0 ? "start" : "resume", i);
    if (s.start < 0) s.start = t_;
    s.phase = Phase::running;
    s.ranSince = t_;
    s.rate = rateOf(s);
    usage_[w_.jobs[i].tenant].hold(t_, s.blocks);
    running_.push_back(i);
    queued_.erase(i);
    for (VaccelId v : s.owners) holders_.push_back(v);
  }
  void stop(size_t i, Phase to) {
    JobState& s = js_[i];
    for (VaccelId v : s.owners) {
      pool_.release(v);
      holders_.erase(std::find(holders_.begin(), holders_.end(), v));
    }
    s.owners.clear();
    usage_[w_.jobs[i].tenant].hold(t_, -static_cast<int64_t>(s.blocks));
    running_.erase(std::find(running_.begin(), running_.end(), i));
    s.phase = to;
    s.service.stopped(t_, s.ranSince);
  }
  void suspend(size_t i, double cost) {
    decide("preempt", i);
    stop(i, Phase::suspended);
    js_[i].remaining += cost;
    queued_.insert(i);
    ++run_.preemptions;
  }
  // raccel: job i's vaccel request (the scheduler's span_slack_nodes as spanSlack).
  Pool::Request spreadRequest(size_t i) const {
    Pool::Request r{js_[i].blocks, scheduler::kAllKinds, scheduler::poolPriority(js_[i].priority, js_[i].service.serviceClass)};
    if (o_.spanSlack >= 0) r.maxNodes = pool_.fewestNodesFor(js_[i].blocks) + static_cast<uint32_t>(o_.spanSlack);
    return r;
  }
  // The baselines: job i's whole-card gang (per-node parts) placed in `p`, its parts'
  // owners in `owners`; or false with nothing held.
  bool placeGang(Pool& p, size_t i, std::vector<VaccelId>& owners) const {
    uint32_t left = w_.jobs[i].gpus;
    for (uint32_t part = 0; left > 0; ++part) {
      Pool::Request r;
      r.shape = Pool::Shape::wholeCards;
      r.wholeCards = std::min(left, cardsPerNode_);
      r.priority = scheduler::poolPriority(js_[i].priority, js_[i].service.serviceClass);
      VaccelId owner = ((i + 1) << 8) | part;
      if (!p.allocate(owner, r)) {
        for (VaccelId v : owners) p.release(v);
        owners.clear();
        return false;
      }
      owners.push_back(owner);
      left -= r.wholeCards;
    }
    return true;
  }
  // Places job i now, or returns false (nothing held).
  bool place(size_t i) {
    JobState& s = js_[i];
    if (!raccel_) return placeGang(pool_, i, s.owners);
    auto got = pool_.allocate(i + 1, spreadRequest(i));
    if (!got) return false;
    s.owners = {i + 1};
    return true;
  }

  // ---- Policies ----
  // Each tenant's demand (held + waiting blocks) and holding now, and its max-min fair share.
  std::vector<double> tenantDemand(std::vector<double>& demand, std::vector<double>& have) const {
    demand.assign(w_.tenants.size(), 0);
    have.assign(w_.tenants.size(), 0);
    for (size_t i : running_) demand[w_.jobs[i].tenant] += js_[i].blocks, have[w_.jobs[i].tenant] += js_[i].blocks;
    for (size_t i : queued_) demand[w_.jobs[i].tenant] += js_[i].blocks;
    return scheduler::waterFill(demand, totalBlocks_);
  }
  std::vector<bool> overShare() const {
    std::vector<double> demand, have;
    tenantDemand(demand, have);
    return scheduler::overFairShare(demand, have, totalBlocks_);
  }
  // Tiresias and Gandiva: the jobs that should run now, in `order`, greedily by GPUs;
  // running jobs outside that set are suspended, then waiting ones placed in order
  // (one that does not fit is passed over: backfilling).
  void reschedule(const std::vector<size_t>& order, double switchCost) {
    double gpusLeft = totalBlocks_ / blocksPerGpu_;
    std::set<size_t> wanted;
    for (size_t i : order)
      if (w_.jobs[i].gpus <= gpusLeft) wanted.insert(i), gpusLeft -= w_.jobs[i].gpus;
    // Running jobs outside the set, the last in order first: suspended only for a wanted
    // job that then fits (tried on a copy of the pool), so nothing is suspended in vain.
    std::vector<size_t> unwanted;
    for (auto it = order.rbegin(); it != order.rend(); ++it)
      if (js_[*it].phase == Phase::running && !wanted.count(*it)) unwanted.push_back(*it);
    for (size_t i : order) {
      if (js_[i].phase == Phase::running || !wanted.count(i)) continue;
      if (place(i)) {
        start(i);
        continue;
      }
      Pool trial = pool_;
      size_t victims = 0;
      bool fits = false;
      while (!fits && victims < unwanted.size()) {
        for (VaccelId v : js_[unwanted[victims]].owners) trial.release(v);
        ++victims;
        std::vector<VaccelId> owners;
        fits = placeGang(trial, i, owners);
      }
      if (!fits) continue;
      for (size_t k = 0; k < victims; ++k) suspend(unwanted[k], switchCost);
      unwanted.erase(unwanted.begin(), unwanted.begin() + static_cast<long>(victims));
      if (place(i)) start(i);
    }
    for (size_t i : order)
      if (js_[i].phase != Phase::running && place(i)) start(i);
  }
  std::vector<size_t> activeJobs() const {
    std::vector<size_t> all(running_.begin(), running_.end());
    all.insert(all.end(), queued_.begin(), queued_.end());
    return all;
  }
  void tiresiasPass() {
    auto order = activeJobs();
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      return std::make_tuple(-js_[a].priority, js_[a].service.serviceClass, a) <
             std::make_tuple(-js_[b].priority, js_[b].service.serviceClass, b);
    });
    reschedule(order, o_.suspendSeconds);
  }
  // Gandiva's round: the jobs that have waited longest since they last ran go first; the
  // running ones that have run longest in this round make room (round robin).
  void gandivaRound() {
    auto order = activeJobs();
    auto since = [&](size_t i) { return js_[i].phase == Phase::running ? js_[i].ranSince : js_[i].service.waitingSince - 1e12; };
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      return std::make_tuple(-js_[a].priority, since(a), a) < std::make_tuple(-js_[b].priority, since(b), b);
    });
    reschedule(order, o_.switchSeconds);
  }
  // Admission: the waiting jobs in the scheduler's order, each placed if it fits, else
  // (raccel) by preempting lower priorities or more attained service.
  Status pass() {
    if (o_.policy == Policy::tiresias) {
      tiresiasPass();
      return {};
    }
    std::vector<scheduler::Waiting> order;
    std::vector<bool> over = overShare();
    for (size_t i : queued_) {
      double score = raccel_ ? usage_[w_.jobs[i].tenant].score(t_, 1.0) : 0;  // baselines: priority, then arrival
      order.push_back({i + 1, js_[i].priority, score, i, raccel_ ? js_[i].service.serviceClass : 0,
                       raccel_ && over[w_.jobs[i].tenant], raccel_ ? js_[i].service.waited(t_) : 0});
    }
    scheduler::orderForAdmission(order);
    uint32_t smallestFailed = std::numeric_limits<uint32_t>::max();  // baselines: a gang this size did not fit
    for (auto& q : order) {
      size_t i = q.arrival;
      JobState& s = js_[i];
      if (s.blocks <= pool_.freeBlocks() && w_.jobs[i].gpus < smallestFailed) {
        if (place(i)) {
          start(i);
          continue;
        }
        if (!raccel_) smallestFailed = w_.jobs[i].gpus;
      }
      // Preemption is for work of a higher priority or of less attained service (the
      // pool priority carries both), whatever its tenant holds: the order has already
      // put tenants within their share first. A suspended job resumes into free blocks
      // unless it has starved.
      if (!raccel_ || !scheduler::mayPreempt(s.phase == Phase::suspended, q.waitedSeconds)) continue;
      auto victims = pool_.planPreemption(spreadRequest(i));
      if (!victims || victims->empty()) continue;
      // planPreemption has checked that the job fits once they are gone (its node limit too).
      for (VaccelId v : *victims) suspend(v - 1, o_.suspendSeconds);
      if (!place(i)) return fail(Code::internal, "job " + std::to_string(i) + " found no placement after its preemptions");
      start(i);
    }
    return {};
  }
  // raccel's compaction after a release, within the scheduler's budget: at most 8 moves
  // a minute (of virtual time).
  void compact() {
    moveBudget_ = std::min(8.0, moveBudget_ + (t_ - lastBudget_) / 60.0 * 8.0);
    lastBudget_ = t_;
    if (moveBudget_ < 1) return;
    for (auto& move : pool_.planCompaction(static_cast<size_t>(moveBudget_))) {
      if (!pool_.applyMove(move)) continue;
      JobState& s = js_[move.owner - 1];
      s.remaining += o_.moveSeconds * s.rate;
      s.rate = rateOf(s);
      ++run_.migrations;
      moveBudget_ -= 1;
    }
  }

  // ---- The run's figures ----
  void figures() {
    std::vector<double> jcts, queues;
    double highQ = 0, highJ = 0, restJ = 0;
    size_t highN = 0, restN = 0;
    double first = n_ ? arrivalOf(0) : 0;
    run_.jct.assign(n_, 0);
    run_.queue.assign(n_, 0);
    for (size_t i = 0; i < n_; ++i) {
      if (js_[i].phase != Phase::done) continue;
      ++run_.finished;
      double jct = js_[i].finish - arrivalOf(i), queue = js_[i].start - arrivalOf(i);
      run_.jct[i] = jct;
      run_.queue[i] = queue;
      jcts.push_back(jct);
      queues.push_back(queue);
      run_.makespan = std::max(run_.makespan, js_[i].finish - first);
      if (run_.high[i]) highQ += queue, highJ += jct, ++highN;
      else restJ += jct, ++restN;
    }
    for (double v : jcts) run_.avgJct += v / jcts.size();
    for (double v : queues) run_.avgQueue += v / queues.size();
    run_.p99Jct = percentile(jcts, 0.99);
    run_.p99Queue = percentile(queues, 0.99);
    run_.utilization = run_.makespan > 0 ? 100 * busy_ / (totalBlocks_ * (run_.makespan + first)) : 0;
    run_.highAvgQueue = highN ? highQ / highN : 0;
    run_.highAvgJct = highN ? highJ / highN : 0;
    run_.restAvgJct = restN ? restJ / restN : 0;
    for (size_t k = 0; k < w_.tenants.size(); ++k) {
      TenantShare ts;
      ts.name = w_.tenants[k];
      ts.share = samples_[k] ? shareSum_[k] / samples_[k] : 0;
      ts.entitlement = samples_[k] ? entSum_[k] / samples_[k] : 0;
      for (auto& job : w_.jobs) ts.jobs += job.tenant == k;
      run_.tenants.push_back(ts);
    }
  }

  Cluster c_;
  Pool& pool_;
  const Workload& w_;
  const DynamicOptions& o_;
  const bool raccel_, lasOrdered_;
  const size_t n_;
  uint32_t blocksPerGpu_ = 0, cardsPerNode_ = 0;
  double totalBlocks_ = 0;
  std::vector<JobState> js_;
  std::vector<TenantUsage> usage_;
  std::vector<VaccelId> holders_;
  DynamicRun run_;
  // The clock, and what is next.
  double t_ = 0, busy_ = 0, moveBudget_ = 0, lastBudget_ = 0, nextRound_ = 0, nextSample_ = 0;
  double tWaiting_ = 0;
  size_t nextArrival_ = 0;
  uint64_t settled_ = 0;        // finished or refused
  std::vector<size_t> running_;
  std::set<size_t> queued_;     // waiting or suspended
  std::vector<double> shareSum_, entSum_, samples_;
};

}  // namespace

Result<DynamicRun> runDynamic(const Cluster& base, const Workload& w, const DynamicOptions& o) {
  if (o.rate <= 0) return fail(Code::invalidArgument, "the arrival-rate multiplier must be positive");
  return DynamicSim(base, w, o).run();
}

double fairnessDeviation(const DynamicRun& run) {
  double deviation = 0;
  size_t active = 0;
  for (auto& ts : run.tenants)
    if (ts.entitlement > 0) deviation += std::fabs(ts.share - ts.entitlement), ++active;
  return active ? deviation / active : 0;
}

}  // namespace raccel::sim
