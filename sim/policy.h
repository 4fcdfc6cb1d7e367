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
};

const char* policyName(Policy policy);
Result<Policy> parsePolicy(const std::string& name);
std::vector<Policy> allPolicies();
scheduler::Pool::Fit fitOf(Policy policy);

}  // namespace raccel::sim
