// raccel-sim: drives the scheduler's real pool and placement code through cluster
// traces with a virtual clock. See sim/README.md.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>

#include "common/flags.h"
#include "sim/cluster.h"
#include "sim/csv.h"
#include "sim/dynamic.h"
#include "sim/fgd.h"
#include "sim/omega.h"
#include "sim/packing.h"
#include "sim/report.h"
#include "sim/traces_dir.h"

using namespace raccel;
using namespace raccel::sim;

namespace {

int die(const std::string& message) {
  std::fprintf(stderr, "raccel-sim: %s\n", message.c_str());
  return 2;
}

Result<double> number(const Flags& flags, const std::string& name, double fallback) {
  if (!flags.has(name)) return fallback;
  return parseReal(flags.get(name), "--" + name);
}

Result<std::vector<uint64_t>> parseSeeds(const std::string& text) {
  auto dash = text.find('-');
  auto first = parseCount(text.substr(0, dash), "--seeds");
  auto last = dash == std::string::npos ? first : parseCount(text.substr(dash + 1), "--seeds");
  if (!first || !last || *last < *first || *last - *first > 1000) return fail(Code::invalidArgument, "--seeds: give N or FIRST-LAST");
  std::vector<uint64_t> seeds;
  for (auto s = *first; s <= *last; ++s) seeds.push_back(s);
  return seeds;
}

// A trace file's error; when the file is not there, with how to get the traces.
Error explainMissing(const std::string& path, const Error& error) {
  std::error_code ec;
  return std::filesystem::exists(path, ec) ? error : Error{error.code, error.message + " (" + howToGetTraces() + ")"};
}

// The openb node list and pod list the flags name (default: the traces folder's).
Result<std::pair<Cluster, std::vector<Pod>>> loadOpenb(const Flags& flags, const std::map<std::string, double>& models) {
  const std::string nodesPath = flags.get("nodes", tracesDir() + "/openb/openb_node_list_gpu_node.csv");
  auto cluster = loadOpenbNodes(nodesPath, models);
  if (!cluster) return fail(explainMissing(nodesPath, cluster.error()));
  const std::string podsPath = flags.get("pods", tracesDir() + "/openb/openb_pod_list_default.csv");
  auto pods = loadOpenbPods(podsPath);
  if (!pods) return fail(explainMissing(podsPath, pods.error()));
  return std::pair{std::move(*cluster), std::move(*pods)};
}

// FGD's own rules (sim/fgd.h) on FGD's arrivals: its published measure, the GPU thousandths
// placed, at 100% and 130% arrived.
int openbFgd(const Flags& flags, const Cluster& cluster, const std::vector<Pod>& pods, const std::vector<uint64_t>& seeds,
             FgdRule rule) {
  const char* name = fgdRuleName(rule);
  auto start = std::chrono::steady_clock::now();
  FgdMeans means = fgdMeans(cluster, pods, rule, seeds, [&](uint64_t seed, const FgdRun& run) {
    std::fprintf(stderr, "seed %llu: %s placed %.2f%% of the GPUs at 100%% arrived, %.2f%% at 130%% (%llu pods, %llu failed)\n",
                 (unsigned long long)seed, name, run.placed[100], run.placed[130], (unsigned long long)run.arrived,
                 (unsigned long long)run.failedPods);
  });
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!flags.has("json"))
    std::printf("policy %s (FGD's rules, FGD's arrivals), %zu seeds, %u GPUs (means over seeds)\n"
                "  GPU thousandths placed at 100%% / 130%% arrived: %.2f%% / %.2f%%\n",
                name, seeds.size(), cluster.cards, means.placed100, means.placed130);
  else
    std::printf("{\"policy\":\"%s\",\"seeds\":%zu,\"gpus\":%u,\"placed_gpu_ratio_100\":%.2f,\"placed_gpu_ratio_130\":%.2f,\"seconds\":%.1f}\n",
                name, seeds.size(), cluster.cards, means.placed100, means.placed130, secs);
  return 0;
}

