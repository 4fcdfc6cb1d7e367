#include "hal/cuda/cuda_device.h"

#include <cublas_v2.h>
#include <cuda.h>
#include <dlfcn.h>
#include <nvrtc.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <optional>

#include "hal/tensor_kernels_source.h"

namespace raccel::hal {
namespace {

#define RACCEL_STR2(x) #x
#define RACCEL_STR(x) RACCEL_STR2(x)  // expands cuda.h's versioned names (cuMemAlloc -> cuMemAlloc_v2)

// The driver API, loaded once. Every entry point is the versioned symbol cuda.h names.
struct Driver {
  void* lib = nullptr;
  std::string note;
#define RACCEL_CU(fn) decltype(&::fn) fn = nullptr;
#define RACCEL_CU_FUNCTIONS(X)                                                                                   \
  X(cuInit) X(cuDeviceGetCount) X(cuDeviceGet) X(cuDeviceGetName) X(cuDeviceTotalMem) X(cuDeviceGetAttribute)   \
  X(cuDevicePrimaryCtxRetain) X(cuDevicePrimaryCtxRelease) X(cuCtxSetCurrent) X(cuMemAlloc) X(cuMemFree)        \
  X(cuMemcpyHtoDAsync) X(cuMemcpyDtoHAsync) X(cuMemcpyDtoDAsync) X(cuMemsetD8Async) X(cuModuleLoadDataEx)       \
  X(cuModuleUnload) X(cuModuleGetFunction) X(cuLaunchKernel) X(cuStreamCreate) X(cuStreamDestroy)              \
  X(cuStreamSynchronize) X(cuGetErrorString) X(cuEventCreate) X(cuEventDestroy) X(cuEventRecord) X(cuEventQuery)     \
  X(cuEventSynchronize) X(cuMemAllocHost) X(cuMemFreeHost)
  RACCEL_CU_FUNCTIONS(RACCEL_CU)
#undef RACCEL_CU
  // Optional (CUDA 12.4+): lets a launch check its argument count and sizes.
  CUresult (*cuFuncGetParamInfo)(CUfunction, size_t, size_t*, size_t*) = nullptr;
  // cuEventElapsedTime_v2 from CUDA 12.8 on, the unversioned symbol before (same signature).
  CUresult (*cuEventElapsedTime)(float*, CUevent, CUevent) = nullptr;

