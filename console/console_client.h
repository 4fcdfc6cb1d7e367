// raccelctl's side of the console API: one request, one reply, over the scheduler's
// console unix socket; and the renderings of replies as tables and as JSON.
// Used from one thread.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "common/error.h"
#include "console/api.h"

namespace raccel::console {

enum class Query { nodes, cards, pool, vaccels, vms };

Result<Query> parseQuery(const std::string& word);
// Asks the scheduler and renders its answer as a table, or as one JSON document.
Result<std::string> run(const std::string& socket, Query query, bool json, int timeoutMs = 10000);
// raccelctl events: subscribes, then hands `print` each event as one line (text, or one
// JSON object), the recent ones first, until `count` lines (0 = until the scheduler
// goes away, which is then the error).
// With `recentOnly`, stops after the recent ones instead.
Status follow(const std::string& socket, bool json, unsigned count, const std::function<void(const std::string&)>& print,
              bool recentOnly = false);

// Operator actions (console/api.h): `words` starts with the command. Returns what the
// scheduler did, in a sentence.
// With `json`, as the document {"done": text}.
Result<std::string> act(const std::string& socket, const std::vector<std::string>& words, const ActionOptions& options,
                        bool json = false, int timeoutMs = 10000);

}  // namespace raccel::console
