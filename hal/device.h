// The hardware abstraction: a vendor-neutral Device with Buffers and Programs.
//
// Called from one worker thread per device (netaccel owns that thread); a Device and
// its objects are not thread-safe. The public methods validate their arguments (range
// checks, sizes, kinds) once, here, then call the protected do* hooks that a backend
// implements, so every backend answers bad input the same way. Optional features have
// a default body that reports `unimplemented`. Vendor headers appear only in
// hal/<backend>/*.cc; hal never includes Cap'n Proto.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.h"
#include "common/images.h"
#include "common/kinds.h"
#include "hal/tensor.h"

namespace raccel::hal {

using raccel::CardKind;
using raccel::ProgramKind;

// The built-in library every backend provides, loadable by this name.
inline constexpr const char* kBuiltinLibrary = "raccel.builtins";
// Bounds on what a program and a launch may carry.
inline constexpr size_t kMaxBuildOptions = 4096;
inline constexpr size_t kMaxArgBytes = 4096;      // one by-value argument
inline constexpr size_t kMaxKernelArgs = 256;
inline constexpr size_t kMaxKernels = 4096;
inline constexpr size_t kMaxNameBytes = 256;
inline constexpr size_t kMaxBuildLog = 64 * 1024;

struct Capabilities {
  CardKind kind = CardKind::cpu;
  std::string model;
  std::string backend;
  double tflops = 0;
  uint64_t memoryBytes = 0;
  std::vector<ProgramKind> programKinds;
  unsigned deviceIndex = 0;  // within its backend: what a sandbox process opens again
  // What the card's runtime reports for its kernels (0 = not known): compute units, the
  // largest work-group (threads per block), local (shared) memory per work-group.
  uint32_t computeUnits = 0;
  uint32_t maxWorkGroupSize = 0;
  uint64_t localMemBytes = 0;
  // OpenCL's extension list (space-separated) and CL_DEVICE_DOUBLE_FP_CONFIG (0: no
  // double precision), for the guest's OpenCL.
  std::string openclExtensions;
  uint64_t doubleFpConfig = 0;
  // The runtime's own version (OpenCL: the device's and the driver's version strings),
  // for what caches its compiled code (netaccel/kernel_template.h); empty if not known.
  std::string driverVersion;
  // What the card offers for images (common/images.h); none by default.
  ImageLimits images;
  // The device's own speed: its properties' FP32 peak (CUDA) or a calibration run;
  // 0 = not known. `tflops` is what the card registers, which an operator may set
  // lower (to sell fewer blocks); work is cut and bounded by the faster of the two.
  double ownTflops = 0;
};

// What a card's compiler says of a loaded program: its build log and, per kernel, the
// arguments and work-group limits (OpenCL's kernel, argument and work-group info).
struct KernelArgDescription {
  enum class Space : uint8_t { privateValue, global, constant, local };
  enum class Access : uint8_t { none, readOnly, writeOnly, readWrite };
  std::string name;
  std::string typeName;
  Space space = Space::privateValue;
  Access access = Access::none;
  uint32_t typeQualifiers = 0;  // OpenCL's CL_KERNEL_ARG_TYPE_* bits
  uint32_t size = 0;            // bytes of a by-value argument; 0 for pointers and local arrays
};

struct KernelDescription {
  std::string name;
  std::string attributes;
  std::vector<KernelArgDescription> args;
  uint64_t workGroupSize = 0;
  std::array<uint64_t, 3> compileWorkGroupSize{0, 0, 0};
  uint64_t localMemBytes = 0;
  uint64_t privateMemBytes = 0;
  uint64_t preferredMultiple = 0;
};

struct ProgramDescription {
  std::string buildLog;
  std::vector<KernelDescription> kernels;
  // `kernels` lists every kernel and each one's every parameter (OpenCL's argument info;
  // CUDA's parameter sizes, pointers included, where the driver tells them): a launch of
  // another name or with another count is refused before it reaches the card.
  bool argumentsKnown = false;
};

// A flat encoding of a ProgramDescription (a sandbox sends it through its window).
// decode() refuses what does not parse, and clips names and counts.
std::string encodeDescription(const ProgramDescription& d);
Result<ProgramDescription> decodeDescription(std::string_view bytes);

// One kernel's time on the device's own clock, reported once, when it has completed.
struct KernelTime {
  uint64_t tag = 0;  // what tagKernels() said when it was issued
  uint64_t ns = 0;
};

// A call that had returned, and then failed on the card (a sandboxed card's posted work).
struct DeferredError {
  uint64_t tag = 0;  // what tagKernels() said when it was made
  Error error;
};

class Buffer {
 public:
  virtual ~Buffer() = default;
  uint64_t size() const { return size_; }

