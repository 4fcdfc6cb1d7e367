// Runs guest instructions on one card, on a worker thread of its own.
//
// Sharing the card (ARCHITECTURE.md "Sharing one card"): each context has its own queue,
// in order. The worker picks the next instruction across contexts: first the tenant
// (VM) with the lowest usage score, its kernel time decayed with a half-life, divided by
// its share (the blocks of this card its contexts hold); then, among that tenant's
// contexts with work ready, the highest priority, then the lowest own usage over share.
// While several tenants keep the card busy, each gets kernel time in proportion to its
// blocks. Usage is the worker's wall time executing the instruction (synchronous
// backends: the kernel's time).
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
#include <unordered_map>
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

  CardWorker(std::unique_ptr<hal::Device> device, std::function<void()> notify, double halfLifeMs = 2000);
  ~CardWorker();
  CardWorker(const CardWorker&) = delete;
  CardWorker& operator=(const CardWorker&) = delete;

  // Immutable after construction: safe from any thread.
  const hal::Capabilities& capabilities() const { return caps_; }

  // Loop thread.
  // `blocks`: the context's share of the card (0 counts as 1); `tenant`: whose usage it
  // adds to (contexts of one tenant share its score); `priority`: order inside the tenant.
  void openContext(uint32_t context, uint64_t memoryQuota, const std::string& label, uint32_t blocks = 1,
                   const std::string& tenant = "", int priority = 0);
  void closeContext(uint32_t context);
  void poison(uint32_t context, uint64_t handle, uint64_t sequence, Code code);
  void enqueue(uint32_t context, uint64_t sequence, transport::Body body);
  void submit();
  void drain(std::vector<Output>& out);
  // Bytes of instructions queued or running (for input backpressure).
  size_t queuedBytes() const;
  size_t queuedInstructions() const;
  // Kernel time each open context has used so far (for the heartbeat).
  std::vector<std::pair<uint32_t, uint64_t>> kernelTimes() const;
  // A context's buffers (handle, bytes) as created so far (for re-registering).
  std::vector<std::pair<uint64_t, uint64_t>> buffersOf(uint32_t context) const;

 private:
  struct Work;
  struct Context;
  struct Tenant;
  void run();
  void intake(std::vector<Work>& arrived);  // into the contexts' queues
  Context* pick();                          // the context to run next, or null
  void charge(Context& c, double ns);
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
  std::unordered_map<uint32_t, uint64_t> kernelNs_;  // by context
  std::unordered_map<uint32_t, std::unordered_map<uint64_t, uint64_t>> bufferBytes_;  // context -> handle -> bytes
  bool stop_ = false;

  // Worker thread only.
  std::vector<Output> pendingOut_;
  size_t pendingOutBytes_ = 0;
  std::unique_ptr<std::unordered_map<uint32_t, Context>> contexts_;
  std::unique_ptr<std::unordered_map<std::string, Tenant>> tenants_;
  double halfLifeNs_;
  size_t readyContexts_ = 0;
  std::thread thread_;
};

}  // namespace raccel::netaccel
