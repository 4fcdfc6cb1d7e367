// The conformance suite on every XRT (FPGA) card (label fpga). Built-in ops and source
// samples do not apply to an FPGA; buffers, memory limits and errors do. Without a
// card the suite is not instantiated and XrtDevices.Present skips, saying why.
#include <gtest/gtest.h>

#include "hal/backends.h"
#include "hal/conformance.h"

namespace raccel::hal {

std::vector<Backend> conformanceBackends() {
  return discoveredBackends("xrt", {.tflops = 1, .memoryBytes = 64 << 20}, std::nullopt);
}

namespace {
TEST(XrtDevices, Present) {
  auto report = discover("xrt");
  if (report.devices.empty()) GTEST_SKIP() << "no FPGA card: " << report.note;
  for (auto& d : report.devices) EXPECT_EQ(d.kind, CardKind::fpga);
}
}  // namespace

}  // namespace raccel::hal
