#include "hal/opencl/opencl_device.h"

#define CL_TARGET_OPENCL_VERSION 300
#include <CL/cl.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <map>

namespace raccel::hal {
namespace {

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

std::string clError(cl_int code) { return "OpenCL error " + std::to_string(code); }

Status check(cl_int code, const char* what) {
  if (code == CL_SUCCESS) return {};
  Code c = code == CL_OUT_OF_RESOURCES || code == CL_OUT_OF_HOST_MEMORY || code == CL_MEM_OBJECT_ALLOCATION_FAILURE
               ? Code::resourceExhausted
               : Code::internal;
  return fail(c, std::string(what) + ": " + clError(code));
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
    clFinish(queue_);
    for (auto& t : timed_) clReleaseEvent(t.event);
    builtins_.reset();
    if (partials_) clReleaseMemObject(partials_);
    clReleaseCommandQueue(queue_);
    clReleaseContext(context_);
  }

  Status init() {
    auto program = build(ProgramKind::openclC, kBuiltinLibrary, std::as_bytes(std::span(kBuiltinSource, std::strlen(kBuiltinSource))));
    if (!program) return fail(program.error().code, "building the built-in kernels: " + program.error().message);
    builtins_.reset(static_cast<ClProgram*>(program->release()));
    gemmTiles_ = deviceValue<size_t>(device_, CL_DEVICE_MAX_WORK_GROUP_SIZE) >= 256;
    cl_int rc = CL_SUCCESS;
    partials_ = clCreateBuffer(context_, CL_MEM_READ_WRITE, kPartials * sizeof(float), nullptr, &rc);
    return check(rc, "allocating reduction scratch");
  }

  Status finish() override { return check(clFinish(queue_), "clFinish"); }

  // Kernels are enqueued and return at once; each carries an event whose profiling
  // times (the device's clock) are its device time.
  bool timesKernels() const override { return true; }
  size_t takeCompleted(std::vector<KernelTime>& out) override {
    while (!timed_.empty()) {
      cl_int status = CL_QUEUED;
      clGetEventInfo(timed_.front().event, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof status, &status, nullptr);
      if (status > CL_COMPLETE) break;  // queued, submitted or running
      Timed t = timed_.front();
      timed_.pop_front();
      cl_ulong start = 0, end = 0;
      if (status == CL_COMPLETE &&
          clGetEventProfilingInfo(t.event, CL_PROFILING_COMMAND_START, sizeof start, &start, nullptr) == CL_SUCCESS &&
          clGetEventProfilingInfo(t.event, CL_PROFILING_COMMAND_END, sizeof end, &end, nullptr) == CL_SUCCESS)
        out.push_back({t.tag, end > start ? end - start : 0});
      else if (status < 0 && lost_.empty())
        lost_ = "a kernel ended abnormally (" + clError(status) + ")";
      clReleaseEvent(t.event);
    }
    return timed_.size();
  }
  void waitCompleted(unsigned) override {
    if (!timed_.empty()) clWaitForEvents(1, &timed_.front().event);
  }
  std::string lost() const override { return lost_; }

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
    return check(clEnqueueWriteBuffer(queue_, memOf(b), CL_TRUE, offset, data.size(), data.data(), 0, nullptr, nullptr),
                 "clEnqueueWriteBuffer");
  }
  Status doRead(const Buffer& b, uint64_t offset, std::span<std::byte> out) override {
    return check(clEnqueueReadBuffer(queue_, memOf(b), CL_TRUE, offset, out.size(), out.data(), 0, nullptr, nullptr),
                 "clEnqueueReadBuffer");
  }
  Status doCopy(Buffer& dst, uint64_t dstOffset, const Buffer& src, uint64_t srcOffset, uint64_t length) override {
    if (length == 0) return {};
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
    return check(clEnqueueFillBuffer(queue_, memOf(b), &value, 1, offset, length, 0, nullptr, nullptr), "clEnqueueFillBuffer");
  }

  Result<std::unique_ptr<Program>> doLoadProgram(ProgramKind kind, const std::string& name,
                                                 std::span<const std::byte> code) override {
    return build(kind, name, code);
  }

