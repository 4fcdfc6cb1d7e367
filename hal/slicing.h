// Bounded work: a built-in or tensor op cut into slices of bounded device time, so that a
// card shared by several tenants (netaccel/card_worker.h) chooses again between slices.
// Fair share and preemption then act on slices of about `sliceFlops` of work each, never
// on whole ops of unbounded length, and a session that ends stops its op at the next
// slice. Every slice is an op of the same vocabulary over a part of the whole, run
// through Device, which checks it again (a sandbox checks it a third time).
//
// Called from a card's worker thread; a SlicedWork is not thread-safe. The op must have
// been checked already (Device::tensor's rules; for built-ins, Device::gemm's and the
// others'): slicing relies on every element being inside its buffer.
#pragma once

#include <cstdint>
#include <memory>

#include "common/error.h"
#include "hal/device.h"

namespace raccel::hal {

class SlicedWork {
 public:
  virtual ~SlicedWork() = default;
  // Runs the next slice on `device`: true when the whole op is done.
  virtual Result<bool> runNext(Device& device) = 0;
  // Slices so far and in all (for logs: "slice 41 of 360000").
  uint64_t done() const { return done_; }
  virtual uint64_t total() const = 0;

 protected:
  uint64_t done_ = 0;
};

// The work of an op in floating-point operations, as the card's rated TFLOPS count it
// (an elementwise op: one per element; matmul: two per multiply-add).
double tensorWork(const LoweredTensorOp& op);

// `op` (checked by lowerTensorOp) in slices of at most `sliceFlops` each, save where one
// indivisible unit is larger (a row of logSoftmax, nllLoss's whole batch: bounded by
// lowerTensorOp). A cut reduction (sum's reduced dimensions, matmul's k) first scales
// the output by beta, then accumulates slice by slice.
std::unique_ptr<SlicedWork> sliceTensor(const TensorOp& op, double sliceFlops);

// A built-in op (checked by checkBuiltin) as tensor ops in slices; null when the whole
// op fits one slice (it then runs as itself).
double builtinWork(const BuiltinOp& op);
std::unique_ptr<SlicedWork> sliceBuiltin(const BuiltinOp& op, double sliceFlops);

// Byte fills and copies in pieces of at most `sliceBytes` (a copy within one buffer whose
// ranges overlap goes in the order that keeps memmove's meaning); null when one piece
// holds it all. Ranges must have been checked (Device::fill, Device::copy).
std::unique_ptr<SlicedWork> sliceFill(Buffer& buffer, uint64_t offset, uint64_t length, uint8_t value,
                                      uint64_t sliceBytes);
std::unique_ptr<SlicedWork> sliceCopy(Buffer& dst, uint64_t dstOffset, const Buffer& src, uint64_t srcOffset,
                                      uint64_t length, uint64_t sliceBytes);

}  // namespace raccel::hal
