#include "hal/opencl/opencl_device.h"

#define CL_TARGET_OPENCL_VERSION 300
#include <CL/cl.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <string_view>

#include "common/program_units.h"
#include "hal/flat_run.h"
#include "hal/opencl/opencl_images.h"
#include "hal/tensor_kernels_source.h"

namespace raccel::hal {
namespace {

// What the tensor kernels (hal/tensor_kernels.inc) need of OpenCL C.
const char* kTensorPrelude = R"CLC(
#define RC_KERNEL __kernel void
#define RC_FUNC
#define RC_GLOBAL __global
#define RC_I64 long
#define RC_GEOM const RcGeom
#define RC_CPU_GID
#define RC_GID ((long)get_global_id(0))
#define RC_EXP(x) exp(x)
#define RC_LOG(x) log(x)
#define RC_FMAX(x, y) fmax(x, y)
#define RC_NAN NAN
#define RC_INFINITY INFINITY
#define RC_SQRT(x) sqrt(x)
#define RC_TANH(x) tanh(x)
#define RC_POW(x, y) pow(x, y)
#define RC_FABS(x) fabs(x)
#define RC_ERF(x) erf(x)
#define RC_LOG1P(x) log1p(x)
#define RC_COS(x) cos(x)
#define RC_F(name, x) name(x)
#define RC_LGAMMA(x) lgamma(x)
#define RC_F2(name, x, y) name(x, y)
#define RC_AS_UINT(x) as_uint(x)
#define RC_AS_FLOAT(u) as_float(u)
#define RC_U64 ulong
#define RC_TILED 1
)CLC";

// The built-in ops as OpenCL C. reduceSum is two passes: per-work-item Kahan partial
// sums over a strided slice, then one work-item folds the partials.
const char* kBuiltinSource = R"CLC(
__kernel void raccel_gemm(uint m, uint n, uint k, float alpha, float beta,
                          __global const float* a, __global const float* b, __global float* c) {
  uint j = get_global_id(0), i = get_global_id(1);
  if (i >= m || j >= n) return;
  float acc = 0.0f;
  for (uint p = 0; p < k; ++p) acc += a[i * k + p] * b[p * n + j];
  float old = beta == 0.0f ? 0.0f : beta * c[i * n + j];
  c[i * n + j] = alpha * acc + old;
}
__kernel void raccel_axpy(ulong n, float alpha, __global const float* x, __global float* y) {
  ulong i = get_global_id(0);
  if (i < n) y[i] = alpha * x[i] + y[i];
}
__kernel void raccel_vadd(ulong n, __global const float* a, __global const float* b, __global float* out) {
  ulong i = get_global_id(0);
  if (i < n) out[i] = a[i] + b[i];
}
__kernel void raccel_partial_sums(ulong n, __global const float* in, __global float* partial) {
  ulong id = get_global_id(0), stride = get_global_size(0);
  float sum = 0.0f, carry = 0.0f;
  for (ulong i = id; i < n; i += stride) {
    float y = in[i] - carry;
    float t = sum + y;
    carry = (t - sum) - y;
    sum = t;
  }
  partial[id] = sum;
}
__kernel void raccel_fold(uint count, __global const float* partial, __global float* out) {
  if (get_global_id(0) != 0) return;
  float sum = 0.0f, carry = 0.0f;
  for (uint i = 0; i < count; ++i) {
    float y = partial[i] - carry;
    float t = sum + y;
    carry = (t - sum) - y;
    sum = t;
  }
  out[0] = sum;
}
)CLC";
constexpr size_t kPartials = 1024;
// An f32 sum of at most this many outputs, each over at least this many elements, runs a
// work-group an output (rc_sum_groups) rather than a work-item an output.
constexpr int64_t kGroupSumOutputs = 4096, kGroupSumElements = 2048;

std::string clError(cl_int code) { return "OpenCL error " + std::to_string(code); }

// A failure that carries the driver's own OpenCL error, for a guest's OpenCL to report.
std::unexpected<Error> clFail(Code c, std::string message, cl_int code) {
  return std::unexpected(Error{c, std::move(message), validOpenclError(code)});
}

Status check(cl_int code, const char* what) {
  if (code == CL_SUCCESS) return {};
  Code c = code == CL_OUT_OF_RESOURCES || code == CL_OUT_OF_HOST_MEMORY || code == CL_MEM_OBJECT_ALLOCATION_FAILURE
               ? Code::resourceExhausted
               : Code::internal;
  return clFail(c, std::string(what) + ": " + clError(code), code);
}

std::string deviceString(cl_device_id d, cl_device_info what) {
  size_t size = 0;
  if (clGetDeviceInfo(d, what, 0, nullptr, &size) != CL_SUCCESS || size == 0) return {};
  std::string s(size, '\0');
  clGetDeviceInfo(d, what, size, s.data(), nullptr);
  while (!s.empty() && s.back() == '\0') s.pop_back();
  return s;
}

template <class T>
T deviceValue(cl_device_id d, cl_device_info what) {
  T v{};
  clGetDeviceInfo(d, what, sizeof v, &v, nullptr);
  return v;
}

std::vector<cl_device_id> allDevices(std::string* note) {
  cl_uint platforms = 0;
  cl_int rc = clGetPlatformIDs(0, nullptr, &platforms);
  if (rc != CL_SUCCESS || platforms == 0) {
    if (note) *note = rc == CL_SUCCESS || rc == -1001 ? "no OpenCL platform installed (ICD loader found none)" : clError(rc);
    return {};
  }
  std::vector<cl_platform_id> ids(platforms);
  clGetPlatformIDs(platforms, ids.data(), nullptr);
  std::vector<cl_device_id> out;
  for (auto p : ids) {
    cl_uint n = 0;
    if (clGetDeviceIDs(p, CL_DEVICE_TYPE_ALL, 0, nullptr, &n) != CL_SUCCESS || n == 0) continue;
    std::vector<cl_device_id> devs(n);
    clGetDeviceIDs(p, CL_DEVICE_TYPE_ALL, n, devs.data(), nullptr);
    out.insert(out.end(), devs.begin(), devs.end());
  }
  if (out.empty() && note) *note = std::to_string(platforms) + " OpenCL platform(s), no devices";
  return out;
}

CardKind kindOf(cl_device_id d) {
  auto type = deviceValue<cl_device_type>(d, CL_DEVICE_TYPE);
  if (type & CL_DEVICE_TYPE_GPU) return CardKind::gpu;
  if (type & CL_DEVICE_TYPE_ACCELERATOR) return CardKind::npu;
  return CardKind::cpu;
}

// Bytes of an OpenCL C scalar or vector type named `name` ("float", "uint4", "size_t"),
// or 0 when the name is not one (a struct, a typedef).
uint32_t scalarTypeBytes(const std::string& name, uint32_t addressBytes) {
  static const std::map<std::string, uint32_t> scalars = {
      {"char", 1},  {"uchar", 1}, {"short", 2}, {"ushort", 2}, {"half", 2},  {"int", 4},    {"uint", 4},
      {"float", 4}, {"long", 8},  {"ulong", 8}, {"double", 8}, {"bool", 1}};
  if (name == "size_t" || name == "ptrdiff_t" || name == "intptr_t" || name == "uintptr_t") return addressBytes;
  size_t digits = name.find_first_of("0123456789");
  auto it = scalars.find(name.substr(0, digits));
  if (it == scalars.end()) return 0;
  if (digits == std::string::npos) return it->second;
  int lanes = std::atoi(name.c_str() + digits);
  if (lanes == 3) lanes = 4;  // a 3-vector is stored as a 4-vector
  if (lanes != 2 && lanes != 4 && lanes != 8 && lanes != 16) return 0;
  return it->second * static_cast<uint32_t>(lanes);
}

class ClBuffer final : public Buffer {
 public:
  ClBuffer(uint64_t size, cl_mem mem) : Buffer(size), mem(mem) {}
  ~ClBuffer() override { clReleaseMemObject(mem); }
  cl_mem mem;
};
cl_mem memOf(const Buffer& b) { return static_cast<const ClBuffer&>(b).mem; }

class ClProgram final : public Program {
 public:
  ClProgram(std::string name, ProgramKind kind, cl_program program) : Program(std::move(name), kind), program(program) {}
  ProgramDescription describe() const override { return description; }
  ProgramDescription description;
  ~ClProgram() override {
    for (auto& [n, k] : cache) clReleaseKernel(k);
    clReleaseProgram(program);
  }
  std::vector<std::string> kernels() const override {
    size_t size = 0;
    clGetProgramInfo(program, CL_PROGRAM_KERNEL_NAMES, 0, nullptr, &size);
    std::string names(size, '\0');
    clGetProgramInfo(program, CL_PROGRAM_KERNEL_NAMES, size, names.data(), nullptr);
    std::vector<std::string> out;
    size_t start = 0;
    while (start < names.size()) {
      size_t end = names.find_first_of(";", start);
      if (end == std::string::npos) end = names.size();
      std::string n = names.substr(start, end - start);
      while (!n.empty() && n.back() == '\0') n.pop_back();
      if (!n.empty()) out.push_back(n);
      start = end + 1;
    }
    return out;
  }
  Result<cl_kernel> kernel(const std::string& name) {
    if (auto it = cache.find(name); it != cache.end()) return it->second;
    cl_int rc = CL_SUCCESS;
    cl_kernel k = clCreateKernel(program, name.c_str(), &rc);
    if (rc != CL_SUCCESS) {
      std::string have;
      for (auto& n : kernels()) have += (have.empty() ? "" : ", ") + n;
      return fail(Code::notFound, "no kernel '" + name + "' in program '" + this->name() + "' (it has: " + have + ")");
    }
    cache[name] = k;
    return k;
  }
  cl_program program;
  std::map<std::string, cl_kernel> cache;
};