int openb(const Flags& flags) {
  auto models = defaultModelTflops();
  if (auto st = overrideModelTflops(models, flags.get("model-tflops")); !st) return die(st.error().message);
  auto openbInput = loadOpenb(flags, models);
  if (!openbInput) return die(openbInput.error().message);
  auto& [cluster, pods] = *openbInput;
  auto parsedSeeds = parseSeeds(flags.get("seeds", "42-51"));
  if (!parsedSeeds) return die(parsedSeeds.error().message);
  const std::vector<uint64_t>& seeds = *parsedSeeds;
  const std::string policyFlag = flags.get("policy", "raccel");
  if (auto rule = parseFgdRule(policyFlag)) {
    if (flags.has("migrate")) return die("--migrate is raccel's: FGD's rules place each pod once");
    return openbFgd(flags, cluster, pods, seeds, *rule);
  }
  auto policy = parsePolicy(policyFlag);
  if (!policy) return die(policy.error().message);
  if (*policy == Policy::tiresias || *policy == Policy::gandiva)
    return die(std::string(policyName(*policy)) + " schedules jobs over time: use it with `raccel-sim philly`");
  PackingOptions options;
  options.policy = *policy;
  options.migrate = flags.has("migrate");
  options.fgdArrivals = flags.has("fgd-arrivals");
  double a100 = 0, a130 = 0, f100 = 0, f130 = 0, p130 = 0, d100 = 0, d130 = 0;
  auto start = std::chrono::steady_clock::now();
  for (uint64_t seed : seeds) {
    options.seed = seed;
    auto run = runPacking(cluster, pods, options);
    if (!run) return die(run.error().message);
    a100 += run->alloc[100], a130 += run->alloc[130], f100 += run->frag[100], f130 += run->frag[130], p130 += run->placed[130];
    d100 += run->placedDiscrete[100], d130 += run->placedDiscrete[130];
    std::fprintf(stderr, "seed %llu: alloc %.2f%% at 100%%, %.2f%% at 130%%; frag %.2f%% at 100%%; migrations %llu\n",
                 (unsigned long long)seed, run->alloc[100], run->alloc[130], run->frag[100], (unsigned long long)run->migrations);
  }
  double n = seeds.size();
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!flags.has("json")) {
    std::printf("policy %s%s, %zu seeds, %u GPUs, %u blocks (means over seeds)\n"
                "  allocated at 100%% / 130%% arrived: %.2f%% / %.2f%% of blocks\n"
                "  fragmented at 100%% / 130%%: %.2f%% / %.2f%%\n"
                "  GPU requests placed at 130%%: %.2f%% of GPUs\n"
                "  FGD's measure (GPU thousandths placed, per arrived percent) at 100%% / 130%%: %.2f%% / %.2f%%%s\n",
                policyName(*policy), options.migrate ? " + migration" : "", seeds.size(), cluster.cards, cluster.blocks, a100 / n,
                a130 / n, f100 / n, f130 / n, p130 / n, d100 / n, d130 / n, options.fgdArrivals ? " (FGD's arrivals)" : "");
    return 0;
  }
  std::printf("{\"policy\":\"%s\",\"migrate\":%s,\"seeds\":%zu,\"blocks\":%u,\"gpus\":%u,\"alloc_ratio_100\":%.2f,\"alloc_ratio_130\":%.2f,"
              "\"frag_ratio_100\":%.2f,\"frag_ratio_130\":%.2f,\"placed_gpu_ratio_130\":%.2f,\"fgd_measure_100\":%.2f,"
              "\"fgd_measure_130\":%.2f,\"fgd_arrivals\":%s,\"seconds\":%.1f}\n",
              policyName(*policy), options.migrate ? "true" : "false", seeds.size(), cluster.blocks, cluster.cards, a100 / n,
              a130 / n, f100 / n, f130 / n, p130 / n, d100 / n, d130 / n, options.fgdArrivals ? "true" : "false", secs);
  return 0;
}

