// The torch device's elementwise families: map functions of one and two inputs, division
// and its rounding modes, the optimizers' steps (addcmul, addcdiv, lerp), activations
// with their backwards, clamps, and the gradients of a tensor times or over a number.
#include <torch/csrc/autograd/custom_function.h>

#include "vmfrontend/python/torch_device.h"

namespace raccel::python {

namespace {

// ---- Elementwise families (optimizers' steps, activations and their backwards) ----------

// out = fn(self) (alpha and beta as the function takes them), or the host's `reference`
// counted.
template <class Host>
at::Tensor& unaryOut(TensorFn fn, const char* name, const at::Tensor& self0, at::Tensor& out, float alpha, Host reference,
                     float beta = 0) {
  const at::Tensor self = promoted(self0, out);
  if (fn == TensorFn::affine && alpha == -1 && beta == 0 && bothI64(self, out)) {  // neg of i64: times -1, exactly
    auto minusOne = *deviceNumber(at::scalar_tensor(-1, at::kLong), at::kLong);
    at::native::resize_output(out, self.sizes());
    elementwise(TensorFn::mul, out, &self, &minusOne);
    return out;
  }
  const bool exactInteger = fn == TensorFn::abs && bothI64(self, out);  // (the card's abs over i64)
  if (!exactInteger && !supported({&self, &out}))
    return orHostInto(name, out, {&self, &out}, [&](auto in) { return reference(in(self)); });
  at::native::resize_output(out, self.sizes());
  elementwise(fn, out, &self, nullptr, alpha, beta);
  return out;
}
// An out that cannot hold an op's result type is refused, with PyTorch's message.
void checkOutHolds(at::ScalarType result, const at::Tensor& out) {
  TORCH_CHECK(at::canCast(result, out.scalar_type()), "result type ", result, " can't be cast to the desired output type ",
              out.scalar_type());
}

// `floats`: a float function, whose result on integers is the default float type.
#define RACCEL_UNARY(op, fn, alpha, floats)                                                                  \
  at::Tensor& op##_out(const at::Tensor& self, at::Tensor& out) {                                              \
    if (floats) checkOutHolds(floatResult(self.scalar_type()), out);                                           \
    return unaryOut(fn, "aten::" #op, self, out, alpha, [](const at::Tensor& x) { return at::op(x); });        \
  }                                                                                                            \
  at::Tensor op(const at::Tensor& self) {                                                                      \
    auto out = emptyOn({0}, floats ? floatResult(self.scalar_type()) : self.scalar_type());                    \
    return python::op##_out(self, out);                                                                        \
  }                                                                                                            \
  at::Tensor& op##_(at::Tensor& self) { return python::op##_out(self, self); }
RACCEL_UNARY(sqrt, TensorFn::sqrt, 1, true)
RACCEL_UNARY(tanh, TensorFn::tanh, 1, true)
RACCEL_UNARY(sigmoid, TensorFn::sigmoid, 1, true)
RACCEL_UNARY(abs, TensorFn::abs, 1, false)
RACCEL_UNARY(neg, TensorFn::affine, -1, false)
RACCEL_UNARY(sign, TensorFn::sign, 1, false)
RACCEL_UNARY(sgn, TensorFn::sign, 1, false)  // for real numbers, sign (abs's backward)
RACCEL_UNARY(exp, TensorFn::exp, 1, true)
RACCEL_UNARY(log, TensorFn::log, 1, true)
RACCEL_UNARY(log1p, TensorFn::log1p, 1, true)
RACCEL_UNARY(reciprocal, TensorFn::reciprocal, 1, true)
RACCEL_UNARY(rsqrt, TensorFn::rsqrt, 1, true)
RACCEL_UNARY(floor, TensorFn::floor, 1, false)
RACCEL_UNARY(ceil, TensorFn::ceil, 1, false)
RACCEL_UNARY(round, TensorFn::round, 1, false)
RACCEL_UNARY(trunc, TensorFn::trunc, 1, false)
RACCEL_UNARY(frac, TensorFn::frac, 1, false)
RACCEL_UNARY(sin, TensorFn::sin, 1, true)
RACCEL_UNARY(cos, TensorFn::cos, 1, true)
RACCEL_UNARY(tan, TensorFn::tan, 1, true)
RACCEL_UNARY(asin, TensorFn::asin, 1, true)
RACCEL_UNARY(acos, TensorFn::acos, 1, true)
RACCEL_UNARY(atan, TensorFn::atan, 1, true)
RACCEL_UNARY(sinh, TensorFn::sinh, 1, true)
RACCEL_UNARY(cosh, TensorFn::cosh, 1, true)
RACCEL_UNARY(erf, TensorFn::erf, 1, true)
RACCEL_UNARY(erfc, TensorFn::erfc, 1, true)
RACCEL_UNARY(expm1, TensorFn::expm1, 1, true)
RACCEL_UNARY(log2, TensorFn::log2, 1, true)
RACCEL_UNARY(log10, TensorFn::log10, 1, true)
RACCEL_UNARY(exp2, TensorFn::exp2, 1, true)
RACCEL_UNARY(lgamma, TensorFn::lgamma, 1, true)
RACCEL_UNARY(digamma, TensorFn::digamma, 1, true)
RACCEL_UNARY(erfinv, TensorFn::erfinv, 1, true)
#undef RACCEL_UNARY

// polygamma(n, x): psi's n-th derivative (the card's orders 0 to 64; PyTorch's error for a
// negative one from the host). digamma's backward is polygamma(1, x).
at::Tensor& polygamma_out(int64_t n, const at::Tensor& self, at::Tensor& out) {
  checkOutHolds(floatResult(self.scalar_type()), out);
  auto reference = [&](const at::Tensor& x) { return at::polygamma(n, x); };
  if (n < 0 || n > 64) return hostInto("aten::polygamma.out", out, reference(host(self)));
  return unaryOut(TensorFn::polygamma, "aten::polygamma.out", self, out, float(n), reference);
}
at::Tensor polygamma(int64_t n, const at::Tensor& self) {
  auto out = emptyOn({0}, floatResult(self.scalar_type()));
  return python::polygamma_out(n, self, out);
}
at::Tensor& polygamma_(at::Tensor& self, int64_t n) { return python::polygamma_out(n, self, self); }

// An i64 to a non-negative integer power, exactly (wrapping past i64 as PyTorch's CPU
// does): products of repeated squares.
at::Tensor integerPower(const at::Tensor& self, int64_t exponent) {
  at::Tensor result, square = self;
  for (; exponent > 0; exponent >>= 1) {
    if (exponent & 1) result = result.defined() ? result * square : square;
    if (exponent > 1) square = square * square;
  }
  return result.defined() ? result : at::ones_like(self);
}
at::Tensor& pow_out(const at::Tensor& self, const at::Scalar& exponent, at::Tensor& out) {
  checkOutHolds(at::result_type(self, exponent), out);
  if (bothI64(self, out) && exponent.isIntegral(false) && exponent.toLong() >= 0)
    return resultInto(out, integerPower(self, exponent.toLong()));
  return unaryOut(TensorFn::pow, "aten::pow.Tensor_Scalar", self, out, exponent.toFloat(),
                  [&](const at::Tensor& x) { return at::pow(x, exponent); });
}
at::Tensor pow(const at::Tensor& self, const at::Scalar& exponent) {
  // PyTorch's result type: an integer to an integer power stays an integer (on the host
  // here, as the kernels' powers are f32), to a fractional one it is the default float.
  auto out = emptyOn({0}, at::result_type(self, exponent));
  return python::pow_out(self, exponent, out);
}
at::Tensor& pow_(at::Tensor& self, const at::Scalar& exponent) { return python::pow_out(self, exponent, self); }
// A positive number to a tensor's powers (logaddexp2's gradient is 2 to a tensor; ldexp
// is 2 to integer powers): exp2 for 2, else exp of the powers times the number's log, an
// i64 or bool exponent of a float result made f32 on the card first; other bases on the
// host.
at::Tensor& pow_scalar_out(const at::Scalar& base, const at::Tensor& exponent0, at::Tensor& out) {
  const at::Tensor exponent = promoted(exponent0, out);
  const double b = base.toDouble();
  if (!supported({&exponent, &out}) || base.isComplex() || !(b > 0) || std::isinf(b))
    return hostInto("aten::pow.Scalar_out", out, at::pow(base, host(exponent)));
  if (b == 1) return resultInto(out, at::ones(exponent.sizes(), exponent.options()));
  return resultInto(out, b == 2 ? at::exp2(exponent) : at::exp(exponent * std::log(b)));
}
at::Tensor pow_scalar(const at::Scalar& base, const at::Tensor& exponent) {
  auto out = emptyOn({0}, at::result_type(base, exponent));
  return python::pow_scalar_out(base, exponent, out);
}

// A host float number as a one-element tensor on the card (written, no wait); any other
// tensor as it is.
at::Tensor onCardSide(const at::Tensor& t) { return isHostScalar(t) && t.is_floating_point() ? *deviceNumber(t, at::kFloat) : t; }
// An operand of a float op whose output is `out`: a host fraction written to the card, and
// an i64 or bool operand promoted to out's f32.
at::Tensor cardOperand(const at::Tensor& t, const at::Tensor& out) { return promoted(onCardSide(t), out); }
// out = fn(a, b) over their broadcast shape (either a host number), or the host's
// `reference` counted.
template <class Host>
at::Tensor& binaryOut(TensorFn fn, const char* name, const at::Tensor& a0, const at::Tensor& b0, at::Tensor& out,
                      Host reference, float alpha = 1, float beta = 0) {
  if (reducedFloats({&a0, &b0, &out}))
    return orHostInto(name, out, {&a0, &b0, &out}, [&](auto in) { return reference(in(a0), in(b0)); });
  const at::Tensor a = cardOperand(a0, out), b = cardOperand(b0, out);
  if (!supported({&a, &b, &out})) return hostInto(name, out, reference(host(a), host(b)));
  resizeBroadcast(out, broadcastShape(a, b), {&a, &b});
  elementwise(fn, out, &a, &b, alpha, beta);
  return out;
}

// The divisor of an exact i64 division (//, %, fmod) as a device operand, or nothing
// (the op then runs otherwise): a host integer, or an i64 tensor on the device. A zero
// divisor raises PyTorch's ZeroDivisionError: a host number's at once, a tensor's by its
// known bounds, else by reading whether it holds a 0 (one wait).
c10::optional<at::Tensor> integerDivisor(const at::Tensor& a, const at::Tensor& b, const at::Tensor& out) {
  if (!bothI64(a, out)) return c10::nullopt;
  if (isHostScalar(b) && !b.is_floating_point()) {
    TORCH_CHECK(b.item<int64_t>() != 0, "ZeroDivisionError");
    return deviceNumber(b, at::kLong);
  }
  if (!typed(b) || b.scalar_type() != at::kLong) return c10::nullopt;
  TORCH_CHECK(knownNonzero(b) || !at::eq(b, 0).any().item<bool>(), "ZeroDivisionError");
  return b;
}
// fn (div: the floor quotient; fmod: the truncated remainder) of i64 a over a divisor
// integerDivisor() gave.
at::Tensor integerDivision(TensorFn fn, const at::Tensor& a, const at::Tensor& divisor) {
  auto out = emptyOn(broadcastShape(a, divisor), at::kLong);
  elementwise(fn, out, &a, &divisor);
  return out;
}
// Where fmod's remainder (mod, of a over b) has the other sign than the divisor: where
// flooring differs from truncating.
at::Tensor signsDiffer(const at::Tensor& mod, const at::Tensor& b) { return (mod != 0).logical_and((b < 0).logical_xor(mod < 0)); }

// The exact i64 forms of two-input maps: maximum and minimum (a comparison and a select:
// the card's own are f32 functions) and fmod. False: not i64 on the device.
bool integerPair(TensorFn fn, const at::Tensor& a, const at::Tensor& b, at::Tensor& out) {
  if (fn == TensorFn::fmod) {
    auto divisor = integerDivisor(a, b, out);
    if (divisor) resultInto(out, integerDivision(TensorFn::fmod, a, *divisor));
    return divisor.has_value();
  }
  if ((fn != TensorFn::maximum && fn != TensorFn::minimum) || !bothI64(a, out) || !bothI64(b, out)) return false;
  resultInto(out, at::where(fn == TensorFn::maximum ? at::ge(a, b) : at::le(a, b), a, b));
  return true;
}

#define RACCEL_BINARY(op, fn, name)                                                                            \
  at::Tensor& op##_out(const at::Tensor& a, const at::Tensor& b, at::Tensor& out) {                            \
    if (integerPair(fn, a, b, out)) return out;                                                            \
    return binaryOut(fn, name, a, b, out, [](const at::Tensor& x, const at::Tensor& y) { return at::op(x, y); }); \
  }                                                                                                            \
  at::Tensor op(const at::Tensor& a, const at::Tensor& b) {                                                    \
    auto out = emptyOn({0}, at::result_type(a, b));                                                            \
    return python::op##_out(a, b, out);                                                                        \
  }
RACCEL_BINARY(maximum, TensorFn::maximum, "aten::maximum")
RACCEL_BINARY(minimum, TensorFn::minimum, "aten::minimum")
RACCEL_BINARY(tanh_backward, TensorFn::tanhBackward, "aten::tanh_backward")
RACCEL_BINARY(sigmoid_backward, TensorFn::sigmoidBackward, "aten::sigmoid_backward")
RACCEL_BINARY(atan2, TensorFn::atan2, "aten::atan2.out")  // C's math of two f32 inputs
RACCEL_BINARY(hypot, TensorFn::hypot, "aten::hypot.out")
RACCEL_BINARY(copysign, TensorFn::copysign, "aten::copysign.out")
RACCEL_BINARY(fmod, TensorFn::fmod, "aten::fmod.Tensor_out")
#undef RACCEL_BINARY

// out = a / b (b may be a host number: a times its inverse). True division: integers
// divide as the default float type, and an integer out is refused, as PyTorch does.
at::Tensor& div_out(const at::Tensor& a, const at::Tensor& b, at::Tensor& out) {
  checkOutHolds(floatResult(out.scalar_type()), out);
  if (isHostScalar(b) && supported({&a, &out})) {
    at::native::resize_output(out, a.sizes());
    elementwise(TensorFn::affine, out, &a, nullptr, static_cast<float>(1.0 / b.item<double>()), 0);
    return out;
  }
  return binaryOut(TensorFn::div, "aten::div.out", a, b, out, [](const at::Tensor& x, const at::Tensor& y) { return at::div(x, y); });
}
at::Tensor div(const at::Tensor& a, const at::Tensor& b) {
  auto out = emptyOn({0}, floatResult(at::result_type(a, b)));
  return python::div_out(a, b, out);
}
at::Tensor& div_(at::Tensor& self, const at::Tensor& other) {
  checkInPlace(self, {&other});
  return python::div_out(self, other, self);
}

// remainder: fmod moved to the divisor's sign, as PyTorch's (Python's %); over f32, or
// exactly over i64.
at::Tensor& remainder_out(const at::Tensor& a0, const at::Tensor& b0, at::Tensor& out) {
  if (auto d = integerDivisor(a0, b0, out)) {
    auto mod = integerDivision(TensorFn::fmod, a0, *d);
    return resultInto(out, at::where(signsDiffer(mod, *d), mod + *d, mod));
  }
  if (reducedFloats({&a0, &b0, &out}))  // in f32 on the card, rounded once
    return orHostInto("aten::remainder.Tensor_out", out, {&a0, &b0, &out}, [&](auto in) { return at::remainder(in(a0), in(b0)); });
  const at::Tensor a = cardOperand(a0, out), b = cardOperand(b0, out);
  if (!supported({&a, &b, &out})) return hostInto("aten::remainder.Tensor_out", out, at::remainder(host(a), host(b)));
  auto mod = at::fmod(a, b);
  auto result = at::where(signsDiffer(mod, b), mod + b, mod);
  return resultInto(out, result);
}
// Division rounded down (floor) or toward zero (trunc), over f32, by PyTorch's CPU rules:
// floor from fmod, so that a / b's own rounding cannot cross an integer (div_floor).
at::Tensor floorDivided(const at::Tensor& a, const at::Tensor& b) {
  auto mod = at::fmod(a, b);
  auto div = (a - mod) / b;
  div = at::where(signsDiffer(mod, b), div - 1, div);
  auto floored = at::floor(div);
  floored = at::where(div - floored > 0.5, floored + 1, floored);
  auto quotient = a / b;
  auto result = at::where(div != 0, floored, at::copysign(at::zeros({}, quotient.options()), quotient));
  return at::where(b == 0, quotient, result);
}
// Division rounded down (floor) or toward zero (trunc): over f32 as above; exactly over
// i64, trunc as the floor of a less its truncated remainder (which divides exactly).
at::Tensor& div_out_mode(const at::Tensor& a0, const at::Tensor& b0, c10::optional<c10::string_view> mode, at::Tensor& out) {
  if (mode && (*mode == "floor" || *mode == "trunc"))
    if (auto d = integerDivisor(a0, b0, out)) {
      const auto dividend = *mode == "floor" ? a0 : a0 - integerDivision(TensorFn::fmod, a0, *d);
      return resultInto(out, integerDivision(TensorFn::div, dividend, *d));
    }
  const at::Tensor a = cardOperand(a0, out), b = cardOperand(b0, out);
  if (!mode) return python::div_out(a, b, out);
  if (!supported({&a, &b, &out})) return hostInto("aten::div.out_mode", out, at::div(host(a), host(b), mode));
  auto result = *mode == "trunc" ? at::trunc(a / b) : floorDivided(a, b);
  return resultInto(out, result);
}
at::Tensor& floor_divide_out(const at::Tensor& a, const at::Tensor& b, at::Tensor& out) {
  return python::div_out_mode(a, b, "floor", out);
}
at::Tensor floor_divide(const at::Tensor& a, const at::Tensor& b) {
  auto out = emptyOn({0}, at::result_type(a, b));
  return python::floor_divide_out(a, b, out);
}
at::Tensor& floor_divide_(at::Tensor& self, const at::Tensor& other) {
  checkInPlace(self, {&other});
  return python::floor_divide_out(self, other, self);
}

// Activations with parameters, and their backwards (grad, the forward's input).
float geluForm(c10::string_view approximate) {
  TORCH_CHECK(approximate == "none" || approximate == "tanh", "raccel: gelu approximate='", std::string(approximate),
              "' (none or tanh)");
  return approximate == "tanh" ? 1.0f : 0.0f;
}
at::Tensor& gelu_out(const at::Tensor& self, c10::string_view approximate, at::Tensor& out) {
  return unaryOut(TensorFn::gelu, "aten::gelu", self, out, geluForm(approximate),
                  [&](const at::Tensor& x) { return at::gelu(x, approximate); });
}
at::Tensor gelu(const at::Tensor& self, c10::string_view approximate) {
  auto out = emptyOn({0}, self.scalar_type());
  return python::gelu_out(self, approximate, out);
}
at::Tensor& gelu_(at::Tensor& self, c10::string_view approximate) { return python::gelu_out(self, approximate, self); }
at::Tensor& gelu_backward_out(const at::Tensor& grad, const at::Tensor& self, c10::string_view approximate, at::Tensor& out) {
  return binaryOut(TensorFn::geluBackward, "aten::gelu_backward", grad, self, out,
                   [&](const at::Tensor& g, const at::Tensor& x) { return at::gelu_backward(g, x, approximate); },
                   geluForm(approximate));
}
at::Tensor gelu_backward(const at::Tensor& grad, const at::Tensor& self, c10::string_view approximate) {
  auto out = emptyOn({0}, grad.scalar_type());
  return python::gelu_backward_out(grad, self, approximate, out);
}

// An activation without parameters and its backward, each one map of its own: op_out,
// op, op_ and op_backward_out, op_backward (the gradient, then the forward's input).
#define RACCEL_PLAIN_ACTIVATION(op, fn, backwardFn)                                                              \
  at::Tensor& op##_out(const at::Tensor& self, at::Tensor& out) {                                               \
    return unaryOut(fn, "aten::" #op, self, out, 1, [](const at::Tensor& x) { return at::op(x); });             \
  }                                                                                                             \
  at::Tensor op(const at::Tensor& self) {                                                                       \
    auto out = emptyOn({0}, self.scalar_type());                                                                \
    return python::op##_out(self, out);                                                                         \
  }                                                                                                             \
  at::Tensor& op##_(at::Tensor& self) { return python::op##_out(self, self); }                                  \
  at::Tensor& op##_backward_out(const at::Tensor& grad, const at::Tensor& self, at::Tensor& out) {              \
    return binaryOut(backwardFn, "aten::" #op "_backward", grad, self, out,                                     \
                     [](const at::Tensor& g, const at::Tensor& x) { return at::op##_backward(g, x); });         \
  }                                                                                                             \
  at::Tensor op##_backward(const at::Tensor& grad, const at::Tensor& self) {                                    \
    auto out = emptyOn({0}, grad.scalar_type());                                                                \
    return python::op##_backward_out(grad, self, out);                                                          \
  }
RACCEL_PLAIN_ACTIVATION(silu, TensorFn::silu, TensorFn::siluBackward)
RACCEL_PLAIN_ACTIVATION(hardswish, TensorFn::hardswish, TensorFn::hardswishBackward)
RACCEL_PLAIN_ACTIVATION(hardsigmoid, TensorFn::hardsigmoid, TensorFn::hardsigmoidBackward)
RACCEL_PLAIN_ACTIVATION(mish, TensorFn::mish, TensorFn::mishBackward)
#undef RACCEL_PLAIN_ACTIVATION

at::Tensor& leaky_relu_out(const at::Tensor& self, const at::Scalar& slope, at::Tensor& out) {
  return unaryOut(TensorFn::leakyRelu, "aten::leaky_relu", self, out, slope.toFloat(),
                  [&](const at::Tensor& x) { return at::leaky_relu(x, slope); });
}
at::Tensor leaky_relu(const at::Tensor& self, const at::Scalar& slope) {
  auto out = emptyOn({0}, self.scalar_type());
  return python::leaky_relu_out(self, slope, out);
}
at::Tensor& leaky_relu_(at::Tensor& self, const at::Scalar& slope) { return python::leaky_relu_out(self, slope, self); }
// (With a positive slope the result has its input's sign, so self_is_result changes nothing.)
at::Tensor& leaky_relu_backward_out(const at::Tensor& grad, const at::Tensor& self, const at::Scalar& slope, bool isResult,
                                    at::Tensor& out) {
  return binaryOut(TensorFn::leakyReluBackward, "aten::leaky_relu_backward", grad, self, out,
                   [&](const at::Tensor& g, const at::Tensor& x) { return at::leaky_relu_backward(g, x, slope, isResult); },
                   slope.toFloat());
}
at::Tensor leaky_relu_backward(const at::Tensor& grad, const at::Tensor& self, const at::Scalar& slope, bool isResult) {
  auto out = emptyOn({0}, grad.scalar_type());
  return python::leaky_relu_backward_out(grad, self, slope, isResult, out);
}

at::Tensor& softplus_out(const at::Tensor& self, const at::Scalar& beta, const at::Scalar& threshold, at::Tensor& out) {
  return unaryOut(TensorFn::softplus, "aten::softplus", self, out, beta.toFloat(),
                  [&](const at::Tensor& x) { return at::softplus(x, beta, threshold); }, threshold.toFloat());
}
at::Tensor softplus(const at::Tensor& self, const at::Scalar& beta, const at::Scalar& threshold) {
  auto out = emptyOn({0}, self.scalar_type());
  return python::softplus_out(self, beta, threshold, out);
}
at::Tensor& softplus_backward_out(const at::Tensor& grad, const at::Tensor& self, const at::Scalar& beta,
                                  const at::Scalar& threshold, at::Tensor& out) {
  return binaryOut(TensorFn::softplusBackward, "aten::softplus_backward", grad, self, out,
                   [&](const at::Tensor& g, const at::Tensor& x) { return at::softplus_backward(g, x, beta, threshold); },
                   beta.toFloat(), threshold.toFloat());
}
at::Tensor softplus_backward(const at::Tensor& grad, const at::Tensor& self, const at::Scalar& beta, const at::Scalar& threshold) {
  auto out = emptyOn({0}, grad.scalar_type());
  return python::softplus_backward_out(grad, self, beta, threshold, out);
}

at::Tensor& hardtanh_out(const at::Tensor& self, const at::Scalar& low, const at::Scalar& high, at::Tensor& out) {
  return unaryOut(TensorFn::hardtanh, "aten::hardtanh", self, out, low.toFloat(),
                  [&](const at::Tensor& x) { return at::hardtanh(x, low, high); }, high.toFloat());
}
at::Tensor hardtanh(const at::Tensor& self, const at::Scalar& low, const at::Scalar& high) {
  auto out = emptyOn({0}, self.scalar_type());
  return python::hardtanh_out(self, low, high, out);
}
at::Tensor& hardtanh_(at::Tensor& self, const at::Scalar& low, const at::Scalar& high) {
  return python::hardtanh_out(self, low, high, self);
}
at::Tensor& hardtanh_backward_out(const at::Tensor& grad, const at::Tensor& self, const at::Scalar& low, const at::Scalar& high,
                                  at::Tensor& out) {
  return binaryOut(TensorFn::hardtanhBackward, "aten::hardtanh_backward", grad, self, out,
                   [&](const at::Tensor& g, const at::Tensor& x) { return at::hardtanh_backward(g, x, low, high); },
                   low.toFloat(), high.toFloat());
}
at::Tensor hardtanh_backward(const at::Tensor& grad, const at::Tensor& self, const at::Scalar& low, const at::Scalar& high) {
  auto out = emptyOn({0}, grad.scalar_type());
  return python::hardtanh_backward_out(grad, self, low, high, out);
}

// out = self + value * t1 (* or /) t2: Adam's and RMSprop's steps.
template <class Host>
at::Tensor& ternaryOut(TensorFn fn, const char* name, const at::Tensor& self, const at::Tensor& t1, const at::Tensor& t2,
                       const at::Scalar& value, at::Tensor& out, Host reference) {
  if (!supported({&self, &t1, &t2, &out}))
    return orHostInto(name, out, {&self, &t1, &t2, &out}, [&](auto in) { return reference(in(self), in(t1), in(t2)); });
  resizeBroadcast(out, at::infer_size(self.sizes(), broadcastShape(t1, t2)), {&self, &t1, &t2});
  elementwise(fn, out, &self, &t1, value.toFloat(), 0, &t2);
  return out;
}

#define RACCEL_TERNARY(op, fn)                                                                                         \
  at::Tensor& op##_out(const at::Tensor& self, const at::Tensor& t1, const at::Tensor& t2, const at::Scalar& value,   \
                       at::Tensor& out) {                                                                            \
    return ternaryOut(fn, "aten::" #op, self, t1, t2, value, out,                                                    \
                      [&](const at::Tensor& x, const at::Tensor& y, const at::Tensor& z) { return at::op(x, y, z, value); }); \
  }                                                                                                                  \
  at::Tensor op(const at::Tensor& self, const at::Tensor& t1, const at::Tensor& t2, const at::Scalar& value) {        \
    auto out = emptyOn({0}, self.scalar_type());                                                                     \
    return python::op##_out(self, t1, t2, value, out);                                                               \
  }                                                                                                                  \
  at::Tensor& op##_(at::Tensor& self, const at::Tensor& t1, const at::Tensor& t2, const at::Scalar& value) {         \
    return python::op##_out(self, t1, t2, value, self);                                                              \
  }
