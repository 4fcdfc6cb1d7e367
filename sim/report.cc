#include "sim/report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <tuple>

#include "sim/csv.h"
#include "sim/dynamic.h"
#include "sim/fgd.h"
#include "sim/packing.h"
#include "sim/plot.h"

namespace raccel::sim {

namespace {

std::string fmt(double v, int digits = 2) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

Status writeFile(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
  out.close();
  if (!out) return fail(Code::unavailable, "cannot write " + path);
  std::fprintf(stderr, "  wrote %s\n", path.c_str());
  return {};
}

// raccel against FGD's own rules in the same harness (sim/fgd.h): FGD's arrivals and
// measure, every pod list, beside the published FGD figure. `raccelFigures` holds raccel's
// measure at 100% and 130% per pod list, from the runs of the table above.
Status compareWithFgd(const ReportOptions& o, const Cluster& cluster, const std::vector<std::string>& workloads,
                      const std::map<std::string, std::pair<double, double>>& raccelFigures, std::ostringstream& md) {
  std::ostringstream csv;
  csv << "workload,seeds,raccel_100,raccel_130,fgd_harness_100,fgd_harness_130,bestfit_harness_100,bestfit_harness_130,"
         "fgd_published_100,fgd_published_130,bestfit_published_100,bestfit_published_130\n";
  md << "\n### raccel and FGD in the same harness\n\nFGD's rules implemented in this harness (`--policy fgd`, `fgd-bestfit`: GPU "
        "thousandths, its typical pods, fragmentation gradient, BestFit's CPU+GPU score, ties to the lowest node name), on "
        "FGD's arrivals (each pod of the list once, shuffled, then copies to 130%) and FGD's measure (GPU thousandths placed, "
        "averaged over the pods whose arrival rounds to each percent). raccel is measured the same way on its pool of blocks. "
        "Published: FGD's own simulator (`fgd-expected/`), means over seeds 42-51.\n\n"
        "| pod list | raccel 100% / 130% | FGD in harness | BestFit in harness | FGD published | BestFit published |\n|---|---|---|---|---|---|\n";
  for (const std::string& workload : workloads) {
    auto pods = loadOpenbPods(o.openbDir + "/openb_pod_list_" + workload + ".csv");
    if (!pods) return fail(pods.error());
    auto published = publishedCurves(o.openbDir + "/fgd-expected/analysis_allo_discrete.csv", "openb_pod_list_" + workload);
    std::pair<double, double> rules[2];
    for (FgdRule rule : {FgdRule::fgd, FgdRule::bestFit}) {
      std::fprintf(stderr, "A %s %s (FGD's rules):", workload.c_str(), fgdRuleName(rule));
      FgdMeans means = fgdMeans(cluster, *pods, rule, o.seeds, [](uint64_t seed, const FgdRun&) {
        std::fprintf(stderr, " %llu", (unsigned long long)seed);
      });
      rules[rule == FgdRule::fgd ? 0 : 1] = {means.placed100, means.placed130};
      std::fprintf(stderr, "\n");
    }
    auto pub = [&](const char* policy, int p) { return published.count(policy) ? fmt(published[policy][p]) : std::string(); };
    auto pair = [](const std::string& a, const std::string& b) { return a.empty() ? std::string("-") : a + " / " + b; };
    auto it = raccelFigures.find(workload);
    std::string r100 = it == raccelFigures.end() ? "" : fmt(it->second.first), r130 = it == raccelFigures.end() ? "" : fmt(it->second.second);
    csv << workload << "," << o.seeds.size() << "," << r100 << "," << r130 << "," << fmt(rules[0].first) << "," << fmt(rules[0].second) << ","
        << fmt(rules[1].first) << "," << fmt(rules[1].second) << "," << pub("06-FGD", 100) << "," << pub("06-FGD", 130) << ","
        << pub("05-BestFit", 100) << "," << pub("05-BestFit", 130) << "\n";
    md << "| " << workload << " | " << pair(r100, r130) << " | " << pair(fmt(rules[0].first), fmt(rules[0].second)) << " | "
       << pair(fmt(rules[1].first), fmt(rules[1].second)) << " | " << pair(pub("06-FGD", 100), pub("06-FGD", 130)) << " | "
       << pair(pub("05-BestFit", 100), pub("05-BestFit", 130)) << " |\n";
  }
  return writeFile(o.out + "/openb_vs_fgd.csv", csv.str());
}

int podListRank(const std::string& w) { return w == "default" ? 0 : w == "gpushare100" ? 1 : 2; }

// Every openb_pod_list_*.csv in the folder (the public trace has 24): `default` and
// `gpushare100` first (every policy, and their plots), the others by name (raccel and
// best-fit, in the table only).
std::vector<std::string> podLists(const std::string& dir) {
  std::error_code ec;
  std::vector<std::string> workloads;
  for (auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    std::string file = entry.path().filename().string();
    const std::string prefix = "openb_pod_list_", suffix = ".csv";
    if (file.size() > prefix.size() + suffix.size() && file.rfind(prefix, 0) == 0 && file.ends_with(suffix))
      workloads.push_back(file.substr(prefix.size(), file.size() - prefix.size() - suffix.size()));
  }
  std::sort(workloads.begin(), workloads.end(),
            [](auto& a, auto& b) { return std::make_pair(podListRank(a), a) < std::make_pair(podListRank(b), b); });
  return workloads;
}

// Experiment A: packing the openb pod lists, each policy averaged over the seeds.
class PackingExperiment {
 public:
  PackingExperiment(const ReportOptions& o, std::ostringstream& md) : o_(o), md_(md) {}

