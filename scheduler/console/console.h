// The operators' side of a scheduler: raccelctl's console socket, the HTTP server
// (Prometheus /metrics, the web console's assets, its JSON API under /api/ and its live
// event stream) and the event stream itself.
//
// The contract. The console owns its listeners and connections, the recent events (the
// last kKeptEvents, for late subscribers), their counts by kind, and the admission
// latency histogram. It answers queries (nodes, cards, pool, vaccels, VMs) and writes
// /metrics by reading the scheduler's state through a const Scheduler, so a query cannot
// change anything; it changes the scheduler only through its operator actions
// (Scheduler::preemptByOperator, resumeByOperator, defrag, drainNode, setPolicy, and the
// pool state's actElsewhere for another host's vaccel). Requests arrive already framed;
// every field a client sends is checked here or by console/api.h before it is acted on.
// The HTTP API answers with the same console requests raccelctl sends and the same
// JSON encoder (console/api.h); actions there need the bearer token from
// http_token_file. Loop thread only.
//
//   GET  /metrics            Prometheus text format
//   GET  /  /app.js  /style.css   the web console (console/web/, built into this binary)
//   GET  /api/nodes|cards|pool|vaccels|vms   as `raccelctl --json`
//   GET  /api/events         text/event-stream: the recent events, then each new one
//   GET  /api/auth           whether actions are enabled and the request's token is good
//   POST /api/actions        {"action": "preempt", "args": ["3"]} (also maxMoves,
//                            maxMoveBytes for defrag, undo for drain); Authorization: Bearer
#pragma once

#include <uv.h>

#include <deque>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/metrics.h"
#include "schema/console.capnp.h"
#include "scheduler/config.h"
#include "scheduler/scheduler.h"
#include "transport/connection.h"
#include "transport/http_server.h"

namespace raccel::scheduler {

class Console {
 public:
  Console(uv_loop_t* loop, const SchedulerConfig& config, Scheduler& scheduler);
  ~Console();

  // The console socket, then the HTTP server (unless http_listen is off); an error names
  // the address or the token file.
  Status start();
  // Stops listening and closes every console connection.
  void stop();

  // An event: kept for late subscribers, sent to live ones (raccelctl events and the web
  // console's stream), counted by kind for /metrics. Peers' text in it is clipped.
  void event(const std::string& kind, const std::string& subject, const std::string& detail);
  // A program's hello answered with its first welcome, `seconds` after it arrived.
  void observeAdmission(double seconds) { admissionSeconds_.observe(seconds); }

  // A console request but `events` (which subscribes): raccelctl's and the web API's.
  void answer(wire::ConsoleRequest::Reader request, wire::ConsoleReply::Builder reply);

 private:
  struct EventRecord {
    uint64_t unixMs;
    std::string kind, subject, detail;
  };
  static constexpr size_t kKeptEvents = 256;
  using Vm = Scheduler::Vm;
  using Session = Scheduler::Session;

  void accept(transport::ConnectionPtr connection);
  void onFrame(transport::Connection& connection, const transport::FrameHeader& header, transport::Body body);

  // Queries: read-only, through s_.
  void nodes(wire::ConsoleReply::Builder reply) const;
  void cards(wire::ConsoleReply::Builder reply) const;
  void poolMap(wire::ConsoleReply::Builder reply) const;
  void vms(wire::ConsoleReply::Builder reply) const;
  void vaccels(wire::ConsoleReply::Builder reply) const;
  // Actions: through the scheduler's operator actions.
  void act(wire::ConsoleRequest::Reader request, wire::ConsoleReply::Builder reply);

  // HTTP (web.cc).
  Status startHttp();
  transport::HttpResponse onHttp(const transport::HttpRequest& request);
  transport::HttpResponse onAction(const transport::HttpRequest& request);
  std::string metricsText() const;
  // metricsText's sections: the pool's blocks, the vaccels by state (and other hosts'),
  // per VM (what the vaccels did, for the totals after), per live vaccel, the totals and
  // events, the nodes and their cards.
  void poolMetrics(MetricsPage& page) const;
  void vaccelStateMetrics(MetricsPage& page) const;
  void vmMetrics(MetricsPage& page, uint64_t& instructions, uint64_t& moved) const;
  void vaccelMetrics(MetricsPage& page) const;
  void eventMetrics(MetricsPage& page) const;
  void nodeMetrics(MetricsPage& page) const;
  std::string sseData(const EventRecord& e) const;
  bool bearerMatches(const std::string& authorization) const;

  uv_loop_t* loop_;
  const SchedulerConfig& config_;
  Scheduler& ops_;       // operator actions only
  const Scheduler& s_;   // the same scheduler, read only
  std::unique_ptr<transport::Listener> listener_;
  std::vector<transport::ConnectionPtr> consoles_;
  uint64_t refused_ = 0;  // connections over the limit, for the log
  std::deque<EventRecord> events_;                                        // the most recent, oldest first
  std::vector<std::pair<transport::Connection*, uint64_t>> subscribers_;  // and their sequence
  std::map<std::string, uint64_t> eventCounts_;                           // by kind, since start
  std::unique_ptr<transport::HttpServer> http_;  // null with http_listen = off
  std::string httpToken_;                        // empty: the web console is read-only
  Histogram admissionSeconds_{{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}};
};

}  // namespace raccel::scheduler
