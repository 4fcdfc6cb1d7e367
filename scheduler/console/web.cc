// The console's HTTP side (scheduler/console/console.h): /metrics, the web console's
// assets, its JSON API and its event stream.
#include <openssl/crypto.h>

#include <fstream>
#include <sstream>

#include "common/limits.h"
#include "common/log.h"
#include "console/api.h"
#include "console/web_assets.h"
#include "scheduler/console/console.h"
#include "scheduler/links/node_links.h"
#include "scheduler/state.h"

namespace raccel::scheduler {

using transport::HttpRequest;
using transport::HttpResponse;

namespace {

HttpResponse jsonResponse(int status, const console::Json& json) { return HttpResponse::json(status, console::dump(json) + "\n"); }

HttpResponse errorResponse(int status, const std::string& code, const std::string& message) {
  return jsonResponse(status, console::Json{{"error", {{"code", code}, {"message", message}}}});
}

int statusFor(Code code) {
  switch (code) {
    case Code::invalidArgument: return 400;
    case Code::notFound: return 404;
    case Code::permissionDenied: return 403;
    case Code::resourceExhausted: return 429;
    case Code::unimplemented: return 501;
    default: return 409;
  }
}

const char* kSecurityPolicy = "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
                              "connect-src 'self'; frame-ancestors 'none'";

HttpResponse asset(const char* type, const char* body) {
  HttpResponse r;
  r.contentType = type;
  r.body = body;
  r.headers = {{"Content-Security-Policy", kSecurityPolicy}, {"Cache-Control", "no-cache"}};
  return r;
}

}  // namespace

Status Console::startHttp() {
  if (config_.httpListen == "off" || config_.httpListen.empty()) return {};
  if (!config_.httpTokenFile.empty()) {
    std::ifstream in(config_.httpTokenFile);
    if (!in) return fail(Code::invalidArgument, "http_token_file " + config_.httpTokenFile + ": cannot read it");
    std::string token;
    std::getline(in, token);
    while (!token.empty() && std::isspace(static_cast<unsigned char>(token.back()))) token.pop_back();
    if (token.size() < 16 || token.size() > 4096)
      return fail(Code::invalidArgument, "http_token_file " + config_.httpTokenFile +
                                             ": the token on its first line must be 16 to 4096 characters");
    for (char c : token)
      if (c < 0x21 || c > 0x7e)
        return fail(Code::invalidArgument, "http_token_file " + config_.httpTokenFile + ": the token must be printable ASCII");
    httpToken_ = token;
  }
  transport::HttpServer::Options options;
  options.listen = config_.httpListen;
  options.name = "scheduler-http";
  options.timeoutS = config_.httpClientTimeoutS;
  http_ = std::make_unique<transport::HttpServer>(loop_, options, [this](const HttpRequest& r) { return onHttp(r); });
  if (auto s = http_->start(); !s) return fail(s.error().code, "http_listen: " + s.error().message);
  RLOG_INFO("scheduler") << "web console and /metrics on http://" << config_.httpListen.substr(0, config_.httpListen.rfind(':'))
                         << ":" << http_->port() << "/ (actions " << (httpToken_.empty() ? "disabled: no http_token_file" : "need the token")
                         << ")";
  return {};
}

// One event as a Server-Sent Event: the console's JSON of it on one data line.
std::string Console::sseData(const EventRecord& e) const {
  capnp::MallocMessageBuilder m;
  auto out = m.initRoot<wire::Event>();
  fillEvent(out, e.unixMs, e.kind, e.subject, e.detail);
  return "data: " + console::dump(console::eventJson(out.asReader())) + "\n\n";
}

// `Authorization: Bearer TOKEN` with the scheduler's token (compared in constant time).
bool Console::bearerMatches(const std::string& authorization) const {
  return !httpToken_.empty() && authorization.size() == httpToken_.size() + 7 && authorization.rfind("Bearer ", 0) == 0 &&
         CRYPTO_memcmp(authorization.data() + 7, httpToken_.data(), httpToken_.size()) == 0;
}


HttpResponse Console::onHttp(const HttpRequest& r) {
  static const std::map<std::string, void (*)(wire::ConsoleRequest::Builder)> queries = {
      {"/api/nodes", [](wire::ConsoleRequest::Builder b) { b.setNodes(); }},
      {"/api/cards", [](wire::ConsoleRequest::Builder b) { b.setCards(); }},
      {"/api/pool", [](wire::ConsoleRequest::Builder b) { b.setPool(); }},
      {"/api/vaccels", [](wire::ConsoleRequest::Builder b) { b.setVaccels(); }},
      {"/api/vms", [](wire::ConsoleRequest::Builder b) { b.setVms(); }},
  };
  bool get = r.method == "GET" || r.method == "HEAD";
  auto onlyGet = [&] { return HttpResponse::methodNotAllowed(r, "GET, HEAD"); };
  if (r.path == "/api/actions") return r.method == "POST" ? onAction(r) : HttpResponse::methodNotAllowed(r, "POST");
  if (r.path == "/metrics") return get ? HttpResponse::metrics(metricsText()) : onlyGet();
  if (r.path == "/" || r.path == "/index.html") return get ? asset("text/html; charset=utf-8", webassets::kIndexHtml) : onlyGet();
  if (r.path == "/app.js") return get ? asset("text/javascript; charset=utf-8", webassets::kAppJs) : onlyGet();
  if (r.path == "/style.css") return get ? asset("text/css; charset=utf-8", webassets::kStyleCss) : onlyGet();
  if (auto q = queries.find(r.path); q != queries.end()) {
    if (!get) return onlyGet();
    capnp::MallocMessageBuilder in, out;
    auto request = in.initRoot<wire::ConsoleRequest>();
    q->second(request);
    auto reply = out.initRoot<wire::ConsoleReply>();
    answer(request.asReader(), reply);
    return jsonResponse(200, console::replyJson(reply.asReader()));
  }
  if (r.path == "/api/events") {
    if (!get) return onlyGet();
    HttpResponse stream;
    stream.stream = true;
    stream.contentType = "text/event-stream";
    stream.body = "retry: 2000\n\n";
    for (auto& e : events_) stream.body += sseData(e);
    return stream;
  }
  if (r.path == "/api/auth") {
    if (!get) return onlyGet();
    return jsonResponse(200, console::Json{{"actions", httpToken_.empty() ? "disabled" : "token"},
                                           {"authorized", bearerMatches(r.header("authorization"))}});
  }
  return errorResponse(404, "notFound", "no " + r.path + " here (the console is at /, metrics at /metrics, the API under /api/)");
}

HttpResponse Console::onAction(const HttpRequest& r) {
  if (httpToken_.empty())
    return errorResponse(403, "permissionDenied",
                         "actions are disabled: the scheduler was started without --http-token-file (read-only console)");
  if (r.header("authorization").empty()) {
    HttpResponse no = errorResponse(401, "unauthenticated", "an action needs the header Authorization: Bearer TOKEN");
    no.headers.emplace_back("WWW-Authenticate", "Bearer realm=\"raccel\"");
    return no;
  }
  if (!bearerMatches(r.header("authorization"))) {
    RLOG_WARN("scheduler") << "web console: an action from " << r.peer << " with a wrong token, refused";
    HttpResponse no = errorResponse(401, "unauthenticated", "the bearer token is not the scheduler's");
    no.headers.emplace_back("WWW-Authenticate", "Bearer realm=\"raccel\", error=\"invalid_token\"");
    return no;
  }
  auto body = console::Json::parse(r.body, nullptr, false);
  if (body.is_discarded() || !body.is_object())
    return errorResponse(400, "invalidArgument", "the body must be a JSON object such as {\"action\":\"preempt\",\"args\":[\"3\"]}");
  if (!body.contains("action") || !body["action"].is_string())
    return errorResponse(400, "invalidArgument", "\"action\" must be a string: preempt, resume, defrag, drain or set-policy");
  std::vector<std::string> words = {body["action"].get<std::string>()};
  if (body.contains("args")) {
    if (!body["args"].is_array() || body["args"].size() > 64)
      return errorResponse(400, "invalidArgument", "\"args\" must be an array of at most 64 strings");
    for (auto& a : body["args"]) {
      if (!a.is_string()) return errorResponse(400, "invalidArgument", "\"args\" must hold strings only");
      words.push_back(a.get<std::string>());
    }
  }
  console::ActionOptions options;
  auto unsignedField = [&](const char* name, uint64_t max, auto* into) -> bool {
    if (!body.contains(name)) return true;
    auto& v = body[name];
    if (!v.is_number_unsigned() || v.get<uint64_t>() > max) return false;
    *into = static_cast<std::remove_pointer_t<decltype(into)>>(v.get<uint64_t>());
    return true;
  };
  if (!unsignedField("maxMoves", UINT32_MAX, &options.maxMoves))
    return errorResponse(400, "invalidArgument", "\"maxMoves\" must be a whole number from 0 to 4294967295");
  if (!unsignedField("maxMoveBytes", UINT64_MAX, &options.maxMoveBytes))
    return errorResponse(400, "invalidArgument", "\"maxMoveBytes\" must be a whole number of bytes");
  if (body.contains("undo")) {
    if (!body["undo"].is_boolean()) return errorResponse(400, "invalidArgument", "\"undo\" must be true or false");
    options.undo = body["undo"].get<bool>();
  }
  capnp::MallocMessageBuilder in, out;
  auto request = in.initRoot<wire::ConsoleRequest>();
  if (auto built = console::buildAction(words, options, request); !built)
    return errorResponse(400, codeName(built.error().code), built.error().message);
  auto reply = out.initRoot<wire::ConsoleReply>();
  answer(request.asReader(), reply);
  auto json = console::replyJson(reply.asReader());
  RLOG_INFO("scheduler") << "web console (" << r.peer << "): " << limits::clip(words[0], 32) << ": "
                         << (json.contains("done") ? json["done"].get<std::string>() : json.dump());
  if (reply.which() == wire::ConsoleReply::ERROR) return jsonResponse(statusFor(transport::errorFrom(reply.getError()).code), json);
  return jsonResponse(200, json);
}

std::string Console::metricsText() const {
  MetricsPage page;
  poolMetrics(page);
  vaccelStateMetrics(page);
  uint64_t instructions = 0, moved = 0;
  vmMetrics(page, instructions, moved);
  vaccelMetrics(page);
  page.family("raccel_instructions_forwarded_total", "counter", "Guest instructions the scheduler forwarded to cards.");
  page.sample("raccel_instructions_forwarded_total", static_cast<double>(instructions));
  page.family("raccel_moved_bytes_total", "counter", "Bytes the scheduler copied between cards.");
  page.sample("raccel_moved_bytes_total", static_cast<double>(moved));
  eventMetrics(page);
  nodeMetrics(page);
  return page.text();
}

void Console::poolMetrics(MetricsPage& page) const {
  // The pool, block by block: by node, kind and state.
  std::map<std::tuple<std::string, std::string, std::string>, uint32_t> blocks;
  for (auto& node : s_.pool().nodes())
    if (!node.forgotten)
      for (auto state : {Pool::BlockState::free, Pool::BlockState::used, Pool::BlockState::draining, Pool::BlockState::offline})
        for (auto ci : node.cards) blocks[{node.name, kindName(s_.pool().cards()[ci].spec.kind), Pool::blockStateName(state)}] += 0;
  for (const Card& c : s_.pool().cards()) {
    const Node& node = s_.pool().nodes()[c.node];
    if (node.forgotten) continue;
    for (uint32_t b = c.blocks.first; b < c.blocks.end(); ++b)
      ++blocks[{node.name, kindName(c.spec.kind), Pool::blockStateName(s_.pool().blockState(b))}];
  }
  page.family("raccel_pool_blocks", "gauge",
              "Compute blocks of the pool by node, card kind and state (free, used, draining, offline).");
  for (auto& [key, n] : blocks)
    page.sample("raccel_pool_blocks", {{"node", std::get<0>(key)}, {"kind", std::get<1>(key)}, {"state", std::get<2>(key)}}, n);
  page.family("raccel_pool_block_tflops", "gauge", "TFLOPS of one block.");
  page.sample("raccel_pool_block_tflops", s_.pool().blockTflops());
}

void Console::vaccelStateMetrics(MetricsPage& page) const {
  std::map<std::string, uint32_t> states;
  for (const char* p : {"running", "waiting", "suspending", "suspended", "moving", "resuming", "recovering", "unavailable"}) states[p] = 0;
  for (auto& [id, s] : s_.sessions_) ++states[!s->unavailable.empty() ? "unavailable" : phaseName(s->phase)];
  page.family("raccel_vaccels", "gauge", "Virtual accelerators by state.");
  for (auto& [state, n] : states) page.sample("raccel_vaccels", {{"state", state}}, n);

  // A pool shared through etcd: the other hosts' vaccels, as this scheduler sees them.
  if (s_.state_->shared()) {
    std::map<std::pair<std::string, std::string>, uint32_t> elsewhere;  // (host, state) -> vaccels
    page.family("raccel_vaccel_elsewhere_blocks", "gauge",
                "Blocks each vaccel of another host of the shared pool holds (host: the scheduler that serves it).");
    size_t n = 0;
    for (auto& v : s_.state_->vaccelsElsewhere()) {
      ++elsewhere[{v.scheduler, "running"}];
      uint32_t held = 0;
      for (auto& r : v.ranges) held += r.count;
      if (++n <= 1000)
        page.sample("raccel_vaccel_elsewhere_blocks", {{"host", v.scheduler}, {"vm", v.vm}, {"vaccel", std::to_string(v.vaccel)}}, held);
    }
    for (auto& u : s_.state_->unplacedElsewhere()) ++elsewhere[{u.scheduler, u.vaccel.state}];
    page.family("raccel_vaccels_elsewhere", "gauge",
                "Vaccels of the other hosts of the shared pool by host and state (running: holding blocks; waiting; suspended).");
    for (auto& [key, count] : elsewhere) page.sample("raccel_vaccels_elsewhere", {{"host", key.first}, {"state", key.second}}, count);
  }
}

void Console::vmMetrics(MetricsPage& page, uint64_t& instructions, uint64_t& moved) const {
  // Per VM (the operator's configured set): usage since the scheduler started (kernel
  // time also across restarts, as tenant usage).
  struct PerVm {
    uint64_t kernelNs = 0, instructions = 0, bytesMoved = 0;
  };
  std::map<const Vm*, PerVm> perVm;
  for (auto& vm : s_.vms_) perVm[vm.get()] = {vm->kernelNsEnded, vm->instructionsEnded, vm->bytesMovedEnded};
  for (auto& [id, s] : s_.sessions_) {
    auto& v = perVm[s->vm];
    v.kernelNs += s->kernelNs();
    v.instructions += s->instructions;
    v.bytesMoved += s->bytesMoved;
  }
  page.family("raccel_vm_kernel_seconds_total", "counter", "Time cards spent running each VM's instructions.");
  for (auto& [vm, v] : perVm) page.sample("raccel_vm_kernel_seconds_total", {{"vm", vm->policy.name}}, v.kernelNs / 1e9);
  page.family("raccel_vm_instructions_total", "counter", "Guest instructions the scheduler forwarded, by VM.");
  for (auto& [vm, v] : perVm) page.sample("raccel_vm_instructions_total", {{"vm", vm->policy.name}}, static_cast<double>(v.instructions));
  page.family("raccel_vm_moved_bytes_total", "counter", "Bytes the scheduler copied between a VM's cards (split ops, routed programs).");
  for (auto& [vm, v] : perVm) page.sample("raccel_vm_moved_bytes_total", {{"vm", vm->policy.name}}, static_cast<double>(v.bytesMoved));
  page.family("raccel_vm_blocks_held", "gauge", "Blocks each VM's vaccels hold now.");
  for (auto& vm : s_.vms_) page.sample("raccel_vm_blocks_held", {{"vm", vm->policy.name}}, vm->blocksHeld);
  page.family("raccel_vm_memory_used_bytes", "gauge", "Device memory each VM's vaccels hold now.");
  for (auto& vm : s_.vms_) page.sample("raccel_vm_memory_used_bytes", {{"vm", vm->policy.name}}, static_cast<double>(vm->memoryUsed));

  for (auto& [vm, v] : perVm) instructions += v.instructions, moved += v.bytesMoved;
}

void Console::vaccelMetrics(MetricsPage& page) const {
  // Per live vaccel: its series end with it (ids are never reused). At most kSeries.
  constexpr size_t kSeries = 1000;
  auto perVaccel = [&](const char* name, const char* type, const char* help, auto value) {
    page.family(name, type, help);
    size_t n = 0;
    for (auto& [id, s] : s_.sessions_) {
      if (++n > kSeries) break;
      page.sample(name, {{"vm", s->vm->policy.name}, {"vaccel", std::to_string(id)}}, static_cast<double>(value(*s)));
    }
  };
  perVaccel("raccel_vaccel_kernel_seconds_total", "counter", "Time cards spent running each live vaccel's instructions.",
            [](const Session& s) { return s.kernelNs() / 1e9; });
  perVaccel("raccel_vaccel_blocks", "gauge", "Blocks each live vaccel holds.", [](const Session& s) {
    uint32_t held = 0;
    for (auto& r : s.blocks) held += r.count;
    return held;
  });
  perVaccel("raccel_vaccel_lineage_bytes", "gauge",
            "Bytes of each live vaccel's lineage in the scheduler's memory (checkpoint and log; failover).",
            [](const Session& s) { return s.lineage.heldBytes(); });
  perVaccel("raccel_vaccel_lineage_log_frames", "gauge", "Instructions in each live vaccel's lineage log since its checkpoint.",
            [](const Session& s) { return s.lineage.log.size(); });
  perVaccel("raccel_vaccel_checkpoints_total", "counter", "Checkpoints of each live vaccel's lineage.",
            [](const Session& s) { return s.lineage.checkpoints; });
  perVaccel("raccel_vaccel_checkpoint_read_bytes_total", "counter",
            "Bytes each live vaccel's checkpoints read back from its cards (what the guest wrote is folded from the log instead).",
            [](const Session& s) { return s.lineage.checkpointBytes; });
  perVaccel("raccel_vaccel_checkpoint_overlapped_frames_total", "counter",
            "Instructions of each live vaccel forwarded while a checkpoint of its was under way (taken in the background).",
            [](const Session& s) { return s.lineage.overlapped; });
  perVaccel("raccel_vaccel_recoveries_total", "counter", "Times each live vaccel was rebuilt after losing a card.",
            [](const Session& s) { return s.lineage.recoveries; });
}

void Console::eventMetrics(MetricsPage& page) const {
  page.family("raccel_admission_latency_seconds", "histogram", "From a program's hello to its welcome (placement, waiting and preemption included).");
  admissionSeconds_.write(page, "raccel_admission_latency_seconds");

  auto count = [&](const char* kind) -> double {
    auto it = eventCounts_.find(kind);
    return it == eventCounts_.end() ? 0 : static_cast<double>(it->second);
  };
  for (auto [name, kind, help] : {std::tuple{"raccel_preemptions_total", "preempted", "Vaccels suspended to make room or by the operator."},
                                  std::tuple{"raccel_migrations_total", "migrated", "Vaccels moved to other blocks (compaction)."},
                                  std::tuple{"raccel_refusals_total", "refused", "Programs refused a vaccel."},
                                  std::tuple{"raccel_node_losses_total", "node-lost", "Netaccels lost (link closed or silent)."},
                                  std::tuple{"raccel_card_faults_total", "card-fault", "Cards or sandboxes that failed under a vaccel."},
                                  std::tuple{"raccel_recoveries_total", "recovering", "Vaccels rebuilt from their lineage after losing a card."},
                                  std::tuple{"raccel_recovery_failures_total", "recovery-failed",
                                             "Vaccels that could not be rebuilt after losing a card."}}) {
    page.family(name, "counter", help);
    page.sample(name, count(kind));
  }
  page.family("raccel_events_total", "counter", "Scheduler events (raccelctl events) by kind.");
  for (auto& [kind, c] : eventCounts_) page.sample("raccel_events_total", {{"kind", kind}}, static_cast<double>(c));
}

void Console::nodeMetrics(MetricsPage& page) const {
  // Nodes and their cards.
  page.family("raccel_node_up", "gauge", "1 while the netaccel is registered and heard from.");
  for (auto& node : s_.pool().nodes())
    if (!node.forgotten) page.sample("raccel_node_up", {{"node", node.name}}, node.online ? 1 : 0);
  page.family("raccel_node_draining", "gauge", "1 while the netaccel drains: online, but nothing new is placed there.");
  for (auto& node : s_.pool().nodes())
    if (!node.forgotten) page.sample("raccel_node_draining", {{"node", node.name}}, node.online && node.draining ? 1 : 0);
  page.family("raccel_node_heartbeat_age_seconds", "gauge", "Since the netaccel's last heartbeat.");
  page.family("raccel_node_contexts", "gauge", "Vaccel contexts open on the netaccel.");
  page.family("raccel_node_lane_frames_total", "counter",
              "Frames that crossed the netaccel's same-host lane (shared memory) instead of its link, by direction.");
  page.family("raccel_node_link_writes_total", "counter",
              "Writes started on the link to the netaccel (each carries every frame queued for it: far fewer than frames).");
  page.family("raccel_node_link_retained_bytes", "gauge",
              "Buffers the TLS link to the netaccel keeps for its next burst (given back once it idles for a second).");
  for (auto& [index, link] : s_.links_->byPoolNode()) {
    page.sample("raccel_node_heartbeat_age_seconds", {{"node", link->name}}, (s_.nowMs() - link->lastHeardMs) / 1e3);
    page.sample("raccel_node_contexts", {{"node", link->name}}, link->contexts);
    page.sample("raccel_node_lane_frames_total", {{"node", link->name}, {"direction", "to"}},
                static_cast<double>(link->connection->laneFramesSent()));
    page.sample("raccel_node_lane_frames_total", {{"node", link->name}, {"direction", "from"}},
                static_cast<double>(link->connection->laneFramesReceived()));
    page.sample("raccel_node_link_writes_total", {{"node", link->name}}, static_cast<double>(link->connection->writes()));
    page.sample("raccel_node_link_retained_bytes", {{"node", link->name}}, static_cast<double>(link->connection->retainedBytes()));
  }
  page.family("raccel_card_memory_bytes", "gauge", "Device memory of each card.");
  page.family("raccel_card_blocks", "gauge", "Blocks of each card.");
  for (const Card& c : s_.pool().cards()) {
    const Node& node = s_.pool().nodes()[c.node];
    if (node.forgotten) continue;
    Labels l = {{"node", node.name}, {"card", std::to_string(c.spec.index)}, {"kind", kindName(c.spec.kind)}};
    page.sample("raccel_card_memory_bytes", l, static_cast<double>(c.spec.memoryBytes));
    page.sample("raccel_card_blocks", l, c.blocks.count);
  }
  page.family("raccel_http_requests_total", "counter", "HTTP requests answered (this page included).");
  page.sample("raccel_http_requests_total", http_ ? static_cast<double>(http_->requestsServed()) : 0);
  page.family("raccel_http_event_streams", "gauge", "Open web console event streams.");
  page.sample("raccel_http_event_streams", http_ ? static_cast<double>(http_->streams()) : 0);
}

}  // namespace raccel::scheduler