  Status run() {
    auto models = defaultModelTflops();
    for (auto& [m, t] : o_.modelTflops) models[m] = t;
    auto loaded = loadOpenbNodes(o_.openbDir + "/openb_node_list_gpu_node.csv", models);
    if (!loaded) return fail(loaded.error().code, loaded.error().message + " (" + howToGetTraces() + ")");
    cluster_ = std::move(*loaded);
    summary_ << "workload,policy,migration,seeds,alloc_100,alloc_130,frag_100,frag_130,placed_gpu_100,placed_gpu_130,pods_arrived,pods_placed,"
                "pods_failed,migrations,published_policy,published_alloc_100,published_alloc_130,published_frag_100\n";
    curves_ << "workload,policy,load_percent,alloc,frag,placed_gpu\n";
    md_ << "## Experiment A: packing (openb)\n\nCluster: " << cluster_.pool.nodes().size() << " nodes, " << cluster_.cards << " GPUs, "
       << cluster_.blocks << " blocks (T4 8.1, P100 9.3, V100 15.7, A10 31.2 TFLOPS; assumed G2 " << fmt(models["G2"], 1) << ", G3 "
       << fmt(models["G3"], 1) << "). Pods arrive as in FGD's evaluation (each pod of the list once, shuffled by the seed, then copies drawn at random while the GPU requests stay within 130% of the GPUs), no departures, seeds "
       << o_.seeds.front() << "-" << o_.seeds.back() << ". `alloc`: blocks held, % of all (shares of a card are counted in thousandths; a share holds at least one block); "
       << "`placed GPU`: the GPU requests of placed pods, % of the GPUs (the published figure's unit); `frag`: FGD's fragmentation "
       << "measure in blocks against the pod list's specs by count.\n\n"
       << "| pod list | policy | alloc 100% | alloc 130% | frag 100% | frag 130% | placed GPU 130% | published (policy: alloc 100/130, frag 100) |\n|---|---|---|---|---|---|---|---|\n";
    for (Policy p : allPolicies()) variants_.push_back({p, false});
    variants_.push_back({Policy::raccel, true});
    const std::vector<std::string> workloads = podLists(o_.openbDir);
    if (workloads.empty()) return fail(Code::notFound, o_.openbDir + ": no openb_pod_list_*.csv");
    std::fprintf(stderr, "A: %zu pod list(s) in %s\n", workloads.size(), o_.openbDir.c_str());
    for (const std::string& workload : workloads)
      if (auto st = podList(workload); !st) return st;
    if (auto st = compareWithFgd(o_, cluster_, workloads, raccelFigures_, md_); !st) return st;
    if (auto st = writeFile(o_.out + "/openb_summary.csv", summary_.str()); !st) return st;
    return writeFile(o_.out + "/openb_curves.csv", curves_.str());
  }

