// Ops the torch device composes of its other ops: GLU, log-sigmoid, nan_to_num, xlogy,
// xlog1py, entr, PReLU, flips and rolls, triu/tril, cumulative sums and products, reflection and
// replication padding, logaddexp, sinc, logit, fmin/fmax, renorm, the shrinks and threshold.
#include "vmfrontend/python/torch_device.h"

namespace raccel::python {

namespace {

// ---- GLU, PReLU, flips and cumulative sums, composed of the ops above --------------------

// glu: the first half of `dim` times the sigmoid of the second, as PyTorch's a * sigmoid(b).
bool cardGlu(const at::Tensor& self, int64_t dim) {
  return self.dim() > 0 && self.size(c10::maybe_wrap_dim(dim, self.dim())) % 2 == 0;  // else PyTorch's own error
}
std::pair<at::Tensor, at::Tensor> gluHalves(const at::Tensor& t, int64_t dim) {
  dim = c10::maybe_wrap_dim(dim, t.dim());
  const int64_t h = t.size(dim) / 2;
  return {t.narrow(dim, 0, h), t.narrow(dim, h, h)};
}
at::Tensor& glu_out(const at::Tensor& self, int64_t dim, at::Tensor& out) {
  if (!supported({&self, &out}) || !cardGlu(self, dim))
    return orHostInto("aten::glu", out, {&self, &out}, [&](auto in) { return at::glu(in(self), dim); });
  auto [a, b] = gluHalves(self, dim);
  at::native::resize_output(out, a.sizes());
  elementwise(TensorFn::sigmoid, out, &b, nullptr);
  elementwise(TensorFn::mul, out, &out, &a);
  return out;
}
at::Tensor glu(const at::Tensor& self, int64_t dim) {
  auto out = emptyOn({0}, self.scalar_type());
  return python::glu_out(self, dim, out);
}
// d/da = sigmoid(b), d/db = a sigmoid(b) (1 - sigmoid(b)), each times the gradient.
at::Tensor& glu_backward_out(const at::Tensor& grad, const at::Tensor& self, int64_t dim, at::Tensor& gradInput) {
  if (!supported({&grad, &self, &gradInput}) || !cardGlu(self, dim) || !grad.sizes().equals(gluHalves(self, dim).first.sizes()))
    return orHostInto("aten::glu_backward", gradInput, {&grad, &self, &gradInput},
                      [&](auto in) { return at::glu_backward(in(grad), in(self), dim); });
  auto [a, b] = gluHalves(self, dim);
  at::native::resize_output(gradInput, self.sizes());
  auto [ga, gb] = gluHalves(gradInput, dim);
  elementwise(TensorFn::sigmoid, ga, &b, nullptr);
  elementwise(TensorFn::mul, gb, &grad, &a);
  elementwise(TensorFn::sigmoidBackward, gb, &gb, &ga);
  elementwise(TensorFn::mul, ga, &ga, &grad);
  return gradInput;
}
at::Tensor glu_backward(const at::Tensor& grad, const at::Tensor& self, int64_t dim) {
  auto out = emptyOn({0}, grad.scalar_type());
  return python::glu_backward_out(grad, self, dim, out);
}

// log_sigmoid as PyTorch's CPU computes it: min(x, 0) - log1p(exp(-|x|)); its backward
// from x alone (the CPU's buffer, exp(-|x|), is made again: the forward keeps none).
std::tuple<at::Tensor, at::Tensor> log_sigmoid_forward(const at::Tensor& self) {
  if (reducedFloats({&self})) {  // in f32 on the card, rounded once (the buffer unused, as below)
    auto [out, buffer] = python::log_sigmoid_forward(widened(self, self.scalar_type()));
    return {out.to(self.scalar_type()), buffer};
  }
  if (!supported({&self})) {
    countFallback("aten::log_sigmoid_forward");
    auto [out, buffer] = at::log_sigmoid_forward(host(self));
    return {out.to(self.device()), buffer.to(self.device())};
  }
  auto out = at::minimum(self, at::zeros({}, self.options())) - at::log1p(at::exp(-at::abs(self)));
  return {out, emptyOn({0})};
}
at::Tensor log_sigmoid_backward(const at::Tensor& grad, const at::Tensor& self, const at::Tensor& buffer) {
  if (reducedFloats({&grad, &self}))  // in f32 on the card, rounded once
    return python::log_sigmoid_backward(widened(grad, grad.scalar_type()), widened(self, self.scalar_type()), buffer)
        .to(self.scalar_type());
  if (!supported({&grad, &self}))
    return onHost("aten::log_sigmoid_backward", [&] {
      return at::log_sigmoid_backward(host(grad), host(self), at::exp(-at::abs(host(self)))).to(self.device());
    });
  auto z = at::exp(-at::abs(self));
  auto share = z / (z + 1);
  return at::where(self < 0, 1 - share, share) * grad;
}

// nan_to_num: NaN, +inf and -inf replaced (by 0, f32's largest and lowest unless given).
at::Tensor& nan_to_num_out(const at::Tensor& self, c10::optional<double> nan, c10::optional<double> posinf,
                           c10::optional<double> neginf, at::Tensor& out) {
  if (!supported({&self, &out}))
    return hostInto("aten::nan_to_num.out", out, at::nan_to_num(host(self), nan, posinf, neginf));
  auto number = [&](double v) { return at::full({}, v, self.options()); };
  const double inf = std::numeric_limits<double>::infinity();
  auto result = at::where(at::isnan(self), number(nan.value_or(0.0)), self);
  result = at::where(self == inf, number(posinf.value_or(std::numeric_limits<float>::max())), result);
  result = at::where(self == -inf, number(neginf.value_or(std::numeric_limits<float>::lowest())), result);
  at::native::resize_output(out, self.sizes());
  return out.copy_(result);
}

// xlogy and xlog1py: self * log(other) or self * log1p(other), 0 where self is 0 and
// other is not NaN (the Kullback-Leibler divergence's x log x), NaN where other is.
at::Tensor& xlogInto(const char* name, const at::Tensor& self, const at::Tensor& other, at::Tensor& out, bool onePlus) {
  if (!supported({&self, &other, &out}))
    return orHostInto(name, out, {&self, &other, &out}, [&](auto in) {
      return onePlus ? at::special_xlog1py(in(self), in(other)) : at::xlogy(in(self), in(other));
    });
  auto zero = at::zeros({}, out.options());
  auto value = at::where(self == 0, zero, self * (onePlus ? at::log1p(other) : at::log(other)));
  auto result = at::where(at::isnan(other), at::full({}, NAN, out.options()), value);
  return resultInto(out, result);
}
at::Tensor& xlogy_out(const at::Tensor& self, const at::Tensor& other, at::Tensor& out) {
  return xlogInto("aten::xlogy.OutTensor", self, other, out, false);
}
at::Tensor& special_xlog1py_out(const at::Tensor& self, const at::Tensor& other, at::Tensor& out) {
  return xlogInto("aten::special_xlog1py.out", self, other, out, true);
}
// entr: -x log x for x > 0, 0 at 0, -inf below, NaN for NaN.
at::Tensor& special_entr_out(const at::Tensor& self, at::Tensor& out) {
  if (!supported({&self, &out}))
    return orHostInto("aten::special_entr.out", out, {&self, &out}, [&](auto in) { return at::special_entr(in(self)); });
  auto below = at::where(self == 0, at::zeros({}, out.options()), at::full({}, -INFINITY, out.options()));
  auto result = at::where(self > 0, -self * at::log(self), at::where(at::isnan(self), self, below));
  return resultInto(out, result);
}
at::Tensor xlogy(const at::Tensor& self, const at::Tensor& other) {
  auto out = emptyOn({0}, floatResult(at::result_type(self, other)));
  return python::xlogy_out(self, other, out);
}
at::Tensor& xlogy_(at::Tensor& self, const at::Tensor& other) {
  checkInPlace(self, {&other});
  return python::xlogy_out(self, other, self);
}

// prelu: x where x > 0, else weight * x, with one weight for all or one per channel (dim
// 1). Any other weight goes to the host, whose check gives PyTorch's error.
std::optional<at::Tensor> preluWeight(const at::Tensor& self, const at::Tensor& weight) {
  if (!supported({&self, &weight}) || weight.dim() > 1) return std::nullopt;
  if (weight.numel() == 1) return weight.reshape({});
  if (self.dim() < 2 || weight.numel() != self.size(1)) return std::nullopt;
  std::vector<int64_t> shape(self.dim(), 1);
  shape[1] = self.size(1);
  return weight.reshape(shape);
}
at::Tensor prelu(const at::Tensor& self, const at::Tensor& weight) {
  auto w = preluWeight(self, weight);
  if (!w)
    return orOnHost("aten::prelu", {&self, &weight}, self.scalar_type(), self.device(),
                    [&](auto in) { return at::prelu(in(self), in(weight)); });
  return at::where(self > 0, self, self * *w);
}
// The input's gradient: the gradient where x > 0, else weight times it; the weight's: x
// times the gradient where x <= 0, summed over all but the channel.
std::tuple<at::Tensor, at::Tensor> prelu_backward(const at::Tensor& grad, const at::Tensor& self, const at::Tensor& weight) {
  if (reducedFloats({&grad, &self, &weight})) {  // in f32 on the card, each gradient rounded once
    auto [gi, gw] = python::prelu_backward(widened(grad, grad.scalar_type()), widened(self, self.scalar_type()),
                                           widened(weight, weight.scalar_type()));
    return {gi.to(self.scalar_type()), gw.to(weight.scalar_type())};
  }
  auto w = preluWeight(self, weight);
  if (!w || !supported({&grad}) || !grad.sizes().equals(self.sizes()))
    return onHost("aten::prelu_backward", [&] {
      auto [gi, gw] = at::prelu_backward(host(grad), host(self), host(weight));
      return std::make_tuple(gi.to(self.device()), gw.to(self.device()));
    });
  auto positive = self > 0;
  auto gradInput = at::where(positive, grad, grad * *w);
  auto terms = (self * grad).masked_fill_(positive, 0);
  std::vector<int64_t> dims;
  for (int64_t d = 0; d < self.dim(); ++d)
    if (d != 1 || weight.numel() == 1) dims.push_back(d);
  return {gradInput, terms.sum(dims).reshape(weight.sizes())};
}

// flip: an index_select of the reversed positions along each flipped dimension.
at::Tensor flip(const at::Tensor& self, at::IntArrayRef dims) {
  if (!stored(self)) return onHost("aten::flip", [&] { return at::flip(host(self), dims).to(self.device()); });
  auto out = self;
  std::vector<bool> seen(std::max<int64_t>(self.dim(), 1), false);
  for (auto d0 : dims) {
    const int64_t d = c10::maybe_wrap_dim(d0, self.dim());
    TORCH_CHECK(!seen[d], "dim ", d, " appears multiple times in the list of dims");
    seen[d] = true;
    if (self.dim() == 0 || self.size(d) < 2) continue;
    auto reversed = at::arange(self.size(d) - 1, -1, -1, at::kLong).to(self.device());
    TrustedIndices inRange;
    out = at::index_select(out, d, reversed);
  }
  return out.is_same(self) ? self.clone() : out;
}

// roll: along each dimension, the last `shift` elements (mod its size) first: a cat of
// two narrowed views. With no dimensions, over the flattened tensor. (Its backward is
// PyTorch's formula: the gradient rolled back.)
at::Tensor roll(const at::Tensor& self, at::IntArrayRef shifts, at::IntArrayRef dims) {
  if (!stored(self) || (dims.empty() ? shifts.size() != 1 : shifts.size() != dims.size()))
    return onHost("aten::roll", [&] { return at::roll(host(self), shifts, dims).to(self.device()); });
  if (dims.empty()) return python::roll(self.reshape({-1}), shifts, {0}).view(self.sizes());
  at::Tensor out = self;
  for (size_t k = 0; k < dims.size(); ++k) {
    const int64_t d = c10::maybe_wrap_dim(dims[k], self.dim()), n = self.size(d);
    if (n == 0) continue;
    const int64_t shift = ((shifts[k] % n) + n) % n;
    if (shift != 0) out = at::cat({out.narrow(d, n - shift, shift), out.narrow(d, 0, n - shift)}, d);
  }
  return out.is_same(self) ? self.clone() : out;
}

// triu and tril: the elements of the last two dimensions on or above (upper) or on or
// below the `diagonal`-th diagonal, 0 elsewhere: a where by a mask made on the host
// (written, no wait), or an and of a bool tensor with it.
at::Tensor& triangleInto(const char* name, bool upper, const at::Tensor& self, int64_t diagonal, at::Tensor& out) {
  const bool ok = stored(self) && onDevice(out) && out.scalar_type() == self.scalar_type() && self.dim() >= 2 &&
                  (out.is_same(self) || !sharesStorage(out, self));
  if (!ok) return hostInto(name, out, upper ? at::triu(host(self), diagonal) : at::tril(host(self), diagonal));
  at::native::resize_output(out, self.sizes());
  if (out.numel() == 0) return out;
  auto all = at::ones({self.size(-2), self.size(-1)}, at::kBool);
  auto keep = (upper ? all.triu(diagonal) : all.tril(diagonal)).to(self.device());
  if (self.scalar_type() == at::kBool) {
    elementwise(TensorFn::mul, out, &self, &keep);  // (and, over bools)
  } else {
    auto zero = at::zeros({}, self.options());
    elementwise(TensorFn::where, out, &keep, &self, 0, 0, &zero);
  }
  return out;
}
#define RACCEL_TRIANGLE(op, upper)                                                                          \
  at::Tensor& op##_out(const at::Tensor& self, int64_t diagonal, at::Tensor& out) {                         \
    return triangleInto("aten::" #op, upper, self, diagonal, out);                                          \
  }                                                                                                         \
  at::Tensor op(const at::Tensor& self, int64_t diagonal) {                                                 \
    auto out = emptyOn({0}, self.scalar_type());                                                            \
    return op##_out(self, diagonal, out);                                                                   \
  }                                                                                                         \
  at::Tensor& op##_(at::Tensor& self, int64_t diagonal) { return op##_out(self, diagonal, self); }
RACCEL_TRIANGLE(triu, true)
RACCEL_TRIANGLE(tril, false)
#undef RACCEL_TRIANGLE

// The type a running or whole sum or product is kept in: the one asked for, else i64 for
// integers and bools (PyTorch's promotion), else the input's.
at::ScalarType accumulatingType(const at::Tensor& self, c10::optional<at::ScalarType> dtype) {
  return dtype ? *dtype : (isIntegral(self) ? at::kLong : self.scalar_type());
}
// A Hillis-Steele scan of `out` along dim: log2(n) rounds of out[k:] = combine(out[k:],
// out[:-k]) for k = 1, 2, 4... (each from a copy of the round's start).
void scanRounds(const at::Tensor& out, int64_t dim, const std::function<void(const at::Tensor&, const at::Tensor&)>& combine) {
  const int64_t n = out.dim() == 0 ? 1 : out.size(dim);
  for (int64_t k = 1; k < n; k *= 2) combine(out.narrow(dim, k, n - k), out.narrow(dim, 0, n - k).clone());
}
// cumsum and cumprod: a scan of adds or products: exact for integers (wrapping as
// PyTorch's CPU); f32 rounded in a tree of adds or products rather than PyTorch's running
// one in double (a few ulps apart over long rows). Integers and bools scan as i64.
template <class Host>
at::Tensor& scanOut(TensorFn fn, const char* name, const at::Tensor& self, int64_t dim, c10::optional<at::ScalarType> dtype,
                    at::Tensor& out, Host reference) {
  const auto type = accumulatingType(self, dtype);
  if (reducedFloats({&self, &out}) && out.scalar_type() == type) {  // in f32 on the card, rounded once
    auto wide = emptyOn({0});
    scanOut(fn, name, widened(self, self.scalar_type()), dim, at::kFloat, wide, reference);
    return resultInto(out, wide);
  }
  if (!typed(self) || !typed(out) || out.scalar_type() != type || !typeOf(type) || type == at::kBool)
    return hostInto(name, out, reference(host(self)));
  dim = c10::maybe_wrap_dim(dim, std::max<int64_t>(self.dim(), 1));
  at::native::resize_output(out, self.sizes());
  elementwise(TensorFn::copy, out, &self, nullptr);
  scanRounds(out, dim, [&](const at::Tensor& after, const at::Tensor& before) { elementwise(fn, after, &after, &before); });
  return out;
}
#define RACCEL_SCAN(op, fn)                                                                                           \
  at::Tensor& op##_out(const at::Tensor& self, int64_t dim, c10::optional<at::ScalarType> dtype, at::Tensor& out) {  \
    return scanOut(fn, "aten::" #op, self, dim, dtype, out, [&](const at::Tensor& x) { return at::op(x, dim, dtype); }); \
  }                                                                                                                   \
  at::Tensor op(const at::Tensor& self, int64_t dim, c10::optional<at::ScalarType> dtype) {                           \
    auto out = emptyOn({0}, accumulatingType(self, dtype));                   \
    return python::op##_out(self, dim, dtype, out);                                                                   \
  }                                                                                                                   \
  at::Tensor& op##_(at::Tensor& self, int64_t dim, c10::optional<at::ScalarType> dtype) {                             \
    return python::op##_out(self, dim, dtype, self);                                                                  \
  }
RACCEL_SCAN(cumsum, TensorFn::add)
RACCEL_SCAN(cumprod, TensorFn::mul)
#undef RACCEL_SCAN

// cdist's direct path (PyTorch's below 25 rows, or for p other than 2): the p-norms of
// every pair's difference, [..., P, R, M] made on the card (so only while that holds at
// most 2^24 elements); the backward of p = 1 and 2 the same differences, signed or over
// the distance (0 where it is 0), summed over the other side's rows.
bool cdistOnCard(const at::Tensor& x1, const at::Tensor& x2, double p) {
  if (!supported({&x1, &x2}) || x1.dim() < 2 || x1.dim() > 4 || x1.dim() != x2.dim() || !(p >= 0)) return false;
  for (int64_t d = 0; d < x1.dim() - 2; ++d)
    if (x1.size(d) != x2.size(d)) return false;
  const int64_t rows = x1.numel() / std::max<int64_t>(x1.size(-1), 1);
  return x1.size(-1) == x2.size(-1) && withinComposedElements(rows, x2.numel());
}
at::Tensor pairDifferences(const at::Tensor& x1, const at::Tensor& x2) { return x1.unsqueeze(-2) - x2.unsqueeze(-3); }
at::Tensor _cdist_forward(const at::Tensor& x1, const at::Tensor& x2, double p, c10::optional<int64_t> mode) {
  if (!cdistOnCard(x1, x2, p))
    return orOnHost("aten::_cdist_forward", {&x1, &x2}, x1.scalar_type(), x1.device(),
                    [&](auto in) { return at::_cdist_forward(in(x1), in(x2), p, mode); });
  auto d = pairDifferences(x1, x2).abs();
  if (p == 0) return (d != 0).sum(-1).to(at::kFloat);
  if (p == 1) return d.sum(-1);
  if (p == 2) return (d * d).sum(-1).sqrt();
  if (std::isinf(p)) return d.amax(-1);
  return d.pow(p).sum(-1).pow(1 / p);
}
at::Tensor _cdist_backward(const at::Tensor& grad, const at::Tensor& x1, const at::Tensor& x2, double p, const at::Tensor& cdist) {
  if ((p != 1 && p != 2) || !cdistOnCard(x1, x2, p) || !supported({&grad, &cdist}))
    return orOnHost("aten::_cdist_backward", {&grad, &x1, &x2, &cdist}, x1.scalar_type(), x1.device(),
                    [&](auto in) { return at::_cdist_backward(in(grad), in(x1), in(x2), p, in(cdist)); });
  auto diff = pairDifferences(x1, x2);
  auto dist = cdist.unsqueeze(-1);
  auto slope = p == 1 ? diff.sign() : at::where(dist == 0, at::zeros({}, diff.options()), diff / dist);
  return (grad.unsqueeze(-1) * slope).sum(-2);
}

// pdist: cdist of the rows with themselves at the pairs i < j (row-major), and its
// backward cdist's with the pairs' gradient made symmetric (each row's share of a pair is
// its derivative there, whichever side it was on).
at::Tensor pairPicks(int64_t n, const at::Tensor& like) {  // the flat positions i * n + j, i < j
  auto pairs = at::triu_indices(n, n, 1);
  return (pairs[0] * n + pairs[1]).to(like.device());
}
at::Tensor _pdist_forward(const at::Tensor& self, double p) {
  if (self.dim() != 2 || !cdistOnCard(self, self, p) || self.size(0) < 2)
    return onHost("aten::_pdist_forward", [&] { return at::_pdist_forward(host(self), p).to(self.device()); });
  auto distances = python::_cdist_forward(self, self, p, c10::nullopt);
  TrustedIndices inRange;  // (pairPicks: below n * n)
  return distances.reshape({-1}).index_select(0, pairPicks(self.size(0), self));
}
at::Tensor _pdist_backward(const at::Tensor& grad, const at::Tensor& self, double p, const at::Tensor& pdist) {
  const int64_t n = self.dim() == 2 ? self.size(0) : 0;
  if (n < 2 || (p != 1 && p != 2) || !cdistOnCard(self, self, p) || !supported({&grad, &pdist}) || grad.dim() != 1 ||
      grad.size(0) != n * (n - 1) / 2 || !pdist.sizes().equals(grad.sizes()))
    return onHost("aten::_pdist_backward", [&] {
      return at::_pdist_backward(host(grad), host(self), p, host(pdist)).to(self.device());
    });
  auto picks = pairPicks(n, self);
  auto square = [&](const at::Tensor& pairs) {
    auto full = at::zeros({n * n}, self.options());
    TrustedIndices inRange;
    full.index_put_({picks}, pairs);
    auto upper = full.view({n, n});
    return upper + upper.t();
  };
  return python::_cdist_backward(square(grad), self, self, p, square(pdist));
}

// prod along a dimension: the running product's last element (cumprod's scan, log2(n)
// ops over the tensor); of f32, or exactly (wrapping) of i64 and bool as i64. 1 over an
// empty dimension.
at::Tensor& prod_int_out(const at::Tensor& self, int64_t dim, bool keepdim, c10::optional<at::ScalarType> dtype,
                         at::Tensor& out) {
  const auto type = accumulatingType(self, dtype);
  if (reducedFloats({&self, &out}) && out.scalar_type() == type) {  // in f32 on the card (PyTorch's CPU refuses bf16), rounded once
    auto wide = emptyOn({0});
    python::prod_int_out(widened(self, self.scalar_type()), dim, keepdim, at::kFloat, wide);
    return resultInto(out, wide);
  }
  const bool onCard = typed(self) && typed(out) && out.scalar_type() == type &&
                      (type == at::kLong ? isIntegral(self) : type == at::kFloat && self.scalar_type() == at::kFloat);
  if (!onCard) return hostInto("aten::prod.int_out", out, at::prod(host(self), dim, keepdim, dtype));
  at::Tensor result;
  if (self.dim() == 0) {
    result = self.to(type);
  } else {
    dim = c10::maybe_wrap_dim(dim, self.dim());
    const int64_t n = self.size(dim);
    if (n == 0) {
      auto sizes = self.sizes().vec();
      sizes[dim] = 1;
      result = at::ones(sizes, self.options().dtype(type));
    } else {
      result = at::cumprod(self, dim, type).narrow(dim, n - 1, 1);
    }
    if (!keepdim) result = result.squeeze(dim);
  }
  return resultInto(out, result);
}
at::Tensor prod(const at::Tensor& self, c10::optional<at::ScalarType> dtype) {  // of every element
  auto out = emptyOn({}, accumulatingType(self, dtype));
  return python::prod_int_out(self.reshape({-1}), 0, false, dtype, out);
}

// Reflection and replication padding: an index_select of the reflected (or the edge's
// repeated) positions along each padded dimension (the last, then the one before it);
// its backward, index_adds of the gradient back along them. Paddings PyTorch refuses
// (a reflection of a dimension's size or more) and negative ones go to the host.
std::optional<at::Tensor> paddedPositions(int64_t n, int64_t before, int64_t after, bool replicate, const at::Tensor& like) {
  if (before < 0 || after < 0 || n == 0 || (!replicate && (before >= n || after >= n))) return std::nullopt;
  std::vector<int64_t> picks;
  for (int64_t i = -before; i < n + after; ++i)
    picks.push_back(replicate ? std::clamp<int64_t>(i, 0, n - 1) : i < 0 ? -i : (i >= n ? 2 * (n - 1) - i : i));
  return at::tensor(picks, at::kLong).to(like.device());
}
// The positions for each padded dimension, last first; none when the host must pad.
std::optional<std::vector<at::Tensor>> paddings(const at::Tensor& self, at::IntArrayRef padding, bool replicate) {
  const int64_t dims = static_cast<int64_t>(padding.size()) / 2;
  if (!supported({&self}) || padding.size() % 2 || self.dim() < dims + 1 || self.numel() == 0) return std::nullopt;
  std::vector<at::Tensor> each;
  for (int64_t k = 0; k < dims; ++k) {
    auto picks = paddedPositions(self.size(-1 - k), padding[2 * k], padding[2 * k + 1], replicate, self);
    if (!picks) return std::nullopt;
    each.push_back(*picks);
  }
  return each;
}
at::Tensor hostPadded(bool replicate, const at::Tensor& self, at::IntArrayRef padding) {
  const bool one = padding.size() == 2;
  return replicate ? (one ? at::replication_pad1d(host(self), padding) : at::replication_pad2d(host(self), padding))
                   : (one ? at::reflection_pad1d(host(self), padding) : at::reflection_pad2d(host(self), padding));
}
at::Tensor hostPaddedBackward(bool replicate, const at::Tensor& grad, const at::Tensor& self, at::IntArrayRef padding) {
  const bool one = padding.size() == 2;
  auto g = host(grad), x = host(self);
  return replicate ? (one ? at::replication_pad1d_backward(g, x, padding) : at::replication_pad2d_backward(g, x, padding))
                   : (one ? at::reflection_pad1d_backward(g, x, padding) : at::reflection_pad2d_backward(g, x, padding));
}
at::Tensor& padInto(const char* name, bool replicate, const at::Tensor& self, at::IntArrayRef padding, at::Tensor& out) {
  auto each = paddings(self, padding, replicate);
  if (!each || !supported({&out})) return hostInto(name, out, hostPadded(replicate, self, padding));
  at::Tensor t = self;
  TrustedIndices inRange;  // (the padding's positions)
  for (size_t k = 0; k < each->size(); ++k) t = at::index_select(t, -1 - static_cast<int64_t>(k), (*each)[k]);
  at::native::resize_output(out, t.sizes());
  return out.copy_(t);
}
at::Tensor& padBackwardInto(const char* name, bool replicate, const at::Tensor& grad, const at::Tensor& self,
                            at::IntArrayRef padding, at::Tensor& gradInput) {
  auto each = paddings(self, padding, replicate);
  if (!each || !supported({&grad, &gradInput})) return hostInto(name, gradInput, hostPaddedBackward(replicate, grad, self, padding));
  at::Tensor t = grad;
  TrustedIndices inRange;  // (the padding's positions)
  for (int64_t k = static_cast<int64_t>(each->size()) - 1; k >= 0; --k) {  // the last select undone first
    auto sizes = t.sizes().vec();
    sizes[sizes.size() - 1 - k] = self.size(-1 - k);
    t = at::zeros(sizes, grad.options()).index_add_(-1 - k, (*each)[k], t);
  }
  at::native::resize_output(gradInput, self.sizes());
  return gradInput.copy_(t);
}
#define RACCEL_PAD(op, replicate)                                                                                      \
  at::Tensor& op##_out(const at::Tensor& self, at::IntArrayRef padding, at::Tensor& out) {                            \
    return padInto("aten::" #op, replicate, self, padding, out);                                                       \
  }                                                                                                                    \
  at::Tensor op(const at::Tensor& self, at::IntArrayRef padding) {                                                     \
    auto out = emptyOn({0}, self.scalar_type());                                                                       \
    return padInto("aten::" #op, replicate, self, padding, out);                                                       \
  }                                                                                                                    \
  at::Tensor& op##_backward_out(const at::Tensor& grad, const at::Tensor& self, at::IntArrayRef padding,              \
                                at::Tensor& gradInput) {                                                               \
    return padBackwardInto("aten::" #op "_backward", replicate, grad, self, padding, gradInput);                       \
  }                                                                                                                    \
  at::Tensor op##_backward(const at::Tensor& grad, const at::Tensor& self, at::IntArrayRef padding) {                 \
    auto out = emptyOn({0}, grad.scalar_type());                                                                       \
    return padBackwardInto("aten::" #op "_backward", replicate, grad, self, padding, out);                             \
  }
RACCEL_PAD(reflection_pad1d, false)
RACCEL_PAD(reflection_pad2d, false)
RACCEL_PAD(replication_pad1d, true)
RACCEL_PAD(replication_pad2d, true)
#undef RACCEL_PAD

// ---- Elementwise functions composed of the map's --------------------------------------

// logaddexp: log(e^a + e^b) as PyTorch's CPU computes it, the larger plus log1p(e^-|a - b|)
// (a itself where a and b are the same infinity); logaddexp2 the same in base 2.
at::Tensor logAddExp(const at::Tensor& a, const at::Tensor& b, bool base2) {
  auto apart = -(a - b).abs();
  auto sum = base2 ? at::maximum(a, b) + at::log1p(at::exp2(apart)) * (1 / std::log(2.0))
                   : at::maximum(a, b) + at::log1p(at::exp(apart));
  return at::where((a == b) & (a.abs() == INFINITY), a, sum);
}
// logcumsumexp: the scan of logaddexp (stable however far apart the values are).
at::Tensor& logcumsumexp_out(const at::Tensor& self, int64_t dim, at::Tensor& out) {
  if (!supported({&self, &out})) return hostInto("aten::_logcumsumexp", out, at::_logcumsumexp(host(self), dim));
  dim = c10::maybe_wrap_dim(dim, std::max<int64_t>(self.dim(), 1));
  auto running = self.clone();
  scanRounds(running, dim, [](const at::Tensor& after, const at::Tensor& before) { after.copy_(logAddExp(after, before, false)); });
  return resultInto(out, running);
}
at::Tensor logcumsumexp(const at::Tensor& self, int64_t dim) {
  auto out = emptyOn({0}, floatResult(self.scalar_type()));
  return python::logcumsumexp_out(self, dim, out);
}
at::Tensor& logaddexp_out(const at::Tensor& self, const at::Tensor& other, at::Tensor& out) {
  if (!supported({&self, &other, &out})) return hostInto("aten::logaddexp.out", out, at::logaddexp(host(self), host(other)));
  return resultInto(out, logAddExp(self, other, false));
}
at::Tensor& logaddexp2_out(const at::Tensor& self, const at::Tensor& other, at::Tensor& out) {
  if (!supported({&self, &other, &out})) return hostInto("aten::logaddexp2.out", out, at::logaddexp2(host(self), host(other)));
  return resultInto(out, logAddExp(self, other, true));
}
at::Tensor logaddexp(const at::Tensor& self, const at::Tensor& other) {
  auto out = emptyOn({0}, floatResult(at::result_type(self, other)));
  return python::logaddexp_out(self, other, out);
}
at::Tensor logaddexp2(const at::Tensor& self, const at::Tensor& other) {
  auto out = emptyOn({0}, floatResult(at::result_type(self, other)));
  return python::logaddexp2_out(self, other, out);
}

// sinc: sin(pi x) / (pi x), 1 at 0.
at::Tensor& sinc_out(const at::Tensor& self, at::Tensor& out) {
  if (!supported({&self, &out})) return hostInto("aten::sinc.out", out, at::sinc(host(self)));
  auto product = self * static_cast<float>(M_PI);
  return resultInto(out, at::where(self == 0, at::ones({}, self.options()), at::sin(product) / product));
}
at::Tensor sinc(const at::Tensor& self) {
  auto out = emptyOn({0}, floatResult(self.scalar_type()));
  return python::sinc_out(self, out);
}
at::Tensor& sinc_(at::Tensor& self) { return python::sinc_out(self, self); }

// The shrinks (0 inside [-lambda, lambda]: soft takes lambda off the rest, hard keeps it)
// and threshold (value at or below it), with NaN kept as PyTorch's CPU keeps it.
at::Tensor inside(const at::Tensor& x, double lambda) { return (x >= -lambda) & (x <= lambda); }
at::Tensor& softshrink_out(const at::Tensor& self, const at::Scalar& lambda, at::Tensor& out) {
  if (!supported({&self, &out})) return hostInto("aten::softshrink.out", out, at::softshrink(host(self), lambda));
  const double l = lambda.toDouble();
  return resultInto(out, at::where(self > l, self - l, at::where(self < -l, self + l, self * 0)));
}
at::Tensor softshrink(const at::Tensor& self, const at::Scalar& lambda) {
  auto out = emptyOn({0}, self.scalar_type());
  return python::softshrink_out(self, lambda, out);
}
at::Tensor& hardshrink_out(const at::Tensor& self, const at::Scalar& lambda, at::Tensor& out) {
  if (!supported({&self, &out})) return hostInto("aten::hardshrink.out", out, at::hardshrink(host(self), lambda));
  return resultInto(out, at::where(inside(self, lambda.toDouble()), at::zeros({}, self.options()), self));
}
at::Tensor hardshrink(const at::Tensor& self, const at::Scalar& lambda) {
  auto out = emptyOn({0}, self.scalar_type());
  return python::hardshrink_out(self, lambda, out);
}
// Either shrink's gradient: 0 inside [-lambda, lambda], the upstream one elsewhere.
at::Tensor& shrinkBackward(const char* name, const at::Tensor& grad, const at::Tensor& self, const at::Scalar& lambda,
                           at::Tensor& gradInput, bool soft) {
  if (!supported({&grad, &self, &gradInput}) || !grad.sizes().equals(self.sizes()))
    return hostInto(name, gradInput, soft ? at::softshrink_backward(host(grad), host(self), lambda)
                                          : at::hardshrink_backward(host(grad), host(self), lambda));
  return resultInto(gradInput, at::where(inside(self, lambda.toDouble()), at::zeros({}, grad.options()), grad));
}
at::Tensor& softshrink_backward_out(const at::Tensor& grad, const at::Tensor& self, const at::Scalar& lambda, at::Tensor& gradInput) {
  return shrinkBackward("aten::softshrink_backward", grad, self, lambda, gradInput, true);
}
at::Tensor softshrink_backward(const at::Tensor& grad, const at::Tensor& self, const at::Scalar& lambda) {
  auto out = emptyOn({0}, grad.scalar_type());
  return python::softshrink_backward_out(grad, self, lambda, out);
}
at::Tensor& hardshrink_backward_out(const at::Tensor& grad, const at::Tensor& self, const at::Scalar& lambda, at::Tensor& gradInput) {
  return shrinkBackward("aten::hardshrink_backward", grad, self, lambda, gradInput, false);
}
at::Tensor hardshrink_backward(const at::Tensor& grad, const at::Tensor& self, const at::Scalar& lambda) {
  auto out = emptyOn({0}, grad.scalar_type());
  return python::hardshrink_backward_out(grad, self, lambda, out);
}
at::Tensor& threshold_out(const at::Tensor& self, const at::Scalar& threshold, const at::Scalar& value, at::Tensor& out) {
  if (!supported({&self, &out})) return hostInto("aten::threshold.out", out, at::threshold(host(self), threshold, value));
  return resultInto(out, at::where(self <= threshold.toDouble(), at::full({}, value.toDouble(), self.options()), self));
}
at::Tensor threshold(const at::Tensor& self, const at::Scalar& threshold, const at::Scalar& value) {
  auto out = emptyOn({0}, self.scalar_type());
  return python::threshold_out(self, threshold, value, out);
}
at::Tensor& threshold_(at::Tensor& self, const at::Scalar& threshold, const at::Scalar& value) {
  return python::threshold_out(self, threshold, value, self);
}

// fmin and fmax: the smaller or larger, a NaN ignored where the other is a number.
at::Tensor& nanIgnoring(const char* name, bool larger, const at::Tensor& a, const at::Tensor& b, at::Tensor& out) {
  if (!supported({&a, &b, &out}))
    return hostInto(name, out, larger ? at::fmax(host(a), host(b)) : at::fmin(host(a), host(b)));
  auto picked = larger ? at::maximum(a, b) : at::minimum(a, b);
  return resultInto(out, at::where(a != a, b, at::where(b != b, a, picked)));
}
at::Tensor& fmin_out(const at::Tensor& a, const at::Tensor& b, at::Tensor& out) { return nanIgnoring("aten::fmin.out", false, a, b, out); }
at::Tensor& fmax_out(const at::Tensor& a, const at::Tensor& b, at::Tensor& out) { return nanIgnoring("aten::fmax.out", true, a, b, out); }

// renorm: each slice along `dim` whose p-norm exceeds maxnorm scaled to maxnorm, by
// PyTorch's factor maxnorm / (norm + 1e-7).
at::Tensor& renorm_out(const at::Tensor& self, const at::Scalar& p, int64_t dim, const at::Scalar& maxnorm, at::Tensor& out) {
  if (!supported({&self, &out}) || self.dim() == 0 || !(p.toDouble() > 0) || maxnorm.toDouble() < 0)
    return hostInto("aten::renorm.out", out, at::renorm(host(self), p, dim, maxnorm));
  dim = c10::maybe_wrap_dim(dim, self.dim());
  std::vector<int64_t> others;
  for (int64_t d = 0; d < self.dim(); ++d)
    if (d != dim) others.push_back(d);
  auto norms = at::linalg_vector_norm(self, p, others, true);
  const double limit = maxnorm.toDouble();
  auto factor = at::where(norms > limit, limit / (norms + 1e-7), at::ones({}, norms.options()));
  return resultInto(out, self * factor);
}

// logit: log(x / (1 - x)), x first held in [eps, 1 - eps] where eps is given (NaN kept),
// and its gradient as PyTorch's CPU gives it: NaN outside [0, 1] without eps, 0 outside
// [eps, 1 - eps] with it.
at::Tensor& logit_out(const at::Tensor& self, c10::optional<double> eps, at::Tensor& out) {
  if (!supported({&self, &out})) return hostInto("aten::logit.out", out, at::logit(host(self), eps));
  auto x = self;
  if (eps && *eps >= 0) {
    auto lo = at::full({}, *eps, self.options()), hi = at::full({}, 1 - *eps, self.options());
    x = at::where(self < lo, lo, at::where(self > hi, hi, self));
  }
  return resultInto(out, at::log(x / (1 - x)));
}
at::Tensor logit(const at::Tensor& self, c10::optional<double> eps) {
  auto out = emptyOn({0}, floatResult(self.scalar_type()));
  return python::logit_out(self, eps, out);
}
at::Tensor& logit_(at::Tensor& self, c10::optional<double> eps) { return python::logit_out(self, eps, self); }
at::Tensor& logit_backward_out(const at::Tensor& grad, const at::Tensor& self, c10::optional<double> eps, at::Tensor& gradInput) {
  if (!supported({&grad, &self, &gradInput}))
    return hostInto("aten::logit_backward", gradInput, at::logit_backward(host(grad), host(self), eps));
  const bool held = eps && *eps >= 0;
  const double lo = held ? *eps : 0, hi = held ? 1 - *eps : 1;
  auto outside = at::full({}, held ? 0.0 : NAN, self.options());
  return resultInto(gradInput, at::where((self < lo) | (self > hi), outside, grad / (self * (1 - self))));
}
at::Tensor logit_backward(const at::Tensor& grad, const at::Tensor& self, c10::optional<double> eps) {
  auto out = emptyOn({0}, grad.scalar_type());
  return python::logit_backward_out(grad, self, eps, out);
}

}  // namespace

// GLU, PReLU, flips, cumulative ops, padding, and the elementwise functions composed.
void registerComposed(torch::Library& m) {
  m.impl("logaddexp.out", TORCH_FN(logaddexp_out));
  m.impl("logaddexp", TORCH_FN(python::logaddexp));
  m.impl("logaddexp2.out", TORCH_FN(logaddexp2_out));
  m.impl("logaddexp2", TORCH_FN(python::logaddexp2));
  RACCEL_IMPL_OUT_NEW_INPLACE(sinc)
  RACCEL_IMPL_OUT_NEW_INPLACE(logit)
  m.impl("fmin.out", TORCH_FN(fmin_out));
  m.impl("fmax.out", TORCH_FN(fmax_out));
  m.impl("renorm.out", TORCH_FN(renorm_out));
  RACCEL_IMPL_BACKWARD(logit)
  RACCEL_IMPL_OUT_NEW_INPLACE(threshold)
  m.impl("softshrink.out", TORCH_FN(softshrink_out));
  m.impl("softshrink", TORCH_FN(python::softshrink));
  RACCEL_IMPL_BACKWARD(softshrink)
  m.impl("hardshrink.out", TORCH_FN(hardshrink_out));
  m.impl("hardshrink", TORCH_FN(python::hardshrink));
  RACCEL_IMPL_BACKWARD(hardshrink)
  m.impl("_cdist_forward", TORCH_FN(python::_cdist_forward));
  m.impl("_cdist_backward", TORCH_FN(python::_cdist_backward));
  m.impl("_pdist_forward", TORCH_FN(python::_pdist_forward));
  m.impl("_pdist_backward", TORCH_FN(python::_pdist_backward));
  m.impl("prod.int_out", TORCH_FN(prod_int_out));
  m.impl("prod", TORCH_FN(python::prod));
  m.impl("glu.out", TORCH_FN(glu_out));
  m.impl("glu", TORCH_FN(python::glu));
  m.impl("glu_backward.grad_input", TORCH_FN(glu_backward_out));
  m.impl("glu_backward", TORCH_FN(python::glu_backward));
  m.impl("log_sigmoid_forward", TORCH_FN(log_sigmoid_forward));
  m.impl("log_sigmoid_backward", TORCH_FN(log_sigmoid_backward));
  m.impl("xlogy.OutTensor", TORCH_FN(xlogy_out));
  m.impl("special_xlog1py.out", TORCH_FN(special_xlog1py_out));
  m.impl("special_entr.out", TORCH_FN(special_entr_out));
  m.impl("nan_to_num.out", TORCH_FN(nan_to_num_out));
  m.impl("xlogy.Tensor", TORCH_FN(python::xlogy));
  m.impl("xlogy_.Tensor", TORCH_FN(xlogy_));
  m.impl("roll", TORCH_FN(python::roll));
  RACCEL_IMPL_OUT_NEW_INPLACE(triu)
  RACCEL_IMPL_OUT_NEW_INPLACE(tril)
  m.impl("prelu", TORCH_FN(python::prelu));
  m.impl("prelu_backward", TORCH_FN(python::prelu_backward));
  m.impl("cumsum.out", TORCH_FN(cumsum_out));
  m.impl("_logcumsumexp.out", TORCH_FN(logcumsumexp_out));
  m.impl("_logcumsumexp", TORCH_FN(python::logcumsumexp));
  m.impl("cumsum", TORCH_FN(python::cumsum));
  m.impl("cumprod.out", TORCH_FN(cumprod_out));
  m.impl("cumprod", TORCH_FN(python::cumprod));
  m.impl("cumsum_", TORCH_FN(python::cumsum_));
  m.impl("cumprod_", TORCH_FN(python::cumprod_));
  m.impl("flip", TORCH_FN(python::flip));
  m.impl("reflection_pad1d.out", TORCH_FN(reflection_pad1d_out));
  m.impl("reflection_pad1d", TORCH_FN(python::reflection_pad1d));
  RACCEL_IMPL_BACKWARD(reflection_pad1d)
  m.impl("reflection_pad2d.out", TORCH_FN(reflection_pad2d_out));
  m.impl("reflection_pad2d", TORCH_FN(python::reflection_pad2d));
  RACCEL_IMPL_BACKWARD(reflection_pad2d)
  m.impl("replication_pad1d.out", TORCH_FN(replication_pad1d_out));
  m.impl("replication_pad1d", TORCH_FN(python::replication_pad1d));
  RACCEL_IMPL_BACKWARD(replication_pad1d)
  m.impl("replication_pad2d.out", TORCH_FN(replication_pad2d_out));
  m.impl("replication_pad2d", TORCH_FN(python::replication_pad2d));
  RACCEL_IMPL_BACKWARD(replication_pad2d)
}

}  // namespace raccel::python
