// The policies the simulator compares: raccel's own, and the baselines. Each maps onto
// the real Pool's Fit (and, for whole-card first-fit, onto whole-card requests).
#pragma once

#include <string>
#include <vector>

#include "common/error.h"
#include "scheduler/pool.h"

namespace raccel::sim {

enum class Policy {
  raccel,             // Pool::Fit::raccel; spread vaccels, preemption, compaction, fair share (experiment B)
  wholeCardFirstFit,  // a Kubernetes device plugin: whole cards only (a share takes a card), first fit
  random,             // any place that fits
  bestFit,            // the fullest node that fits
  // Experiment B only (cluster schedulers of whole GPUs; sim/dynamic.h):
  tiresias,  // Tiresias (NSDI '19): discretized 2D least-attained-service queues, preemptive, starvation guard; consolidated
  gandiva,   // Gandiva (OSDI '18): greedy packing, time-slicing (suspend/resume in rounds) when oversubscribed
};

const char* policyName(Policy policy);
Result<Policy> parsePolicy(const std::string& name);
// The packing policies (experiment A), and every policy of experiment B.
std::vector<Policy> allPolicies();
std::vector<Policy> dynamicPolicies();
scheduler::Pool::Fit fitOf(Policy policy);

}  // namespace raccel::sim
