#include "netaccel/netaccel.h"

#include "common/metrics.h"

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
constexpr unsigned kMaxBackoffMs = 5000;
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

Netaccel::Netaccel(uv_loop_t* loop, NetaccelConfig config, std::vector<std::unique_ptr<hal::Device>> devices)
    : loop_(loop), config_(std::move(config)) {
  schedulerAddress_ = transport::parseAddress(config_.scheduler).value_or(transport::Address{});
  async_ = new uv_async_t;
  uv_async_init(loop_, async_, [](uv_async_t* a) { static_cast<Netaccel*>(a->data)->drainOutputs(); });
  async_->data = this;
  heartbeat_ = new uv_timer_t;
  uv_timer_init(loop_, heartbeat_);
  heartbeat_->data = this;
  reconnect_ = new uv_timer_t;
  uv_timer_init(loop_, reconnect_);
  reconnect_->data = this;
  grace_ = new uv_timer_t;
  uv_timer_init(loop_, grace_);
  grace_->data = this;
  settle_ = new uv_timer_t;
  uv_timer_init(loop_, settle_);
  settle_->data = this;
  for (auto& d : devices) {
    CardWorker::Options options;
    options.halfLifeMs = config_.fairHalfLifeMs;
    options.queueDepth = config_.queueDepth;
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
                          << ") " << caps.tflops << " TFLOPS, " << (caps.memoryBytes >> 20) << " MiB"
                          << (workers_[i]->sandboxed() ? "; each tenant in a sandbox process" : "");
  }
  connect();
  return {};
}

std::string Netaccel::metricsText() {
  MetricsPage page;
  page.family("raccel_netaccel_connected", "gauge", "1 while registered with the scheduler.");
  page.sample("raccel_netaccel_connected", {{"node", config_.name}}, link_ && registered_ ? 1 : 0);
  page.family("raccel_netaccel_links_lost_total", "counter", "Times the link to the scheduler was lost.");
  page.sample("raccel_netaccel_links_lost_total", {{"node", config_.name}}, static_cast<double>(linksLost_));
  page.family("raccel_netaccel_instructions_received_total", "counter", "Instructions received from the scheduler.");
  page.sample("raccel_netaccel_instructions_received_total", {{"node", config_.name}}, static_cast<double>(instructionsReceived_));
  std::vector<uint32_t> contexts(workers_.size(), 0);
  for (auto& [context, card] : contextCard_) ++contexts[card];
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
  if (link_) link_->close();
  auto closeHandle = [](auto* h) {
    uv_close(reinterpret_cast<uv_handle_t*>(h), [](uv_handle_t* x) { delete reinterpret_cast<decltype(h)>(x); });
  };
  if (http_) http_->stop();
  closeHandle(heartbeat_);
  closeHandle(reconnect_);
  closeHandle(grace_);
  closeHandle(settle_);
  closeHandle(async_);
}

void Netaccel::connect() {
  if (stopping_) return;
  transport::connect(loop_, schedulerAddress_, wire::DEFAULT_MAX_FRAME_BYTES, [this](Result<transport::ConnectionPtr> r) {
    if (stopping_) {
      if (r) (*r)->close();
      return;
    }
    if (!r) {
      RLOG_WARN("netaccel") << r.error().message << "; retrying in " << backoffMs_ << " ms";
      scheduleReconnect();
      return;
    }
    onConnected(*r);
  });
}

void Netaccel::scheduleReconnect() {
  if (stopping_) return;
  uv_timer_start(reconnect_, [](uv_timer_t* t) { static_cast<Netaccel*>(t->data)->connect(); }, backoffMs_, 0);
  backoffMs_ = std::min(backoffMs_ * 2, kMaxBackoffMs);
}

void Netaccel::onConnected(transport::ConnectionPtr link) {
  link_ = std::move(link);
  transport::Connection::Callbacks cb;
  cb.onFrame = [this](transport::Connection&, const transport::FrameHeader& h, transport::Body body) {
    onFrame(h, std::move(body));
  };
  cb.onOversized = [](transport::Connection&, const transport::FrameHeader& h) {
    RLOG_ERROR("netaccel") << "scheduler sent a frame of " << h.length << " bytes on channel " << h.channel
                           << ", over the limit; skipped";
  };
  cb.onBatchEnd = [this](transport::Connection& c) {
    size_t queued = 0;
    for (auto& w : workers_) {
      w->submit();
      queued += w->queuedBytes();
    }
    if (queued > kInputHighWater && !inputPaused_) {
      inputPaused_ = true;
      c.pauseReading();
    }
  };
  cb.onClose = [this](transport::Connection&, bool) { onLinkClosed(); };
  link_->setCallbacks(cb);
  if (tls_) link_->useTls(tls_);
  link_->start();
  settleWaitedMs_ = 0;
  sendRegister();
}

