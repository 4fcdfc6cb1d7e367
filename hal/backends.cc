#include "hal/backends.h"

#include <chrono>

#include "hal/cpu/cpu_device.h"
#ifdef RACCEL_HAVE_OPENCL
#include "hal/opencl/opencl_device.h"
#endif
#ifdef RACCEL_HAVE_CUDA
#include "hal/cuda/cuda_device.h"
#endif
#ifdef RACCEL_HAVE_XRT
#include "hal/xrt/xrt_device.h"
#endif

namespace raccel::hal {

std::vector<std::string> builtBackends() {
  std::vector<std::string> out{"cpu"};
#ifdef RACCEL_HAVE_OPENCL
  out.push_back("opencl");
#endif
#ifdef RACCEL_HAVE_CUDA
  out.push_back("cuda");
#endif
#ifdef RACCEL_HAVE_XRT
  out.push_back("xrt");
#endif
  return out;
}

BackendReport discover(const std::string& backend) {
  BackendReport r;
  r.backend = backend;
  if (backend == "cpu") {
    r.note = "cpu cards are declared in the config (backend=cpu), not discovered";
    return r;
  }
#ifdef RACCEL_HAVE_OPENCL
  if (backend == "opencl") r.devices = enumerateOpenclDevices(&r.note);
  else
#endif
#ifdef RACCEL_HAVE_CUDA
  if (backend == "cuda") r.devices = enumerateCudaDevices(&r.note);
  else
#endif
#ifdef RACCEL_HAVE_XRT
  if (backend == "xrt") r.devices = enumerateXrtDevices(&r.note);
  else
#endif
    r.note = "not built into this binary";
  if (!r.devices.empty() && r.note.empty()) r.note = std::to_string(r.devices.size()) + " device(s)";
  return r;
}

Result<std::unique_ptr<Device>> openDevice(const std::string& backend, unsigned index, const DeviceOverrides& overrides) {
  Result<std::unique_ptr<Device>> device = fail(Code::notFound, "backend '" + backend + "' is not built into this binary");
#ifdef RACCEL_HAVE_OPENCL
  if (backend == "opencl") device = openOpenclDevice(index, overrides);
#endif
#ifdef RACCEL_HAVE_CUDA
  if (backend == "cuda") device = openCudaDevice(index, overrides);
#endif
#ifdef RACCEL_HAVE_XRT
  if (backend == "xrt") device = openXrtDevice(index, overrides);
#endif
  if (!device) return device;  // each backend has applied the overrides
  (*device)->setDeviceIndex(index);
  if ((*device)->capabilities().tflops <= 0) {
    auto measured = calibrateTflops(**device);
    if (!measured)
      return fail(measured.error().code, backend + " device " + std::to_string(index) +
                                             ": its TFLOPS could not be measured (" + measured.error().message +
                                             "); set tflops= for this card in the config");
    (*device)->setTflops(*measured);
    (*device)->setOwnTflops(*measured);
  }
  return device;
}

Result<double> calibrateTflops(Device& device) {
  // Grow the problem until one gemm takes long enough to time, then take the best of three.
  using Clock = std::chrono::steady_clock;
  uint32_t n = 128;
  double best = 0;
  for (;;) {
    uint64_t bytes = uint64_t{n} * n * 4;
    if (3 * bytes > device.capabilities().memoryBytes) break;
    auto a = device.allocate(bytes), b = device.allocate(bytes), c = device.allocate(bytes);
    if (!a || !b || !c) return fail(Code::resourceExhausted, "no memory for the calibration gemm");
    GemmArgs g{n, n, n, 1, 0, a->get(), b->get(), c->get()};
    if (auto s = device.gemm(g); !s) return fail(s.error());  // warm-up (and kernel compilation)
    if (auto s = device.finish(); !s) return fail(s.error());
    double seconds = 1e30;
    for (int rep = 0; rep < 3; ++rep) {
      auto start = Clock::now();
      if (auto s = device.gemm(g); !s) return fail(s.error());
      if (auto s = device.finish(); !s) return fail(s.error());
      seconds = std::min(seconds, std::chrono::duration<double>(Clock::now() - start).count());
    }
    best = 2.0 * n * n * n / seconds / 1e12;
    device.release(std::move(*a));
    device.release(std::move(*b));
    device.release(std::move(*c));
    if (seconds > 0.02 || n >= 2048) break;
    n *= 2;
  }
  if (best <= 0) return fail(Code::resourceExhausted, "the card is too small for a calibration gemm");
  return best;
}

Error noSuchDevice(const std::string& backend, unsigned index, size_t found, const std::string& note) {
  return Error{Code::notFound, "no " + backend + " device " + std::to_string(index) + " (" +
                                   (found == 0 ? note : std::to_string(found) + " found") + ")"};
}

void applyOverrides(Capabilities& caps, const DeviceOverrides& o) {
  if (o.kind) caps.kind = *o.kind;
  if (o.model) caps.model = *o.model;
  if (o.tflops) caps.tflops = *o.tflops;
  if (o.memoryBytes) caps.memoryBytes = std::min(caps.memoryBytes, *o.memoryBytes);
  if (o.noImages) caps.images = {};
}

}  // namespace raccel::hal
