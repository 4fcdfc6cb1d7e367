// The conformance suite on every CUDA device (label gpu). Without a driver or a device
// the suite is not instantiated and CudaDevices.Present skips, saying why.
#include <gtest/gtest.h>

#include "hal/backends.h"
#include "hal/conformance.h"
#include "hal/cuda/cuda_device.h"
#include "hal/tensor.h"

namespace raccel::hal {

std::vector<Backend> conformanceBackends() { return discoveredBackends("cuda", {.memoryBytes = 64 << 20}, cudaSample()); }

namespace {
// The one kernel source compiles as CUDA C++ too, wherever NVRTC is (a machine without a
// GPU included): for Turing (the oldest CUDA 13 compiles for) and Hopper, with
// every tensor function's kernel in the PTX.
TEST(CudaKernels, TheTensorKernelsCompileWithNvrtc) {
  for (auto [major, minor] : {std::pair{7, 5}, std::pair{9, 0}}) {
    auto ptx = compileCudaTensorKernels(major, minor);
    if (!ptx && ptx.error().code == Code::unavailable) GTEST_SKIP() << ptx.error().message;
    ASSERT_TRUE(ptx) << ptx.error().message;
    for (unsigned f = 0; f < kTensorFns; ++f) {
      const std::string entry = std::string(".entry ") + tensorKernelName(TensorFn(f));
      EXPECT_NE(ptx->find(entry), std::string::npos) << entry << " for compute_" << major << minor;
    }
  }
}

TEST(CudaDevices, Present) {
  auto report = discover("cuda");
  if (report.devices.empty()) GTEST_SKIP() << "no CUDA device: " << report.note;
  for (auto& d : report.devices) {
    EXPECT_EQ(d.kind, CardKind::gpu);
    EXPECT_GT(d.tflops, 0) << d.model;  // from SM count, clock and FP32 lanes
    EXPECT_GT(d.memoryBytes, 0u);
  }
  // An operator's lower tflops is what the card registers; its own speed stays known.
  auto overridden = openDevice("cuda", 0, {.tflops = 1});
  ASSERT_TRUE(overridden) << overridden.error().message;
  EXPECT_EQ((*overridden)->capabilities().tflops, 1);
  EXPECT_EQ((*overridden)->capabilities().ownTflops, report.devices[0].tflops);
}
}  // namespace

}  // namespace raccel::hal