  Status doLaunch(Program& program, const std::string& kernelName, const LaunchDims& dims,
                  std::span<const KernelArg> args) override {
    auto& p = static_cast<ClProgram&>(program);
    auto kernel = p.kernel(kernelName);
    if (!kernel) return fail(kernel.error());
    for (size_t i = 0; i < args.size(); ++i) {
      const KernelArg& a = args[i];
      cl_int rc = CL_SUCCESS;
      cl_mem mem = nullptr;
      switch (a.type) {
        case KernelArg::Type::buffer: mem = memOf(*a.buffer); rc = clSetKernelArg(*kernel, i, sizeof mem, &mem); break;
        case KernelArg::Type::u32: rc = clSetKernelArg(*kernel, i, 4, &a.scalar.u32); break;
        case KernelArg::Type::i32: rc = clSetKernelArg(*kernel, i, 4, &a.scalar.i32); break;
        case KernelArg::Type::f32: rc = clSetKernelArg(*kernel, i, 4, &a.scalar.f32); break;
        case KernelArg::Type::u64: rc = clSetKernelArg(*kernel, i, 8, &a.scalar.u64); break;
        case KernelArg::Type::i64: rc = clSetKernelArg(*kernel, i, 8, &a.scalar.i64); break;
        case KernelArg::Type::f64: rc = clSetKernelArg(*kernel, i, 8, &a.scalar.f64); break;
      }
      if (rc != CL_SUCCESS)
        return fail(Code::invalidArgument, "kernel " + kernelName + " argument " + std::to_string(i) +
                                               " does not match its declaration (" + clError(rc) + ")");
    }
    cl_uint declared = 0;
    clGetKernelInfo(*kernel, CL_KERNEL_NUM_ARGS, sizeof declared, &declared, nullptr);
    if (declared != args.size())
      return fail(Code::invalidArgument, "kernel " + kernelName + " takes " + std::to_string(declared) + " arguments, " +
                                             std::to_string(args.size()) + " given");
    size_t global[3], local[3];
    bool defaultLocal = true;
    for (int d = 0; d < 3; ++d) {
      global[d] = size_t{dims.grid[d]} * dims.block[d];
      local[d] = dims.block[d];
      if (dims.block[d] != 1) defaultLocal = false;
      if (global[d] == 0) return fail(Code::invalidArgument, "launch grid and block sizes must be nonzero");
    }
    cl_event event = nullptr;
    cl_int rc = clEnqueueNDRangeKernel(queue_, *kernel, 3, nullptr, global, defaultLocal ? nullptr : local, 0, nullptr, &event);
    track(event);
    if (rc == CL_INVALID_WORK_GROUP_SIZE || rc == CL_INVALID_WORK_ITEM_SIZE)
      return fail(Code::invalidArgument, "launch of " + kernelName + ": block size not accepted by this device (" + clError(rc) + ")");
    return check(rc, "clEnqueueNDRangeKernel");
  }

  Status doGemm(const GemmArgs& g) override {
    size_t global[2] = {roundUp(g.n, 16), roundUp(g.m, 16)};
    size_t local[2] = {16, 16};
    return run("raccel_gemm", 2, global, gemmTiles_ ? local : nullptr, g.m, g.n, g.k, g.alpha, g.beta, memOf(*g.a),
               memOf(*g.b), memOf(*g.c));
  }
  Status doAxpy(uint64_t n, float alpha, const Buffer& x, Buffer& y) override {
    size_t global[1] = {roundUp(n, 256)};
    return run("raccel_axpy", 1, global, nullptr, cl_ulong{n}, alpha, memOf(x), memOf(y));
  }
  Status doVadd(uint64_t n, const Buffer& a, const Buffer& b, Buffer& out) override {
    size_t global[1] = {roundUp(n, 256)};
    return run("raccel_vadd", 1, global, nullptr, cl_ulong{n}, memOf(a), memOf(b), memOf(out));
  }
  Status doReduceSum(uint64_t n, const Buffer& input, Buffer& out) override {
    size_t global[1] = {kPartials};
    if (auto s = run("raccel_partial_sums", 1, global, nullptr, cl_ulong{n}, memOf(input), partials_); !s) return s;
    size_t one[1] = {1};
    return run("raccel_fold", 1, one, nullptr, cl_uint{kPartials}, partials_, memOf(out));
  }

