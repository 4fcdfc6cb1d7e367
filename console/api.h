// The console API's shared parts, used by raccelctl and by the scheduler's web API alike:
// the JSON encoding of every console reply and event (one encoder: `raccelctl --json`
// and GET /api/... print the same documents), and the operator actions built from words
// (`raccelctl preempt 3`, or POST /api/actions {"action":"preempt","args":["3"]}).
// JSON through nlohmann-json; field order follows the schema.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "common/error.h"
#include "schema/console.capnp.h"

namespace raccel::console {

using Json = nlohmann::ordered_json;

// The reply to a query (nodes, cards, pool, vaccels, vms) as one JSON document; `done`
// as {"done": text}, an error as {"error": {"code", "message"}}.
Json replyJson(wire::ConsoleReply::Reader reply);
Json eventJson(wire::Event::Reader event);
// One line of JSON; bytes that are not UTF-8 (a guest names its programs) become U+FFFD.
std::string dump(const Json& json);

// Operator actions: preempt ID | resume ID | defrag | drain NODE | set-policy VM KEY=VALUE...
struct ActionOptions {
  unsigned maxMoves = 0;                // defrag: 0 = the scheduler's rate limit
  unsigned long long maxMoveBytes = 0;  // defrag: 0 = the scheduler's limit
  bool undo = false;                    // drain: place on the node again
};
bool isAction(const std::string& word);
// `words` starts with the action; an error says what is wrong with them.
Status buildAction(const std::vector<std::string>& words, const ActionOptions& options, wire::ConsoleRequest::Builder request);

}  // namespace raccel::console
