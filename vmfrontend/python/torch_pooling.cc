// The torch device's pooling (max, average, adaptive average; 2-D, and 3-D as 2-D ones)
// and max unpooling, with their backwards.
#include "vmfrontend/python/torch_device.h"

namespace raccel::python {

namespace {

// Max pooling: each window's largest element and where it was (PyTorch's indices: the
// flat position h * W + w in its input plane).
// (ceil_mode where it adds windows: max pooling passes the ceiled window and false)
bool poolOnCard(const at::Tensor& self, const Window2d& w, bool ceilMode) {
  if (!supported({&self}) || self.dim() != 4 || !w.sane() || w.outH(self.size(2)) <= 0 || w.outW(self.size(3)) <= 0) return false;
  const auto c = ceiled(w, self, ceilMode);
  return !ceilMode || (c.eh == 0 && c.ew == 0);
}
// Each window's position of its largest element, kh * KW + kw.
at::Tensor windowArgmax(const at::Tensor& win) {
  auto out = emptyOn({win.size(0), win.size(1), win.size(2), win.size(3)}, at::kLong);
  reduceInto(TensorFn::argmax, out, win, 0b110000, false);
  return out;
}
std::tuple<at::Tensor, at::Tensor> max_pool2d_with_indices(const at::Tensor& self, c10::IntArrayRef kernel,
                                                           c10::IntArrayRef stride, c10::IntArrayRef padding,
                                                           c10::IntArrayRef dilation, bool ceilMode) {
  if (self.dim() == 3 && self.numel() > 0) {  // unbatched: one image of a batch
    auto [v, i] = python::max_pool2d_with_indices(self.unsqueeze(0), kernel, stride, padding, dilation, ceilMode);
    return {v.squeeze(0), i.squeeze(0)};
  }
  const auto w = ceiled(Window2d::of(kernel, stride, padding, dilation), self, ceilMode);
  if (reducedFloats({&self})) {  // compared in f32: the same maxima, exactly
    auto [v, i] = python::max_pool2d_with_indices(widened(self, self.scalar_type()), kernel, stride, padding, dilation, ceilMode);
    return {v.to(self.scalar_type()), i};
  }
  if (!poolOnCard(self, w, false)) {
    countFallback("aten::max_pool2d_with_indices");
    auto [v, i] = at::max_pool2d_with_indices(host(self), kernel, stride, padding, dilation, ceilMode);
    return {v.to(self.device()), i.to(self.device())};
  }
  auto win = windows(padded(self, w, -INFINITY), w);
  const int64_t nc = self.size(0) * self.size(1), oh = win.size(2), ow = win.size(3), kk = w.kh * w.kw;
  auto values = emptyOn({self.size(0), self.size(1), oh, ow});
  if (w.ph == 0 && w.pw == 0 && w.eh == 0 && w.ew == 0) {  // one op: a contiguous plane's windows give PyTorch's indices
    auto indices = emptyOn(values.sizes(), at::kLong);
    const std::vector<int64_t> perWindow = {oh * ow * self.size(1), oh * ow, ow, 1, 0, 0};  // values' and indices'
    Locked s;
    client::TensorOp op;
    op.fn = TensorFn::maxPool2d;
    op.shape = shapeOf(win.sizes());
    op.operands = {operand(values, perWindow), operand(win, win.strides()), operand(indices, perWindow)};
    send(*s, op);
    return {values, indices};
  }
  // Padded: the padding's -inf must not win a window of -inf inputs (PyTorch's index is
  // then the first input element), so amax, then the position, then the input's index.
  reduceInto(TensorFn::amax, values, win, 0b110000, false);
  // Each window's input position: the sources table's entry in the row of its largest
  // element (a gather along the table's window elements).
  auto position = windowArgmax(win);
  auto sources = windowTable(self.size(2), self.size(3), w, Table::sources);
  auto indices = emptyOn(values.sizes(), at::kLong);
  Locked s;
  client::TensorOp op;
  op.fn = TensorFn::indexSelect;
  op.shape = {uint64_t(nc), uint64_t(oh * ow), uint64_t(kk)};
  op.operands = {operand(indices, {oh * ow, 1, 0}), operand(sources, {0, 1, oh * ow}), operand(position, {oh * ow, 1, 0})};
  send(*s, op);
  return {values, indices};
}
// Each output's gradient goes to the input position its window's largest element came
// from: the column elements that read the forward's indices, summed back (col2im).
at::Tensor max_pool2d_with_indices_backward(const at::Tensor& grad, const at::Tensor& self, c10::IntArrayRef kernel,
                                            c10::IntArrayRef stride, c10::IntArrayRef padding, c10::IntArrayRef dilation,
                                            bool ceilMode, const at::Tensor& indices) {
  if (self.dim() == 3 && grad.dim() == 3 && indices.dim() == 3 && self.numel() > 0)  // unbatched: one image of a batch
    return python::max_pool2d_with_indices_backward(grad.unsqueeze(0), self.unsqueeze(0), kernel, stride, padding, dilation,
                                                    ceilMode, indices.unsqueeze(0)).squeeze(0);
  const auto w = ceiled(Window2d::of(kernel, stride, padding, dilation), self, ceilMode);
  const bool onCard = poolOnCard(self, w, false) && supported({&grad}) && typed(indices) &&
                      indices.scalar_type() == at::kLong && indices.sizes() == grad.sizes();
  if (!onCard)
    return orOnHost("aten::max_pool2d_with_indices_backward", {&grad, &self}, grad.scalar_type(), self.device(), [&](auto in) {
      return at::max_pool2d_with_indices_backward(in(grad), in(self), kernel, stride, padding, dilation, ceilMode, in(indices));
    });
  // One op: each plane of the input's gradient set to 0, then each output's gradient
  // added at its index.
  const int64_t h = self.size(2), wd = self.size(3);
  auto out = emptyOn(self.sizes());
  Locked s;
  client::TensorOp op;
  op.fn = TensorFn::maxPool2dBackward;
  op.shape = shapeOf({self.size(0), self.size(1), grad.size(2), grad.size(3), h, wd});
  auto over = [](const at::Tensor& t) { return std::vector<int64_t>{t.stride(0), t.stride(1), t.stride(2), t.stride(3), 0, 0}; };
  op.operands = {operand(out, {self.size(1) * h * wd, h * wd, 0, 0, wd, 1}), operand(grad, over(grad)),
                 operand(indices, over(indices))};
  send(*s, op);
  return out;
}

// Average pooling (padding counted in the divisor, as PyTorch does by default): each
// window's sum of its sources, and back, each position's sum over the windows that read it.
bool avgOnCard(const at::Tensor& self, const Window2d& w, bool ceilMode, bool countIncludePad, c10::optional<int64_t> divisor) {
  return poolOnCard(self, w, ceilMode) && (!divisor || *divisor != 0);
}
// Padding left out of the divisor (count_include_pad=False, no divisor given): each
// window's share of the kernel inside the input, the padded average of a plane of ones.
// The average is the padded one over that share, and the backward the padded one of
// the gradient over it.
c10::optional<at::Tensor> insideShare(const at::Tensor& self, c10::IntArrayRef kernel, c10::IntArrayRef stride,
                                      c10::IntArrayRef padding, const Window2d& w, bool countIncludePad,
                                      c10::optional<int64_t> divisor) {
  if (countIncludePad || divisor || (w.ph == 0 && w.pw == 0)) return c10::nullopt;
  auto ones = at::ones({1, 1, self.size(2), self.size(3)}, self.options());
  return at::avg_pool2d(ones, kernel, stride, padding, false, true, c10::nullopt);
}
// Each output window's sum of x's elements at `sources` ([K, OH * OW]: -1 adds nothing),
// times alpha: x [N, C, H, W] to [N, C, OH, OW]. Average pooling's forwards.
at::Tensor windowSums(const at::Tensor& self, const at::Tensor& sources, int64_t oh, int64_t ow, float alpha) {
  const auto x = self.contiguous();
  const int64_t n = x.size(0), c = x.size(1), hw = x.size(2) * x.size(3), kk = sources.size(0);
  auto out = emptyOn({n, c, oh, ow});
  gatherSum(out, {n, c, oh * ow, kk, hw}, {c * oh * ow, oh * ow, 1, 0, 0}, x, {c * hw, hw, 0, 0, 1}, sources,
            {0, 0, 1, oh * ow, 0}, alpha, 0);
  return out;
}
// The other way: each input position's sum of grad [N, C, OH, OW] over the windows that
// read it (`readers` [H * W, R], in order), times alpha, into an input of `sizes`.
// Average pooling's backwards.
at::Tensor readerSums(const at::Tensor& grad, const at::Tensor& readers, c10::IntArrayRef sizes, float alpha) {
  const int64_t n = sizes[0], c = sizes[1], hw = sizes[2] * sizes[3], ohw = grad.size(2) * grad.size(3);
  const int64_t picks = readers.size(1);
  const auto g = grad.reshape({n, c, ohw});
  auto out = emptyOn(sizes);
  gatherSum(out, {n, c, hw, picks, ohw}, {c * hw, hw, 1, 0, 0}, g, {g.stride(0), g.stride(1), 0, 0, g.stride(2)}, readers,
            {0, 0, picks, 1, 0}, alpha, 0);
  return out;
}
// ceil_mode's added windows (w ceiled): PyTorch's divisor per window, kept per geometry,
// [OH * OW] f32: the divisor given, or the window's size clipped to the padding (with
// count_include_pad) or to the input (without). Each window's sum in row order over it,
// and its gradient over it added back, as its CPU kernel does.
at::Tensor poolDivisors(int64_t h, int64_t wd, const Window2d& w, bool countIncludePad, c10::optional<int64_t> divisor) {
  return cachedTable({h, wd, w.kh, w.kw, w.sh, w.sw, w.ph, w.pw, -3, countIncludePad, w.eh, w.ew, divisor.value_or(0)}, [&] {
    std::vector<float> d;
    for (int64_t o = 0; o < w.outH(h) * w.outW(wd); ++o) {
      int64_t y0 = o / w.outW(wd) * w.sh - w.ph, x0 = o % w.outW(wd) * w.sw - w.pw;
      int64_t y1 = std::min(y0 + w.kh, h + w.ph), x1 = std::min(x0 + w.kw, wd + w.pw);
      const int64_t padded = (y1 - y0) * (x1 - x0);
      y0 = std::max<int64_t>(y0, 0), x0 = std::max<int64_t>(x0, 0), y1 = std::min(y1, h), x1 = std::min(x1, wd);
      d.push_back(float(divisor ? *divisor : countIncludePad ? padded : (y1 - y0) * (x1 - x0)));
    }
    return at::tensor(d, at::kFloat);
  });
}
at::Tensor ceiledAverage(const at::Tensor& self, const Window2d& w, bool countIncludePad, c10::optional<int64_t> divisor) {
  const int64_t h = self.size(2), wd = self.size(3), oh = w.outH(h), ow = w.outW(wd);
  auto out = windowSums(self, windowTable(h, wd, w, Table::sources), oh, ow, 1);
  return out.div_(poolDivisors(h, wd, w, countIncludePad, divisor).view({oh, ow}));
}
at::Tensor ceiledAverageBackward(const at::Tensor& grad, const at::Tensor& self, const Window2d& w, bool countIncludePad,
                                 c10::optional<int64_t> divisor) {
  const int64_t h = self.size(2), wd = self.size(3);
  auto shares = grad / poolDivisors(h, wd, w, countIncludePad, divisor).view({w.outH(h), w.outW(wd)});
  return readerSums(shares, windowTable(h, wd, w, Table::outputs), self.sizes(), 1);
}
// The ceiled window where ceil_mode adds windows and the card takes them, else none.
c10::optional<Window2d> addedWindows(const at::Tensor& self, const Window2d& w, bool ceilMode, c10::optional<int64_t> divisor) {
  const auto c = ceiled(w, self, ceilMode);
  if ((c.eh == 0 && c.ew == 0) || !poolOnCard(self, c, false) || (divisor && *divisor == 0)) return c10::nullopt;
  return c;
}
at::Tensor avg_pool2d(const at::Tensor& self, c10::IntArrayRef kernel, c10::IntArrayRef stride, c10::IntArrayRef padding,
                      bool ceilMode, bool countIncludePad, c10::optional<int64_t> divisor) {
  if (reducedFloats({&self}))  // in f32 on the card, rounded once
    return python::avg_pool2d(widened(self, self.scalar_type()), kernel, stride, padding, ceilMode, countIncludePad, divisor)
        .to(self.scalar_type());
  const auto w = Window2d::of(kernel, stride, padding, {});
  if (auto c = addedWindows(self, w, ceilMode, divisor)) return ceiledAverage(self, *c, countIncludePad, divisor);
  if (avgOnCard(self, w, ceilMode, countIncludePad, divisor))
    if (auto share = insideShare(self, kernel, stride, padding, w, countIncludePad, divisor))
      return at::avg_pool2d(self, kernel, stride, padding, false, true, c10::nullopt) / *share;
  if (!avgOnCard(self, w, ceilMode, countIncludePad, divisor))
    return onHost("aten::avg_pool2d", [&] {
      return at::avg_pool2d(host(self), kernel, stride, padding, ceilMode, countIncludePad, divisor).to(self.device());
    });
  const int64_t h = self.size(2), wd = self.size(3);
  return windowSums(self, windowTable(h, wd, w, Table::sources), w.outH(h), w.outW(wd),
                    float(1.0 / double(divisor.value_or(w.kh * w.kw))));
}
at::Tensor avg_pool2d_backward(const at::Tensor& grad, const at::Tensor& self, c10::IntArrayRef kernel, c10::IntArrayRef stride,
                               c10::IntArrayRef padding, bool ceilMode, bool countIncludePad, c10::optional<int64_t> divisor) {
  if (reducedFloats({&grad, &self}))  // in f32 on the card, rounded once
    return python::avg_pool2d_backward(widened(grad, grad.scalar_type()), widened(self, self.scalar_type()), kernel, stride,
                                       padding, ceilMode, countIncludePad, divisor)
        .to(self.scalar_type());
  const auto w = Window2d::of(kernel, stride, padding, {});
  if (auto c = addedWindows(self, w, ceilMode, divisor); c && supported({&grad}) && grad.dim() == 4 &&
      grad.size(2) == c->outH(self.size(2)) && grad.size(3) == c->outW(self.size(3)))
    return ceiledAverageBackward(grad, self, *c, countIncludePad, divisor);
  if (avgOnCard(self, w, ceilMode, countIncludePad, divisor) && supported({&grad}))
    if (auto share = insideShare(self, kernel, stride, padding, w, countIncludePad, divisor))
      return at::avg_pool2d_backward(grad / *share, self, kernel, stride, padding, false, true, c10::nullopt);
  if (!avgOnCard(self, w, ceilMode, countIncludePad, divisor) || !supported({&grad}))
    return onHost("aten::avg_pool2d_backward", [&] {
      return at::avg_pool2d_backward(host(grad), host(self), kernel, stride, padding, ceilMode, countIncludePad, divisor)
          .to(self.device());
    });
  return readerSums(grad, windowTable(self.size(2), self.size(3), w, Table::outputs), self.sizes(),
                    float(1.0 / double(divisor.value_or(w.kh * w.kw))));
}
// Adaptive average pooling where the output divides the input: an average pool.
c10::optional<std::array<int64_t, 2>> adaptiveKernel(const at::Tensor& self, c10::IntArrayRef outSize) {
  if (self.dim() != 4 || outSize.size() != 2 || outSize[0] <= 0 || outSize[1] <= 0 || self.size(2) % outSize[0] ||
      self.size(3) % outSize[1])
    return c10::nullopt;
  return std::array<int64_t, 2>{self.size(2) / outSize[0], self.size(3) / outSize[1]};
}
// Other sizes: PyTorch's windows, output o of n over an input of `in` reading [o * in / n,
// ceil((o + 1) * in / n)), as index tables (built on the host once per geometry, kept):
//   sources: [K, OH * OW], the input positions of each output's window in row order, -1
//     past its size (K: the largest window's); paddedSources the same with H * W there;
//   readers: [H * W, R], the outputs whose windows read each input position, in order;
//   sizes: [OH, 1] and [1, OW] (f32), the windows' heights and widths.
std::pair<int64_t, int64_t> adaptiveSpan(int64_t o, int64_t in, int64_t n) { return {o * in / n, ((o + 1) * in + n - 1) / n}; }
enum class Adaptive { sources, readers, heights, widths, paddedSources };
at::Tensor buildAdaptiveTable(int64_t h, int64_t wd, int64_t oh, int64_t ow, Adaptive kind) {
  if (kind == Adaptive::heights || kind == Adaptive::widths) {
    const int64_t n = kind == Adaptive::heights ? oh : ow, in = kind == Adaptive::heights ? h : wd;
    std::vector<float> sizes;
    for (int64_t o = 0; o < n; ++o) sizes.push_back(float(adaptiveSpan(o, in, n).second - adaptiveSpan(o, in, n).first));
    return at::tensor(sizes, at::kFloat).reshape(kind == Adaptive::heights ? std::vector<int64_t>{n, 1} : std::vector<int64_t>{1, n});
  }
  std::vector<std::vector<int64_t>> windowsOf(oh * ow), readers(h * wd);
  for (int64_t o = 0; o < oh * ow; ++o) {
    auto [y0, y1] = adaptiveSpan(o / ow, h, oh);
    auto [x0, x1] = adaptiveSpan(o % ow, wd, ow);
    for (int64_t y = y0; y < y1; ++y)
      for (int64_t x = x0; x < x1; ++x) windowsOf[o].push_back(y * wd + x), readers[y * wd + x].push_back(o);
  }
  const bool sources = kind == Adaptive::sources || kind == Adaptive::paddedSources;
  auto& lists = sources ? windowsOf : readers;
  size_t picks = 1;
  for (auto& l : lists) picks = std::max(picks, l.size());
  auto table = at::full({int64_t(lists.size()), int64_t(picks)}, kind == Adaptive::paddedSources ? h * wd : -1, at::kLong);
  auto* t = table.data_ptr<int64_t>();
  for (size_t i = 0; i < lists.size(); ++i) std::copy(lists[i].begin(), lists[i].end(), t + i * picks);
  return sources ? table.t().contiguous() : table;  // sources: [K, OH * OW]
}
at::Tensor adaptiveTable(int64_t h, int64_t wd, int64_t oh, int64_t ow, Adaptive kind) {
  // (-1 where a window's stride would be: no window geometry has one)
  return cachedTable({h, wd, oh, ow, -1, -1, 0, 0, 0, 0, 0, 0, int64_t(kind)}, [&] { return buildAdaptiveTable(h, wd, oh, ow, kind); });
}
bool adaptiveOnCard(const at::Tensor& self, c10::IntArrayRef outSize) {
  return supported({&self}) && self.dim() == 4 && outSize.size() == 2 && outSize[0] > 0 && outSize[1] > 0 &&
         self.size(2) > 0 && self.size(3) > 0;
}
// Each window's sum in row order, then divided by its height and by its width (PyTorch's
// CPU kernel's sum / kh / kw, the same roundings).
at::Tensor adaptiveAverage(const at::Tensor& self, int64_t oh, int64_t ow) {
  const int64_t h = self.size(2), wd = self.size(3);
  auto out = windowSums(self, adaptiveTable(h, wd, oh, ow, Adaptive::sources), oh, ow, 1);
  return out.div_(adaptiveTable(h, wd, oh, ow, Adaptive::heights)).div_(adaptiveTable(h, wd, oh, ow, Adaptive::widths));
}
// Each input position's gradient: the sum, over the windows that read it in order, of
// their gradient / kh / kw.
at::Tensor adaptiveAverageBackward(const at::Tensor& grad, const at::Tensor& self) {
  const int64_t h = self.size(2), wd = self.size(3), oh = grad.size(2), ow = grad.size(3);
  auto shares = (grad / adaptiveTable(h, wd, oh, ow, Adaptive::heights)).div_(adaptiveTable(h, wd, oh, ow, Adaptive::widths));
  return readerSums(shares, adaptiveTable(h, wd, oh, ow, Adaptive::readers), self.sizes(), 1);
}
at::Tensor _adaptive_avg_pool2d(const at::Tensor& self, c10::SymIntArrayRef outputSize) {
#ifdef C10_AS_INTARRAYREF_SLOW
  auto size = C10_AS_INTARRAYREF_SLOW(outputSize);
#else
  auto size = c10::asIntArrayRefSlow(outputSize);
#endif
  if (reducedFloats({&self}))  // in f32 on the card, rounded once
    return at::_adaptive_avg_pool2d(widened(self, self.scalar_type()), size).to(self.scalar_type());
  if (!adaptiveOnCard(self, size))
    return onHost("aten::_adaptive_avg_pool2d", [&] { return at::_adaptive_avg_pool2d(host(self), size).to(self.device()); });
  if (auto k = adaptiveKernel(self, size)) return python::avg_pool2d(self, *k, *k, {0, 0}, false, true, c10::nullopt);
  return adaptiveAverage(self, size[0], size[1]);
}
at::Tensor _adaptive_avg_pool2d_backward(const at::Tensor& grad, const at::Tensor& self) {
  if (reducedFloats({&grad, &self}))  // in f32 on the card, rounded once
    return python::_adaptive_avg_pool2d_backward(widened(grad, grad.scalar_type()), widened(self, self.scalar_type()))
        .to(self.scalar_type());
  if (grad.dim() != 4 || !supported({&grad}) || !adaptiveOnCard(self, {grad.size(2), grad.size(3)}))
    return onHost("aten::_adaptive_avg_pool2d_backward",
                  [&] { return at::_adaptive_avg_pool2d_backward(host(grad), host(self)).to(self.device()); });
  if (auto k = adaptiveKernel(self, {grad.size(-2), grad.size(-1)}))
    return python::avg_pool2d_backward(grad, self, *k, *k, {0, 0}, false, true, c10::nullopt);
  return adaptiveAverageBackward(grad, self);
}

// adaptive_max_pool2d where every window is one size (the input a multiple of the output):
// max pooling with that window as kernel and stride. Other sizes: each output's window
// gathered from its plane by the padded sources table (-inf past a smaller window), its
// amax and argmax over the window, the argmax mapped back to the plane's position: a
// window's first largest value, as PyTorch's CPU kernel takes (a window holding several
// NaNs gives its first NaN's position where PyTorch gives its last; the value is NaN
// either way). The positions are noted in range. The backward adds the gradient at the
// positions picked, a scatter_add over each plane (which checks positions it was not
// given by the forward).
std::tuple<at::Tensor, at::Tensor> unevenAdaptiveMax(const at::Tensor& batched, int64_t oh, int64_t ow) {
  const int64_t planes = batched.size(0) * batched.size(1), h = batched.size(2), wd = batched.size(3);
  auto sources = adaptiveTable(h, wd, oh, ow, Adaptive::paddedSources);  // [K, OH * OW]
  const int64_t k = sources.size(0);
  auto padded = at::cat({batched.reshape({planes, h * wd}),
                         at::full({planes, 1}, -std::numeric_limits<float>::infinity(), batched.options())}, 1);
  at::Tensor windows;
  {
    TrustedIndices inRange;  // (the table's positions, and the one past the plane)
    windows = at::index_select(padded, 1, sources.reshape({-1})).view({planes, k, oh * ow});
  }
  auto values = at::amax(windows, {1});
  auto positions = at::gather(sources.unsqueeze(0).expand({planes, k, oh * ow}), 1, at::argmax(windows, 1).unsqueeze(1));
  const std::vector<int64_t> shape = {batched.size(0), batched.size(1), oh, ow};
  return {values.view(shape), positions.view(shape)};
}
std::tuple<at::Tensor, at::Tensor> adaptive_max_pool2d(const at::Tensor& self, at::IntArrayRef outSize) {
  const auto batched = self.dim() == 3 ? self.unsqueeze(0) : self;
  if (reducedFloats({&self})) {  // compared in f32: the same maxima, exactly
    auto [values, indices] = python::adaptive_max_pool2d(widened(self, self.scalar_type()), outSize);
    return {values.to(self.scalar_type()), indices};
  }
  const bool onCard = (self.dim() == 3 || self.dim() == 4) && adaptiveOnCard(batched, outSize);
  if (!onCard) {
    countFallback("aten::adaptive_max_pool2d");
    auto [values, indices] = at::adaptive_max_pool2d(host(self), outSize);
    return {values.to(self.device()), indices.to(self.device())};
  }
  const auto k = adaptiveKernel(batched, outSize);
  auto [values, indices] = k ? python::max_pool2d_with_indices(batched, *k, *k, {0, 0}, {1, 1}, false)
                             : unevenAdaptiveMax(batched, outSize[0], outSize[1]);
  notePositions(indices, batched.size(2) * batched.size(3));
  if (self.dim() == 3) return {values.squeeze(0), indices.squeeze(0)};
  return {values, indices};
}
// A max pool's gradient: each output's added at its flat index in its plane (the last
// `planeDims` dimensions of self), the rest 0.
at::Tensor gradientAtIndices(const at::Tensor& grad, const at::Tensor& self, const at::Tensor& indices, int64_t planeDims) {
  int64_t plane = 1;
  for (int64_t d = self.dim() - planeDims; d < self.dim(); ++d) plane *= self.size(d);
  const int64_t planes = plane ? self.numel() / plane : 0;
  auto gradInput = at::zeros({planes, plane}, self.options());
  gradInput.scatter_add_(1, indices.reshape({planes, -1}), grad.reshape({planes, -1}));
  return gradInput.view(self.sizes());
}
at::Tensor adaptive_max_pool2d_backward(const at::Tensor& grad, const at::Tensor& self, const at::Tensor& indices) {
  if (reducedFloats({&grad, &self}))  // in f32 on the card, rounded once
    return python::adaptive_max_pool2d_backward(widened(grad, grad.scalar_type()), widened(self, self.scalar_type()), indices)
        .to(self.scalar_type());
  if (!supported({&grad, &self}) || !typed(indices) || indices.scalar_type() != at::kLong || self.dim() < 3 ||
      grad.sizes() != indices.sizes())
    return onHost("aten::adaptive_max_pool2d_backward", [&] {
      return at::adaptive_max_pool2d_backward(host(grad), host(self), host(indices)).to(self.device());
    });
  return gradientAtIndices(grad, self, indices, 2);
}

// max_unpool2d: each value put at its index in a plane of zeros of output_size, where an
// index names a position twice the later value winning, as in PyTorch's CPU loop (the
// card's index_put_ keeps that order); an index outside the plane raises PyTorch's error.
// Its backward (PyTorch's formula) gathers the gradient at the indices.
at::Tensor& max_unpool2d_out(const at::Tensor& self, const at::Tensor& indices, c10::IntArrayRef outputSize, at::Tensor& out) {
  const bool ok = supported({&self, &out}) && (self.dim() == 3 || self.dim() == 4) && typed(indices) &&
                  indices.scalar_type() == at::kLong && indices.sizes().equals(self.sizes()) && outputSize.size() == 2 &&
                  outputSize[0] > 0 && outputSize[1] > 0;
  if (!ok) return hostInto("aten::max_unpool2d", out, at::max_unpool2d(host(self), host(indices), outputSize));
  const int64_t plane = outputSize[0] * outputSize[1], planes = self.numel() / std::max<int64_t>(self.size(-1) * self.size(-2), 1);
  auto sizes = self.sizes().vec();
  sizes[sizes.size() - 2] = outputSize[0], sizes.back() = outputSize[1];
  auto result = at::zeros({planes * plane}, self.options());
  if (self.numel() > 0) {
    checkIndex(indices, 0, plane - 1, std::nullopt, [&](int64_t v) {
      TORCH_CHECK(false, "Found an invalid max index: ", v, " (output volumes are of size ", outputSize[0], "x", outputSize[1]);
    });
    auto bases = (at::arange(planes, at::kLong) * plane).to(self.device()).view({planes, 1});
    auto flat = (indices.reshape({planes, -1}) + bases).reshape({-1});
    TrustedIndices inRange;  // (checked above, each plane's moved to its place)
    result.index_put_({flat}, self.reshape({-1}));
  }
  return resultInto(out, result.view(sizes));
}
at::Tensor max_unpool2d(const at::Tensor& self, const at::Tensor& indices, c10::IntArrayRef outputSize) {
  auto out = emptyOn({0});
  return python::max_unpool2d_out(self, indices, outputSize, out);
}

// ---- 3-D pooling as 2-D pooling, one per depth offset of the window ----------------------
//
// Max pooling: each depth offset's 2-D max pool over the depth slices it reads (a slab of
// -inf for the padding), combined in offset order as PyTorch's CPU scans a window (a later
// value replaces the kept one where larger or NaN), indices the flat d * H * W + h * W + w;
// its backward a scatter_add of the gradient at them. Average pooling: each offset's
// window sums over its slices, divided by the 3-D divisor (the window's size, padding
// counted, or the divisor given); its backward the 2-D reader sums added back at their
// depths. Max pooling's ceil_mode: the last depth windows that reach past the padding
// read the slab there, and each 2-D pool takes ceil_mode itself. Average pooling's
// ceil_mode, and padding left out of its count, run on the host.
struct Window3d {
  Depth z;
  Window2d w;
  bool ceil;
};
std::optional<Window3d> window3d(const at::Tensor& self, c10::IntArrayRef kernel, c10::IntArrayRef stride,
                                 c10::IntArrayRef padding, c10::IntArrayRef dilation, bool ceilMode) {
  const auto pick = windowValue;
  if (!supported({&self}) || self.dim() != 5 || kernel.empty() || kernel.size() > 3 || stride.size() > 3 ||
      padding.size() > 3 || dilation.size() > 3 || self.numel() == 0)
    return std::nullopt;
  const int64_t k = pick(kernel, 0, 1), s = pick(stride, 0, k), p = pick(padding, 0, 0), d = pick(dilation, 0, 1);
  constexpr int64_t kMax = Window2d::kMax;  // (beyond, the host's checks and arithmetic)
  if (k < 1 || k > kMax || s < 1 || s > kMax || d < 1 || d > kMax || p < 0 || p > k || 2 * p > k) return std::nullopt;
  Window3d w{Depth::of(k, s, p, d, self.size(2), ceilMode), {}, ceilMode};
  const std::vector<int64_t> k2 = {pick(kernel, 1, 1), pick(kernel, 2, 1)};
  const std::vector<int64_t> s2 = {pick(stride, 1, k2[0]), pick(stride, 2, k2[1])};
  w.w = Window2d::of(k2, s2, {pick(padding, 1, 0), pick(padding, 2, 0)}, {pick(dilation, 1, 1), pick(dilation, 2, 1)});
  if (!w.w.sane() || 2 * w.w.ph > w.w.kh || 2 * w.w.pw > w.w.kw) return std::nullopt;
  if (w.z.out < 1 || w.w.outH(self.size(3)) < 1 || w.w.outW(self.size(4)) < 1) return std::nullopt;
  return w;
}
std::vector<int64_t> kernelOf(const Window2d& w) { return {w.kh, w.kw}; }
std::vector<int64_t> strideOf(const Window2d& w) { return {w.sh, w.sw}; }
std::vector<int64_t> paddingOf(const Window2d& w) { return {w.ph, w.pw}; }
std::tuple<at::Tensor, at::Tensor> max_pool3d_with_indices(const at::Tensor& self, c10::IntArrayRef kernel, c10::IntArrayRef stride,
                                                           c10::IntArrayRef padding, c10::IntArrayRef dilation, bool ceilMode) {
  auto w = window3d(self, kernel, stride, padding, dilation, ceilMode);
  if (!w) {
    countFallback("aten::max_pool3d_with_indices");
    auto [out, indices] = at::max_pool3d_with_indices(host(self), kernel, stride, padding, dilation, ceilMode);
    return {out.to(self.device()), indices.to(self.device())};
  }
  const int64_t n = self.size(0), plane = self.size(3) * self.size(4);
  auto padded = withSlab(self, -INFINITY);
  at::Tensor best, bestIndex;
  for (int64_t kd = 0; kd < w->z.k; ++kd) {
    auto picks = depthPicks(w->z, kd, self);
    auto [v, i] = python::max_pool2d_with_indices(depthSlices(padded, picks), kernelOf(w->w), strideOf(w->w), paddingOf(w->w),
                                                  {w->w.dh, w->w.dw}, ceilMode);
    auto index = depthSlicesAsPlanes(i, n) + picks.view({1, 1, -1, 1, 1}) * plane;
    auto value = depthSlicesAsPlanes(v, n);
    if (!best.defined()) {
      best = value.contiguous(), bestIndex = index.contiguous();
      continue;
    }
    auto later = (value > best) | (value != value);
    best = at::where(later, value, best), bestIndex = at::where(later, index, bestIndex);
  }
  notePositions(bestIndex, self.size(2) * plane);
  return {best, bestIndex};
}
at::Tensor max_pool3d_with_indices_backward(const at::Tensor& grad, const at::Tensor& self, c10::IntArrayRef kernel,
                                            c10::IntArrayRef stride, c10::IntArrayRef padding, c10::IntArrayRef dilation,
                                            bool ceilMode, const at::Tensor& indices) {
  if (!window3d(self, kernel, stride, padding, dilation, ceilMode) || !supported({&grad}) || !typed(indices) ||
      indices.scalar_type() != at::kLong || !grad.sizes().equals(indices.sizes()) || grad.dim() != 5)
    return onHost("aten::max_pool3d_with_indices_backward", [&] {
      return at::max_pool3d_with_indices_backward(host(grad), host(self), kernel, stride, padding, dilation, ceilMode,
                                                  host(indices)).to(self.device());
    });
  return gradientAtIndices(grad, self, indices, 3);
}
bool avg3dOnCard(const std::optional<Window3d>& w, bool countIncludePad, c10::optional<int64_t> divisor) {
  return w && !w->ceil && w->w.dh == 1 && w->w.dw == 1 && w->z.d == 1 && (!divisor || *divisor != 0) &&
         (countIncludePad || divisor || (w->z.p == 0 && w->w.ph == 0 && w->w.pw == 0));
}
float avg3dScale(const Window3d& w, c10::optional<int64_t> divisor) {
  return float(1.0 / double(divisor.value_or(w.z.k * w.w.kh * w.w.kw)));
}
at::Tensor avg_pool3d(const at::Tensor& self, c10::IntArrayRef kernel, c10::IntArrayRef stride, c10::IntArrayRef padding,
                      bool ceilMode, bool countIncludePad, c10::optional<int64_t> divisor) {
  auto w = window3d(self, kernel, stride, padding, {}, ceilMode);
  if (!avg3dOnCard(w, countIncludePad, divisor))
    return onHost("aten::avg_pool3d", [&] {
      return at::avg_pool3d(host(self), kernel, stride, padding, ceilMode, countIncludePad, divisor).to(self.device());
    });
  const int64_t h = self.size(3), wd = self.size(4);
  auto sources = windowTable(h, wd, w->w, Table::sources);
  auto padded = withSlab(self, 0);
  at::Tensor sum;
  for (int64_t kd = 0; kd < w->z.k; ++kd) {
    auto part = windowSums(depthSlices(padded, depthPicks(w->z, kd, self)), sources, w->w.outH(h), w->w.outW(wd),
                           avg3dScale(*w, divisor));
    sum = sum.defined() ? sum.add_(part) : part;
  }
  return fromDepthSlices(sum, self.size(0));
}
at::Tensor avg_pool3d_backward(const at::Tensor& grad, const at::Tensor& self, c10::IntArrayRef kernel, c10::IntArrayRef stride,
                               c10::IntArrayRef padding, bool ceilMode, bool countIncludePad, c10::optional<int64_t> divisor) {
  auto w = window3d(self, kernel, stride, padding, {}, ceilMode);
  if (!avg3dOnCard(w, countIncludePad, divisor) || !supported({&grad}) || grad.dim() != 5 || grad.size(2) != w->z.out)
    return onHost("aten::avg_pool3d_backward", [&] {
      return at::avg_pool3d_backward(host(grad), host(self), kernel, stride, padding, ceilMode, countIncludePad, divisor)
          .to(self.device());
    });
  const int64_t n = self.size(0), c = self.size(1), h = self.size(3), wd = self.size(4);
  auto readers = windowTable(h, wd, w->w, Table::outputs);
  auto g = asDepthSlices(grad);
  auto gradPadded = at::zeros({n, c, self.size(2) + 1, h, wd}, self.options());
  // Every depth offset's slices take the same share of the gradient, added at its depths.
  auto share = depthSlicesAsPlanes(readerSums(g, readers, {n * w->z.out, c, h, wd}, avg3dScale(*w, divisor)), n);
  TrustedIndices inRange;  // (depthPicks: in [0, D])
  for (int64_t kd = 0; kd < w->z.k; ++kd) gradPadded.index_add_(2, depthPicks(w->z, kd, self), share);
  return gradPadded.narrow(2, 0, self.size(2)).contiguous();
}
// Adaptive average pooling whose windows are all one size (the input a multiple of the
// output): average pooling by that window.
std::optional<std::vector<int64_t>> evenWindows3d(const at::Tensor& self, c10::IntArrayRef out) {
  if (self.dim() != 5 || out.size() != 3) return std::nullopt;
  std::vector<int64_t> k;
  for (int i = 0; i < 3; ++i) {
    if (out[i] <= 0 || self.size(2 + i) % out[i] != 0) return std::nullopt;
    k.push_back(self.size(2 + i) / out[i]);
  }
  return k;
}
at::Tensor adaptive_avg_pool3d(const at::Tensor& self, c10::IntArrayRef outputSize) {
  auto k = evenWindows3d(self, outputSize);
  if (!k || !supported({&self}))
    return onHost("aten::_adaptive_avg_pool3d", [&] { return at::_adaptive_avg_pool3d(host(self), outputSize).to(self.device()); });
  return python::avg_pool3d(self, *k, *k, {0, 0, 0}, false, true, c10::nullopt);
}
at::Tensor adaptive_avg_pool3d_backward(const at::Tensor& grad, const at::Tensor& self) {
  auto k = grad.dim() == 5 ? evenWindows3d(self, grad.sizes().slice(2)) : std::nullopt;
  if (!k || !supported({&self, &grad}))
    return onHost("aten::_adaptive_avg_pool3d_backward",
                  [&] { return at::_adaptive_avg_pool3d_backward(host(grad), host(self)).to(self.device()); });
  return python::avg_pool3d_backward(grad, self, *k, *k, {0, 0, 0}, false, true, c10::nullopt);
}

}  // namespace

// Pooling, 2-D and 3-D.
void registerPooling(torch::Library& m) {
  m.impl("max_unpool2d.out", TORCH_FN(max_unpool2d_out));
  m.impl("max_unpool2d", TORCH_FN(python::max_unpool2d));
  m.impl("max_pool3d_with_indices", TORCH_FN(python::max_pool3d_with_indices));
  m.impl("max_pool3d_with_indices_backward", TORCH_FN(python::max_pool3d_with_indices_backward));
  m.impl("avg_pool3d", TORCH_FN(python::avg_pool3d));
  m.impl("avg_pool3d_backward", TORCH_FN(python::avg_pool3d_backward));
  m.impl("_adaptive_avg_pool3d", TORCH_FN(python::adaptive_avg_pool3d));
  m.impl("_adaptive_avg_pool3d_backward", TORCH_FN(python::adaptive_avg_pool3d_backward));
  m.impl("max_pool2d_with_indices", TORCH_FN(max_pool2d_with_indices));
  m.impl("adaptive_max_pool2d", TORCH_FN(python::adaptive_max_pool2d));
  m.impl("adaptive_max_pool2d_backward", TORCH_FN(python::adaptive_max_pool2d_backward));
  m.impl("max_pool2d_with_indices_backward", TORCH_FN(max_pool2d_with_indices_backward));
  m.impl("avg_pool2d", TORCH_FN(python::avg_pool2d));
  m.impl("avg_pool2d_backward", TORCH_FN(avg_pool2d_backward));
  m.impl("_adaptive_avg_pool2d", TORCH_FN(_adaptive_avg_pool2d));
  m.impl("_adaptive_avg_pool2d_backward", TORCH_FN(_adaptive_avg_pool2d_backward));
}

}  // namespace raccel::python