RACCEL_TERNARY(addcmul, TensorFn::addcmul)
RACCEL_TERNARY(addcdiv, TensorFn::addcdiv)
#undef RACCEL_TERNARY

// ---- Clamps, interpolation, ELU ---------------------------------------------------------

// i64 clamped by integers, exactly: a comparison and a select for each bound given (low
// first, so that a low above high gives high, as PyTorch's). False: not i64 and integers.
bool integerClamp(const at::Tensor& self, const c10::optional<at::Scalar>& low, const c10::optional<at::Scalar>& high,
                  at::Tensor& out) {
  const bool integers = (!low || low->isIntegral(false)) && (!high || high->isIntegral(false)) && (low || high);
  if (!integers || !bothI64(self, out)) return false;
  auto result = self;
  if (low) result = at::where(at::lt(result, *low), at::scalar_tensor(*low, at::kLong), result);
  if (high) result = at::where(at::gt(result, *high), at::scalar_tensor(*high, at::kLong), result);
  resultInto(out, result);
  return true;
}
// PyTorch's type of a clamp: i64 clamped by a fraction is f32.
at::ScalarType clampType(const at::Tensor& self, const c10::optional<at::Scalar>& low, const c10::optional<at::Scalar>& high) {
  auto type = self.scalar_type();
  for (const auto* bound : {&low, &high})
    if (*bound) type = at::promote_types(type, at::result_type(self, **bound));
  return type;
}
at::Tensor& clamp_out(const at::Tensor& self, const c10::optional<at::Scalar>& low, const c10::optional<at::Scalar>& high,
                      at::Tensor& out) {
  const auto type = clampType(self, low, high);
  TORCH_CHECK(at::canCast(type, out.scalar_type()), "result type ", type, " can't be cast to the desired output type ",
              out.scalar_type());
  if (integerClamp(self, low, high, out)) return out;
  return unaryOut(TensorFn::clamp, "aten::clamp", self, out, low ? low->toFloat() : -INFINITY,
                  [&](const at::Tensor& x) { return at::clamp(x, low, high); }, high ? high->toFloat() : INFINITY);
}
at::Tensor clamp(const at::Tensor& self, const c10::optional<at::Scalar>& low, const c10::optional<at::Scalar>& high) {
  auto out = emptyOn({0}, clampType(self, low, high));
  return python::clamp_out(self, low, high, out);
}
at::Tensor& clamp_(at::Tensor& self, const c10::optional<at::Scalar>& low, const c10::optional<at::Scalar>& high) {
  return python::clamp_out(self, low, high, self);
}
at::Tensor& clamp_min_out(const at::Tensor& self, const at::Scalar& low, at::Tensor& out) {
  return python::clamp_out(self, low, c10::nullopt, out);
}
at::Tensor clamp_min(const at::Tensor& self, const at::Scalar& low) { return python::clamp(self, low, c10::nullopt); }
at::Tensor& clamp_min_(at::Tensor& self, const at::Scalar& low) { return python::clamp_out(self, low, c10::nullopt, self); }
at::Tensor& clamp_max_out(const at::Tensor& self, const at::Scalar& high, at::Tensor& out) {
  return python::clamp_out(self, c10::nullopt, high, out);
}
at::Tensor clamp_max(const at::Tensor& self, const at::Scalar& high) { return python::clamp(self, c10::nullopt, high); }
at::Tensor& clamp_max_(at::Tensor& self, const at::Scalar& high) { return python::clamp_out(self, c10::nullopt, high, self); }

