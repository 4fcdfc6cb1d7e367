// The tensor functions and element types, in the order of the wire's TensorFn and
// TensorType (schema/guest.capnp): one list for the client (vmfrontend/raccel.h) and the
// HAL (hal/tensor.h, which checks it against the kernels' numbers in tensor_kernels.inc).
#pragma once

#include <cstdint>

namespace raccel {

enum class TensorFn : uint8_t {
  copy, fill, add, mul, div, relu, thresholdBackward, exp, log, affine,
  sum, matmul, logSoftmax, logSoftmaxBackward, nllLoss, nllLossBackward,
  sqrt, tanh, sigmoid, tanhBackward, sigmoidBackward, addcmul, addcdiv, maximum, minimum, abs, pow,
  layerNorm, layerNormBackward,
  gelu, geluBackward, silu, siluBackward, leakyRelu, leakyReluBackward, softplus, softplusBackward, hardtanh,
  hardtanhBackward, softmax, softmaxBackward, sign,
  eq, ne, lt, le, gt, ge, where, clamp, log1p, reciprocal, rsqrt, elu, eluBackward, lerp,
  amax, amin, argmax, argmin, indexSelect, indexAdd, uniform, bernoulli, normal, gatherSum,
  maxPool2d, maxPool2dBackward,
  hardswish, hardswishBackward, hardsigmoid, hardsigmoidBackward, mish, mishBackward, sort,
  // elementwise math of one input (since 2026-11-30)
  floor, ceil, round, trunc, frac, sin, cos, tan, asin, acos, atan, sinh, cosh, erf, erfc, expm1, log2, log10, exp2,
  // elementwise math of two inputs (since 2026-11-30)
  atan2, hypot, copysign, fmod,
  // the gamma function's log and derivative, and erf's inverse (since 2026-11-30)
  lgamma, digamma, erfinv,
  // the bits of i64 (since 2026-12-01)
  bitwiseAnd, bitwiseOr, bitwiseXor, shiftLeft, shiftRight,
  // psi's n-th derivative, n in alpha (since 2026-12-01)
  polygamma,
  // linear algebra: a work-item a matrix, or a right-hand column (since 2026-12-01)
  cholesky, triangularSolve, luFactor, luSolve,
  // the greatest common divisor of i64 (since 2026-12-01)
  gcd,
  // indexAdd's scatter with a product, a largest, a smallest or the last pick (since 2026-12-01)
  indexReduce,
  // orthogonal factorizations: Householder QR and the product of its reflectors, and the
  // symmetric eigenproblem and the singular values by Jacobi's rotations; a work-item a
  // matrix (since 2026-12-01)
  qrFactor, householderProduct, symmetricEigen, singularValues,
  // connectionist temporal classification's forward or backward variables, a work-item a
  // sequence (since 2026-12-01)
  ctcLattice,
};
inline constexpr unsigned kTensorFns = 118;

// i32, f64, f16 and bf16 are storage types: copies and fills convert to and from them
// (PyTorch's int32 results, linear algebra's pivots and infos; numpy's float64,
// half-precision models) and picks move them (storageOnly); no other function takes them
// but the float map functions, which take f16 and bf16 operands, computed in f32 and
// rounded once (hal/tensor.cc, floatMapOverHalves).
enum class TensorType : uint8_t { f32, i64, boolean, i32, f64, f16, bf16 };
inline constexpr unsigned kTensorTypes = 7;
// The bytes of one element.
constexpr uint64_t tensorTypeBytes(TensorType t) {
  switch (t) {
    case TensorType::i64: case TensorType::f64: return 8;
    case TensorType::boolean: return 1;
    case TensorType::f16: case TensorType::bf16: return 2;
    default: return 4;
  }
}
// The storage types: copies (conversions between any two types), fills and picks
// (indexSelect, where) alone.
constexpr bool storageOnly(TensorType t) {
  return t == TensorType::i32 || t == TensorType::f64 || t == TensorType::f16 || t == TensorType::bf16;
}

// The elementwise functions of the map kernel (rc_map) whose arithmetic takes a fused
// scale and shift of operand a before it and of the result after it (TensorOp's preScale,
// preShift, postScale, postShift), over f32 operands. The HAL refuses the scales on any
// other function; the client folds an in-place affine step into these.
constexpr bool takesFusedScale(TensorFn fn) {
  switch (fn) {
    case TensorFn::copy: case TensorFn::fill: case TensorFn::add: case TensorFn::mul: case TensorFn::div:
    case TensorFn::relu: case TensorFn::thresholdBackward: case TensorFn::exp: case TensorFn::log:
    case TensorFn::affine: case TensorFn::sqrt: case TensorFn::tanh: case TensorFn::sigmoid:
    case TensorFn::tanhBackward: case TensorFn::sigmoidBackward: case TensorFn::addcmul: case TensorFn::addcdiv:
    case TensorFn::maximum: case TensorFn::minimum: case TensorFn::abs: case TensorFn::pow: case TensorFn::gelu:
    case TensorFn::geluBackward: case TensorFn::silu: case TensorFn::siluBackward: case TensorFn::leakyRelu:
    case TensorFn::leakyReluBackward: case TensorFn::softplus: case TensorFn::softplusBackward:
    case TensorFn::hardtanh: case TensorFn::hardtanhBackward: case TensorFn::sign: case TensorFn::clamp:
    case TensorFn::log1p: case TensorFn::reciprocal: case TensorFn::rsqrt: case TensorFn::elu:
    case TensorFn::eluBackward: case TensorFn::lerp: case TensorFn::hardswish: case TensorFn::hardswishBackward:
    case TensorFn::hardsigmoid: case TensorFn::hardsigmoidBackward: case TensorFn::mish: case TensorFn::mishBackward:
    case TensorFn::floor: case TensorFn::ceil: case TensorFn::round: case TensorFn::trunc: case TensorFn::frac:
    case TensorFn::sin: case TensorFn::cos: case TensorFn::tan: case TensorFn::asin: case TensorFn::acos:
    case TensorFn::atan: case TensorFn::sinh: case TensorFn::cosh: case TensorFn::erf: case TensorFn::erfc:
    case TensorFn::expm1: case TensorFn::log2: case TensorFn::log10: case TensorFn::exp2:
    case TensorFn::atan2: case TensorFn::hypot: case TensorFn::copysign: case TensorFn::fmod:
    case TensorFn::lgamma: case TensorFn::digamma: case TensorFn::erfinv: case TensorFn::polygamma:
      return true;
    default:
      return false;
  }
}

// The operands a function writes, as a mask (bit i: operand i): the output, and the
// forwards that write a second result: layerNorm's mean and rstd, maxPool2d's index,
// nllLoss's total weight, sort's positions and its scratch, cholesky's info, luFactor's
// pivots and info, qrFactor's tau, symmetricEigen's eigenvalues and its scratch, singularValues' values and V.
constexpr unsigned writtenOperands(TensorFn fn) {
  switch (fn) {
    case TensorFn::layerNorm: return 0b1101;
    case TensorFn::maxPool2d: return 0b0011;
    case TensorFn::nllLoss: return 0b1001;
    case TensorFn::sort: return 0b1101;
    case TensorFn::cholesky: return 0b0101;
    case TensorFn::luFactor: return 0b1101;
    case TensorFn::qrFactor: return 0b0101;
    case TensorFn::symmetricEigen:
    case TensorFn::singularValues: return 0b1101;
    default: return 0b0001;
  }
}

}  // namespace raccel