class OpenclDevice final : public Device {
 public:
  OpenclDevice(Capabilities caps, cl_device_id device, cl_context context, cl_command_queue queue)
      : Device(std::move(caps)), device_(device), context_(context), queue_(queue) {}
  ~OpenclDevice() override {
    unplug();
    clFinish(queue_);
    for (auto& t : timed_) clReleaseEvent(t.event);
    releaseKept();
    builtins_.reset();
    tensorKernels_.reset();
    if (partials_) clReleaseMemObject(partials_);
    if (scratch_) clReleaseMemObject(scratch_);
    clReleaseCommandQueue(queue_);
    clReleaseContext(context_);
  }

  Status init(bool runs) {
    runs_ = runs;
    auto program = build(ProgramKind::openclC, kBuiltinLibrary, std::as_bytes(std::span(kBuiltinSource, std::strlen(kBuiltinSource))));
    if (!program) return fail(program.error().code, "building the built-in kernels: " + program.error().message);
    builtins_.reset(static_cast<ClProgram*>(program->release()));
    groups256_ = deviceValue<size_t>(device_, CL_DEVICE_MAX_WORK_GROUP_SIZE) >= 256;
    cpu_ = (deviceValue<cl_device_type>(device_, CL_DEVICE_TYPE) & CL_DEVICE_TYPE_CPU) != 0;
    // PoCL's basic device runs a command inside clSetUserEventStatus, under a lock that
    // running it takes again: unplug() hung there (PoCL 3.1). It runs only what is
    // flushed anyway, in the flushing thread: there is no wake-up for a plug to save.
    gates_ = !(deviceString(device_, CL_DEVICE_VERSION).find("PoCL") != std::string::npos &&
               deviceString(device_, CL_DEVICE_NAME).starts_with("basic"));
    baseAlign_ = std::max<uint64_t>(1, deviceValue<cl_uint>(device_, CL_DEVICE_MEM_BASE_ADDR_ALIGN) / 8);
    addressBytes_ = std::max<cl_uint>(4, deviceValue<cl_uint>(device_, CL_DEVICE_ADDRESS_BITS) / 8);
    cl_int rc = CL_SUCCESS;
    partials_ = clCreateBuffer(context_, CL_MEM_READ_WRITE, kPartials * sizeof(float), nullptr, &rc);
    return check(rc, "allocating reduction scratch");
  }

  Status finish() override {
    unplug();
    Status s = check(clFinish(queue_), "clFinish");
    if (s) releaseKept();
    return s;
  }
  // An event's command: queued, submitted, running, CL_COMPLETE, or an error (< 0).
  static cl_int executionStatus(cl_event event) {
    cl_int status = CL_QUEUED;
    clGetEventInfo(event, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof status, &status, nullptr);
    return status;
  }
  void releaseKept() {
    for (auto& k : kept_) clReleaseEvent(k.done);
    kept_.clear();
  }

  // Kernels are enqueued and return at once; each carries an event whose profiling
  // times (the device's clock) are its device time.
  bool timesKernels() const override { return true; }
  uint64_t launches() const override { return launches_; }
  size_t takeCompleted(std::vector<KernelTime>& out) override {
    while (!timed_.empty()) {
      cl_int status = executionStatus(timed_.front().event);
      // A driver may hold queued work until it is flushed (PoCL's basic device): not
      // while plugged, when the gate holds it anyway.
      if (status == CL_QUEUED && !gate_) clFlush(queue_);
      if (status > CL_COMPLETE) break;  // queued, submitted or running
      Timed t = timed_.front();
      timed_.pop_front();
      cl_ulong start = 0, end = 0;
      if (status == CL_COMPLETE &&
          clGetEventProfilingInfo(t.event, CL_PROFILING_COMMAND_START, sizeof start, &start, nullptr) == CL_SUCCESS &&
          clGetEventProfilingInfo(t.event, CL_PROFILING_COMMAND_END, sizeof end, &end, nullptr) == CL_SUCCESS)
        t.shares.empty() ? out.push_back({t.tag, end > start ? end - start : 0})
                         : splitRunTime(t.shares, end > start ? end - start : 0, out);
      else if (status < 0 && lost_.empty()) {
        lost_ = "a kernel ended abnormally (" + clError(status) + ")";
        cardLost_ = status == CL_DEVICE_NOT_AVAILABLE;  // the card went away under it (a reset), not the kernel's doing
      }
      clReleaseEvent(t.event);
    }
    return timed_.size();
  }
  void waitCompleted(unsigned) override {
    unplug();
    if (!timed_.empty()) clWaitForEvents(1, &timed_.front().event);
  }

  // The commands queued from here wait behind a barrier on a user event; unplug()
  // completes it and PoCL's threads take them as one run. Without a barrier (the driver
  // refused one, or PoCL's basic device) no command is held; small maps gather into runs
  // (doTensor) either way.
  void plug() override {
    plugged_ = true;
    if (gate_ || !gates_) return;
    cl_int rc = CL_SUCCESS;
    cl_event gate = clCreateUserEvent(context_, &rc);
    if (rc != CL_SUCCESS || !gate) return;
    if (clEnqueueBarrierWithWaitList(queue_, 1, &gate, nullptr) != CL_SUCCESS) {
      clSetUserEventStatus(gate, CL_COMPLETE);
      clReleaseEvent(gate);
      return;
    }
    gate_ = gate;
  }
  void unplug() override {
    plugged_ = false;
    launchRunOrLose();  // behind the gate, if any: it starts with the rest
    if (!gate_) return;
    clSetUserEventStatus(gate_, CL_COMPLETE);
    clReleaseEvent(gate_);
    gate_ = nullptr;
  }
  std::string lost() const override { return lost_; }
  bool lostFromOutside() const override { return cardLost_; }

 protected:
  Result<std::unique_ptr<Buffer>> doAllocate(uint64_t bytes) override {
    cl_int rc = CL_SUCCESS;
    cl_mem mem = clCreateBuffer(context_, CL_MEM_READ_WRITE, bytes, nullptr, &rc);
    if (auto s = check(rc, "clCreateBuffer"); !s) return fail(s.error());
    auto buffer = std::make_unique<ClBuffer>(bytes, mem);
    // Zero it: a new buffer never shows an earlier tenant's data.
    if (auto s = doFill(*buffer, 0, bytes, 0); !s) return fail(s.error());
    return std::unique_ptr<Buffer>(std::move(buffer));
  }
  Status doWrite(Buffer& b, uint64_t offset, std::span<const std::byte> data) override {
    unplug();  // it waits for the queue
    return check(clEnqueueWriteBuffer(queue_, memOf(b), CL_TRUE, offset, data.size(), data.data(), 0, nullptr, nullptr),
                 "clEnqueueWriteBuffer");
  }
  Status doRead(const Buffer& b, uint64_t offset, std::span<std::byte> out) override {
    unplug();
    return check(clEnqueueReadBuffer(queue_, memOf(b), CL_TRUE, offset, out.size(), out.data(), 0, nullptr, nullptr),
                 "clEnqueueReadBuffer");
  }
  Status doCopy(Buffer& dst, uint64_t dstOffset, const Buffer& src, uint64_t srcOffset, uint64_t length) override {
    if (length == 0) return {};
    if (auto s = launchRun(); !s) return s;
    if (&dst == &src && std::max(dstOffset, srcOffset) < std::min(dstOffset, srcOffset) + length) {
      // OpenCL forbids overlapping copies within one buffer: go through the host.
      std::vector<std::byte> tmp(length);
      if (auto s = doRead(src, srcOffset, tmp); !s) return s;
      return doWrite(dst, dstOffset, tmp);
    }
    return check(clEnqueueCopyBuffer(queue_, memOf(src), memOf(dst), srcOffset, dstOffset, length, 0, nullptr, nullptr),
                 "clEnqueueCopyBuffer");
  }
  Status doFill(Buffer& b, uint64_t offset, uint64_t length, uint8_t value) override {
    if (length == 0) return {};
    if (auto s = launchRun(); !s) return s;
    return check(clEnqueueFillBuffer(queue_, memOf(b), &value, 1, offset, length, 0, nullptr, nullptr), "clEnqueueFillBuffer");
  }

  Result<std::unique_ptr<Program>> doLoadProgram(ProgramKind kind, const std::string& name,
                                                 std::span<const std::byte> code, const std::string& options) override {
    return build(kind, name, code, options);
  }

