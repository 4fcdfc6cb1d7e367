// The CUDA backend, built when the CUDA toolkit's headers are found. Everything is
// loaded at run time: the driver API with dlopen("libcuda.so.1") (absent = zero
// devices, not an error), NVRTC for cudaC programs and the built-in kernels, cuBLAS
// for the built-in gemm. Programs of kind ptx, cubin and cudaC; one in-order stream
// per device carries every copy and launch, and finish() synchronizes it.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "hal/backends.h"

namespace raccel::hal {

std::vector<DeviceInfo> enumerateCudaDevices(std::string* note);
Result<std::unique_ptr<Device>> openCudaDevice(unsigned index, const DeviceOverrides& overrides);

// A baseline for benchmarks: `bytes` copied host to device and back from page-locked
// host memory with the driver alone (no raccel); GB/s (10^9 bytes) each way.
struct PinnedCopy {
  double writeGBps = 0, readGBps = 0;
};
Result<PinnedCopy> measurePinnedCopy(unsigned index, uint64_t bytes);

// The tensor kernels (hal/tensor_kernels.inc behind the CUDA prelude) compiled to PTX for
// compute capability major.minor by NVRTC: no driver or device needed (unavailable when
// NVRTC is not installed).
Result<std::string> compileCudaTensorKernels(int major, int minor);

}  // namespace raccel::hal