  bool load() {
    lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
      note = "no CUDA driver (libcuda.so.1 not found)";
      return false;
    }
    bool ok = true;
#define RACCEL_CU(fn)                                                        \
  fn = reinterpret_cast<decltype(fn)>(dlsym(lib, RACCEL_STR(fn)));          \
  if (!fn) {                                                                 \
    ok = false;                                                              \
    note = std::string("the CUDA driver lacks ") + RACCEL_STR(fn);          \
  }
    RACCEL_CU_FUNCTIONS(RACCEL_CU)
#undef RACCEL_CU
    cuFuncGetParamInfo = reinterpret_cast<decltype(cuFuncGetParamInfo)>(dlsym(lib, "cuFuncGetParamInfo"));
    void* elapsed = dlsym(lib, "cuEventElapsedTime_v2");
    if (!elapsed) elapsed = dlsym(lib, "cuEventElapsedTime");
    cuEventElapsedTime = reinterpret_cast<decltype(cuEventElapsedTime)>(elapsed);
    if (!elapsed) {
      ok = false;
      note = "the CUDA driver lacks cuEventElapsedTime";
    }
    if (!ok) return false;
    CUresult rc = cuInit(0);
    if (rc != CUDA_SUCCESS) {
      note = "cuInit failed: " + error(rc);
      return false;
    }
    return true;
  }
  std::string error(CUresult rc) const {
    const char* s = nullptr;
    if (cuGetErrorString && cuGetErrorString(rc, &s) == CUDA_SUCCESS && s) return s;
    return "CUDA error " + std::to_string(static_cast<int>(rc));
  }
};

Driver* driver() {
  static Driver* d = [] {
    auto* x = new Driver;
    if (!x->load()) x->lib = nullptr;
    return x;
  }();
  return d;
}

// A library from the toolkit, by soname or from the toolkit's lib directory.
void* openToolkitLibrary(std::initializer_list<const char*> names) {
  for (const char* n : names) {
    if (void* h = dlopen(n, RTLD_NOW | RTLD_LOCAL)) return h;
#ifdef RACCEL_CUDA_LIBDIR
    if (void* h = dlopen((std::string(RACCEL_CUDA_LIBDIR) + "/" + n).c_str(), RTLD_NOW | RTLD_LOCAL)) return h;
#endif
  }
  return nullptr;
}

struct Nvrtc {
#define RACCEL_NV(fn) decltype(&::fn) fn = nullptr;
#define RACCEL_NV_FUNCTIONS(X)                                                                                  \
  X(nvrtcCreateProgram) X(nvrtcCompileProgram) X(nvrtcGetPTXSize) X(nvrtcGetPTX) X(nvrtcGetProgramLogSize)     \
  X(nvrtcGetProgramLog) X(nvrtcDestroyProgram) X(nvrtcGetErrorString)
  RACCEL_NV_FUNCTIONS(RACCEL_NV)
#undef RACCEL_NV
  bool ok = false;
};

Nvrtc* nvrtc() {
  static Nvrtc* n = [] {
    auto* x = new Nvrtc;
    void* h = openToolkitLibrary({"libnvrtc.so", "libnvrtc.so.13", "libnvrtc.so.12"});
    if (!h) return x;
    x->ok = true;
#define RACCEL_NV(fn) \
  x->fn = reinterpret_cast<decltype(x->fn)>(dlsym(h, #fn)); \
  if (!x->fn) x->ok = false;
    RACCEL_NV_FUNCTIONS(RACCEL_NV)
#undef RACCEL_NV
    return x;
  }();
  return n;
}

struct Cublas {
  decltype(&::cublasCreate) create = nullptr;
  decltype(&::cublasDestroy) destroy = nullptr;
  decltype(&::cublasSetStream) setStream = nullptr;
  decltype(&::cublasSgemm) sgemm = nullptr;
  bool ok = false;
};

Cublas* cublas() {
  static Cublas* c = [] {
    auto* x = new Cublas;
    void* h = openToolkitLibrary({"libcublas.so", "libcublas.so.13", "libcublas.so.12"});
    if (!h) return x;
    x->create = reinterpret_cast<decltype(x->create)>(dlsym(h, RACCEL_STR(cublasCreate)));
    x->destroy = reinterpret_cast<decltype(x->destroy)>(dlsym(h, RACCEL_STR(cublasDestroy)));
    x->setStream = reinterpret_cast<decltype(x->setStream)>(dlsym(h, RACCEL_STR(cublasSetStream)));
    x->sgemm = reinterpret_cast<decltype(x->sgemm)>(dlsym(h, RACCEL_STR(cublasSgemm)));
    x->ok = x->create && x->destroy && x->setStream && x->sgemm;
    return x;
  }();
  return c;
}

const char* kBuiltinSource = R"CU(
extern "C" __global__ void raccel_axpy(unsigned long long n, float alpha, const float* x, float* y) {
  unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
  for (; i < n; i += (unsigned long long)gridDim.x * blockDim.x) y[i] = alpha * x[i] + y[i];
}
extern "C" __global__ void raccel_vadd(unsigned long long n, const float* a, const float* b, float* out) {
  unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
  for (; i < n; i += (unsigned long long)gridDim.x * blockDim.x) out[i] = a[i] + b[i];
}
// One block of 1024 threads: per-thread double partial sums, then a shared-memory tree.
extern "C" __global__ void raccel_reduce_sum(unsigned long long n, const float* in, float* out) {
  __shared__ double partial[1024];
  double sum = 0;
  for (unsigned long long i = threadIdx.x; i < n; i += blockDim.x) sum += in[i];
  partial[threadIdx.x] = sum;
  __syncthreads();
  for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) partial[threadIdx.x] += partial[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) out[0] = (float)partial[0];
}
)CU";

// CUDA C++ to PTX for compute capability major.minor through NVRTC (no driver needed).
Result<std::string> nvrtcCompile(const std::string& name, const std::string& source, int major, int minor,
                                 const std::string& options) {
  auto* nv = nvrtc();
  if (!nv->ok) return fail(Code::unavailable, "NVRTC (libnvrtc.so) could not be loaded: cudaC programs need it");
  nvrtcProgram prog = nullptr;
  if (nv->nvrtcCreateProgram(&prog, source.c_str(), name.c_str(), 0, nullptr, nullptr) != NVRTC_SUCCESS)
    return fail(Code::internal, "nvrtcCreateProgram failed");
  std::string arch = "--gpu-architecture=compute_" + std::to_string(major) + std::to_string(minor);
  // The caller's flags, split at spaces, after ours (a later --std wins).
  std::vector<std::string> words{arch, "--std=c++17"};
  for (size_t at = 0; at < options.size();) {
    size_t end = options.find(' ', at);
    if (end == std::string::npos) end = options.size();
    if (end > at) words.push_back(options.substr(at, end - at));
    at = end + 1;
  }
  std::vector<const char*> opts;
  for (auto& w : words) opts.push_back(w.c_str());
  nvrtcResult rc = nv->nvrtcCompileProgram(prog, static_cast<int>(opts.size()), opts.data());
  size_t logSize = 0;
  nv->nvrtcGetProgramLogSize(prog, &logSize);
  std::string log(logSize, '\0');
  if (logSize) nv->nvrtcGetProgramLog(prog, log.data());
  while (!log.empty() && (log.back() == '\0' || log.back() == '\n')) log.pop_back();
  if (rc != NVRTC_SUCCESS) {
    nv->nvrtcDestroyProgram(&prog);
    return fail(Code::invalidArgument, "program '" + name + "' failed to compile (" + nv->nvrtcGetErrorString(rc) +
                                           "). Compiler log:\n" + log);
  }
  size_t ptxSize = 0;
  nv->nvrtcGetPTXSize(prog, &ptxSize);
  std::string ptx(ptxSize, '\0');
  nv->nvrtcGetPTX(prog, ptx.data());
  nv->nvrtcDestroyProgram(&prog);
  while (!ptx.empty() && ptx.back() == '\0') ptx.pop_back();
  return ptx;
}

// What the tensor kernels (hal/tensor_kernels.inc) need of CUDA C++.
const char* kTensorPrelude = R"CU(
#define RC_KERNEL extern "C" __global__ void
#define RC_FUNC __device__ inline
#define RC_GLOBAL
#define RC_I64 long long
#define RC_GEOM const RcGeom
#define RC_CPU_GID
#define RC_GID ((long long)blockIdx.x * blockDim.x + threadIdx.x)
#define RC_EXP(x) expf(x)
#define RC_LOG(x) logf(x)
#define RC_FMAX(x, y) fmaxf(x, y)
#define RC_NAN __int_as_float(0x7fffffff)
#define RC_INFINITY __int_as_float(0x7f800000)
#define RC_SQRT(x) sqrtf(x)
#define RC_TANH(x) tanhf(x)
#define RC_POW(x, y) powf(x, y)
#define RC_FABS(x) fabsf(x)
#define RC_ERF(x) erff(x)
#define RC_LOG1P(x) log1pf(x)
#define RC_COS(x) cosf(x)
#define RC_F(name, x) name##f(x)
#define RC_LGAMMA(x) lgammaf(x)
#define RC_F2(name, x, y) name##f(x, y)
#define RC_AS_UINT(x) __float_as_uint(x)
#define RC_AS_FLOAT(u) __uint_as_float(u)
#define RC_U64 unsigned long long
)CU";

