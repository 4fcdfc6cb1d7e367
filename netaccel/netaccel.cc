#include "netaccel/netaccel.h"

#include "common/metrics.h"

#include "common/limits.h"
#include "common/log.h"
#include <algorithm>
#include <cstdlib>
#include <filesystem>

#include "hal/backends.h"
#include "hal/cpu/cpu_device.h"
#include "schema/frame.capnp.h"
#include "schema/node.capnp.h"
#include "transport/wire_types.h"

namespace raccel::netaccel {
namespace {
constexpr size_t kInputHighWater = 64 * 1024 * 1024;

// A scheduler's name in a shared pool as it told us: checked as the scheduler's config
// checks it; anything else is no name (its contexts then wait the grace).
std::string poolNameOf(capnp::Text::Reader text) {
  std::string name(text.begin(), text.size());
  return limits::checkKeyName("name", name) ? name : std::string();
}
constexpr unsigned kMaxBackoffMs = 5000;
// Closed contexts whose final usage is still to be reported, at most.
constexpr size_t kMaxClosedPending = 65536;
}  // namespace

Result<std::vector<std::unique_ptr<hal::Device>>> openCards(const NetaccelConfig& config, std::vector<std::string>* notes) {
  std::vector<std::unique_ptr<hal::Device>> out;
  auto overridesOf = [](const CardConfig& c) {
    return hal::DeviceOverrides{c.kind, c.model, c.tflops, c.memoryBytes, c.noImages};
  };
  for (size_t i = 0; i < config.cards.size(); ++i) {
    const CardConfig& c = config.cards[i];
    if (c.backend == "cpu") {
      CardKind kind = c.kind.value_or(CardKind::cpu);
      out.push_back(hal::makeCpuDevice({kind, c.model.value_or(kind == CardKind::cpu ? "host-cpu" : std::string("sim-") + kindName(kind)),
                                        c.tflops.value_or(1), c.memoryBytes.value_or(1ull << 30), c.threads, c.paced, c.async}));
      continue;
    }
    auto device = hal::openDevice(c.backend, c.device.value_or(0), overridesOf(c));
    if (!device)
      return fail(device.error().code, "card " + std::to_string(i) + " (" + c.backend + " device " +
                                           std::to_string(c.device.value_or(0)) + "): " + device.error().message);
    out.push_back(std::move(*device));
  }
  for (auto& backend : config.discover) {
    auto report = hal::discover(backend);
    if (notes) notes->push_back(backend + ": " + report.note);
    for (auto& d : report.devices) {
      bool named = std::any_of(config.cards.begin(), config.cards.end(),
                               [&](const CardConfig& c) { return c.backend == backend && c.device == d.index; });
      if (named) continue;
      auto device = hal::openDevice(backend, d.index, {});
      if (!device) {
        if (notes) notes->push_back(backend + " device " + std::to_string(d.index) + " skipped: " + device.error().message);
        continue;
      }
      out.push_back(std::move(*device));
    }
  }
  if (out.empty()) out.push_back(hal::makeCpuDevice({CardKind::cpu, "host-cpu", 4, 1ull << 30, 0, false}));
  return out;
}

// One scheduler: its connection, its timers, and the contexts it owns.
struct Netaccel::Link {
  Netaccel* netaccel = nullptr;
  transport::Address address;
  transport::ConnectionPtr connection;
  bool registered = false;
  unsigned backoffMs = 100;
  uv_timer_t* reconnect = nullptr;
  uv_timer_t* heartbeat = nullptr;
  uv_timer_t* grace = nullptr;
  uv_timer_t* settle = nullptr;  // waits for kept contexts' queues to run dry before registering
  unsigned settleWaitedMs = 0;
  std::unordered_map<uint32_t, uint32_t> contexts;  // the scheduler's id -> the netaccel's
  // Contexts kept while it was away, not yet adopted: their replies, by the netaccel's id.
  std::unordered_map<uint32_t, std::vector<CardWorker::Output>> kept;
  // The final kernel time of its closed contexts, for its next heartbeat (its ids).
  std::vector<std::pair<uint32_t, uint64_t>> closedUsage;
  std::string poolName;  // its name in a shared pool, as it said when it took us in
  // Found in etcd (scheduler = etcd) under this name; retired once its lease ended (not
  // reconnected to until it advertises itself again).
  std::string foundAs;
  bool retired = false;
  std::string name() const { return address.toString(); }
  // A same-host lane handed over and not yet accepted: what this side will send through.
  std::shared_ptr<transport::LaneMapping> laneUp;
  bool laneOffered = false;  // on this connection (one offer a connection is honoured)
};

Netaccel::Netaccel(uv_loop_t* loop, NetaccelConfig config, std::vector<std::unique_ptr<hal::Device>> devices)
    : loop_(loop), config_(std::move(config)) {
  async_ = new uv_async_t;
  uv_async_init(loop_, async_, [](uv_async_t* a) { static_cast<Netaccel*>(a->data)->drainOutputs(); });
  async_->data = this;
  goneAsync_ = new uv_async_t;
  uv_async_init(loop_, goneAsync_, [](uv_async_t* a) { static_cast<Netaccel*>(a->data)->onPoolChange(); });
  goneAsync_->data = this;
  for (auto& address : schedulerAddresses(config_.scheduler).value_or(std::vector<transport::Address>{})) addLink(address);
  for (auto& d : devices) {
    CardWorker::Options options;
    options.halfLifeMs = config_.fairHalfLifeMs;
    options.queueDepth = config_.queueDepth;
    options.aloneQueueDepth = config_.aloneQueueDepth;
    options.sliceMs = config_.sliceMs;
    options.maxOpSeconds = config_.maxOpSeconds;
    options.label = "card " + std::to_string(workers_.size());
    // Backends that run guest code serve each tenant from a sandbox process.
    const std::string& backend = d->capabilities().backend;
    if (config_.sandbox.enabled && (backend == "opencl" || backend == "cuda" || backend == "xrt")) {
      options.sandbox = config_.sandbox;  // an allow-list: the node's key, $HOME and the rest are not on it
    }
    workers_.push_back(std::make_unique<CardWorker>(std::move(d), [a = async_] { uv_async_send(a); }, options));
  }
}

Netaccel::~Netaccel() { workers_.clear(); }

Netaccel::Link& Netaccel::addLink(const transport::Address& address) {
  auto link = std::make_unique<Link>();
  link->netaccel = this;
  link->address = address;
  for (uv_timer_t** t : {&link->reconnect, &link->heartbeat, &link->grace, &link->settle}) {
    *t = new uv_timer_t;
    uv_timer_init(loop_, *t);
    (*t)->data = link.get();
  }
  links_.push_back(std::move(link));
  return *links_.back();
}

Status Netaccel::start() {
  if (config_.httpListen != "off" && !config_.httpListen.empty()) {
    transport::HttpServer::Options options;
    options.listen = config_.httpListen;
    options.name = "netaccel-http";
    options.maxStreams = 0;
    http_ = std::make_unique<transport::HttpServer>(loop_, options, [this](const transport::HttpRequest& r) {
      if (r.path != "/metrics")
        return transport::HttpResponse::text(404, "no " + r.path + " here: raccel-netaccel serves /metrics only");
      if (r.method != "GET" && r.method != "HEAD") return transport::HttpResponse::methodNotAllowed(r, "GET, HEAD");
      return transport::HttpResponse::metrics(metricsText());
    });
    if (auto s = http_->start(); !s) return fail(s.error().code, "http_listen: " + s.error().message);
    RLOG_INFO("netaccel") << "/metrics on http://" << config_.httpListen.substr(0, config_.httpListen.rfind(':')) << ":"
                          << http_->port() << "/metrics";
  }
  for (size_t i = 0; i < workers_.size(); ++i) {
    auto& caps = workers_[i]->capabilities();
    RLOG_INFO("netaccel") << "card " << i << ": " << kindName(caps.kind) << " " << caps.model << " (" << caps.backend
                          << ") " << caps.tflops << " TFLOPS, " << formatBytes(caps.memoryBytes)
                          << (workers_[i]->sandboxed() ? "; each tenant in a sandbox process" : "");
  }
  for (auto& link : links_) connect(*link);
  return {};
}

std::string Netaccel::metricsText() {
  MetricsPage page;
  size_t registered = 0;
  for (auto& link : links_) registered += link->connection && link->registered;
  page.family("raccel_netaccel_connected", "gauge", "Schedulers this netaccel is registered with now.");
  page.sample("raccel_netaccel_connected", {{"node", config_.name}}, static_cast<double>(registered));
  page.family("raccel_netaccel_links_lost_total", "counter", "Times a link to a scheduler was lost.");
  page.sample("raccel_netaccel_links_lost_total", {{"node", config_.name}}, static_cast<double>(linksLost_));
  page.family("raccel_netaccel_instructions_received_total", "counter", "Instructions received from the scheduler.");
  page.sample("raccel_netaccel_instructions_received_total", {{"node", config_.name}}, static_cast<double>(instructionsReceived_));
  std::vector<uint32_t> contexts(workers_.size(), 0);
  for (auto& [id, context] : contexts_) ++contexts[context.card];
  std::vector<CardWorker::Stats> stats;
  for (auto& w : workers_) stats.push_back(w->stats());
  auto perCard = [&](const std::string& name, const char* type, const std::string& help, auto value) {
    page.family(name, type, help);
    for (size_t i = 0; i < workers_.size(); ++i) {
      auto& caps = workers_[i]->capabilities();
      page.sample(name, {{"node", config_.name}, {"card", std::to_string(i)}, {"kind", kindName(caps.kind)}, {"model", caps.model}},
                  static_cast<double>(value(i, caps)));
    }
  };
  perCard("raccel_card_busy_seconds_total", "counter", "Kernel time the card ran (its utilization is the rate of this).",
          [&](size_t i, auto&) { return stats[i].busyNs / 1e9; });
  perCard("raccel_card_instructions_total", "counter", "Instructions the card ran.", [&](size_t i, auto&) { return stats[i].instructions; });
  perCard("raccel_card_queued_instructions", "gauge", "Instructions waiting or running on the card.",
          [&](size_t i, auto&) { return stats[i].queued; });
  perCard("raccel_card_memory_bytes", "gauge", "Device memory the card offers.", [&](size_t, auto& caps) { return caps.memoryBytes; });
  perCard("raccel_card_memory_used_bytes", "gauge", "Device memory the open contexts' buffers hold.",
          [&](size_t i, auto&) { return stats[i].memoryUsed; });
  perCard("raccel_card_contexts", "gauge", "Vaccel contexts open on the card.", [&](size_t i, auto&) { return contexts[i]; });
  perCard("raccel_card_tflops", "gauge", "The card's TFLOPS as registered.", [&](size_t, auto& caps) { return caps.tflops; });
  perCard("raccel_sandbox_starts_total", "counter", "Sandbox processes given to tenants on the card.",
          [&](size_t i, auto&) { return stats[i].sandboxesStarted; });
  perCard("raccel_sandbox_restarts_total", "counter",
          "Tenant sandboxes lost (faulting kernel, crash, stall); the tenant's next instruction gets a new one.",
          [&](size_t i, auto&) { return stats[i].sandboxesLost; });
  return page.text();
}

void Netaccel::stop() {
  stopping_ = true;
  auto closeHandle = [](auto* h) {
    uv_close(reinterpret_cast<uv_handle_t*>(h), [](uv_handle_t* x) { delete reinterpret_cast<decltype(h)>(x); });
  };
  for (auto& link : links_) {
    if (link->connection) link->connection->close();
    for (uv_timer_t* t : {link->heartbeat, link->reconnect, link->grace, link->settle}) closeHandle(t);
  }
  if (http_) http_->stop();
  closeHandle(async_);
  {
    std::lock_guard lock(goneMutex_);
    goneAsyncOpen_ = false;
  }
  closeHandle(goneAsync_);
}

void Netaccel::schedulerGone(const std::string& name) {
  std::lock_guard lock(goneMutex_);
  if (!goneAsyncOpen_ || gone_.size() >= 4096) return;  // stopping, or a flood: the grace still bounds it
  gone_.push_back(name);
  uv_async_send(goneAsync_);
}

void Netaccel::schedulerFound(const std::string& name, const std::string& address) {
  std::lock_guard lock(goneMutex_);
  if (!goneAsyncOpen_ || found_.size() >= 4096) return;  // stopping, or a flood
  found_.push_back({name, address});
  uv_async_send(goneAsync_);
}

void Netaccel::onPoolChange() {
  std::vector<std::pair<std::string, std::string>> found;
  {
    std::lock_guard lock(goneMutex_);
    found.swap(found_);
  }
  for (auto& [name, text] : found) {
    if (stopping_) break;
    auto address = transport::parseAddress(text);
    if (!address || address->isUnix) continue;  // checked by the watch already
    auto known = std::find_if(links_.begin(), links_.end(), [&](auto& l) { return l->address.toString() == address->toString(); });
    if (known != links_.end()) {
      Link& link = **known;
      const bool wasRetired = link.retired;
      link.retired = false;
      link.foundAs = name;
      if (wasRetired && !link.connection && !uv_is_active(reinterpret_cast<uv_handle_t*>(link.reconnect))) connect(link);
      continue;
    }
    if (links_.size() >= kMaxSchedulerLinks) {
      RLOG_WARN("netaccel") << "scheduler '" << limits::clip(name, 64) << "' at " << address->toString()
                            << " found in etcd, but this netaccel has " << links_.size() << " links already; not linked";
      continue;
    }
    RLOG_INFO("netaccel") << "linking to scheduler '" << name << "' at " << address->toString() << " (found in etcd)";
    Link& link = addLink(*address);
    link.foundAs = name;
    connect(link);
  }
  dropKeptOfGone();
}

void Netaccel::dropKeptOfGone() {
  std::vector<std::string> gone;
  {
    std::lock_guard lock(goneMutex_);
    gone.swap(gone_);
  }
  for (auto& name : gone)
    for (auto& link : links_) {
      if (link->foundAs == name && !link->retired) {
        // Found in etcd, and its lease ended: not reconnected to until it advertises
        // itself again (a live link stays while it holds).
        link->retired = true;
        uv_timer_stop(link->reconnect);
        if (!link->connection)
          RLOG_INFO("netaccel") << "scheduler '" << name << "' at " << link->name() << " left the pool; not reconnecting";
      }
      if (link->poolName == name && !link->connection && !link->kept.empty())
        dropKept(*link, "its etcd lease ended (its blocks are back in the pool)");
    }
}

void Netaccel::connect(Link& link) {
  if (stopping_) return;
  transport::connect(loop_, link.address, wire::DEFAULT_MAX_FRAME_BYTES, [this, &link](Result<transport::ConnectionPtr> r) {
    if (stopping_) {
      if (r) (*r)->close();
      return;
    }
    if (!r) {
      RLOG_WARN("netaccel") << r.error().message << "; retrying in " << link.backoffMs << " ms";
      scheduleReconnect(link);
      return;
    }
    onConnected(link, *r);
  });
}

void Netaccel::scheduleReconnect(Link& link) {
  if (stopping_) return;
  if (link.retired) {
    RLOG_INFO("netaccel") << "scheduler '" << link.foundAs << "' at " << link.name() << " left the pool; not reconnecting";
    return;
  }
  uv_timer_start(link.reconnect, [](uv_timer_t* t) {
    auto* l = static_cast<Link*>(t->data);
    l->netaccel->connect(*l);
  }, link.backoffMs, 0);
  link.backoffMs = std::min(link.backoffMs * 2, kMaxBackoffMs);
}

void Netaccel::onConnected(Link& link, transport::ConnectionPtr connection) {
  link.connection = std::move(connection);
  transport::Connection::Callbacks cb;
  cb.onFrame = [this, &link](transport::Connection&, const transport::FrameHeader& h, transport::Body body) {
    onFrame(link, h, std::move(body));
  };
  cb.onOversized = [&link](transport::Connection&, const transport::FrameHeader& h) {
    RLOG_ERROR("netaccel") << "scheduler " << link.name() << " sent a frame of " << h.length << " bytes on channel "
                           << h.channel << ", over the limit; skipped";
  };
  cb.onBatchEnd = [this](transport::Connection&) {
    for (auto& w : workers_) w->submit();
    checkInputPressure();
  };
  cb.onClose = [this, &link](transport::Connection&, bool) { onLinkClosed(link); };
  link.connection->setCallbacks(cb);
  if (tls_) link.connection->useTls(tls_);
  link.connection->start();
  if (inputPaused_) link.connection->pauseReading();
  link.settleWaitedMs = 0;
  sendRegister(link);
}

void Netaccel::checkInputPressure() {
  size_t queued = 0;
  for (auto& w : workers_) queued += w->queuedBytes();
  bool pause = inputPaused_ ? queued >= kInputHighWater / 2 : queued > kInputHighWater;
  if (pause == inputPaused_) return;
  inputPaused_ = pause;
  for (auto& link : links_) {
    if (!link->connection) continue;
    if (pause) link->connection->pauseReading();
    else link->connection->resumeReading();
  }
}

void Netaccel::sendRegister(Link& link) {
  if (!link.connection) return;
  // Kept contexts are reported with their buffers once their queued work has run (so
  // the list is complete); that takes as long as the longest queued kernel, up to 10 s.
  if (!link.kept.empty() && link.settleWaitedMs < 10000) {
    size_t queued = 0;
    for (auto& w : workers_) queued += w->queuedInstructions();
    if (queued > 0) {
      link.settleWaitedMs += 10;
      uv_timer_start(link.settle, [](uv_timer_t* t) {
        auto* l = static_cast<Link*>(t->data);
        l->netaccel->sendRegister(*l);
      }, 10, 0);
      return;
    }
  }
  capnp::MallocMessageBuilder m;
  auto reg = m.initRoot<wire::NodeMessage>().initRegister();
  reg.setVersionMajor(wire::PROTOCOL_MAJOR);
  reg.setVersionMinor(wire::PROTOCOL_MINOR);
  reg.setName(config_.name);
  reg.setHostCpuMilli(config_.hostCpuMilli);
  reg.setHostMemoryMib(config_.hostMemoryMib);
  auto cards = reg.initCards(workers_.size());
  for (size_t i = 0; i < workers_.size(); ++i) {
    auto& caps = workers_[i]->capabilities();
    auto c = cards[i];
    c.setIndex(static_cast<uint32_t>(i));
    c.setKind(transport::toWire(caps.kind));
    c.setModel(caps.model);
    c.setTflops(caps.tflops);
    c.setMemoryBytes(caps.memoryBytes);
    c.setBackend(caps.backend);
    c.setComputeUnits(caps.computeUnits);
    c.setMaxWorkGroupSize(caps.maxWorkGroupSize);
    c.setLocalMemBytes(caps.localMemBytes);
    c.setOpenclExtensions(caps.openclExtensions);
    c.setDoubleFpConfig(caps.doubleFpConfig);
    transport::setImageLimits(c.initImages(), caps.images);
    auto kinds = c.initProgramKinds(caps.programKinds.size());
    for (size_t k = 0; k < caps.programKinds.size(); ++k) kinds.set(k, transport::toWire(caps.programKinds[k]));
  }
  auto held = reg.initContexts(link.kept.size());
  size_t i = 0;
  for (auto& [ours, waiting] : link.kept) {
    const Context& context = contexts_.at(ours);
    auto h = held[i++];
    h.setContext(context.theirs);
    h.setCard(static_cast<uint32_t>(context.card));
    h.setLastSequence(context.lastGuestSequence);
    auto buffers = workers_[context.card]->buffersOf(ours);
    auto list = h.initBuffers(buffers.size());
    for (size_t b = 0; b < buffers.size(); ++b) {
      list[b].setHandle(buffers[b].first);
      list[b].setBytes(buffers[b].second);
    }
  }
  link.connection->send(transport::kControlChannel, 0, m);
  RLOG_INFO("netaccel") << "connected to scheduler at " << link.name() << "; registering as '" << config_.name << "' with "
                        << workers_.size() << " card(s)"
                        << (link.kept.empty() ? "" : " and " + std::to_string(link.kept.size()) + " kept context(s)");
}

void Netaccel::onLinkClosed(Link& link) {
  link.connection.reset();
  link.laneUp.reset();
  link.laneOffered = false;
  uv_timer_stop(link.heartbeat);
  uv_timer_stop(link.settle);
  if (stopping_) {
    closeContextsOf(link);
    return;
  }
  ++linksLost_;
  // Its open contexts are kept (not adopted) until the scheduler comes back for them.
  if (config_.contextGraceMs == 0) {
    closeContextsOf(link);
  } else if (!link.contexts.empty()) {
    for (auto& [theirs, ours] : link.contexts) link.kept[ours];
    setReplyLanes(link, nullptr);  // their replies wait here now, not in the lost link's lane
    if (!uv_is_active(reinterpret_cast<uv_handle_t*>(link.grace))) {
      uv_timer_start(link.grace, [](uv_timer_t* t) {
        auto* l = static_cast<Link*>(t->data);
        l->netaccel->graceOver(*l);
      }, config_.contextGraceMs, 0);
      RLOG_INFO("netaccel") << "keeping " << link.contexts.size() << " context(s) of scheduler " << link.name() << " for "
                            << config_.contextGraceMs << " ms for it to come back";
    }
    if (!link.poolName.empty() && live_ && live_(link.poolName) == false)
      dropKept(link, "it holds no etcd lease (its blocks are back in the pool)");
  }
  if (link.registered) {
    RLOG_WARN("netaccel") << "lost the scheduler at " << link.name() << "; reconnecting";
    link.backoffMs = 100;
  }
  link.registered = false;
  scheduleReconnect(link);
}

void Netaccel::graceOver(Link& link) {
  dropKept(link, "it did not come back within " + std::to_string(config_.contextGraceMs) + " ms");
}

void Netaccel::dropKept(Link& link, const std::string& why) {
  if (link.kept.empty()) return;
  RLOG_WARN("netaccel") << "dropping the " << link.kept.size() << " context(s) (and their buffers) kept for the scheduler at "
                        << link.name() << (link.poolName.empty() ? "" : " ('" + link.poolName + "')") << ": " << why;
  uv_timer_stop(link.grace);
  std::vector<uint32_t> kept;
  for (auto& [ours, waiting] : link.kept) kept.push_back(ours);
  for (uint32_t ours : kept) closeContext(ours);
  for (auto& w : workers_) w->submit();
}

void Netaccel::closeContext(uint32_t ours) {
  auto it = contexts_.find(ours);
  if (it == contexts_.end()) return;
  Link& link = *it->second.link;
  workers_[it->second.card]->closeContext(ours);
  if (closed_.size() >= kMaxClosedPending) closed_.erase(closed_.begin());  // bounded: that usage is lost
  closed_[ours] = Closed{&link, it->second.theirs};
  link.contexts.erase(it->second.theirs);
  link.kept.erase(ours);
  contexts_.erase(it);
}

void Netaccel::closeContextsOf(Link& link) {
  std::vector<uint32_t> ours;
  for (auto& [theirs, id] : link.contexts) ours.push_back(id);
  for (uint32_t id : ours) closeContext(id);
  for (auto& w : workers_) w->submit();
  link.kept.clear();
  uv_timer_stop(link.grace);
}

void Netaccel::onFrame(Link& link, const transport::FrameHeader& header, transport::Body body) {
  if (header.channel == transport::kControlChannel) {
    onControl(link, std::move(body));
    return;
  }
  auto theirs = link.contexts.find(header.channel);
  if (theirs == link.contexts.end()) {
    RLOG_DEBUG("netaccel") << "instruction for unknown context " << header.channel << " of " << link.name() << " dropped";
    return;
  }
  Context& context = contexts_.at(theirs->second);
  if (header.sequence < (1ull << 63)) context.lastGuestSequence = header.sequence;  // a guest's, not the scheduler's own
  workers_[context.card]->enqueue(theirs->second, header.sequence, std::move(body));
  ++instructionsReceived_;
}

void Netaccel::openContext(Link& link, wire::OpenContext::Reader o) {
  if (o.getCard() >= workers_.size()) {
    RLOG_ERROR("netaccel") << "scheduler " << link.name() << " opened context " << o.getContext() << " on card "
                           << o.getCard() << ", which does not exist";
    return;
  }
  // An id it uses again replaces its old context there (whose buffers are freed).
  if (auto old = link.contexts.find(o.getContext()); old != link.contexts.end()) closeContext(old->second);
  if (nextContext_ == UINT32_MAX) {
    RLOG_ERROR("netaccel") << "context ids are spent (2^32 - 1 opened since start); restart this netaccel";
    return;
  }
  uint32_t ours = nextContext_++;
  contexts_[ours] = Context{&link, o.getContext(), o.getCard(), 0};
  link.contexts[o.getContext()] = ours;
  workers_[o.getCard()]->openContext(ours, o.getMemoryQuota(), o.getLabel(), o.getBlocks(), o.getTenant(), o.getPriority(),
                                     link.connection ? link.connection->outLane() : nullptr);
  RLOG_DEBUG("netaccel") << "context " << ours << " (" << o.getLabel().cStr() << ", " << link.name() << " #"
                         << o.getContext() << ") on card " << o.getCard();
}

void Netaccel::onControl(Link& link, transport::Body body) {
  auto status = transport::decodeGuard([&] {
    transport::MessageIn in(std::move(body));
    auto msg = in.root<wire::SchedulerMessage>();
    switch (msg.which()) {
      case wire::SchedulerMessage::REGISTERED:
        registered(link, msg.getRegistered());
        return;
      case wire::SchedulerMessage::OPEN_CONTEXT:
        openContext(link, msg.getOpenContext());
        return;
      case wire::SchedulerMessage::POISON: {
        auto p = msg.getPoison();
        auto it = link.contexts.find(p.getContext());
        if (it != link.contexts.end())
          workers_[contexts_.at(it->second).card]->poison(it->second, p.getHandle(), p.getSequence(),
                                                          transport::fromWire(p.getError().getCode()), p.getError().getMessage());
        return;
      }
      case wire::SchedulerMessage::CLOSE_CONTEXT: {
        auto it = link.contexts.find(msg.getCloseContext());
        if (it == link.contexts.end()) return;
        size_t card = contexts_.at(it->second).card;
        closeContext(it->second);
        workers_[card]->submit();
        return;
      }
      case wire::SchedulerMessage::ADOPT_CONTEXT:
        adoptContext(link, msg.getAdoptContext());
        return;
      case wire::SchedulerMessage::LANE_OFFER:
        takeLane(link, msg.getLaneOffer().getPath(), msg.getLaneOffer().getToken());
        return;
      case wire::SchedulerMessage::LANE_ACCEPTED:
        if (link.laneUp) {
          link.connection->sendLane(std::move(link.laneUp));
          setReplyLanes(link, link.connection->outLane());  // contexts opened meanwhile, too
          RLOG_INFO("netaccel") << "the scheduler at " << link.name() << " took a same-host lane: big frames skip the node link";
        }
        return;
    }
    RLOG_WARN("netaccel") << "unknown control message from the scheduler at " << link.name() << " ignored";
  });
  if (!status)
    RLOG_ERROR("netaccel") << "bad control message from the scheduler at " << link.name() << ": " << status.error().message;
}

// The scheduler's answer to this netaccel's registration: refused (the link closes and
// is tried again), or accepted with its heartbeat period and the cards it will not use.
void Netaccel::registered(Link& link, wire::Registered::Reader r) {
  if (!r.getAccepted()) {
    RLOG_ERROR("netaccel") << "scheduler " << link.name() << " refused registration: " << r.getError().getMessage().cStr()
                           << "; retrying in " << link.backoffMs << " ms";
    link.connection->close();
    return;
  }
  link.registered = true;
  link.backoffMs = 100;
  link.poolName = poolNameOf(r.getPoolName());
  // Kept contexts: the scheduler adopts or closes each right after this.
  uv_timer_stop(link.grace);
  unsigned hb = r.getHeartbeatMs() ? r.getHeartbeatMs() : config_.heartbeatMs;
  uv_timer_start(link.heartbeat, [](uv_timer_t* t) {
    auto* l = static_cast<Link*>(t->data);
    l->netaccel->sendHeartbeat(*l);
  }, hb, hb);
  RLOG_INFO("netaccel") << "registered with the scheduler at " << link.name() << "; heartbeat every " << hb << " ms";
  size_t told = 0;
  for (auto unused : r.getUnusedCards())
    if (++told <= workers_.size())  // the scheduler's words, bounded: at most one per card
      RLOG_WARN("netaccel") << "card " << unused.getCard() << " serves no work for " << link.name() << ": "
                            << limits::clip(unused.getWhy(), 512);
}

// A context kept over a lost link, taken back by the scheduler: the replies it made
// meanwhile go now.
void Netaccel::adoptContext(Link& link, uint32_t context) {
  auto theirs = link.contexts.find(context);
  if (theirs == link.contexts.end()) return;
  auto it = link.kept.find(theirs->second);
  if (it == link.kept.end()) return;
  size_t waiting = it->second.size();
  for (auto& o : it->second) link.connection->sendBody(theirs->first, o.sequence, std::move(o.body));
  RLOG_INFO("netaccel") << "context " << theirs->first << " adopted by the scheduler at " << link.name() << "; " << waiting
                        << " waiting repl" << (waiting == 1 ? "y" : "ies") << " sent";
  link.kept.erase(it);
}

void Netaccel::setReplyLanes(Link& link, const std::shared_ptr<transport::LaneOut>& lane) {
  for (auto& [theirs, ours] : link.contexts) workers_[contexts_.at(ours).card]->setReplyLane(ours, lane);
  for (auto& w : workers_) w->submit();
}

void Netaccel::takeLane(Link& link, capnp::Text::Reader path, capnp::Data::Reader token) {
  if (!config_.sameHostLane || !link.connection || std::exchange(link.laneOffered, true)) return;
  auto lane = transport::handOverLane(std::string(path.cStr(), path.size()),
                                     std::string(reinterpret_cast<const char*>(token.begin()), token.size()));
  if (!lane) {
    // Another host's scheduler (its socket is not here), a malformed offer, or no memfds:
    // the node link alone.
    RLOG_INFO("netaccel") << "no same-host lane with the scheduler at " << link.name() << ": " << lane.error().message;
    return;
  }
  // What the scheduler sends may come through it from now on; what this side sends, once
  // the scheduler says it holds the lane (laneAccepted).
  link.connection->receiveLane(lane->down, true);
  link.laneUp = lane->up;
}

void Netaccel::sendHeartbeat(Link& link) {
  if (!link.connection) return;
  link.connection->trimIdle();  // a link idle since the last heartbeat gives its burst buffers back
  // Once a heartbeat period for the whole netaccel, however many schedulers it serves:
  // at the first connected link's heartbeat, with what every link has moved.
  auto first = std::find_if(links_.begin(), links_.end(), [](const auto& l) { return l->connection != nullptr; });
  if (first != links_.end() && first->get() == &link) {
    uint64_t moved = 0;
    for (auto& l : links_)
      if (l->connection) moved += l->connection->moved();
    if (freeMemory_.tick(moved)) RLOG_DEBUG("netaccel") << "the links went quiet: free memory given back";
  }
  capnp::MallocMessageBuilder m;
  auto hb = m.initRoot<wire::NodeMessage>().initHeartbeat();
  hb.setContexts(static_cast<uint32_t>(link.contexts.size()));
  uint64_t queued = 0;
  for (auto& w : workers_) queued += w->queuedInstructions();
  hb.setQueuedInstructions(queued);
  // The kernel time of this scheduler's contexts only, under its ids. The cards report
  // a closed context's final time once: it goes to the scheduler that owned it.
  std::vector<std::pair<uint32_t, uint64_t>> usage;
  for (auto& w : workers_)
    for (auto& [ours, ns] : w->kernelTimes()) {
      if (auto open = contexts_.find(ours); open != contexts_.end()) {
        if (open->second.link == &link) usage.push_back({open->second.theirs, ns});
      } else if (auto gone = closed_.find(ours); gone != closed_.end()) {
        auto& pending = gone->second.link->closedUsage;
        if (pending.size() < kMaxClosedPending) pending.push_back({gone->second.theirs, ns});
        closed_.erase(gone);
      }
    }
  usage.insert(usage.end(), link.closedUsage.begin(), link.closedUsage.end());
  link.closedUsage.clear();
  auto list = hb.initUsage(usage.size());
  for (size_t i = 0; i < usage.size(); ++i) {
    list[i].setContext(usage[i].first);
    list[i].setKernelNs(usage[i].second);
  }
  link.connection->send(transport::kControlChannel, 0, m);
}

void Netaccel::drainOutputs() {
  transport::Connection::Cork cork;  // the batch as one write to each scheduler
  // Faults first: each scheduler hears of a lost sandbox (naming its own contexts)
  // before the errors it caused.
  std::vector<CardWorker::Fault> faults;
  for (size_t card = 0; card < workers_.size(); ++card) {
    faults.clear();
    workers_[card]->drainFaults(faults);
    for (auto& f : faults)
      for (auto& link : links_) {
        std::vector<uint32_t> theirs;
        for (uint32_t ours : f.contexts)
          if (auto it = contexts_.find(ours); it != contexts_.end() && it->second.link == link.get())
            theirs.push_back(it->second.theirs);
        if (!link->connection || theirs.empty()) continue;
        capnp::MallocMessageBuilder m;
        auto fault = m.initRoot<wire::NodeMessage>().initFault();
        fault.setCard(static_cast<uint32_t>(card));
        fault.setMessage(f.message);
        fault.setCause(f.notItsOwn ? wire::FaultCause::NOT_ITS_OWN : wire::FaultCause::ITS_WORK);
        auto list = fault.initContexts(static_cast<unsigned>(theirs.size()));
        for (size_t i = 0; i < theirs.size(); ++i) list.set(static_cast<unsigned>(i), theirs[i]);
        link->connection->send(transport::kControlChannel, 0, m);
      }
  }
  outputs_.clear();
  for (auto& w : workers_) w->drain(outputs_);
  for (auto& o : outputs_) {
    auto it = contexts_.find(o.context);
    if (it == contexts_.end()) continue;  // closed since
    Link& link = *it->second.link;
    if (auto kept = link.kept.find(o.context); kept != link.kept.end()) kept->second.push_back(std::move(o));  // until adopted
    else if (link.connection) link.connection->sendBody(it->second.theirs, o.sequence, std::move(o.body));
  }
  outputs_.clear();
  checkInputPressure();
}

}  // namespace raccel::netaccel