int philly(const Flags& flags) {
  auto maxJobs = number(flags, "max-jobs", 0);
  auto rate = number(flags, "rate", 1);
  auto high = number(flags, "high-fraction", 0);
  auto penalty = number(flags, "span-penalty", 0.1);
  auto slack = number(flags, "span-slack", 1);
  for (auto* r : {&maxJobs, &rate, &high, &penalty, &slack})
    if (!*r) return die(r->error().message);
  if (*rate <= 0 || *high < 0 || *high > 1 || *penalty < 0 || *maxJobs < 0 || *slack < -1)
    return die("--rate > 0, --high-fraction 0..1, --span-penalty >= 0, --span-slack >= -1, --max-jobs >= 0");
  const std::string tracesPath = flags.get("traces", tracesDir() + "/philly-vc");
  auto workload = loadPhilly(tracesPath, defaultStepSeconds(), static_cast<size_t>(*maxJobs));
  if (!workload) return die(explainMissing(tracesPath, workload.error()).message);
  Cluster cluster = phillyCluster();
  std::vector<Policy> policies;
  if (flags.get("policy", "all") == "all") policies = dynamicPolicies();
  else {
    auto p = parsePolicy(flags.get("policy"));
    if (!p) return die(p.error().message);
    policies = {*p};
  }
  DynamicOptions options;
  options.rate = *rate;
  options.highFraction = *high;
  options.spanPenalty = *penalty;
  options.spanSlack = static_cast<int>(*slack);
  for (Policy p : policies) {
    options.policy = p;
    auto start = std::chrono::steady_clock::now();
    auto run = runDynamic(cluster, *workload, options);
    if (!run) return die(run.error().message);
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("{\"policy\":\"%s\",\"rate\":%.2f,\"jobs\":%llu,\"finished\":%llu,\"avg_jct_h\":%.2f,\"p99_jct_h\":%.1f,"
                "\"avg_queue_h\":%.2f,\"p99_queue_h\":%.1f,\"utilization\":%.1f,\"preemptions\":%llu,\"migrations\":%llu,"
                "\"high_avg_queue_h\":%.2f,\"rest_avg_jct_h\":%.2f,\"fairness_deviation\":%.2f,\"seconds\":%.1f}\n",
                policyName(p), options.rate, (unsigned long long)run->jobs, (unsigned long long)run->finished, run->avgJct / 3600,
                run->p99Jct / 3600, run->avgQueue / 3600, run->p99Queue / 3600, run->utilization,
                (unsigned long long)run->preemptions, (unsigned long long)run->migrations, run->highAvgQueue / 3600,
                run->restAvgJct / 3600, fairnessDeviation(*run), secs);
    std::fflush(stdout);
  }
  return 0;
}

