#include "sim/audit.h"

#include <string>

namespace raccel::sim {

using scheduler::VaccelId;

Status auditPool(const scheduler::Pool& pool, const std::vector<VaccelId>& holders) {
  std::vector<VaccelId> seen(pool.highestBlock() + 1, scheduler::kNoOwner);
  uint64_t held = 0;
  for (VaccelId h : holders) {
    const auto& ranges = pool.held(h);
    if (ranges.empty()) return fail(Code::internal, "holder " + std::to_string(h) + " holds no blocks");
    for (auto& r : ranges)
      for (uint32_t b = r.first; b < r.end(); ++b) {
        if (b == 0 || b > pool.highestBlock()) return fail(Code::internal, "holder " + std::to_string(h) + " holds non-block " + std::to_string(b));
        if (seen[b] != scheduler::kNoOwner)
          return fail(Code::internal, "block " + std::to_string(b) + " held by " + std::to_string(seen[b]) + " and " + std::to_string(h));
        if (pool.ownerOf(b) != h)
          return fail(Code::internal, "block " + std::to_string(b) + " listed for " + std::to_string(h) + " but owned by " + std::to_string(pool.ownerOf(b)));
        seen[b] = h;
        ++held;
      }
  }
  for (uint32_t b = 1; b <= pool.highestBlock(); ++b)
    if (pool.ownerOf(b) != seen[b])
      return fail(Code::internal, "block " + std::to_string(b) + " owned by " + std::to_string(pool.ownerOf(b)) + ", a holder the simulator does not know");
  uint64_t free = 0;
  for (auto& [first, count] : pool.freeRuns())
    for (uint32_t b = first; b < first + count; ++b) {
      if (seen[b] != scheduler::kNoOwner) return fail(Code::internal, "block " + std::to_string(b) + " is both free and held");
      ++free;
    }
  if (free != pool.freeBlocks()) return fail(Code::internal, "free runs count " + std::to_string(free) + " blocks, the pool says " + std::to_string(pool.freeBlocks()));
  if (held + free != pool.total())
    return fail(Code::internal, std::to_string(held) + " held + " + std::to_string(free) + " free != " + std::to_string(pool.total()) + " blocks");
  return {};
}

}  // namespace raccel::sim
