#include "sim/policy.h"

namespace raccel::sim {

const char* policyName(Policy policy) {
  switch (policy) {
    case Policy::raccel: return "raccel";
    case Policy::wholeCardFirstFit: return "whole-card-first-fit";
    case Policy::random: return "random";
    case Policy::bestFit: return "best-fit";
    case Policy::tiresias: return "tiresias";
    case Policy::gandiva: return "gandiva";
  }
  return "?";
}

Result<Policy> parsePolicy(const std::string& name) {
  for (Policy p : dynamicPolicies())
    if (name == policyName(p)) return p;
  return fail(Code::invalidArgument, "unknown policy '" + name + "' (raccel, whole-card-first-fit, random, best-fit, tiresias, gandiva; openb also fgd, fgd-bestfit)");
}

std::vector<Policy> allPolicies() { return {Policy::raccel, Policy::wholeCardFirstFit, Policy::random, Policy::bestFit}; }
std::vector<Policy> dynamicPolicies() {
  return {Policy::raccel, Policy::tiresias, Policy::gandiva, Policy::wholeCardFirstFit, Policy::random, Policy::bestFit};
}

scheduler::Pool::Fit fitOf(Policy policy) {
  switch (policy) {
    case Policy::raccel: return scheduler::Pool::Fit::raccel;
    case Policy::wholeCardFirstFit: return scheduler::Pool::Fit::firstFit;
    case Policy::random: return scheduler::Pool::Fit::random;
    case Policy::bestFit: return scheduler::Pool::Fit::bestFit;
    case Policy::tiresias: return scheduler::Pool::Fit::firstFit;  // consolidated: lowest whole cards of one node
    case Policy::gandiva: return scheduler::Pool::Fit::bestFit;    // packs onto the fullest node
  }
  return scheduler::Pool::Fit::raccel;
}

}  // namespace raccel::sim