  Status doLaunch(Program& program, const std::string& kernelName, const LaunchDims& dims,
                  std::span<const KernelArg> args) override {
    if (auto s = launchRun(); !s) return s;
    auto& p = static_cast<ClProgram&>(program);
    auto kernel = p.kernel(kernelName);
    if (!kernel) return fail(kernel.error());
    // What the arguments need made on the card (sub-buffers, images, samplers) lives
    // until the kernel and its copies back have run: a driver need not keep a kernel
    // argument's object alive for the command (PoCL 3.1 faults, now and then, on an
    // image of a buffer released while its kernel runs).
    auto owned = std::make_unique<LaunchObjects>(context_, queue_);
    LaunchObjects& made = *owned;
    if (auto s = setArgs(p, kernelName, *kernel, args, made); !s) return s;
    cl_uint declared = 0;
    clGetKernelInfo(*kernel, CL_KERNEL_NUM_ARGS, sizeof declared, &declared, nullptr);
    if (declared != args.size())
      return fail(Code::invalidArgument, "kernel " + kernelName + " takes " + std::to_string(declared) + " arguments, " +
                                             std::to_string(args.size()) + " given");
    size_t global[3], local[3], offset[3];
    // An explicit block is always passed (a kernel with reqd_work_group_size(1,1,1)
    // needs its 1 x 1 x 1). Only guests older than workDim meant "the device chooses"
    // by a block of 1 x 1 x 1.
    bool defaultLocal = dims.autoBlock ||
                        (dims.workDim == 0 && dims.block[0] == 1 && dims.block[1] == 1 && dims.block[2] == 1);
    const cl_uint workDim = dims.workDim ? dims.workDim : 3;
    for (int d = 0; d < 3; ++d) {
      global[d] = dims.autoBlock ? size_t{dims.grid[d]} : size_t{dims.grid[d]} * dims.block[d];
      local[d] = dims.block[d];
      offset[d] = dims.offset[d];
      if (global[d] == 0) return fail(Code::invalidArgument, "launch grid and block sizes must be nonzero");
    }
    bool anyOffset = offset[0] || offset[1] || offset[2];
    cl_event event = nullptr;
    cl_int rc = clEnqueueNDRangeKernel(queue_, *kernel, workDim, anyOffset ? offset : nullptr, global,
                                       defaultLocal ? nullptr : local, 0, nullptr, &event);
    launches_ += rc == CL_SUCCESS;
    track(event);
    if (rc == CL_INVALID_WORK_GROUP_SIZE || rc == CL_INVALID_WORK_ITEM_SIZE)
      return clFail(Code::invalidArgument, "launch of " + kernelName + ": block size not accepted by this device (" + clError(rc) + ")", rc);
    if (rc == CL_INVALID_KERNEL_ARGS)
      return clFail(Code::invalidArgument, "launch of " + kernelName + ": not every argument is set", rc);
    if (auto s = check(rc, "clEnqueueNDRangeKernel"); !s) return s;
    Status copied = check(made.finish(), "copying the images the kernel wrote back into their buffers");
    keepUntilDone(std::move(owned));
    return copied;
  }

  // Holds `made` until the commands enqueued so far have run (an in-order queue: a
  // marker after them completes last); releases what earlier launches held once theirs
  // have.
  void keepUntilDone(std::unique_ptr<LaunchObjects> made) {
    while (!kept_.empty() && executionStatus(kept_.front().done) <= CL_COMPLETE) {  // complete, or ended in error
      clReleaseEvent(kept_.front().done);
      kept_.pop_front();
    }
    if (made->empty()) return;
    if (kept_.size() >= 4096) (void)finish();  // a bound on what waits (it releases what is kept)
    cl_event done = nullptr;
    if (clEnqueueMarkerWithWaitList(queue_, 0, nullptr, &done) != CL_SUCCESS || !done) {
      (void)finish();  // no marker: wait here rather than release early
      return;
    }
    kept_.push_back({done, std::move(made)});
  }
  struct Kept {
    cl_event done;
    std::unique_ptr<LaunchObjects> objects;
  };
  std::deque<Kept> kept_;

  // Sets each argument of `kernel`, making on the card what one needs.
  Status setArgs(ClProgram& p, const std::string& kernelName, cl_kernel kernel, std::span<const KernelArg> args,
                 LaunchObjects& made) {
    auto described = std::find_if(p.description.kernels.begin(), p.description.kernels.end(),
                                  [&](const KernelDescription& k) { return k.name == kernelName; });
    for (size_t i = 0; i < args.size(); ++i) {
      const KernelArg& a = args[i];
      auto which = [&] { return "kernel " + kernelName + " argument " + std::to_string(i); };  // (made only to refuse)
      // What the card's compiler says of this argument, if it said.
      const KernelArgDescription* declared =
          described != p.description.kernels.end() && i < described->args.size() ? &described->args[i] : nullptr;
      // An image only where the kernel takes one (a driver may take any cl_mem for any).
      if (declared && (a.type == KernelArg::Type::image) != isImageTypeName(declared->typeName) &&
          (a.type == KernelArg::Type::image || a.type == KernelArg::Type::buffer))
        return clFail(Code::invalidArgument, which() + " is " + (a.type == KernelArg::Type::image ? "an image" : "a buffer") +
                                                 "; the kernel takes " + declared->typeName, CL_INVALID_MEM_OBJECT);
      cl_int rc = CL_SUCCESS;
      cl_mem mem = nullptr;
      cl_sampler sampler = nullptr;
      switch (a.type) {
        case KernelArg::Type::buffer:
          mem = memOf(*a.buffer);
          if (a.offset != 0) {
            if (a.offset % baseAlign_ != 0)
              return fail(Code::invalidArgument, which() + ": a buffer from offset " + std::to_string(a.offset) +
                                                     " is not aligned to this device's " + std::to_string(baseAlign_) +
                                                     " bytes (CL_DEVICE_MEM_BASE_ADDR_ALIGN)");
            if (a.offset >= a.buffer->size())
              return fail(Code::invalidArgument, which() + ": a buffer from its very end (nothing left to pass)");
            rc = made.subBuffer(mem, a.offset, a.buffer->size() - a.offset, &mem);
            if (rc != CL_SUCCESS) break;
          }
          rc = clSetKernelArg(kernel, i, sizeof mem, &mem);
          break;
        case KernelArg::Type::image: {
          // Copied back after the kernel unless the kernel declares it read_only (or
          // the card did not say: then it is copied back).
          bool readOnly = declared && declared->access == KernelArgDescription::Access::readOnly;
          rc = made.image(memOf(*a.buffer), a.offset, a.image, !readOnly, &mem);
          if (rc == CL_SUCCESS) rc = clSetKernelArg(kernel, i, sizeof mem, &mem);
          break;
        }
        case KernelArg::Type::sampler:
          rc = made.sampler(a.scalar.u32, &sampler);
          if (rc == CL_SUCCESS) rc = clSetKernelArg(kernel, i, sizeof sampler, &sampler);
          break;
        case KernelArg::Type::u32: rc = clSetKernelArg(kernel, i, 4, &a.scalar.u32); break;
        case KernelArg::Type::i32: rc = clSetKernelArg(kernel, i, 4, &a.scalar.i32); break;
        case KernelArg::Type::f32: rc = clSetKernelArg(kernel, i, 4, &a.scalar.f32); break;
        case KernelArg::Type::u64: rc = clSetKernelArg(kernel, i, 8, &a.scalar.u64); break;
        case KernelArg::Type::i64: rc = clSetKernelArg(kernel, i, 8, &a.scalar.i64); break;
        case KernelArg::Type::f64: rc = clSetKernelArg(kernel, i, 8, &a.scalar.f64); break;
        case KernelArg::Type::local: rc = clSetKernelArg(kernel, i, a.scalar.u32, nullptr); break;
        case KernelArg::Type::bytes: rc = clSetKernelArg(kernel, i, a.bytes.size(), a.bytes.data()); break;
      }
      if (rc == CL_IMAGE_FORMAT_NOT_SUPPORTED || rc == CL_INVALID_IMAGE_SIZE || rc == CL_INVALID_IMAGE_FORMAT_DESCRIPTOR ||
          rc == CL_INVALID_IMAGE_DESCRIPTOR)
        return clFail(Code::invalidArgument, which() + ": the card refused the image (" + clError(rc) + ")", rc);
      if (rc != CL_SUCCESS)
        return clFail(Code::invalidArgument, which() + " does not match its declaration (" + clError(rc) + ")", rc);
    }
    return {};
  }