 protected:
  explicit Buffer(uint64_t size) : size_(size) {}

 private:
  uint64_t size_;
};

class Program {
 public:
  virtual ~Program() = default;
  const std::string& name() const { return name_; }
  ProgramKind kind() const { return kind_; }
  virtual std::vector<std::string> kernels() const = 0;
  // The compiler's account of the program; by default only the kernels' names.
  virtual ProgramDescription describe() const;

 protected:
  Program(std::string name, ProgramKind kind) : name_(std::move(name)), kind_(kind) {}

 private:
  std::string name_;
  ProgramKind kind_;
};

// A kernel argument: a buffer (borrowed, from `offset` on), a scalar, a local
// (shared) array of scalar.u32 bytes, bytes passed by value (borrowed: a struct), an
// image (the buffer's pixels from `offset` on, read as `image` says), or a sampler
// (scalar.u32, common/images.h's sampler word).
struct KernelArg {
  enum class Type { buffer, u32, i32, u64, i64, f32, f64, local, bytes, image, sampler } type = Type::u64;
  Buffer* buffer = nullptr;
  uint64_t offset = 0;
  std::span<const std::byte> bytes;
  ImageDesc image;
  union {
    uint32_t u32;
    int32_t i32;
    uint64_t u64;
    int64_t i64;
    float f32;
    double f64;
  } scalar{};
};

struct LaunchDims {
  std::array<uint32_t, 3> grid{1, 1, 1};
  std::array<uint32_t, 3> block{1, 1, 1};
  uint32_t sharedBytes = 0;
  std::array<uint64_t, 3> offset{0, 0, 0};  // global id of the first work-item (OpenCL)
  bool autoBlock = false;  // the device picks the work-group size; grid is the global size
  // OpenCL's work_dim (1-3): that many dimensions, the block exactly as given. 0 (older
  // guests): 3 dimensions, and a block of 1 x 1 x 1 lets the device choose.
  uint8_t workDim = 0;
};

// c[m x n] = alpha * a[m x k] * b[k x n] + beta * c; f32, row-major.
struct GemmArgs {
  uint32_t m = 0, n = 0, k = 0;
  float alpha = 1, beta = 0;
  const Buffer* a = nullptr;
  const Buffer* b = nullptr;
  Buffer* c = nullptr;
};

struct BuiltinOp;  // below

class Device {
 public:
  virtual ~Device() = default;

  const Capabilities& capabilities() const { return caps_; }
  // Discovery sets a measured throughput once, before the device is handed to a worker.
  void setTflops(double tflops) { caps_.tflops = tflops; }
  void setOwnTflops(double tflops) { caps_.ownTflops = tflops; }
  void setDeviceIndex(unsigned index) { caps_.deviceIndex = index; }
  uint64_t memoryUsed() const { return memoryUsed_; }

  // Owned, zero-filled buffer (never another tenant's leftovers), or resourceExhausted
  // when the card's memory would be exceeded.
  Result<std::unique_ptr<Buffer>> allocate(uint64_t bytes);
  // Every buffer handed to a Device must have been allocated by it and not released.
  void release(std::unique_ptr<Buffer> buffer);

  Status write(Buffer& buffer, uint64_t offset, std::span<const std::byte> data);
  Status read(const Buffer& buffer, uint64_t offset, std::span<std::byte> out);
  Status copy(Buffer& dst, uint64_t dstOffset, const Buffer& src, uint64_t srcOffset, uint64_t length);
  Status fill(Buffer& buffer, uint64_t offset, uint64_t length, uint8_t value);

  // `options` go to the device's compiler (OpenCL C build options, NVRTC flags).
  Result<std::unique_ptr<Program>> loadProgram(ProgramKind kind, const std::string& name,
                                               std::span<const std::byte> code, const std::string& options = {});
  Status launch(Program& program, const std::string& kernel, const LaunchDims& dims,
                std::span<const KernelArg> args);