// out = self + weight * (end - self)
at::Tensor& lerp_out(const at::Tensor& self, const at::Tensor& end, const at::Scalar& weight, at::Tensor& out) {
  return binaryOut(TensorFn::lerp, "aten::lerp.Scalar", self, end, out,
                   [&](const at::Tensor& x, const at::Tensor& y) { return at::lerp(x, y, weight); }, weight.toFloat());
}
at::Tensor lerp(const at::Tensor& self, const at::Tensor& end, const at::Scalar& weight) {
  auto out = emptyOn({0}, self.scalar_type());
  return python::lerp_out(self, end, weight, out);
}
at::Tensor& lerp_(at::Tensor& self, const at::Tensor& end, const at::Scalar& weight) {
  checkInPlace(self, {&end});
  return python::lerp_out(self, end, weight, self);
}

// clamp by tensors: maximum with the low bound, then minimum with the high one (a NaN on
// either side is NaN, and a low bound above the high one gives the high, as PyTorch's).
at::Tensor& clamp_Tensor_out(const at::Tensor& self, const c10::optional<at::Tensor>& low, const c10::optional<at::Tensor>& high,
                             at::Tensor& out) {
  if (!supported({&self, present(low), present(high), &out}) || (!present(low) && !present(high)))
    return orHostInto("aten::clamp.Tensor_out", out, {&self, present(low), present(high), &out}, [&](auto in) {
      return at::clamp(in(self), present(low) ? c10::optional<at::Tensor>(in(*low)) : c10::nullopt,
                       present(high) ? c10::optional<at::Tensor>(in(*high)) : c10::nullopt);
    });
  auto result = present(low) ? at::maximum(self, *low) : self;
  if (present(high)) result = at::minimum(result, *high);
  return resultInto(out, result);
}
// lerp by a tensor of weights, PyTorch's formula: from the nearer end (|w| < 0.5: start).
at::Tensor& lerp_Tensor_out(const at::Tensor& self, const at::Tensor& end, const at::Tensor& weight, at::Tensor& out) {
  if (!supported({&self, &end, &weight, &out}))
    return orHostInto("aten::lerp.Tensor_out", out, {&self, &end, &weight, &out},
                      [&](auto in) { return at::lerp(in(self), in(end), in(weight)); });
  auto span = end - self;
  auto result = at::where(weight.abs() < 0.5, self + weight * span, end - span * (1 - weight));
  return resultInto(out, result);
}

