#include "scheduler/admission.h"

#include <algorithm>
#include <tuple>

namespace raccel::scheduler {

void TenantUsage::hold(double now, int64_t deltaBlocks) {
  if (now > since_) used_.add(now, kHalfLifeSeconds, blocks_ * (now - since_));
  since_ = std::max(since_, now);
  blocks_ = static_cast<uint32_t>(std::max<int64_t>(0, static_cast<int64_t>(blocks_) + deltaBlocks));
}

double TenantUsage::score(double now, double entitlement) const {
  double used = used_.decayed(now, kHalfLifeSeconds) + (now > since_ ? blocks_ * (now - since_) : 0);
  return used / std::max(entitlement, 1e-9);
}

int serviceClassOf(double attained) {
  int k = 0;
  while (k + 1 < kServiceClasses && attained >= kServiceThresholds[k]) ++k;
  return k;
}

int poolPriority(int priority, int serviceClass) {
  return priority * kServiceClasses + (kServiceClasses - 1 - std::clamp(serviceClass, 0, kServiceClasses - 1));
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
