// Discovery, calibration and overrides, on the backends this machine really has; the
// encoding of a program's description.
#include "hal/backends.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <span>
#include <vector>

#include "common/images.h"
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
  EXPECT_EQ(caps.ownTflops, caps.tflops);  // calibrated: its own speed
  EXPECT_EQ(caps.memoryBytes, 64u << 20);
  auto& kinds = caps.programKinds;
  EXPECT_NE(std::find(kinds.begin(), kinds.end(), ProgramKind::openclC), kinds.end());
  auto fpga = openDevice("opencl", 0, {.kind = CardKind::fpga, .tflops = 3});
  ASSERT_TRUE(fpga);
  EXPECT_EQ((*fpga)->capabilities().kind, CardKind::fpga);
  EXPECT_EQ((*fpga)->capabilities().tflops, 3);
  EXPECT_EQ((*fpga)->capabilities().ownTflops, 0);  // an operator's figure skips calibration
}

// An image of a buffer made for one launch lives until its kernel has run: many launches
// go in without a wait between, and every texel each wrote is in its buffer after.
TEST(Backends, OpenclImagesOfBuffersOutliveTheirLaunches) {
  auto report = discover("opencl");
  if (report.devices.empty()) GTEST_SKIP() << "no OpenCL device: " << report.note;
  auto d = openDevice("opencl", 0, {.memoryBytes = 64 << 20});
  ASSERT_TRUE(d) << d.error().message;
  Device& dev = **d;
  const char* text =
      "__kernel void put(__write_only image1d_buffer_t out, __global float* marks, float base) {\n"
      "  int i = get_global_id(0);\n"
      "  write_imagef(out, i, (float4)(base + i, -i, 0.5f, 1));\n"
      "  marks[i] = i;\n"
      "}\n";
  auto program = dev.loadProgram(ProgramKind::openclC, "put", std::as_bytes(std::span(text, std::strlen(text))));
  ASSERT_TRUE(program) << program.error().message;
  constexpr uint32_t kTexels = 64, kLaunches = 200;
  std::vector<std::unique_ptr<Buffer>> images;
  auto marks = dev.allocate(kTexels * 4);
  ASSERT_TRUE(marks);
  for (uint32_t l = 0; l < kLaunches; ++l) {
    auto b = dev.allocate(kTexels * 16);
    ASSERT_TRUE(b) << b.error().message;
    KernelArg args[3];
    args[0].type = KernelArg::Type::image;
    args[0].buffer = b->get();
    args[0].image = {.type = image::kImage1dBuffer, .channelOrder = 0x10B5 /* CL_RGBA */, .channelType = 0x10DE /* CL_FLOAT */, .width = kTexels};
    args[1].type = KernelArg::Type::buffer;
    args[1].buffer = marks->get();
    args[2].type = KernelArg::Type::f32;
    args[2].scalar.f32 = static_cast<float>(l * 1000);
    LaunchDims dims;
    dims.workDim = 1;
    dims.autoBlock = true;
    dims.grid = {kTexels, 1, 1};
    auto s = dev.launch(**program, "put", dims, args);
    ASSERT_TRUE(s) << s.error().message;
    images.push_back(std::move(*b));
  }
  for (uint32_t l = 0; l < kLaunches; ++l) {
    std::vector<float> got(kTexels * 4);
    ASSERT_TRUE(dev.read(*images[l], 0, std::as_writable_bytes(std::span(got))));
    for (uint32_t i = 0; i < kTexels; ++i)
      ASSERT_EQ(got[i * 4], static_cast<float>(l * 1000 + i)) << "launch " << l << " texel " << i;
  }
  ASSERT_TRUE(dev.finish());
}


// A sandbox sends its programs' descriptions through its window: they come back whole,
// and what does not parse (a flag other than 0 or 1, cut short) is refused.
TEST(ProgramDescriptions, RoundTripAndRefuseWhatDoesNotParse) {
  ProgramDescription d{.buildLog = "ok", .kernels = {{.name = "scale", .args = {{.size = 4}, {.size = 8}}}},
                       .argumentsKnown = true};
  auto back = decodeDescription(encodeDescription(d));
  ASSERT_TRUE(back) << back.error().message;
  EXPECT_TRUE(back->argumentsKnown);
  ASSERT_EQ(back->kernels.size(), 1u);
  EXPECT_EQ(back->kernels[0].name, "scale");
  ASSERT_EQ(back->kernels[0].args.size(), 2u);
  EXPECT_EQ(back->kernels[0].args[1].size, 8u);
  d.argumentsKnown = false;
  auto unknown = decodeDescription(encodeDescription(d));
  ASSERT_TRUE(unknown);
  EXPECT_FALSE(unknown->argumentsKnown);

  std::string bytes = encodeDescription(d);
  bytes[4 + 2] = 2;  // the flag after the log's length and bytes
  EXPECT_FALSE(decodeDescription(bytes));
  EXPECT_FALSE(decodeDescription(encodeDescription(d).substr(0, 9)));
}
}  // namespace
}  // namespace raccel::hal
