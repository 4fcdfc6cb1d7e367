// libraccel, the C++ API a guest program uses to drive its virtual accelerator.
//
// A Session is one program's ordered instruction stream to the scheduler, through
// raccel-guestd's socket (or, on the host, straight to a VM's socket). Instructions are
// asynchronous: alloc/write/copy/fill/launch/ops return at once, and a failure is
// reported later by fence()/sync() (the first unreported error, naming the failed
// instruction). read() and fence() wait for their answer.
//
// A Session is not thread-safe: use it from one thread at a time (one per thread is
// fine). The C ABI over this API is in raccel_c.h.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <utility>
#include <unordered_map>
#include <span>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/images.h"
#include "common/kinds.h"
#include "common/tensor_fns.h"

namespace capnp {
class MessageBuilder;
}

namespace raccel::client {

using Handle = uint64_t;

struct Options {
  std::string socket = "/run/raccel/guestd.sock";
  std::string program = "raccel-client";
  double tflops = 1;              // size of the virtual accelerator asked for
  std::vector<CardKind> kinds;    // accepted card kinds; empty = whatever the VM allows
  int priority = 0;
  int timeoutMs = 120000;         // for hello, read and fence
  // When the pool cannot hold it even by preempting lower priorities: wait this long
  // for blocks (hello then waits too), 0 = fail at once with resourceExhausted.
  unsigned admitWaitMs = 0;
  // While suspended by a higher priority or the operator, fail instructions with
  // `unavailable` instead of waiting (the default waits: latency, no error).
  bool noWait = false;
  // How long a wait for a reply (a read, a fence) may poll before it sleeps, at most, in
  // microseconds (transport/spin_wait.h: the window adapts, so long waits cost no CPU);
  // -1: RACCEL_SPIN_US when set, else 1000 on a host of two or more CPUs, else 0 (never).
  int spinMicros = -1;
};

struct CardInfo {
  std::string node;
  uint32_t index = 0;
  CardKind kind = CardKind::cpu;
  std::string model;
  uint32_t blocks = 0;
  uint64_t memoryBytes = 0;
  std::vector<ProgramKind> programKinds;
  uint32_t computeUnits = 0;      // 0 = not known
  uint32_t maxWorkGroupSize = 0;
  uint64_t localMemBytes = 0;
  std::string openclExtensions;  // space-separated
  uint64_t doubleFpConfig = 0;   // 0: no double precision
  ImageLimits images;            // none: no images
  bool runs(ProgramKind kind) const;
};

struct VaccelInfo {
  uint64_t id = 0;
  double blockTflops = 1;
  std::vector<std::pair<uint32_t, uint32_t>> blocks;  // (first, count)
  std::vector<CardInfo> cards;
  uint64_t memoryQuota = 0;  // bytes the VM may hold (0 = no limit known)
  std::string describe() const;
};

// What a card's compiler says of a loaded program (Session::describeProgram).
struct KernelArgInfo {
  enum class Space { privateValue, global, constant, local };
  enum class Access { none, readOnly, writeOnly, readWrite };
  std::string name, typeName;
  Space space = Space::privateValue;
  Access access = Access::none;
  uint32_t typeQualifiers = 0;
  uint32_t size = 0;  // bytes of a by-value argument (0 = pointer, local, or not known)
};
struct KernelInfo {
  std::string name, attributes;
  std::vector<KernelArgInfo> args;
  uint64_t workGroupSize = 0;
  uint64_t compileWorkGroupSize[3] = {0, 0, 0};
  uint64_t localMemBytes = 0, privateMemBytes = 0, preferredMultiple = 0;
};
struct ProgramInfo {
  std::string buildLog;
  std::vector<KernelInfo> kernels;
};

// A kernel argument for launch().
struct Arg {
  enum class Type { buffer, u32, i32, u64, i64, f32, f64, local, bytes, image, sampler } type;
  uint64_t bits;  // buffer handle, the scalar's bits, a local array's bytes, a sampler word
  uint64_t offset = 0;               // a buffer (or an image's pixels) from this offset on
  std::span<const std::byte> bytes;  // by value (borrowed until launch() returns)
  ImageDesc image{};                 // an image: how the card reads the buffer's pixels
  // An image: the buffer's packed pixels from `offset` on (common/images.h).
  static Arg imageOf(Handle h, uint64_t offset, const ImageDesc& d) { return {Type::image, h, offset, {}, d}; }
  // A sampler: common/images.h's encodeSampler word.
  static Arg sampler(uint32_t word) { return {Type::sampler, word}; }
  static Arg subBuffer(Handle h, uint64_t offset) { return {Type::buffer, h, offset}; }
  static Arg local(uint32_t bytes) { return {Type::local, bytes}; }
  static Arg value(std::span<const std::byte> bytes) { return {Type::bytes, 0, 0, bytes}; }
  static Arg buffer(Handle h) { return {Type::buffer, h}; }
  static Arg u32(uint32_t v) { return {Type::u32, v}; }
  static Arg u64(uint64_t v) { return {Type::u64, v}; }
  static Arg i32(int32_t v) { return {Type::i32, static_cast<uint64_t>(static_cast<uint32_t>(v))}; }
  static Arg i64(int64_t v) { return {Type::i64, static_cast<uint64_t>(v)}; }
  static Arg f32(float v);
  static Arg f64(double v);
};

// A tensor op over strided views of buffers (schema/guest.capnp, TensorOp, says what
// each function computes): what a framework's device is built on (vmfrontend/python).
using raccel::TensorFn;    // common/tensor_fns.h: the wire's order
using raccel::TensorType;
struct TensorOperand {
  Handle buffer = 0;
  uint64_t offset = 0;             // elements
  std::vector<uint64_t> strides;   // elements, one per dimension of the shape
  TensorType type = TensorType::f32;
};
struct TensorOp {
  TensorFn fn = TensorFn::copy;
  std::vector<uint64_t> shape;
  std::vector<TensorOperand> operands;  // the output first
  float alpha = 1, beta = 0;
  uint32_t reduceMask = 0;
  int64_t ignoreIndex = -100;
  bool mean = true;
  float preScale = 1, preShift = 0, postScale = 1, postShift = 0;  // map functions (schema/guest.capnp)
};

// A task graph of built-in and tensor ops (Session::submitGraph). Each call adds a node and
// returns its index; `after` names earlier nodes it must follow besides its data (an op
// reading a buffer already follows the op that last wrote it).
class Graph {
 public:
  enum class Placement { fewestBytes, roundRobin };
  uint32_t gemm(uint32_t m, uint32_t n, uint32_t k, float alpha, Handle a, Handle b, float beta, Handle c,
                std::vector<uint32_t> after = {});
  uint32_t axpy(uint64_t n, float alpha, Handle x, Handle y, std::vector<uint32_t> after = {});
  uint32_t vadd(uint64_t n, Handle a, Handle b, Handle out, std::vector<uint32_t> after = {});
  uint32_t reduceSum(uint64_t n, Handle input, Handle out, std::vector<uint32_t> after = {});
  // Any tensor op but those that write more than their output (layerNorm, nllLoss).
  uint32_t tensor(TensorOp op, std::vector<uint32_t> after = {});
  size_t size() const { return nodes_.size(); }