 private:
  struct Variant {
    Policy policy;
    bool migrate;
  };
  // One variant over every seed, averaged: allocation, fragmentation, placed GPUs (and
  // placed in whole pods) at each arrived percent, and the pods' counts.
  struct Means {
    std::vector<double> a, f, pl, pd;
    double arrived = 0, placedPods = 0, failedPods = 0, migrations = 0;
  };
  Result<Means> means(const std::vector<Pod>& pods, const Variant& v) {
    Means m;
    m.a.assign(o_.seeds.empty() ? 0 : 131, 0), m.f.assign(m.a.size(), 0), m.pl.assign(m.a.size(), 0), m.pd.assign(m.a.size(), 0);
    auto& [a, f, pl, pd, arrived, placedPods, failedPods, migrations] = m;
    for (uint64_t seed : o_.seeds) {
      PackingOptions po;
      po.policy = v.policy;
      po.seed = seed;
      po.migrate = v.migrate;
      po.fgdArrivals = true;
      auto run = runPacking(cluster_, pods, po);
      if (!run) return fail(run.error());
      for (size_t p = 0; p < a.size(); ++p)
        a[p] += run->alloc[p], f[p] += run->frag[p], pl[p] += run->placed[p], pd[p] += run->placedDiscrete[p];
      arrived += run->arrived, placedPods += run->placedPods, failedPods += run->failedPods, migrations += run->migrations;
      std::fprintf(stderr, " %llu", (unsigned long long)seed);
    }
    std::fprintf(stderr, "\n");
    double n = o_.seeds.size();
    for (size_t p = 0; p < a.size(); ++p) a[p] /= n, f[p] /= n, pl[p] /= n, pd[p] /= n;
    return m;
  }

  Status podList(const std::string& workload) {
    auto pods = loadOpenbPods(o_.openbDir + "/openb_pod_list_" + workload + ".csv");
    if (!pods) return fail(pods.error());
    const bool full = podListRank(workload) < 2;
    auto published = publishedCurves(o_.openbDir + "/fgd-expected/analysis_allo_discrete.csv", "openb_pod_list_" + workload);
    // The published fragmentation ratio is of the idle GPUs; as a share of capacity it is
    // ratio x idle (the traces README's 13.5 / 7.05 / 4.73 at 100%).
    auto publishedFrag = publishedCurves(o_.openbDir + "/fgd-expected/analysis_frag_ratio_discrete.csv", "openb_pod_list_" + workload);
    for (auto& [policy, curve] : publishedFrag)
      if (published.count(policy))
        for (size_t p = 0; p < curve.size() && p < published[policy].size(); ++p) curve[p] *= (100 - published[policy][p]) / 100;
    Chart alloc{"openb " + workload + ": allocation", "arrived GPU requests (% of GPUs)", "allocated (% of capacity)", {}, false, true, 0, 100};
    Chart frag{"openb " + workload + ": fragmentation", "arrived GPU requests (% of GPUs)", "fragmented (% of capacity)", {}, false, false};
    for (auto& v : variants_) {
      if (!full && (v.migrate || (v.policy != Policy::raccel && v.policy != Policy::bestFit))) continue;
      std::string name = std::string(policyName(v.policy)) + (v.migrate ? " + migration" : "");
      std::fprintf(stderr, "A %s %s:", workload.c_str(), name.c_str());
      auto got = means(*pods, v);
      if (!got) return fail(got.error());
      auto& [a, f, pl, pd, arrived, placedPods, failedPods, migrations] = *got;
      const double n = o_.seeds.size();
      if (v.policy == Policy::raccel && !v.migrate && pd.size() > 130) raccelFigures_[workload] = {pd[100], pd[130]};
      std::string pub = v.policy == Policy::random ? "01-Random" : v.policy == Policy::bestFit ? "05-BestFit" : v.policy == Policy::raccel ? "06-FGD" : "";
      std::string pubName = pub.empty() ? "" : pub.substr(3);
      bool havePub = !pub.empty() && published.count(pub);
      summary_ << workload << "," << policyName(v.policy) << "," << (v.migrate ? "yes" : "no") << "," << o_.seeds.size() << "," << fmt(a[100]) << ","
              << fmt(a[130]) << "," << fmt(f[100]) << "," << fmt(f[130]) << "," << fmt(pl[100]) << "," << fmt(pl[130]) << "," << fmt(arrived / n, 1)
              << "," << fmt(placedPods / n, 1) << "," << fmt(failedPods / n, 1) << "," << fmt(migrations / n, 1) << "," << pubName << ","
              << (havePub ? fmt(published[pub][100]) : "") << "," << (havePub ? fmt(published[pub][130]) : "") << ","
              << (havePub && publishedFrag.count(pub) ? fmt(publishedFrag[pub][100]) : "") << "\n";
      md_ << "| " << workload << " | " << name << " | " << fmt(a[100]) << " | " << fmt(a[130]) << " | " << fmt(f[100]) << " | " << fmt(f[130])
         << " | " << fmt(pl[130]) << " | "
         << (havePub ? pubName + ": " + fmt(published[pub][100]) + " / " + fmt(published[pub][130]) + ", " +
                           (publishedFrag.count(pub) ? fmt(publishedFrag[pub][100]) : "?")
                     : "")
         << " |\n";
      Series sa{name, {}, a}, sf{name, {}, f};
      for (size_t p = 0; p < a.size(); ++p) {
        sa.x.push_back(p), sf.x.push_back(p);
        curves_ << workload << "," << name << "," << p << "," << fmt(a[p], 3) << "," << fmt(f[p], 3) << "," << fmt(pl[p], 3) << "\n";
      }
      alloc.series.push_back(sa);
      frag.series.push_back(sf);
    }
    for (const char* pub : {"06-FGD", "05-BestFit", "01-Random"}) {
      if (!published.count(pub)) continue;
      Series s{std::string(pub + 3) + " (published)", {}, published[pub]};
      for (size_t p = 0; p < s.y.size(); ++p) s.x.push_back(p);
      alloc.series.push_back(s);
      if (publishedFrag.count(pub)) frag.series.push_back({s.label, s.x, publishedFrag[pub]});
    }
    if (!full) return {};
    if (auto st = writeFile(o_.out + "/openb_alloc_" + workload + ".svg", renderSvg(alloc)); !st) return st;
    return writeFile(o_.out + "/openb_frag_" + workload + ".svg", renderSvg(frag));
  }