  Status doGemm(const GemmArgs& g) override {
    if (auto s = launchRun(); !s) return s;
    size_t global[2] = {roundUp(g.n, 16), roundUp(g.m, 16)};
    size_t local[2] = {16, 16};
    return run("raccel_gemm", 2, global, groups256_ ? local : nullptr, g.m, g.n, g.k, g.alpha, g.beta, memOf(*g.a),
               memOf(*g.b), memOf(*g.c));
  }
  Status doAxpy(uint64_t n, float alpha, const Buffer& x, Buffer& y) override {
    if (auto s = launchRun(); !s) return s;
    size_t global[1] = {roundUp(n, 256)};
    return run("raccel_axpy", 1, global, nullptr, cl_ulong{n}, alpha, memOf(x), memOf(y));
  }
  Status doVadd(uint64_t n, const Buffer& a, const Buffer& b, Buffer& out) override {
    if (auto s = launchRun(); !s) return s;
    size_t global[1] = {roundUp(n, 256)};
    return run("raccel_vadd", 1, global, nullptr, cl_ulong{n}, memOf(a), memOf(b), memOf(out));
  }
  Status prepare() override { return buildTensorKernels(); }
  // On a CPU device (PoCL) every tensor kernel launched once in one and in two dimensions,
  // the two work-group shapes cpuGroups gives it (three dimensions share the second), or
  // at its required size, over one work-group of an empty geometry: no work-items (n 0),
  // every extent 1 and every stride 0, so that a kernel that reads before it checks n
  // stays in its first elements of a zeroed buffer.
  Result<unsigned> precompile() override {
    if (!cpu_) return 0u;
    if (auto s = buildTensorKernels(); !s) return fail(s.error());
    auto scratch = allocate(64 << 10);
    if (!scratch) return fail(scratch.error());
    const cl_mem mem = memOf(**scratch);
    if (auto s = fill(**scratch, 0, 64 << 10, 0); !s) return fail(s.error());
    kernels::RcGeom geom{};
    geom.dims = RC_MAX_DIMS;
    std::fill(std::begin(geom.shape), std::end(geom.shape), 1);
    kernels::RcRun run{};
    unsigned launched = 0;
    for (const std::string& name : tensorKernels_->kernels()) {
      auto kernel = tensorKernels_->kernel(name);
      if (!kernel) return fail(kernel.error());
      cl_uint args = 0;
      size_t required[3] = {0, 0, 0};
      cl_int rc = clGetKernelInfo(*kernel, CL_KERNEL_NUM_ARGS, sizeof args, &args, nullptr);
      if (rc == CL_SUCCESS)
        rc = clGetKernelWorkGroupInfo(*kernel, device_, CL_KERNEL_COMPILE_WORK_GROUP_SIZE, sizeof required, required, nullptr);
      rc = rc == CL_SUCCESS ? (name == "rc_flat_run" ? clSetKernelArg(*kernel, 0, sizeof run, &run)
                                                     : clSetKernelArg(*kernel, 0, sizeof geom, &geom))
                            : rc;
      for (cl_uint i = 1; i < args && rc == CL_SUCCESS; ++i) rc = clSetKernelArg(*kernel, i, sizeof mem, &mem);
      if (auto s = check(rc, name.c_str()); !s) return fail(s.error());
      for (cl_uint dims : {1u, 2u}) {
        size_t one[3] = {1, 1, 1};
        CpuRange r = cpuGroups(name, dims, one);
        if (required[0]) std::copy(required, required + 3, r.local.begin()), std::copy(required, required + 3, r.global.begin());
        rc = clEnqueueNDRangeKernel(queue_, *kernel, required[0] ? 3 : dims, nullptr, r.global.data(), r.local.data(), 0,
                                    nullptr, nullptr);
        if (auto s = check(rc, name.c_str()); !s) return fail(s.error());
        ++launched;
        if (required[0]) break;
      }
    }
    if (auto s = check(clFinish(queue_), "precompile"); !s) return fail(s.error());
    return launched;
  }
  // Built on first use (most tenants never run one), or ahead by prepare().
  Status buildTensorKernels() {
    if (tensorKernels_) return {};
    const std::string source = std::string(kTensorPrelude) + kTensorKernelSource;
    auto program = build(ProgramKind::openclC, "raccel.tensor", std::as_bytes(std::span(source)));
    if (!program) return fail(program.error().code, "building the tensor kernels: " + program.error().message);
    tensorKernels_.reset(static_cast<ClProgram*>(program->release()));
    return {};
  }
  Status doTensor(const LoweredTensorOp& op) override {
    if (auto s = buildTensorKernels(); !s) return s;
    if (plugged_ && runs_ && FlatRun::fits(op)) {  // plugged: a small flat map waits to run with the next ones
      if (run_.join(op, kernelTag())) return {};
      if (auto s = launchRun(); !s) return s;
      if (run_.join(op, kernelTag())) return {};
    }
    if (auto s = launchRun(); !s) return s;
    return launchTensor(op);
  }
  // The maps gathered in run_ (doTensor), as one rc_flat_run (a run of one as its own
  // kernel), tagged with each map's tag; every other use of the queue launches them first.
  Status launchRun() {
    if (run_.empty()) return {};
    const uint64_t tag = kernelTag();
    Status s;
    if (run_.size() == 1) {
      const LoweredTensorOp op = run_.first();
      tagKernels(run_.shares()[0].first);
      run_.clear();
      s = launchTensor(op);
    } else {
      const auto& b = run_.buffers();
      const size_t global[1] = {size_t(run_.workItems())};
      shares_ = run_.shares();
      s = runIn(*tensorKernels_, "rc_flat_run", 1, global, nullptr, run_.args(), memOf(*b[0]), memOf(*b[1]),
                memOf(*b[2]), memOf(*b[3]));
      shares_.clear();
      run_.clear();
    }
    tagKernels(tag);
    return s;
  }
  // launchRun where no caller takes a Status: a run that could not be queued loses the
  // device (its maps were answered as done).
  void launchRunOrLose() {
    if (auto s = launchRun(); !s && lost_.empty()) lost_ = "a run of maps could not be queued: " + s.error().message;
  }
  void doRelease(Buffer&) override { launchRunOrLose(); }
  Status launchTensor(const LoweredTensorOp& op) {
    auto& b = op.buffers;
    // On a CPU device, rc_matmul_vec (matmulVec) where out's columns allow it.
    const int d = int(op.geom.dims) - 3;
    if (TensorFn(op.geom.fn) == TensorFn::matmul && cpu_ && op.geom.shape[d + 1] >= kVecColumns &&
        op.geom.stride[0][d + 1] == 1)
      if (auto s = matmulVec(op); !s || *s) return s ? Status{} : fail(s.error());
    if (cpu_)  // a sum into few outputs in two passes (sumInTwo)
      if (auto s = sumInTwo(op); !s || *s) return s ? Status{} : fail(s.error());
    const TensorLaunch l = tensorLaunch(op.geom);
    return runIn(*tensorKernels_, l.kernel, l.dims, l.global.data(), l.grouped ? l.local.data() : nullptr, op.geom,
                 memOf(*b[0]), memOf(*b[1]), memOf(*b[2]), memOf(*b[3]));
  }
  // Which kernel runs a tensor op (other than rc_matmul_vec's), over which grid.
  struct TensorLaunch {
    const char* kernel;
    cl_uint dims = 1;
    std::array<size_t, 3> global{1, 1, 1}, local{1, 1, 1};
    bool grouped = false;  // `local` is its work-group (else the driver's choice)
  };
  TensorLaunch tensorLaunch(const kernels::RcGeom& g) const {
    const TensorFn fn = TensorFn(g.fn);
    const int d = int(g.dims) - 3;
    // rc_matmul_tiled, in 16 x 16 work-groups, for entries of at least 64 rows, columns and
    // k: below that staging tiles and the work-groups' barriers cost more than the reuse
    // saves (the reference CNN's matmuls, 16 to 72 wide, ran 2-5x slower tiled than
    // rc_matmul's four running sums).
    if (fn == TensorFn::matmul && groups256_ && g.shape[d] >= kTiledFrom && g.shape[d + 1] >= kTiledFrom &&
        g.inner >= kTiledFrom) {
      const uint64_t rows = uint64_t(g.shape[d]), cols = uint64_t(g.shape[d + 1]), entries = d ? uint64_t(g.shape[0]) : 1;
      return {"rc_matmul_tiled", 2, {roundUp(cols, 16), roundUp(rows, 16) * entries, 1}, {16, 16, 1}, true};
    }
    if (cpu_ && fn == TensorFn::maxPool2d && g.dims >= 4 && g.shape[g.dims - 4] > 0)  // a work-item a plane of windows
      return {"rc_max_pool_planes", 1, {roundUp(uint64_t(g.n / g.shape[g.dims - 4]), 64), 1, 1}};
    if (cpu_ && sumRowsVec(g))  // a work-item a row of neighbours, as vectors
      return {"rc_sum_rows_vec", 1, {roundUp(uint64_t(g.n), 64), 1, 1}};
    if (fn == TensorFn::sum && g.type[1] == int(TensorType::f32) && groups256_ && g.n <= kGroupSumOutputs &&
        g.inner >= kGroupSumElements)  // a work-group an output
      return {"rc_sum_groups", 1, {size_t(g.n) * 256, 1, 1}, {256, 1, 1}, true};
    if (cpu_ && gatherVec(g)) {  // an im2col or col2im as vectors (1 to 4 kept dimensions)
      const int kept = int(g.dims) - 2;
      return {"rc_gather_vec", 3, {1, kept > 1 ? size_t(g.shape[kept - 2]) : 1, kept > 2 ? size_t(g.shape[kept - 3]) : 1}};
    }
    if (const int d = cpu_ ? indexRowsVec(g) : -1; d >= 0)  // a work-item a row of neighbours, as vectors
      return {fn == TensorFn::indexSelect ? "rc_index_select_rows" : "rc_index_add_cols", 1, {size_t(g.n / g.shape[d]), 1, 1}};
    if (cpu_ && layerNormVec(g))  // a work-item a row, as vectors
      return {fn == TensorFn::layerNorm ? "rc_layer_norm_vec" : "rc_layer_norm_backward_vec", 2, {1, size_t(g.n), 1}};
    if (const char* convert = flatConvertKernel(g))  // f32 to f16 or bf16 and back, contiguous
      return {convert, 1, {roundUp(static_cast<uint64_t>(g.n), 64), 1, 1}};
    const char* fast = fastMapKernel(g);
    if (cpu_ && fast && g.dims == 1 && (fn == TensorFn::gelu || fn == TensorFn::geluBackward))
      return {fn == TensorFn::gelu ? "rc_flat_gelu_vec" : "rc_flat_gelu_backward_vec", 1,
              {size_t((uint64_t(g.n) + kVecColumns - 1) / kVecColumns), 1, 1}};
    if (!fast && typedGridMap(g)) fast = "rc_grid_typed";
    if (fast && g.dims > 1) {  // a grid: the last dimension first (in spans of rows, rc_rows_)
      const int dims = int(g.dims);
      const uint64_t cols = uint64_t(g.shape[dims - 1]);
      const char* rows = cpu_ ? rowsMapKernel(g) : nullptr;
      return {rows ? rows : fast, 3,
              {rows ? size_t((cols + kRowSpan - 1) / kRowSpan) : size_t(cols), size_t(g.shape[dims - 2]),
               dims > 3 ? size_t(g.shape[0] * g.shape[1]) : dims > 2 ? size_t(g.shape[0]) : 1}};
    }
    return {fast ? fast : tensorKernelName(fn), 1, {roundUp(static_cast<uint64_t>(g.n), 64), 1, 1}};
  }
  // A matmul as rc_matmul_vec (out's columns neighbours): true when it ran. b's columns
  // that are not neighbours are laid out as rows first (rc_matmul_b_rows, or _vec where
  // its k are neighbours, into scratch_ of at most kScratchBytes; false past that:
  // rc_matmul reads b as it is).
  // Except where a's and b's k are neighbours and k is RC_SUM4_FROM or more (x W^T, a
  // convolution's weight gradient g cols^T): rc_matmul_nt reads b as it is, 2-4x faster
  // than laying it out (8 x 27 x 4608: 33 us against 152; 512^3: 2.2 ms against 3.8).
  Result<bool> matmulVec(const LoweredTensorOp& op) {
    const int d = int(op.geom.dims) - 3;
    const uint64_t rows = uint64_t(op.geom.shape[d]), cols = uint64_t(op.geom.shape[d + 1]), k = uint64_t(op.geom.inner);
    const uint64_t entries = d ? uint64_t(op.geom.shape[0]) : 1;
    kernels::RcGeom geom = op.geom;
    cl_mem b = memOf(*op.buffers[2]);
    auto& u = op.buffers;
    const bool bApart = geom.stride[2][d + 1] != 1, bkNear = geom.stride[2][d + 2] == 1;
    if (bApart && bkNear && geom.stride[1][d + 2] == 1 && k >= RC_SUM4_FROM) {
      size_t global[3] = {size_t((cols + kNtCols - 1) / kNtCols), size_t((rows + kNtRows - 1) / kNtRows), size_t(entries)};
      if (auto s = runIn(*tensorKernels_, "rc_matmul_nt", 3, global, nullptr, geom, memOf(*u[0]), memOf(*u[1]), b, memOf(*u[3])); !s)
        return fail(s.error());
      return true;
    }
    if (bApart) {
      if (k == 0 || cols > kScratchBytes / 4 / k / entries) return false;
      if (auto s = scratch(entries * k * cols * 4); !s) return fail(s.error());
      size_t global[3] = {size_t(cols), size_t(bkNear ? (k + kVecColumns - 1) / kVecColumns : k), size_t(entries)};
      if (auto s = runIn(*tensorKernels_, bkNear ? "rc_matmul_b_rows_vec" : "rc_matmul_b_rows", 3, global, nullptr, op.geom,
                         scratch_, b);
          !s)
        return fail(s.error());
      geom.offset[2] = 0;
      geom.stride[2][0] = int64_t(k * cols);
      geom.stride[2][d + 1] = 1;
      geom.stride[2][d + 2] = int64_t(cols);
      b = scratch_;
    }
    size_t global[3] = {size_t((cols + kVecColumns - 1) / kVecColumns), size_t((rows + kVecRows - 1) / kVecRows), size_t(entries)};
    if (auto s = runIn(*tensorKernels_, "rc_matmul_vec", 3, global, nullptr, geom, memOf(*u[0]), memOf(*u[1]), b, memOf(*u[3])); !s)
      return fail(s.error());
    return true;
  }
  // An f32 sum into fewer than kSplitSumOutputs outputs over two or more reduced
  // dimensions, the last at least kVecColumns long (a batch norm's or a convolution's
  // per-channel sums over [N, C, H x W]), on a CPU device: true when it ran. rc_reduce's
  // work-items, one an output, would leave the cores idle; here the last reduced
  // dimension's rows are summed first, a work-item a row, into scratch_, then those sums
  // into the outputs with the op's alpha and beta (the additions' order is a parallel
  // sum's, as rc_sum_groups' is).
  Result<bool> sumInTwo(const LoweredTensorOp& op) {
    const kernels::RcGeom& g = op.geom;
    const int last = int(g.dims) - 1;
    if (TensorFn(g.fn) != TensorFn::sum || g.type[0] != int(TensorType::f32) || g.type[1] != int(TensorType::f32) ||
        g.n >= kSplitSumOutputs || last < 1 || g.shape[last] < kVecColumns)
      return false;
    int first = last;  // the reduced dimensions, [first, dims), as rc_reduce finds them
    int64_t count = g.shape[last];
    while (first > 0 && count < g.inner) count *= g.shape[--first];
    const int64_t rows = g.inner / g.shape[last];
    if (count != g.inner || first == last || uint64_t(g.n) > kScratchBytes / 4 / uint64_t(rows)) return false;
    kernels::RcGeom rowSums = g;  // out: scratch_, [kept..., reduced but the last...] row-major
    rowSums.n = g.n * rows;
    rowSums.inner = g.shape[last];
    rowSums.alpha = 1, rowSums.beta = 0;
    rowSums.offset[0] = 0;
    rowSums.stride[0][last] = 0;
    for (int64_t d = last - 1, at = 1; d >= 0; at *= g.shape[d--]) rowSums.stride[0][d] = at;
    kernels::RcGeom total = g;  // the rows' sums into out: the last dimension gone
    total.dims = g.dims - 1;
    total.inner = rows;
    total.offset[1] = 0;
    for (int d = 0; d < last; ++d) total.stride[1][d] = rowSums.stride[0][d];
    if (auto s = scratch(uint64_t(rowSums.n) * 4); !s) return fail(s.error());
    auto& b = op.buffers;
    size_t global[1] = {roundUp(uint64_t(rowSums.n), 64)};
    const char* rowKernel = sumRowsVec(rowSums) ? "rc_sum_rows_vec" : "rc_reduce";
    if (auto s = runIn(*tensorKernels_, rowKernel, 1, global, nullptr, rowSums, scratch_, memOf(*b[1]), scratch_, scratch_); !s)
      return fail(s.error());
    global[0] = roundUp(uint64_t(g.n), 64);
    if (auto s = runIn(*tensorKernels_, "rc_reduce", 1, global, nullptr, total, memOf(*b[0]), scratch_, scratch_, scratch_); !s)
      return fail(s.error());
    return true;
  }
  // scratch_ of at least `bytes` (at most kScratchBytes): what an op lays out between its
  // kernels. The queue runs in order, so a kernel still to run keeps what it was given.
  Status scratch(uint64_t bytes) {
    if (bytes <= scratchBytes_) return {};
    if (scratch_) clReleaseMemObject(scratch_);
    cl_int rc = CL_SUCCESS;
    scratch_ = clCreateBuffer(context_, CL_MEM_READ_WRITE, bytes, nullptr, &rc);
    scratchBytes_ = rc == CL_SUCCESS ? bytes : 0;
    if (rc != CL_SUCCESS) scratch_ = nullptr;
    return check(rc, "allocating scratch memory");
  }
  Status doReduceSum(uint64_t n, const Buffer& input, Buffer& out) override {
    if (auto s = launchRun(); !s) return s;
    size_t global[1] = {kPartials};
    if (auto s = run("raccel_partial_sums", 1, global, nullptr, cl_ulong{n}, memOf(input), partials_); !s) return s;
    size_t one[1] = {1};
    return run("raccel_fold", 1, one, nullptr, cl_uint{kPartials}, partials_, memOf(out));
  }