// ELU with PyTorch's three coefficients: the card's elu takes alpha and the input scale
// (celu's 1 / alpha), and the output scale (selu's) multiplies after it, forward and
// backward. The backward from the result (an in-place elu_ kept its output, not its
// input) is PyTorch's formula over the result: grad * input_scale * (out + alpha * scale)
// where out <= 0, else grad * scale.
at::Tensor& scaledBy(at::Tensor& out, const at::Scalar& scale) { return scale.toDouble() == 1 ? out : out.mul_(scale); }
at::Tensor& elu_out(const at::Tensor& self, const at::Scalar& alpha, const at::Scalar& scale, const at::Scalar& inputScale,
                    at::Tensor& out) {
  auto reference = [&](const at::Tensor& x) { return at::elu(x, alpha, scale, inputScale); };
  if (!supported({&self, &out}))
    return orHostInto("aten::elu", out, {&self, &out}, [&](auto in) { return reference(in(self)); });
  return scaledBy(unaryOut(TensorFn::elu, "aten::elu", self, out, alpha.toFloat(), reference, inputScale.toFloat()), scale);
}
at::Tensor elu(const at::Tensor& self, const at::Scalar& alpha, const at::Scalar& scale, const at::Scalar& inputScale) {
  auto out = emptyOn({0}, self.scalar_type());
  return python::elu_out(self, alpha, scale, inputScale, out);
}
at::Tensor& elu_(at::Tensor& self, const at::Scalar& alpha, const at::Scalar& scale, const at::Scalar& inputScale) {
  return python::elu_out(self, alpha, scale, inputScale, self);
}
at::Tensor& elu_backward_out(const at::Tensor& grad, const at::Scalar& alpha, const at::Scalar& scale,
                             const at::Scalar& inputScale, bool isResult, const at::Tensor& selfOrResult, at::Tensor& out) {
  auto reference = [&](const at::Tensor& g, const at::Tensor& x) {
    return at::elu_backward(g, alpha, scale, inputScale, isResult, x);
  };
  if (!supported({&grad, &selfOrResult, &out}))
    return orHostInto("aten::elu_backward", out, {&grad, &selfOrResult, &out},
                      [&](auto in) { return reference(in(grad), in(selfOrResult)); });
  if (isResult) {
    const double s = scale.toDouble(), negative = alpha.toDouble() * s;
    auto below = grad * (selfOrResult + negative) * inputScale;
    return resultInto(out, at::where(selfOrResult > 0, s == 1 ? grad : grad * s, below));
  }
  return scaledBy(binaryOut(TensorFn::eluBackward, "aten::elu_backward", grad, selfOrResult, out, reference, alpha.toFloat(),
                            inputScale.toFloat()),
                  scale);
}
at::Tensor elu_backward(const at::Tensor& grad, const at::Scalar& alpha, const at::Scalar& scale, const at::Scalar& inputScale,
                        bool isResult, const at::Tensor& selfOrResult) {
  auto out = emptyOn({0}, grad.scalar_type());
  return python::elu_backward_out(grad, alpha, scale, inputScale, isResult, selfOrResult, out);
}