int fp32LanesPerSm(int major, int minor) {
  switch (major) {
    case 3: return 192;
    case 5: return 128;
    case 6: return minor == 0 ? 64 : 128;
    case 7: return 64;
    case 8: return minor == 0 ? 64 : 128;
    default: return 128;
  }
}

class CuBuffer final : public Buffer {
 public:
  CuBuffer(uint64_t size, CUdeviceptr ptr) : Buffer(size), ptr(ptr) {}
  ~CuBuffer() override { driver()->cuMemFree(ptr); }
  CUdeviceptr ptr;
};
CUdeviceptr ptrOf(const Buffer& b) { return static_cast<const CuBuffer&>(b).ptr; }

class CuProgram final : public Program {
 public:
  CuProgram(std::string name, ProgramKind kind, CUmodule module, std::vector<std::string> names)
      : Program(std::move(name), kind), module(module), names(std::move(names)) {}
  ~CuProgram() override { driver()->cuModuleUnload(module); }
  std::vector<std::string> kernels() const override { return names; }
  ProgramDescription describe() const override { return description; }
  CUmodule module;
  std::vector<std::string> names;  // known only for cudaC sources (extern "C" names are not listed by the driver)
  ProgramDescription description;
};

// Each kernel with its parameters' sizes, where the driver tells them (cuFuncGetParamInfo,
// CUDA 12.4 on): what a sandbox's caller checks a launch against before posting it.
ProgramDescription describeModule(CUmodule module, const std::vector<std::string>& names) {
  ProgramDescription d;
  d.argumentsKnown = driver()->cuFuncGetParamInfo != nullptr;
  for (auto& name : names) {
    KernelDescription k{.name = name};
    CUfunction f = nullptr;
    if (d.argumentsKnown && driver()->cuModuleGetFunction(&f, module, name.c_str()) == CUDA_SUCCESS) {
      size_t offset = 0, bytes = 0;
      for (size_t i = 0; driver()->cuFuncGetParamInfo(f, i, &offset, &bytes) == CUDA_SUCCESS; ++i) {
        if (i == kMaxKernelArgs) {  // more than a launch can carry: not described
          d.argumentsKnown = false;
          break;
        }
        k.args.push_back({.size = static_cast<uint32_t>(bytes)});
      }
    } else {
      d.argumentsKnown = false;
    }
    d.kernels.push_back(std::move(k));
  }
  return d;
}

class CudaDevice final : public Device {
 public:
  CudaDevice(Capabilities caps, CUdevice device, int major, int minor)
      : Device(std::move(caps)), device_(device), major_(major), minor_(minor) {}
  ~CudaDevice() override {
    auto* d = driver();
    d->cuCtxSetCurrent(context_);
    if (stream_) d->cuStreamSynchronize(stream_);
    builtins_.reset();
    tensorKernels_.reset();
    for (auto& t : timed_) spareEvents_.insert(spareEvents_.end(), {t.start, t.end});
    for (auto e : spareEvents_) d->cuEventDestroy(e);
    for (auto& st : stages_) {
      if (st.event) d->cuEventDestroy(st.event);
      if (st.host) d->cuMemFreeHost(st.host);
    }
    if (blas_) cublas()->destroy(blas_);
    if (stream_) d->cuStreamDestroy(stream_);
    if (context_) d->cuDevicePrimaryCtxRelease(device_);
  }

  Status init() {
    auto* d = driver();
    if (auto s = cu(d->cuDevicePrimaryCtxRetain(&context_, device_), "cuDevicePrimaryCtxRetain"); !s) return s;
    if (auto s = cu(d->cuCtxSetCurrent(context_), "cuCtxSetCurrent"); !s) return s;
    if (auto s = cu(d->cuStreamCreate(&stream_, 0), "cuStreamCreate"); !s) return s;
    auto program = compile(kBuiltinLibrary, kBuiltinSource);
    if (!program) return fail(program.error().code, "building the built-in kernels: " + program.error().message);
    builtins_ = std::move(*program);
    if (!cublas()->ok) return fail(Code::unavailable, "cuBLAS (libcublas.so) could not be loaded for the built-in gemm");
    if (cublas()->create(&blas_) != CUBLAS_STATUS_SUCCESS) return fail(Code::internal, "cublasCreate failed");
    cublas()->setStream(blas_, reinterpret_cast<cudaStream_t>(stream_));
    return {};
  }

  Status finish() override {
    bind();
    return cu(driver()->cuStreamSynchronize(stream_), "cuStreamSynchronize");
  }

