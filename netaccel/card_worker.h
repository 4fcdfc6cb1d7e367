// Runs guest instructions on one card, on a worker thread of its own.
//
// Sharing the card (docs/ARCHITECTURE.md, "The pool"): each context has its own queue,
// in order. The worker picks the next instruction across contexts: first the tenant
// (VM) with the lowest usage score, its kernel time decayed with a half-life, divided by
// its share (the blocks of this card its contexts hold); then, among that tenant's
// contexts with work ready, the highest priority, then the lowest own usage over share.
// While several tenants keep the card busy, each gets kernel time in proportion to its
// blocks. Usage on a synchronous device is the worker's wall time executing the
// instruction (the kernel's time). On an asynchronous one (hal::Device::timesKernels: a
// GPU stream, the asynchronous simulated card) it is each kernel's time on the device's
// own clock, charged when the kernel completes; and at most `queueDepth` kernels are in
// flight on the card at once, so the next dispatch always goes to the tenant that is
// furthest behind its share. Transfers are not charged.
//
// Bounded work (hal/slicing.h): a built-in or tensor op worth more than `maxOpSeconds` of
// this card at its rated speed is refused when it arrives; one worth more than `sliceMs`
// is cut into slices of about that much, and the choice above is made again between
// slices, so the granularity of a share is one slice (or one launched kernel, which is
// never cut; a sandbox whose kernels make no progress for maxOpSeconds or its call
// timeout, whichever is less, is stopped).
// A context that closes (its session ended) drops its queued work and its running op at
// once, between two slices: a close never waits behind the work it cancels.
//
// Sandboxes (netaccel/sandbox.h): on a card built with a SandboxPool, each tenant's
// contexts run in a sandbox process of that tenant's, taken when its first context
// opens and ended when its last closes. When it dies or its device faults, the
// instruction that met it fails naming the fault, every buffer and program of that
// tenant's contexts on this card is gone (their handles fail naming the fault from then
// on), a fresh sandbox serves what follows, and the fault is reported through
// drainFaults(). Other tenants, in their own sandboxes, are untouched.
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
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "hal/device.h"
#include "netaccel/sandbox.h"
#include "transport/frame.h"
#include "transport/lane.h"

namespace raccel::netaccel {

class CardWorker {
 public:
  struct Output {
    uint32_t context;
    uint64_t sequence;
    transport::Body body;
  };

  struct Fault {
    std::vector<uint32_t> contexts;  // every context the lost sandbox served
    std::string message;
    bool notItsOwn = false;  // not the tenant's work's doing (hal::Device::lostFromOutside)
  };
  struct Options {
    double halfLifeMs = 2000;
    unsigned queueDepth = 2;  // asynchronous devices: kernels in flight on the card while tenants share it
    unsigned aloneQueueDepth = 64;  // ... while one tenant has work here (nobody's share is at stake)
    double sliceMs = 10;      // ops are cut into slices of about this much of the card's speed (speedTflops)
    double maxOpSeconds = 120;  // an op worth more of the card than this is refused
    std::string label = "card";  // in messages: "card 0"
    // Set: each tenant's work runs in a sandbox process of its own (for backends that
    // run guest code; the in-process device only supplies the capabilities).
    std::optional<SandboxSettings> sandbox;
  };

  CardWorker(std::unique_ptr<hal::Device> device, std::function<void()> notify, double halfLifeMs = 2000);
  CardWorker(std::unique_ptr<hal::Device> device, std::function<void()> notify, Options options);
  ~CardWorker();
  CardWorker(const CardWorker&) = delete;
  CardWorker& operator=(const CardWorker&) = delete;

  // Immutable after construction: safe from any thread.
  const hal::Capabilities& capabilities() const { return caps_; }

  // Loop thread.
  // `blocks`: the context's share of the card (0 counts as 1); `tenant`: whose usage it
  // adds to (contexts of one tenant share its score); `priority`: order inside the tenant.
  // `replyLane`: the same-host lane of the link it answers on (null: none), where read
  // replies are built to be sent without a copy.
  void openContext(uint32_t context, uint64_t memoryQuota, const std::string& label, uint32_t blocks = 1,
                   const std::string& tenant = "", int priority = 0, std::shared_ptr<transport::LaneOut> replyLane = nullptr);
  void closeContext(uint32_t context);
  // The context's read replies are built in `lane` from now on (null: in bodies of their
  // own): its link took a same-host lane after the context opened.
  void setReplyLane(uint32_t context, std::shared_ptr<transport::LaneOut> lane);
  // `sequence` 0: no instruction failed (a handle lost with a sandbox); `message` says why.
  void poison(uint32_t context, uint64_t handle, uint64_t sequence, Code code, const std::string& message = "");
  void enqueue(uint32_t context, uint64_t sequence, transport::Body body);
  void submit();
  void drain(std::vector<Output>& out);
  void drainFaults(std::vector<Fault>& out);
  bool sandboxed() const { return options_.sandbox.has_value(); }
  // Bytes of instructions queued or running (for input backpressure).
  size_t queuedBytes() const;
  size_t queuedInstructions() const;
  // Kernel time each open context has used so far, and the final time of those closed
  // since the last call (for the heartbeat).
  std::vector<std::pair<uint32_t, uint64_t>> kernelTimes();
  // What the card has done so far, for the netaccel's /metrics. Any thread.
  struct Stats {
    uint64_t busyNs = 0;        // kernel time of every context, open or closed
    uint64_t instructions = 0;  // run (failed ones too)
    uint64_t memoryUsed = 0;    // bytes of the open contexts' buffers
    uint64_t sandboxesStarted = 0, sandboxesLost = 0;  // tenants' sandboxes given out, and lost (fault, crash, stall)
    size_t queued = 0;          // instructions waiting or running
  };
  Stats stats() const;
  // A context's buffers (handle, bytes) as created so far (for re-registering).
  std::vector<std::pair<uint64_t, uint64_t>> buffersOf(uint32_t context) const;

