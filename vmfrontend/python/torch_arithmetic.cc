// The torch device's arithmetic: add, sub and mul (exact over i64 where PyTorch is), sums
// and means, matmuls (mm, addmm, bmm, baddbmm, addmv, dot), trace, diag and ReLU.
#include "vmfrontend/python/torch_device.h"

namespace raccel::python {

// ---- Compute ----------------------------------------------------------------------------

std::vector<int64_t> broadcastShape(const at::Tensor& a, const at::Tensor& b) { return at::infer_size(a.sizes(), b.sizes()); }
namespace {
void refuseShape(const at::Tensor& out, c10::IntArrayRef shape) {
  TORCH_CHECK(false, "output with shape ", out.sizes(), " doesn't match the broadcast shape ", shape);
}
}  // namespace
void resizeBroadcast(const at::Tensor& out, c10::IntArrayRef shape, std::initializer_list<const at::Tensor*> inputs) {
  if (!out.sizes().equals(shape))
    for (const at::Tensor* t : inputs)
      if (t && t->defined() && out.is_alias_of(*t)) refuseShape(out, shape);
  at::native::resize_output(out, shape);
}
void checkInPlace(const at::Tensor& self, std::initializer_list<const at::Tensor*> operands) {
  std::vector<int64_t> shape = self.sizes().vec();
  for (const at::Tensor* t : operands)
    if (t && t->defined()) shape = at::infer_size(shape, t->sizes());
  if (!self.sizes().equals(shape)) refuseShape(self, shape);
}

at::Tensor promoted(const at::Tensor& x, const at::Tensor& out) {
  // An i64, bool or int32 side made f32 (PyTorch computes in f32 there: f64, f16 and bf16
  // sides it computes in their own type, or in f64, and are left to the host).
  const auto t = x.scalar_type();
  if (!isF32(out) || !stored(x) || (t != at::kLong && t != at::kBool && t != at::kInt)) return x;
  auto f = emptyOn(x.sizes());
  elementwise(TensorFn::copy, f, &x, nullptr);
  return f;
}

c10::optional<at::Tensor> deviceNumber(const at::Tensor& number, at::ScalarType dtype) {
  if (!at::isFloatingType(dtype) && number.is_floating_point()) return c10::nullopt;
  auto t = emptyOn({}, dtype);
  writeFrom(number.to(dtype).contiguous(), t);
  return t;
}
c10::optional<at::Tensor> integerSide(const at::Tensor& a, const at::Tensor& b, const at::Tensor& out, double alpha) {
  if (!typed(out) || !isIntegral(out) || !typed(a) || !isIntegral(a) || alpha != std::trunc(alpha) || std::fabs(alpha) > 16777216)
    return c10::nullopt;
  if (isHostScalar(b)) return deviceNumber(b, at::kLong);
  if (typed(b) && isIntegral(b)) return b;
  return c10::nullopt;
}

namespace {

// out = a + alpha * b (either may be a host number).
at::Tensor& add_out(const at::Tensor& a0, const at::Tensor& b0, const at::Scalar& alpha, at::Tensor& out) {
  const at::Tensor a = promoted(a0, out), b = promoted(b0, out);
  if (isHostScalar(b) && supported({&a, &out})) {
    at::native::resize_output(out, a.sizes());
    elementwise(TensorFn::affine, out, &a, nullptr, 1, static_cast<float>(alpha.toDouble() * b.item<double>()));
  } else if (isHostScalar(a) && supported({&b, &out})) {
    at::native::resize_output(out, b.sizes());
    elementwise(TensorFn::affine, out, &b, nullptr, alpha.toFloat(), a.item<float>());
  } else if (supported({&a, &b, &out})) {
    resizeBroadcast(out, broadcastShape(a, b), {&a, &b});
    elementwise(TensorFn::add, out, &a, &b, alpha.toFloat());
  } else if (auto y = integerSide(a, b, out, alpha.toDouble())) {
    resizeBroadcast(out, broadcastShape(a, *y), {&a, &*y});
    elementwise(TensorFn::add, out, &a, &*y, alpha.toFloat());
  } else if (auto x = isHostScalar(a) ? integerSide(b, a, out, alpha.toDouble()) : c10::nullopt) {  // a number first
    at::native::resize_output(out, b.sizes());
    elementwise(TensorFn::add, out, &*x, &b, alpha.toFloat());
  } else {
    return orHostInto("aten::add.out", out, {&a, &b, &out},
                      [&](auto in) { return at::add(in(a), in(b), roundedTo(alpha, out.scalar_type())); });
  }
  return out;
}
at::Tensor add(const at::Tensor& a, const at::Tensor& b, const at::Scalar& alpha) {
  auto out = emptyOn({0}, at::result_type(a, b));
  return python::add_out(a, b, alpha, out);
}
at::Tensor& add_(at::Tensor& self, const at::Tensor& other, const at::Scalar& alpha) {
  checkInPlace(self, {&other});
  return python::add_out(self, other, alpha, self);
}

// out = a - alpha * b: add with -alpha (over f32, either side a host number, as in
// `1 - x`; or over i64 exactly; PyTorch refuses a bool side, on the host).
at::Tensor& sub_out(const at::Tensor& a, const at::Tensor& b, const at::Scalar& alpha, at::Tensor& out) {
  const bool integers = (bothI64(a, out) || (isHostScalar(a) && bothI64(b, out))) && b.scalar_type() != at::kBool;
  const bool floats = supported({&a, &out}) || (isHostScalar(a) && typed(b) && supported({&b, &out}));
  if (!(floats || integers) || !(typed(b) || isHostScalar(b)))
    return orHostInto("aten::sub.out", out, {&a, &b, &out},
                      [&](auto in) { return at::sub(in(a), in(b), roundedTo(alpha, out.scalar_type())); });
  return python::add_out(a, b, -alpha.toDouble(), out);
}
at::Tensor sub(const at::Tensor& a, const at::Tensor& b, const at::Scalar& alpha) {
  auto out = emptyOn({0}, at::result_type(a, b));
  return python::sub_out(a, b, alpha, out);
}
at::Tensor& sub_(at::Tensor& self, const at::Tensor& other, const at::Scalar& alpha) {
  checkInPlace(self, {&other});
  return python::sub_out(self, other, alpha, self);
}

// out = a * b (either may be a host number).
at::Tensor& mul_out(const at::Tensor& a0, const at::Tensor& b0, at::Tensor& out) {
  const at::Tensor a = promoted(a0, out), b = promoted(b0, out);
  if (isHostScalar(b) && supported({&a, &out})) {
    at::native::resize_output(out, a.sizes());
    elementwise(TensorFn::affine, out, &a, nullptr, b.item<float>(), 0);
  } else if (isHostScalar(a) && supported({&b, &out})) {
    at::native::resize_output(out, b.sizes());
    elementwise(TensorFn::affine, out, &b, nullptr, a.item<float>(), 0);
  } else if (supported({&a, &b, &out})) {
    resizeBroadcast(out, broadcastShape(a, b), {&a, &b});
    elementwise(TensorFn::mul, out, &a, &b);
  } else if (auto y = integerSide(a, b, out, 1)) {
    resizeBroadcast(out, broadcastShape(a, *y), {&a, &*y});
    elementwise(TensorFn::mul, out, &a, &*y);
  } else {
    return orHostInto("aten::mul.out", out, {&a, &b, &out}, [&](auto in) { return at::mul(in(a), in(b)); });
  }
  return out;
}
at::Tensor mul(const at::Tensor& a, const at::Tensor& b) {
  auto out = emptyOn({0}, at::result_type(a, b));
  return python::mul_out(a, b, out);
}
at::Tensor& mul_(at::Tensor& self, const at::Tensor& other) {
  checkInPlace(self, {&other});
  return python::mul_out(self, other, self);
}

}  // namespace

uint32_t everyDim(int64_t rank) { return rank ? (1u << rank) - 1 : 1; }

void sumInto(const at::Tensor& out, const at::Tensor& self, uint32_t mask, bool keepdim, float alpha) {
  // out's strides over self's shape: 0 on the summed dimensions.
  std::vector<int64_t> outStrides;
  for (int64_t d = 0, o = 0; d < self.dim(); ++d) {
    if (mask >> d & 1) {
      outStrides.push_back(0);
      if (keepdim) ++o;
    } else {
      outStrides.push_back(out.stride(o++));
    }
  }
  Locked s;
  client::TensorOp op;
  op.fn = TensorFn::sum;
  op.shape = shapeOf(self.sizes());
  op.operands = {operand(out, outStrides), operand(self, self.strides())};
  op.reduceMask = mask;
  op.alpha = alpha;
  send(*s, op);
}

uint32_t maskOf(at::OptionalIntArrayRef dims, int64_t rank) {
  if (!dims || dims->empty()) return everyDim(rank);
  uint32_t mask = 0;
  for (auto d : *dims) mask |= 1u << c10::maybe_wrap_dim(d, std::max<int64_t>(rank, 1));
  return mask;
}
std::vector<int64_t> reducedShape(const at::Tensor& self, uint32_t mask, bool keepdim) {
  std::vector<int64_t> shape;
  for (int64_t d = 0; d < self.dim(); ++d) {
    if (!(mask >> d & 1)) shape.push_back(self.size(d));
    else if (keepdim) shape.push_back(1);
  }
  return shape;
}

namespace {

// A sum over f32 is f32; over i64 or bool, an exact i64 (PyTorch's integer sum).
bool sumOnDevice(const at::Tensor& self, c10::optional<at::ScalarType> dtype, const at::Tensor& out) {
  if (!typed(self)) return false;
  const at::ScalarType want = isIntegral(self) ? at::kLong : at::kFloat;
  return dtype.value_or(want) == want && (!out.defined() || (onDevice(out) && out.scalar_type() == want));
}

}  // namespace

at::Tensor& sum_out(const at::Tensor& self, at::OptionalIntArrayRef dims, bool keepdim, c10::optional<at::ScalarType> dtype,
                    at::Tensor& out) {
  if (!sumOnDevice(self, dtype, out)) {
    return orHostInto("aten::sum.IntList_out", out, {&self, &out}, [&](auto in) {
      const auto x = in(self);  // (on the card, in f32: out's conversion gives the type asked)
      const auto type = onDevice(x) ? c10::nullopt : dtype;
      return dims ? at::sum(x, *dims, keepdim, type) : at::sum(x, type);
    });
  }
  const uint32_t mask = maskOf(dims, self.dim());
  at::native::resize_output(out, reducedShape(self, mask, keepdim));
  if (self.numel() == 0) return out.zero_();
  sumInto(out, self, mask, keepdim, 1);
  return out;
}

namespace {

at::Tensor sum_dim(const at::Tensor& self, at::OptionalIntArrayRef dims, bool keepdim, c10::optional<at::ScalarType> dtype) {
  auto out = emptyOn({0}, dtype.value_or(at::isIntegralType(self.scalar_type(), /*includeBool=*/true) ? at::kLong : self.scalar_type()));
  return python::sum_out(self, dims, keepdim, dtype, out);
}
at::Tensor sum_all(const at::Tensor& self, c10::optional<at::ScalarType> dtype) { return python::sum_dim(self, c10::nullopt, false, dtype); }

}  // namespace

at::Tensor& mean_out(const at::Tensor& self, at::OptionalIntArrayRef dims, bool keepdim, c10::optional<at::ScalarType> dtype,
                     at::Tensor& out) {
  if (!supported({&self}) || (dtype && *dtype != at::kFloat) || (out.defined() && !isF32(out))) {
    return orHostInto("aten::mean.out", out, {&self, &out}, [&](auto in) {
      const auto x = in(self);
      const auto type = onDevice(x) ? c10::nullopt : dtype;
      return dims ? at::mean(x, *dims, keepdim, type) : at::mean(x, type);
    });
  }
  python::sum_out(self, dims, keepdim, dtype, out);
  const int64_t count = out.numel() == 0 ? 0 : self.numel() / out.numel();
  if (count == 0) return out.fill_(NAN);
  if (count != 1) elementwise(TensorFn::affine, out, &out, nullptr, 1.0f / static_cast<float>(count), 0);
  return out;
}

namespace {

at::Tensor mean_dim(const at::Tensor& self, at::OptionalIntArrayRef dims, bool keepdim, c10::optional<at::ScalarType> dtype) {
  auto out = emptyOn({0}, dtype.value_or(self.scalar_type()));
  return python::mean_out(self, dims, keepdim, dtype, out);
}
at::Tensor mean_all(const at::Tensor& self, c10::optional<at::ScalarType> dtype) { return python::mean_dim(self, c10::nullopt, false, dtype); }

// out = alpha * a b + beta * out (out not read when beta is 0); a: [m, k], b: [k, n].
void matmul(const at::Tensor& out, const at::Tensor& a, const at::Tensor& b, float alpha, float beta) {
  Locked s;
  client::TensorOp op;
  op.fn = TensorFn::matmul;
  op.shape = {static_cast<uint64_t>(a.size(0)), static_cast<uint64_t>(b.size(1)), static_cast<uint64_t>(a.size(1))};
  op.operands = {operand(out, {out.stride(0), out.stride(1), 0}), operand(a, {a.stride(0), 0, a.stride(1)}),
                 operand(b, {0, b.stride(1), b.stride(0)})};
  op.alpha = alpha, op.beta = beta;
  send(*s, op);
}
}  // namespace

bool sharesStorage(const at::Tensor& x, const at::Tensor& y) { return x.storage().is_alias_of(y.storage()); }

namespace {

at::Tensor& mm_out(const at::Tensor& a, const at::Tensor& b, at::Tensor& out) {
  TORCH_CHECK(a.dim() == 2 && b.dim() == 2 && a.size(1) == b.size(0), "raccel: mm of ", a.sizes(), " and ", b.sizes());
  if (!supported({&a, &b, &out})) {
    return orHostInto("aten::mm.out", out, {&a, &b, &out}, [&](auto in) { return at::mm(in(a), in(b)); });
  }
  at::native::resize_output(out, {a.size(0), b.size(1)});
  if (out.numel() == 0) return out;
  if (a.size(1) == 0) return out.zero_();
  if (sharesStorage(out, a) || sharesStorage(out, b)) {
    auto fresh = emptyOn(out.sizes());
    matmul(fresh, a, b, 1, 0);
    return out.copy_(fresh);
  }
  matmul(out, a, b, 1, 0);
  return out;
}
at::Tensor mm(const at::Tensor& a, const at::Tensor& b) {
  auto out = emptyOn({0}, a.scalar_type());  // PyTorch takes one dtype: an integer mm runs on the host
  return python::mm_out(a, b, out);
}

}  // namespace

void batchedMatmul(const at::Tensor& out, const at::Tensor& a, const at::Tensor& b, float alpha, float beta) {
  Locked s;
  client::TensorOp op;
  op.fn = TensorFn::matmul;
  op.shape = {static_cast<uint64_t>(a.size(0)), static_cast<uint64_t>(a.size(1)), static_cast<uint64_t>(b.size(2)),
              static_cast<uint64_t>(a.size(2))};
  op.operands = {operand(out, {out.stride(0), out.stride(1), out.stride(2), 0}),
                 operand(a, {a.stride(0), a.stride(1), 0, a.stride(2)}), operand(b, {b.stride(0), 0, b.stride(2), b.stride(1)})};
  op.alpha = alpha, op.beta = beta;
  send(*s, op);
}

namespace {

// out = beta * self + alpha * a b, batched (self broadcast to [B, m, n]); bmm is beta 0.
at::Tensor& baddbmm_out(const at::Tensor& self, const at::Tensor& a, const at::Tensor& b, const at::Scalar& beta,
                        const at::Scalar& alpha, at::Tensor& out) {
  TORCH_CHECK(a.dim() == 3 && b.dim() == 3 && a.size(0) == b.size(0) && a.size(2) == b.size(1), "raccel: bmm of ",
              a.sizes(), " and ", b.sizes());
  const float betaF = beta.toFloat();
  if (!supported({betaF != 0 ? &self : nullptr, &a, &b, &out}))
    return orHostInto("aten::baddbmm.out", out, {betaF != 0 ? &self : nullptr, &a, &b, &out}, [&](auto in) {
      return at::baddbmm(betaF != 0 ? in(self) : at::zeros({1}), in(a), in(b), beta, alpha);
    });
  at::native::resize_output(out, {a.size(0), a.size(1), b.size(2)});
  if (out.numel() == 0) return out;
  at::Tensor target = (sharesStorage(out, a) || sharesStorage(out, b)) ? emptyOn(out.sizes()) : out;
  if (betaF != 0) elementwise(TensorFn::affine, target, &self, nullptr, betaF, 0);
  if (a.size(2) > 0) batchedMatmul(target, a, b, alpha.toFloat(), betaF != 0 ? 1.0f : 0.0f);
  else if (betaF == 0) target.zero_();
  if (!target.is_same(out)) out.copy_(target);
  return out;
}
at::Tensor baddbmm(const at::Tensor& self, const at::Tensor& a, const at::Tensor& b, const at::Scalar& beta, const at::Scalar& alpha) {
  auto out = emptyOn({0}, a.scalar_type());
  return python::baddbmm_out(self, a, b, beta, alpha, out);
}
at::Tensor& baddbmm_(at::Tensor& self, const at::Tensor& a, const at::Tensor& b, const at::Scalar& beta, const at::Scalar& alpha) {
  return python::baddbmm_out(self, a, b, beta, alpha, self);
}
at::Tensor& bmm_out(const at::Tensor& a, const at::Tensor& b, at::Tensor& out) { return python::baddbmm_out(out, a, b, 0, 1, out); }
at::Tensor bmm(const at::Tensor& a, const at::Tensor& b) {
  auto out = emptyOn({0}, a.scalar_type());
  return python::bmm_out(a, b, out);
}

// out = beta * self + alpha * a b
at::Tensor& addmm_out(const at::Tensor& self, const at::Tensor& a, const at::Tensor& b, const at::Scalar& beta,
                      const at::Scalar& alpha, at::Tensor& out) {
  TORCH_CHECK(a.dim() == 2 && b.dim() == 2 && a.size(1) == b.size(0), "raccel: addmm of ", a.sizes(), " and ", b.sizes());
  if (!supported({&self, &a, &b, &out})) {
    return orHostInto("aten::addmm.out", out, {&self, &a, &b, &out},
                      [&](auto in) { return at::addmm(in(self), in(a), in(b), beta, alpha); });
  }
  at::native::resize_output(out, {a.size(0), b.size(1)});
  if (out.numel() == 0) return out;
  at::Tensor target = (sharesStorage(out, a) || sharesStorage(out, b)) ? emptyOn(out.sizes()) : out;
  const float betaF = beta.toFloat();
  if (betaF != 0) elementwise(TensorFn::affine, target, &self, nullptr, betaF, 0);
  if (a.size(1) > 0) matmul(target, a, b, alpha.toFloat(), betaF != 0 ? 1.0f : 0.0f);
  else if (betaF == 0) target.zero_();
  if (!target.is_same(out)) out.copy_(target);
  return out;
}
at::Tensor addmm(const at::Tensor& self, const at::Tensor& a, const at::Tensor& b, const at::Scalar& beta,
                 const at::Scalar& alpha) {
  auto out = emptyOn({0}, a.scalar_type());
  return python::addmm_out(self, a, b, beta, alpha, out);
}
at::Tensor& addmm_(at::Tensor& self, const at::Tensor& a, const at::Tensor& b, const at::Scalar& beta, const at::Scalar& alpha) {
  return python::addmm_out(self, a, b, beta, alpha, self);
}

// out = beta * self + alpha * mat vec (so mv, x @ v): addmm over vec as one column.
at::Tensor& addmv_out(const at::Tensor& self, const at::Tensor& mat, const at::Tensor& vec, const at::Scalar& beta,
                      const at::Scalar& alpha, at::Tensor& out) {
  TORCH_CHECK(mat.dim() == 2 && vec.dim() == 1 && mat.size(1) == vec.size(0), "raccel: addmv of ", mat.sizes(), " and ",
              vec.sizes());
  if (!supported({&self, &mat, &vec, &out}) || !at::is_expandable_to(self.sizes(), {mat.size(0)}))
    return orHostInto("aten::addmv.out", out, {&self, &mat, &vec, &out},
                      [&](auto in) { return at::addmv(in(self), in(mat), in(vec), beta, alpha); });
  at::native::resize_output(out, {mat.size(0)});
  auto column = out.view({mat.size(0), 1});
  python::addmm_out(self.expand({mat.size(0)}).unsqueeze(1), mat, vec.unsqueeze(1), beta, alpha, column);
  return out;
}
// trace: the diagonal's sum; diag: a matrix's k-th diagonal, or a vector set on one.
at::Tensor trace(const at::Tensor& self) {
  TORCH_CHECK(self.dim() == 2, "trace: expected a matrix, but got tensor with dim ", self.dim());
  if (!typed(self)) return onHost("aten::trace", [&] { return at::trace(host(self)).to(self.device()); });
  return self.diagonal().sum();
}
at::Tensor& diag_out(const at::Tensor& self, int64_t k, at::Tensor& out) {
  TORCH_CHECK(self.dim() == 1 || self.dim() == 2, "diag(): Supports 1D or 2D tensors. Got ", self.dim(), "D");
  if (!stored(self) || !onDevice(out) || out.scalar_type() != self.scalar_type())
    return hostInto("aten::diag.out", out, at::diag(host(self), k));
  if (self.dim() == 2) {
    auto d = self.diagonal(k);
    at::native::resize_output(out, d.sizes());
    return out.copy_(d);
  }
  const int64_t n = self.size(0) + std::abs(k);
  at::native::resize_output(out, {n, n});
  out.zero_();
  out.diagonal(k).copy_(self);
  return out;
}
// The dot product of two vectors: a 1 x n by n x 1 matmul.
at::Tensor dot(const at::Tensor& a, const at::Tensor& b) {
  TORCH_CHECK(a.dim() == 1 && b.dim() == 1, "1D tensors expected, but got ", a.dim(), "D and ", b.dim(), "D tensors");
  TORCH_CHECK(a.numel() == b.numel(), "inconsistent tensor size, expected tensor [", a.numel(), "] and src [", b.numel(),
              "] to have the same number of elements, but got ", a.numel(), " and ", b.numel(), " elements respectively");
  if (!supported({&a, &b}))
    return orOnHost("aten::dot", {&a, &b}, a.scalar_type(), a.device(), [&](auto in) { return at::dot(in(a), in(b)); });
  return python::mm(a.unsqueeze(0), b.unsqueeze(1)).reshape({});
}

at::Tensor relu(const at::Tensor& self) {
  if (!supported({&self}))
    return orOnHost("aten::relu", {&self}, self.scalar_type(), self.device(), [&](auto in) { return at::relu(in(self)); });
  auto out = emptyOn(self.sizes());
  elementwise(TensorFn::relu, out, &self, nullptr);
  return out;
}
at::Tensor& relu_(at::Tensor& self) {
  if (!supported({&self})) {
    return orHostInto("aten::relu_", self, {&self}, [&](auto in) { return at::relu(in(self)); });
  }
  elementwise(TensorFn::relu, self, &self, nullptr);
  return self;
}

at::Tensor& threshold_backward_out(const at::Tensor& grad, const at::Tensor& self, const at::Scalar& threshold,
                                   at::Tensor& gradInput) {
  if (!supported({&grad, &self, &gradInput})) {
    return orHostInto("aten::threshold_backward", gradInput, {&grad, &self, &gradInput},
                      [&](auto in) { return at::threshold_backward(in(grad), in(self), threshold); });
  }
  at::native::resize_output(gradInput, broadcastShape(grad, self));
  elementwise(TensorFn::thresholdBackward, gradInput, &grad, &self, threshold.toFloat());
  return gradInput;
}
at::Tensor threshold_backward(const at::Tensor& grad, const at::Tensor& self, const at::Scalar& threshold) {
  auto out = emptyOn({0}, grad.scalar_type());
  return python::threshold_backward_out(grad, self, threshold, out);
}

}  // namespace

// Arithmetic, sums and means, matmuls, ReLU.
void registerArithmetic(torch::Library& m) {
  m.impl("add.out", TORCH_FN(add_out));
  m.impl("add.Tensor", TORCH_FN(add));
  m.impl("add_.Tensor", TORCH_FN(add_));
  m.impl("mul.out", TORCH_FN(mul_out));
  m.impl("mul.Tensor", TORCH_FN(mul));
  m.impl("mul_.Tensor", TORCH_FN(mul_));
  m.impl("sub.out", TORCH_FN(sub_out));
  m.impl("sub.Tensor", TORCH_FN(python::sub));
  m.impl("sub_.Tensor", TORCH_FN(sub_));
  m.impl("mm.out", TORCH_FN(mm_out));
  m.impl("mm", TORCH_FN(mm));
  m.impl("addmm.out", TORCH_FN(addmm_out));
  m.impl("addmm", TORCH_FN(addmm));
  m.impl("addmm_", TORCH_FN(addmm_));
  m.impl("addmv.out", TORCH_FN(addmv_out));
  m.impl("dot", TORCH_FN(python::dot));
  m.impl("bmm.out", TORCH_FN(bmm_out));
  m.impl("bmm", TORCH_FN(python::bmm));
  RACCEL_IMPL_OUT_NEW_INPLACE(baddbmm)
  m.impl("relu", TORCH_FN(relu));
  m.impl("relu_", TORCH_FN(relu_));
  m.impl("threshold_backward.grad_input", TORCH_FN(threshold_backward_out));
  m.impl("threshold_backward", TORCH_FN(threshold_backward));
  m.impl("sum.IntList_out", TORCH_FN(sum_out));
  m.impl("sum.dim_IntList", TORCH_FN(sum_dim));
  m.impl("sum", TORCH_FN(sum_all));
  m.impl("mean.out", TORCH_FN(mean_out));
  m.impl("mean.dim", TORCH_FN(mean_dim));
  m.impl("mean", TORCH_FN(mean_all));
  m.impl("trace", TORCH_FN(python::trace));
  m.impl("diag.out", TORCH_FN(diag_out));
}

}  // namespace raccel::python
