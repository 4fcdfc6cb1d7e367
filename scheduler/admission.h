// The order in which waiting and suspended vaccels are placed (docs/ARCHITECTURE.md,
// "The pool"), and the tenant usage that orders equals. Pure logic, time passed in
// (seconds): the scheduler's placement pass and raccel-sim share it.
#pragma once

#include <cstdint>
#include <limits>
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
  // `elsewhere`: the tenant's decayed block-seconds on other schedulers of a shared pool.
  double score(double now, double entitlement, double elsewhere = 0) const;
  // Its decayed block-seconds up to `now` (what a shared pool's other schedulers are told).
  double used(double now) const;
  uint32_t blocks() const { return blocks_; }

 private:
  DecayedUsage used_;
  uint32_t blocks_ = 0;
  double since_ = 0;
};

// Attained service, discretized (as Tiresias, NSDI '19, does with its 2D-LAS queues): a
// vaccel's class by the block-seconds it has held so far. Class 0 (under
// kServiceThresholds[0]) is the freshest; work that has had much waits behind work that
// has had little, so short work is not stuck behind long work. Thresholds grow tenfold.
constexpr double kServiceThresholds[] = {15.0 * 3600, 150.0 * 3600};  // a V100's blocks for 1 h, 10 h
constexpr int kServiceClasses = 3;
int serviceClassOf(double attainedBlockSeconds);
// The pool priority that carries a vaccel's priority and its service class, so that
// Pool::planPreemption takes from lower priorities first and, within one priority, from
// work that has had the most service: priority x kServiceClasses + (classes - 1 - class).
int poolPriority(int priority, int serviceClass);
// The priority a pool priority carries (the inverse of poolPriority's first part).
int priorityOfPoolPriority(int poolPriority);

// Starvation guard: a request that has waited this long since it last ran (or arrived)
// counts as fresh work (class 0) of a tenant within its share, whatever its tenant holds,
// and may preempt even if it was suspended, so a heavy tenant's wide jobs (quickly in
// the last class: attained service counts blocks) are not passed over for ever by
// everyone's narrower ones. One day, chosen on the Philly trace (sim/README.md): 24, 36,
// 48, 72 and 96 hours gave p99 JCTs of 661, 686, 690, 706 and 717 h (fewer preemptions
// the longer the guard); ten days left suspended 32-GPU jobs waiting for weeks.
constexpr double kStarvedAfterSeconds = 24.0 * 3600;
// Whether a request that does not fit may have others suspended for it: new work may; a
// suspended request resumes into free blocks only, until it has starved (otherwise
// suspended work would preempt its preemptors, back and forth).
bool mayPreempt(bool suspended, double waitedSeconds);

// Tiresias' promotion: a request that has waited more than this many times its last
// run is promoted to class 0 with its attained service forgotten.
constexpr double kPromoteAfterLastRuns = 8;

// A request's service as the admission policy counts it: the block-seconds it has run
// (its class follows them) and how long it has waited since it arrived or last ran.
// raccel-sim drives it with its virtual clock, raccel-scheduler with the real one
// (seconds either way), so both make the same decisions from the same history.
struct Service {
  double attained = 0;      // block-seconds run so far
  int serviceClass = 0;     // serviceClassOf(attained), or 0 after a promotion
  double lastRun = 0;       // seconds of its last run
  double waitingSince = 0;  // when it last arrived or stopped running
  void ran(double seconds, uint32_t blocks) { attained += seconds * blocks; }
  // Demotion as attained service grows (a crossing due now counts, despite rounding):
  // whether its class changed.
  bool reclassify();
  // Seconds until running on `blocks` moves it to the next class (infinity in the last).
  double secondsToNextClass(uint32_t blocks) const;
  void stopped(double now, double ranSince) {
    lastRun = now - ranSince;
    waitingSince = now;
  }
  // Promotion of a suspended request starved for over kPromoteAfterLastRuns (or
  // `knob`) times its last run: whether it was promoted.
  bool promote(double now, double knob = kPromoteAfterLastRuns);
  double waited(double now) const { return now - waitingSince; }
  // The first moment after `now` at which waiting alone changes this request's standing:
  // it passes the starvation guard, or (in a class above 0, having run) its promotion is
  // due. Both drivers run admission again then, so a starved request is not left for the
  // next arrival or release. Infinity when neither is still to come.
  double nextWaitingChange(double now, double knob = kPromoteAfterLastRuns) const;
};

// Max-min fair shares of `capacity` among tenants' demands (equal weights).
std::vector<double> waterFill(const std::vector<double>& demand, double capacity);
// Per tenant: whether it holds more than its max-min fair share of `capacity`, given
// each one's demand (held plus waiting blocks) and holding.
std::vector<bool> overFairShare(const std::vector<double>& demand, const std::vector<double>& have, double capacity);

struct Waiting {
  VaccelId id = kNoOwner;
  int priority = 0;
  double tenantScore = 0;  // TenantUsage::score
  uint64_t arrival = 0;    // admission requests in arrival order
  int serviceClass = 0;    // serviceClassOf its attained service
  bool overShare = false;  // its tenant holds more than its fair share now
  double waitedSeconds = 0;
};
// Applies the starvation guard (serviceClass and overShare become what the order uses),
// then orders: highest priority first; then tenants within their fair share before those
// over it; then the least attained service class; then the tenant with the lowest usage
// over its entitlement (usage-based fair share); then arrival order.
void orderForAdmission(std::vector<Waiting>& queue);

}  // namespace raccel::scheduler