 private:
  static size_t roundUp(uint64_t v, size_t to) { return static_cast<size_t>((v + to - 1) / to * to); }

  // A tensor kernel's range on a CPU device (PoCL): one work-group size a kernel,
  // whatever the op's shape, the range rounded up to whole groups (the kernels skip the
  // work-items past their shape). PoCL compiles a kernel anew for each work-group size it
  // runs (~0.2 s each here) and, left to choose, picks the size from the range: the
  // reference CNN's first step compiled 70 (15 s), and each new shape compiled more.
  // 1-D ranges go in groups of 64 (max pooling's window reductions ran 15% faster so);
  // kernels of a block of vectors an item (rc_rows_*, rc_gather_vec, rc_matmul_vec, _nt,
  // rc_layer_norm_vec and its backward's, an item a row)
  // in groups of 8 along range dimension 1, the rows; the scalar grids in 16s along
  // dimension 0, the columns.
  struct CpuRange {
    std::array<size_t, 3> global{1, 1, 1}, local{1, 1, 1};
  };
  static CpuRange cpuGroups(std::string_view kernel, cl_uint dims, const size_t* global) {
    CpuRange r;
    std::copy(global, global + dims, r.global.begin());
    const bool blocks = kernel.starts_with("rc_rows_") || kernel == "rc_gather_vec" || kernel.starts_with("rc_matmul_vec") ||
                        kernel == "rc_matmul_nt" || kernel == "rc_layer_norm_vec" || kernel == "rc_layer_norm_backward_vec";
    const int along = dims == 1 || !blocks ? 0 : 1;
    r.local[along] = dims == 1 ? 64 : blocks ? 8 : 16;
    r.global[along] = roundUp(r.global[along], r.local[along]);
    return r;
  }

