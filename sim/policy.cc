#include "sim/policy.h"

namespace raccel::sim {

const char* policyName(Policy policy) {
  switch (policy) {
    case Policy::raccel: return "raccel";
    case Policy::wholeCardFirstFit: return "whole-card-first-fit";
    case Policy::random: return "random";
    case Policy::bestFit: return "best-fit";
  }
  return "?";
}

Result<Policy> parsePolicy(const std::string& name) {
  for (Policy p : allPolicies())
    if (name == policyName(p)) return p;
  return fail(Code::invalidArgument, "unknown policy '" + name + "' (raccel, whole-card-first-fit, random, best-fit)");
}

std::vector<Policy> allPolicies() { return {Policy::raccel, Policy::wholeCardFirstFit, Policy::random, Policy::bestFit}; }

scheduler::Pool::Fit fitOf(Policy policy) {
  switch (policy) {
    case Policy::raccel: return scheduler::Pool::Fit::raccel;
    case Policy::wholeCardFirstFit: return scheduler::Pool::Fit::firstFit;
    case Policy::random: return scheduler::Pool::Fit::random;
    case Policy::bestFit: return scheduler::Pool::Fit::bestFit;
  }
  return scheduler::Pool::Fit::raccel;
}

}  // namespace raccel::sim
