// The XRT backend for Xilinx FPGA cards (xrt::device, xrt::xclbin, xrt::bo,
// xrt::kernel/xrt::run), built against Debian's libxrt-dev. Programs are xclbin
// bitstreams; a launch runs one compute unit with its arguments (grid and block sizes
// mean nothing to an FPGA kernel and are ignored). The built-in ops need a bitstream
// raccel does not ship, so an XRT card accepts xclbin programs only and is never a
// target of compute aggregation. TFLOPS cannot be derived or calibrated without a
// bitstream: it is the config's tflops= (1 when unset, with a warning in the listing).
// Zero devices (no card, or no XRT driver) is reported, not an error.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "hal/backends.h"

namespace raccel::hal {

std::vector<DeviceInfo> enumerateXrtDevices(std::string* note);
Result<std::unique_ptr<Device>> openXrtDevice(unsigned index, const DeviceOverrides& overrides);

}  // namespace raccel::hal