  // The map kernel of one function (tensor_kernels.inc: RC_MAP_FAST) for a map over f32
  // operands: over one contiguous dimension (every stride 1) the flat one, over 2 to 4
  // dimensions the grid one (a range of that shape, the first two of 4 as one); null
  // otherwise (rc_map then).
  struct FastMapNames {
    int fn;
    const char *flat, *grid, *rows;
  };
#define RC_FAST_MAP_NAMES(name, FN) {FN, "rc_flat_" #name, "rc_grid_" #name, "rc_rows_" #name},
  static constexpr FastMapNames kFastMaps[] = {RC_FAST_MAPS(RC_FAST_MAP_NAMES)};
#undef RC_FAST_MAP_NAMES
  static const FastMapNames* fastMapNames(const kernels::RcGeom& g) {
    const FastMapNames* f =
        std::find_if(std::begin(kFastMaps), std::end(kFastMaps), [&](const FastMapNames& n) { return n.fn == g.fn; });
    return f == std::end(kFastMaps) ? nullptr : f;
  }
  static const char* fastMapKernel(const kernels::RcGeom& g) {
    const FastMapNames* f = fastMapNames(g);
    if (!f || g.dims < 1 || g.dims > 4) return nullptr;
    for (unsigned i = 0; i < tensorFnOperands(TensorFn(g.fn)); ++i)
      if (g.type[i] != int(TensorType::f32) || (g.dims == 1 && g.stride[i][0] != 1)) return nullptr;
    return g.dims == 1 ? f->flat : f->grid;
  }
  // A copy over one dimension, both operands contiguous, from f32 to f16 or bf16 or back:
  // rc_flat_to_<type> or rc_flat_from_<type>; null otherwise.
  static const char* flatConvertKernel(const kernels::RcGeom& g) {
    if (TensorFn(g.fn) != TensorFn::copy || g.dims != 1 || g.stride[0][0] != 1 || g.stride[1][0] != 1) return nullptr;
    const auto to = TensorType(g.type[0]), from = TensorType(g.type[1]);
    if (from == TensorType::f32) return to == TensorType::f16 ? "rc_flat_to_f16" : to == TensorType::bf16 ? "rc_flat_to_bf16" : nullptr;
    if (to == TensorType::f32) return from == TensorType::f16 ? "rc_flat_from_f16" : from == TensorType::bf16 ? "rc_flat_from_bf16" : nullptr;
    return nullptr;
  }
  // The rows kernel of a grid map (2 to 4 dimensions) whose rows are at least kVecColumns
  // long: rc_rows_typed for rc_grid_typed's maps (typedGridMap), rc_rows_<name> for a
  // fast map whose rows are out's neighbours and, in each operand it reads, neighbours or
  // one element broadcast along the row; null otherwise.
  static const char* rowsMapKernel(const kernels::RcGeom& g) {
    const int last = int(g.dims) - 1;
    if (g.dims < 2 || g.dims > 4 || g.shape[last] < kVecColumns) return nullptr;
    if (typedGridMap(g)) return "rc_rows_typed";
    const FastMapNames* f = fastMapKernel(g) ? fastMapNames(g) : nullptr;
    if (!f || g.stride[0][last] != 1) return nullptr;
    for (unsigned i = 1; i < tensorFnOperands(TensorFn(g.fn)); ++i)
      if (g.stride[i][last] != 0 && g.stride[i][last] != 1) return nullptr;
    return f->rows;
  }

  // An f32 sum whose reduced elements are one row of neighbours an output (the last
  // dimension alone, stride 1), at least kVecColumns long: rc_sum_rows_vec.
  static bool sumRowsVec(const kernels::RcGeom& g) {
    const int last = int(g.dims) - 1;
    return TensorFn(g.fn) == TensorFn::sum && g.type[0] == int(TensorType::f32) && g.type[1] == int(TensorType::f32) &&
           last >= 0 && g.shape[last] == g.inner && g.stride[1][last] == 1 && g.inner >= kVecColumns;
  }

  // A gatherSum over f32 whose output is contiguous along the last of its 1 to 4 kept
  // dimensions, at least kVecColumns long (an im2col, a col2im): rc_gather_vec.
  static bool gatherVec(const kernels::RcGeom& g) {
    if (TensorFn(g.fn) != TensorFn::gatherSum || g.dims < 3 || g.dims > 6) return false;
    const int last = int(g.dims) - 3;
    return g.type[0] == int(TensorType::f32) && g.type[1] == int(TensorType::f32) && g.shape[last] >= kVecColumns &&
           g.stride[0][last] == 1;
  }

  // An indexSelect over f32 whose out and a hold the dimension before the rows as
  // neighbours (an embedding's lookup), or an indexAdd whose out and a hold the one before
  // the rows as neighbours (an embedding's gradient), at least kVecColumns long:
  // rc_index_select_rows, rc_index_add_cols. That dimension, or -1.
  static int indexRowsVec(const kernels::RcGeom& g) {
    const TensorFn fn = TensorFn(g.fn);
    if ((fn != TensorFn::indexSelect && fn != TensorFn::indexAdd) || g.dims < 3) return -1;
    const int d = int(g.dims) - (fn == TensorFn::indexSelect ? 2 : 3);
    const bool rows = g.type[0] == int(TensorType::f32) && g.type[1] == int(TensorType::f32) && g.stride[0][d] == 1 &&
                      g.stride[1][d] == 1 && g.shape[d] >= kVecColumns;
    return rows ? d : -1;
  }

  // A layer norm or its backward whose row operands (out, a; out, grad, xhat) have their
  // columns as neighbours, at least kVecColumns: rc_layer_norm_vec, _backward_vec.
  static bool layerNormVec(const kernels::RcGeom& g) {
    const TensorFn fn = TensorFn(g.fn);
    if ((fn != TensorFn::layerNorm && fn != TensorFn::layerNormBackward) || (g.dims != 2 && g.dims != 3)) return false;
    const int last = int(g.dims) - 1;
    const int rowOperands = fn == TensorFn::layerNorm ? 2 : 3;
    for (int i = 0; i < rowOperands; ++i)
      if (g.stride[i][last] != 1) return false;
    return g.shape[last] >= kVecColumns;
  }

  // A map rc_map would run through its typed path (rc_map_typed: an operand not f32, a
  // comparison, where) over 2 to 4 dimensions: rc_grid_typed runs it with no division
  // per dimension (the reference CNN's max pooling backward: eq and where at ~200 us
  // each over 36,864 elements as rc_map).
  static bool typedGridMap(const kernels::RcGeom& g) {
    if (g.dims < 2 || g.dims > 4 || std::strcmp(tensorKernelName(TensorFn(g.fn)), "rc_map") != 0) return false;
    const TensorFn fn = TensorFn(g.fn);
    if (fn == TensorFn::where || (fn >= TensorFn::eq && fn <= TensorFn::ge)) return true;
    for (unsigned i = 0; i < tensorFnOperands(fn); ++i)
      if (g.type[i] != int(TensorType::f32)) return true;
    return false;
  }

  template <class... A>
  Status run(const char* name, cl_uint dims, const size_t* global, const size_t* local, const A&... args) {
    return runIn(*builtins_, name, dims, global, local, args...);
  }
  template <class... A>
  Status runIn(ClProgram& program, const char* name, cl_uint dims, const size_t* global, const size_t* local,
               const A&... args) {
    auto kernel = program.kernel(name);
    if (!kernel) return fail(kernel.error());
    cl_uint i = 0;
    cl_int rc = CL_SUCCESS;
    ((rc = rc == CL_SUCCESS ? clSetKernelArg(*kernel, i++, sizeof(A), &args) : rc), ...);
    if (auto s = check(rc, name); !s) return s;
    CpuRange cpuRange;
    if (cpu_ && !local && &program == tensorKernels_.get()) {
      cpuRange = cpuGroups(name, dims, global);
      global = cpuRange.global.data(), local = cpuRange.local.data();
    }
    cl_event event = nullptr;
    rc = clEnqueueNDRangeKernel(queue_, *kernel, dims, nullptr, global, local, 0, nullptr, &event);
    launches_ += rc == CL_SUCCESS;
    track(event);
    return check(rc, name);
  }