  struct Node {
    enum class Op { gemm, axpy, vadd, reduceSum, tensor } op;
    uint64_t n = 0;            // gemm: m
    uint32_t gemmN = 0, gemmK = 0;
    float alpha = 0, beta = 0;
    Handle a = 0, b = 0, c = 0;  // inputs, then the output
    std::vector<uint32_t> after;
    TensorOp tensor;  // op tensor
  };
  const std::vector<Node>& nodes() const { return nodes_; }

 private:
  uint32_t add(Node node);
  std::vector<Node> nodes_;
};

class Session {
 public:
  // Connects and says hello; fails with the scheduler's refusal (e.g. resourceExhausted
  // with the numbers) or unavailable when nothing answers.
  static Result<std::unique_ptr<Session>> open(const Options& options);
  ~Session();

  // The vaccel as the welcome described it, or the last describeVaccel().
  const VaccelInfo& vaccel() const { return vaccel_; }
  // Asks the scheduler where the vaccel is now (it changes when the vaccel is moved or
  // rebuilt after a loss), in order with the instructions before it; vaccel() follows.
  Result<VaccelInfo> describeVaccel();

  Handle alloc(uint64_t bytes);
  void free(Handle handle);
  void write(Handle buffer, uint64_t offset, std::span<const std::byte> data);
  Status read(Handle buffer, uint64_t offset, std::span<std::byte> out);
  void copy(Handle dst, uint64_t dstOffset, Handle src, uint64_t srcOffset, uint64_t length);
  void fill(Handle buffer, uint64_t offset, uint64_t length, uint8_t value);
  Handle loadProgram(ProgramKind kind, const std::string& name, std::span<const std::byte> code = {});
  void launch(Handle program, const std::string& kernel, std::vector<uint32_t> grid, std::vector<uint32_t> block,
              const std::vector<Arg>& args, uint32_t sharedBytes = 0);
  // An OpenCL NDRange: `global` work-items from `offset` (empty = 0) in work-groups of
  // `local` (empty = the card chooses).
  void launchRange(Handle program, const std::string& kernel, std::span<const uint64_t> global,
                   std::span<const uint64_t> local, std::span<const uint64_t> offset, std::span<const Arg> args);
  // Source or binary with compiler options (OpenCL C build options, NVRTC flags).
  Handle loadProgram(ProgramKind kind, const std::string& name, std::span<const std::byte> code, const std::string& options);
  // Waits for the card's account of a loaded program; a failed build is this call's
  // error (its message holds the build log).
  Result<ProgramInfo> describeProgram(Handle program);

