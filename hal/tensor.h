// Tensor ops: what a framework's device needs (PyTorch's privateuseone backend,
// vmfrontend/python), as one built-in op over strided views of buffers. The semantics of
// each function are in schema/guest.capnp (TensorOp). Device::tensor() checks an op once
// here (operand counts, every element each operand can reach inside its buffer, the
// stride rules of each function) and lowers it to the geometry the kernels take; the
// kernels themselves are one source for every backend (hal/tensor_kernels.inc).
#pragma once

#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>

#include "common/error.h"
#include "common/tensor_fns.h"

namespace raccel::hal {
class Buffer;
// log |gamma(x)| through glibc's reentrant form: lgammaf also writes the global signgam,
// a race between the CPU card's worker threads.
inline float lgammaOf(float x) {
  int sign;
  return ::lgammaf_r(x, &sign);
}
}  // namespace raccel::hal

// The CPU's compilation of the kernels (the prelude tensor_kernels.inc asks for); the
// geometry type RcGeom is shared with the devices' compilations.
#define RC_KERNEL inline void
#define RC_FUNC inline
#define RC_GLOBAL
#define RC_I64 int64_t
#define RC_GEOM const RcGeom&
#define RC_CPU_GID RC_I64 rc_gid,
#define RC_GID rc_gid
#define RC_EXP(x) std::exp(x)
#define RC_LOG(x) std::log(x)
#define RC_FMAX(x, y) std::fmax(x, y)
#define RC_NAN std::numeric_limits<float>::quiet_NaN()
#define RC_INFINITY std::numeric_limits<float>::infinity()
#define RC_SQRT(x) std::sqrt(x)
#define RC_TANH(x) std::tanh(x)
#define RC_POW(x, y) std::pow(x, y)
#define RC_FABS(x) std::fabs(x)
#define RC_ERF(x) std::erf(x)
#define RC_LOG1P(x) std::log1p(x)
#define RC_COS(x) std::cos(x)
#define RC_F(name, x) std::name(x)
#define RC_LGAMMA(x) raccel::hal::lgammaOf(x)
#define RC_F2(name, x, y) std::name(x, y)
#define RC_AS_UINT(x) std::bit_cast<unsigned int>(static_cast<float>(x))
#define RC_AS_FLOAT(u) std::bit_cast<float>(static_cast<unsigned int>(u))
#define RC_U64 uint64_t
namespace raccel::hal::kernels {
#include "hal/tensor_kernels.inc"
}  // namespace raccel::hal::kernels

namespace raccel::hal {

inline constexpr unsigned kMaxTensorDims = RC_MAX_DIMS;
inline constexpr unsigned kMaxTensorOperands = RC_MAX_OPERANDS;

// The functions and element types (common/tensor_fns.h), as the HAL's.
using raccel::kTensorFns;
using raccel::kTensorTypes;
using raccel::takesFusedScale;
using raccel::TensorFn;
using raccel::TensorType;

const char* tensorTypeName(TensorType t);
using raccel::storageOnly;
using raccel::tensorTypeBytes;

const char* tensorFnName(TensorFn fn);
// Operands the function takes, the output included.
unsigned tensorFnOperands(TensorFn fn);
// The kernel (in tensor_kernels.inc) that runs the function.
const char* tensorKernelName(TensorFn fn);

struct TensorOperand {
  Buffer* buffer = nullptr;
  uint64_t offset = 0;                        // elements
  std::array<uint64_t, kMaxTensorDims> strides{};  // elements, per dimension of the shape
  TensorType type = TensorType::f32;
};

struct TensorOp {
  TensorFn fn = TensorFn::copy;
  unsigned dims = 1;
  std::array<uint64_t, kMaxTensorDims> shape{1, 1, 1, 1, 1, 1};
  std::array<TensorOperand, kMaxTensorOperands> operands{};  // [0] is the output
  float alpha = 1, beta = 0;
  uint32_t reduceMask = 0;
  int64_t ignoreIndex = -100;
  bool mean = true;
  // Random draws (uniform, bernoulli, normal; the key in ignoreIndex): the position in
  // operand 0's buffer of the element drawn with counter 0. Each element's counter is
  // its position less this, so one key draws the same numbers wherever the output lies
  // (torch.manual_seed makes the same tensors again), and a slice (hal/slicing.h), which
  // keeps its op's origin, draws what the whole op would. Where an op comes in from the
  // wire, its output's own offset (netaccel/card_worker.cc).
  uint64_t drawOrigin = 0;
  // Elementwise map functions over f32: a read as preScale * a + preShift, the result
  // written as postScale * r + postShift (schema/guest.capnp); (1, 0) for the others.
  float preScale = 1, preShift = 0, postScale = 1, postShift = 0;
};

// A checked op, ready for a kernel: its geometry and its operands' buffers (the output
// stands in for operands the function does not take).
struct LoweredTensorOp {
  TensorOp op;  // as asked (a sandbox's proxy sends it on, to be checked again there)
  kernels::RcGeom geom{};
  std::array<Buffer*, kMaxTensorOperands> buffers{};
  double flops = 0;
  bool empty = false;  // a shape with a zero: nothing to run
};

// Checks `op` against its buffers' sizes and lowers it (invalidArgument naming the
// problem otherwise).
Result<LoweredTensorOp> lowerTensorOp(const TensorOp& op);

// One entry of a batched matmul ([batch, m, n, k]) as a matmul of its own ([m, n, k]):
// for backends that hand each to a BLAS.
kernels::RcGeom matmulEntry(const kernels::RcGeom& batched, int64_t entry);

// The tensor kernels' OpenCL C / CUDA C source (tensor_kernels.inc), as the backends
// that compile it are given it: what a cache of its compiled kernels is keyed by.
std::string_view tensorKernelSource();

}  // namespace raccel::hal
