// libFuzzer target: a guest's tensor op, as Device::tensor() checks it (hal/tensor.h),
// over three real buffers of fuzzer-chosen sizes on a CPU device. Whatever the checks
// accept is then run, whole and cut into slices (hal/slicing.h): a check that let an
// element outside its buffer through is a read or write out of bounds that
// AddressSanitizer reports, and an overflow in the shape arithmetic is UBSan's.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>

#include "hal/cpu/cpu_device.h"
#include "hal/slicing.h"
#include "tests/fuzz/input.h"

using namespace raccel::hal;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static std::unique_ptr<Device> device = makeCpuDevice(CpuDeviceOptions{.threads = 1});
  raccel::fuzz::Input in(data, size);
  std::unique_ptr<Buffer> buffers[3];
  for (auto& b : buffers) {
    auto made = device->allocate(1 + in.number(4095));
    if (!made) return 0;
    b = std::move(*made);
  }
  TensorOp op;
  op.fn = static_cast<TensorFn>(in.number(kTensorFns + 1));  // one past the last: refused
  op.dims = static_cast<unsigned>(in.number(kMaxTensorDims + 1));
  for (unsigned d = 0; d < kMaxTensorDims; ++d) op.shape[d] = in.wide();
  for (auto& o : op.operands) {
    o.buffer = in.number(4) == 3 ? nullptr : buffers[in.number(2)].get();
    o.offset = in.wide();
    for (auto& s : o.strides) s = in.wide();
    o.type = static_cast<TensorType>(in.number(kTensorTypes));  // one past the last: refused
  }
  op.alpha = in.real();
  op.beta = in.real();
  op.reduceMask = static_cast<uint32_t>(in.number(255));
  op.ignoreIndex = static_cast<int64_t>(in.wide());
  op.mean = in.number(1);
  if (in.number(1)) {  // a fused elementwise step before and after
    op.preScale = in.real(), op.preShift = in.real();
    op.postScale = in.real(), op.postShift = in.real();
  }
  auto lowered = lowerTensorOp(op);
  if (!lowered || lowered->empty || lowered->flops > 65536) return 0;  // refused, or too long to run here
  (void)device->tensor(op);
  auto slices = sliceTensor(op, 1 + double(in.number(63)));
  for (int i = 0; i < 70000; ++i) {
    auto r = slices->runNext(*device);
    if (!r || *r) break;
  }
  return 0;
}