// Experiment C: N schedulers sharing the openb cluster through etcd (sim/omega.h).
int omega(const Flags& flags) {
  auto models = defaultModelTflops();
  auto openbInput = loadOpenb(flags, models);
  if (!openbInput) return die(openbInput.error().message);
  auto& [cluster, pods] = *openbInput;
  OmegaOptions o;
  auto commitMs = number(flags, "commit-ms", o.commitMs), rttMs = number(flags, "rtt-ms", o.rttMs),
       decisionMs = number(flags, "decision-ms", o.decisionMs), rate = number(flags, "rate", o.ratePerScheduler),
       capacity = number(flags, "etcd-txn-per-s", o.etcdTxnPerS), load = number(flags, "load", o.load),
       arrivals = number(flags, "arrivals", o.pods);
  for (auto* r : {&commitMs, &rttMs, &decisionMs, &rate, &capacity, &load, &arrivals})
    if (!*r) return die(r->error().message);
  if (*arrivals < 1 || *arrivals > 1e7) return die("--arrivals: 1 to 10000000");
  o.commitMs = *commitMs, o.rttMs = *rttMs, o.decisionMs = *decisionMs, o.ratePerScheduler = *rate;
  o.etcdTxnPerS = *capacity, o.load = *load, o.pods = static_cast<uint32_t>(*arrivals);
  auto policy = parsePolicy(flags.get("policy", "raccel"));
  if (!policy) return die(policy.error().message);
  o.policy = *policy;
  std::vector<uint32_t> counts;
  for (auto& item : splitFields(flags.get("schedulers", "1,4,16,64"), ',')) {
    auto n = parseCount(item, "--schedulers");
    if (!n || *n < 1 || *n > 1024) return die("--schedulers: counts from 1 to 1024, separated by commas");
    counts.push_back(static_cast<uint32_t>(*n));
  }
  for (uint32_t n : counts) {
    o.schedulers = n;
    auto start = std::chrono::steady_clock::now();
    auto run = runOmega(cluster, pods, o);
    if (!run) return die(run.error().message);
    std::printf("{\"schedulers\":%u,\"arrival_per_s\":%.0f,\"commit_ms\":%.2f,\"rtt_ms\":%.2f,\"admitted\":%llu,"
                "\"refused\":%llu,\"gave_up\":%llu,\"conflict_rate\":%.4f,\"admission_p50_ms\":%.2f,"
                "\"admission_p99_ms\":%.2f,\"admitted_per_s\":%.0f,\"etcd_utilization\":%.3f,\"double_held\":%llu,"
                "\"seconds\":%.1f}\n",
                n, o.ratePerScheduler * n, o.commitMs, o.rttMs, (unsigned long long)run->admitted,
                (unsigned long long)run->refused, (unsigned long long)run->gaveUp, run->conflictRate, run->latencyP50Ms,
                run->latencyP99Ms, run->admittedPerS, run->etcdUtilization, (unsigned long long)run->doubleHeld,
                std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    std::fflush(stdout);
  }
  return 0;
}

int report(const Flags& flags) {
  ReportOptions options;
  options.out = flags.get("out", options.out);
  options.openbDir = flags.get("openb", options.openbDir);
  options.phillyDir = flags.get("traces", options.phillyDir);
  if (flags.has("seeds")) {
    auto seeds = parseSeeds(flags.get("seeds"));
    if (!seeds) return die(seeds.error().message);
    options.seeds = *seeds;
  }
  auto maxJobs = number(flags, "max-jobs", 0);
  if (!maxJobs || *maxJobs < 0) return die("--max-jobs: a whole number >= 0");
  options.maxJobsPerTenant = static_cast<size_t>(*maxJobs);
  if (auto st = overrideModelTflops(options.modelTflops, flags.get("model-tflops")); !st) return die(st.error().message);
  auto start = std::chrono::steady_clock::now();
  if (auto st = writeReport(options); !st) return die(st.error().message);
  std::fprintf(stderr, "report written to %s/ in %.0f s (report.md, *.csv, *.svg)\n", options.out.c_str(),
               std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Flags flags("raccel-sim", "Trace-driven evaluation of the raccel scheduler's pool and placement.\n\ncommands:\n"
                            "  openb    experiment A (packing): sample openb pods to 130% of the GPUs, seeds 42-51;\n"
                            "           prints the means (one JSON object with --json)\n"
                            "  philly   experiment B (dynamic): the Philly VCs as tenants on 40x8 V100-class GPUs;\n"
                            "           one JSON line per policy\n"
                            "  omega    experiment C (many hosts): N schedulers share the openb cluster through etcd\n"
                            "           (commit latency, round trip, decision time as flags); one JSON line per N\n"
                            "  report   everything: both experiments, every policy, the rate sweep, high priority,\n"
                            "           span penalty; CSV + SVG + report.md into --out (about 40 minutes)\n\n"
                            "Trace paths default to $RACCEL_TRACES, else traces/ under the current folder\n"
                            "(scripts/get-traces.sh fetches them there).");
  flags.positional("COMMAND");
  flags.value("pods", "CSV", "openb: the pod list");
  flags.value("nodes", "CSV", "openb: the node list");
  flags.value("seeds", "N|FIRST-LAST", "openb: seeds (default 42-51)");
  flags.value("policy", "NAME", "raccel, whole-card-first-fit, random, best-fit (default raccel); openb also fgd,\n"
              "fgd-bestfit: FGD's own rules and arrivals (sim/fgd.h)");
  flags.value("model-tflops", "M=T,...", "GPU model TFLOPS over the defaults (G2=15.7, G3=19.5 assumed)");
  flags.boolean("migrate", "openb: also move one-card pods between a node's cards to make room");
  flags.boolean("fgd-arrivals", "openb: FGD's arrivals (every pod once, shuffled, then copies to 130%) instead of draws");
  flags.boolean("json", "print one JSON object");
  flags.value("traces", "DIR", "philly, report: the folder of *.trace files (one tenant each)");
  flags.value("openb", "DIR", "report: the openb folder (node list, pod lists, fgd-expected/)");
  flags.value("out", "DIR", "report: where the CSV, SVG and report.md go (default sim-report)");
  flags.value("span-penalty", "P", "philly: a job spanning k nodes runs at 1/(1+P(k-1)) (default 0.1)");
  flags.value("span-slack", "N", "philly: raccel waits rather than span more than the fewest nodes + N (default 1; -1: any)");
  flags.value("rate", "X", "philly: arrival-rate multiplier (default 1); omega: pods/s at each scheduler (default 20)");
  flags.value("high-fraction", "F", "philly: share of jobs tagged high priority (default 0)");
  flags.value("max-jobs", "N", "philly: at most N jobs per tenant (default all)");
  flags.value("schedulers", "N,...", "omega: scheduler counts to run (default 1,4,16,64)");
  flags.value("commit-ms", "MS", "omega: etcd's commit latency (default 2)");
  flags.value("rtt-ms", "MS", "omega: scheduler-etcd round trip (default 0.5)");
  flags.value("decision-ms", "MS", "omega: time to place one pod on a view (default 0.2)");
  flags.value("etcd-txn-per-s", "N", "omega: etcd's transaction capacity (default 10000)");
  flags.value("load", "F", "omega: GPU share the pods keep busy (default 0.9)");
  flags.value("arrivals", "N", "omega: pods arriving in all (default 20000)");
  int code = 0;
  if (!parseFlagsOrExit(flags, argc, argv, &code)) return code;
  if (flags.positionals().empty()) return die("give a command (openb, philly, omega, report); --help lists them");
  std::string command = flags.positionals()[0];
  if (command == "openb") return openb(flags);
  if (command == "philly") return philly(flags);
  if (command == "report") return report(flags);
  if (command == "omega") return omega(flags);
  return die("unknown command '" + command + "'; --help lists them");
}
