// The torch device's losses (smooth L1, Huber, BCE, MSE, NLL, the margin ones), softmax and
// log-softmax, layer and group norms, weight normalization, and channel shuffles.
#include "vmfrontend/python/torch_device.h"

namespace raccel::python {

namespace {

// PyTorch's loss reductions (at::Reduction).
constexpr int64_t kNone = 0, kMean = 1, kSum = 2;

// ---- Losses composed of the ops above ----------------------------------------------------

at::Tensor reduced(const at::Tensor& losses, int64_t reduction) {
  return reduction == kNone ? losses : reduction == kSum ? losses.sum() : losses.mean();
}
// The gradient of a reduced loss with respect to each element's loss.
at::Tensor unreduced(const at::Tensor& grad, const at::Tensor& like, int64_t reduction) {
  return reduction == kMean ? grad / static_cast<double>(std::max<int64_t>(like.numel(), 1)) : grad;
}
bool lossOnCard(std::initializer_list<const at::Tensor*> tensors) { return supported(tensors); }

// smooth L1 (beta) and Huber (delta): quadratic inside the bound, linear outside.
at::Tensor smoothLoss(const at::Tensor& self, const at::Tensor& target, double bound, bool huber) {
  auto diff = self - target;
  auto size = diff.abs();
  if (bound == 0) return size;
  auto inside = huber ? diff * diff * 0.5 : diff * diff * (0.5 / bound);
  auto outside = huber ? (size - 0.5 * bound) * bound : size - 0.5 * bound;
  return at::where(huber ? size <= bound : size < bound, inside, outside);
}
at::Tensor smoothGrad(const at::Tensor& grad, const at::Tensor& self, const at::Tensor& target, double bound, bool huber,
                      int64_t reduction) {
  auto diff = self - target;
  auto size = diff.abs();
  auto slope = bound == 0 ? diff.sign()
                          : at::where(huber ? size <= bound : size < bound, huber ? diff : diff / bound,
                                      huber ? diff.sign() * bound : diff.sign());
  return slope * unreduced(grad, self, reduction);
}
at::Tensor& smooth_l1_loss_out(const at::Tensor& self, const at::Tensor& target, int64_t reduction, double beta, at::Tensor& out) {
  if (!lossOnCard({&self, &target, &out}) || beta < 0)
    return orHostInto("aten::smooth_l1_loss", out, {&self, &target, &out},
                      [&](auto in) { return at::smooth_l1_loss(in(self), in(target), reduction, beta); });
  auto loss = reduced(smoothLoss(self, target, beta, false), reduction);
  at::native::resize_output(out, loss.sizes());
  return out.copy_(loss);
}
at::Tensor smooth_l1_loss(const at::Tensor& self, const at::Tensor& target, int64_t reduction, double beta) {
  auto out = emptyOn({0}, at::result_type(self, target));
  return python::smooth_l1_loss_out(self, target, reduction, beta, out);
}
at::Tensor& smooth_l1_loss_backward_out(const at::Tensor& grad, const at::Tensor& self, const at::Tensor& target,
                                        int64_t reduction, double beta, at::Tensor& out) {
  if (!lossOnCard({&grad, &self, &target, &out}) || beta < 0)
    return orHostInto("aten::smooth_l1_loss_backward", out, {&grad, &self, &target, &out},
                      [&](auto in) { return at::smooth_l1_loss_backward(in(grad), in(self), in(target), reduction, beta); });
  auto g = smoothGrad(grad, self, target, beta, false, reduction);
  at::native::resize_output(out, g.sizes());
  return out.copy_(g);
}
at::Tensor smooth_l1_loss_backward(const at::Tensor& grad, const at::Tensor& self, const at::Tensor& target, int64_t reduction,
                                   double beta) {
  auto out = emptyOn({0}, self.scalar_type());
  return python::smooth_l1_loss_backward_out(grad, self, target, reduction, beta, out);
}
at::Tensor& huber_loss_out(const at::Tensor& self, const at::Tensor& target, int64_t reduction, double delta, at::Tensor& out) {
  if (!lossOnCard({&self, &target, &out}) || !(delta > 0))
    return orHostInto("aten::huber_loss", out, {&self, &target, &out},
                      [&](auto in) { return at::huber_loss(in(self), in(target), reduction, delta); });
  auto loss = reduced(smoothLoss(self, target, delta, true), reduction);
  at::native::resize_output(out, loss.sizes());
  return out.copy_(loss);
}
at::Tensor huber_loss(const at::Tensor& self, const at::Tensor& target, int64_t reduction, double delta) {
  auto out = emptyOn({0}, at::result_type(self, target));
  return python::huber_loss_out(self, target, reduction, delta, out);
}
at::Tensor& huber_loss_backward_out(const at::Tensor& grad, const at::Tensor& self, const at::Tensor& target, int64_t reduction,
                                    double delta, at::Tensor& out) {
  if (!lossOnCard({&grad, &self, &target, &out}) || !(delta > 0))
    return orHostInto("aten::huber_loss_backward", out, {&grad, &self, &target, &out},
                      [&](auto in) { return at::huber_loss_backward(in(grad), in(self), in(target), reduction, delta); });
  auto g = smoothGrad(grad, self, target, delta, true, reduction);
  at::native::resize_output(out, g.sizes());
  return out.copy_(g);
}

// Binary cross-entropy over probabilities, each log clamped at -100 as PyTorch does.
at::Tensor binary_cross_entropy(const at::Tensor& self, const at::Tensor& target, const c10::optional<at::Tensor>& weight,
                                int64_t reduction) {
  if (!lossOnCard({&self, &target, present(weight)}))
    return orOnHost("aten::binary_cross_entropy", {&self, &target, present(weight)}, self.scalar_type(), self.device(),
                    [&](auto in) {
                      return at::binary_cross_entropy(in(self), in(target), present(weight) ? in(*weight) : at::Tensor(),
                                                      reduction);
                    });
  auto loss = -(target * self.log().clamp_min(-100) + (1 - target) * (1 - self).log().clamp_min(-100));
  if (present(weight)) loss = loss * *weight;
  return reduced(loss, reduction);
}
at::Tensor binary_cross_entropy_backward(const at::Tensor& grad, const at::Tensor& self, const at::Tensor& target,
                                         const c10::optional<at::Tensor>& weight, int64_t reduction) {
  if (!lossOnCard({&grad, &self, &target, present(weight)}))
    return orOnHost("aten::binary_cross_entropy_backward", {&grad, &self, &target, present(weight)}, self.scalar_type(),
                    self.device(), [&](auto in) {
                      return at::binary_cross_entropy_backward(in(grad), in(self), in(target),
                                                               present(weight) ? in(*weight) : at::Tensor(), reduction);
                    });
  auto g = (self - target) / ((1 - self) * self).clamp_min(1e-12) * unreduced(grad, self, reduction);
  return present(weight) ? g * *weight : g;
}

at::Tensor& mse_loss_out(const at::Tensor& self, const at::Tensor& target, int64_t reduction, at::Tensor& out) {
  if (!supported({&self, &target, &out})) {
    return orHostInto("aten::mse_loss", out, {&self, &target, &out},
                      [&](auto in) { return at::mse_loss(in(self), in(target), reduction); });
  }
  auto shape = broadcastShape(self, target);
  auto diff = emptyOn(shape);
  elementwise(TensorFn::add, diff, &self, &target, -1);
  elementwise(TensorFn::mul, diff, &diff, &diff);
  if (reduction == kNone) {
    at::native::resize_output(out, shape);
    return out.copy_(diff);
  }
  at::native::resize_output(out, {});
  if (diff.numel() == 0) return out.fill_(reduction == kMean ? NAN : 0.0);
  sumInto(out, diff, everyDim(diff.dim()), false, reduction == kMean ? 1.0f / static_cast<float>(diff.numel()) : 1.0f);
  return out;
}
at::Tensor mse_loss(const at::Tensor& self, const at::Tensor& target, int64_t reduction) {
  auto out = emptyOn({0}, at::result_type(self, target));
  return python::mse_loss_out(self, target, reduction, out);
}

// grad_input = 2 (self - target) grad (/ n for the mean)
at::Tensor& mse_loss_backward_out(const at::Tensor& grad, const at::Tensor& self, const at::Tensor& target,
                                  int64_t reduction, at::Tensor& gradInput) {
  if (!supported({&grad, &self, &target, &gradInput})) {
    return orHostInto("aten::mse_loss_backward", gradInput, {&grad, &self, &target, &gradInput},
                      [&](auto in) { return at::mse_loss_backward(in(grad), in(self), in(target), reduction); });
  }
  at::native::resize_output(gradInput, self.sizes());
  auto diff = emptyOn(self.sizes());
  elementwise(TensorFn::add, diff, &self, &target, -1);
  const float scale = reduction == kMean ? 2.0f / static_cast<float>(std::max<int64_t>(self.numel(), 1)) : 2.0f;
  elementwise(TensorFn::mul, gradInput, &diff, &grad, scale);
  return gradInput;
}
at::Tensor mse_loss_backward(const at::Tensor& grad, const at::Tensor& self, const at::Tensor& target, int64_t reduction) {
  auto out = emptyOn({0}, self.scalar_type());
  return python::mse_loss_backward_out(grad, self, target, reduction, out);
}

// Runs a rows op (logSoftmax and its backward) over `dim`, moved last and flattened.
at::Tensor rowsOp(TensorFn fn, const at::Tensor& x, const at::Tensor* y, int64_t dim) {
  dim = c10::maybe_wrap_dim(dim, x.dim());
  auto moved = [&](const at::Tensor& t) { return x.dim() == 0 ? t.reshape({1, 1}) : t.movedim(dim, -1).reshape({-1, t.size(dim)}); };
  auto a = moved(x);
  at::Tensor b = y ? moved(*y) : at::Tensor();
  auto out = emptyOn(a.sizes());
  if (out.numel() > 0) {
    Locked s;
    client::TensorOp op;
    op.fn = fn;
    op.shape = shapeOf(a.sizes());
    op.operands = {operand(out, out.strides()), operand(a, a.strides())};
    if (y) op.operands.push_back(operand(b, b.strides()));
    send(*s, op);
  }
  if (x.dim() == 0) return out.reshape({});
  auto movedShape = x.movedim(dim, -1).sizes().vec();
  return out.view(movedShape).movedim(-1, dim);
}

at::Tensor _log_softmax(const at::Tensor& self, int64_t dim, bool halfToFloat) {
  if (!supported({&self}) || halfToFloat)
    return orOnHost("aten::_log_softmax", {&self}, halfToFloat ? at::kFloat : self.scalar_type(), self.device(), [&](auto in) {
      const auto x = in(self);
      return at::_log_softmax(x, dim, onDevice(x) ? false : halfToFloat);
    });
  return rowsOp(TensorFn::logSoftmax, self, nullptr, dim);
}
at::Tensor _log_softmax_backward_data(const at::Tensor& grad, const at::Tensor& output, int64_t dim, at::ScalarType inputDtype) {
  if (!supported({&grad, &output}) || inputDtype != at::kFloat)
    return orOnHost("aten::_log_softmax_backward_data", {&grad, &output}, inputDtype, grad.device(), [&](auto in) {
      const auto g = in(grad);
      return at::_log_softmax_backward_data(g, in(output), dim, onDevice(g) ? at::kFloat : inputDtype);
    });
  return rowsOp(TensorFn::logSoftmaxBackward, grad, &output, dim);
}

at::Tensor _softmax(const at::Tensor& self, int64_t dim, bool halfToFloat) {
  if (!supported({&self}) || halfToFloat)
    return orOnHost("aten::_softmax", {&self}, halfToFloat ? at::kFloat : self.scalar_type(), self.device(), [&](auto in) {
      const auto x = in(self);
      return at::_softmax(x, dim, onDevice(x) ? false : halfToFloat);
    });
  return rowsOp(TensorFn::softmax, self, nullptr, dim);
}
at::Tensor _softmax_backward_data(const at::Tensor& grad, const at::Tensor& output, int64_t dim, at::ScalarType inputDtype) {
  if (!supported({&grad, &output}) || inputDtype != at::kFloat)
    return orOnHost("aten::_softmax_backward_data", {&grad, &output}, inputDtype, grad.device(), [&](auto in) {
      const auto g = in(grad);
      return at::_softmax_backward_data(g, in(output), dim, onDevice(g) ? at::kFloat : inputDtype);
    });
  return rowsOp(TensorFn::softmaxBackward, grad, &output, dim);
}

// ---- LayerNorm: a rows op over the normalized (last) dimensions ----------------------

// The rows a LayerNorm over `normalized` trailing dimensions of `input` works on: [M, N].
std::pair<int64_t, int64_t> layerNormRows(const at::Tensor& input, c10::IntArrayRef normalized) {
  const int64_t axis = input.dim() - static_cast<int64_t>(normalized.size());
  TORCH_CHECK(axis >= 0 && input.sizes().slice(axis).equals(normalized), "raccel: layer_norm over ", normalized,
              " of an input of ", input.sizes());
  int64_t n = 1;
  for (auto d : normalized) n *= d;
  return {n == 0 ? 0 : input.numel() / n, n};
}
// mean and rstd's shape: the input's leading dimensions, then a 1 for each normalized one.
std::vector<int64_t> statsShape(const at::Tensor& input, size_t normalized) {
  auto shape = input.sizes().vec();
  for (size_t i = shape.size() - normalized; i < shape.size(); ++i) shape[i] = 1;
  return shape;
}
bool layerNormSupported(const at::Tensor& input, const c10::optional<at::Tensor>& weight, const c10::optional<at::Tensor>& bias) {
  const at::Tensor* w = weight && weight->defined() ? &*weight : nullptr;
  const at::Tensor* b = bias && bias->defined() ? &*bias : nullptr;
  return supported({&input, w, b});
}
// One rows op over [M, N]: out and a are [M, N]; `third` is [M, N] or one element per
// row ([M]); perRow is one element per row.
void rowsOf(TensorFn fn, const at::Tensor& out, const at::Tensor& a, const at::Tensor& third, const at::Tensor& perRow,
            float alpha) {
  Locked s;
  client::TensorOp op;
  op.fn = fn;
  op.shape = {static_cast<uint64_t>(a.size(0)), static_cast<uint64_t>(a.size(1))};
  op.operands = {operand(out, out.strides()), operand(a, a.strides()),
                 operand(third, third.dim() == 2 ? third.strides() : c10::IntArrayRef{third.stride(0), 0}),
                 operand(perRow, {perRow.stride(0), 0})};
  op.alpha = alpha;
  send(*s, op);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> native_layer_norm(const at::Tensor& input, c10::IntArrayRef normalized,
                                                                 const c10::optional<at::Tensor>& weight,
                                                                 const c10::optional<at::Tensor>& bias, double eps) {
  if (reducedFloats({&input, present(weight), present(bias)})) {  // in f32 on the card, each result rounded once
    const auto type = input.scalar_type();
    auto [out, mean, rstd] = python::native_layer_norm(widened(input, type), normalized, widenedOrNone(weight),
                                                       widenedOrNone(bias), eps);
    return {out.to(type), mean.to(type), rstd.to(type)};
  }
  if (!layerNormSupported(input, weight, bias)) {
    countFallback("aten::native_layer_norm");
    auto [out, mean, rstd] = at::native_layer_norm(host(input), normalized, weight ? host(*weight) : at::Tensor(),
                                                   bias ? host(*bias) : at::Tensor(), eps);
    return {out.to(input.device()), mean.to(input.device()), rstd.to(input.device())};
  }
  auto [m, n] = layerNormRows(input, normalized);
  auto out = emptyOn(input.sizes()), mean = emptyOn({m}), rstd = emptyOn({m});
  if (m > 0 && n > 0) {
    auto rows = input.reshape({m, n}), outRows = out.view({m, n});
    rowsOf(TensorFn::layerNorm, outRows, rows, mean, rstd, static_cast<float>(eps));
    const bool w = weight && weight->defined(), b = bias && bias->defined();
    if (w && b) elementwise(TensorFn::addcmul, out, &*bias, &out, 1, 0, &*weight);  // bias + out * weight
    else if (w) elementwise(TensorFn::mul, out, &out, &*weight);
    else if (b) elementwise(TensorFn::add, out, &out, &*bias);
  }
  auto shape = statsShape(input, normalized.size());
  return {out, mean.view(shape), rstd.view(shape)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> native_layer_norm_backward(
    const at::Tensor& grad, const at::Tensor& input, c10::IntArrayRef normalized, const at::Tensor& mean,
    const at::Tensor& rstd, const c10::optional<at::Tensor>& weight, const c10::optional<at::Tensor>& bias,
    std::array<bool, 3> mask) {
  if (reducedFloats({&grad, &input, &mean, &rstd, present(weight), present(bias)})) {
    const auto type = input.scalar_type();
    auto [gi, gw, gb] = python::native_layer_norm_backward(widened(grad, type), widened(input, type), normalized,
                                                           widened(mean, type), widened(rstd, type), widenedOrNone(weight),
                                                           widenedOrNone(bias), mask);
    auto typeOr = [&](const c10::optional<at::Tensor>& of) { return present(of) ? of->scalar_type() : type; };
    return {narrowedTo(gi, type), narrowedTo(gw, typeOr(weight)), narrowedTo(gb, typeOr(bias))};
  }
  if (!layerNormSupported(input, weight, bias) || !supported({&grad, &mean, &rstd})) {
    countFallback("aten::native_layer_norm_backward");
    auto [gi, gw, gb] = at::native_layer_norm_backward(host(grad), host(input), normalized, host(mean), host(rstd),
                                                       weight ? host(*weight) : at::Tensor(), bias ? host(*bias) : at::Tensor(), mask);
    auto back = [&](const at::Tensor& t) { return t.defined() ? t.to(input.device()) : t; };
    return {back(gi), back(gw), back(gb)};
  }
  auto [m, n] = layerNormRows(input, normalized);
  const bool w = weight && weight->defined();
  at::Tensor gradInput, gradWeight, gradBias;
  auto g = grad.reshape({m, n}), x = input.reshape({m, n}), mu = mean.reshape({m, 1}), r = rstd.reshape({m, 1});
  // The normalized values again: (x - mean) * rstd.
  auto xhat = emptyOn({m, n});
  if (m > 0 && n > 0) {
    elementwise(TensorFn::add, xhat, &x, &mu, -1);
    elementwise(TensorFn::mul, xhat, &xhat, &r);
  }
  if (mask[0]) {
    gradInput = emptyOn(input.sizes());
    if (m > 0 && n > 0) {
      at::Tensor gw = g;
      if (w) {
        gw = emptyOn({m, n});
        auto weightRow = weight->reshape({1, n});
        elementwise(TensorFn::mul, gw, &g, &weightRow);
      }
      rowsOf(TensorFn::layerNormBackward, gradInput.view({m, n}), gw, xhat, rstd.reshape({m}), 0);
    }
  }
  if (mask[1] && w) {
    gradWeight = emptyOn(weight->sizes());
    auto product = emptyOn({m, n});
    if (m > 0 && n > 0) elementwise(TensorFn::mul, product, &g, &xhat);
    if (m == 0) gradWeight.zero_();
    else sumInto(gradWeight.view({n}), product, 1, false, 1);
  }
  if (mask[2] && bias && bias->defined()) {
    gradBias = emptyOn(bias->sizes());
    if (m == 0) gradBias.zero_();
    else sumInto(gradBias.view({n}), g, 1, false, 1);
  }
  return {gradInput, gradWeight, gradBias};
}

// GroupNorm's backward (its forward is PyTorch's own composition, over batch norm): each
// (sample, group) a row of C / group channels x HxW positions, layer norm's backward over
// it; the weight's and bias's gradients summed per channel.
std::tuple<at::Tensor, at::Tensor, at::Tensor> native_group_norm_backward(
    const at::Tensor& grad, const at::Tensor& input, const at::Tensor& mean, const at::Tensor& rstd,
    const c10::optional<at::Tensor>& weight, int64_t n, int64_t c, int64_t hw, int64_t group, std::array<bool, 3> mask) {
  if (reducedFloats({&grad, &input, &mean, &rstd, present(weight)})) {  // in f32 on the card, each gradient rounded once
    const auto type = input.scalar_type(), wtype = present(weight) ? weight->scalar_type() : type;
    auto [gi, gw, gb] = python::native_group_norm_backward(widened(grad, type), widened(input, type), widened(mean, type),
                                                           widened(rstd, type), widenedOrNone(weight), n, c, hw, group, mask);
    return {narrowedTo(gi, type), narrowedTo(gw, wtype), narrowedTo(gb, wtype)};
  }
  const bool ok = supported({&grad, &input, &mean, &rstd, present(weight)}) && group > 0 && c % group == 0 &&
                  input.numel() == n * c * hw && input.numel() > 0;
  if (!ok) {
    countFallback("aten::native_group_norm_backward");
    auto [gi, gw, gb] = at::native_group_norm_backward(host(grad), host(input), host(mean), host(rstd),
                                                       present(weight) ? host(*weight) : at::Tensor(), n, c, hw, group, mask);
    auto back = [&](const at::Tensor& t) { return t.defined() ? t.to(input.device()) : t; };
    return {back(gi), back(gw), back(gb)};
  }
  const int64_t rows = n * group, span = c / group * hw;
  auto g = grad.reshape({n, c, hw});
  auto xhat = ((input.reshape({n, group, span}) - mean.reshape({n, group, 1})) * rstd.reshape({n, group, 1})).reshape({n, c, hw});
  at::Tensor gradInput, gradWeight, gradBias;
  if (mask[0]) {
    auto scaled = (present(weight) ? g * weight->reshape({1, c, 1}) : g).contiguous();
    gradInput = emptyOn(input.sizes());
    rowsOf(TensorFn::layerNormBackward, gradInput.view({rows, span}), scaled.view({rows, span}), xhat.reshape({rows, span}),
           rstd.reshape({rows}), 0);
  }
  if (mask[1]) gradWeight = (g * xhat).sum(at::IntArrayRef{0, 2});
  if (mask[2]) gradBias = g.sum(at::IntArrayRef{0, 2});
  return {gradInput, gradWeight, gradBias};
}

bool nllSupported(const at::Tensor& self, const at::Tensor& target, const c10::optional<at::Tensor>& weight,
                  int64_t reduction) {
  return supported({&self}) && onDevice(target) && target.scalar_type() == at::kLong && (!weight || !weight->defined()) &&
         reduction != kNone && self.dim() >= 1 && self.dim() <= 2 && target.dim() == self.dim() - 1;
}

// nllLoss and its backward: `rows` is [n, classes] or [classes] (the log-probabilities,
// or the gradient written), `loss` the loss (written, or its gradient read), `total`
// the total weight (written, or read).
void sendNll(TensorFn fn, const at::Tensor& rows, const at::Tensor& loss, const at::Tensor& target,
             const at::Tensor& total, int64_t ignoreIndex, int64_t reduction) {
  auto x = rows.dim() == 1 ? rows.unsqueeze(0) : rows;
  auto t = target.dim() == 0 ? target.unsqueeze(0) : target;
  Locked s;  // before operand(): the arena is the session's
  auto scalar = operand(loss, {0, 0}), matrix = operand(x, x.strides());
  client::TensorOp op;
  op.fn = fn;
  op.shape = shapeOf(x.sizes());
  op.operands = {fn == TensorFn::nllLoss ? scalar : matrix, fn == TensorFn::nllLoss ? matrix : scalar,
                 operand(t, {t.stride(0), 0}), operand(total, {0, 0})};
  op.ignoreIndex = ignoreIndex;
  op.mean = reduction == kMean;
  send(*s, op);
}

// With class weights or reduction 'none': composed of gather and selections. Each
// sample's picked log-probability and its weight, both 0 where the target is ignored.
bool nllComposable(const at::Tensor& self, const at::Tensor& target, const c10::optional<at::Tensor>& weight) {
  return supported({&self, present(weight)}) && typed(target) && target.scalar_type() == at::kLong && self.dim() >= 1 &&
         self.dim() <= 2 && target.dim() == self.dim() - 1;
}
std::pair<at::Tensor, at::Tensor> nllTerms(const at::Tensor& self, const at::Tensor& target,
                                           const c10::optional<at::Tensor>& weight, int64_t ignoreIndex) {
  auto rows = self.dim() == 1 ? self.unsqueeze(0) : self;
  auto t = target.reshape({-1, 1});
  TrustedIndices checked;  // (by the forward; an ignored target picks what is then dropped)
  auto ignored = t == ignoreIndex;
  auto zero = at::zeros({}, self.options());
  auto picked = at::where(ignored, zero, at::gather(rows, 1, t)).squeeze(1);
  auto w = present(weight) ? at::index_select(*weight, 0, t.squeeze(1)).unsqueeze(1) : at::ones({t.size(0), 1}, self.options());
  return {picked, at::where(ignored, zero, w).squeeze(1)};
}
std::tuple<at::Tensor, at::Tensor> nllComposed(const at::Tensor& self, const at::Tensor& target,
                                               const c10::optional<at::Tensor>& weight, int64_t reduction, int64_t ignoreIndex) {
  auto [picked, w] = nllTerms(self, target, weight, ignoreIndex);
  auto losses = -(picked * w);
  auto total = w.sum();
  if (reduction == kNone) return {self.dim() == 1 ? losses.squeeze(0) : losses, total};
  auto sum = losses.sum();
  return {reduction == kMean ? sum / total : sum, total};
}

std::tuple<at::Tensor, at::Tensor> nll_loss_forward(const at::Tensor& self, const at::Tensor& target,
                                                    const c10::optional<at::Tensor>& weight, int64_t reduction,
                                                    int64_t ignoreIndex) {
  const bool onCard = nllSupported(self, target, weight, reduction) || nllComposable(self, target, weight);
  if (onCard && self.dim() > 0)
    checkIndex(target, 0, self.size(-1) - 1, ignoreIndex, [](int64_t v) { TORCH_CHECK_INDEX(false, "Target ", v, " is out of bounds."); });
  if (reducedFloats({&self, present(weight)})) {  // in f32 on the card, rounded once
    auto [out, total] = python::nll_loss_forward(widened(self, self.scalar_type()), target, widenedOrNone(weight), reduction,
                                                 ignoreIndex);
    return {out.to(self.scalar_type()), total.to(self.scalar_type())};
  }
  if (!nllSupported(self, target, weight, reduction) && nllComposable(self, target, weight))
    return nllComposed(self, target, weight, reduction, ignoreIndex);
  if (!nllSupported(self, target, weight, reduction)) {
    countFallback("aten::nll_loss_forward");
    auto [out, total] = at::nll_loss_forward(host(self), host(target), weight ? host(*weight) : at::Tensor(), reduction, ignoreIndex);
    return {out.to(self.device()), total.to(self.device())};
  }
  auto out = emptyOn({}), total = emptyOn({});
  sendNll(TensorFn::nllLoss, self, out, target, total, ignoreIndex, reduction);
  return {out, total};
}

at::Tensor nll_loss_backward(const at::Tensor& grad, const at::Tensor& self, const at::Tensor& target,
                             const c10::optional<at::Tensor>& weight, int64_t reduction, int64_t ignoreIndex,
                             const at::Tensor& totalWeight) {
  if (reducedFloats({&grad, &self, present(weight), &totalWeight})) {
    const auto type = self.scalar_type();
    return python::nll_loss_backward(widened(grad, type), widened(self, type), target, widenedOrNone(weight), reduction,
                                     ignoreIndex, widened(totalWeight, type))
        .to(type);
  }
  if (!nllSupported(self, target, weight, reduction) && nllComposable(self, target, weight) && isF32(grad) &&
      isF32(totalWeight)) {
    // grad_input[i, c] = -w_i * g_i (/ total for the mean) where c is row i's target.
    auto [picked, w] = nllTerms(self, target, weight, ignoreIndex);
    auto scale = reduction == kNone ? -(w * grad.reshape({-1})) : -(w * grad.reshape({}));
    if (reduction == kMean) scale = scale / totalWeight;
    const int64_t classes = self.size(-1);
    auto columns = at::arange(classes, at::kLong).to(self.device()).reshape({1, classes});
    auto rows = at::where(columns == target.reshape({-1, 1}), scale.reshape({-1, 1}), at::zeros({}, self.options()));
    return self.dim() == 1 ? rows.squeeze(0) : rows;
  }
  if (!nllSupported(self, target, weight, reduction) || !isF32(grad) || grad.numel() != 1 || !isF32(totalWeight)) {
    return onHost("aten::nll_loss_backward", [&] {
      return at::nll_loss_backward(host(grad), host(self), host(target), weight ? host(*weight) : at::Tensor(), reduction,
                                   ignoreIndex, host(totalWeight))
          .to(self.device());
    });
  }
  auto gradInput = emptyOn(self.sizes());
  sendNll(TensorFn::nllLossBackward, gradInput, grad, target, totalWeight, ignoreIndex, reduction);
  return gradInput;
}

// The 2-D loss of a segmentation ([N, C, H, W] against [N, H, W], and cross entropy over
// [N, C, d] through it): the classes moved last, one row per position, and the losses
// above over those rows.
bool nll2dShaped(const at::Tensor& self, const at::Tensor& target) {
  return typed(self) && self.dim() == 4 && typed(target) && target.dim() == 3 && target.size(0) == self.size(0) &&
         target.size(1) == self.size(2) && target.size(2) == self.size(3);
}
at::Tensor classesLast(const at::Tensor& self) { return self.permute({0, 2, 3, 1}).reshape({-1, self.size(1)}); }
std::tuple<at::Tensor, at::Tensor> nll_loss2d_forward(const at::Tensor& self, const at::Tensor& target,
                                                      const c10::optional<at::Tensor>& weight, int64_t reduction,
                                                      int64_t ignoreIndex) {
  if (!nll2dShaped(self, target)) {
    countFallback("aten::nll_loss2d_forward");
    auto [out, total] = at::nll_loss2d_forward(host(self), host(target), weight ? host(*weight) : at::Tensor(), reduction, ignoreIndex);
    return {out.to(self.device()), total.to(self.device())};
  }
  auto [out, total] = python::nll_loss_forward(classesLast(self), target.reshape({-1}), weight, reduction, ignoreIndex);
  return {reduction == kNone ? out.reshape(target.sizes()) : out, total};
}
at::Tensor nll_loss2d_backward(const at::Tensor& grad, const at::Tensor& self, const at::Tensor& target,
                               const c10::optional<at::Tensor>& weight, int64_t reduction, int64_t ignoreIndex,
                               const at::Tensor& totalWeight) {
  if (!nll2dShaped(self, target))
    return onHost("aten::nll_loss2d_backward", [&] {
      return at::nll_loss2d_backward(host(grad), host(self), host(target), weight ? host(*weight) : at::Tensor(), reduction,
                                     ignoreIndex, host(totalWeight))
          .to(self.device());
    });
  auto rows = python::nll_loss_backward(reduction == kNone ? grad.reshape({-1}) : grad, classesLast(self), target.reshape({-1}),
                                        weight, reduction, ignoreIndex, totalWeight);
  return rows.reshape({self.size(0), self.size(2), self.size(3), self.size(1)}).permute({0, 3, 1, 2}).contiguous();
}

// ---- Weight normalization (nn.utils.weight_norm: PyTorch's fused interface) ------------
//
// w = v * (g / ||v||), the norm over every dimension but `dim` (the first or the last, the
// cases PyTorch fuses), as rows: [M, K] with M along `dim`. The backward as PyTorch's CPU:
// grad_g = sum(grad_w * v) / norm, grad_v = (g / norm) grad_w - (g / norm) grad_g / norm v.
std::optional<at::Tensor> weightRows(const at::Tensor& t, int64_t dim) {
  if (!isF32(t) || t.dim() < 1 || (dim != 0 && dim != t.dim() - 1)) return std::nullopt;
  return t.movedim(dim, 0).reshape({t.size(dim), -1});
}
at::Tensor fromWeightRows(const at::Tensor& rows, const at::Tensor& like, int64_t dim) {
  auto moved = like.movedim(dim, 0);
  return rows.reshape(moved.sizes()).movedim(0, dim).contiguous();
}
std::tuple<at::Tensor, at::Tensor> _weight_norm_interface(const at::Tensor& v, const at::Tensor& g, int64_t dim) {
  auto rows = weightRows(v, dim);
  if (!rows || !isF32(g) || g.numel() != v.size(dim))
    return onHost("aten::_weight_norm_interface", [&] {
      auto [w, norms] = at::_weight_norm_interface(host(v), host(g), dim);
      return std::make_tuple(w.to(v.device()), norms.to(v.device()));
    });
  auto norms = at::linalg_vector_norm(*rows, 2, {1}, true);
  auto w = *rows * (g.reshape({-1, 1}) / norms);
  return {fromWeightRows(w, v, dim), norms.reshape(g.sizes())};
}
std::tuple<at::Tensor, at::Tensor> _weight_norm_interface_backward(const at::Tensor& gradW, const at::Tensor& v, const at::Tensor& g,
                                                                   const at::Tensor& norms, int64_t dim) {
  auto rows = weightRows(v, dim), gradRows = weightRows(gradW, dim);
  if (!rows || !gradRows || !gradW.sizes().equals(v.sizes()) || !isF32(g) || !isF32(norms) || g.numel() != v.size(dim) ||
      norms.numel() != g.numel())
    return onHost("aten::_weight_norm_interface_backward", [&] {
      auto [gv, gg] = at::_weight_norm_interface_backward(host(gradW), host(v), host(g), host(norms), dim);
      return std::make_tuple(gv.to(v.device()), gg.to(v.device()));
    });
  auto norm = norms.reshape({-1, 1});
  auto gradG = (*gradRows * *rows).sum(1, true) / norm;
  auto a = g.reshape({-1, 1}) / norm;
  auto gradV = a * *gradRows - (a * gradG / norm) * *rows;
  return {fromWeightRows(gradV, v, dim), gradG.reshape(g.sizes())};
}

// multi_margin_loss as PyTorch's CPU computes it: row i with target y adds, over the other
// classes d, max(0, (margin - x[y]) + x[d])^p (times weight[y]), divided by the classes'
// count. Its backward: each such class's slope (g, or 2 g z; times weight[y]; g is 1 over
// the classes, and over the rows too for the mean), the target's the negated sum of the
// row's slopes, all times the upstream gradient. A target outside the classes raises
// PyTorch's error; p other than 1 or 2, and shapes it refuses, go to PyTorch's CPU.
struct MarginRows {
  at::Tensor z, active, weight;  // [rows, classes], the terms counted, [rows, 1] or undefined
  at::Tensor target;             // [rows, 1]
  int64_t rows, classes;
};
bool multiMarginOnCard(const at::Tensor& self, const at::Tensor& target, const at::Scalar& p,
                       const c10::optional<at::Tensor>& weight) {
  if (!isF32(self) || self.dim() > 2 || self.numel() == 0 || !onDevice(target) || target.scalar_type() != at::kLong ||
      (p.toDouble() != 1 && p.toDouble() != 2))
    return false;
  const int64_t rows = self.dim() <= 1 ? 1 : self.size(0), classes = self.dim() <= 1 ? self.numel() : self.size(1);
  return target.numel() == rows && target.dim() <= 1 && (!present(weight) || (isF32(*weight) && weight->numel() == classes));
}
MarginRows marginRows(const at::Tensor& self, const at::Tensor& target, const at::Scalar& margin,
                      const c10::optional<at::Tensor>& weight) {
  MarginRows m;
  auto x = self.reshape({self.dim() <= 1 ? 1 : self.size(0), -1});
  m.rows = x.size(0), m.classes = x.size(1);
  m.target = target.reshape({m.rows, 1});
  checkIndex(m.target, 0, m.classes - 1, std::nullopt, [](int64_t) { TORCH_CHECK(false, "target out of range"); });
  TrustedIndices inRange;  // (checked above)
  m.z = at::rsub(x.gather(1, m.target), margin) + x;
  auto columns = at::arange(m.classes, at::kLong).to(self.device()).reshape({1, m.classes});
  m.active = (m.z > 0).logical_and_(columns != m.target);
  if (present(weight)) m.weight = weight->index_select(0, m.target.reshape({-1})).reshape({m.rows, 1});
  return m;
}
at::Tensor multi_margin_loss(const at::Tensor& self, const at::Tensor& target, const at::Scalar& p, const at::Scalar& margin,
                             const c10::optional<at::Tensor>& weight, int64_t reduction) {
  if (!multiMarginOnCard(self, target, p, weight))
    return onHost("aten::multi_margin_loss", [&] {
      return at::multi_margin_loss(host(self), host(target), p, margin, present(weight) ? host(*weight) : at::Tensor(), reduction)
          .to(self.device());
    });
  const auto m = marginRows(self, target, margin, weight);
  auto terms = at::where(m.active, p.toDouble() == 1 ? m.z : m.z * m.z, at::zeros({}, m.z.options()));
  if (m.weight.defined()) terms = m.weight * terms;
  auto losses = terms.sum(1).div_(static_cast<double>(m.classes));
  if (reduction == kNone) return target.dim() > 0 ? losses : losses.reshape({});
  return reduction == kSum ? losses.sum() : losses.sum().div_(static_cast<double>(m.rows));
}
at::Tensor multi_margin_loss_backward(const at::Tensor& grad, const at::Tensor& self, const at::Tensor& target,
                                      const at::Scalar& p, const at::Scalar& margin, const c10::optional<at::Tensor>& weight,
                                      int64_t reduction) {
  const bool perRow = reduction == kNone && grad.dim() > 0;
  if (!multiMarginOnCard(self, target, p, weight) || !isF32(grad) || grad.numel() != (perRow ? target.numel() : 1))
    return onHost("aten::multi_margin_loss_backward", [&] {
      return at::multi_margin_loss_backward(host(grad), host(self), host(target), p, margin,
                                            present(weight) ? host(*weight) : at::Tensor(), reduction)
          .to(self.device());
    });
  const auto m = marginRows(self, target, margin, weight);
  const auto g = static_cast<float>(reduction == kMean ? 1. / double(m.rows * m.classes) : 1. / double(m.classes));
  auto slopes = p.toDouble() == 1 ? at::full({}, g, m.z.options()).expand(m.z.sizes()) : m.z * (2 * g);
  if (m.weight.defined()) slopes = m.weight * slopes;
  slopes = at::where(m.active, slopes, at::zeros({}, m.z.options()));
  auto columns = at::arange(m.classes, at::kLong).to(self.device()).reshape({1, m.classes});
  auto gradInput = at::where(columns == m.target, -slopes.sum(1, true), slopes);
  gradInput = perRow ? gradInput * grad.reshape({m.rows, 1}) : gradInput * grad.reshape({});
  return gradInput.reshape(self.sizes());
}

// multilabel_margin_loss as PyTorch's CPU computes it: a row's targets are its entries
// before the first -1; each (target m, class d not among them) adds max(0, (1 - x[m]) +
// x[d]), the row's sum divided by the classes' count (a target listed twice counts
// twice). As [rows, targets, classes] terms (up to 2^24 of them; more run on the host).
// is_target marks each row's targets. The backward: each counted term adds g at d and
// takes g from m (g: 1 over the classes, and over the rows for the mean), times the
// upstream gradient. A target outside [-1, classes) raises PyTorch's error.
struct LabelTerms {
  at::Tensor active, z, listed, isTarget;  // [rows, M, C] bool and f32, [rows, M] i64 (C where unlisted), [rows, C] f32
  int64_t rows, classes;
};
bool multilabelOnCard(const at::Tensor& self, const at::Tensor& target) {
  if (!isF32(self) || self.dim() > 2 || self.numel() == 0 || !onDevice(target) || target.scalar_type() != at::kLong ||
      !target.sizes().equals(self.sizes()))
    return false;
  const int64_t classes = self.dim() <= 1 ? self.numel() : self.size(1);
  return classes <= (int64_t{1} << 12) && self.numel() * classes <= (int64_t{1} << 24);
}
LabelTerms labelTerms(const at::Tensor& self, const at::Tensor& target) {
  LabelTerms t;
  auto x = self.reshape({self.dim() <= 1 ? 1 : self.size(0), -1});
  t.rows = x.size(0), t.classes = x.size(1);
  auto labels = target.reshape({t.rows, t.classes});
  checkIndex(labels, -1, t.classes - 1, std::nullopt, [](int64_t) { TORCH_CHECK(false, "argument #2 'target' is out of range"); });
  auto listedMask = (labels < 0).cumsum(1) == 0;  // before the row's first -1
  t.listed = at::where(listedMask, labels, at::full({}, t.classes, labels.options()));
  auto marks = at::zeros({t.rows, t.classes + 1}, x.options());
  TrustedIndices inRange;  // (checked above; C is the column past the classes)
  marks.scatter_(1, t.listed, 1.0);
  t.isTarget = marks.narrow(1, 0, t.classes).contiguous();
  auto picked = at::cat({x, at::zeros({t.rows, 1}, x.options())}, 1).gather(1, t.listed);  // [rows, M]
  t.z = (1 - picked).unsqueeze(2) + x.unsqueeze(1);
  t.active = listedMask.unsqueeze(2).logical_and((t.isTarget == 0).unsqueeze(1)).logical_and_(t.z > 0);
  return t;
}
std::tuple<at::Tensor, at::Tensor> multilabel_margin_loss_forward(const at::Tensor& self, const at::Tensor& target,
                                                                  int64_t reduction) {
  if (!multilabelOnCard(self, target)) {
    countFallback("aten::multilabel_margin_loss_forward");
    auto [out, isTarget] = at::multilabel_margin_loss_forward(host(self), host(target), reduction);
    return {out.to(self.device()), isTarget.to(self.device())};
  }
  const auto t = labelTerms(self, target);
  auto losses = at::where(t.active, t.z, at::zeros({}, t.z.options())).sum({1, 2}).div_(static_cast<double>(t.classes));
  at::Tensor out;
  if (reduction == kNone) out = target.dim() > 1 ? losses : losses.reshape({});
  else out = reduction == kSum ? losses.sum() : losses.sum().div_(static_cast<double>(t.rows));
  return {out, t.isTarget.view(target.sizes())};
}
at::Tensor multilabel_margin_loss_backward(const at::Tensor& grad, const at::Tensor& self, const at::Tensor& target,
                                           int64_t reduction, const at::Tensor& isTarget) {
  const bool perRow = reduction == kNone && grad.dim() > 0;
  if (!multilabelOnCard(self, target) || !isF32(grad) || grad.numel() != (perRow ? target.numel() / self.size(-1) : 1))
    return onHost("aten::multilabel_margin_loss_backward", [&] {
      return at::multilabel_margin_loss_backward(host(grad), host(self), host(target), reduction, host(isTarget))
          .to(self.device());
    });
  const auto t = labelTerms(self, target);
  const double g = reduction == kMean ? 1. / double(t.rows * t.classes) : 1. / double(t.classes);
  auto counts = t.active.to(at::kFloat);
  auto taken = at::zeros({t.rows, t.classes + 1}, self.options());
  {
    TrustedIndices inRange;  // (the listed targets, or the column past the classes)
    taken.scatter_add_(1, t.listed, counts.sum(2));
  }
  auto gradInput = (counts.sum(1) - taken.narrow(1, 0, t.classes)).mul_(g);
  gradInput = perRow ? gradInput * grad.reshape({t.rows, 1}) : gradInput * grad.reshape({});
  return gradInput.reshape(self.sizes());
}

// channel_shuffle: the channels' groups interleaved, [N, g, C/g, ...] read as [N, C/g, g, ...].
at::Tensor channel_shuffle(const at::Tensor& self, int64_t groups) {
  if (!typed(self) || self.dim() < 3 || groups <= 0 || self.size(1) % groups != 0)
    return onHost("aten::channel_shuffle", [&] { return at::channel_shuffle(host(self), groups).to(self.device()); });
  auto shape = self.sizes().vec();
  shape[1] = self.size(1) / groups;
  shape.insert(shape.begin() + 1, groups);
  return self.reshape(shape).transpose(1, 2).reshape(self.sizes()).contiguous();
}

}  // namespace

// Normalization, softmax and losses; weight normalization and channel shuffles.
void registerNormsAndLosses(torch::Library& m) {
  m.impl("_weight_norm_interface", TORCH_FN(python::_weight_norm_interface));
  m.impl("_weight_norm_interface_backward", TORCH_FN(python::_weight_norm_interface_backward));
  m.impl("channel_shuffle", TORCH_FN(python::channel_shuffle));
  m.impl("multi_margin_loss", TORCH_FN(python::multi_margin_loss));
  m.impl("multi_margin_loss_backward", TORCH_FN(python::multi_margin_loss_backward));
  m.impl("multilabel_margin_loss_forward", TORCH_FN(python::multilabel_margin_loss_forward));
  m.impl("multilabel_margin_loss_backward", TORCH_FN(python::multilabel_margin_loss_backward));
  m.impl("native_group_norm_backward", TORCH_FN(native_group_norm_backward));
  m.impl("native_layer_norm", TORCH_FN(native_layer_norm));
  m.impl("native_layer_norm_backward", TORCH_FN(native_layer_norm_backward));
  m.impl("_softmax", TORCH_FN(_softmax));
  m.impl("_softmax_backward_data", TORCH_FN(_softmax_backward_data));
  m.impl("_log_softmax", TORCH_FN(_log_softmax));
  m.impl("_log_softmax_backward_data", TORCH_FN(_log_softmax_backward_data));
  m.impl("nll_loss_forward", TORCH_FN(nll_loss_forward));
  m.impl("nll_loss_backward", TORCH_FN(nll_loss_backward));
  m.impl("nll_loss2d_forward", TORCH_FN(nll_loss2d_forward));
  m.impl("nll_loss2d_backward", TORCH_FN(nll_loss2d_backward));
  m.impl("mse_loss.out", TORCH_FN(mse_loss_out));
  m.impl("mse_loss", TORCH_FN(mse_loss));
  m.impl("mse_loss_backward.grad_input", TORCH_FN(mse_loss_backward_out));
  m.impl("mse_loss_backward", TORCH_FN(mse_loss_backward));
  m.impl("smooth_l1_loss.out", TORCH_FN(smooth_l1_loss_out));
  m.impl("smooth_l1_loss", TORCH_FN(python::smooth_l1_loss));
  RACCEL_IMPL_BACKWARD(smooth_l1_loss)
  m.impl("huber_loss.out", TORCH_FN(huber_loss_out));
  m.impl("huber_loss", TORCH_FN(python::huber_loss));
  m.impl("huber_loss_backward.out", TORCH_FN(huber_loss_backward_out));
  m.impl("binary_cross_entropy", TORCH_FN(python::binary_cross_entropy));
  m.impl("binary_cross_entropy_backward", TORCH_FN(python::binary_cross_entropy_backward));
}

}  // namespace raccel::python
