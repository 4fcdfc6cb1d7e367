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
// An error as the console's JSON documents carry it: {"error": {"code", "message"}}.
Json errorJson(const Error& error);
Json eventJson(wire::Event::Reader event);
// The words every view of the pool uses: a range's state, and the pool's one-line
// summary ("8 blocks of 1 TFLOPS: 0 free, 0 used, 8 draining, 0 offline").
const char* rangeState(wire::PoolRange::State state);
std::string poolSummary(wire::PoolMap::Reader pool);
// One line of JSON; bytes that are not UTF-8 (a guest names its programs) become U+FFFD.
std::string dump(const Json& json);

// Operator actions: preempt ID | resume ID | defrag | drain NODE | set-policy VM KEY=VALUE...
struct ActionOptions {
  unsigned maxMoves = 0;                // defrag: 0 = the scheduler's rate limit
  unsigned long long maxMoveBytes = 0;  // defrag: 0 = the scheduler's limit
  bool undo = false;                    // drain: place on the node again
};
bool isAction(const std::string& word);
// The actions (raccelctl's and the web API's), and every raccelctl command.
inline constexpr const char* kActionList = "preempt, resume, defrag, drain, set-policy";
inline constexpr const char* kCommandList =
    "nodes, cards, pool, vaccels, vms, events, preempt, resume, defrag, drain, set-policy";
// `words` starts with the action; an error says what is wrong with them.
Status buildAction(const std::vector<std::string>& words, const ActionOptions& options, wire::ConsoleRequest::Builder request);

}  // namespace raccel::console
