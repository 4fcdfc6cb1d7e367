// Experiment B, dynamic (Microsoft Philly jobs per virtual cluster, as Gavel prepared
// them): each VC file is a tenant; jobs arrive at their trace times, run for total_steps
// x a per-model step time on their GPUs' worth of blocks, and leave. raccel's policy is
// the scheduler's own: spread vaccels placed by Pool::allocate, priority preemption by
// Pool::planPreemption, compaction by Pool::planCompaction/applyMove, and the admission
// order and tenant usage of scheduler/admission.h, which orders by attained service
// (discretized, as Tiresias) within fair share. The baselines place whole cards per
// node (a job larger than a node is a gang of per-node parts): first-fit, best-fit and
// random in priority, then arrival, order, without preemption or migration; Tiresias
// preemptive by discretized least attained service; Gandiva by time-slicing rounds.
// Pure: the clock is virtual.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "sim/cluster.h"
#include "sim/policy.h"

namespace raccel::sim {

struct Job {
  uint32_t id = 0;
  uint32_t tenant = 0;
  std::string model;
  double arrival = 0;   // seconds
  double seconds = 0;   // run time on `gpus` GPUs of one node
  uint32_t gpus = 1;
  int priority = 0;     // unless DynamicOptions::highFraction tags it
};

struct Workload {
  std::vector<std::string> tenants;  // VC names (file names without .trace)
  std::vector<Job> jobs;             // by arrival
};

// Seconds per training step by model family (the part of job_type before " ("). The
// defaults are our choice (stated with the results): ResNet-18 0.01, ResNet-50 0.02,
// Transformer 0.01, LM 0.01, Recommendation 0.005, CycleGAN 0.03, A3C 0.005.
std::map<std::string, double> defaultStepSeconds();
// Every *.trace file in `dir`, in name order; `maxJobsPerTenant` 0 = all.
Result<Workload> loadPhilly(const std::string& dir, const std::map<std::string, double>& stepSeconds,
                            size_t maxJobsPerTenant = 0);

// 40 nodes of 8 V100-class GPUs (15.7 TFLOPS: 15 blocks each): 320 GPUs, 4800 blocks.
Cluster phillyCluster();

struct DynamicOptions {
  Policy policy = Policy::raccel;
  double rate = 1.0;           // arrival-rate multiplier: trace times are divided by it
  double highFraction = 0;     // share of jobs tagged high priority (chosen by `seed`)
  uint64_t seed = 1;
  double spanPenalty = 0.1;
  // raccel: a job waits rather than span more than (the fewest nodes it could use) +
  // spanSlack nodes; -1 = spread over any number (the scheduler's span_slack_nodes).
  int spanSlack = 1;   // a job spanning k nodes runs at 1 / (1 + penalty x (k - 1))
  double suspendSeconds = 30;  // a preempted job's save + restore
  double moveSeconds = 10;     // a migrated job's pause
  // Tiresias (and raccel's attained-service order): a job waiting longer than this many
  // times its last run goes back to the first queue.
  double promoteKnob = 8;
  // Gandiva: a time-slicing round, and the suspend/resume of a job at a round (the same
  // cost as a preemption: a job resumed elsewhere restores its state like any other).
  double roundSeconds = 1800;
  double switchSeconds = 30;
  double sampleSeconds = 3600; // tenant shares sampled this often
  bool audit = false;          // check the pool against the simulator after every event
  bool logDecisions = false;   // DynamicRun::decisions (raccel)
};

struct TenantShare {
  std::string name;
  double share = 0;        // mean share of blocks held, over samples with demand (%)
  double entitlement = 0;  // mean max-min fair share (equal weights, capped at demand) (%)
  uint32_t jobs = 0;
};

struct DynamicRun {
  uint64_t jobs = 0, finished = 0, preemptions = 0, migrations = 0;
  double avgJct = 0, p99Jct = 0, avgQueue = 0, p99Queue = 0, utilization = 0, makespan = 0;
  double highAvgQueue = 0, highAvgJct = 0, restAvgJct = 0;  // tagged high / the rest (highFraction > 0)
  std::vector<double> jct, queue;             // per job, seconds (by job index)
  std::vector<bool> high;                     // per job
  std::vector<TenantShare> tenants;
  std::vector<double> sampleTimes;            // hours
  std::vector<std::vector<double>> shareSeries;  // [tenant][sample]: % of blocks held
  // With logDecisions: "start jN", "demote jN", "preempt jN", "resume jN", "finish jN"
  // (N: the job's index), in the order made; what raccel-scheduler's events say too.
  std::vector<std::string> decisions;
};

Result<DynamicRun> runDynamic(const Cluster& cluster, const Workload& workload, const DynamicOptions& options);
// Tenant fairness: the mean over tenants with demand of |share - entitlement| (points).
double fairnessDeviation(const DynamicRun& run);

}  // namespace raccel::sim
