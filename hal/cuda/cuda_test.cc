// The conformance suite on every CUDA device (label gpu). Without a driver or a device
// the suite is not instantiated and CudaDevices.Present skips, saying why.
#include <gtest/gtest.h>

#include "hal/backends.h"
#include "hal/conformance.h"

namespace raccel::hal {

std::vector<Backend> conformanceBackends() {
  std::vector<Backend> out;
  for (auto& d : discover("cuda").devices) {
    unsigned index = d.index;
    out.push_back({"cuda" + std::to_string(index),
                   [index] { return openDevice("cuda", index, {.memoryBytes = 64 << 20}); }, cudaSample()});
  }
  return out;
}

namespace {
TEST(CudaDevices, Present) {
  auto report = discover("cuda");
  if (report.devices.empty()) GTEST_SKIP() << "no CUDA device: " << report.note;
  for (auto& d : report.devices) {
    EXPECT_EQ(d.kind, CardKind::gpu);
    EXPECT_GT(d.tflops, 0) << d.model;  // from SM count, clock and FP32 lanes
    EXPECT_GT(d.memoryBytes, 0u);
  }
}
}  // namespace

}  // namespace raccel::hal