void Netaccel::sendRegister() {
  if (!link_) return;
  // Kept contexts are reported with their buffers once their queued work has run (so
  // the list is complete); that takes as long as the longest queued kernel, up to 10 s.
  if (!kept_.empty() && settleWaitedMs_ < 10000) {
    size_t queued = 0;
    for (auto& w : workers_) queued += w->queuedInstructions();
    if (queued > 0) {
      settleWaitedMs_ += 10;
      uv_timer_start(settle_, [](uv_timer_t* t) { static_cast<Netaccel*>(t->data)->sendRegister(); }, 10, 0);
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
  auto held = reg.initContexts(kept_.size());
  size_t i = 0;
  for (auto& [ctx, waiting] : kept_) {
    auto h = held[i++];
    size_t card = contextCard_.at(ctx);
    h.setContext(ctx);
    h.setCard(static_cast<uint32_t>(card));
    h.setLastSequence(lastGuestSequence_[ctx]);
    auto buffers = workers_[card]->buffersOf(ctx);
    auto list = h.initBuffers(buffers.size());
    for (size_t b = 0; b < buffers.size(); ++b) {
      list[b].setHandle(buffers[b].first);
      list[b].setBytes(buffers[b].second);
    }
  }
  link_->send(transport::kControlChannel, 0, m);
  RLOG_INFO("netaccel") << "connected to scheduler at " << schedulerAddress_.toString() << "; registering as '"
                        << config_.name << "' with " << workers_.size() << " card(s)"
                        << (kept_.empty() ? "" : " and " + std::to_string(kept_.size()) + " kept context(s)");
}

void Netaccel::onLinkClosed() {
  link_.reset();
  uv_timer_stop(heartbeat_);
  uv_timer_stop(settle_);
  inputPaused_ = false;
  if (stopping_) {
    closeAllContexts();
    return;
  }
  ++linksLost_;
  // Every open context is kept (not adopted) until the scheduler comes back for it.
  if (config_.contextGraceMs == 0) {
    closeAllContexts();
  } else if (!contextCard_.empty()) {
    for (auto& [ctx, card] : contextCard_) kept_[ctx];
    if (!uv_is_active(reinterpret_cast<uv_handle_t*>(grace_))) {
      uv_timer_start(grace_, [](uv_timer_t* t) { static_cast<Netaccel*>(t->data)->graceOver(); }, config_.contextGraceMs, 0);
      RLOG_INFO("netaccel") << "keeping " << contextCard_.size() << " context(s) for " << config_.contextGraceMs
                            << " ms for the scheduler to come back";
    }
  }
  if (registered_) {
    RLOG_WARN("netaccel") << "lost the scheduler; reconnecting";
    backoffMs_ = 100;
  }
  registered_ = false;
  scheduleReconnect();
}

void Netaccel::graceOver() {
  if (kept_.empty()) return;
  RLOG_WARN("netaccel") << "the scheduler did not come back for " << kept_.size() << " context(s) within "
                        << config_.contextGraceMs << " ms; dropping them and their buffers";
  for (auto& [ctx, waiting] : kept_) {
    auto it = contextCard_.find(ctx);
    if (it == contextCard_.end()) continue;
    workers_[it->second]->closeContext(ctx);
    contextCard_.erase(it);
    lastGuestSequence_.erase(ctx);
  }
  for (auto& w : workers_) w->submit();
  kept_.clear();
}

void Netaccel::closeAllContexts() {
  for (auto& [ctx, card] : contextCard_) workers_[card]->closeContext(ctx);
  for (auto& w : workers_) w->submit();
  contextCard_.clear();
  lastGuestSequence_.clear();
  kept_.clear();
  uv_timer_stop(grace_);
}

void Netaccel::onFrame(const transport::FrameHeader& header, transport::Body body) {
  if (header.channel == transport::kControlChannel) {
    onControl(std::move(body));
    return;
  }
  auto it = contextCard_.find(header.channel);
  if (it == contextCard_.end()) {
    RLOG_DEBUG("netaccel") << "instruction for unknown context " << header.channel << " dropped";
    return;
  }
  if (header.sequence < (1ull << 63)) lastGuestSequence_[header.channel] = header.sequence;  // a guest's, not the scheduler's own
  workers_[it->second]->enqueue(header.channel, header.sequence, std::move(body));
  ++instructionsReceived_;
}

void Netaccel::onControl(transport::Body body) {
  auto status = transport::decodeGuard([&] {
    transport::MessageIn in(std::move(body));
    auto msg = in.root<wire::SchedulerMessage>();
    switch (msg.which()) {
      case wire::SchedulerMessage::REGISTERED: {
        auto r = msg.getRegistered();
        if (!r.getAccepted()) {
          RLOG_ERROR("netaccel") << "scheduler refused registration: " << r.getError().getMessage().cStr()
                                 << "; retrying in " << backoffMs_ << " ms";
          link_->close();
          return;
        }
        registered_ = true;
        backoffMs_ = 100;
        // Kept contexts: the scheduler adopts or closes each right after this.
        uv_timer_stop(grace_);
        unsigned hb = r.getHeartbeatMs() ? r.getHeartbeatMs() : config_.heartbeatMs;
        uv_timer_start(heartbeat_, [](uv_timer_t* t) { static_cast<Netaccel*>(t->data)->sendHeartbeat(); }, hb, hb);
        RLOG_INFO("netaccel") << "registered with the scheduler; heartbeat every " << hb << " ms";
        return;
      }
      case wire::SchedulerMessage::OPEN_CONTEXT: {
        auto o = msg.getOpenContext();
        if (o.getCard() >= workers_.size()) {
          RLOG_ERROR("netaccel") << "scheduler opened context " << o.getContext() << " on card " << o.getCard()
                                 << ", which does not exist";
          return;
        }
        contextCard_[o.getContext()] = o.getCard();
        workers_[o.getCard()]->openContext(o.getContext(), o.getMemoryQuota(), o.getLabel(), o.getBlocks(), o.getTenant(),
                                           o.getPriority());
        RLOG_DEBUG("netaccel") << "context " << o.getContext() << " (" << o.getLabel().cStr() << ") on card " << o.getCard();
        return;
      }
      case wire::SchedulerMessage::POISON: {
        auto p = msg.getPoison();
        auto it = contextCard_.find(p.getContext());
        if (it != contextCard_.end())
          workers_[it->second]->poison(p.getContext(), p.getHandle(), p.getSequence(), transport::fromWire(p.getError().getCode()),
                                       p.getError().getMessage());
        return;
      }
      case wire::SchedulerMessage::CLOSE_CONTEXT: {
        auto it = contextCard_.find(msg.getCloseContext());
        if (it == contextCard_.end()) return;
        workers_[it->second]->closeContext(it->first);
        workers_[it->second]->submit();
        kept_.erase(it->first);
        lastGuestSequence_.erase(it->first);
        contextCard_.erase(it);
        return;
      }
      case wire::SchedulerMessage::ADOPT_CONTEXT: {
        auto it = kept_.find(msg.getAdoptContext());
        if (it == kept_.end()) return;
        size_t waiting = it->second.size();
        for (auto& o : it->second) link_->sendBody(o.context, o.sequence, std::move(o.body));
        RLOG_INFO("netaccel") << "context " << it->first << " adopted by the scheduler; " << waiting << " waiting repl"
                              << (waiting == 1 ? "y" : "ies") << " sent";
        kept_.erase(it);
        return;
      }
    }
    RLOG_WARN("netaccel") << "unknown control message from the scheduler ignored";
  });
  if (!status) RLOG_ERROR("netaccel") << "bad control message from the scheduler: " << status.error().message;
}

void Netaccel::sendHeartbeat() {
  if (!link_) return;
  capnp::MallocMessageBuilder m;
  auto hb = m.initRoot<wire::NodeMessage>().initHeartbeat();
  hb.setContexts(static_cast<uint32_t>(contextCard_.size()));
  uint64_t queued = 0;
  for (auto& w : workers_) queued += w->queuedInstructions();
  hb.setQueuedInstructions(queued);
  std::vector<std::pair<uint32_t, uint64_t>> usage;
  for (auto& w : workers_)
    for (auto& u : w->kernelTimes()) usage.push_back(u);
  auto list = hb.initUsage(usage.size());
  for (size_t i = 0; i < usage.size(); ++i) {
    list[i].setContext(usage[i].first);
    list[i].setKernelNs(usage[i].second);
  }
  link_->send(transport::kControlChannel, 0, m);
}

void Netaccel::drainOutputs() {
  // Faults first: the scheduler hears of a lost sandbox before the errors it caused.
  std::vector<CardWorker::Fault> faults;
  for (size_t card = 0; card < workers_.size(); ++card) {
    faults.clear();
    workers_[card]->drainFaults(faults);
    for (auto& f : faults) {
      if (!link_) continue;
      capnp::MallocMessageBuilder m;
      auto fault = m.initRoot<wire::NodeMessage>().initFault();
      fault.setCard(static_cast<uint32_t>(card));
      fault.setMessage(f.message);
      auto list = fault.initContexts(static_cast<unsigned>(f.contexts.size()));
      for (size_t i = 0; i < f.contexts.size(); ++i) list.set(static_cast<unsigned>(i), f.contexts[i]);
      link_->send(transport::kControlChannel, 0, m);
    }
  }
  outputs_.clear();
  for (auto& w : workers_) w->drain(outputs_);
  for (auto& o : outputs_) {
    if (!kept_.empty() && kept_.count(o.context)) kept_[o.context].push_back(std::move(o));  // until adopted
    else if (link_) link_->sendBody(o.context, o.sequence, std::move(o.body));
  }
  outputs_.clear();
  if (inputPaused_ && link_) {
    size_t queued = 0;
    for (auto& w : workers_) queued += w->queuedBytes();
    if (queued < kInputHighWater / 2) {
      inputPaused_ = false;
      link_->resumeReading();
    }
  }
}

}  // namespace raccel::netaccel