 private:
  static size_t roundUp(uint64_t v, size_t to) { return static_cast<size_t>((v + to - 1) / to * to); }

  template <class... A>
  Status run(const char* name, cl_uint dims, const size_t* global, const size_t* local, const A&... args) {
    auto kernel = builtins_->kernel(name);
    if (!kernel) return fail(kernel.error());
    cl_uint i = 0;
    cl_int rc = CL_SUCCESS;
    ((rc = rc == CL_SUCCESS ? clSetKernelArg(*kernel, i++, sizeof(A), &args) : rc), ...);
    if (auto s = check(rc, name); !s) return s;
    cl_event event = nullptr;
    rc = clEnqueueNDRangeKernel(queue_, *kernel, dims, nullptr, global, local, 0, nullptr, &event);
    track(event);
    return check(rc, name);
  }

  // A kernel's event, for takeCompleted. Nobody asking (a caller that only finishes)
  // must not grow the list without end: past 4096, the oldest completed ones go.
  void track(cl_event event) {
    if (!event) return;
    timed_.push_back({event, kernelTag()});
    if (timed_.size() > 4096) {
      std::vector<KernelTime> dropped;
      takeCompleted(dropped);
    }
  }
  struct Timed {
    cl_event event;
    uint64_t tag;
  };
  std::deque<Timed> timed_;
  std::string lost_;

  Result<std::unique_ptr<Program>> build(ProgramKind kind, const std::string& name, std::span<const std::byte> code) {
    if (code.empty()) return fail(Code::invalidArgument, "program '" + name + "' has no code");
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
    rc = clBuildProgram(program, 1, &device_, "", nullptr, nullptr);
    if (rc != CL_SUCCESS) {
      size_t size = 0;
      clGetProgramBuildInfo(program, device_, CL_PROGRAM_BUILD_LOG, 0, nullptr, &size);
      std::string log(size, '\0');
      clGetProgramBuildInfo(program, device_, CL_PROGRAM_BUILD_LOG, size, log.data(), nullptr);
      while (!log.empty() && (log.back() == '\0' || log.back() == '\n')) log.pop_back();
      clReleaseProgram(program);
      if (log.size() > 16000) log = log.substr(0, 16000) + "\n[build log truncated]";
      return fail(Code::invalidArgument, "program '" + name + "' failed to build (" + clError(rc) + "). Build log:\n" + log);
    }
    return std::unique_ptr<Program>(new ClProgram(name, kind, program));
  }

  cl_device_id device_;
  cl_context context_;
  cl_command_queue queue_;
  std::unique_ptr<ClProgram> builtins_;
  cl_mem partials_ = nullptr;
  bool gemmTiles_ = false;  // the device takes 16 x 16 work-groups
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
  caps.programKinds = {ProgramKind::builtin, ProgramKind::openclC};
  if (!deviceString(d, CL_DEVICE_IL_VERSION).empty()) caps.programKinds.push_back(ProgramKind::spirv);
  applyOverrides(caps, overrides);
  cl_int rc = CL_SUCCESS;
  cl_context context = clCreateContext(nullptr, 1, &d, nullptr, nullptr, &rc);
  if (auto s = check(rc, "clCreateContext"); !s) return fail(s.error());
  const cl_queue_properties profiling[] = {CL_QUEUE_PROPERTIES, CL_QUEUE_PROFILING_ENABLE, 0};
  cl_command_queue queue = clCreateCommandQueueWithProperties(context, d, profiling, &rc);
  if (rc != CL_SUCCESS) {
    clReleaseContext(context);
    return fail(check(rc, "clCreateCommandQueue").error());
  }
  auto device = std::make_unique<OpenclDevice>(caps, d, context, queue);
  if (auto s = device->init(); !s) return fail(s.error());
  return std::unique_ptr<Device>(std::move(device));
}

}  // namespace raccel::hal