  const ReportOptions& o_;
  std::ostringstream& md_;
  Cluster cluster_;
  std::vector<Variant> variants_;
  std::map<std::string, std::pair<double, double>> raccelFigures_;  // FGD's measure at 100% and 130%
  std::ostringstream summary_, curves_;
};

// Experiment B: the Philly VCs under each dynamic policy: the rate sweep, high priority
// and the span penalty.
class PhillyExperiment {
 public:
  PhillyExperiment(const ReportOptions& o, std::ostringstream& md) : o_(o), md_(md), philly_(phillyCluster()) {}

  Status run() {
    auto loaded = loadPhilly(o_.phillyDir, defaultStepSeconds(), o_.maxJobsPerTenant);
    if (!loaded) return fail(loaded.error());
    workload_ = std::move(*loaded);
    md_ << "\n## Experiment B: dynamic (Philly VCs)\n\n" << workload_.tenants.size() << " tenants (one per VC file), " << workload_.jobs.size()
       << " jobs; cluster: 40 nodes x 8 V100-class GPUs (15 blocks each, " << philly_.blocks << " blocks). A job of g GPUs asks for 15g blocks; "
       << "its run time is total_steps x a step time per model (ResNet-18 0.01 s, ResNet-50 0.02, Transformer 0.01, LM 0.01, Recommendation "
       << "0.005, CycleGAN 0.03, A3C 0.005). A job spanning k nodes runs at 1/(1 + 0.1(k-1)) of its speed; a preempted job pays 30 s, a moved one "
       << "10 s. raccel: spread vaccels (Pool::allocate), preemption by priority and attained service, compaction (8 moves a "
       << "minute), fair admission order (scheduler/admission.h); baselines: whole cards per node (gangs of per-node parts); "
       << "first-fit, best-fit and random in priority then arrival order, without preemption or migration; tiresias: "
       << "discretized least-attained-service queues, preemptive; gandiva: best fit and 30-minute time-slicing rounds. Times in hours.\n\n"
       << "| policy | rate | avg JCT | p99 JCT | avg queue | p99 queue | utilization % | preemptions | migrations |\n|---|---|---|---|---|---|---|---|---|\n";
    bsum_ << "policy,rate,jobs,finished,avg_jct_h,p99_jct_h,avg_queue_h,p99_queue_h,utilization,preemptions,migrations\n";
    cdf_ << "policy,jct_h,fraction\n";
    tenants_ << "policy,tenant,jobs,share_percent,entitlement_percent\n";
    series_ << "policy,hour,tenant,share_percent\n";
    for (auto step : {&PhillyExperiment::rateSweep, &PhillyExperiment::highPriority, &PhillyExperiment::spanPenalty})
      if (auto st = (this->*step)(); !st) return st;
    for (auto& [name, text] : std::vector<std::pair<std::string, std::string>>{{"philly_summary.csv", bsum_.str()},
                                                                               {"philly_jct_cdf.csv", cdf_.str()},
                                                                               {"philly_tenants.csv", tenants_.str()},
                                                                               {"philly_share_over_time.csv", series_.str()},
                                                                               {"philly_priority.csv", prio_.str()},
                                                                               {"philly_span_penalty.csv", span_.str()}})
      if (auto st = writeFile(o_.out + "/" + name, text); !st) return st;
    return {};
  }

