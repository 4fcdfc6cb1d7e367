// The hal conformance suite (device_test.cc) runs against the backends a test binary
// names here: hal_test gives cpu, a simulated gpu and every OpenCL device; hal_cuda_test
// (label gpu) and hal_xrt_test (label fpga) give the cards of their backend.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "hal/backends.h"
#include "hal/device.h"

namespace raccel::hal {

// A program in the backend's own language, for the launch tests: kernel `scale`
// taking (float s, buffer x, uint n) and doing x[i] *= s for i < n, one item per element.
struct SampleProgram {
  ProgramKind kind;
  std::string source;
  std::string broken;  // the same with a syntax error
};

struct Backend {
  std::string name;
  std::function<Result<std::unique_ptr<Device>>()> make;
  std::optional<SampleProgram> sample;
};

std::vector<Backend> conformanceBackends();
inline void PrintTo(const Backend& b, std::ostream* os) { *os << b.name; }

// One entry per device `backend` discovers, opened with `overrides`.
std::vector<Backend> discoveredBackends(const std::string& backend, const DeviceOverrides& overrides,
                                        std::optional<SampleProgram> sample);

// The OpenCL C and CUDA C versions of the sample.
SampleProgram openclSample();
SampleProgram cudaSample();

}  // namespace raccel::hal
