// The OpenCL backend: any OpenCL device behind the ICD loader (PoCL gives a real CPU
// device on machines without a GPU). Programs of kind openclC (built on the device;
// the build log comes back on failure) and spirv (where the device takes IL); the
// built-in ops run as OpenCL kernels compiled when the device is opened.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "hal/backends.h"

namespace raccel::hal {

// Devices of every OpenCL platform, in platform then device order; an empty list (with
// the reason in *note) when there is no ICD, no platform or no device.
std::vector<DeviceInfo> enumerateOpenclDevices(std::string* note);
Result<std::unique_ptr<Device>> openOpenclDevice(unsigned index, const DeviceOverrides& overrides);

}  // namespace raccel::hal
