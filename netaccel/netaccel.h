// The network-accelerator daemon: joins a scheduler over TCP, registers its cards,
// heartbeats, and runs forwarded instructions on one CardWorker per card. Everything
// here runs on the loop thread; the workers hand results back through a uv_async.
// If the scheduler goes away, the daemon reconnects with backoff and keeps its contexts
// for context_grace_ms: their queued work runs, their replies wait. It registers again
// with the contexts it kept (once their queues have run dry); the scheduler adopts those
// it knows (their waiting replies are sent) and closes the rest. When the grace ends
// first, they are dropped.
#pragma once

#include <uv.h>

#include <memory>
#include <unordered_map>
#include <vector>

#include "hal/device.h"
#include "netaccel/card_worker.h"
#include "netaccel/config.h"
#include "transport/connection.h"
#include "transport/http_server.h"

namespace raccel::netaccel {

// Opens the cards a config serves: its [card] sections in order, then every device the
// discovered backends see that no section names; one cpu card when that is nothing.
// A configured card that cannot be opened is an error naming it; a discovered one is
// skipped with a note. `notes` gets a line per backend (what discovery found, and why
// not) for logs and --list-devices.
Result<std::vector<std::unique_ptr<hal::Device>>> openCards(const NetaccelConfig& config, std::vector<std::string>* notes);

class Netaccel {
 public:
  Netaccel(uv_loop_t* loop, NetaccelConfig config, std::vector<std::unique_ptr<hal::Device>> devices);
  ~Netaccel();

  // The link to the scheduler is mutual TLS with this context (null: plain TCP).
  void useTls(std::shared_ptr<transport::TlsContext> tls) { tls_ = std::move(tls); }
  // Serves /metrics (http_listen) and joins the scheduler; an error: the metrics address.
  Status start();
  // Closes the link and every handle so the loop can end.
  void stop();

 private:
  void connect();
  void scheduleReconnect();
  void onConnected(transport::ConnectionPtr link);
  void onFrame(const transport::FrameHeader& header, transport::Body body);
  void onControl(transport::Body body);
  void onLinkClosed();
  void sendHeartbeat();
  void drainOutputs();
  void closeAllContexts();
  void sendRegister();
  void graceOver();
  std::string metricsText();

  uv_loop_t* loop_;
  NetaccelConfig config_;
  transport::Address schedulerAddress_;
  std::shared_ptr<transport::TlsContext> tls_;
  std::vector<std::unique_ptr<CardWorker>> workers_;
  std::unordered_map<uint32_t, size_t> contextCard_;
  std::unordered_map<uint32_t, uint64_t> lastGuestSequence_;  // by context
  std::unordered_map<uint32_t, std::vector<CardWorker::Output>> kept_;  // contexts kept, not adopted: their replies
  uv_timer_t* grace_;
  uv_timer_t* settle_;      // waits for kept contexts' queues to run dry before registering
  unsigned settleWaitedMs_ = 0;
  transport::ConnectionPtr link_;
  bool registered_ = false, stopping_ = false, inputPaused_ = false;
  unsigned backoffMs_ = 100;
  uv_async_t* async_;
  uv_timer_t* heartbeat_;
  uv_timer_t* reconnect_;
  std::vector<CardWorker::Output> outputs_;
  std::unique_ptr<transport::HttpServer> http_;
  uint64_t instructionsReceived_ = 0, linksLost_ = 0;
};

}  // namespace raccel::netaccel