  Status gemm(const GemmArgs& args);
  Status axpy(uint64_t n, float alpha, const Buffer& x, Buffer& y);
  Status vadd(uint64_t n, const Buffer& a, const Buffer& b, Buffer& out);
  Status reduceSum(uint64_t n, const Buffer& input, Buffer& out);
  // One of the four above, as a value.
  Status run(const BuiltinOp& op);
  // A tensor op (hal/tensor.h), checked and lowered here; a shape with a zero runs nothing.
  Status tensor(const TensorOp& op);

  // Returns when all work issued so far has completed.
  virtual Status finish() = 0;

  // A run of queued work, started at once: between plug() and unplug() what is queued
  // waits, then the device takes it as one run. For a driver that wakes its device's
  // threads for every command (PoCL), a stream of small kernels arriving a few
  // microseconds apart otherwise pays a wake-up each. Whatever waits for the device
  // (finish, read, write, waitCompleted) unplugs first. No-ops where nothing is gained.
  virtual void plug() {}
  virtual void unplug() {}
  // Builds ahead what a first use would build and wait for (the tensor kernels), for a
  // device opened before its tenant is known (a warm sandbox). A no-op where nothing is.
  virtual Status prepare() { return {}; }
  // Launches each of raccel's own kernels once at every work-group size the device gives
  // them, on empty input, and waits: a driver that compiles a kernel per work-group size
  // and caches it on disk (PoCL) then has them all, and a tenant's first ops compile
  // nothing. Only ever run where no tenant is (netaccel/kernel_template.h). The number
  // of launches; 0 where nothing is compiled per size.
  virtual Result<unsigned> precompile() { return 0u; }
  // The caller reads [offset, offset + length) of `buffer` next, in order, `piece` bytes a
  // read(). A device whose reads fetch from another process (a sandbox) fetches the next
  // pieces ahead while the caller copies each one out, rather than a round trip a piece.
  // Anything else done with the device meanwhile ends it. A no-op elsewhere.
  virtual void readAhead(const Buffer& /*buffer*/, uint64_t /*offset*/, uint64_t /*length*/, uint64_t /*piece*/) {}

  // Asynchronous devices (a GPU's stream, the asynchronous simulated card) queue kernels
  // (launch and the built-in ops), return at once, and time each kernel on the device's
  // own clock (CUDA events, OpenCL profiling, the simulated card's queue). Their callers
  // charge that time, not the wall time of the call, which is only the enqueue.
  virtual bool timesKernels() const { return false; }
  // Kernels issued from now on carry this tag in their KernelTime.
  void tagKernels(uint64_t tag) { tag_ = tag; }
  // Kernels started so far (a run of small maps counts once: hal/flat_run.h); 0 where a
  // backend does not count them.
  virtual uint64_t launches() const { return 0; }
  // Appends the kernels completed since the last call; returns how many are in flight.
  virtual size_t takeCompleted(std::vector<KernelTime>&) { return 0; }
  // Blocks until a kernel in flight completes or `timeoutMs` passes.
  virtual void waitCompleted(unsigned /*timeoutMs*/) {}
  // The calls that returned before their work was checked on the card and then failed
  // there, oldest first, each once (a sandboxed card posts work: netaccel/sandbox.h).
  virtual std::vector<DeferredError> takeDeferredErrors() { return {}; }

  // Allocation refuses past this many bytes, below the card's memory (a sandbox that
  // serves one tenant holds that tenant's share). 0 = the card's memory.
  void setMemoryCap(uint64_t bytes) {
    memoryCap_ = bytes;
    doSetMemoryCap(bytes);
  }

  // Non-empty once the device context is gone for good (a CUDA context after a kernel
  // fault, a sandbox that died): every later call fails, its buffers are lost. Says why.
  virtual std::string lost() const { return {}; }
  // Lost, and not by anything its work did: its process was killed from outside (an
  // operator, the OOM killer), or its card went away under it (a driver reset, an
  // uncorrectable memory error). Failover may rebuild its tenants elsewhere.
  virtual bool lostFromOutside() const { return false; }

 protected:
  explicit Device(Capabilities caps) : caps_(std::move(caps)) {}