 private:
  struct Work;
  struct Context;
  struct Tenant;
  void run();
  // The device a run of instructions goes to, plugged (hal::Device::plug): a sandbox
  // then gets the run as one message, PoCL starts it as one. Unplugged when the run ends
  // or turns to another device, and before anything else can touch the devices (an open,
  // a close or a new lane taken in, a wait, work that is not an instruction). New
  // instructions taken in join it.
  struct PluggedRun {
    hal::Device* device = nullptr;
    Tenant* tenant = nullptr;  // whose device it is
    void end() {
      if (device) device->unplug();
      device = nullptr;
    }
    void turnTo(hal::Device* next, Tenant* nextTenant) {
      if (next == device) return;
      end();
      if (next) next->plug(), device = next, tenant = nextTenant;
    }
  };
  // Runs c's next instruction, or its running op's next slice, and charges or counts
  // its kernel; what arrived meanwhile lands in `arrived`. False: the worker stops.
  bool dispatch(Context& c, PluggedRun& run, std::vector<Work>& arrived);
  void intake(std::vector<Work>& arrived);  // into the contexts' queues
  Context* pick();                          // the context to run next, or null
  size_t readyContexts() const;             // contexts with work to run (0, 1 or 2: "more")
  bool othersWaiting(const Context& self);  // another context's work is ready or has arrived
  void runSlice(Context& c, hal::Device& device);  // the next slice of its running op
  void close(Work& work);                   // drops the context, its queue and its running op
  // The card's speed for cutting and bounding work: its own (properties or calibration)
  // where that is faster than what it registers. A CUDA card registered at 8 TFLOPS
  // that runs at 50 would otherwise cut a 4096^3 gemm in two for nothing.
  double speedTflops() const;
  double sliceFlops() const;
  Status withinCeiling(double flops, const std::string& what) const;
  void charge(Context& c, double ns, double now);  // `now`: nowNs(), read once per batch
  hal::Device& deviceOf(Context& c);
  bool eligible(const Context& c) const;
  // Completed kernels' device time, charged; returns how many were real (this device's).
  size_t collect(hal::Device& device);
  // A kernel posted into a plugged run: it cannot complete before the run is unplugged,
  // so it counts as in flight without asking the device (asking a sandbox costs a
  // receive); the device is asked once the run ends or the depth is near.
  void countPosted(hal::Device& device);
  // Kernels that may be in flight now: deep for a tenant alone, shallow when tenants share.
  unsigned depth() const;
  size_t collectAll();
  void waitForDevice();               // some kernel in flight to complete
  void stopStalled();                 // sandboxes whose kernels make no progress
  void forgetDevice(hal::Device* device);  // its kernels in flight are no longer counted
  hal::Device* existingDevice(Tenant& t);  // where its buffers are, or null (no sandbox yet)
  void capMemory(Tenant& t);               // its sandbox allocates up to its VM's quota
  void sandboxLost(const std::string& tenant, const std::string& why, uint64_t sequence, bool notItsOwn = false);
  std::string lossMessage(const std::string& why) const;
  class Step;  // one instruction's handlers (card_worker.cc)
  void open(Work& work);     // a context opened: its quota, its tenant's share
  void execute(Work& work);
  // A reply to `context`'s instruction; what its device reports as failed since (posted
  // work, hal::Device::takeDeferredErrors) is answered first.
  void emit(uint32_t context, uint64_t sequence, transport::Body body);
  void queueOutput(uint32_t context, uint64_t sequence, transport::Body body);
  void reportDeferred(hal::Device& device);
  void flushOutputs(bool force);

  hal::Capabilities caps_;
  Options options_;
  std::unique_ptr<hal::Device> device_;  // worker thread only; null with sandboxes
  std::unique_ptr<SandboxPool> sandboxes_;  // worker thread only, after construction
  std::function<void()> notify_;
  std::vector<Work> staged_;  // loop thread only

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Work> queue_;
  std::vector<Output> outbox_;
  std::vector<Fault> faults_;
  size_t queuedBytes_ = 0, queuedCount_ = 0;
  std::unordered_map<uint32_t, uint64_t> kernelNs_;  // by context
  std::vector<std::pair<uint32_t, uint64_t>> closedKernelNs_;  // closed since the last kernelTimes()
  uint64_t busyNs_ = 0, executed_ = 0, sandboxesStarted_ = 0, sandboxesLost_ = 0;
  std::unordered_map<uint32_t, std::unordered_map<uint64_t, uint64_t>> bufferBytes_;  // context -> handle -> bytes
  bool stop_ = false;

  // Worker thread only.
  std::vector<Output> pendingOut_;
  size_t pendingOutBytes_ = 0;
  std::unique_ptr<std::unordered_map<uint32_t, Context>> contexts_;
  std::unique_ptr<std::unordered_map<std::string, Tenant>> tenants_;
  double halfLifeNs_;
  std::unordered_map<hal::Device*, size_t> inFlight_;  // asynchronous devices: kernels in flight
  size_t inFlightTotal_ = 0;
  std::unordered_map<hal::Device*, double> stalledSince_;  // last progress of those in flight
  std::unordered_map<hal::Device*, size_t> outstanding_;   // instructions given, not seen complete
  std::vector<hal::KernelTime> completed_;
  std::thread thread_;
};

}  // namespace raccel::netaccel
