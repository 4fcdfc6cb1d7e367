// The torch device's comparisons and selection: bool masks from f32 and exact i64
// compares, logical and bitwise ops, where, masked_fill, and all/any.
#include <ATen/ScalarOps.h>

#include "vmfrontend/python/torch_device.h"

namespace raccel::python {

namespace {

// ---- Comparisons and selection (bool masks; f32 and exact i64) --------------------------

// `x` as an operand of `dtype`: itself when on the device with that dtype, a written
// host number, or nothing (the op runs on the host).
c10::optional<at::Tensor> sideOf(const at::Tensor& x, at::ScalarType dtype) {
  if (isHostScalar(x)) return deviceNumber(x, dtype);
  if (stored(x) && x.scalar_type() == dtype) return x;
  return c10::nullopt;
}

template <class Host>
at::Tensor& compareOut(TensorFn fn, const char* name, const at::Tensor& a, const at::Tensor& b, at::Tensor& out, Host reference) {
  // An int32 side (linear algebra's infos and pivots): widened to i64 on the card, exactly.
  auto int32 = [](const at::Tensor& t) { return onDevice(t) && t.scalar_type() == at::kInt && t.dim() <= 6; };
  if (int32(a) || int32(b)) {
    auto wide = [&](const at::Tensor& t) { return int32(t) ? t.to(at::kLong) : t; };
    return compareOut(fn, name, wide(a), wide(b), out, reference);
  }
  // An i64 or bool side compared with a float one (a tensor, or a fraction): both as f32,
  // PyTorch's common type, converted on the card.
  const bool mixed = typed(a) && (typed(b) || isHostScalar(b)) && at::result_type(a, b) == at::kFloat &&
                     (a.scalar_type() != at::kFloat || (typed(b) && b.scalar_type() != at::kFloat));
  if (mixed) {
    auto asF32 = [](const at::Tensor& t) { return isHostScalar(t) || t.scalar_type() == at::kFloat ? t : t.to(at::kFloat); };
    return compareOut(fn, name, asF32(a), asF32(b), out, reference);
  }
  // f16 or bf16 sides: compared in f32, exactly, a number rounded to their type first (as
  // PyTorch's CPU compares).
  if (reducedFloats({&a, &b})) {
    const auto type = at::result_type(a, b);
    return compareOut(fn, name, widened(a, type), widened(b, type), out, reference);
  }
  c10::optional<at::Tensor> side;
  if (typed(a) && onDevice(out) && out.scalar_type() == at::kBool) side = sideOf(b, a.scalar_type());
  if (!side) return hostInto(name, out, reference(host(a), host(b)));
  resizeBroadcast(out, broadcastShape(a, *side), {&a, &*side});
  elementwise(fn, out, &a, &*side);
  return out;
}

#define RACCEL_COMPARE(op, fn)                                                                                       \
  at::Tensor& op##_out(const at::Tensor& a, const at::Tensor& b, at::Tensor& out) {                                   \
    return compareOut(fn, "aten::" #op, a, b, out, [](const at::Tensor& x, const at::Tensor& y) { return at::op(x, y); }); \
  }                                                                                                                   \
  at::Tensor op(const at::Tensor& a, const at::Tensor& b) {                                                           \
    auto out = emptyOn({0}, at::kBool);                                                                               \
    return python::op##_out(a, b, out);                                                                               \
  }                                                                                                                   \
  at::Tensor& op##_scalar_out(const at::Tensor& a, const at::Scalar& b, at::Tensor& out) {                            \
    return python::op##_out(a, at::native::wrapped_scalar_tensor(b), out);                                           \
  }                                                                                                                   \
  at::Tensor op##_scalar(const at::Tensor& a, const at::Scalar& b) {                                                  \
    return python::op(a, at::native::wrapped_scalar_tensor(b));                                                       \
  }
RACCEL_COMPARE(eq, TensorFn::eq)
RACCEL_COMPARE(ne, TensorFn::ne)
RACCEL_COMPARE(lt, TensorFn::lt)
RACCEL_COMPARE(le, TensorFn::le)
RACCEL_COMPARE(gt, TensorFn::gt)
RACCEL_COMPARE(ge, TensorFn::ge)
#undef RACCEL_COMPARE

