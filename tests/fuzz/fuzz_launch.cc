// libFuzzer target: a guest's launch, as checkLaunch() (hal/device.h) checks it against a
// card's limits, then run on a CPU device where it is a launch of the built-in library
// (gemm, axpy, vadd, reduceSum over real buffers of fuzzer-chosen sizes; images and
// samplers are checked against a card that may have images, then refused by the
// built-in library): a check that
// let a kernel reach outside its buffers is a read or write out of bounds that
// AddressSanitizer reports; one that let a size overflow is UBSan's.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "hal/cpu/cpu_device.h"
#include "hal/slicing.h"
#include "tests/fuzz/input.h"

using namespace raccel::hal;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static std::unique_ptr<Device> device = makeCpuDevice(CpuDeviceOptions{.threads = 1});
  static auto program = device->loadProgram(raccel::ProgramKind::builtin, kBuiltinLibrary, {});
  raccel::fuzz::Input in(data, size);
  Capabilities caps;
  caps.localMemBytes = in.number(1) ? 65536 : 0;
  caps.maxWorkGroupSize = in.number(1) ? 1024 : 0;
  if (in.number(1)) {  // a card with images: any descriptor must still fit its buffer
    caps.images.max2dWidth = caps.images.max2dHeight = caps.images.max3dWidth = caps.images.max3dHeight = 1 + in.number(65535);
    caps.images.max3dDepth = caps.images.maxArraySize = caps.images.maxBufferPixels = 1 + in.number(65535);
    caps.images.formats = {raccel::formatKey(0x10B5, 0x10D2), raccel::formatKey(0x10B0, 0x10DE),
                           raccel::formatKey(0x10B0 + static_cast<uint32_t>(in.number(19)), 0x10D0 + static_cast<uint32_t>(in.number(16)))};
  }
  LaunchDims dims;
  for (auto& g : dims.grid) g = static_cast<uint32_t>(in.wide());
  for (auto& b : dims.block) b = static_cast<uint32_t>(in.wide());
  for (auto& o : dims.offset) o = in.wide();
  dims.sharedBytes = static_cast<uint32_t>(in.wide());
  dims.autoBlock = in.number(1);
  dims.workDim = static_cast<uint8_t>(in.number(5));  // 4 and 5: refused
  std::unique_ptr<Buffer> buffers[3];
  for (auto& b : buffers) {
    auto made = device->allocate(1 + in.number(4095));
    if (!made) return 0;
    b = std::move(*made);
  }
  std::vector<std::byte> bytes(in.number(5000));
  std::vector<KernelArg> args(in.number(9));
  for (auto& a : args) {
    a.type = static_cast<KernelArg::Type>(in.number(10));
    a.buffer = in.number(4) == 3 ? nullptr : buffers[in.number(2)].get();
    a.offset = in.wide();
    a.bytes = std::span<const std::byte>(bytes).first(in.number(bytes.size()));
    a.scalar.u64 = in.wide();
    if (a.type == KernelArg::Type::u32 || a.type == KernelArg::Type::local) a.scalar.u64 &= 0xFFFF;  // sizes a test can run
    if (a.type == KernelArg::Type::u64) a.scalar.u64 &= 0xFFFFF;
    a.image = {0x10F0 + static_cast<uint32_t>(in.number(7)), 0x10B0 + static_cast<uint32_t>(in.number(19)),
               0x10D0 + static_cast<uint32_t>(in.number(16)), static_cast<uint32_t>(in.number(1)),
               in.wide(), in.wide(), in.wide(), in.wide()};
  }
  static const char* kernels[] = {"gemm", "axpy", "vadd", "reduceSum", "nothing"};
  const std::string kernel = kernels[in.number(4)];
  if (!checkLaunch(caps, kernel, dims, args)) return 0;
  auto op = parseBuiltin(kernel, args);
  if (!op || !checkBuiltin(*op) || builtinWork(*op) > (1 << 22)) return 0;
  (void)device->launch(**program, kernel, dims, args);
  if (auto slices = sliceBuiltin(*op, 1 + double(in.number(4095))))
    for (int i = 0; i < 100000; ++i) {
      auto r = slices->runNext(*device);
      if (!r || *r) break;
    }
  return 0;
}