  // A kernel's event, for takeCompleted. Nobody asking (a caller that only finishes)
  // must not grow the list without end: past 4096, the oldest completed ones go.
  void track(cl_event event) {
    if (!event) return;
    timed_.push_back({event, kernelTag(), shares_});
    if (timed_.size() > 4096) {
      std::vector<KernelTime> dropped;
      takeCompleted(dropped);
    }
  }
  struct Timed {
    cl_event event;
    uint64_t tag;
    std::vector<std::pair<uint64_t, uint64_t>> shares;  // a run of maps: each one's tag and elements
  };
  FlatRun run_;  // small flat maps held while plugged (doTensor)
  bool runs_ = true;  // gathers them (not for DeviceOverrides::mapsOneByOne)
  uint64_t launches_ = 0;
  std::vector<std::pair<uint64_t, uint64_t>> shares_;  // the shares of the run being launched
  std::deque<Timed> timed_;
  std::string lost_;
  bool cardLost_ = false;

  Result<std::unique_ptr<Program>> build(ProgramKind kind, const std::string& name, std::span<const std::byte> code,
                                         const std::string& options = {}) {
    if (code.empty()) return fail(Code::invalidArgument, "program '" + name + "' has no code");
    if (kind == ProgramKind::openclUnits) return buildUnits(name, code, options);
    cl_int rc = CL_SUCCESS;
    cl_program program = nullptr;
    if (kind == ProgramKind::openclC) {
      const char* src = reinterpret_cast<const char*>(code.data());
      size_t len = code.size();
      program = clCreateProgramWithSource(context_, 1, &src, &len, &rc);
    } else {
      program = clCreateProgramWithIL(context_, code.data(), code.size(), &rc);
    }
    if (rc != CL_SUCCESS)
      return fail(Code::invalidArgument, "program '" + name + "': the device refused the " + programKindName(kind) +
                                             " code (" + clError(rc) + ")");
    // Argument names and types are kept for describe() (OpenCL's kernel argument info).
    std::string flags = options + (kind == ProgramKind::openclC ? kArgInfo : "");
    rc = clBuildProgram(program, 1, &device_, flags.c_str(), nullptr, nullptr);
    std::string log = buildLog(program);
    if (rc != CL_SUCCESS) {
      clReleaseProgram(program);
      if (rc == CL_INVALID_BUILD_OPTIONS)
        return clFail(Code::invalidArgument, "program '" + name + "': the compiler refused the build options '" + options + "'", rc);
      return clFail(Code::invalidArgument, "program '" + name + "' failed to build (" + clError(rc) + "). Build log:\n" + log, rc);
    }
    return described(name, kind, program, log);
  }

  static constexpr const char* kArgInfo = " -cl-kernel-arg-info";

  std::string buildLog(cl_program program) {
    size_t size = 0;
    clGetProgramBuildInfo(program, device_, CL_PROGRAM_BUILD_LOG, 0, nullptr, &size);
    std::string log(size, '\0');
    clGetProgramBuildInfo(program, device_, CL_PROGRAM_BUILD_LOG, size, log.data(), nullptr);
    while (!log.empty() && (log.back() == '\0' || log.back() == '\n')) log.pop_back();
    if (log.size() > 16000) log = log.substr(0, 16000) + "\n[build log truncated]";
    return log;
  }

  // The program, owned from here, with its kernels described (none for an object that
  // was only compiled).
  std::unique_ptr<Program> described(const std::string& name, ProgramKind kind, cl_program program, const std::string& log) {
    auto out = std::make_unique<ClProgram>(name, kind, program);
    out->description.buildLog = log;
    out->description.argumentsKnown = true;  // CL_KERNEL_NUM_ARGS of each (a launch carries at most kMaxKernelArgs)
    cl_program_binary_type type = CL_PROGRAM_BINARY_TYPE_EXECUTABLE;
    clGetProgramBuildInfo(program, device_, CL_PROGRAM_BINARY_TYPE, sizeof type, &type, nullptr);
    if (type == CL_PROGRAM_BINARY_TYPE_EXECUTABLE)
      for (auto& k : out->kernels()) {
        auto cl = out->kernel(k);
        if (cl) out->description.kernels.push_back(describeKernel(k, *cl));
      }
    return std::unique_ptr<Program>(std::move(out));
  }

  // OpenCL's separate compilation on this card: each unit compiled with its headers
  // (clCompileProgram), then all linked (clLinkProgram) with `options` as link options.
  Result<std::unique_ptr<Program>> buildUnits(const std::string& name, std::span<const std::byte> code,
                                              const std::string& options) {
    auto units = decodeUnits(code);
    if (!units) return fail(units.error());
    std::vector<cl_program> compiled;
    auto releaseAll = [&] {
      for (cl_program p : compiled) clReleaseProgram(p);
      compiled.clear();
    };
    std::string logs;
    for (size_t i = 0; i < units->units.size(); ++i) {
      auto unit = compileUnit(name, i, units->units[i], logs);
      if (!unit) {
        releaseAll();
        return fail(unit.error());
      }
      compiled.push_back(*unit);
    }
    if (units->compileOnly) {
      cl_program first = compiled.front();
      compiled.erase(compiled.begin());
      releaseAll();
      return described(name, ProgramKind::openclUnits, first, logs);
    }
    cl_int rc = CL_SUCCESS;
    const std::string linkFlags = options + kArgInfo;  // (the driver keeps argument info only if the link asks too)
    cl_program linked = clLinkProgram(context_, 1, &device_, linkFlags.c_str(), static_cast<cl_uint>(compiled.size()),
                                      compiled.data(), nullptr, nullptr, &rc);
    releaseAll();
    std::string log = linked ? buildLog(linked) : "";
    if (rc != CL_SUCCESS || !linked) {
      if (linked) clReleaseProgram(linked);
      if (rc == CL_INVALID_LINKER_OPTIONS)
        return clFail(Code::invalidArgument, "program '" + name + "': the linker refused the link options '" + options + "'", rc);
      return clFail(Code::invalidArgument, "program '" + name + "' failed to link (" + clError(rc) + "). Build log:\n" + logs + log, rc);
    }
    return described(name, ProgramKind::openclUnits, linked, logs + log);
  }

  // Unit i of program `name` compiled with its headers, its build log added to `logs`;
  // the caller owns it.
  Result<cl_program> compileUnit(const std::string& name, size_t i, const ProgramUnit& u, std::string& logs) {
    if (u.options.size() > kMaxBuildOptions)
      return fail(Code::invalidArgument, "unit " + std::to_string(i) + ": compile options of " + std::to_string(u.options.size()) +
                                             " bytes (at most " + std::to_string(kMaxBuildOptions) + ")");
    cl_int rc = CL_SUCCESS;
    auto source = [&](const std::string& text) {
      const char* src = text.data();
      size_t len = text.size();
      return clCreateProgramWithSource(context_, 1, &src, &len, &rc);
    };
    std::vector<cl_program> headers;
    std::vector<const char*> names;
    for (auto& [headerName, text] : u.headers) {
      cl_program h = text.empty() ? nullptr : source(text);
      if (!h) break;
      headers.push_back(h);
      names.push_back(headerName.c_str());
    }
    cl_program unit = rc == CL_SUCCESS && headers.size() == u.headers.size() && !u.source.empty() ? source(u.source) : nullptr;
    if (unit) {
      std::string flags = u.options + kArgInfo;
      rc = clCompileProgram(unit, 1, &device_, flags.c_str(), static_cast<cl_uint>(headers.size()),
                            headers.empty() ? nullptr : headers.data(), headers.empty() ? nullptr : names.data(), nullptr, nullptr);
      logs += buildLog(unit);
    }
    for (cl_program h : headers) clReleaseProgram(h);
    if (unit && rc == CL_SUCCESS) return unit;
    if (unit) clReleaseProgram(unit);
    if (!unit) return fail(Code::invalidArgument, "program '" + name + "': unit " + std::to_string(i) + " or a header of it is empty");
    if (rc == CL_INVALID_COMPILER_OPTIONS)
      return clFail(Code::invalidArgument, "program '" + name + "': the compiler refused the compile options '" + u.options + "'", rc);
    return clFail(Code::invalidArgument, "program '" + name + "': unit " + std::to_string(i) + " failed to compile (" + clError(rc) +
                                             "). Build log:\n" + logs, rc);
  }