// not x: x == 0
at::Tensor& logical_not_out(const at::Tensor& self, at::Tensor& out) {
  return compareOut(TensorFn::eq, "aten::logical_not", self, at::scalar_to_tensor(0), out,
                    [](const at::Tensor& x, const at::Tensor&) { return at::logical_not(x); });
}
at::Tensor logical_not(const at::Tensor& self) {
  auto out = emptyOn({0}, at::kBool);
  return python::logical_not_out(self, out);
}
// torch.equal: the same sizes and every element equal (NaN never is), compared on the
// card with one bool read back, not both tensors.
bool equal(const at::Tensor& self, const at::Tensor& other) {
  if (!typed(self) || !typed(other)) {
    countFallback("aten::equal");
    return at::equal(host(self), host(other));
  }
  return self.sizes() == other.sizes() && at::eq(self, other).all().item<bool>();
}
// How many elements are not 0 along dims: an exact i64 sum of their truths.
at::Tensor count_nonzero_dims(const at::Tensor& self, at::IntArrayRef dims) {
  if (!typed(self)) return onHost("aten::count_nonzero.dim_IntList", [&] { return at::count_nonzero(host(self), dims).to(self.device()); });
  return (self != 0).sum(dims.empty() ? at::OptionalIntArrayRef() : at::OptionalIntArrayRef(dims), false, at::kLong);
}
// NaN is the one value not equal to itself.
at::Tensor isnan(const at::Tensor& self) { return at::ne(self, self); }
// signbit: the sign bit set (-0.0 and negative NaNs too), as copysign(1, x) < 0; isposinf
// and isneginf: equal to that infinity.
at::Tensor& signbit_out(const at::Tensor& self, at::Tensor& out) {
  if (!isF32(self) || !typed(out) || out.scalar_type() != at::kBool) return hostInto("aten::signbit.out", out, at::signbit(host(self)));
  return resultInto(out, at::copysign(at::ones({}, self.options()), self) < 0);
}
at::Tensor& isposinf_out(const at::Tensor& self, at::Tensor& out) {
  if (!isF32(self) || !typed(out) || out.scalar_type() != at::kBool) return hostInto("aten::isposinf.out", out, at::isposinf(host(self)));
  return resultInto(out, self == INFINITY);
}
at::Tensor& isneginf_out(const at::Tensor& self, at::Tensor& out) {
  if (!isF32(self) || !typed(out) || out.scalar_type() != at::kBool) return hostInto("aten::isneginf.out", out, at::isneginf(host(self)));
  return resultInto(out, self == -INFINITY);
}

// heaviside over f32: 0 below zero (and for NaN), 1 above, `values` at zero.
at::Tensor& heaviside_out(const at::Tensor& self, const at::Tensor& values, at::Tensor& out) {
  if (!isF32(self) || !isF32(out) || !(isF32(values) || isHostScalar(values)))
    return hostInto("aten::heaviside.out", out, at::heaviside(host(self), host(values)));
  auto result = at::where(at::eq(self, 0), values.to(at::kFloat), at::gt(self, 0).to(at::kFloat));
  return resultInto(out, result);
}

// Over bools (or i64s: nonzero is true), as an exact integer mul (and) or add (or).
#define RACCEL_LOGICAL(op, fn)                                                                                        \
  at::Tensor& op##_out(const at::Tensor& a, const at::Tensor& b, at::Tensor& out) {                                   \
    auto y = integerSide(a, b, out, 1);                                                                               \
    if (!y || out.scalar_type() != at::kBool) return hostInto("aten::" #op, out, at::op(host(a), host(b)));          \
    resizeBroadcast(out, broadcastShape(a, *y), {&a, &*y});                                                           \
    elementwise(fn, out, &a, &*y);                                                                                    \
    return out;                                                                                                       \
  }                                                                                                                   \
  at::Tensor op(const at::Tensor& a, const at::Tensor& b) {                                                           \
    auto out = emptyOn({0}, at::kBool);                                                                               \
    return python::op##_out(a, b, out);                                                                               \
  }                                                                                                                   \
  at::Tensor& op##_(at::Tensor& self, const at::Tensor& other) {                                                     \
    checkInPlace(self, {&other});                                                                                     \
    return python::op##_out(self, other, self);                                                                       \
  }
