// A run of small flat maps launched as one kernel (tensor_kernels.inc: rc_flat_run).
// An optimizer's step over a model's parameters is a few maps per tensor, each over a
// few hundred elements: on PoCL such a kernel costs a few microseconds to start (the
// reference CNN's 50-map SGD step: 230 us one kernel a map, 74 us in runs, on its
// pthread device) and well under one to run. A device that holds queued work (Device::plug)
// gathers these maps here and launches each run of up to RC_RUN_STEPS of them once.
//
// A map joins only where running it in the same kernel as the earlier steps gives what
// running them one after the other would: rc_flat_run's work-item i runs every step over
// the same elements [RC_RUN_SPAN i, RC_RUN_SPAN (i + 1)) of it, in order, so a step may touch bytes that an
// earlier step wrote (or write bytes an earlier step read) only at the same element
// offset, where the same work-item touched them.
#pragma once

#include <array>
#include <cstdint>
#include <utility>
#include <vector>

#include "hal/device.h"
#include "hal/tensor.h"

namespace raccel::hal {

class FlatRun {
 public:
  // The largest map that joins a run: past it, a kernel's start is small beside its work.
  static constexpr uint64_t kMaxElements = 1 << 14;
  static constexpr unsigned kMaxSteps = RC_RUN_STEPS;
  static constexpr unsigned kSlots = 4;  // distinct buffers a run reaches

  // A map rc_flat_run runs: one of rc_flat_'s functions (but GELU's, whose vector form a
  // CPU device runs instead), f32 operands all contiguous, at most kMaxElements.
  static bool fits(const LoweredTensorOp& op);

  // Adds `op` (fits() holds), issued under `tag`: false, and nothing added, when the run
  // is full, would reach a fifth buffer, or `op` touches what an earlier step touched at
  // another offset where either writes it (then launch this run and start the next).
  bool join(const LoweredTensorOp& op, uint64_t tag);

  bool empty() const { return steps_.empty(); }
  size_t size() const { return steps_.size(); }
  // The kernel's first argument and its buffers (slots not used: the first one again).
  kernels::RcRun args() const;
  const std::array<Buffer*, kSlots>& buffers() const { return buffers_; }
  // rc_flat_run's work-items: one a RC_RUN_SPAN elements of the longest step.
  uint64_t workItems() const { return (widest_ + RC_RUN_SPAN - 1) / RC_RUN_SPAN; }
  // A run of one launches as the map's own kernel.
  const LoweredTensorOp& first() const { return first_; }
  // Each step's tag and elements: the run's device time is split among them so.
  const std::vector<std::pair<uint64_t, uint64_t>>& shares() const { return shares_; }
  void clear();

 private:
  struct Access {
    unsigned slot;
    uint64_t from, to;  // elements
    bool written;
  };
  std::vector<kernels::RcRunStep> steps_;
  std::vector<Access> touched_;
  std::vector<std::pair<uint64_t, uint64_t>> shares_;
  std::array<Buffer*, kSlots> buffers_{};
  unsigned slots_ = 0;
  uint64_t widest_ = 0;
  LoweredTensorOp first_;
};

// `ns` of a run's device time as one KernelTime per share, in proportion to its
// elements (the remainder to the last, so that they add up to `ns`).
void splitRunTime(const std::vector<std::pair<uint64_t, uint64_t>>& shares, uint64_t ns, std::vector<KernelTime>& out);

}  // namespace raccel::hal
