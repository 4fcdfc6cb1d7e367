// raccelctl's side of the console API: one request, one reply, over the scheduler's
// console unix socket; and the renderings of replies as tables and as JSON.
// Used from one thread.
#pragma once

#include <string>

#include "common/error.h"

namespace raccel::console {

enum class Query { nodes, cards, pool, vaccels, vms };

Result<Query> parseQuery(const std::string& word);
// Asks the scheduler and renders its answer as a table, or as one JSON document.
Result<std::string> run(const std::string& socket, Query query, bool json, int timeoutMs = 10000);

}  // namespace raccel::console