  // Kernels are timed with a pair of events each on the stream (the device's clock).
  bool timesKernels() const override { return true; }
  size_t takeCompleted(std::vector<KernelTime>& out) override {
    bind();
    while (!timed_.empty()) {
      CUresult rc = driver()->cuEventQuery(timed_.front().end);
      if (rc == CUDA_ERROR_NOT_READY) break;
      Timed t = timed_.front();
      timed_.pop_front();
      float ms = 0;
      if (rc == CUDA_SUCCESS && driver()->cuEventElapsedTime(&ms, t.start, t.end) == CUDA_SUCCESS)
        out.push_back({t.tag, static_cast<uint64_t>(ms * 1e6)});
      else
        (void)cu(rc, "cuEventQuery");  // a fault shows here first: the context is lost
      spareEvents_.push_back(t.start);
      spareEvents_.push_back(t.end);
    }
    return timed_.size();
  }
  void waitCompleted(unsigned) override {
    // Blocks for one kernel (CUDA events cannot be waited on with a timeout).
    if (timed_.empty()) return;
    bind();
    (void)cu(driver()->cuEventSynchronize(timed_.front().end), "cuEventSynchronize");
  }
  std::string lost() const override { return lost_; }
  bool lostFromOutside() const override { return cardLost_; }

 protected:
  Result<std::unique_ptr<Buffer>> doAllocate(uint64_t bytes) override {
    bind();
    CUdeviceptr p = 0;
    if (auto s = cu(driver()->cuMemAlloc(&p, bytes), "cuMemAlloc"); !s) return fail(s.error());
    auto buffer = std::make_unique<CuBuffer>(bytes, p);
    if (auto s = doFill(*buffer, 0, bytes, 0); !s) return fail(s.error());
    return std::unique_ptr<Buffer>(std::move(buffer));
  }
  // Writes go through a ring of page-locked staging buffers: the caller's bytes are
  // copied into one and the DMA from it is queued on the stream; the call returns then,
  // so the next write (the next chunk off the network) is copied while this one moves.
  // A stage is reused once the event after its DMA has passed.
  Status doWrite(Buffer& b, uint64_t offset, std::span<const std::byte> data) override {
    bind();
    if (data.empty()) return {};
    if (!stagesReady()) {  // no page-locked memory: the driver stages it, and we wait
      if (auto s = cu(driver()->cuMemcpyHtoDAsync(ptrOf(b) + offset, data.data(), data.size(), stream_), "cuMemcpyHtoD"); !s)
        return s;
      return finish();
    }
    for (uint64_t done = 0; done < data.size();) {
      Stage& st = stages_[nextStage_++ % stages_.size()];
      if (auto s = cu(driver()->cuEventSynchronize(st.event), "cuEventSynchronize"); !s) return s;
      uint64_t n = std::min<uint64_t>(kStageBytes, data.size() - done);
      std::memcpy(st.host, data.data() + done, n);
      if (auto s = cu(driver()->cuMemcpyHtoDAsync(ptrOf(b) + offset + done, st.host, n, stream_), "cuMemcpyHtoD"); !s) return s;
      if (auto s = cu(driver()->cuEventRecord(st.event, stream_), "cuEventRecord"); !s) return s;
      done += n;
    }
    return {};
  }
  // Reads: up to the whole ring of DMAs in flight, each copied out as it lands.
  Status doRead(const Buffer& b, uint64_t offset, std::span<std::byte> out) override {
    bind();
    if (out.empty()) return {};
    if (!stagesReady()) {
      if (auto s = cu(driver()->cuMemcpyDtoHAsync(out.data(), ptrOf(b) + offset, out.size(), stream_), "cuMemcpyDtoH"); !s)
        return s;
      return finish();
    }
    struct Piece {
      Stage* stage;
      uint64_t at, bytes;
    };
    std::deque<Piece> landing;
    uint64_t issued = 0, copied = 0;
    while (copied < out.size()) {
      while (issued < out.size() && landing.size() < stages_.size()) {
        Stage& st = stages_[nextStage_++ % stages_.size()];
        if (auto s = cu(driver()->cuEventSynchronize(st.event), "cuEventSynchronize"); !s) return s;
        uint64_t n = std::min<uint64_t>(kStageBytes, out.size() - issued);
        if (auto s = cu(driver()->cuMemcpyDtoHAsync(st.host, ptrOf(b) + offset + issued, n, stream_), "cuMemcpyDtoH"); !s)
          return s;
        if (auto s = cu(driver()->cuEventRecord(st.event, stream_), "cuEventRecord"); !s) return s;
        landing.push_back({&st, issued, n});
        issued += n;
      }
      Piece p = landing.front();
      landing.pop_front();
      if (auto s = cu(driver()->cuEventSynchronize(p.stage->event), "cuEventSynchronize"); !s) return s;
      std::memcpy(out.data() + p.at, p.stage->host, p.bytes);
      copied += p.bytes;
    }
    return {};
  }
  Status doCopy(Buffer& dst, uint64_t dstOffset, const Buffer& src, uint64_t srcOffset, uint64_t length) override {
    bind();
    if (length == 0) return {};
    return cu(driver()->cuMemcpyDtoDAsync(ptrOf(dst) + dstOffset, ptrOf(src) + srcOffset, length, stream_), "cuMemcpyDtoD");
  }
  Status doFill(Buffer& b, uint64_t offset, uint64_t length, uint8_t value) override {
    bind();
    if (length == 0) return {};
    return cu(driver()->cuMemsetD8Async(ptrOf(b) + offset, value, length, stream_), "cuMemsetD8");
  }

  Result<std::unique_ptr<Program>> doLoadProgram(ProgramKind kind, const std::string& name,
                                                 std::span<const std::byte> code, const std::string& options) override {
    bind();
    if (code.empty()) return fail(Code::invalidArgument, "program '" + name + "' has no code");
    if (kind == ProgramKind::cudaC) {
      auto p = compile(name, std::string(reinterpret_cast<const char*>(code.data()), code.size()), options);
      if (!p) return fail(p.error());
      return std::unique_ptr<Program>(std::move(*p));
    }
    std::string image(reinterpret_cast<const char*>(code.data()), code.size());  // ptx must end in NUL
    auto module = loadModule(name, image);
    if (!module) return fail(module.error());
    return std::unique_ptr<Program>(new CuProgram(name, kind, *module, {}));
  }

