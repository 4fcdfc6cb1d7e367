#include "scheduler/admission.h"

#include <algorithm>
#include <limits>
#include <tuple>

namespace raccel::scheduler {

void TenantUsage::hold(double now, int64_t deltaBlocks) {
  if (now > since_) used_.add(now, kHalfLifeSeconds, blocks_ * (now - since_));
  since_ = std::max(since_, now);
  blocks_ = static_cast<uint32_t>(std::max<int64_t>(0, static_cast<int64_t>(blocks_) + deltaBlocks));
}

double TenantUsage::used(double now) const {
  return used_.decayed(now, kHalfLifeSeconds) + (now > since_ ? blocks_ * (now - since_) : 0);
}

double TenantUsage::score(double now, double entitlement, double elsewhere) const {
  return (used(now) + std::max(elsewhere, 0.0)) / std::max(entitlement, 1e-9);
}

int serviceClassOf(double attained) {
  int k = 0;
  while (k + 1 < kServiceClasses && attained >= kServiceThresholds[k]) ++k;
  return k;
}

int poolPriority(int priority, int serviceClass) {
  return priority * kServiceClasses + (kServiceClasses - 1 - std::clamp(serviceClass, 0, kServiceClasses - 1));
}

int priorityOfPoolPriority(int poolPriority) {
  const int rest = ((poolPriority % kServiceClasses) + kServiceClasses) % kServiceClasses;
  return (poolPriority - rest) / kServiceClasses;
}

bool Service::reclassify() {
  int k = serviceClassOf(attained + 1e-3);
  if (k == serviceClass) return false;
  serviceClass = k;
  return true;
}

double Service::secondsToNextClass(uint32_t blocks) const {
  if (serviceClass + 1 >= kServiceClasses || blocks == 0) return std::numeric_limits<double>::infinity();
  return std::max(0.0, kServiceThresholds[serviceClass] - attained) / blocks;
}

bool Service::promote(double now, double knob) {
  if (serviceClass == 0 || lastRun <= 0 || now - waitingSince <= knob * lastRun) return false;
  serviceClass = 0;
  attained = 0;
  return true;
}

double Service::nextWaitingChange(double now, double knob) const {
  // Both rules compare strictly (waited > limit): the change is just after the limit.
  constexpr double kJustAfter = 1e-6;
  double next = std::numeric_limits<double>::infinity();
  double guard = waitingSince + kStarvedAfterSeconds + kJustAfter;
  double promotion = serviceClass > 0 && lastRun > 0 ? waitingSince + knob * lastRun + kJustAfter : next;
  for (double at : {guard, promotion})
    if (at > now && at < next) next = at;
  return next;
}

std::vector<double> waterFill(const std::vector<double>& demand, double capacity) {
  std::vector<double> out(demand.size(), 0);
  std::vector<size_t> order;
  for (size_t i = 0; i < demand.size(); ++i)
    if (demand[i] > 0) order.push_back(i);
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return demand[a] < demand[b]; });
  double left = capacity;
  for (size_t k = 0; k < order.size(); ++k) {
    double even = left / static_cast<double>(order.size() - k);
    out[order[k]] = std::min(demand[order[k]], even);
    left -= out[order[k]];
  }
  return out;
}

std::vector<bool> overFairShare(const std::vector<double>& demand, const std::vector<double>& have, double capacity) {
  auto fair = waterFill(demand, capacity);
  std::vector<bool> over(demand.size());
  for (size_t k = 0; k < over.size() && k < have.size(); ++k) over[k] = have[k] > fair[k] + 1e-9;
  return over;
}

bool mayPreempt(bool suspended, double waitedSeconds) { return !suspended || waitedSeconds > kStarvedAfterSeconds; }

void orderForAdmission(std::vector<Waiting>& queue) {
  for (auto& w : queue)
    if (w.waitedSeconds > kStarvedAfterSeconds) w.serviceClass = 0, w.overShare = false;
  std::stable_sort(queue.begin(), queue.end(), [](const Waiting& a, const Waiting& b) {
    return std::make_tuple(-a.priority, a.overShare, a.serviceClass, a.tenantScore, a.arrival) <
           std::make_tuple(-b.priority, b.overShare, b.serviceClass, b.tenantScore, b.arrival);
  });
}

}  // namespace raccel::scheduler
