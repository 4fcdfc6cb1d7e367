// hal_test's backends: the cpu card, a simulated gpu (synchronous and asynchronous), and every OpenCL device found
// (PoCL's CPU device in CI), each limited to 64 MiB so the memory tests stay small.
#include "hal/backends.h"
#include "hal/conformance.h"
#include "hal/cpu/cpu_device.h"

namespace raccel::hal {

std::vector<Backend> conformanceBackends() {
  std::vector<Backend> out;
  out.push_back({"cpu", [] { return Result<std::unique_ptr<Device>>(makeCpuDevice({CardKind::cpu, "host", 1, 64 << 20, 2})); },
                 std::nullopt});
  out.push_back({"simulatedGpu",
                 [] { return Result<std::unique_ptr<Device>>(makeCpuDevice({CardKind::gpu, "sim-gpu", 8, 64 << 20, 1})); },
                 std::nullopt});
  // Asynchronous: ops queue on the card's own thread and are timed there.
  out.push_back({"asyncSimulatedGpu",
                 [] {
                   return Result<std::unique_ptr<Device>>(
                       makeCpuDevice({CardKind::gpu, "sim-gpu", 8, 64 << 20, 1, false, true}));
                 },
                 std::nullopt});
  auto opencl = discoveredBackends("opencl", {.tflops = 1, .memoryBytes = 64 << 20}, openclSample());
  out.insert(out.end(), opencl.begin(), opencl.end());
  return out;
}

}  // namespace raccel::hal