 private:
  // Runs are deterministic: one run per set of options serves every table that needs it
  // (the 1x runs of the sweep are the untagged and penalty-0.1 runs of the studies).
  Result<const DynamicRun*> simulate(const DynamicOptions& d) {
    auto key = std::make_tuple(d.policy, d.rate, d.highFraction, d.spanPenalty);
    if (auto it = runs_.find(key); it != runs_.end()) return &it->second;
    std::fprintf(stderr, "B %s rate %.2f, high fraction %.2f, span penalty %.2f\n", policyName(d.policy), d.rate, d.highFraction, d.spanPenalty);
    auto run = runDynamic(philly_, workload_, d);
    if (!run) return fail(run.error());
    return &runs_.emplace(key, std::move(*run)).first->second;
  }

  // Each policy at each arrival rate: the table, the JCT CDF and tenants' shares at 1x.
  Status rateSweep() {
    Chart cdfChart{"Philly VCs, rate 1x: job completion time CDF", "JCT (hours, log scale)", "fraction of jobs", {}, true, true, 0, 1};
    Chart rateChart{"Philly VCs: average JCT by arrival rate", "arrival-rate multiplier", "average JCT (hours)", {}, false, false};
    std::ostringstream fairness, shareMd;
    fairness << "\nFairness at 1x: mean over tenants of |share - entitlement| (percentage points of the blocks; lower is fairer):\n\n"
             << "| policy | mean deviation |\n|---|---|\n";
    for (Policy p : dynamicPolicies()) {
      Series rs{policyName(p), {}, {}};
      for (double rate : o_.rates) {
        DynamicOptions d;
        d.policy = p;
        d.rate = rate;
        auto got = simulate(d);
        if (!got) return fail(got.error());
        const DynamicRun* run = *got;
        bsum_ << policyName(p) << "," << rate << "," << run->jobs << "," << run->finished << "," << fmt(run->avgJct / 3600, 3) << ","
             << fmt(run->p99Jct / 3600, 3) << "," << fmt(run->avgQueue / 3600, 3) << "," << fmt(run->p99Queue / 3600, 3) << ","
             << fmt(run->utilization) << "," << run->preemptions << "," << run->migrations << "\n";
        md_ << "| " << policyName(p) << " | " << rate << "x | " << fmt(run->avgJct / 3600) << " | " << fmt(run->p99Jct / 3600, 1) << " | "
           << fmt(run->avgQueue / 3600) << " | " << fmt(run->p99Queue / 3600, 1) << " | " << fmt(run->utilization, 1) << " | " << run->preemptions
           << " | " << run->migrations << " |\n";
        rs.x.push_back(rate), rs.y.push_back(run->avgJct / 3600);
        if (rate != 1.0) continue;
        std::vector<double> sorted;
        for (size_t i = 0; i < run->jct.size(); ++i) sorted.push_back(run->jct[i] / 3600);
        std::sort(sorted.begin(), sorted.end());
        Series cs{policyName(p), {}, {}};
        for (int q = 1; q <= 200; ++q) {
          size_t i = std::min(sorted.size() - 1, static_cast<size_t>(q / 200.0 * sorted.size()));
          cdf_ << policyName(p) << "," << fmt(sorted[i], 4) << "," << fmt(q / 200.0, 3) << "\n";
          cs.x.push_back(std::max(sorted[i], 1e-3)), cs.y.push_back(q / 200.0);
        }
        cdfChart.series.push_back(cs);
        fairness << "| " << policyName(p) << " | " << fmt(fairnessDeviation(*run)) << " |\n";
        if (auto st = tenantShares(p, *run); !st) return st;
        if (p == Policy::raccel || p == Policy::wholeCardFirstFit) {
          shareMd << "\nTenant shares at 1x, " << policyName(p) << " (mean % of blocks held while it had demand, against its max-min fair share "
             << "with equal weights, capped at its demand):\n\n| tenant | jobs | share % | entitlement % |\n|---|---|---|---|\n";
          for (auto& ts : run->tenants) shareMd << "| " << ts.name << " | " << ts.jobs << " | " << fmt(ts.share) << " | " << fmt(ts.entitlement) << " |\n";
        }
      }
      rateChart.series.push_back(rs);
    }
    md_ << fairness.str() << shareMd.str();
    if (auto st = writeFile(o_.out + "/philly_jct_cdf.svg", renderSvg(cdfChart)); !st) return st;
    return writeFile(o_.out + "/philly_avg_jct_by_rate.svg", renderSvg(rateChart));
  }
  // A policy's tenants at 1x: their shares and entitlements (CSV), every sample (CSV),
  // and a stacked chart of daily means.
  Status tenantShares(Policy p, const DynamicRun& r) {
    const DynamicRun* run = &r;
    // Stacked: the bands add up to what the cluster holds, each tenant's the part it has.
    Chart shares{std::string("Philly, 1x, ") + policyName(p) + ": tenants' shares (stacked, daily means)", "time (hours)",
                 "share of all blocks (%)", {}, false, true, 0, 100, true};
    for (size_t k = 0; k < run->tenants.size(); ++k) {
      auto& ts = run->tenants[k];
      tenants_ << policyName(p) << "," << ts.name << "," << ts.jobs << "," << fmt(ts.share, 3) << "," << fmt(ts.entitlement, 3) << "\n";
      for (size_t i = 0; i < run->sampleTimes.size(); ++i)
        series_ << policyName(p) << "," << fmt(run->sampleTimes[i], 1) << "," << ts.name << "," << fmt(run->shareSeries[k][i], 3) << "\n";
      // Hourly samples are too dense to read over months: the chart shows daily means
      // (the CSV keeps every sample).
      Series s{ts.name, {}, {}};
      constexpr size_t kPerBin = 24;
      for (size_t i = 0; i < run->sampleTimes.size(); i += kPerBin) {
        size_t end = std::min(run->sampleTimes.size(), i + kPerBin);
        double sum = 0;
        for (size_t j = i; j < end; ++j) sum += run->shareSeries[k][j];
        s.x.push_back(run->sampleTimes[i]);
        s.y.push_back(sum / static_cast<double>(end - i));
      }
      shares.series.push_back(s);
    }
    return writeFile(o_.out + "/philly_share_over_time_" + policyName(p) + ".svg", renderSvg(shares));
  }