RACCEL_LOGICAL(logical_and, TensorFn::mul)
RACCEL_LOGICAL(logical_or, TensorFn::add)
#undef RACCEL_LOGICAL

// Exclusive or, over bools (or i64s: nonzero is true): the two sides' truths unequal.
at::Tensor& logical_xor_out(const at::Tensor& a, const at::Tensor& b, at::Tensor& out) {
  if (!typed(a) || !typed(b) || isF32(a) || isF32(b) || out.scalar_type() != at::kBool)
    return hostInto("aten::logical_xor", out, at::logical_xor(host(a), host(b)));
  auto truth = [](const at::Tensor& t) { return t.scalar_type() == at::kBool ? t : t != 0; };
  resizeBroadcast(out, broadcastShape(a, b), {&a, &b});
  return at::ne_out(out, truth(a), truth(b));
}
// The bits of i64 (the card's bitwiseAnd, bitwiseOr, bitwiseXor, shiftLeft, shiftRight):
// b an i64 tensor or a host integer; of bools, the logical ops; anything else on the host.
c10::optional<at::Tensor> bitsSide(const at::Tensor& a, const at::Tensor& b, const at::Tensor& out) {
  if (!typed(a) || a.scalar_type() != at::kLong || !typed(out) || out.scalar_type() != at::kLong) return c10::nullopt;
  if (isHostScalar(b)) return b.is_floating_point() ? c10::nullopt : deviceNumber(b, at::kLong);
  if (typed(b) && b.scalar_type() == at::kLong) return b;
  return c10::nullopt;
}
template <class Host>
at::Tensor& bitsOut(TensorFn fn, const char* name, const at::Tensor& a, const at::Tensor& b, at::Tensor& out, Host reference) {
  auto side = bitsSide(a, b, out);
  if (!side) return hostInto(name, out, reference(host(a), host(b)));
  resizeBroadcast(out, broadcastShape(a, *side), {&a, &*side});
  elementwise(fn, out, &a, &*side);
  return out;
}
bool allBool(const at::Tensor& a, const at::Tensor& b, const at::Tensor& out) {
  return a.scalar_type() == at::kBool && b.scalar_type() == at::kBool && out.scalar_type() == at::kBool;
}
#define RACCEL_BITWISE(op, logical, fn)                                                                              \
  at::Tensor& op##_out(const at::Tensor& a, const at::Tensor& b, at::Tensor& out) {                                  \
    if (allBool(a, b, out)) return python::logical##_out(a, b, out);                                                 \
    return bitsOut(fn, "aten::" #op, a, b, out, [](const at::Tensor& x, const at::Tensor& y) { return at::op(x, y); }); \
  }
RACCEL_BITWISE(bitwise_and, logical_and, TensorFn::bitwiseAnd)
RACCEL_BITWISE(bitwise_or, logical_or, TensorFn::bitwiseOr)
RACCEL_BITWISE(bitwise_xor, logical_xor, TensorFn::bitwiseXor)
#undef RACCEL_BITWISE

// ~x: not x of a bool, x ^ -1 of an i64 (other dtypes' bitwise not runs on the host).
at::Tensor& bitwise_not_out(const at::Tensor& self, at::Tensor& out) {
  if (typed(self) && self.scalar_type() == at::kBool) return python::logical_not_out(self, out);
  return bitsOut(TensorFn::bitwiseXor, "aten::bitwise_not", self, at::scalar_to_tensor(int64_t{-1}), out,
                 [](const at::Tensor& x, const at::Tensor&) { return at::bitwise_not(x); });
}