  Status doLaunch(Program& program, const std::string& kernel, const LaunchDims& dims,
                  std::span<const KernelArg> args) override {
    bind();
    auto& p = static_cast<CuProgram&>(program);
    CUfunction f = nullptr;
    if (driver()->cuModuleGetFunction(&f, p.module, kernel.c_str()) != CUDA_SUCCESS)
      return fail(Code::notFound, "no kernel '" + kernel + "' in program '" + p.name() + "' (kernels need extern \"C\" names)");
    if (dims.autoBlock)
      return fail(Code::invalidArgument, "launch of " + kernel + ": CUDA kernels need a block size (no automatic work-group size)");
    if (dims.offset[0] || dims.offset[1] || dims.offset[2])
      return fail(Code::unimplemented, "launch of " + kernel + ": CUDA kernels have no global work offset");
    std::vector<uint64_t> storage(args.size());
    std::vector<void*> params(args.size());
    for (size_t i = 0; i < args.size(); ++i) {
      const KernelArg& a = args[i];
      size_t size = 8;
      params[i] = &storage[i];
      switch (a.type) {
        case KernelArg::Type::buffer: storage[i] = ptrOf(*a.buffer) + a.offset; break;
        case KernelArg::Type::u32: case KernelArg::Type::i32: case KernelArg::Type::f32:
          std::memcpy(&storage[i], &a.scalar, 4);
          size = 4;
          break;
        case KernelArg::Type::bytes:
          params[i] = const_cast<std::byte*>(a.bytes.data());  // cuLaunchKernel copies the bytes
          size = a.bytes.size();
          break;
        case KernelArg::Type::local:
          return fail(Code::invalidArgument, "kernel " + kernel + " argument " + std::to_string(i) +
                                                 ": CUDA kernels take no local-array arguments (use the launch's shared bytes)");
        case KernelArg::Type::image: case KernelArg::Type::sampler:
          return fail(Code::unimplemented, "kernel " + kernel + " argument " + std::to_string(i) +
                                               ": raccel passes no images or samplers to CUDA kernels");
        default: std::memcpy(&storage[i], &a.scalar, 8); break;
      }
      size_t offset = 0, declared = 0;
      if (driver()->cuFuncGetParamInfo) {
        if (driver()->cuFuncGetParamInfo(f, i, &offset, &declared) != CUDA_SUCCESS)
          return fail(Code::invalidArgument, "kernel " + kernel + " takes fewer than " + std::to_string(args.size()) + " arguments");
        if (declared != size)
          return fail(Code::invalidArgument, "kernel " + kernel + " argument " + std::to_string(i) + " is " +
                                                 std::to_string(declared) + " bytes, " + std::to_string(size) + " given");
      }
    }
    if (driver()->cuFuncGetParamInfo) {
      size_t offset = 0, declared = 0;
      if (driver()->cuFuncGetParamInfo(f, args.size(), &offset, &declared) == CUDA_SUCCESS)
        return fail(Code::invalidArgument, "kernel " + kernel + " takes more than " + std::to_string(args.size()) + " arguments");
    }
    return timed([&]() -> Status {
      CUresult rc = driver()->cuLaunchKernel(f, dims.grid[0], dims.grid[1], dims.grid[2], dims.block[0], dims.block[1],
                                             dims.block[2], dims.sharedBytes, stream_, params.data(), nullptr);
      if (rc == CUDA_ERROR_INVALID_VALUE || rc == CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES)
        return fail(Code::invalidArgument, "launch of " + kernel + " refused: " + driver()->error(rc));
      return cu(rc, "cuLaunchKernel");
    });
  }

