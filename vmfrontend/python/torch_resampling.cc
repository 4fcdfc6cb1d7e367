// The torch device's resampling: upsampling (every mode of interpolate but area, which is
// adaptive average pooling) and sampling at a grid's points (grid_sample), with their backwards.
#include <ATen/native/UpSample.h>

#include "vmfrontend/python/torch_device.h"

namespace raccel::python {

namespace {

// ---- Upsampling ------------------------------------------------------------------------

// Every mode of interpolate over 1, 2 or 3 spatial dimensions (nearest, nearest-exact,
// linear, bilinear, bicubic, trilinear; either align_corners, with or without scales),
// one axis at a time, the last first: each output position the sum over its taps of the
// input at a tap's index times its weight (one tap of weight 1 for nearest: a pick
// alone; two linear; four bicubic). The taps are PyTorch's CPU kernel's in float:
// nearest_idx and nearest_exact_idx (floor(o * in / out), floor((o + 0.5) * in / out),
// held below the input's size), area_pixel_compute_scale and _source_index (the source
// index held at 0 for linear only), linear's index clamped and its neighbour kept
// inside, bicubic's four around floor(source) clamped to the edges and weighted by the
// cubic convolution (A = -0.75), in its order of products and sums: ((x0 w0 + x1 w1) +
// x2 w2) + x3 w3 over columns, then the same over rows, to a few ulps (its compiled
// kernel may fuse them). The backward adds each output's weighted gradient back at every
// tap, the first axis first. Nearest by whole factors over one or two axes is the input
// expanded over the factors, one copy, and its backward each block's sum.
struct Taps {
  at::Tensor at, weights;  // [taps, out] each: the input's indices (i64) and their weights (f32, none for nearest), on the device
};
enum class Interpolation : int64_t { nearest = -1, linear = -2, nearestExact = -3, cubic = -4 };  // (tables' keys: no window has these sizes)
bool isNearest(Interpolation kind) { return kind == Interpolation::nearest || kind == Interpolation::nearestExact; }
int64_t tapsOf(Interpolation kind) { return kind == Interpolation::cubic ? 4 : kind == Interpolation::linear ? 2 : 1; }
using Scales = std::vector<c10::optional<double>>;  // one an axis

float axisStep(int64_t in, int64_t out, bool alignCorners, c10::optional<double> scale) {
  if (alignCorners) return out > 1 ? float(in - 1) / float(out - 1) : 0.0f;
  return scale && *scale > 0 ? float(1.0 / *scale) : float(in) / float(out);
}
float sourceIndex(float step, int64_t o, bool alignCorners) {
  return alignCorners ? step * float(o) : step * (float(o) + 0.5f) - 0.5f;
}
int64_t nearestIndex(int64_t o, int64_t in, int64_t out, c10::optional<double> scale, Interpolation kind) {
  if (kind == Interpolation::nearest && out == in) return o;
  if (kind == Interpolation::nearest && out == 2 * in) return o >> 1;
  const float step = axisStep(in, out, false, scale);
  const float src = kind == Interpolation::nearest ? float(o) * step : float((double(o) + 0.5) * double(step));
  return std::min(static_cast<int64_t>(std::floor(src)), in - 1);
}
// The cubic convolution's weights of the four inputs around a source index t past the
// second (ATen/native/UpSample.h, get_cubic_upsample_coefficients).
std::array<float, 4> cubicWeights(float t) {
  const float a = -0.75f;
  auto near = [&](float x) { return ((a + 2) * x - (a + 3)) * x * x + 1; };
  auto far = [&](float x) { return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a; };
  const float rest = 1.0f - t;
  return {far(t + 1.0f), near(t), near(rest), far(rest + 1.0f)};
}
at::Tensor buildTaps(int64_t in, int64_t out, bool alignCorners, c10::optional<double> scale, Interpolation kind,
                     bool weights) {
  const float step = axisStep(in, out, alignCorners, scale);
  const int64_t taps = tapsOf(kind);
  std::vector<int64_t> picks(taps * out);
  std::vector<float> lambda(taps * out, 1.0f);
  for (int64_t o = 0; o < out; ++o) {
    if (isNearest(kind)) {
      picks[o] = nearestIndex(o, in, out, scale, kind);
      continue;
    }
    float src = sourceIndex(step, o, alignCorners);
    if (kind == Interpolation::linear && src < 0) src = 0;
    const int64_t i = std::min(static_cast<int64_t>(std::floor(src)), in - 1);
    const float l = std::min(std::max(src - float(i), 0.0f), 1.0f);
    if (kind == Interpolation::linear) {
      picks[o] = i, picks[out + o] = i + (i < in - 1 ? 1 : 0);
      lambda[o] = 1.0f - l, lambda[out + o] = l;
      continue;
    }
    const auto w = cubicWeights(l);
    for (int64_t k = 0; k < 4; ++k) {
      picks[k * out + o] = std::clamp<int64_t>(i - 1 + k, 0, in - 1);
      lambda[k * out + o] = w[size_t(k)];
    }
  }
  return weights ? at::tensor(lambda, at::kFloat).reshape({taps, out}) : at::tensor(picks, at::kLong).reshape({taps, out});
}
Taps axisTaps(int64_t in, int64_t out, bool alignCorners, c10::optional<double> scale, Interpolation kind) {
  const int64_t scaleBits = scale ? std::bit_cast<int64_t>(*scale) : -1;
  auto table = [&](bool weights) {
    return cachedTable({in, out, int64_t(kind), int64_t(kind), alignCorners, scaleBits, weights, 0, 0, 0, 0, 0, 0},
                       [&] { return buildTaps(in, out, alignCorners, scale, kind, weights); });
  };
  return {table(false), isNearest(kind) ? at::Tensor() : table(true)};
}
// Whether `in` ([N, C, spatial...]) resamples to `out` (the spatial sizes) on the card.
bool resampledOnCard(c10::IntArrayRef in, c10::IntArrayRef out) {
  if (out.empty() || out.size() > 3 || in.size() != out.size() + 2) return false;
  for (size_t a = 0; a < out.size(); ++a)
    if (in[a + 2] <= 0 || out[a] <= 0) return false;
  return true;
}
// A tap's weights along `dim` of a tensor of `dims` dimensions.
at::Tensor alongDim(const at::Tensor& weights, int64_t dim, int64_t dims) {
  std::vector<int64_t> shape(size_t(dims - dim), 1);
  shape[0] = -1;
  return weights.reshape(shape);
}
// x's dimension `dim` resampled by `a`: the sum over the taps of x at a tap's index times
// its weight.
at::Tensor resampled(const at::Tensor& x, int64_t dim, const Taps& a) {
  TrustedIndices inRange;  // (the axis's positions)
  if (!a.weights.defined()) return at::index_select(x, dim, a.at[0]);
  auto out = at::index_select(x, dim, a.at[0]) * alongDim(a.weights[0], dim, x.dim());
  for (int64_t k = 1; k < a.at.size(0); ++k) out.addcmul_(at::index_select(x, dim, a.at[k]), alongDim(a.weights[k], dim, x.dim()));
  return out;
}
// The transpose: g's dimension `dim` added back into `size` positions at every tap.
at::Tensor unresampled(const at::Tensor& g, int64_t dim, int64_t size, const Taps& a) {
  auto sizes = g.sizes().vec();
  sizes[size_t(dim)] = size;
  auto out = at::zeros(sizes, g.options());
  TrustedIndices inRange;  // (the axis's positions)
  for (int64_t k = 0; k < a.at.size(0); ++k)
    out.index_add_(dim, a.at[k], a.weights.defined() ? g * alongDim(a.weights[k], dim, g.dim()) : g);
  return out;
}
// Nearest by whole factors over one or two axes (and scales, if given, that match them):
// the factors.
c10::optional<std::vector<int64_t>> wholeFactors(c10::IntArrayRef in, c10::IntArrayRef out, const Scales& scales,
                                                 Interpolation kind) {
  if (!isNearest(kind) || out.size() > 2) return c10::nullopt;
  std::vector<int64_t> f;
  for (size_t a = 0; a < out.size(); ++a) {
    if (out[a] % in[a + 2]) return c10::nullopt;
    f.push_back(out[a] / in[a + 2]);
    if (scales[a] && *scales[a] > 0 && *scales[a] != double(f.back())) return c10::nullopt;
  }
  return f;
}
// [N, C, s0, f0, s1, f1...]: each axis and its factor.
std::vector<int64_t> blocksOf(c10::IntArrayRef in, const std::vector<int64_t>& f, bool expanded) {
  std::vector<int64_t> shape = {in[0], in[1]};
  for (size_t a = 0; a < f.size(); ++a) shape.insert(shape.end(), {in[a + 2], expanded ? f[a] : 1});
  return shape;
}

// The upsampling of self to `size` (its checks passed) by its taps.
at::Tensor upsampled(const at::Tensor& self, c10::IntArrayRef size, bool alignCorners, const Scales& scales, Interpolation kind) {
  auto x = self;
  for (int64_t a = int64_t(size.size()) - 1; a >= 0; --a)
    x = resampled(x, a + 2, axisTaps(self.size(a + 2), size[size_t(a)], alignCorners, scales[size_t(a)], kind));
  return x;
}
at::Tensor upsampledBackward(const at::Tensor& grad, c10::IntArrayRef size, c10::IntArrayRef in, bool alignCorners,
                             const Scales& scales, Interpolation kind) {
  if (auto f = wholeFactors(in, size, scales, kind)) {
    std::vector<int64_t> summed;
    for (size_t a = 0; a < f->size(); ++a) summed.push_back(int64_t(3 + 2 * a));
    return grad.reshape(blocksOf(in, *f, true)).sum(summed);
  }
  auto g = grad;
  for (size_t a = 0; a < size.size(); ++a) g = unresampled(g, int64_t(a) + 2, in[a + 2], axisTaps(in[a + 2], size[a], alignCorners, scales[a], kind));
  return g;
}

// An upsampling op run on the host by `onHost` (PyTorch's own op through its _ops handle
// `Op`), into a CPU tensor of `like`'s type, and counted.
at::Tensor& onHostInto(const char* name, const at::Tensor& like, at::Tensor& out,
                       const std::function<void(at::Tensor&)>& onHost) {
  auto result = at::empty({0}, like.options().device(at::kCPU));
  onHost(result);
  return hostInto(name, out, result);
}
// An upsampling op's forward and backward, on the card where it can.
at::Tensor& upsampleInto(const char* name, const at::Tensor& self, c10::SymIntArrayRef outputSize, bool alignCorners,
                         const Scales& scales, Interpolation kind, at::Tensor& out, const std::function<void(at::Tensor&)>& onHost) {
  const auto size = c10::asIntArrayRefSlow(outputSize);
  if (reducedFloats({&self, &out}) && resampledOnCard(self.sizes(), size)) {  // in f32 on the card, rounded once
    auto wide = emptyOn({0});
    return resultInto(out, upsampleInto(name, widened(self, self.scalar_type()), outputSize, alignCorners, scales, kind, wide, onHost));
  }
  if (!supported({&self, &out}) || !resampledOnCard(self.sizes(), size)) return onHostInto(name, self, out, onHost);
  if (auto f = wholeFactors(self.sizes(), size, scales, kind)) {
    std::vector<int64_t> shape = {self.size(0), self.size(1)};
    shape.insert(shape.end(), size.begin(), size.end());
    at::native::resize_output(out, shape);
    if (out.is_contiguous()) {  // (else by its taps)
      const auto blocks = blocksOf(self.sizes(), *f, true);
      auto expanded = self.reshape(blocksOf(self.sizes(), *f, false)).expand(blocks);
      elementwise(TensorFn::copy, out.view(blocks), &expanded, nullptr);
      return out;
    }
  }
  return resultInto(out, upsampled(self, size, alignCorners, scales, kind));
}
at::Tensor& upsampleBackwardInto(const char* name, const at::Tensor& grad, c10::SymIntArrayRef outputSize,
                                 c10::SymIntArrayRef inputSize, bool alignCorners, const Scales& scales, Interpolation kind,
                                 at::Tensor& out, const std::function<void(at::Tensor&)>& onHost) {
  const auto size = c10::asIntArrayRefSlow(outputSize), in = c10::asIntArrayRefSlow(inputSize);
  bool fits = resampledOnCard(in, size) && grad.dim() == int64_t(in.size()) && grad.size(0) == in[0] && grad.size(1) == in[1];
  for (size_t a = 0; fits && a < size.size(); ++a) fits = grad.size(int64_t(a) + 2) == size[a];
  if (fits && reducedFloats({&grad, &out})) {  // in f32 on the card, rounded once
    auto wide = emptyOn({0});
    return resultInto(out, upsampleBackwardInto(name, widened(grad, grad.scalar_type()), outputSize, inputSize, alignCorners,
                                                scales, kind, wide, onHost));
  }
  if (!fits || !supported({&grad, &out})) return onHostInto(name, grad, out, onHost);
  at::native::resize_output(out, in);
  return out.copy_(upsampledBackward(grad, size, in, alignCorners, scales, kind));
}
// The registered forms: with align_corners (linear, bilinear, bicubic, trilinear) or
// without (nearest, nearest-exact), and a scale an axis.
template <class Op, Interpolation kind, class... Scale>
at::Tensor& interpolateOut(const at::Tensor& self, c10::SymIntArrayRef outputSize, bool alignCorners, Scale... scales,
                           at::Tensor& out) {
  return upsampleInto(Op::name, self, outputSize, alignCorners, {scales...}, kind, out,
                      [&](at::Tensor& r) { Op::call(host(self), outputSize, alignCorners, scales..., r); });
}
template <class Op, Interpolation kind, class... Scale>
at::Tensor& interpolateBackwardOut(const at::Tensor& grad, c10::SymIntArrayRef outputSize, c10::SymIntArrayRef inputSize,
                                   bool alignCorners, Scale... scales, at::Tensor& out) {
  return upsampleBackwardInto(Op::name, grad, outputSize, inputSize, alignCorners, {scales...}, kind, out,
                              [&](at::Tensor& r) { Op::call(host(grad), outputSize, inputSize, alignCorners, scales..., r); });
}
template <class Op, Interpolation kind, class... Scale>
at::Tensor& nearestOut(const at::Tensor& self, c10::SymIntArrayRef outputSize, Scale... scales, at::Tensor& out) {
  return upsampleInto(Op::name, self, outputSize, false, {scales...}, kind, out,
                      [&](at::Tensor& r) { Op::call(host(self), outputSize, scales..., r); });
}
template <class Op, Interpolation kind, class... Scale>
at::Tensor& nearestBackwardOut(const at::Tensor& grad, c10::SymIntArrayRef outputSize, c10::SymIntArrayRef inputSize,
                               Scale... scales, at::Tensor& out) {
  return upsampleBackwardInto(Op::name, grad, outputSize, inputSize, false, {scales...}, kind, out,
                              [&](at::Tensor& r) { Op::call(host(grad), outputSize, inputSize, scales..., r); });
}

// upsample_nearest3d.vec, _upsample_nearest_exact3d.vec and their backwards are kernels
// of their own in PyTorch 1.13 (the other .vec forms are made of the forms above): the
// sizes and scales of the form above, by PyTorch's own rules and checks.
struct VecForm {
  c10::SmallVector<int64_t, 3> size;
  c10::optional<double> d, h, w;
};
VecForm vecForm(c10::IntArrayRef in, at::OptionalSymIntArrayRef outputSize, c10::optional<at::ArrayRef<double>> scaleFactors) {
  using at::native::upsample::get_scale_value;
  const auto size = outputSize ? c10::make_optional(c10::asIntArrayRefSlow(*outputSize)) : c10::nullopt;
  return {at::native::upsample::compute_output_size(in, size, scaleFactors), get_scale_value(scaleFactors, 0),
          get_scale_value(scaleFactors, 1), get_scale_value(scaleFactors, 2)};
}
using Scale = c10::optional<double>;
template <class Op, Interpolation kind>
at::Tensor nearest3dVec(const at::Tensor& input, at::OptionalSymIntArrayRef outputSize,
                        c10::optional<at::ArrayRef<double>> scaleFactors) {
  const auto f = vecForm(input.sizes(), outputSize, scaleFactors);
  auto out = emptyOn({0}, input.scalar_type());
  return nearestOut<Op, kind, Scale, Scale, Scale>(input, c10::fromIntArrayRefKnownNonNegative(f.size), f.d, f.h, f.w, out);
}
template <class Op, Interpolation kind>
at::Tensor nearest3dBackwardVec(const at::Tensor& grad, at::OptionalSymIntArrayRef outputSize, c10::SymIntArrayRef inputSize,
                                c10::optional<at::ArrayRef<double>> scaleFactors) {
  const auto f = vecForm(c10::asIntArrayRefSlow(inputSize), outputSize, scaleFactors);
  auto out = emptyOn({0}, grad.scalar_type());
  return nearestBackwardOut<Op, kind, Scale, Scale, Scale>(grad, c10::fromIntArrayRefKnownNonNegative(f.size), inputSize, f.d,
                                                            f.h, f.w, out);
}

// ---- Sampling at a grid's points (grid_sample) -----------------------------------------
//
// grid_sampler_2d as PyTorch's CPU computes it (its vectorized kernel), bilinear or
// nearest, with zeros, border or reflection padding: each grid point's coordinates
// unnormalized, (g + 1) * ((size - 1) / 2) with align_corners, else (g + 1) * (size / 2)
// - 0.5, for reflection folded by their mirror images into the plane (reflected), then
// held in [0, size - 1] but for zeros; the corners' values gathered from each plane (0
// outside it) and weighted by the distances to the opposite sides, summed in PyTorch's
// order. The backward scatters the upstream gradient times each weight into the input
// and sums over the channels the gradient of those weights for the grid. Bicubic runs on
// the host.
enum class GridPadding : int64_t { zeros, border, reflection };  // (PyTorch's numbers)
struct GridSample {
  int64_t n, c, h, w, points;  // points: the grid's Ho * Wo
  bool bilinear;
  GridPadding padding;
  bool alignCorners;
};
std::optional<GridSample> gridSample(const at::Tensor& input, const at::Tensor& grid, int64_t interpolation, int64_t padding,
                                     bool alignCorners) {
  if (!supported({&input, &grid}) || input.dim() != 4 || grid.dim() != 4 || grid.size(3) != 2 || grid.size(0) != input.size(0) ||
      interpolation > 1 || interpolation < 0 || padding > 2 || padding < 0 || input.numel() == 0 || grid.numel() == 0 ||
      input.size(2) * input.size(3) > (int64_t{1} << 24))
    return std::nullopt;
  return GridSample{input.size(0), input.size(1), input.size(2), input.size(3), grid.size(1) * grid.size(2), interpolation == 0,
                    GridPadding(padding), alignCorners};
}
// PyTorch's reflect_coordinates(_get_grad): x folded into [low, low + span] by its mirror
// images about both ends (low 0 and span size - 1 with align_corners, else -0.5 and
// size; with align_corners and one position, 0), and the slope times d(folded)/d(x), +-1.
std::pair<at::Tensor, at::Tensor> reflected(const at::Tensor& x, const at::Tensor& slope, int64_t size, bool alignCorners) {
  if (alignCorners && size <= 1) return {at::zeros_like(x), at::zeros_like(x)};
  const double low = alignCorners ? 0.0 : -0.5;
  const float twiceSpan = alignCorners ? static_cast<float>(size - 1) * 2 : static_cast<float>(size) * 2;
  auto shifted = x - low;
  auto distance = shifted.abs();
  auto extra = distance - (distance / twiceSpan).trunc_() * twiceSpan;
  auto mirrored = twiceSpan - extra;
  auto flip = extra > mirrored;
  auto folded = at::where(flip, mirrored, extra) + low;
  auto flipped = at::where(flip, -slope, slope);
  return {folded, at::where(shifted < 0, -flipped, flipped)};
}
// One axis of the grid unnormalized (folded, for reflection; held, but for zeros), with
// d(coordinate)/d(grid).
std::pair<at::Tensor, at::Tensor> unnormalized(const at::Tensor& g, int64_t size, const GridSample& s) {
  const float scale = s.alignCorners ? static_cast<float>(size - 1) / 2 : static_cast<float>(size) / 2;
  auto x = (g + 1) * scale;
  if (!s.alignCorners) x = x - 0.5;
  auto slope = at::full({}, scale, g.options()).expand(x.sizes());
  if (s.padding == GridPadding::zeros) return {x, slope};
  if (s.padding == GridPadding::reflection) std::tie(x, slope) = reflected(x, slope, size, s.alignCorners);
  const double last = static_cast<double>(size - 1);
  auto held = at::where(x < 0, at::zeros({}, x.options()), at::where(x > last, at::full({}, last, x.options()), x));
  return {held, at::where((x > 0) & (x < last), slope, at::zeros({}, x.options()))};
}
// The corners of each point: its plane positions (i64, 0 where outside), whether each
// lies inside, and its weight; [N, 1, P] each, over the channels by broadcast.
struct Corner {
  at::Tensor flat, inside, weight;
};
struct Corners {
  std::vector<Corner> corners;           // nw, ne, sw, se (bilinear) or the nearest one
  at::Tensor e, w, s, n, slopeX, slopeY;  // the distances (bilinear) and d(x)/d(grid x), d(y)/d(grid y)
};
Corner cornerAt(const at::Tensor& x, const at::Tensor& y, const at::Tensor& weight, const GridSample& s) {
  auto inside = (x >= 0) & (x <= static_cast<double>(s.w - 1)) & (y >= 0) & (y <= static_cast<double>(s.h - 1));
  auto flat = at::where(inside, y * static_cast<float>(s.w) + x, at::zeros({}, x.options())).to(at::kLong);
  notePositions(flat, s.h * s.w);
  return {flat, inside, weight};
}
Corners cornersOf(const at::Tensor& grid, const GridSample& s) {
  auto points = grid.reshape({s.n, 1, s.points, 2});
  auto [x, slopeX] = unnormalized(points.select(3, 0), s.w, s);
  auto [y, slopeY] = unnormalized(points.select(3, 1), s.h, s);
  Corners k;
  k.slopeX = slopeX, k.slopeY = slopeY;
  if (!s.bilinear) {
    k.corners = {cornerAt(at::round(x), at::round(y), at::ones({}, x.options()), s)};
    return k;
  }
  auto west = at::floor(x), north = at::floor(y);
  k.w = x - west, k.e = 1 - k.w, k.n = y - north, k.s = 1 - k.n;
  auto east = west + 1, south = north + 1;
  k.corners = {cornerAt(west, north, k.s * k.e, s), cornerAt(east, north, k.s * k.w, s), cornerAt(west, south, k.n * k.e, s),
               cornerAt(east, south, k.n * k.w, s)};
  return k;
}
// Each corner's values, [N, C, P] (0 outside the plane).
at::Tensor cornerValues(const at::Tensor& planes, const Corner& k, const GridSample& s) {
  TrustedIndices inRange;  // (made in [0, H * W) above)
  auto values = planes.gather(2, k.flat.expand({s.n, s.c, s.points}));
  return at::where(k.inside, values, at::zeros({}, values.options()));
}
at::Tensor grid_sampler_2d(const at::Tensor& input, const at::Tensor& grid, int64_t interpolation, int64_t padding,
                           bool alignCorners) {
  auto s = gridSample(input, grid, interpolation, padding, alignCorners);
  if (!s)
    return onHost("aten::grid_sampler_2d", [&] {
      return at::grid_sampler_2d(host(input), host(grid), interpolation, padding, alignCorners).to(input.device());
    });
  auto k = cornersOf(grid, *s);
  auto planes = input.reshape({s->n, s->c, s->h * s->w});
  at::Tensor out;
  for (auto& corner : k.corners) {
    auto term = cornerValues(planes, corner, *s) * corner.weight;
    out = out.defined() ? out + term : term;
  }
  return out.view({s->n, s->c, grid.size(1), grid.size(2)});
}
std::tuple<at::Tensor, at::Tensor> grid_sampler_2d_backward(const at::Tensor& grad, const at::Tensor& input, const at::Tensor& grid,
                                                            int64_t interpolation, int64_t padding, bool alignCorners,
                                                            std::array<bool, 2> outputMask) {
  auto s = gridSample(input, grid, interpolation, padding, alignCorners);
  if (!s || !isF32(grad) || grad.sizes() != at::IntArrayRef{input.size(0), input.size(1), grid.size(1), grid.size(2)})
    return onHost("aten::grid_sampler_2d_backward", [&] {
      auto [gi, gg] = at::grid_sampler_2d_backward(host(grad), host(input), host(grid), interpolation, padding, alignCorners,
                                                   outputMask);
      return std::make_tuple(gi.defined() ? gi.to(input.device()) : gi, gg.defined() ? gg.to(input.device()) : gg);
    });
  auto k = cornersOf(grid, *s);
  auto g = grad.reshape({s->n, s->c, s->points});
  at::Tensor gradInput;
  if (outputMask[0]) {
    auto planes = emptyOn({s->n, s->c, s->h * s->w}).zero_();
    TrustedIndices inRange;
    for (auto& corner : k.corners)
      planes.scatter_add_(2, corner.flat.expand(g.sizes()),
                          at::where(corner.inside, g * corner.weight, at::zeros({}, g.options())));
    gradInput = planes.view(input.sizes());
  }
  auto gradGrid = emptyOn(grid.sizes()).zero_();
  if (outputMask[1] && s->bilinear) {
    auto planes = input.reshape({s->n, s->c, s->h * s->w});
    std::vector<at::Tensor> v;
    for (auto& corner : k.corners) v.push_back(cornerValues(planes, corner, *s));
    auto gx = (((v[1] - v[0]) * k.s + (v[3] - v[2]) * k.n) * g).sum(1) * k.slopeX.squeeze(1);
    auto gy = (((v[2] - v[0]) * k.e + (v[3] - v[1]) * k.w) * g).sum(1) * k.slopeY.squeeze(1);
    gradGrid.copy_(at::stack({gx, gy}, 2).view(grid.sizes()));
  }
  return {gradInput, gradGrid};
}

}  // namespace

// Upsampling and grid sampling.
void registerResampling(torch::Library& m) {
  m.impl("grid_sampler_2d", TORCH_FN(python::grid_sampler_2d));
  m.impl("grid_sampler_2d_backward", TORCH_FN(python::grid_sampler_2d_backward));
  using S = Scale;
  using N = Interpolation;
  namespace ops = at::_ops;
  m.impl("upsample_nearest1d.out", TORCH_FN((nearestOut<ops::upsample_nearest1d_out, N::nearest, S>)));
  m.impl("upsample_nearest2d.out", TORCH_FN((nearestOut<ops::upsample_nearest2d_out, N::nearest, S, S>)));
  m.impl("upsample_nearest3d.out", TORCH_FN((nearestOut<ops::upsample_nearest3d_out, N::nearest, S, S, S>)));
  m.impl("_upsample_nearest_exact1d.out", TORCH_FN((nearestOut<ops::_upsample_nearest_exact1d_out, N::nearestExact, S>)));
  m.impl("_upsample_nearest_exact2d.out", TORCH_FN((nearestOut<ops::_upsample_nearest_exact2d_out, N::nearestExact, S, S>)));
  m.impl("_upsample_nearest_exact3d.out",
         TORCH_FN((nearestOut<ops::_upsample_nearest_exact3d_out, N::nearestExact, S, S, S>)));
  m.impl("upsample_nearest1d_backward.grad_input",
         TORCH_FN((nearestBackwardOut<ops::upsample_nearest1d_backward_grad_input, N::nearest, S>)));
  m.impl("upsample_nearest2d_backward.grad_input",
         TORCH_FN((nearestBackwardOut<ops::upsample_nearest2d_backward_grad_input, N::nearest, S, S>)));
  m.impl("upsample_nearest3d_backward.grad_input",
         TORCH_FN((nearestBackwardOut<ops::upsample_nearest3d_backward_grad_input, N::nearest, S, S, S>)));
  m.impl("_upsample_nearest_exact1d_backward.grad_input",
         TORCH_FN((nearestBackwardOut<ops::_upsample_nearest_exact1d_backward_grad_input, N::nearestExact, S>)));
  m.impl("_upsample_nearest_exact2d_backward.grad_input",
         TORCH_FN((nearestBackwardOut<ops::_upsample_nearest_exact2d_backward_grad_input, N::nearestExact, S, S>)));
  m.impl("_upsample_nearest_exact3d_backward.grad_input",
         TORCH_FN((nearestBackwardOut<ops::_upsample_nearest_exact3d_backward_grad_input, N::nearestExact, S, S, S>)));
  m.impl("upsample_nearest3d.vec", TORCH_FN((nearest3dVec<ops::upsample_nearest3d_out, N::nearest>)));
  m.impl("_upsample_nearest_exact3d.vec", TORCH_FN((nearest3dVec<ops::_upsample_nearest_exact3d_out, N::nearestExact>)));
  m.impl("upsample_nearest3d_backward.vec",
         TORCH_FN((nearest3dBackwardVec<ops::upsample_nearest3d_backward_grad_input, N::nearest>)));
  m.impl("_upsample_nearest_exact3d_backward.vec",
         TORCH_FN((nearest3dBackwardVec<ops::_upsample_nearest_exact3d_backward_grad_input, N::nearestExact>)));
  m.impl("upsample_linear1d.out", TORCH_FN((interpolateOut<ops::upsample_linear1d_out, N::linear, S>)));
  m.impl("upsample_bilinear2d.out", TORCH_FN((interpolateOut<ops::upsample_bilinear2d_out, N::linear, S, S>)));
  m.impl("upsample_bicubic2d.out", TORCH_FN((interpolateOut<ops::upsample_bicubic2d_out, N::cubic, S, S>)));
  m.impl("upsample_trilinear3d.out", TORCH_FN((interpolateOut<ops::upsample_trilinear3d_out, N::linear, S, S, S>)));
  m.impl("upsample_linear1d_backward.grad_input",
         TORCH_FN((interpolateBackwardOut<ops::upsample_linear1d_backward_grad_input, N::linear, S>)));
  m.impl("upsample_bilinear2d_backward.grad_input",
         TORCH_FN((interpolateBackwardOut<ops::upsample_bilinear2d_backward_grad_input, N::linear, S, S>)));
  m.impl("upsample_bicubic2d_backward.grad_input",
         TORCH_FN((interpolateBackwardOut<ops::upsample_bicubic2d_backward_grad_input, N::cubic, S, S>)));
  m.impl("upsample_trilinear3d_backward.grad_input",
         TORCH_FN((interpolateBackwardOut<ops::upsample_trilinear3d_backward_grad_input, N::linear, S, S, S>)));
}

}  // namespace raccel::python