  // High priority: a fraction of jobs tagged; their queueing delay, and the rest's JCT
  // against the same jobs' JCT in the untagged run.
  Status highPriority() {
    prio_ << "policy,high_fraction,high_jobs,high_avg_queue_h,high_avg_queue_untagged_h,high_avg_jct_h,rest_avg_jct_h,rest_avg_jct_untagged_h,rest_slowdown,preemptions\n";
    md_ << "\nHigh priority (rate 1x, " << fmt(o_.highFraction * 100, 0) << "% of jobs tagged, seed 1):\n\n"
       << "| policy | high jobs' avg queue | their avg queue untagged | rest avg JCT | same jobs untagged | slowdown of the rest | preemptions |\n|---|---|---|---|---|---|---|\n";
    for (Policy p : allPolicies()) {
      DynamicOptions d;
      d.policy = p;
      auto untaggedRun = simulate(d);
      if (!untaggedRun) return fail(untaggedRun.error());
      d.highFraction = o_.highFraction;
      auto taggedRun = simulate(d);
      if (!taggedRun) return fail(taggedRun.error());
      const DynamicRun* plain = *untaggedRun;
      const DynamicRun* tagged = *taggedRun;
      double restBefore = 0, highQueueBefore = 0;
      size_t rest = 0, high = 0;
      for (size_t i = 0; i < tagged->jct.size(); ++i) {
        if (tagged->high[i]) highQueueBefore += plain->queue[i], ++high;
        else restBefore += plain->jct[i], ++rest;
      }
      restBefore = rest ? restBefore / rest : 0;
      highQueueBefore = high ? highQueueBefore / high : 0;
      double slowdown = restBefore > 0 ? tagged->restAvgJct / restBefore : 0;
      prio_ << policyName(p) << "," << o_.highFraction << "," << high << "," << fmt(tagged->highAvgQueue / 3600, 3) << ","
           << fmt(highQueueBefore / 3600, 3) << ","
           << fmt(tagged->highAvgJct / 3600, 3) << "," << fmt(tagged->restAvgJct / 3600, 3) << "," << fmt(restBefore / 3600, 3) << ","
           << fmt(slowdown, 3) << "," << tagged->preemptions << "\n";
      md_ << "| " << policyName(p) << " | " << fmt(tagged->highAvgQueue / 3600) << " | " << fmt(highQueueBefore / 3600) << " | "
         << fmt(tagged->restAvgJct / 3600) << " | " << fmt(restBefore / 3600) << " | " << fmt(slowdown, 3) << "x | " << tagged->preemptions << " |\n";
    }
    return {};
  }
  // Span penalty: how much of the comparison rests on the cost of spanning nodes.
  Status spanPenalty() {
    span_ << "span_penalty,raccel_avg_jct_h,whole_card_first_fit_avg_jct_h,raccel_over_first_fit\n";
    md_ << "\nSpan penalty (rate 1x): raccel spreads a vaccel over nodes when no node has room; the baselines wait for whole cards. "
       << "How the average JCT compares as the cost of spanning nodes changes:\n\n| penalty per extra node | raccel avg JCT | whole-card first-fit | raccel / first-fit |\n|---|---|---|---|\n";
    for (double penalty : o_.spanPenalties) {
      double jct[2];
      for (int k = 0; k < 2; ++k) {
        DynamicOptions d;
        d.policy = k == 0 ? Policy::raccel : Policy::wholeCardFirstFit;
        d.spanPenalty = penalty;
        auto run = simulate(d);
        if (!run) return fail(run.error());
        jct[k] = (*run)->avgJct / 3600;
      }
      span_ << penalty << "," << fmt(jct[0], 3) << "," << fmt(jct[1], 3) << "," << fmt(jct[0] / jct[1], 3) << "\n";
      md_ << "| " << penalty << " | " << fmt(jct[0]) << " | " << fmt(jct[1]) << " | " << fmt(jct[0] / jct[1], 3) << " |\n";
    }
    return {};
  }

  const ReportOptions& o_;
  std::ostringstream& md_;
  Cluster philly_;
  Workload workload_;
  std::map<std::tuple<Policy, double, double, double>, DynamicRun> runs_;
  std::ostringstream bsum_, cdf_, tenants_, series_, prio_, span_;
};

}  // namespace

Status writeReport(const ReportOptions& o) {
  std::error_code ec;
  std::filesystem::create_directories(o.out, ec);
  if (ec) return fail(Code::unavailable, "cannot create " + o.out + ": " + ec.message());
  std::ostringstream md;
  md << "# raccel-sim report\n\nWritten by `raccel-sim report --out " << o.out << "`. Every figure below is in a CSV beside this file.\n\n";
  if (auto st = PackingExperiment(o, md).run(); !st) return st;
  if (auto st = PhillyExperiment(o, md).run(); !st) return st;
  return writeFile(o.out + "/report.md", md.str());
}

}  // namespace raccel::sim
