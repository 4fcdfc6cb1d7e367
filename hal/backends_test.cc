// Discovery, calibration and overrides, on the backends this machine really has.
#include "hal/backends.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "hal/cpu/cpu_device.h"

namespace raccel::hal {
namespace {

TEST(Backends, CpuIsAlwaysBuiltAndEveryBuiltBackendReports) {
  auto built = builtBackends();
  ASSERT_FALSE(built.empty());
  EXPECT_EQ(built.front(), "cpu");
  for (auto& b : built) {
    auto report = discover(b);
    EXPECT_EQ(report.backend, b);
    // Zero devices is normal (no GPU here), but it always says why.
    if (report.devices.empty()) {
      EXPECT_FALSE(report.note.empty()) << b;
    }
    for (auto& d : report.devices) {
      EXPECT_EQ(d.backend, b);
      EXPECT_FALSE(d.model.empty());
    }
  }
  EXPECT_FALSE(discover("tpu").note.empty());
}

TEST(Backends, OpeningAMissingDeviceSaysWhatThereIs) {
  for (auto& b : builtBackends()) {
    if (b == "cpu") continue;
    auto d = openDevice(b, 999, {});
    ASSERT_FALSE(d) << b;
    EXPECT_EQ(d.error().code, Code::notFound);
    EXPECT_NE(d.error().message.find("999"), std::string::npos) << d.error().message;
  }
  EXPECT_FALSE(openDevice("tpu", 0, {}));
}

TEST(Backends, CalibrationMeasuresTheCard) {
  auto device = makeCpuDevice({CardKind::cpu, "host", 0, 256 << 20, 1});
  auto t = calibrateTflops(*device);
  ASSERT_TRUE(t) << t.error().message;
  EXPECT_GT(*t, 1e-4);  // 0.1 GFLOPS: far below any real core
  EXPECT_LT(*t, 10.0);  // one thread does not reach 10 TFLOPS

  // A paced simulated card measures at its declared throughput.
  auto paced = makeCpuDevice({CardKind::npu, "sim", 0.002, 256 << 20, 1, true});
  auto p = calibrateTflops(*paced);
  ASSERT_TRUE(p) << p.error().message;
  if (*t > 0.004) {
    EXPECT_NEAR(*p, 0.002, 0.0005);
  }
}

TEST(Backends, OverridesReplaceKindAndTflopsAndOnlyShrinkMemory) {
  Capabilities caps{CardKind::cpu, "x", "opencl", 0.5, 1000, {}};
  applyOverrides(caps, {.kind = CardKind::fpga, .tflops = 7, .memoryBytes = 5000});
  EXPECT_EQ(caps.kind, CardKind::fpga);
  EXPECT_EQ(caps.tflops, 7);
  EXPECT_EQ(caps.memoryBytes, 1000u);
  applyOverrides(caps, {.memoryBytes = 10});
  EXPECT_EQ(caps.memoryBytes, 10u);
}

TEST(Backends, OpenclDevicesOpenWithTheirKindAndCalibratedTflops) {
  auto report = discover("opencl");
  if (report.devices.empty()) GTEST_SKIP() << "no OpenCL device: " << report.note;
  auto d = openDevice("opencl", 0, {.memoryBytes = 64 << 20});
  ASSERT_TRUE(d) << d.error().message;
  auto& caps = (*d)->capabilities();
  EXPECT_EQ(caps.backend, "opencl");
  EXPECT_EQ(caps.kind, report.devices[0].kind);
  EXPECT_GT(caps.tflops, 0);
  EXPECT_EQ(caps.memoryBytes, 64u << 20);
  auto& kinds = caps.programKinds;
  EXPECT_NE(std::find(kinds.begin(), kinds.end(), ProgramKind::openclC), kinds.end());
  auto fpga = openDevice("opencl", 0, {.kind = CardKind::fpga, .tflops = 3});
  ASSERT_TRUE(fpga);
  EXPECT_EQ((*fpga)->capabilities().kind, CardKind::fpga);
  EXPECT_EQ((*fpga)->capabilities().tflops, 3);
}

}  // namespace
}  // namespace raccel::hal
