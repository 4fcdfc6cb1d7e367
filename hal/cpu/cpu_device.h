// The CPU backend: buffers in host memory and the built-in ops on a pool of threads.
// Always built. With a declared kind other than cpu it is a simulated card: a real
// device that computes real results, standing in for hardware this machine lacks.
#pragma once

#include <memory>
#include <string>

#include "hal/device.h"

namespace raccel::hal {

struct CpuDeviceOptions {
  CardKind kind = CardKind::cpu;
  std::string model = "host-cpu";
  double tflops = 1;
  uint64_t memoryBytes = 1ull << 30;
  unsigned threads = 0;  // 0 = one per core
  // Paced: the built-in ops take at least as long as a card of `tflops` would need, so
  // a simulated card's throughput is the configured one (results are computed for real).
  bool paced = false;
  // Asynchronous (implies paced): the built-in ops go to a queue that the card's own
  // thread runs in order, like a GPU stream; the call returns at once and each op's
  // device time (compute, then paced to `tflops`) is reported through takeCompleted().
  // Transfers, allocation and finish() wait for the queue first.
  bool async = false;
};

std::unique_ptr<Device> makeCpuDevice(const CpuDeviceOptions& options);

}  // namespace raccel::hal
