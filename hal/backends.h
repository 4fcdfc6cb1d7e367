// Device discovery across the backends compiled into this build: which backends exist,
// which devices each one sees, and opening a device with the operator's overrides.
// A backend whose library or driver is absent reports zero devices and why; that is
// normal (a server without an FPGA), never an error.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "hal/device.h"

namespace raccel::hal {

// What the operator's config may override on a discovered device.
struct DeviceOverrides {
  std::optional<CardKind> kind;       // e.g. an FPGA that presents itself as an OpenCL accelerator
  std::optional<std::string> model;
  std::optional<double> tflops;       // skips the calibration run
  std::optional<uint64_t> memoryBytes;  // at most what the device has
  bool noImages = false;              // offer no images even where the device has them
  bool mapsOneByOne = false;          // no runs of small maps (hal/flat_run.h): a bench's baseline
};

// A device a backend can see, before it is opened.
struct DeviceInfo {
  std::string backend;
  unsigned index = 0;  // within its backend
  CardKind kind = CardKind::cpu;
  std::string model;
  uint64_t memoryBytes = 0;
  double tflops = 0;  // from the device's properties; 0 = unknown until calibrated
};

struct BackendReport {
  std::string backend;
  std::vector<DeviceInfo> devices;
  std::string note;  // why there are none, or what was found
};

// Backends compiled into this build, "cpu" first.
std::vector<std::string> builtBackends();
// Devices of one backend (cpu reports none: cpu cards are declared, not discovered).
BackendReport discover(const std::string& backend);
// Opens device `index` of `backend`. TFLOPS: the override, else the device's
// properties, else a short calibration run of the built-in gemm.
Result<std::unique_ptr<Device>> openDevice(const std::string& backend, unsigned index, const DeviceOverrides& overrides);

// Measures a device's f32 gemm throughput in TFLOPS with a short run (about 0.1-0.5 s).
Result<double> calibrateTflops(Device& device);

// The error for a device index a backend does not have (for backends' open functions).
Error noSuchDevice(const std::string& backend, unsigned index, size_t found, const std::string& note);

// Applies overrides to capabilities a backend derived (memory only ever shrinks).
void applyOverrides(Capabilities& caps, const DeviceOverrides& overrides);

}  // namespace raccel::hal
