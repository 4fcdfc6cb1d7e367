// The netaccels' side of a scheduler: the node port, one link per netaccel connection,
// and the table that routes what a card sends to the vaccel whose context it is.
//
// The contract. NodeLinks owns the node port's listener (mutual TLS unless --insecure),
// every link and its life (registration within register_timeout_ms, heartbeats within
// heartbeat_timeout_ms, its end, whoever ends it), the links by pool node, when each pool
// node went offline, and the context table: (pool node, context id) -> the session that
// holds that context there. It checks what a netaccel sends before anything is made of
// it: the protocol version; its name (with TLS, its certificate's, never the message's);
// the sizes of its lists before they are read; that a reply comes over the link that
// holds the context; that a heartbeat or a fault names no more contexts than the link
// ever held. What passes goes to the scheduler, which owns the pool and the sessions:
// Scheduler::nodeJoined (the pool takes the node, or says why not), nodeReady (its kept
// contexts, placement), cardReply, contextTime, cardFault and nodeLost. The scheduler
// opens and closes contexts itself (over the link's connection) and keeps the table up
// to date through bind and unbind. Loop thread only.
#pragma once

#include <uv.h>

#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/free_memory.h"
#include "scheduler/config.h"
#include "scheduler/scheduler.h"
#include "transport/connection.h"
#include "transport/lane.h"
#include "transport/tls.h"

namespace raccel::scheduler {

class NodeLinks {
 public:
  using NodeLink = Scheduler::NodeLink;
  using Session = Scheduler::Session;

  NodeLinks(uv_loop_t* loop, const SchedulerConfig& config, Scheduler& scheduler);
  ~NodeLinks();

  // Listens on node_listen (TLS from config.security unless --insecure), and on the lane
  // socket unless it is off (one that cannot be bound only means no lanes); an error names it.
  Status start();
  int port() const;
  // Stops listening and closes every link (each ends through its close callback).
  void stop();

  // The registered link of pool node `node`, or null; all of them, by pool node.
  NodeLink* at(size_t node) const;
  const std::unordered_map<size_t, NodeLink*>& byPoolNode() const { return byPoolNode_; }
  // Pool nodes whose link is gone, and since when (forgotten by the scheduler after
  // forget_offline_ms with nothing on them).
  std::map<size_t, uint64_t>& offlineSince() { return offlineSince_; }

  // The context table: context `context` of pool node `node` is `session`'s.
  static uint64_t key(size_t node, uint32_t context) { return (static_cast<uint64_t>(node) << 32) | context; }
  void bind(size_t node, uint32_t context, Session& session) { sessions_[key(node, context)] = &session; }
  void unbind(size_t node, uint32_t context) { sessions_.erase(key(node, context)); }
  Session* sessionOf(size_t node, uint32_t context) const;

  // From the scheduler's tick: links silent past the heartbeat timeout, or unregistered
  // past the register timeout, are closed. `stalled`: the loop itself stalled, so the
  // netaccels' clocks start again first (their silence was ours).
  void check(uint64_t now, bool stalled);

 private:
  void accept(transport::ConnectionPtr connection);
  void onFrame(NodeLink& node, const transport::FrameHeader& header, transport::Body body);
  void onControl(NodeLink& node, transport::Body body);
  void registerNode(NodeLink& node, wire::Register::Reader reg);
  void refuse(NodeLink& node, const std::string& why);
  // A joining node's cards that got no block (rated under one), each with why and what to do.
  std::vector<std::pair<uint32_t, std::string>> unusedCards(size_t node) const;
  void closed(NodeLink& node);  // the one place a link ends
  // Same-host lanes: offered to each registered link; what a netaccel hands over is
  // checked and mapped, then the link's big frames go through it.
  void offerLane(NodeLink& node);
  void laneHandedOver(const std::string& token, transport::UniqueFd up, transport::UniqueFd down);

  uv_loop_t* loop_;
  const SchedulerConfig& config_;
  Scheduler& scheduler_;
  std::shared_ptr<transport::TlsContext> tls_;  // null with --insecure
  std::unique_ptr<transport::Listener> listener_;
  std::unique_ptr<transport::LaneListener> lanes_;
  std::unordered_map<transport::Connection*, std::unique_ptr<NodeLink>> links_;
  std::unordered_map<size_t, NodeLink*> byPoolNode_;
  std::map<size_t, uint64_t> offlineSince_;
  std::unordered_map<uint64_t, Session*> sessions_;  // the context table, by key()
  uint64_t refused_ = 0;  // connections over max_node_links, for the log
  static constexpr uint64_t kTrimEveryMs = 1000;  // Connection::trimIdle, each link
  uint64_t lastTrimMs_ = 0;
  FreeMemoryAfterBursts freeMemory_;  // the heap back once the links go quiet (each trim)
};

}  // namespace raccel::scheduler
