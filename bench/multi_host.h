// raccel-bench's multi-host figures: admissions through the pool shared in etcd
// (scheduler/etcd/shared_pool.h), three schedulers racing on one pool beside one alone,
// in the same run on the same 3-member etcd cluster. Each scheduler is a
// raccel-pool-race process. Called from raccel-bench's main thread.
#pragma once

#include <string>

namespace raccel::bench {

struct MultiHostFigures {
  std::string skipped;  // why nothing was measured ("" when measured)
  double singleAdmissionsPerS = -1, singleP99Ms = -1;
  double multiAdmissionsPerS = -1, multiP99Ms = -1, multiConflictRate = -1;
  unsigned schedulers = 3;
};

MultiHostFigures measureMultiHost(bool quick);
std::string multiHostJson(const MultiHostFigures& f);  // its keys, without the braces
void printMultiHostText(const MultiHostFigures& f);

}  // namespace raccel::bench