  Status doGemm(const GemmArgs& g) override {
    bind();
    // Row-major C = A B is column-major C^T = B^T A^T.
    return timed([&]() -> Status {
      auto rc = cublas()->sgemm(blas_, CUBLAS_OP_N, CUBLAS_OP_N, g.n, g.m, g.k, &g.alpha,
                                reinterpret_cast<const float*>(ptrOf(*g.b)), g.n,
                                reinterpret_cast<const float*>(ptrOf(*g.a)), g.k, &g.beta,
                                reinterpret_cast<float*>(ptrOf(*g.c)), g.n);
      if (rc != CUBLAS_STATUS_SUCCESS) return fail(Code::internal, "cublasSgemm failed (status " + std::to_string(rc) + ")");
      return {};
    });
  }
  Status prepare() override { return buildTensorKernels(); }
  // Compiled on first use (most tenants never run one), or ahead by prepare().
  Status buildTensorKernels() {
    if (tensorKernels_) return {};
    auto program = compile("raccel.tensor", std::string(kTensorPrelude) + kTensorKernelSource);
    if (!program) return fail(program.error().code, "building the tensor kernels: " + program.error().message);
    tensorKernels_ = std::move(*program);
    return {};
  }
  Status doTensor(const LoweredTensorOp& op) override {
    bind();
    if (TensorFn(op.geom.fn) == TensorFn::matmul) {
      if (op.geom.dims == 4) {  // batched: each entry to cuBLAS where its strides allow (all alike)
        std::optional<Status> done = matmulWithBlas(op, matmulEntry(op.geom, 0));
        for (int64_t b = 1; done && *done && b < op.geom.shape[0]; ++b) done = matmulWithBlas(op, matmulEntry(op.geom, b));
        if (done) return *done;
      } else if (auto done = matmulWithBlas(op, op.geom)) {
        return *done;
      }
    }
    if (auto s = buildTensorKernels(); !s) return s;
    const char* name = tensorKernelName(TensorFn(op.geom.fn));
    const uint64_t blocks = (static_cast<uint64_t>(op.geom.n) + 255) / 256;
    if (blocks > 0x7fffffffu) return fail(Code::invalidArgument, std::string(name) + ": too many work-items for one launch");
    CUfunction f = nullptr;
    if (auto s = cu(driver()->cuModuleGetFunction(&f, tensorKernels_->module, name), name); !s) return s;
    kernels::RcGeom g = op.geom;
    CUdeviceptr p[kMaxTensorOperands];
    for (unsigned i = 0; i < kMaxTensorOperands; ++i) p[i] = ptrOf(*op.buffers[i]);
    void* params[] = {&g, &p[0], &p[1], &p[2], &p[3]};
    return timed([&] {
      return cu(driver()->cuLaunchKernel(f, static_cast<unsigned>(blocks), 1, 1, 256, 1, 1, 0, stream_, params, nullptr), name);
    });
  }
  Status doAxpy(uint64_t n, float alpha, const Buffer& x, Buffer& y) override {
    return builtin("raccel_axpy", blocksFor(n), 256, n, alpha, ptrOf(x), ptrOf(y));
  }
  Status doVadd(uint64_t n, const Buffer& a, const Buffer& b, Buffer& out) override {
    return builtin("raccel_vadd", blocksFor(n), 256, n, ptrOf(a), ptrOf(b), ptrOf(out));
  }
  Status doReduceSum(uint64_t n, const Buffer& input, Buffer& out) override {
    return builtin("raccel_reduce_sum", 1, 1024, n, ptrOf(input), ptrOf(out));
  }

 private:
  void bind() { driver()->cuCtxSetCurrent(context_); }
  static unsigned blocksFor(uint64_t n) { return static_cast<unsigned>(std::min<uint64_t>((n + 255) / 256, 65535)); }
  Status cu(CUresult rc, const char* what) {
    if (rc == CUDA_SUCCESS) return {};
    Code code = rc == CUDA_ERROR_OUT_OF_MEMORY ? Code::resourceExhausted : Code::internal;
    // These leave the context unusable: every later call fails the same way. The first
    // kind is the kernel's doing; the second the card's (a driver reset, an uncorrectable
    // memory or link error, a context destroyed under it), whatever the tenant ran.
    switch (rc) {
      case CUDA_ERROR_ILLEGAL_ADDRESS: case CUDA_ERROR_LAUNCH_TIMEOUT: case CUDA_ERROR_HARDWARE_STACK_ERROR:
      case CUDA_ERROR_ILLEGAL_INSTRUCTION: case CUDA_ERROR_MISALIGNED_ADDRESS: case CUDA_ERROR_INVALID_ADDRESS_SPACE:
      case CUDA_ERROR_INVALID_PC: case CUDA_ERROR_LAUNCH_FAILED: case CUDA_ERROR_ASSERT:
        if (lost_.empty()) lost_ = driver()->error(rc);
        break;
      case CUDA_ERROR_ECC_UNCORRECTABLE: case CUDA_ERROR_NVLINK_UNCORRECTABLE: case CUDA_ERROR_DEVICE_UNAVAILABLE:
      case CUDA_ERROR_SYSTEM_NOT_READY: case CUDA_ERROR_DEINITIALIZED: case CUDA_ERROR_CONTEXT_IS_DESTROYED:
        if (lost_.empty()) lost_ = driver()->error(rc), cardLost_ = true;
        break;
      default: break;
    }
    return fail(code, std::string(what) + ": " + driver()->error(rc));
  }

  // A kernel between two events on the stream; its time is reported by takeCompleted.
  template <class Launch>
  Status timed(Launch launch) {
    CUevent start = event(), end = event();
    if (!start || !end) return launch();  // no events: untimed, still correct
    if (auto s = cu(driver()->cuEventRecord(start, stream_), "cuEventRecord"); !s) return s;
    auto s = launch();
    if (!s) {
      spareEvents_.insert(spareEvents_.end(), {start, end});
      return s;
    }
    if (auto r = cu(driver()->cuEventRecord(end, stream_), "cuEventRecord"); !r) return r;
    timed_.push_back({start, end, kernelTag()});
    if (timed_.size() > 4096) {  // nobody asking (a caller that only finishes): the oldest go
      std::vector<KernelTime> dropped;
      takeCompleted(dropped);
    }
    return {};
  }
  CUevent event() {
    if (!spareEvents_.empty()) {
      CUevent e = spareEvents_.back();
      spareEvents_.pop_back();
      return e;
    }
    CUevent e = nullptr;
    if (driver()->cuEventCreate(&e, CU_EVENT_DEFAULT) != CUDA_SUCCESS) return nullptr;
    return e;
  }