  KernelDescription describeKernel(const std::string& name, cl_kernel k) {
    KernelDescription d;
    d.name = name;
    auto kernelString = [&](cl_kernel_info what) {
      size_t n = 0;
      if (clGetKernelInfo(k, what, 0, nullptr, &n) != CL_SUCCESS || n == 0) return std::string();
      std::string v(n, '\0');
      clGetKernelInfo(k, what, n, v.data(), nullptr);
      while (!v.empty() && v.back() == '\0') v.pop_back();
      return v;
    };
    d.attributes = kernelString(CL_KERNEL_ATTRIBUTES);
    auto wg = [&](cl_kernel_work_group_info what, void* out, size_t bytes) {
      clGetKernelWorkGroupInfo(k, device_, what, bytes, out, nullptr);
    };
    size_t wgSize = 0, multiple = 0, compiled[3] = {0, 0, 0};
    cl_ulong localMem = 0, privateMem = 0;
    wg(CL_KERNEL_WORK_GROUP_SIZE, &wgSize, sizeof wgSize);
    wg(CL_KERNEL_PREFERRED_WORK_GROUP_SIZE_MULTIPLE, &multiple, sizeof multiple);
    wg(CL_KERNEL_COMPILE_WORK_GROUP_SIZE, compiled, sizeof compiled);
    wg(CL_KERNEL_LOCAL_MEM_SIZE, &localMem, sizeof localMem);
    wg(CL_KERNEL_PRIVATE_MEM_SIZE, &privateMem, sizeof privateMem);
    d.workGroupSize = wgSize, d.preferredMultiple = multiple, d.localMemBytes = localMem, d.privateMemBytes = privateMem;
    for (int i = 0; i < 3; ++i) d.compileWorkGroupSize[i] = compiled[i];
    cl_uint count = 0;
    clGetKernelInfo(k, CL_KERNEL_NUM_ARGS, sizeof count, &count, nullptr);
    for (cl_uint i = 0; i < count && i < kMaxKernelArgs; ++i) {
      KernelArgDescription a;
      auto argString = [&](cl_kernel_arg_info what) {
        size_t n = 0;
        if (clGetKernelArgInfo(k, i, what, 0, nullptr, &n) != CL_SUCCESS || n == 0) return std::string();
        std::string v(n, '\0');
        clGetKernelArgInfo(k, i, what, n, v.data(), nullptr);
        while (!v.empty() && v.back() == '\0') v.pop_back();
        return v;
      };
      a.name = argString(CL_KERNEL_ARG_NAME);
      a.typeName = argString(CL_KERNEL_ARG_TYPE_NAME);
      cl_kernel_arg_address_qualifier space = CL_KERNEL_ARG_ADDRESS_PRIVATE;
      cl_kernel_arg_access_qualifier access = CL_KERNEL_ARG_ACCESS_NONE;
      cl_kernel_arg_type_qualifier quals = 0;
      clGetKernelArgInfo(k, i, CL_KERNEL_ARG_ADDRESS_QUALIFIER, sizeof space, &space, nullptr);
      clGetKernelArgInfo(k, i, CL_KERNEL_ARG_ACCESS_QUALIFIER, sizeof access, &access, nullptr);
      clGetKernelArgInfo(k, i, CL_KERNEL_ARG_TYPE_QUALIFIER, sizeof quals, &quals, nullptr);
      using S = KernelArgDescription::Space;
      using A = KernelArgDescription::Access;
      a.space = space == CL_KERNEL_ARG_ADDRESS_GLOBAL     ? S::global
                : space == CL_KERNEL_ARG_ADDRESS_CONSTANT ? S::constant
                : space == CL_KERNEL_ARG_ADDRESS_LOCAL    ? S::local
                                                          : S::privateValue;
      a.access = access == CL_KERNEL_ARG_ACCESS_READ_ONLY    ? A::readOnly
                 : access == CL_KERNEL_ARG_ACCESS_WRITE_ONLY  ? A::writeOnly
                 : access == CL_KERNEL_ARG_ACCESS_READ_WRITE  ? A::readWrite
                                                              : A::none;
      a.typeQualifiers = static_cast<uint32_t>(quals);
      // A by-value argument's size, from its type's name (scalars and vectors); 0 for a
      // struct or anything else whose size the name does not tell (the compiler checks).
      if (a.space == S::privateValue) a.size = scalarTypeBytes(a.typeName, addressBytes_);
      d.args.push_back(std::move(a));
    }
    return d;
  }

  cl_device_id device_;
  cl_context context_;
  cl_command_queue queue_;
  uint64_t baseAlign_ = 128;  // bytes; sub-buffer origins must be multiples
  uint32_t addressBytes_ = 8;
  std::unique_ptr<ClProgram> builtins_;
  std::unique_ptr<ClProgram> tensorKernels_;
  static constexpr int64_t kTiledFrom = 64;
  static constexpr int64_t kVecColumns = 16, kVecRows = 4;  // rc_matmul_vec's RC_VCOLS, RC_VROWS
  static constexpr uint64_t kNtCols = 4, kNtRows = 4;         // rc_matmul_nt's RC_NT_COLS, RC_NT_ROWS
  static constexpr uint64_t kRowSpan = 256;                   // the rows kernels' RC_ROW_SPAN
  cl_mem partials_ = nullptr;
  static constexpr uint64_t kScratchBytes = 16 << 20;
  static constexpr int64_t kSplitSumOutputs = 1024;
  cl_mem scratch_ = nullptr;  // scratch(): matmulVec's b laid out as rows, sumInTwo's row sums
  uint64_t scratchBytes_ = 0;
  bool plugged_ = false;     // between plug() and unplug()
  cl_event gate_ = nullptr;  // plug()'s user event, while plugged
  bool gates_ = true;        // plug() holds work behind a user event (not on PoCL's basic device)
  bool groups256_ = false;  // the device takes work-groups of 256: 16 x 16 tiles (gemm, matmul), 256-wide sums
  bool cpu_ = false;        // a CPU device (PoCL): matmuls as explicit vectors (rc_matmul_vec)
};

}  // namespace

std::vector<DeviceInfo> enumerateOpenclDevices(std::string* note) {
  std::vector<DeviceInfo> out;
  auto devices = allDevices(note);
  for (size_t i = 0; i < devices.size(); ++i) {
    DeviceInfo info;
    info.backend = "opencl";
    info.index = static_cast<unsigned>(i);
    info.kind = kindOf(devices[i]);
    info.model = deviceString(devices[i], CL_DEVICE_NAME);
    info.memoryBytes = deviceValue<cl_ulong>(devices[i], CL_DEVICE_GLOBAL_MEM_SIZE);
    out.push_back(info);
  }
  return out;
}

Result<std::unique_ptr<Device>> openOpenclDevice(unsigned index, const DeviceOverrides& overrides) {
  std::string note;
  auto devices = allDevices(&note);
  if (index >= devices.size()) return fail(noSuchDevice("OpenCL", index, devices.size(), note));
  cl_device_id d = devices[index];
  Capabilities caps;
  caps.kind = kindOf(d);
  caps.model = deviceString(d, CL_DEVICE_NAME);
  caps.backend = "opencl";
  caps.memoryBytes = deviceValue<cl_ulong>(d, CL_DEVICE_GLOBAL_MEM_SIZE);
  caps.programKinds = {ProgramKind::builtin, ProgramKind::openclC, ProgramKind::openclUnits};
  if (!deviceString(d, CL_DEVICE_IL_VERSION).empty()) caps.programKinds.push_back(ProgramKind::spirv);
  caps.computeUnits = deviceValue<cl_uint>(d, CL_DEVICE_MAX_COMPUTE_UNITS);
  caps.maxWorkGroupSize = static_cast<uint32_t>(std::min<size_t>(deviceValue<size_t>(d, CL_DEVICE_MAX_WORK_GROUP_SIZE), UINT32_MAX));
  caps.localMemBytes = deviceValue<cl_ulong>(d, CL_DEVICE_LOCAL_MEM_SIZE);
  caps.openclExtensions = deviceString(d, CL_DEVICE_EXTENSIONS);
  caps.driverVersion = deviceString(d, CL_DEVICE_VERSION) + " / " + deviceString(d, CL_DRIVER_VERSION);
  caps.doubleFpConfig = deviceValue<cl_device_fp_config>(d, CL_DEVICE_DOUBLE_FP_CONFIG);
  cl_int rc = CL_SUCCESS;
  cl_context context = clCreateContext(nullptr, 1, &d, nullptr, nullptr, &rc);
  if (auto s = check(rc, "clCreateContext"); !s) return fail(s.error());
  caps.images = imageLimitsOf(d, context);
  applyOverrides(caps, overrides);  // (after the images: an operator's images = false turns them off)
  const cl_queue_properties profiling[] = {CL_QUEUE_PROPERTIES, CL_QUEUE_PROFILING_ENABLE, 0};
  cl_command_queue queue = clCreateCommandQueueWithProperties(context, d, profiling, &rc);
  if (rc != CL_SUCCESS) {
    clReleaseContext(context);
    return fail(check(rc, "clCreateCommandQueue").error());
  }
  auto device = std::make_unique<OpenclDevice>(caps, d, context, queue);
  if (auto s = device->init(!overrides.mapsOneByOne); !s) return fail(s.error());
  return std::unique_ptr<Device>(std::move(device));
}

}  // namespace raccel::hal
