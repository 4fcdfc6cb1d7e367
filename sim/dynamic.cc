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

}  // namespace

Result<DynamicRun> runDynamic(const Cluster& base, const Workload& w, const DynamicOptions& o) {
  if (o.rate <= 0) return fail(Code::invalidArgument, "the arrival-rate multiplier must be positive");
  Cluster c = base;
  Pool& pool = c.pool;
  pool.setFit(fitOf(o.policy), o.seed);
  const bool raccel = o.policy == Policy::raccel;
  // A GPU's worth of blocks, and the most cards a node has (a gang part's size).
  uint32_t blocksPerGpu = 0, cardsPerNode = 0;
  {
    std::map<uint32_t, uint32_t> sizes;
    for (auto& card : pool.cards()) ++sizes[card.blocks.count];
    for (auto& [size, n] : sizes)
      if (!blocksPerGpu || n > sizes[blocksPerGpu]) blocksPerGpu = size;
    for (auto& node : pool.nodes()) cardsPerNode = std::max<uint32_t>(cardsPerNode, static_cast<uint32_t>(node.cards.size()));
  }
  const double totalBlocks = pool.total();
  const size_t n = w.jobs.size();
  std::vector<JobState> js(n);
  std::mt19937_64 rng(o.seed);
  std::bernoulli_distribution tag(std::clamp(o.highFraction, 0.0, 1.0));
  DynamicRun run;
  run.jobs = n;
  run.high.resize(n);
  for (size_t i = 0; i < n; ++i) {
    js[i].remaining = w.jobs[i].seconds;
    js[i].blocks = w.jobs[i].gpus * blocksPerGpu;
    js[i].priority = (o.highFraction > 0 && tag(rng)) ? 1 : w.jobs[i].priority;
    run.high[i] = js[i].priority > 0;
  }
  std::vector<TenantUsage> usage(w.tenants.size());
  std::vector<VaccelId> holders;
  auto arrivalOf = [&](size_t i) { return w.jobs[i].arrival / o.rate; };

  const bool lasOrdered = raccel || o.policy == Policy::tiresias;
  double nextRound = 0;
  double t = 0, busy = 0, moveBudget = 0, lastBudget = 0;
  size_t nextArrival = 0;
  uint64_t settled = 0;  // finished or refused
  std::vector<size_t> running;
  std::set<size_t> queued;  // waiting or suspended
  double nextSample = 0;
  std::vector<double> shareSum(w.tenants.size(), 0), entSum(w.tenants.size(), 0), samples(w.tenants.size(), 0);
  run.shareSeries.resize(w.tenants.size());

  auto nodesSpanned = [&](const JobState& s) {
    std::set<size_t> nodes;
    for (VaccelId owner : s.owners)
      for (auto& share : pool.cardsOf(pool.held(owner))) nodes.insert(pool.cards()[share.card].node);
    return std::max<size_t>(1, nodes.size());
  };
  // A job's speed where it is placed now (the span penalty).
  auto rateOf = [&](const JobState& s) { return 1.0 / (1.0 + o.spanPenalty * (nodesSpanned(s) - 1)); };
  auto decide = [&](const char* what, size_t i) {
    if (o.logDecisions) run.decisions.push_back(std::string(what) + " j" + std::to_string(i));
  };
  auto start = [&](size_t i) {
    JobState& s = js[i];
    decide(s.start < 0 ? "start" : "resume", i);
    if (s.start < 0) s.start = t;
    s.phase = Phase::running;
    s.ranSince = t;
    s.rate = rateOf(s);
    usage[w.jobs[i].tenant].hold(t, s.blocks);
    running.push_back(i);
    queued.erase(i);
    for (VaccelId v : s.owners) holders.push_back(v);
  };
  auto stop = [&](size_t i, Phase to) {
    JobState& s = js[i];
    for (VaccelId v : s.owners) {
      pool.release(v);
      holders.erase(std::find(holders.begin(), holders.end(), v));
    }
    s.owners.clear();
    usage[w.jobs[i].tenant].hold(t, -static_cast<int64_t>(s.blocks));
    running.erase(std::find(running.begin(), running.end(), i));
    s.phase = to;
    s.service.stopped(t, s.ranSince);
  };
  // raccel: job i's vaccel request (the scheduler's span_slack_nodes as spanSlack).
  auto spreadRequest = [&](size_t i) {
    Pool::Request r{js[i].blocks, scheduler::kAllKinds, scheduler::poolPriority(js[i].priority, js[i].service.serviceClass)};
    if (o.spanSlack >= 0) r.maxNodes = pool.fewestNodesFor(js[i].blocks) + static_cast<uint32_t>(o.spanSlack);
    return r;
  };
  // The baselines: job i's whole-card gang (per-node parts) placed in `p`, its parts'
  // owners in `owners`; or false with nothing held.
  auto placeGang = [&](Pool& p, size_t i, std::vector<VaccelId>& owners) -> bool {
    uint32_t left = w.jobs[i].gpus;
    for (uint32_t part = 0; left > 0; ++part) {
      Pool::Request r;
      r.shape = Pool::Shape::wholeCards;
      r.wholeCards = std::min(left, cardsPerNode);
      r.priority = scheduler::poolPriority(js[i].priority, js[i].service.serviceClass);
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
  };
  // Places job i now, or returns false (nothing held).
  auto place = [&](size_t i) -> bool {
    JobState& s = js[i];
    if (!raccel) return placeGang(pool, i, s.owners);
    auto got = pool.allocate(i + 1, spreadRequest(i));
    if (!got) return false;
    s.owners = {i + 1};
    return true;
  };
  // Each tenant's demand (held + waiting blocks) and holding now, and its max-min fair share.
  auto tenantDemand = [&](std::vector<double>& demand, std::vector<double>& have) {
    demand.assign(w.tenants.size(), 0);
    have.assign(w.tenants.size(), 0);
    for (size_t i : running) demand[w.jobs[i].tenant] += js[i].blocks, have[w.jobs[i].tenant] += js[i].blocks;
    for (size_t i : queued) demand[w.jobs[i].tenant] += js[i].blocks;
    return scheduler::waterFill(demand, totalBlocks);
  };
  auto overShare = [&] {
    std::vector<double> demand, have;
    tenantDemand(demand, have);
    return scheduler::overFairShare(demand, have, totalBlocks);
  };
  auto suspend = [&](size_t i, double cost) {
    decide("preempt", i);
    stop(i, Phase::suspended);
    js[i].remaining += cost;
    queued.insert(i);
    ++run.preemptions;
  };
  // Tiresias and Gandiva: the jobs that should run now, in `order`, greedily by GPUs;
  // running jobs outside that set are suspended, then waiting ones placed in order
  // (one that does not fit is passed over: backfilling).
  auto reschedule = [&](std::vector<size_t> order, double switchCost) {
    double gpusLeft = totalBlocks / blocksPerGpu;
    std::set<size_t> wanted;
    for (size_t i : order)
      if (w.jobs[i].gpus <= gpusLeft) wanted.insert(i), gpusLeft -= w.jobs[i].gpus;
    // Running jobs outside the set, the last in order first: suspended only for a wanted
    // job that then fits (tried on a copy of the pool), so nothing is suspended in vain.
    std::vector<size_t> unwanted;
    for (auto it = order.rbegin(); it != order.rend(); ++it)
      if (js[*it].phase == Phase::running && !wanted.count(*it)) unwanted.push_back(*it);
    for (size_t i : order) {
      if (js[i].phase == Phase::running || !wanted.count(i)) continue;
      if (place(i)) {
        start(i);
        continue;
      }
      Pool trial = pool;
      size_t victims = 0;
      bool fits = false;
      while (!fits && victims < unwanted.size()) {
        for (VaccelId v : js[unwanted[victims]].owners) trial.release(v);
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
      if (js[i].phase != Phase::running && place(i)) start(i);
  };
  auto activeJobs = [&] {
    std::vector<size_t> all(running.begin(), running.end());
    all.insert(all.end(), queued.begin(), queued.end());
    return all;
  };
  auto tiresiasPass = [&] {
    auto order = activeJobs();
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      return std::make_tuple(-js[a].priority, js[a].service.serviceClass, a) <
             std::make_tuple(-js[b].priority, js[b].service.serviceClass, b);
    });
    reschedule(order, o.suspendSeconds);
  };
  // Gandiva's round: the jobs that have waited longest since they last ran go first; the
  // running ones that have run longest in this round make room (round robin).
  auto gandivaRound = [&] {
    auto order = activeJobs();
    auto since = [&](size_t i) { return js[i].phase == Phase::running ? js[i].ranSince : js[i].service.waitingSince - 1e12; };
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      return std::make_tuple(-js[a].priority, since(a), a) < std::make_tuple(-js[b].priority, since(b), b);
    });
    reschedule(order, o.switchSeconds);
  };
  auto pass = [&]() -> Status {
    if (o.policy == Policy::tiresias) {
      tiresiasPass();
      return {};
    }
    std::vector<scheduler::Waiting> order;
    std::vector<bool> over = overShare();
    for (size_t i : queued) {
      double score = raccel ? usage[w.jobs[i].tenant].score(t, 1.0) : 0;  // baselines: priority, then arrival
      order.push_back({i + 1, js[i].priority, score, i, raccel ? js[i].service.serviceClass : 0,
                       raccel && over[w.jobs[i].tenant], raccel ? js[i].service.waited(t) : 0});
    }
    scheduler::orderForAdmission(order);
    uint32_t smallestFailed = std::numeric_limits<uint32_t>::max();  // baselines: a gang this size did not fit
    for (auto& q : order) {
      size_t i = q.arrival;
      JobState& s = js[i];
      if (s.blocks <= pool.freeBlocks() && w.jobs[i].gpus < smallestFailed) {
        if (place(i)) {
          start(i);
          continue;
        }
        if (!raccel) smallestFailed = w.jobs[i].gpus;
      }
      // Preemption is for work of a higher priority or of less attained service (the
      // pool priority carries both), whatever its tenant holds: the order has already
      // put tenants within their share first. A suspended job resumes into free blocks
      // unless it has starved.
      if (!raccel || !scheduler::mayPreempt(s.phase == Phase::suspended, q.waitedSeconds)) continue;
      auto victims = pool.planPreemption(spreadRequest(i));
      if (!victims || victims->empty()) continue;
      // planPreemption has checked that the job fits once they are gone (its node limit too).
      for (VaccelId v : *victims) suspend(v - 1, o.suspendSeconds);
      if (!place(i)) return fail(Code::internal, "job " + std::to_string(i) + " found no placement after its preemptions");
      start(i);
    }
    return {};
  };
  auto compact = [&] {
    // The scheduler's budget: at most 8 moves a minute (of virtual time).
    moveBudget = std::min(8.0, moveBudget + (t - lastBudget) / 60.0 * 8.0);
    lastBudget = t;
    if (moveBudget < 1) return;
    for (auto& move : pool.planCompaction(static_cast<size_t>(moveBudget))) {
      if (!pool.applyMove(move)) continue;
      JobState& s = js[move.owner - 1];
      s.remaining += o.moveSeconds * s.rate;
      s.rate = rateOf(s);
      ++run.migrations;
      moveBudget -= 1;
    }
  };

  while (settled < n) {
    double tArrival = nextArrival < n ? arrivalOf(nextArrival) : std::numeric_limits<double>::infinity();
    double tDone = std::numeric_limits<double>::infinity();
    for (size_t i : running) tDone = std::min(tDone, t + js[i].remaining / js[i].rate);
    // Attained service crossing a class threshold (raccel and Tiresias order by it).
    double tClass = std::numeric_limits<double>::infinity();
    if (lasOrdered)
      for (size_t i : running) tClass = std::min(tClass, t + js[i].service.secondsToNextClass(js[i].blocks));
    double tRound = o.policy == Policy::gandiva && !queued.empty() ? nextRound : std::numeric_limits<double>::infinity();
    // raccel: waiting alone passing the starvation guard or a promotion (as the
    // scheduler's tick does).
    double tWaiting = std::numeric_limits<double>::infinity();
    if (raccel)
      for (size_t i : queued) tWaiting = std::min(tWaiting, js[i].service.nextWaitingChange(t, o.promoteKnob));
    double tNext = std::min({tArrival, tDone, nextSample, tClass, tRound, tWaiting});
    if (!std::isfinite(tNext)) return fail(Code::internal, "jobs wait that nothing can ever run");
    double held = 0;
    for (size_t i : running) {
      js[i].remaining -= (tNext - t) * js[i].rate;
      js[i].service.ran(tNext - t, js[i].blocks);
      held += js[i].blocks;
    }
    busy += held * (tNext - t);
    t = tNext;
    if (t == nextSample) {
      std::vector<double> demand, have;
      auto fair = tenantDemand(demand, have);
      run.sampleTimes.push_back(t / 3600);
      for (size_t k = 0; k < w.tenants.size(); ++k) {
        run.shareSeries[k].push_back(100 * have[k] / totalBlocks);
        if (demand[k] <= 0) continue;
        shareSum[k] += 100 * have[k] / totalBlocks;
        entSum[k] += 100 * fair[k] / totalBlocks;
        ++samples[k];
      }
      nextSample += o.sampleSeconds;
    }
    bool changed = t == tWaiting, released = false;
    if (lasOrdered) {
      // Demotion as attained service grows; promotion of work starved for longer than
      // promoteKnob x its last run (Tiresias' guard).
      for (size_t i : running) {
        if (!js[i].service.reclassify()) continue;
        decide("demote", i);
        for (VaccelId v : js[i].owners) pool.setPriority(v, scheduler::poolPriority(js[i].priority, js[i].service.serviceClass));
        changed = true;
      }
      for (size_t i : queued) changed = js[i].service.promote(t, o.promoteKnob) || changed;
    }
    if (o.policy == Policy::gandiva && t >= nextRound) {
      nextRound = t + o.roundSeconds;
      if (!queued.empty()) gandivaRound();
    }
    for (size_t k = 0; k < running.size();) {
      size_t i = running[k];
      if (js[i].remaining <= 1e-6 * std::max(1.0, w.jobs[i].seconds)) {
        decide("finish", i);
        stop(i, Phase::done);
        js[i].finish = t;
        ++settled;
        changed = released = true;
      } else {
        ++k;
      }
    }
    while (nextArrival < n && arrivalOf(nextArrival) <= t) {
      size_t i = nextArrival++;
      if (w.jobs[i].gpus * blocksPerGpu > pool.total()) {
        js[i].phase = Phase::refused;  // can never run here
        ++settled;
        continue;
      }
      js[i].phase = Phase::waiting;
      js[i].service.waitingSince = t;
      queued.insert(i);
      changed = true;
    }
    if (raccel && released) compact();
    if (changed)
      if (auto st = pass(); !st) return fail(st.error());
    if (running.empty() && nextArrival == n && !queued.empty()) {
      for (size_t i : queued) js[i].phase = Phase::refused, ++settled;  // fits nowhere, even in an empty cluster
      queued.clear();
    }
    if (o.audit)
      if (auto st = auditPool(pool, holders); !st) return fail(Code::internal, "t=" + std::to_string(t) + "s: " + st.error().message);
  }

  // Figures.
  std::vector<double> jcts, queues;
  double highQ = 0, highJ = 0, restJ = 0;
  size_t highN = 0, restN = 0;
  double first = n ? arrivalOf(0) : 0;
  run.jct.assign(n, 0);
  run.queue.assign(n, 0);
  for (size_t i = 0; i < n; ++i) {
    if (js[i].phase != Phase::done) continue;
    ++run.finished;
    double jct = js[i].finish - arrivalOf(i), queue = js[i].start - arrivalOf(i);
    run.jct[i] = jct;
    run.queue[i] = queue;
    jcts.push_back(jct);
    queues.push_back(queue);
    run.makespan = std::max(run.makespan, js[i].finish - first);
    if (run.high[i]) highQ += queue, highJ += jct, ++highN;
    else restJ += jct, ++restN;
  }
  for (double v : jcts) run.avgJct += v / jcts.size();
  for (double v : queues) run.avgQueue += v / queues.size();
  run.p99Jct = percentile(jcts, 0.99);
  run.p99Queue = percentile(queues, 0.99);
  run.utilization = run.makespan > 0 ? 100 * busy / (totalBlocks * (run.makespan + first)) : 0;
  run.highAvgQueue = highN ? highQ / highN : 0;
  run.highAvgJct = highN ? highJ / highN : 0;
  run.restAvgJct = restN ? restJ / restN : 0;
  for (size_t k = 0; k < w.tenants.size(); ++k) {
    TenantShare ts;
    ts.name = w.tenants[k];
    ts.share = samples[k] ? shareSum[k] / samples[k] : 0;
    ts.entitlement = samples[k] ? entSum[k] / samples[k] : 0;
    for (auto& job : w.jobs) ts.jobs += job.tenant == k;
    run.tenants.push_back(ts);
  }
  return run;
}

double fairnessDeviation(const DynamicRun& run) {
  double deviation = 0;
  size_t active = 0;
  for (auto& ts : run.tenants)
    if (ts.entitlement > 0) deviation += std::fabs(ts.share - ts.entitlement), ++active;
  return active ? deviation / active : 0;
}

}  // namespace raccel::sim
