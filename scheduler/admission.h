// The order in which waiting and suspended vaccels are placed (ARCHITECTURE.md
// "Admission"), and the tenant usage that orders equals. Pure logic, time passed in
// (seconds): the scheduler's placement pass and raccel-sim share it.
#pragma once

#include <cstdint>
#include <vector>

#include "common/usage.h"
#include "scheduler/pool.h"

namespace raccel::scheduler {

// A tenant's (a VM's) use of the pool: blocks held over time, decayed with a half-life
// of kHalfLifeSeconds; charged whenever its holding changes.
class TenantUsage {
 public:
  static constexpr double kHalfLifeSeconds = 600;
  void hold(double now, int64_t deltaBlocks);
  // Decayed block-seconds up to `now` over the tenant's entitlement (its weight: the
  // scheduler uses the VM's TFLOPS cap). Lower goes first.
  double score(double now, double entitlement) const;
  uint32_t blocks() const { return blocks_; }

 private:
  DecayedUsage used_;
  uint32_t blocks_ = 0;
  double since_ = 0;
};

struct Waiting {
  VaccelId id = kNoOwner;
  int priority = 0;
  double tenantScore = 0;  // TenantUsage::score
  uint64_t arrival = 0;    // admission requests in arrival order
};
// Highest priority first; among equals the tenant with the lowest usage over its
// entitlement (usage-based fair share); then arrival order.
void orderForAdmission(std::vector<Waiting>& queue);

}  // namespace raccel::scheduler