  // The staging ring, made on first use; false when page-locked memory is refused.
  bool stagesReady() {
    if (!stages_.empty()) return true;
    if (stagingFailed_) return false;
    std::vector<Stage> made(kStages);
    for (auto& st : made) {
      if (driver()->cuMemAllocHost(&st.host, kStageBytes) != CUDA_SUCCESS ||
          driver()->cuEventCreate(&st.event, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS) {
        for (auto& m : made) {
          if (m.event) driver()->cuEventDestroy(m.event);
          if (m.host) driver()->cuMemFreeHost(m.host);
        }
        stagingFailed_ = true;
        return false;
      }
      driver()->cuEventRecord(st.event, stream_);  // passed at once: the stage is free
    }
    stages_ = std::move(made);
    return true;
  }

  // A matmul whose operands each walk one axis contiguously is cuBLAS's sgemm: row-major
  // out = a b is column-major out^T = b^T a^T, each operand transposed or not by which of
  // its strides is 1. Anything else (nullopt) runs the tensor kernel.
  std::optional<Status> matmulWithBlas(const LoweredTensorOp& op, const kernels::RcGeom& g) {
    const int64_t m = g.shape[0], n = g.shape[1], k = g.shape[2];
    if (m > INT32_MAX || n > INT32_MAX || k > INT32_MAX) return std::nullopt;
    auto unit = [&](int operand, int dim) { return g.stride[operand][dim] == 1 || g.shape[dim] == 1; };
    // out: its n axis contiguous, rows ldc apart.
    if (!unit(0, 1)) return std::nullopt;
    const int64_t ldc = std::max<int64_t>({g.stride[0][0], n, 1});
    if (m > 1 && g.stride[0][0] < n) return std::nullopt;
    struct Side {
      cublasOperation_t op;
      int64_t ld;
    };
    // An operand [rows x cols] (a: m x k, b: k x n) as column-major cuBLAS sees it.
    auto side = [&](int operand, int rowDim, int colDim, int64_t rows, int64_t cols) -> std::optional<Side> {
      const int64_t rs = g.stride[operand][rowDim], cs = g.stride[operand][colDim];
      if ((cs == 1 || cols == 1) && (rows == 1 || rs >= cols)) return Side{CUBLAS_OP_N, std::max<int64_t>({rs, cols, 1})};
      if ((rs == 1 || rows == 1) && (cols == 1 || cs >= rows)) return Side{CUBLAS_OP_T, std::max<int64_t>({cs, rows, 1})};
      return std::nullopt;
    };
    auto a = side(1, 0, 2, m, k), b = side(2, 2, 1, k, n);
    if (!a || !b || a->ld > INT32_MAX || b->ld > INT32_MAX || ldc > INT32_MAX) return std::nullopt;
    if (!unit(0, 1)) return std::nullopt;
    const float alpha = g.alpha, beta = g.beta;
    auto at = [&](int operand) { return reinterpret_cast<float*>(ptrOf(*op.buffers[operand]) + 4 * g.offset[operand]); };
    return timed([&]() -> Status {
      auto rc = cublas()->sgemm(blas_, b->op, a->op, int(n), int(m), int(k), &alpha, at(2), int(b->ld), at(1), int(a->ld),
                                &beta, at(0), int(ldc));
      if (rc != CUBLAS_STATUS_SUCCESS) return fail(Code::internal, "cublasSgemm failed (status " + std::to_string(rc) + ")");
      return {};
    });
  }

  template <class... A>
  Status builtin(const char* name, unsigned grid, unsigned block, A... args) {
    bind();
    CUfunction f = nullptr;
    if (auto s = cu(driver()->cuModuleGetFunction(&f, builtins_->module, name), name); !s) return s;
    void* params[] = {&args...};
    return timed([&] { return cu(driver()->cuLaunchKernel(f, grid, 1, 1, block, 1, 1, 0, stream_, params, nullptr), name); });
  }

  Result<CUmodule> loadModule(const std::string& name, std::string image) {
    image.push_back('\0');
    char log[8192] = {0};
    CUjit_option options[] = {CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
    void* values[] = {log, reinterpret_cast<void*>(sizeof log)};
    CUmodule module = nullptr;
    CUresult rc = driver()->cuModuleLoadDataEx(&module, image.data(), 2, options, values);
    if (rc != CUDA_SUCCESS)
      return fail(Code::invalidArgument, "program '" + name + "' could not be loaded (" + driver()->error(rc) + "). Log:\n" + log);
    return module;
  }

  Result<std::unique_ptr<CuProgram>> compile(const std::string& name, const std::string& source,
                                             const std::string& options = {}) {
    auto ptx = nvrtcCompile(name, source, major_, minor_, options);
    if (!ptx) return fail(ptx.error());
    auto module = loadModule(name, *ptx);
    if (!module) return fail(module.error());
    // The entry points, from the PTX (".entry NAME(").
    std::vector<std::string> names;
    for (size_t at = ptx->find(".entry "); at != std::string::npos; at = ptx->find(".entry ", at + 1)) {
      size_t start = at + 7, end = ptx->find_first_of("( \n", start);
      names.push_back(ptx->substr(start, end - start));
    }
    auto program = std::make_unique<CuProgram>(name, ProgramKind::cudaC, *module, names);
    program->description = describeModule(*module, names);
    return program;
  }

  CUdevice device_;
  int major_, minor_;
  CUcontext context_ = nullptr;
  CUstream stream_ = nullptr;
  cublasHandle_t blas_ = nullptr;
  std::unique_ptr<CuProgram> builtins_;
  std::unique_ptr<CuProgram> tensorKernels_;
  std::string lost_;
  bool cardLost_ = false;  // lost_ is the card's doing, not its work's
  // Kernel timing.
  struct Timed {
    CUevent start, end;
    uint64_t tag;
  };
  std::deque<Timed> timed_;
  std::vector<CUevent> spareEvents_;
  // Transfers: kStages page-locked buffers of kStageBytes (16 MiB of host memory a device).
  static constexpr uint64_t kStageBytes = 4ull << 20;
  static constexpr size_t kStages = 4;
  struct Stage {
    void* host = nullptr;
    CUevent event = nullptr;
  };
  std::vector<Stage> stages_;
  size_t nextStage_ = 0;
  bool stagingFailed_ = false;
};

}  // namespace

Result<std::string> compileCudaTensorKernels(int major, int minor) {
  return nvrtcCompile("raccel.tensor", std::string(kTensorPrelude) + kTensorKernelSource, major, minor, {});
}

std::vector<DeviceInfo> enumerateCudaDevices(std::string* note) {
  auto* d = driver();
  std::vector<DeviceInfo> out;
  if (!d->lib) {
    if (note) *note = d->note;
    return out;
  }
  int count = 0;
  if (d->cuDeviceGetCount(&count) != CUDA_SUCCESS || count == 0) {
    if (note) *note = "the CUDA driver reports no devices";
    return out;
  }
  for (int i = 0; i < count; ++i) {
    CUdevice dev = 0;
    if (d->cuDeviceGet(&dev, i) != CUDA_SUCCESS) continue;
    DeviceInfo info;
    info.backend = "cuda";
    info.index = static_cast<unsigned>(i);
    info.kind = CardKind::gpu;
    char name[256] = {0};
    d->cuDeviceGetName(name, sizeof name - 1, dev);
    info.model = name;
    size_t mem = 0;
    d->cuDeviceTotalMem(&mem, dev);
    info.memoryBytes = mem;
    int sms = 0, clockKhz = 0, major = 0, minor = 0;
    d->cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev);
    d->cuDeviceGetAttribute(&clockKhz, CU_DEVICE_ATTRIBUTE_CLOCK_RATE, dev);
    d->cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev);
    d->cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev);
    // Peak FP32: SMs x FP32 lanes per SM x 2 (fused multiply-add) x clock.
    info.tflops = 2.0 * sms * fp32LanesPerSm(major, minor) * (clockKhz * 1e3) / 1e12;
    out.push_back(info);
  }
  return out;
}