// Shifts of i64 (x << n, x >> n: the count taken modulo 64, as PyTorch 1.13's CPU on x86).
#define RACCEL_SHIFT(op, pyop, fn)                                                                                   \
  at::Tensor& op##_out(const at::Tensor& a, const at::Tensor& b, at::Tensor& out) {                                  \
    return bitsOut(fn, "aten::" #op, a, b, out, [](const at::Tensor& x, const at::Tensor& y) { return at::op(x, y); }); \
  }                                                                                                                  \
  at::Tensor pyop##_tensor(const at::Tensor& a, const at::Tensor& b) {                                               \
    auto out = emptyOn({0}, at::result_type(a, b));                                                                 \
    return python::op##_out(a, b, out);                                                                              \
  }                                                                                                                  \
  at::Tensor pyop##_scalar(const at::Tensor& a, const at::Scalar& b) {                                               \
    return pyop##_tensor(a, at::native::wrapped_scalar_tensor(b));                                                   \
  }                                                                                                                  \
  at::Tensor& i##pyop##_tensor(at::Tensor& a, const at::Tensor& b) { return python::op##_out(a, b, a); }             \
  at::Tensor& i##pyop##_scalar(at::Tensor& a, const at::Scalar& b) {                                                 \
    return python::op##_out(a, at::native::wrapped_scalar_tensor(b), a);                                             \
  }
RACCEL_SHIFT(bitwise_left_shift, lshift, TensorFn::shiftLeft)
RACCEL_SHIFT(bitwise_right_shift, rshift, TensorFn::shiftRight)
#undef RACCEL_SHIFT

// gcd of i64 (one tensor function), and lcm from it as PyTorch's CPU: 0 where the gcd is
// 0, else |a / gcd * b| (wrapping past the i64 range). The division is the card's own (the
// gcd divides a exactly; by 0 it gives 0), with no divisor check to wait for.
at::Tensor& gcd_out(const at::Tensor& a, const at::Tensor& b, at::Tensor& out) {
  return bitsOut(TensorFn::gcd, "aten::gcd", a, b, out, [](const at::Tensor& x, const at::Tensor& y) { return at::gcd(x, y); });
}
at::Tensor& lcm_out(const at::Tensor& a, const at::Tensor& b, at::Tensor& out) {
  auto side = bitsSide(a, b, out);
  if (!side) return hostInto("aten::lcm", out, at::lcm(host(a), host(b)));
  auto g = at::gcd(a, *side);
  auto quotient = emptyOn(g.sizes(), at::kLong);
  elementwise(TensorFn::div, quotient, &a, &g);
  return resultInto(out, quotient.mul(*side).abs());
}

// out = condition ? self : other (either side may be a host number).
at::Tensor& where_out(const at::Tensor& condition, const at::Tensor& self, const at::Tensor& other, at::Tensor& out) {
  c10::optional<at::Tensor> x, y;
  const bool ok = typed(condition) && condition.scalar_type() == at::kBool && stored(out);
  if (ok) x = sideOf(self, out.scalar_type()), y = sideOf(other, out.scalar_type());
  if (!x || !y) return hostInto("aten::where.self", out, at::where(host(condition), host(self), host(other)));
  resizeBroadcast(out, at::infer_size(condition.sizes(), broadcastShape(*x, *y)), {&condition, &*x, &*y});
  elementwise(TensorFn::where, out, &condition, &*x, 0, 0, &*y);
  return out;
}
at::Tensor where(const at::Tensor& condition, const at::Tensor& self, const at::Tensor& other) {
  auto out = emptyOn({0}, at::result_type(self, other));
  return python::where_out(condition, self, other, out);
}

}  // namespace

at::Tensor& masked_fill_(at::Tensor& self, const at::Tensor& mask, const at::Tensor& value) {
  TORCH_CHECK(value.dim() == 0, "raccel: masked_fill_ takes a 0-dimensional value, not one of ", value.sizes());
  c10::optional<at::Tensor> v;
  if (typed(mask) && mask.scalar_type() == at::kBool && stored(self)) {
    // a number converted once, as PyTorch's masked_fill converts it: into self's type, with
    // its range checks (1e6 into f16 raises)
    v = sideOf(isHostScalar(value) ? at::scalar_tensor(value.item(), self.options().device(at::kCPU)) : value,
               self.scalar_type());
  }
  if (!v) return hostInto("aten::masked_fill_", self, host(self).masked_fill(host(mask), host(value)));
  elementwise(TensorFn::where, self, &mask, &*v, 0, 0, &self);
  return self;
}

