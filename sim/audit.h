// The simulator's bookkeeping check: the pool's blocks against the holders the
// simulator believes it placed. Used after every event when a run audits (tests).
#pragma once

#include <vector>

#include "common/error.h"
#include "scheduler/pool.h"

namespace raccel::sim {

// Fails, naming the block, when a block is held twice, held by someone not in
// `holders`, free and held at once, when a holder holds nothing, or when held and free
// blocks do not add up to the pool's total.
Status auditPool(const scheduler::Pool& pool, const std::vector<scheduler::VaccelId>& holders);

}  // namespace raccel::sim
