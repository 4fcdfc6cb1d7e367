#include "scheduler/links/node_links.h"

#include <sstream>

#include "common/limits.h"
#include "common/log.h"
#include "scheduler/state.h"

namespace raccel::scheduler {

using transport::Body;
using transport::Connection;
using transport::ConnectionPtr;
using transport::FrameHeader;
using transport::MessageIn;

NodeLinks::NodeLinks(uv_loop_t* loop, const SchedulerConfig& config, Scheduler& scheduler)
    : loop_(loop), config_(config), scheduler_(scheduler) {}

NodeLinks::~NodeLinks() = default;

Status NodeLinks::start() {
  auto address = transport::parseAddress(config_.nodeListen);
  if (!address) return fail(address.error());
  auto tls = transport::tlsFor(transport::TlsContext::Role::server, config_.security, "the node port " + config_.nodeListen);
  if (!tls) return fail(tls.error());
  tls_ = *tls;
  auto listener = transport::Listener::listen(loop_, *address, wire::DEFAULT_MAX_FRAME_BYTES,
                                              [this](ConnectionPtr c) { accept(std::move(c)); });
  if (!listener) return fail(listener.error());
  listener_ = std::move(*listener);
  if (const std::string path = config_.laneSocketPath(); !path.empty()) {
    auto lanes = transport::LaneListener::listen(loop_, path, [this](const std::string& token, transport::UniqueFd up,
                                                                      transport::UniqueFd down) {
      laneHandedOver(token, std::move(up), std::move(down));
    });
    if (lanes) lanes_ = std::move(*lanes);
    else RLOG_WARN("scheduler") << "no same-host lanes (netaccels here use the node port alone): " << lanes.error().message;
  }
  return {};
}

void NodeLinks::offerLane(NodeLink& node) {
  if (!lanes_) return;
  node.laneToken = transport::newLaneToken();
  capnp::MallocMessageBuilder m;
  auto offer = m.initRoot<wire::SchedulerMessage>().initLaneOffer();
  offer.setPath(lanes_->path());
  offer.setToken(kj::arrayPtr(reinterpret_cast<const capnp::byte*>(node.laneToken.data()), node.laneToken.size()));
  node.connection->send(transport::kControlChannel, 0, m);
}

void NodeLinks::laneHandedOver(const std::string& token, transport::UniqueFd up, transport::UniqueFd down) {
  NodeLink* node = nullptr;
  for (auto& [c, n] : links_)
    if (!n->laneToken.empty() && n->laneToken == token && !n->connection->closed()) node = n.get();
  if (!node) {
    RLOG_WARN("scheduler") << "a lane was handed over with a token no link was offered; ignored";
    return;
  }
  node->laneToken.clear();  // one use
  auto upMap = transport::LaneMapping::map(up);
  auto downMap = transport::LaneMapping::map(down);
  if (!upMap || !downMap) {
    RLOG_WARN("scheduler") << "netaccel '" << node->name << "' handed over a lane that cannot be used ("
                           << (upMap ? downMap.error() : upMap.error()).message << "); its frames keep to the node port";
    return;
  }
  capnp::MallocMessageBuilder m;
  m.initRoot<wire::SchedulerMessage>().setLaneAccepted();
  node->connection->send(transport::kControlChannel, 0, m);
  node->connection->receiveLane(*upMap, false);  // a netaccel's memory: copied out before anything reads it
  node->connection->sendLane(*downMap);
  RLOG_INFO("scheduler") << "netaccel '" << node->name << "' shares a same-host lane (" << (*upMap)->size() / (1 << 20)
                         << " MiB each way): big frames skip the node port";
}

int NodeLinks::port() const { return listener_ ? listener_->port() : 0; }

void NodeLinks::stop() {
  listener_.reset();
  lanes_.reset();
  std::vector<ConnectionPtr> all;
  for (auto& [c, node] : links_) all.push_back(node->connection);
  for (auto& c : all) c->close();
}

NodeLinks::NodeLink* NodeLinks::at(size_t node) const {
  auto it = byPoolNode_.find(node);
  return it == byPoolNode_.end() ? nullptr : it->second;
}

NodeLinks::Session* NodeLinks::sessionOf(size_t node, uint32_t context) const {
  auto it = sessions_.find(key(node, context));
  return it == sessions_.end() ? nullptr : it->second;
}

void NodeLinks::accept(ConnectionPtr connection) {
  if (links_.size() >= config_.maxNodeLinks) {
    // Full: the oldest link that has not registered makes room; with none, this one goes.
    NodeLink* oldest = nullptr;
    for (auto& [c, n] : links_)
      if (n->name.empty() && !n->connection->closed() && (!oldest || n->acceptedMs < oldest->acceptedMs)) oldest = n.get();
    if (++refused_ % 1000 == 1)
      RLOG_WARN("scheduler") << "the node port has " << links_.size() << " connections (max_node_links); "
                             << (oldest ? "closing the oldest unregistered one" : "refusing a new one") << " (" << refused_
                             << " so far)";
    if (!oldest) {
      connection->close();
      return;
    }
    oldest->lostReason = "closed to make room: it had not registered";
    oldest->connection->close();
  }
  auto node = std::make_unique<NodeLink>();
  node->connection = connection;
  node->lastHeardMs = node->acceptedMs = uv_now(loop_);
  if (tls_) connection->useTls(tls_);
  NodeLink* raw = node.get();
  Connection::Callbacks cb;
  cb.onFrame = [this, raw](Connection&, const FrameHeader& h, Body body) { onFrame(*raw, h, std::move(body)); };
  cb.onOversized = [raw](Connection&, const FrameHeader& h) {
    RLOG_ERROR("scheduler") << "netaccel '" << raw->name << "' (" << raw->connection->peer() << ") sent a frame of "
                            << h.length << " bytes; skipped";
  };
  cb.onClose = [this, raw](Connection&, bool) { closed(*raw); };
  connection->setCallbacks(cb);
  links_[connection.get()] = std::move(node);
  connection->start();
}

void NodeLinks::closed(NodeLink& node) {
  const std::string reason = node.lostReason.empty() ? "its connection closed" : node.lostReason;
  if (!node.name.empty()) {
    if (node.poolIndex >= 0) {
      byPoolNode_.erase(static_cast<size_t>(node.poolIndex));
      offlineSince_[static_cast<size_t>(node.poolIndex)] = uv_now(loop_);
    }
    scheduler_.nodeLost(node, reason);
  }
  links_.erase(node.connection.get());
}

void NodeLinks::onFrame(NodeLink& node, const FrameHeader& h, Body body) {
  node.lastHeardMs = uv_now(loop_);
  if (h.channel == transport::kControlChannel) {
    onControl(node, std::move(body));
    return;
  }
  if (node.poolIndex < 0) return;  // not registered: it holds no context
  Session* s = sessionOf(static_cast<size_t>(node.poolIndex), h.channel);
  if (!s) return;  // the session ended; its late replies go nowhere
  // Context ids are per node link: the member is the one with this id on this node.
  auto member = std::find_if(s->members.begin(), s->members.end(),
                             [&](const Member& m) { return m.context == h.channel && m.node == &node; });
  if (member == s->members.end()) {
    // Only the netaccel holding a context may answer for it (an unregistered or other
    // peer on the node port cannot inject replies into a tenant's session).
    RLOG_WARN("scheduler") << "reply for context " << h.channel << " from " << node.connection->peer()
                           << ", which does not hold it; dropped";
    return;
  }
  Status taken = scheduler_.cardReply(*s, static_cast<size_t>(member - s->members.begin()), node, h, std::move(body));
  if (!taken && (++node.badReplies == 1 || node.badReplies % 1000 == 0))
    RLOG_ERROR("scheduler") << "netaccel '" << node.name << "' sent " << taken.error().message << "; dropped ("
                            << node.badReplies << " so far)";
}

void NodeLinks::refuse(NodeLink& node, const std::string& why) {
  capnp::MallocMessageBuilder m;
  auto r = m.initRoot<wire::SchedulerMessage>().initRegistered();
  r.setAccepted(false);
  transport::setError(r.initError(), Error{Code::permissionDenied, why});
  node.connection->send(transport::kControlChannel, 0, m);
  RLOG_WARN("scheduler") << "netaccel registration from " << node.connection->peer() << " refused: " << limits::clip(why);
}

std::vector<std::pair<uint32_t, std::string>> NodeLinks::unusedCards(size_t node) const {
  const Pool& pool = scheduler_.pool();
  std::vector<std::pair<uint32_t, std::string>> unused;
  for (size_t ci : pool.nodes()[node].cards) {
    const CardSpec& spec = pool.cards()[ci].spec;
    if (pool.cards()[ci].blocks.count > 0) continue;
    std::ostringstream why;
    why << kindName(spec.kind) << " '" << limits::clip(spec.model, 64) << "' (" << spec.backend << ") rates " << spec.tflops
        << " TFLOPS, under one block of " << pool.blockTflops()
        << " TFLOPS, so nothing is placed on it; rate it with tflops= in the netaccel's card (e.g. --card backend="
        << spec.backend << ",device=N,tflops=2), leave it out (--discover none), or give the scheduler a smaller --block-tflops";
    unused.emplace_back(spec.index, why.str());
  }
  return unused;
}

void NodeLinks::registerNode(NodeLink& node, wire::Register::Reader reg) {
  if (!node.name.empty()) return refuse(node, "this connection is already registered as '" + node.name + "'");
  if (reg.getVersionMajor() != wire::PROTOCOL_MAJOR)
    return refuse(node, "protocol version " + std::to_string(reg.getVersionMajor()) + " is not supported; this scheduler speaks " +
                            std::to_string(wire::PROTOCOL_MAJOR));
  // With TLS the node's name is its certificate's, never the message's.
  std::string name = tls_ ? node.connection->peerName() : std::string(reg.getName());
  if (tls_ && reg.getName().size() > 0 && reg.getName() != name)
    return refuse(node, "this netaccel's certificate is for node '" + limits::clip(name, 64) + "', but it registered as '" +
                            limits::clip(reg.getName(), 64) + "'");
  if (auto ok = limits::checkName("node name", name); !ok) return refuse(node, ok.error().message);
  // Lists are counted before anything is made of them (a list of empty structs costs its
  // sender nothing and its reader one step per element).
  if (reg.getCards().size() > limits::kMaxCardsPerNode || reg.getContexts().size() > limits::kMaxKeptContexts)
    return refuse(node, "a registration may list at most " + std::to_string(limits::kMaxCardsPerNode) + " cards and " +
                            std::to_string(limits::kMaxKeptContexts) + " kept contexts (got " +
                            std::to_string(reg.getCards().size()) + " and " + std::to_string(reg.getContexts().size()) + ")");
  for (auto hc : reg.getContexts())
    if (hc.getBuffers().size() > limits::kMaxKeptBuffers)
      return refuse(node, "a kept context may list at most " + std::to_string(limits::kMaxKeptBuffers) + " buffers");
  auto cards = cardSpecsOf(reg.getCards());
  if (!cards) return refuse(node, cards.error().message);
  HostVector host{reg.getHostCpuMilli(), reg.getHostMemoryMib()};
  if (!host.inBounds())
    return refuse(node, "host resources out of range: " + std::to_string(reg.getHostCpuMilli()) + " milli-CPU and " +
                            std::to_string(reg.getHostMemoryMib()) + " MiB (at most " + std::to_string(limits::kMaxHostCpuMilli) +
                            " and " + std::to_string(limits::kMaxHostMemoryMib) + ")");
  auto index = scheduler_.nodeJoined(name, *cards, host, reg);
  if (!index) return refuse(node, index.error().message);
  node.name = name;
  node.poolIndex = static_cast<long>(*index);
  offlineSince_.erase(*index);
  byPoolNode_[*index] = &node;
  const Node& n = scheduler_.pool().nodes()[*index];
  const auto unused = unusedCards(*index);
  capnp::MallocMessageBuilder m;
  auto r = m.initRoot<wire::SchedulerMessage>().initRegistered();
  r.setAccepted(true);
  r.setHeartbeatMs(std::max(10u, config_.heartbeatTimeoutMs / 5));
  if (config_.etcd.enabled()) r.setPoolName(config_.name);
  auto told = r.initUnusedCards(static_cast<unsigned>(unused.size()));
  for (size_t i = 0; i < unused.size(); ++i) {
    told[i].setCard(unused[i].first);
    told[i].setWhy(unused[i].second);
  }
  node.connection->send(transport::kControlChannel, 0, m);
  std::string joined = std::to_string(cards->size()) + " card(s), blocks " +
                       (n.blocks.count ? std::to_string(n.blocks.first) + "-" + std::to_string(n.blocks.end() - 1) : "none") +
                       (host.empty() ? std::string() : ", host " + Pool::describeHost(host)) + "; pool now " +
                       std::to_string(scheduler_.pool().total()) + " blocks";
  for (auto& [card, why] : unused) joined += "; card " + std::to_string(card) + " unused: " + why;
  RLOG_INFO("scheduler") << "netaccel '" << name << "' joined from " << node.connection->peer() << ": " << joined;
  offerLane(node);
  scheduler_.nodeReady(node, joined, reg.getContexts());
}

void NodeLinks::onControl(NodeLink& node, Body body) {
  auto decoded = transport::decodeGuard([&] {
    MessageIn in(std::move(body));
    auto msg = in.root<wire::NodeMessage>();
    switch (msg.which()) {
      case wire::NodeMessage::REGISTER: return registerNode(node, msg.getRegister());
      case wire::NodeMessage::HEARTBEAT:
        if (node.poolIndex < 0) return;  // not registered: nothing to account
        if (msg.getHeartbeat().getUsage().size() > node.nextContext) return;  // more than it ever held: made up
        for (auto u : msg.getHeartbeat().getUsage())
          scheduler_.contextTime(node, sessionOf(static_cast<size_t>(node.poolIndex), u.getContext()), u.getContext(),
                                 u.getKernelNs());
        return;
      case wire::NodeMessage::FAULT:
        if (node.poolIndex < 0) return;
        if (msg.getFault().getContexts().size() > node.nextContext) return;  // more than it ever held: made up
        return scheduler_.cardFault(node, msg.getFault());
    }
  });
  if (!decoded) RLOG_ERROR("scheduler") << "malformed control message from a netaccel: " << decoded.error().message;
}

void NodeLinks::check(uint64_t now, bool stalled) {
  // The loop itself stalled (a long step of its own, or the host starved it): what the
  // netaccels sent meanwhile waits unread in their sockets. That silence is ours, not
  // theirs: their clocks start again now, before any is judged.
  if (stalled)
    for (auto& [c, n] : links_) n->lastHeardMs = std::max(n->lastHeardMs, now);
  std::vector<NodeLink*> silent, unregistered;
  const bool trim = now - lastTrimMs_ >= kTrimEveryMs;  // an idle link's burst buffers go back
  if (trim) lastTrimMs_ = now;
  uint64_t moved = 0;
  for (auto& [c, n] : links_) {
    moved += n->connection->moved();
    if (n->connection->closed()) continue;
    if (trim) n->connection->trimIdle();
    // Not reading it (a guest link behind it is backed up) is our silence, not its: its
    // heartbeats wait in the socket. The clock starts again when reading resumes.
    if (n->connection->readingPaused()) n->lastHeardMs = now;
    if (!n->name.empty() && now - n->lastHeardMs > config_.heartbeatTimeoutMs) silent.push_back(n.get());
    if (n->name.empty() && now - n->acceptedMs > config_.registerTimeoutMs) unregistered.push_back(n.get());
  }
  if (trim && freeMemory_.tick(moved)) RLOG_DEBUG("scheduler") << "the node links went quiet: free memory given back";
  for (auto* n : silent) {
    n->lostReason = "no heartbeat for " + std::to_string(now - n->lastHeardMs) + " ms";
    n->connection->close();  // closed() does the rest
  }
  for (auto* n : unregistered) {
    RLOG_DEBUG("scheduler") << n->connection->peer() << " did not register within " << config_.registerTimeoutMs << " ms; closed";
    n->connection->close();
  }
}

}  // namespace raccel::scheduler