namespace {

at::Tensor& masked_fill_scalar_(at::Tensor& self, const at::Tensor& mask, const at::Scalar& value) {
  return python::masked_fill_(self, mask, at::scalar_to_tensor(value));
}

// ---- all / any: counts of the true elements --------------------------------------------

// all: the count of nonzero elements over `mask` is every one; any: it is not 0.
at::Tensor& allOrAny(bool all, const at::Tensor& self, uint32_t mask, bool keepdim, at::Tensor& out) {
  std::vector<int64_t> dims;
  for (int64_t d = 0; d < std::max<int64_t>(self.dim(), 1); ++d)
    if (mask >> d & 1) dims.push_back(d);
  int64_t each = 1;  // elements per count
  for (int64_t d : dims) each *= self.dim() ? self.size(d) : 1;
  if (!typed(self) || !typed(out) || out.scalar_type() != at::kBool) {
    auto count = host(self).ne(0).sum(self.dim() ? at::IntArrayRef(dims) : at::IntArrayRef{}, keepdim);
    return hostInto(all ? "aten::all" : "aten::any", out, all ? count.eq(each) : count.gt(0));
  }
  at::Tensor nonzero = self.scalar_type() == at::kBool ? self : python::ne(self, at::scalar_to_tensor(0));
  auto count = emptyOn({0}, at::kLong);
  python::sum_out(nonzero, dims, keepdim, c10::nullopt, count);
  return all ? python::eq_out(count, at::scalar_to_tensor(each), out) : python::gt_out(count, at::scalar_to_tensor(0), out);
}
at::Tensor all(const at::Tensor& self) {
  auto out = emptyOn({0}, at::kBool);
  return allOrAny(true, self, everyDim(self.dim()), false, out);
}
at::Tensor any(const at::Tensor& self) {
  auto out = emptyOn({0}, at::kBool);
  return allOrAny(false, self, everyDim(self.dim()), false, out);
}
at::Tensor& all_dim_out(const at::Tensor& self, int64_t dim, bool keepdim, at::Tensor& out) {
  return allOrAny(true, self, 1u << c10::maybe_wrap_dim(dim, std::max<int64_t>(self.dim(), 1)), keepdim, out);
}
at::Tensor all_dim(const at::Tensor& self, int64_t dim, bool keepdim) {
  auto out = emptyOn({0}, at::kBool);
  return python::all_dim_out(self, dim, keepdim, out);
}
at::Tensor& any_dim_out(const at::Tensor& self, int64_t dim, bool keepdim, at::Tensor& out) {
  return allOrAny(false, self, 1u << c10::maybe_wrap_dim(dim, std::max<int64_t>(self.dim(), 1)), keepdim, out);
}
at::Tensor any_dim(const at::Tensor& self, int64_t dim, bool keepdim) {
  auto out = emptyOn({0}, at::kBool);
  return python::any_dim_out(self, dim, keepdim, out);
}

// isin: each element compared with every test element (at most 2^24 comparisons; NaN is
// in nothing), as PyTorch's CPU compares them.
at::Tensor& isin_out(const at::Tensor& elements, const at::Tensor& tests, bool assumeUnique, bool invert, at::Tensor& out) {
  const bool ok = typed(elements) && typed(tests) && elements.scalar_type() == tests.scalar_type() && typed(out) &&
                  out.scalar_type() == at::kBool && withinComposedElements(elements.numel(), tests.numel());
  if (!ok) return hostInto("aten::isin.Tensor_Tensor_out", out, at::isin(host(elements), host(tests), assumeUnique, invert));
  auto found = (elements.reshape({-1, 1}) == tests.reshape({1, -1})).any(1).view(elements.sizes());
  return resultInto(out, invert ? found.logical_not() : found);
}

}  // namespace

