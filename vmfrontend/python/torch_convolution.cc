// The torch device's batch norm and convolutions: im2col and a matmul, plain and
// transposed, 3-D as 2-D ones, with their backwards.
#include "vmfrontend/python/torch_device.h"

namespace raccel::python {

namespace {

// ---- Batch norm, composed of the ops above ----------------------------------------------
// (Each at:: call on the device's tensors runs through this device's own ops.)

// The statistics shape of a batch norm over [N, C, ...]: [1, C, 1, ...].
std::vector<int64_t> channelShape(const at::Tensor& input) {
  std::vector<int64_t> shape(input.dim(), 1);
  shape[1] = input.size(1);
  return shape;
}
std::vector<int64_t> allButChannels(const at::Tensor& input) {
  std::vector<int64_t> dims = {0};
  for (int64_t d = 2; d < input.dim(); ++d) dims.push_back(d);
  return dims;
}

// Batch norm's training statistics as layer norm over channels (hal/tensor.h): an [N, C,
// positions...] tensor seen as [C, N, positions], each channel's row a strided block.
// layerNorm (out, x, mean, invstd) or layerNormBackward (out, grad, xhat, invstd) over
// those rows; the [N, C, ...] operands contiguous, the per-channel ones [C].
void channelNorm(TensorFn fn, const at::Tensor& out, const at::Tensor& a, const at::Tensor& b, const at::Tensor& c, float alpha) {
  const int64_t n = a.size(0), channels = a.size(1), positions = a.numel() / std::max<int64_t>(n * channels, 1);
  const std::vector<int64_t> strides = {positions, channels * positions, 1};
  auto perChannel = [](const at::Tensor& t) { return std::vector<int64_t>{t.stride(0), 0, 0}; };
  Locked s;
  client::TensorOp op;
  op.fn = fn;
  op.shape = {uint64_t(channels), uint64_t(n), uint64_t(positions)};
  op.operands = {operand(out, strides), operand(a, strides), operand(b, fn == TensorFn::layerNorm ? perChannel(b) : strides),
                 operand(c, perChannel(c))};
  op.alpha = alpha;
  send(*s, op);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> native_batch_norm(
    const at::Tensor& input, const c10::optional<at::Tensor>& weight, const c10::optional<at::Tensor>& bias,
    const c10::optional<at::Tensor>& runningMean, const c10::optional<at::Tensor>& runningVar, bool training, double momentum,
    double eps) {
  const at::Tensor *w = present(weight), *b = present(bias), *rm = present(runningMean), *rv = present(runningVar);
  if (reducedFloats({&input, w, b, rm, rv})) {  // in f32 on the card, each result (and running statistic) rounded once
    auto m = widenedOrNone(runningMean), v = widenedOrNone(runningVar);
    auto [out, mean, invstd] = python::native_batch_norm(widened(input, input.scalar_type()), widenedOrNone(weight),
                                                         widenedOrNone(bias), m, v, training, momentum, eps);
    if (rm && !m->is_same(*rm)) rm->copy_(*m);
    if (rv && !v->is_same(*rv)) rv->copy_(*v);
    return {out.to(input.scalar_type()), mean.to(input.scalar_type()), invstd.to(input.scalar_type())};
  }
  if (!supported({&input, w, b, rm, rv}) || input.dim() < 2 || (!training && !(rm && rv))) {
    countFallback("aten::native_batch_norm");
    at::Tensor hm = rm ? host(*rm) : at::Tensor(), hv = rv ? host(*rv) : at::Tensor();
    auto [out, mean, invstd] = at::native_batch_norm(host(input), w ? host(*w) : at::Tensor(), b ? host(*b) : at::Tensor(),
                                                     hm, hv, training, momentum, eps);
    if (rm) rm->copy_(hm);
    if (rv) rv->copy_(hv);
    return {out.to(input.device()), mean.to(input.device()), invstd.to(input.device())};
  }
  const auto shape = channelShape(input);
  if (training) {
    // One layerNorm over the channels gives the output, the means and 1 / sqrt(var + eps);
    // the weight and bias are one addcmul. The running variance is the unbiased one, got
    // back from invstd: 1 / invstd^2 - eps (to float's rounding of var + eps).
    const auto x = input.contiguous();
    auto out = emptyOn(x.sizes()), mean = emptyOn({x.size(1)}), invstd = emptyOn({x.size(1)});
    channelNorm(TensorFn::layerNorm, out, x, mean, invstd, float(eps));
    if (w && b) {
      const auto bias = b->reshape(shape), scale = w->reshape(shape);
      elementwise(TensorFn::addcmul, out, &bias, &scale, 1, 0, &out);
    } else if (w) out.mul_(w->reshape(shape));
    else if (b) out.add_(b->reshape(shape));
    const int64_t n = x.numel() / std::max<int64_t>(x.size(1), 1);
    if (rm) rm->lerp_(mean, momentum);
    if (rv) {
      const double unbiased = double(n) / double(std::max<int64_t>(n - 1, 1));
      auto var = at::pow(invstd, -2);
      elementwise(TensorFn::affine, var, &var, nullptr, float(unbiased), float(-eps * unbiased));
      rv->lerp_(var, momentum);
    }
    return {out, mean, invstd};
  }
  auto out = (input - rm->reshape(shape)) * at::rsqrt(rv->reshape(shape) + eps);
  if (w) out.mul_(w->reshape(shape));
  if (b) out.add_(b->reshape(shape));
  return {out, emptyOn({0}), emptyOn({0})};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> native_batch_norm_backward(
    const at::Tensor& grad, const at::Tensor& input, const c10::optional<at::Tensor>& weight,
    const c10::optional<at::Tensor>& runningMean, const c10::optional<at::Tensor>& runningVar,
    const c10::optional<at::Tensor>& saveMean, const c10::optional<at::Tensor>& saveInvstd, bool train, double eps,
    std::array<bool, 3> mask) {
  const at::Tensor *w = present(weight), *rm = present(runningMean), *rv = present(runningVar), *sm = present(saveMean),
                   *si = present(saveInvstd);
  const bool stats = train ? (sm && si) : (rm && rv);
  if (reducedFloats({&grad, &input, w, rm, rv, sm, si})) {  // in f32 on the card, each gradient rounded once
    auto [gi, gw, gb] = python::native_batch_norm_backward(
        widened(grad, grad.scalar_type()), widened(input, input.scalar_type()), widenedOrNone(weight),
        widenedOrNone(runningMean), widenedOrNone(runningVar), widenedOrNone(saveMean), widenedOrNone(saveInvstd), train, eps,
        mask);
    const auto wtype = w ? w->scalar_type() : input.scalar_type();
    return {narrowedTo(gi, input.scalar_type()), narrowedTo(gw, wtype), narrowedTo(gb, wtype)};
  }
  if (!supported({&grad, &input, w, rm, rv, sm, si}) || input.dim() < 2 || !stats) {
    countFallback("aten::native_batch_norm_backward");
    auto opt = [](const at::Tensor* t) { return t ? host(*t) : at::Tensor(); };
    auto [gi, gw, gb] = at::native_batch_norm_backward(host(grad), host(input), opt(w), opt(rm), opt(rv), opt(sm), opt(si), train,
                                                       eps, mask);
    auto back = [&](const at::Tensor& t) { return t.defined() ? t.to(input.device()) : t; };
    return {back(gi), back(gw), back(gb)};
  }
  const auto shape = channelShape(input);
  const auto dims = allButChannels(input);
  auto mean = (train ? *sm : *rm).reshape(shape);
  auto invstd = train ? si->reshape(shape) : at::rsqrt(rv->reshape(shape) + eps);
  auto xhat = (input - mean) * invstd;
  at::Tensor gradInput, gradWeight, gradBias;
  if (mask[0] && train) {  // layer norm's backward over the channels' rows
    const auto g = w ? (grad * w->reshape(shape)).contiguous() : grad.contiguous();
    gradInput = emptyOn(g.sizes());
    channelNorm(TensorFn::layerNormBackward, gradInput, g, xhat.contiguous(), *si, 0);
  } else if (mask[0]) {  // eval: the statistics are constants
    gradInput = grad * (w ? invstd * w->reshape(shape) : invstd);
  }
  if (mask[1]) gradWeight = at::sum(grad * xhat, dims);
  if (mask[2]) gradBias = at::sum(grad, dims);
  return {gradInput, gradWeight, gradBias};
}

// A 2-D window geometry: kernel, stride, padding, dilation (each given once or twice),
// and the rows and columns past the bottom and right padding that ceil_mode's last
// windows reach (ceiled()).

at::Tensor columns(const at::Tensor& input, const Window2d& w) {
  const auto x = input.contiguous();
  const int64_t n = x.size(0), c = x.size(1), hw = x.size(2) * x.size(3), kk = w.kh * w.kw;
  const int64_t ohw = w.outH(x.size(2)) * w.outW(x.size(3));
  auto sources = windowTable(x.size(2), x.size(3), w, Table::sources);
  auto cols = emptyOn({c * kk, n * ohw});
  gatherSum(cols, {c, kk, n, ohw, 1, hw}, {kk * n * ohw, n * ohw, ohw, 1, 0, 0}, x, {hw, 0, c * hw, 0, 0, 1}, sources,
            {0, ohw, 0, 1, 0, 0}, 1, 0);
  return cols;
}
// The other way (col2im): cols [N, C, KK * OH * OW] (contiguous) summed into the input
// positions their windows read, an input of `sizes` [N, C, H, W].
at::Tensor uncolumns(const at::Tensor& cols, c10::IntArrayRef sizes, const Window2d& w) {
  const int64_t n = sizes[0], c = sizes[1], hw = sizes[2] * sizes[3], span = cols.size(2);
  auto readers = windowTable(sizes[2], sizes[3], w, Table::readers);
  const int64_t picks = readers.size(1);
  auto out = emptyOn(sizes);
  gatherSum(out, {n, c, hw, picks, span}, {c * hw, hw, 1, 0, 0}, cols, {cols.stride(0), cols.stride(1), 0, 0, cols.stride(2)},
            readers, {0, 0, picks, 1, 0}, 1, 0);
  return out;
}

// F.unfold and F.fold (im2col and col2im of [N, C, H, W] and [N, C x KK, L]): the
// convolution's own gathers, their columns laid out as PyTorch's ([N, C x KK, L]).
// A 3-D input (no batch) is one of a batch.
at::Tensor im2col(const at::Tensor& self, at::IntArrayRef kernel, at::IntArrayRef dilation, at::IntArrayRef padding,
                  at::IntArrayRef stride) {
  const auto w = Window2d::of(kernel, stride, padding, dilation);
  const bool ok = supported({&self}) && (self.dim() == 3 || self.dim() == 4) && kernel.size() == 2 && stride.size() == 2 &&
                  w.sane() && self.numel() > 0;
  if (!ok) return onHost("aten::im2col", [&] { return at::im2col(host(self), kernel, dilation, padding, stride).to(self.device()); });
  const auto x = self.dim() == 3 ? self.unsqueeze(0) : self;
  const int64_t n = x.size(0), l = w.outH(x.size(2)) * w.outW(x.size(3));
  TORCH_CHECK(w.outH(x.size(2)) > 0 && w.outW(x.size(3)) > 0, "im2col: the kernel is larger than the padded input ", x.sizes());
  auto cols = columns(x, w).view({-1, n, l}).permute({1, 0, 2}).contiguous();  // [C x KK, N x L] -> [N, C x KK, L]
  return self.dim() == 3 ? cols.squeeze(0) : cols;
}
at::Tensor col2im(const at::Tensor& self, at::IntArrayRef outputSize, at::IntArrayRef kernel, at::IntArrayRef dilation,
                  at::IntArrayRef padding, at::IntArrayRef stride) {
  const auto w = Window2d::of(kernel, stride, padding, dilation);
  const int64_t kk = w.kh * w.kw;
  const bool ok = supported({&self}) && (self.dim() == 2 || self.dim() == 3) && outputSize.size() == 2 && kernel.size() == 2 &&
                  stride.size() == 2 && w.sane() && self.numel() > 0 && self.size(-2) % kk == 0 &&
                  w.outH(outputSize[0]) > 0 && w.outW(outputSize[1]) > 0 &&
                  self.size(-1) == w.outH(outputSize[0]) * w.outW(outputSize[1]);
  if (!ok)
    return onHost("aten::col2im", [&] {
      return at::col2im(host(self), outputSize, kernel, dilation, padding, stride).to(self.device());
    });
  const auto cols = (self.dim() == 2 ? self.unsqueeze(0) : self).contiguous();
  const int64_t n = cols.size(0), c = cols.size(1) / kk;
  auto out = uncolumns(cols.view({n, c, kk * cols.size(2)}), {n, c, outputSize[0], outputSize[1]}, w);
  return self.dim() == 2 ? out.squeeze(0) : out;
}

// The columns of a convolution's input, kept from its forward for its backward's weight
// gradient, which needs the same ones (making them again was a third of the reference
// CNN's step). Found by the input itself, held so that its memory cannot be reused
// meanwhile, unchanged since (its version: views share it) and the window; each taken
// once. At most kKeptColumns, and kKeptColumnBytes in all: the oldest go first.
struct KeptColumns {
  at::Tensor input;
  int64_t version;
  Window2d w;
  at::Tensor cols;
};
constexpr size_t kKeptColumns = 8;
constexpr size_t kKeptColumnBytes = size_t{256} << 20;
struct ColumnCache {
  std::mutex mu;  // never held while tensors are made or freed (the session's lock)
  std::deque<KeptColumns> kept;
  size_t bytes = 0;
};
ColumnCache& columnCache() {
  static auto* c = new ColumnCache;  // never destroyed, like the session's State
  return *c;
}
void keepColumns(const at::Tensor& input, const Window2d& w, const at::Tensor& cols) {
  const size_t bytes = cols.nbytes();
  if (bytes > kKeptColumnBytes) return;
  std::deque<KeptColumns> dropped;  // freed after the lock is let go
  auto& c = columnCache();
  std::lock_guard lock(c.mu);
  while (!c.kept.empty() && (c.kept.size() >= kKeptColumns || c.bytes + bytes > kKeptColumnBytes)) {
    c.bytes -= c.kept.front().cols.nbytes();
    dropped.push_back(std::move(c.kept.front()));
    c.kept.pop_front();
  }
  c.kept.push_back({input, input._version(), w, cols});
  c.bytes += bytes;
}
std::optional<at::Tensor> takeColumns(const at::Tensor& input, const Window2d& w) {
  std::optional<KeptColumns> found;  // freed after the lock is let go
  {
    auto& c = columnCache();
    std::lock_guard lock(c.mu);
    for (auto it = c.kept.begin(); it != c.kept.end(); ++it) {
      const bool same = it->input.unsafeGetTensorImpl() == input.unsafeGetTensorImpl() ||
                        (it->input.data_ptr() == input.data_ptr() && it->input.sizes() == input.sizes() &&
                         it->input.strides() == input.strides() && it->input.dtype() == input.dtype());
      if (!same || it->w != w) continue;
      c.bytes -= it->cols.nbytes();
      found = std::move(*it);
      c.kept.erase(it);
      break;
    }
  }
  if (!found || found->input._version() != found->version || input._version() != found->version) return std::nullopt;
  return found->cols;
}

// Convolution (2-D, ungrouped, not transposed) as im2col and one matmul.
// Grouped (a depthwise one too): each group's convolution on its channels, their outputs
// side by side (a loop of the ungrouped ones, and of their backwards).
bool convOnCard(const at::Tensor& input, const at::Tensor& weight, const at::Tensor* bias, c10::IntArrayRef stride,
                c10::IntArrayRef padding, c10::IntArrayRef dilation, bool transposed, int64_t groups) {
  return supported({&input, &weight, bias}) && input.dim() == 4 && weight.dim() == 4 && !transposed && groups >= 1 &&
         Window2d::of({weight.size(2), weight.size(3)}, stride, padding, dilation).sane() &&
         input.size(1) == weight.size(1) * groups && weight.size(0) % groups == 0;
}
// Transposed (an output padding below the stride): the gradient of a
// convolution by the same window with respect to its input. Each input position's
// [Cout * KK] contributions (one batched matmul by the weight [Cin, Cout * KK]
// transposed), summed into the output positions whose windows read them (col2im). Its
// backward: the input's gradient is the convolution of the output's gradient by the same
// weight (as [Cin, Cout, KH, KW]), the weight's the input times the gradient's columns.
// A grouped one is a loop over its groups, as a grouped convolution is (perGroup).
bool transposedOnCard(const at::Tensor& input, const at::Tensor& weight, const at::Tensor* bias, c10::IntArrayRef stride,
                      c10::IntArrayRef padding, c10::IntArrayRef dilation, c10::IntArrayRef outputPadding, int64_t groups) {
  if (!supported({&input, &weight, bias}) || input.dim() != 4 || weight.dim() != 4 || groups < 1 ||
      input.size(1) != weight.size(0) || weight.size(0) % groups != 0 || outputPadding.size() > 2)
    return false;
  const auto w = Window2d::of({weight.size(2), weight.size(3)}, stride, padding, dilation);
  const int64_t oph = outputPadding.empty() ? 0 : outputPadding[0], opw = outputPadding.empty() ? 0 : outputPadding.back();
  return w.sane() && oph >= 0 && opw >= 0 && oph < w.sh && opw < w.sw && input.size(2) > 0 && input.size(3) > 0;
}
at::Tensor transposedConvolution(const at::Tensor& input, const at::Tensor& weight, const c10::optional<at::Tensor>& bias,
                                 c10::IntArrayRef stride, c10::IntArrayRef padding, c10::IntArrayRef dilation,
                                 c10::IntArrayRef outputPadding) {
  const auto w = Window2d::of({weight.size(2), weight.size(3)}, stride, padding, dilation);
  const int64_t oph = outputPadding.empty() ? 0 : outputPadding[0], opw = outputPadding.empty() ? 0 : outputPadding.back();
  const int64_t n = input.size(0), ci = input.size(1), co = weight.size(1), kk = w.kh * w.kw;
  const int64_t h = input.size(2), wd = input.size(3), hw = h * wd;
  const int64_t oh = (h - 1) * w.sh - 2 * w.ph + w.dh * (w.kh - 1) + oph + 1;
  const int64_t ow = (wd - 1) * w.sw - 2 * w.pw + w.dw * (w.kw - 1) + opw + 1;
  TORCH_CHECK(oh > 0 && ow > 0, "raccel: a transposed convolution whose padding leaves no output (", oh, " x ", ow, ")");
  auto cols = emptyOn({n, co * kk, hw});
  if (co * kk > 0) {
    if (ci == 0) cols.zero_();
    else batchedMatmul(cols, weight.reshape({ci, co * kk}).t().expand({n, co * kk, ci}), input.reshape({n, ci, hw}), 1, 0);
  }
  auto out = uncolumns(cols.view({n, co, kk * hw}), {n, co, oh, ow}, w);
  if (present(bias)) out.add_(bias->reshape({1, co, 1, 1}));
  return out;
}
std::tuple<at::Tensor, at::Tensor, at::Tensor> transposedConvolutionBackward(
    const at::Tensor& grad, const at::Tensor& input, const at::Tensor& weight, c10::IntArrayRef stride,
    c10::IntArrayRef padding, c10::IntArrayRef dilation, std::array<bool, 3> mask);

at::Tensor convolution_overrideable(const at::Tensor& input, const at::Tensor& weight, const c10::optional<at::Tensor>& bias,
                                    c10::IntArrayRef stride, c10::IntArrayRef padding, c10::IntArrayRef dilation, bool transposed,
                                    c10::IntArrayRef outputPadding, int64_t groups);
std::tuple<at::Tensor, at::Tensor, at::Tensor> convolution_backward_overrideable(
    const at::Tensor& grad, const at::Tensor& input, const at::Tensor& weight, c10::IntArrayRef stride,
    c10::IntArrayRef padding, c10::IntArrayRef dilation, bool transposed, c10::IntArrayRef outputPadding, int64_t groups,
    std::array<bool, 3> mask);

// 3-D convolution (not transposed; grouped or not) as 2-D ones, one per depth offset of
// the kernel: out[:, :, d] = the sum over kd of the 2-D convolution of the input at depth
// d * sd + kd * dd - pd (0 in the padding) by weight[:, :, kd], each kd's over every
// output depth at once (the depth slices stacked into the batch). Its backward is the
// 2-D backwards of the same slices, the input's gradient added back at their depths.
std::optional<Depth> depthOf(const at::Tensor& input, const at::Tensor& weight, const at::Tensor* bias, c10::IntArrayRef stride,
                             c10::IntArrayRef padding, c10::IntArrayRef dilation, bool transposed, int64_t groups) {
  if (!supported({&input, &weight, bias}) || input.dim() != 5 || weight.dim() != 5 || transposed || groups < 1 ||
      stride.size() != 3 || padding.size() != 3 || dilation.size() != 3 || input.size(1) != weight.size(1) * groups ||
      weight.size(0) % groups != 0 || weight.size(2) < 1 || stride[0] < 1 || padding[0] < 0 || dilation[0] < 1)
    return std::nullopt;
  const auto z = Depth::of(weight.size(2), stride[0], padding[0], dilation[0], input.size(2));
  if (z.out < 1 || !Window2d::of({weight.size(3), weight.size(4)}, stride.slice(1), padding.slice(1), dilation.slice(1)).sane())
    return std::nullopt;
  return z;
}
at::Tensor convolution3d(const at::Tensor& input, const at::Tensor& weight, const c10::optional<at::Tensor>& bias,
                         c10::IntArrayRef stride, c10::IntArrayRef padding, c10::IntArrayRef dilation, int64_t groups,
                         const Depth& z) {
  at::NoGradGuard slicesAreNotKept;  // (the 2-D forwards keep no columns for slices the backward makes again)
  auto padded = withSlab(input, 0);
  at::Tensor sum;
  for (int64_t kd = 0; kd < z.k; ++kd) {
    auto out = python::convolution_overrideable(depthSlices(padded, depthPicks(z, kd, input)), weight.select(2, kd), c10::nullopt,
                                                stride.slice(1), padding.slice(1), dilation.slice(1), false, {}, groups);
    sum = sum.defined() ? sum.add_(out) : out;
  }
  auto out = fromDepthSlices(sum, input.size(0));
  if (present(bias)) out.add_(bias->reshape({1, -1, 1, 1, 1}));
  return out;
}
std::tuple<at::Tensor, at::Tensor, at::Tensor> convolution3dBackward(const at::Tensor& grad, const at::Tensor& input,
                                                                     const at::Tensor& weight, c10::IntArrayRef stride,
                                                                     c10::IntArrayRef padding, c10::IntArrayRef dilation,
                                                                     int64_t groups, std::array<bool, 3> mask, const Depth& z) {
  const int64_t n = input.size(0);
  auto g = asDepthSlices(grad);
  auto padded = withSlab(input, 0);
  at::Tensor gradPadded = mask[0] ? at::zeros_like(padded) : at::Tensor(), gradWeight = mask[1] ? at::empty_like(weight) : at::Tensor();
  for (int64_t kd = 0; kd < z.k; ++kd) {
    auto picks = depthPicks(z, kd, input);
    auto [gi, gw, gb] = python::convolution_backward_overrideable(g, depthSlices(padded, picks), weight.select(2, kd),
                                                                  stride.slice(1), padding.slice(1), dilation.slice(1), false,
                                                                  {}, groups, {mask[0], mask[1], false});
    if (mask[1]) gradWeight.select(2, kd).copy_(gw);
    if (mask[0]) {
      TrustedIndices inRange;
      gradPadded.index_add_(2, picks, depthSlicesAsPlanes(gi, n));
    }
  }
  return {mask[0] ? gradPadded.narrow(2, 0, z.in).contiguous() : at::Tensor(), gradWeight,
          mask[2] ? at::sum(grad, {0, 2, 3, 4}) : at::Tensor()};
}

// One group's channels: the input's, the weight's first dimension's and the output's (a
// transposed weight is [Cin, Cout / groups, KH, KW], a plain one [Cout, Cin / groups, ...]).
struct GroupChannels {
  int64_t input, weight, output;
  static GroupChannels of(const at::Tensor& weight, bool transposed, int64_t groups) {
    if (transposed) return {weight.size(0) / groups, weight.size(0) / groups, weight.size(1)};
    return {weight.size(1), weight.size(0) / groups, weight.size(0) / groups};
  }
};

at::Tensor convolution_overrideable(const at::Tensor& input, const at::Tensor& weight, const c10::optional<at::Tensor>& bias,
                                    c10::IntArrayRef stride, c10::IntArrayRef padding, c10::IntArrayRef dilation, bool transposed,
                                    c10::IntArrayRef outputPadding, int64_t groups) {
  if (auto z = depthOf(input, weight, present(bias), stride, padding, dilation, transposed, groups))
    return convolution3d(input, weight, bias, stride, padding, dilation, groups, *z);
  const bool onCard = transposed ? transposedOnCard(input, weight, present(bias), stride, padding, dilation, outputPadding, groups)
                                  : convOnCard(input, weight, present(bias), stride, padding, dilation, transposed, groups);
  if (!onCard)
    return orOnHost("aten::convolution_overrideable", {&input, &weight, present(bias)}, input.scalar_type(), input.device(),
                    [&](auto in) {
                      return at::convolution(in(input), in(weight), present(bias) ? in(*bias) : at::Tensor(), stride, padding,
                                             dilation, transposed, outputPadding, groups);
                    });
  if (groups > 1) {
    const auto c = GroupChannels::of(weight, transposed, groups);
    std::vector<at::Tensor> outs;
    for (int64_t g = 0; g < groups; ++g) {
      auto b = present(bias) ? c10::optional<at::Tensor>(bias->narrow(0, g * c.output, c.output)) : c10::nullopt;
      outs.push_back(python::convolution_overrideable(input.narrow(1, g * c.input, c.input), weight.narrow(0, g * c.weight, c.weight),
                                                      b, stride, padding, dilation, transposed, outputPadding, 1));
    }
    return at::cat(outs, 1);
  }
  if (transposed) return transposedConvolution(input, weight, bias, stride, padding, dilation, outputPadding);
  const auto w = Window2d::of({weight.size(2), weight.size(3)}, stride, padding, dilation);
  const int64_t n = input.size(0), oc = weight.size(0), oh = w.outH(input.size(2)), ow = w.outW(input.size(3));
  TORCH_CHECK(oh > 0 && ow > 0, "raccel: a convolution whose kernel is larger than its padded input");
  auto cols = columns(input, w);  // [C * KK, N * OHW]
  if (at::GradMode::is_enabled() && weight.requires_grad()) keepColumns(input, w, cols);
  const int64_t span = cols.size(0);
  // Each image's [OC, OHW] straight into its place in [N, OC, OH, OW]: one batched matmul.
  auto out = emptyOn({n, oc, oh, ow});
  if (span == 0) out.zero_();
  else batchedMatmul(out.view({n, oc, oh * ow}), weight.reshape({oc, span}).expand({n, oc, span}),
                     cols.view({span, n, oh * ow}).permute({1, 0, 2}), 1, 0);
  if (present(bias)) out.add_(bias->reshape({1, oc, 1, 1}));
  return out;
}
std::tuple<at::Tensor, at::Tensor, at::Tensor> convolution_backward_overrideable(
    const at::Tensor& grad, const at::Tensor& input, const at::Tensor& weight, c10::IntArrayRef stride,
    c10::IntArrayRef padding, c10::IntArrayRef dilation, bool transposed, c10::IntArrayRef outputPadding, int64_t groups,
    std::array<bool, 3> mask) {
  if (reducedFloats({&grad, &input, &weight})) {  // in f32 on the card, each gradient rounded once
    auto [gi, gw, gb] = python::convolution_backward_overrideable(
        widened(grad, grad.scalar_type()), widened(input, input.scalar_type()), widened(weight, weight.scalar_type()), stride,
        padding, dilation, transposed, outputPadding, groups, mask);
    return {narrowedTo(gi, input.scalar_type()), narrowedTo(gw, weight.scalar_type()), narrowedTo(gb, weight.scalar_type())};
  }
  if (auto z = depthOf(input, weight, nullptr, stride, padding, dilation, transposed, groups);
      z && supported({&grad}) && grad.dim() == 5)
    return convolution3dBackward(grad, input, weight, stride, padding, dilation, groups, mask, *z);
  const bool onCard = supported({&grad}) && grad.dim() == 4 &&
                      (transposed ? transposedOnCard(input, weight, nullptr, stride, padding, dilation, outputPadding, groups)
                                  : convOnCard(input, weight, nullptr, stride, padding, dilation, transposed, groups));
  if (!onCard) {
    countFallback("aten::convolution_backward_overrideable");
    std::vector<int64_t> biasSizes = {weight.size(0)};
    auto [gi, gw, gb] = at::convolution_backward(host(grad), host(input), host(weight), at::OptionalIntArrayRef(biasSizes),
                                                 stride, padding, dilation, transposed, outputPadding, groups, mask);
    auto back = [&](const at::Tensor& t) { return t.defined() ? t.to(input.device()) : t; };
    return {back(gi), back(gw), back(gb)};
  }
  if (groups > 1) {
    const auto c = GroupChannels::of(weight, transposed, groups);
    std::vector<at::Tensor> gradInputs, gradWeights;
    for (int64_t g = 0; g < groups; ++g) {
      auto [gi, gw, gb] = python::convolution_backward_overrideable(
          grad.narrow(1, g * c.output, c.output), input.narrow(1, g * c.input, c.input),
          weight.narrow(0, g * c.weight, c.weight), stride, padding, dilation, transposed, outputPadding, 1,
          {mask[0], mask[1], false});
      gradInputs.push_back(gi), gradWeights.push_back(gw);
    }
    return {mask[0] ? at::cat(gradInputs, 1) : at::Tensor(), mask[1] ? at::cat(gradWeights, 0) : at::Tensor(),
            mask[2] ? at::sum(grad, {0, 2, 3}) : at::Tensor()};
  }
  if (transposed) return transposedConvolutionBackward(grad, input, weight, stride, padding, dilation, mask);
  const auto w = Window2d::of({weight.size(2), weight.size(3)}, stride, padding, dilation);
  const int64_t n = input.size(0), oc = weight.size(0), ohw = grad.size(2) * grad.size(3);
  const int64_t span = weight.numel() / std::max<int64_t>(oc, 1);  // C * KK
  at::Tensor gradInput, gradWeight, gradBias;
  if (mask[1]) {
    auto g = grad.permute({1, 0, 2, 3}).reshape({oc, -1});  // [OC, N * OHW]
    auto kept = takeColumns(input, w);
    gradWeight = at::mm(g, (kept ? *kept : columns(input, w)).t()).reshape(weight.sizes());
  }
  if (mask[2]) gradBias = at::sum(grad, {0, 2, 3});
  if (mask[0]) {
    // Each image's columns' gradient [C * KK, OHW] (one batched matmul), summed back into
    // the positions they were gathered from.
    auto cols = emptyOn({n, span, ohw});
    batchedMatmul(cols, weight.reshape({oc, span}).t().expand({n, span, oc}), grad.reshape({n, oc, ohw}), 1, 0);
    gradInput = uncolumns(cols.view({n, input.size(1), span / input.size(1) * ohw}), input.sizes(), w);
  }
  return {gradInput, gradWeight, gradBias};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> transposedConvolutionBackward(
    const at::Tensor& grad, const at::Tensor& input, const at::Tensor& weight, c10::IntArrayRef stride,
    c10::IntArrayRef padding, c10::IntArrayRef dilation, std::array<bool, 3> mask) {
  const auto w = Window2d::of({weight.size(2), weight.size(3)}, stride, padding, dilation);
  at::Tensor gradInput, gradWeight, gradBias;
  if (mask[0])
    gradInput = python::convolution_overrideable(grad, weight, c10::nullopt, stride, padding, dilation, false, {}, 1);
  if (mask[1]) {
    const int64_t ci = input.size(1);
    auto x = input.transpose(0, 1).reshape({ci, -1});  // [Cin, N * H * W]
    gradWeight = at::mm(x, columns(grad, w).t()).reshape(weight.sizes());
  }
  if (mask[2]) gradBias = at::sum(grad, {0, 2, 3});
  return {gradInput, gradWeight, gradBias};
}

}  // namespace

// Batch norm, convolutions and their columns (im2col, col2im).
void registerConvolutions(torch::Library& m) {
  m.impl("native_batch_norm", TORCH_FN(native_batch_norm));
  m.impl("native_batch_norm_backward", TORCH_FN(native_batch_norm_backward));
  m.impl("im2col", TORCH_FN(python::im2col));
  m.impl("col2im", TORCH_FN(python::col2im));
  m.impl("convolution_overrideable", TORCH_FN(convolution_overrideable));
  m.impl("convolution_backward_overrideable", TORCH_FN(convolution_backward_overrideable));
}

}  // namespace raccel::python