// ---- Gradients of a tensor times or over a number ---------------------------------------

// PyTorch 1.13 differentiates mul.Scalar and div.Scalar (what C++ code calls: cross
// entropy's label smoothing, for one) through the number made a float64 CPU tensor that
// is no wrapped number, so a 0-dim gradient times it comes out float64: on the card, a
// CPU fallback and a conversion back, a round trip each, every step. Here their gradient
// is the upstream one times (or over) the number itself, float32 as the input.
struct ByNumber : public torch::autograd::Function<ByNumber> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& self, const at::Scalar& number,
                            bool divide) {
    ctx->saved_data["number"] = number;
    ctx->saved_data["divide"] = divide;
    at::AutoDispatchBelowADInplaceOrView below;
    return divide ? at::div(self, number) : at::mul(self, number);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx, torch::autograd::variable_list grads) {
    const at::Scalar number = ctx->saved_data["number"].toScalar();
    const at::Tensor& g = grads[0];
    return {ctx->saved_data["divide"].toBool() ? g.div(number) : g.mul(number), at::Tensor(), at::Tensor()};
  }
};
at::Tensor mulNumber(const at::Tensor& self, const at::Scalar& number) { return ByNumber::apply(self, number, false); }
at::Tensor divNumber(const at::Tensor& self, const at::Scalar& number) { return ByNumber::apply(self, number, true); }