// Comparisons, selection and the boolean ops masks need.
void registerComparisons(torch::Library& m) {
  m.impl("isin.Tensor_Tensor_out", TORCH_FN(isin_out));
  m.impl("signbit.out", TORCH_FN(signbit_out));
  m.impl("isposinf.out", TORCH_FN(isposinf_out));
  m.impl("isneginf.out", TORCH_FN(isneginf_out));
  m.impl("all", TORCH_FN(python::all));
  m.impl("any", TORCH_FN(python::any));
  m.impl("all.out", TORCH_FN(all_dim_out));
  m.impl("all.dim", TORCH_FN(all_dim));
  m.impl("any.out", TORCH_FN(any_dim_out));
  m.impl("any.dim", TORCH_FN(any_dim));
#define RACCEL_IMPL_COMPARE(op)                                 \
  m.impl(#op ".Tensor_out", TORCH_FN(op##_out));                \
  m.impl(#op ".Tensor", TORCH_FN(python::op));                  \
  m.impl(#op ".Scalar_out", TORCH_FN(op##_scalar_out));         \
  m.impl(#op ".Scalar", TORCH_FN(op##_scalar));
  RACCEL_IMPL_COMPARE(eq)
  RACCEL_IMPL_COMPARE(ne)
  RACCEL_IMPL_COMPARE(lt)
  RACCEL_IMPL_COMPARE(le)
  RACCEL_IMPL_COMPARE(gt)
  RACCEL_IMPL_COMPARE(ge)
#undef RACCEL_IMPL_COMPARE
  m.impl("heaviside.out", TORCH_FN(heaviside_out));
  m.impl("where.self_out", TORCH_FN(where_out));
  m.impl("where.self", TORCH_FN(python::where));
  m.impl("masked_fill_.Scalar", TORCH_FN(masked_fill_scalar_));
  m.impl("masked_fill_.Tensor", TORCH_FN(masked_fill_));
  m.impl("logical_not.out", TORCH_FN(logical_not_out));
  m.impl("logical_not", TORCH_FN(python::logical_not));
  m.impl("isnan", TORCH_FN(python::isnan));
  m.impl("equal", TORCH_FN(python::equal));
  RACCEL_IMPL_OUT_NEW_INPLACE(logical_and)
  RACCEL_IMPL_OUT_NEW_INPLACE(logical_or)
  m.impl("bitwise_not.out", TORCH_FN(bitwise_not_out));
  m.impl("bitwise_and.Tensor_out", TORCH_FN(bitwise_and_out));
  m.impl("bitwise_or.Tensor_out", TORCH_FN(bitwise_or_out));
  m.impl("bitwise_xor.Tensor_out", TORCH_FN(bitwise_xor_out));
  m.impl("logical_xor.out", TORCH_FN(logical_xor_out));
  m.impl("bitwise_left_shift.Tensor_out", TORCH_FN(bitwise_left_shift_out));
  m.impl("bitwise_right_shift.Tensor_out", TORCH_FN(bitwise_right_shift_out));
  m.impl("gcd.out", TORCH_FN(gcd_out));
  m.impl("lcm.out", TORCH_FN(lcm_out));
  m.impl("__lshift__.Tensor", TORCH_FN(lshift_tensor));
  m.impl("__lshift__.Scalar", TORCH_FN(lshift_scalar));
  m.impl("__rshift__.Tensor", TORCH_FN(rshift_tensor));
  m.impl("__rshift__.Scalar", TORCH_FN(rshift_scalar));
  m.impl("__ilshift__.Tensor", TORCH_FN(ilshift_tensor));
  m.impl("__ilshift__.Scalar", TORCH_FN(ilshift_scalar));
  m.impl("__irshift__.Tensor", TORCH_FN(irshift_tensor));
  m.impl("__irshift__.Scalar", TORCH_FN(irshift_scalar));
  m.impl("count_nonzero.dim_IntList", TORCH_FN(count_nonzero_dims));
}

}  // namespace raccel::python