Result<std::unique_ptr<Device>> openCudaDevice(unsigned index, const DeviceOverrides& overrides) {
  std::string note;
  auto devices = enumerateCudaDevices(&note);
  if (index >= devices.size()) return fail(noSuchDevice("CUDA", index, devices.size(), note));
  auto* d = driver();
  CUdevice dev = 0;
  d->cuDeviceGet(&dev, static_cast<int>(index));
  int major = 0, minor = 0;
  d->cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev);
  d->cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev);
  Capabilities caps;
  caps.kind = CardKind::gpu;
  caps.model = devices[index].model;
  caps.backend = "cuda";
  caps.tflops = devices[index].tflops;
  caps.ownTflops = devices[index].tflops;  // kept when the config overrides tflops
  caps.memoryBytes = devices[index].memoryBytes;
  caps.programKinds = {ProgramKind::builtin, ProgramKind::ptx, ProgramKind::cubin, ProgramKind::cudaC};
  // Every CUDA device computes IEEE doubles with FMA and all roundings (NVRTC compiles
  // `double`): what OpenCL calls a full CL_DEVICE_DOUBLE_FP_CONFIG (CL_FP_DENORM,
  // INF_NAN, ROUND_TO_NEAREST, ROUND_TO_ZERO, ROUND_TO_INF, FMA).
  caps.doubleFpConfig = 0x1 | 0x2 | 0x4 | 0x8 | 0x10 | 0x20;
  caps.openclExtensions = "cl_khr_fp64";
  applyOverrides(caps, overrides);
  auto device = std::make_unique<CudaDevice>(caps, dev, major, minor);
  if (auto s = device->init(); !s) return fail(s.error());
  return std::unique_ptr<Device>(std::move(device));
}

Result<PinnedCopy> measurePinnedCopy(unsigned index, uint64_t bytes) {
  std::string note;
  auto devices = enumerateCudaDevices(&note);
  if (index >= devices.size()) return fail(noSuchDevice("CUDA", index, devices.size(), note));
  auto* d = driver();
  CUdevice dev = 0;
  CUcontext ctx = nullptr;
  d->cuDeviceGet(&dev, static_cast<int>(index));
  if (d->cuDevicePrimaryCtxRetain(&ctx, dev) != CUDA_SUCCESS) return fail(Code::unavailable, "cuDevicePrimaryCtxRetain failed");
  d->cuCtxSetCurrent(ctx);
  void* host = nullptr;
  CUdeviceptr mem = 0;
  Result<PinnedCopy> out = fail(Code::resourceExhausted, "no memory for the pinned copy baseline");
  if (d->cuMemAllocHost(&host, bytes) == CUDA_SUCCESS && d->cuMemAlloc(&mem, bytes) == CUDA_SUCCESS) {
    std::memset(host, 1, bytes);
    using Clock = std::chrono::steady_clock;
    d->cuMemcpyHtoDAsync(mem, host, bytes, nullptr);  // warm-up
    d->cuStreamSynchronize(nullptr);
    auto t0 = Clock::now();
    d->cuMemcpyHtoDAsync(mem, host, bytes, nullptr);
    d->cuStreamSynchronize(nullptr);
    auto t1 = Clock::now();
    d->cuMemcpyDtoHAsync(host, mem, bytes, nullptr);
    d->cuStreamSynchronize(nullptr);
    auto t2 = Clock::now();
    PinnedCopy p;
    p.writeGBps = bytes / std::chrono::duration<double>(t1 - t0).count() / 1e9;
    p.readGBps = bytes / std::chrono::duration<double>(t2 - t1).count() / 1e9;
    out = p;
  }
  if (mem) d->cuMemFree(mem);
  if (host) d->cuMemFreeHost(host);
  d->cuDevicePrimaryCtxRelease(dev);
  return out;
}

}  // namespace raccel::hal