  // c[m x n] = alpha * a[m x k] * b[k x n] + beta * c (f32, row-major).
  void gemm(uint32_t m, uint32_t n, uint32_t k, float alpha, Handle a, Handle b, float beta, Handle c);
  void axpy(uint64_t n, float alpha, Handle x, Handle y);
  void vadd(uint64_t n, Handle a, Handle b, Handle out);
  void reduceSum(uint64_t n, Handle input, Handle out);
  // Asynchronous like the other ops; a bad op is reported by fence() with the card's reason.
  // An elementwise op over f32 is held back: a later elementwise step on the same output
  // (an in-place scale of its result, or an op that reads the result of an in-place
  // affine as its first input, as in Adam's exp_avg.mul_(b1).add_(g, 1 - b1)) fuses into
  // it and both go as one op, also past ops on other memory in between (AdamW's
  // param.mul_(1 - lr * wd) with its param.addcdiv_). An op that touches a held op's
  // memory sends that one first; any other call sends them all.
  void tensor(const TensorOp& op);
  // Tensor ops that went fused into the one before them, so far.
  uint64_t fusedTensorOps() const;
  // Runs a graph as one instruction across the vaccel's cards (the scheduler places
  // each op, moving as few bytes between cards as it can); asynchronous like an op.
  void submitGraph(const Graph& graph, Graph::Placement placement = Graph::Placement::fewestBytes);

  // Waits until everything sent so far has completed; returns the first error not yet
  // reported (or the connection's loss).
  Status fence();
  Status sync() { return fence(); }
  // The first error of an earlier instruction heard so far and not yet reported (cleared
  // by this call): a read or another wait has received every reply sent before its own,
  // so after one this says, without a fence, whether the instructions before it failed.
  std::optional<Error> takeError() { return std::exchange(firstError_, std::nullopt); }
  // Every instruction up to this sequence number has completed (the last fence answered).
  uint64_t completedThrough() const { return completedThrough_; }
  // The device time of the kernels of the instruction `sequence`, by the card's own clock,
  // once a fence after it has answered (taken: asked once). None where the card does not
  // time its kernels.
  std::optional<uint64_t> takeKernelNs(uint64_t sequence);
  // Called with every error reply as it arrives (sequence, error), besides fence()'s
  // first-error report: an API that tracks commands (OpenCL events) fails the right one.
  void onError(std::function<void(uint64_t, const Error&)> listener) { errorListener_ = std::move(listener); }
  // Sends whatever is queued without waiting.
  Status flush();
  // The same but for the held tensor ops, which may still fuse with later ones.
  Status sendQueued();

  // Typed conveniences.
  void writeFloats(Handle buffer, const std::vector<float>& values) { write(buffer, 0, std::as_bytes(std::span(values))); }
  Result<std::vector<float>> readFloats(Handle buffer, size_t count);

  // Testing seam: the next instruction's handle is chosen by the caller (to probe
  // isolation with guessed handles). 0 restores client-chosen handles.
  void forceNextHandle(Handle handle) { forcedHandle_ = handle; }
  uint64_t lastSequence() const { return nextSequence_ - 1; }

 private:
  Session();
  struct Impl;
  Handle newHandle();
  // Queues one instruction (after the held tensor ops); returns its sequence number.
  uint64_t queue(capnp::MessageBuilder& message);
  uint64_t queueNow(capnp::MessageBuilder& message);
  void sendHeld();  // the held tensor ops, in order
  void sendHeldBefore(const TensorOp& op);
  void sendHeldTouching(Handle buffer, uint64_t first, uint64_t last);
  struct HeldOp;
  void sendHeldWhere(const std::function<bool(const HeldOp&)>& mustGo);
  struct HeldFill;
  const TensorOp* passFills(const TensorOp& op, std::optional<TensorOp>& rewritten);
  void sendFillsWhere(const std::function<bool(const HeldFill&)>& mustGo);
  void queueTensor(const TensorOp& op);
  void noteError(const Error& error);
  // Receives until `handle` says the awaited answer is complete (true); error replies are
  // noted (and given to the listener) on the way; an error for `seq` itself ends the wait.
  Status await(uint64_t seq, const std::function<bool(uint64_t, const void*)>& handle);
  void fillLaunchArgs(void* list, std::span<const Arg> args);
  uint64_t completedThrough_ = 0;
  std::function<void(uint64_t, const Error&)> errorListener_;
  std::unique_ptr<Impl> impl_;
  VaccelInfo vaccel_;
  uint64_t nextSequence_ = 1;
  Handle nextHandle_ = 1;
  Handle forcedHandle_ = 0;
  std::optional<Error> firstError_;
  std::unordered_map<uint32_t, uint64_t> kernelNs_;  // by sequence's low 32 bits; bounded
};

}  // namespace raccel::client
