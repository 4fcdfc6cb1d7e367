// Runs guest instructions on one card, on a worker thread of its own.
//
// The loop thread queues work (enqueue/openContext/closeContext) and publishes it with
// submit(), once per batch of frames; the worker executes it in order and hands
// encoded replies back through drain(), calling `notify` (uv_async_send) when there are
// some. Each execution context (one guest session's slice of this card) has its own
// handle tables, touched only by the worker thread: a handle another context created
// is simply not there (notFound). This file is the one place netaccel converts wire
// instructions into hal calls.
#pragma once

#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "hal/device.h"
#include "transport/frame.h"

namespace raccel::netaccel {

class CardWorker {
 public:
  struct Output {
    uint32_t context;
    uint64_t sequence;
    transport::Body body;
  };

  CardWorker(std::unique_ptr<hal::Device> device, std::function<void()> notify);
  ~CardWorker();
  CardWorker(const CardWorker&) = delete;
  CardWorker& operator=(const CardWorker&) = delete;

  // Immutable after construction: safe from any thread.
  const hal::Capabilities& capabilities() const { return caps_; }

  // Loop thread.
  void openContext(uint32_t context, uint64_t memoryQuota, const std::string& label);
  void closeContext(uint32_t context);
  void poison(uint32_t context, uint64_t handle, uint64_t sequence, Code code);
  void enqueue(uint32_t context, uint64_t sequence, transport::Body body);
  void submit();
  void drain(std::vector<Output>& out);
  // Bytes of instructions queued or running (for input backpressure).
  size_t queuedBytes() const;
  size_t queuedInstructions() const;

 private:
  struct Work;
  struct Context;
  void run();
  void execute(Work& work);
  void emit(uint32_t context, uint64_t sequence, transport::Body body);
  void flushOutputs(bool force);

  hal::Capabilities caps_;
  std::unique_ptr<hal::Device> device_;  // worker thread only
  std::function<void()> notify_;
  std::vector<Work> staged_;  // loop thread only

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Work> queue_;
  std::vector<Output> outbox_;
  size_t queuedBytes_ = 0, queuedCount_ = 0;
  bool stop_ = false;

  // Worker thread only.
  std::vector<Output> pendingOut_;
  size_t pendingOutBytes_ = 0;
  std::unique_ptr<std::unordered_map<uint32_t, Context>> contexts_;
  std::thread thread_;
};

}  // namespace raccel::netaccel
