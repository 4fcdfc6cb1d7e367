// The network-accelerator daemon: joins a scheduler over TCP, registers its cards,
// heartbeats, and runs forwarded instructions on one CardWorker per card. Everything
// here runs on the loop thread; the workers hand results back through a uv_async.
// If the scheduler goes away, every context is dropped and the daemon reconnects with
// backoff.
#pragma once

#include <uv.h>

#include <memory>
#include <unordered_map>
#include <vector>

#include "hal/device.h"
#include "netaccel/card_worker.h"
#include "netaccel/config.h"
#include "transport/connection.h"

namespace raccel::netaccel {

// Builds the devices a config names. Errors name the card.
Result<std::vector<std::unique_ptr<hal::Device>>> makeDevices(const std::vector<CardConfig>& cards);

class Netaccel {
 public:
  Netaccel(uv_loop_t* loop, NetaccelConfig config, std::vector<std::unique_ptr<hal::Device>> devices);
  ~Netaccel();

  void start();
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

  uv_loop_t* loop_;
  NetaccelConfig config_;
  transport::Address schedulerAddress_;
  std::vector<std::unique_ptr<CardWorker>> workers_;
  std::unordered_map<uint32_t, size_t> contextCard_;
  transport::ConnectionPtr link_;
  bool registered_ = false, stopping_ = false, inputPaused_ = false;
  unsigned backoffMs_ = 100;
  uv_async_t* async_;
  uv_timer_t* heartbeat_;
  uv_timer_t* reconnect_;
  std::vector<CardWorker::Output> outputs_;
};

}  // namespace raccel::netaccel
