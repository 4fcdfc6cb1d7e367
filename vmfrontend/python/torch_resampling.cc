// The torch device's resampling: upsampling (nearest, bilinear, bicubic) and sampling at a
// grid's points (grid_sample), with their backwards.
#include "vmfrontend/python/torch_device.h"

namespace raccel::python {

namespace {

// ---- Upsampling ------------------------------------------------------------------------

// Nearest upsampling by whole factors: each output element the input's at (row / fh,
// column / fw), which is PyTorch's floor(dst * in / out) there; the input expanded over
// the factors, one copy, and the backward each block's sum. Other sizes (and scales that
// do not match them) run on the host.
c10::optional<std::array<int64_t, 2>> nearestFactors(c10::IntArrayRef in, c10::IntArrayRef out, c10::optional<double> sh,
                                                     c10::optional<double> sw) {
  if (in.size() != 4 || out.size() != 2 || in[2] <= 0 || in[3] <= 0 || out[0] % in[2] || out[1] % in[3]) return c10::nullopt;
  const std::array<int64_t, 2> f = {out[0] / in[2], out[1] / in[3]};
  if (f[0] <= 0 || f[1] <= 0 || (sh && *sh > 0 && *sh != double(f[0])) || (sw && *sw > 0 && *sw != double(f[1]))) return c10::nullopt;
  return f;
}
at::Tensor& upsample_nearest2d_out(const at::Tensor& self, c10::SymIntArrayRef outputSize, c10::optional<double> sh,
                                   c10::optional<double> sw, at::Tensor& out) {
  const auto size = c10::asIntArrayRefSlow(outputSize);
  auto f = supported({&self, &out}) ? nearestFactors(self.sizes(), size, sh, sw) : c10::nullopt;
  if (!f) return hostInto("aten::upsample_nearest2d", out, at::upsample_nearest2d(host(self), size, sh, sw));
  const int64_t n = self.size(0), c = self.size(1), h = self.size(2), w = self.size(3);
  at::native::resize_output(out, {n, c, size[0], size[1]});
  auto blocks = self.reshape({n, c, h, 1, w, 1}).expand({n, c, h, (*f)[0], w, (*f)[1]});
  elementwise(TensorFn::copy, out.view({n, c, h, (*f)[0], w, (*f)[1]}), &blocks, nullptr);
  return out;
}
at::Tensor& upsample_nearest2d_backward_out(const at::Tensor& grad, c10::SymIntArrayRef outputSize, c10::SymIntArrayRef inputSize,
                                            c10::optional<double> sh, c10::optional<double> sw, at::Tensor& out) {
  const auto size = c10::asIntArrayRefSlow(outputSize), in = c10::asIntArrayRefSlow(inputSize);
  auto f = supported({&grad, &out}) && grad.is_contiguous() ? nearestFactors(in, size, sh, sw) : c10::nullopt;
  if (!f) return hostInto("aten::upsample_nearest2d_backward", out, at::upsample_nearest2d_backward(host(grad), size, in, sh, sw));
  at::native::resize_output(out, in);
  return at::sum_out(out, grad.view({in[0], in[1], in[2], (*f)[0], in[3], (*f)[1]}), {3, 5});
}

// Bilinear and bicubic upsampling (either align_corners, with or without scales), one
// axis at a time: each output column the sum over its taps of the input at a tap's index
// times its weight (two taps bilinear, four bicubic), then the same over rows. The taps
// are PyTorch's CPU kernel's in float: area_pixel_compute_scale and _source_index (the
// source index held at 0 for bilinear only), bilinear's index clamped and its neighbour
// kept inside, bicubic's four around floor(source) clamped to the edges and weighted by
// the cubic convolution (A = -0.75), in its order of products and sums: ((x0 w0 + x1 w1)
// + x2 w2) + x3 w3 over columns, then the same over rows, to a few ulps (its compiled
// kernel may fuse them). The backward adds each output's weighted gradient back at every
// tap, rows first.
struct Taps {
  at::Tensor at, weights;  // [taps, out] each: the input's indices (i64) and their weights (f32), on the device
};
enum class Interpolation : int64_t { linear = -2, cubic = -4 };  // (the table's key: no window has that stride)
float axisStep(int64_t in, int64_t out, bool alignCorners, c10::optional<double> scale) {
  if (alignCorners) return out > 1 ? float(in - 1) / float(out - 1) : 0.0f;
  return scale && *scale > 0 ? float(1.0 / *scale) : float(in) / float(out);
}
float sourceIndex(float step, int64_t o, bool alignCorners) {
  return alignCorners ? step * float(o) : step * (float(o) + 0.5f) - 0.5f;
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
  const int64_t taps = kind == Interpolation::cubic ? 4 : 2;
  std::vector<int64_t> picks(taps * out);
  std::vector<float> lambda(taps * out);
  for (int64_t o = 0; o < out; ++o) {
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
  return {table(false), table(true)};
}
bool resampledOnCard(c10::IntArrayRef in, c10::IntArrayRef out) {
  return in.size() == 4 && out.size() == 2 && in[2] > 0 && in[3] > 0 && out[0] > 0 && out[1] > 0;
}
// x's dimension `dim` resampled by `a`: the sum over the taps of x at a tap's index times
// its weight.
at::Tensor resampled(const at::Tensor& x, int64_t dim, const Taps& a) {
  auto shape = [&](const at::Tensor& l) { return dim == 2 ? l.reshape({-1, 1}) : l; };
  TrustedIndices inRange;  // (the axis's positions)
  auto out = at::index_select(x, dim, a.at[0]) * shape(a.weights[0]);
  for (int64_t k = 1; k < a.at.size(0); ++k) out.addcmul_(at::index_select(x, dim, a.at[k]), shape(a.weights[k]));
  return out;
}
// The transpose: g's dimension `dim` added back into `size` positions at every tap.
at::Tensor unresampled(const at::Tensor& g, int64_t dim, int64_t size, const Taps& a) {
  auto shape = [&](const at::Tensor& l) { return dim == 2 ? l.reshape({-1, 1}) : l; };
  auto sizes = g.sizes().vec();
  sizes[dim] = size;
  auto out = at::zeros(sizes, g.options());
  TrustedIndices inRange;  // (the axis's positions)
  for (int64_t k = 0; k < a.at.size(0); ++k) out.index_add_(dim, a.at[k], g * shape(a.weights[k]));
  return out;
}
// upsample_bilinear2d and upsample_bicubic2d, and their backwards.
template <Interpolation kind>
at::Tensor& upsample2d_out(const at::Tensor& self, c10::SymIntArrayRef outputSize, bool alignCorners, c10::optional<double> sh,
                           c10::optional<double> sw, at::Tensor& out) {
  const auto size = c10::asIntArrayRefSlow(outputSize);
  if (!supported({&self, &out}) || !resampledOnCard(self.sizes(), size)) {
    auto onHost = kind == Interpolation::cubic ? at::upsample_bicubic2d(host(self), size, alignCorners, sh, sw)
                                               : at::upsample_bilinear2d(host(self), size, alignCorners, sh, sw);
    return hostInto(kind == Interpolation::cubic ? "aten::upsample_bicubic2d" : "aten::upsample_bilinear2d", out, onHost);
  }
  auto columns = resampled(self, 3, axisTaps(self.size(3), size[1], alignCorners, sw, kind));
  auto result = resampled(columns, 2, axisTaps(self.size(2), size[0], alignCorners, sh, kind));
  return resultInto(out, result);
}
template <Interpolation kind>
at::Tensor& upsample2d_backward_out(const at::Tensor& grad, c10::SymIntArrayRef outputSize, c10::SymIntArrayRef inputSize,
                                    bool alignCorners, c10::optional<double> sh, c10::optional<double> sw, at::Tensor& out) {
  const auto size = c10::asIntArrayRefSlow(outputSize), in = c10::asIntArrayRefSlow(inputSize);
  if (!supported({&grad, &out}) || !resampledOnCard(in, size) || grad.dim() != 4 || grad.size(2) != size[0] ||
      grad.size(3) != size[1] || grad.size(0) != in[0] || grad.size(1) != in[1]) {
    auto onHost = kind == Interpolation::cubic
                      ? at::upsample_bicubic2d_backward(host(grad), size, in, alignCorners, sh, sw)
                      : at::upsample_bilinear2d_backward(host(grad), size, in, alignCorners, sh, sw);
    return hostInto(kind == Interpolation::cubic ? "aten::upsample_bicubic2d_backward" : "aten::upsample_bilinear2d_backward",
                    out, onHost);
  }
  auto rows = unresampled(grad, 2, in[2], axisTaps(in[2], size[0], alignCorners, sh, kind));
  auto result = unresampled(rows, 3, in[3], axisTaps(in[3], size[1], alignCorners, sw, kind));
  at::native::resize_output(out, in);
  return out.copy_(result);
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
  m.impl("upsample_nearest2d.out", TORCH_FN(upsample_nearest2d_out));
  m.impl("upsample_nearest2d_backward.grad_input", TORCH_FN(upsample_nearest2d_backward_out));
  m.impl("upsample_bilinear2d.out", TORCH_FN(upsample2d_out<Interpolation::linear>));
  m.impl("upsample_bilinear2d_backward.grad_input", TORCH_FN(upsample2d_backward_out<Interpolation::linear>));
  m.impl("upsample_bicubic2d.out", TORCH_FN(upsample2d_out<Interpolation::cubic>));
  m.impl("upsample_bicubic2d_backward.grad_input", TORCH_FN(upsample2d_backward_out<Interpolation::cubic>));
}

}  // namespace raccel::python
