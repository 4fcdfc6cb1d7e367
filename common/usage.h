// Usage decayed exponentially with a half-life: the numerator of the usage-based
// fair-share score (netaccel's card time-slicing, the scheduler's admission order).
// Time, half-life and amounts are in the caller's units. Plain value; one thread.
#pragma once

#include <cmath>

namespace raccel {

struct DecayedUsage {
  double value = 0, at = 0;
  double decayed(double now, double halfLife) const { return value * std::exp2(-(now - at) / halfLife); }
  void add(double now, double halfLife, double amount) {
    value = decayed(now, halfLife) + amount;
    at = now;
  }
};

}  // namespace raccel