TORCH_LIBRARY_IMPL(aten, AutogradPrivateUse1, m) {
  m.impl("mul.Scalar", TORCH_FN(mulNumber));
  m.impl("div.Scalar", TORCH_FN(divNumber));
}

}  // namespace

namespace {

// C's math functions of one and two inputs, and signs.
void registerMathFunctions(torch::Library& m) {
  RACCEL_IMPL_OUT_NEW_INPLACE(sqrt)
  RACCEL_IMPL_OUT_NEW_INPLACE(rsqrt)
  RACCEL_IMPL_OUT_NEW_INPLACE(exp)
  RACCEL_IMPL_OUT_NEW_INPLACE(log)
  RACCEL_IMPL_OUT_NEW_INPLACE(log1p)
  RACCEL_IMPL_OUT_NEW_INPLACE(floor)
  RACCEL_IMPL_OUT_NEW_INPLACE(ceil)
  RACCEL_IMPL_OUT_NEW_INPLACE(round)
  RACCEL_IMPL_OUT_NEW_INPLACE(trunc)
  RACCEL_IMPL_OUT_NEW_INPLACE(frac)
  RACCEL_IMPL_OUT_NEW_INPLACE(sin)
  RACCEL_IMPL_OUT_NEW_INPLACE(cos)
  RACCEL_IMPL_OUT_NEW_INPLACE(tan)
  RACCEL_IMPL_OUT_NEW_INPLACE(asin)
  RACCEL_IMPL_OUT_NEW_INPLACE(acos)
  RACCEL_IMPL_OUT_NEW_INPLACE(atan)
  RACCEL_IMPL_OUT_NEW_INPLACE(sinh)
  RACCEL_IMPL_OUT_NEW_INPLACE(cosh)
  RACCEL_IMPL_OUT_NEW_INPLACE(erf)
  RACCEL_IMPL_OUT_NEW_INPLACE(erfc)
  RACCEL_IMPL_OUT_NEW_INPLACE(expm1)
  RACCEL_IMPL_OUT_NEW_INPLACE(log2)
  RACCEL_IMPL_OUT_NEW_INPLACE(log10)
  RACCEL_IMPL_OUT_NEW_INPLACE(exp2)
  RACCEL_IMPL_OUT_NEW_INPLACE(lgamma)
  RACCEL_IMPL_OUT_NEW_INPLACE(digamma)
  RACCEL_IMPL_OUT_NEW_INPLACE(erfinv)
  RACCEL_IMPL_OUT_NEW_INPLACE(reciprocal)
  RACCEL_IMPL_OUT_NEW_INPLACE(abs)
  RACCEL_IMPL_OUT_NEW_INPLACE(neg)
  RACCEL_IMPL_OUT_NEW_INPLACE(sign)
  RACCEL_IMPL_OUT_NEW_INPLACE(sgn)
  m.impl("atan2.out", TORCH_FN(atan2_out));
  m.impl("atan2", TORCH_FN(python::atan2));
  m.impl("hypot.out", TORCH_FN(hypot_out));
  m.impl("hypot", TORCH_FN(python::hypot));
  m.impl("copysign.out", TORCH_FN(copysign_out));
  m.impl("copysign.Tensor", TORCH_FN(python::copysign));
}

// Division and its rounding modes, powers, extrema, clamps and the optimizers' steps.
void registerDivisionAndSteps(torch::Library& m) {
  m.impl("div.out", TORCH_FN(div_out));
  m.impl("div.Tensor", TORCH_FN(python::div));
  m.impl("div_.Tensor", TORCH_FN(div_));
  m.impl("pow.Tensor_Scalar_out", TORCH_FN(pow_out));
  m.impl("pow.Tensor_Scalar", TORCH_FN(python::pow));
  m.impl("pow_.Scalar", TORCH_FN(pow_));
  m.impl("pow.Scalar_out", TORCH_FN(pow_scalar_out));
  m.impl("polygamma.out", TORCH_FN(polygamma_out));
  m.impl("polygamma", TORCH_FN(python::polygamma));
  m.impl("polygamma_", TORCH_FN(python::polygamma_));
  m.impl("pow.Scalar", TORCH_FN(pow_scalar));
  m.impl("maximum.out", TORCH_FN(maximum_out));
  m.impl("maximum", TORCH_FN(python::maximum));
  m.impl("minimum.out", TORCH_FN(minimum_out));
  m.impl("minimum", TORCH_FN(python::minimum));
  m.impl("lerp.Scalar_out", TORCH_FN(lerp_out));
  m.impl("lerp.Scalar", TORCH_FN(python::lerp));
  m.impl("lerp_.Scalar", TORCH_FN(lerp_));
  RACCEL_IMPL_OUT_NEW_INPLACE(addcmul)
  RACCEL_IMPL_OUT_NEW_INPLACE(addcdiv)
  RACCEL_IMPL_OUT_NEW_INPLACE(clamp)
  RACCEL_IMPL_OUT_NEW_INPLACE(clamp_min)
  RACCEL_IMPL_OUT_NEW_INPLACE(clamp_max)
  m.impl("clamp.Tensor_out", TORCH_FN(clamp_Tensor_out));
  m.impl("lerp.Tensor_out", TORCH_FN(lerp_Tensor_out));
  m.impl("fmod.Tensor_out", TORCH_FN(fmod_out));
  m.impl("fmod.Tensor", TORCH_FN(python::fmod));
  m.impl("remainder.Tensor_out", TORCH_FN(remainder_out));
  m.impl("div.out_mode", TORCH_FN(div_out_mode));
  m.impl("floor_divide.out", TORCH_FN(floor_divide_out));
  m.impl("floor_divide", TORCH_FN(python::floor_divide));
  m.impl("floor_divide_.Tensor", TORCH_FN(floor_divide_));
}

// Activations, each with its backward.
void registerActivations(torch::Library& m) {
  m.impl("softplus.out", TORCH_FN(softplus_out));
  m.impl("softplus", TORCH_FN(python::softplus));
  RACCEL_IMPL_BACKWARD(softplus)
  RACCEL_IMPL_OUT_NEW_INPLACE(gelu)
  RACCEL_IMPL_BACKWARD(gelu)
  RACCEL_IMPL_OUT_NEW_INPLACE(silu)
  RACCEL_IMPL_BACKWARD(silu)
  RACCEL_IMPL_OUT_NEW_INPLACE(hardswish)
  m.impl("hardswish_backward.out", TORCH_FN(hardswish_backward_out));
  m.impl("hardswish_backward", TORCH_FN(python::hardswish_backward));
  RACCEL_IMPL_OUT_NEW_INPLACE(hardsigmoid)
  RACCEL_IMPL_BACKWARD(hardsigmoid)
  RACCEL_IMPL_OUT_NEW_INPLACE(mish)
  m.impl("mish_backward", TORCH_FN(python::mish_backward));  // (no out overload)
  RACCEL_IMPL_OUT_NEW_INPLACE(leaky_relu)
  RACCEL_IMPL_BACKWARD(leaky_relu)
  RACCEL_IMPL_OUT_NEW_INPLACE(hardtanh)
  RACCEL_IMPL_BACKWARD(hardtanh)
  RACCEL_IMPL_OUT_NEW_INPLACE(tanh)
  RACCEL_IMPL_BACKWARD(tanh)
  RACCEL_IMPL_OUT_NEW_INPLACE(sigmoid)
  RACCEL_IMPL_BACKWARD(sigmoid)
  RACCEL_IMPL_OUT_NEW_INPLACE(elu)
  RACCEL_IMPL_BACKWARD(elu)
}

}  // namespace

void registerElementwise(torch::Library& m) {
  registerMathFunctions(m);
  registerDivisionAndSteps(m);
  registerActivations(m);
}

}  // namespace raccel::python