  virtual Result<std::unique_ptr<Buffer>> doAllocate(uint64_t bytes) = 0;
  virtual Status doWrite(Buffer& buffer, uint64_t offset, std::span<const std::byte> data) = 0;
  virtual Status doRead(const Buffer& buffer, uint64_t offset, std::span<std::byte> out) = 0;
  virtual Status doCopy(Buffer& dst, uint64_t dstOffset, const Buffer& src, uint64_t srcOffset, uint64_t length) = 0;
  virtual Status doFill(Buffer& buffer, uint64_t offset, uint64_t length, uint8_t value) = 0;
  virtual Result<std::unique_ptr<Program>> doLoadProgram(ProgramKind kind, const std::string& name,
                                                         std::span<const std::byte> code, const std::string& options);
  virtual Status doLaunch(Program& program, const std::string& kernel, const LaunchDims& dims,
                          std::span<const KernelArg> args);
  virtual Status doGemm(const GemmArgs& args) = 0;
  virtual Status doAxpy(uint64_t n, float alpha, const Buffer& x, Buffer& y) = 0;
  virtual Status doVadd(uint64_t n, const Buffer& a, const Buffer& b, Buffer& out) = 0;
  virtual Status doReduceSum(uint64_t n, const Buffer& input, Buffer& out) = 0;
  virtual Status doTensor(const LoweredTensorOp& op);
  virtual void doSetMemoryCap(uint64_t) {}
  // Before a buffer is freed: a backend whose queued work may still use it waits here.
  // (OpenCL objects are kept by the commands that use them; cuMemFree synchronizes.)
  virtual void doRelease(Buffer&) {}

  uint64_t kernelTag() const { return tag_; }

  Capabilities caps_;

 private:
  Status launchBuiltin(const std::string& kernel, std::span<const KernelArg> args);
  uint64_t memoryUsed_ = 0;
  uint64_t memoryCap_ = 0;
  uint64_t tag_ = 0;
};

// A built-in op as one value: an `op` instruction's gemm, axpy, vadd or reduceSum, or a
// launch of the built-in library's kernel of that name (parseBuiltin).
struct BuiltinOp {
  enum class Fn { gemm, axpy, vadd, reduceSum } fn = Fn::gemm;
  GemmArgs gemm;  // gemm
  uint64_t n = 0;  // the others: elements
  float alpha = 1;  // axpy
  Buffer* x = nullptr;    // axpy: x; vadd: a; reduceSum: input
  Buffer* y = nullptr;    // axpy: y (read and written); vadd: b
  Buffer* out = nullptr;  // vadd, reduceSum
};
const char* builtinName(BuiltinOp::Fn fn);
// A launch of kBuiltinLibrary's `kernel` with `args` as a BuiltinOp (invalidArgument or
// notFound naming the kernel's signature otherwise).
Result<BuiltinOp> parseBuiltin(const std::string& kernel, std::span<const KernelArg> args);
// Its sizes against its buffers (and a gemm's aliasing), as Device::run checks them.
Status checkBuiltin(const BuiltinOp& op);

// The checks Device's methods make before a backend sees a call, for callers that plan
// work before running it (hal/slicing.h): a byte range inside a buffer, n floats in a
// buffer, a gemm's sizes and aliasing. invalidArgument naming the problem otherwise.
Status checkBytes(const Buffer& buffer, uint64_t offset, uint64_t length, const char* what);
Status checkFloats(const Buffer& buffer, uint64_t n, const char* op, const char* arg);
Status checkGemm(const GemmArgs& g);

// Every field of a launch against the card's limits, before any reaches a driver: buffer
// arguments inside their buffers, images the card can make and inside theirs, samplers
// that decode, by-value bytes (each and in all) and local memory (the
// local arrays and sharedBytes together) within what the card reports, work-group sizes
// nonzero and within the card's largest, offsets that do not overflow. invalidArgument
// naming the field otherwise. Device::launch calls it; a fuzz target drives it alone.
Status checkLaunch(const Capabilities& caps, const std::string& kernel, const LaunchDims& dims,
                   std::span<const KernelArg> args);

// The program object a backend returns for the built-in library.
class BuiltinProgram final : public Program {
 public:
  BuiltinProgram() : Program(kBuiltinLibrary, ProgramKind::builtin) {}
  std::vector<std::string> kernels() const override { return {"gemm", "axpy", "vadd", "reduceSum"}; }
};

}  // namespace raccel::hal
