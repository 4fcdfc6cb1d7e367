// The torch device's resampling: upsampling (nearest, bilinear) and sampling at a grid's
// points (grid_sample), with their backwards.
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

// Bilinear upsampling (either align_corners, with or without scales), one axis at a
// time: each output column the input's at i0 times l0 plus at i1 times l1, then the same
// over rows; PyTorch's CPU kernel's float indices and weights (area_pixel_compute_scale,
// area_pixel_compute_source_index, the index clamped and its neighbour kept inside) and
// its order of products, l0h (l0w x00 + l1w x01) + l1h (...), to a few ulps (its compiled
// kernel may fuse them). The backward adds each output's weighted gradient back at both
// indices, rows first.
struct LinearAxis {
  at::Tensor at, weights;  // [2, out] each: i0 and i1 (i64), l0 and l1 (f32), on the device
};
at::Tensor buildLinearAxis(int64_t in, int64_t out, bool alignCorners, c10::optional<double> scale, bool weights) {
  float step = 0;
  if (alignCorners) step = out > 1 ? float(in - 1) / float(out - 1) : 0.0f;
  else step = scale && *scale > 0 ? float(1.0 / *scale) : float(in) / float(out);
  std::vector<int64_t> picks(2 * out);
  std::vector<float> lambda(2 * out);
  for (int64_t o = 0; o < out; ++o) {
    float src = alignCorners ? step * float(o) : step * (float(o) + 0.5f) - 0.5f;
    if (!alignCorners && src < 0) src = 0;
    const int64_t i = std::min(static_cast<int64_t>(std::floor(src)), in - 1);
    const float l = std::min(std::max(src - float(i), 0.0f), 1.0f);
    picks[o] = i, picks[out + o] = i + (i < in - 1 ? 1 : 0);
    lambda[o] = 1.0f - l, lambda[out + o] = l;
  }
  return weights ? at::tensor(lambda, at::kFloat).reshape({2, out}) : at::tensor(picks, at::kLong).reshape({2, out});
}
LinearAxis linearAxis(int64_t in, int64_t out, bool alignCorners, c10::optional<double> scale) {
  const int64_t scaleBits = scale ? std::bit_cast<int64_t>(*scale) : -1;
  auto table = [&](bool weights) {
    return cachedTable({in, out, -2, -2, alignCorners, scaleBits, weights, 0, 0, 0, 0, 0, 0},  // (-2: no window has that stride)
                       [&] { return buildLinearAxis(in, out, alignCorners, scale, weights); });
  };
  return {table(false), table(true)};
}
bool bilinearOnCard(c10::IntArrayRef in, c10::IntArrayRef out) {
  return in.size() == 4 && out.size() == 2 && in[2] > 0 && in[3] > 0 && out[0] > 0 && out[1] > 0;
}
// x's dimension `dim` resampled by `a`: x at a's i0 times l0, plus x at i1 times l1.
at::Tensor resampled(const at::Tensor& x, int64_t dim, const LinearAxis& a) {
  auto shape = [&](const at::Tensor& l) { return dim == 2 ? l.reshape({-1, 1}) : l; };
  TrustedIndices inRange;  // (the axis's positions)
  auto out = at::index_select(x, dim, a.at[0]) * shape(a.weights[0]);
  return out.addcmul_(at::index_select(x, dim, a.at[1]), shape(a.weights[1]));
}
// The transpose: g's dimension `dim` added back into `size` positions at i0 and i1.
at::Tensor unresampled(const at::Tensor& g, int64_t dim, int64_t size, const LinearAxis& a) {
  auto shape = [&](const at::Tensor& l) { return dim == 2 ? l.reshape({-1, 1}) : l; };
  auto sizes = g.sizes().vec();
  sizes[dim] = size;
  auto out = at::zeros(sizes, g.options());
  TrustedIndices inRange;  // (the axis's positions)
  out.index_add_(dim, a.at[0], g * shape(a.weights[0]));
  return out.index_add_(dim, a.at[1], g * shape(a.weights[1]));
}
at::Tensor& upsample_bilinear2d_out(const at::Tensor& self, c10::SymIntArrayRef outputSize, bool alignCorners,
                                    c10::optional<double> sh, c10::optional<double> sw, at::Tensor& out) {
  const auto size = c10::asIntArrayRefSlow(outputSize);
  if (!supported({&self, &out}) || !bilinearOnCard(self.sizes(), size))
    return hostInto("aten::upsample_bilinear2d", out, at::upsample_bilinear2d(host(self), size, alignCorners, sh, sw));
  auto columns = resampled(self, 3, linearAxis(self.size(3), size[1], alignCorners, sw));
  auto result = resampled(columns, 2, linearAxis(self.size(2), size[0], alignCorners, sh));
  return resultInto(out, result);
}
at::Tensor& upsample_bilinear2d_backward_out(const at::Tensor& grad, c10::SymIntArrayRef outputSize, c10::SymIntArrayRef inputSize,
                                             bool alignCorners, c10::optional<double> sh, c10::optional<double> sw,
                                             at::Tensor& out) {
  const auto size = c10::asIntArrayRefSlow(outputSize), in = c10::asIntArrayRefSlow(inputSize);
  if (!supported({&grad, &out}) || !bilinearOnCard(in, size) || grad.dim() != 4 || grad.size(2) != size[0] ||
      grad.size(3) != size[1] || grad.size(0) != in[0] || grad.size(1) != in[1])
    return hostInto("aten::upsample_bilinear2d_backward", out,
                    at::upsample_bilinear2d_backward(host(grad), size, in, alignCorners, sh, sw));
  auto rows = unresampled(grad, 2, in[2], linearAxis(in[2], size[0], alignCorners, sh));
  auto result = unresampled(rows, 3, in[3], linearAxis(in[3], size[1], alignCorners, sw));
  at::native::resize_output(out, in);
  return out.copy_(result);
}

// ---- Sampling at a grid's points (grid_sample) -----------------------------------------
//
// grid_sampler_2d as PyTorch's CPU computes it (its vectorized kernel), bilinear or
// nearest, with zeros or border padding: each grid point's coordinates unnormalized,
// (g + 1) * ((size - 1) / 2) with align_corners, else (g + 1) * (size / 2) - 0.5, held
// in [0, size - 1] for border; the corners' values gathered from each plane (0 outside
// it) and weighted by the distances to the opposite sides, summed in PyTorch's order.
// The backward scatters the upstream gradient times each weight into the input and sums
// over the channels the gradient of those weights for the grid. Bicubic and reflection
// run on the host.
struct GridSample {
  int64_t n, c, h, w, points;  // points: the grid's Ho * Wo
  bool bilinear, border, alignCorners;
};
std::optional<GridSample> gridSample(const at::Tensor& input, const at::Tensor& grid, int64_t interpolation, int64_t padding,
                                     bool alignCorners) {
  if (!supported({&input, &grid}) || input.dim() != 4 || grid.dim() != 4 || grid.size(3) != 2 || grid.size(0) != input.size(0) ||
      interpolation > 1 || interpolation < 0 || padding > 1 || padding < 0 || input.numel() == 0 || grid.numel() == 0 ||
      input.size(2) * input.size(3) > (int64_t{1} << 24))
    return std::nullopt;
  return GridSample{input.size(0), input.size(1), input.size(2), input.size(3), grid.size(1) * grid.size(2), interpolation == 0,
                    padding == 1, alignCorners};
}
// One axis of the grid unnormalized (and held, for border), with d(coordinate)/d(grid).
std::pair<at::Tensor, at::Tensor> unnormalized(const at::Tensor& g, int64_t size, const GridSample& s) {
  const float scale = s.alignCorners ? static_cast<float>(size - 1) / 2 : static_cast<float>(size) / 2;
  auto x = (g + 1) * scale;
  if (!s.alignCorners) x = x - 0.5;
  auto slope = at::full({}, scale, g.options());
  if (!s.border) return {x, slope.expand(x.sizes())};
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
  m.impl("upsample_bilinear2d.out", TORCH_FN(upsample_bilinear2d_out));
  m.impl("upsample_bilinear2d_backward.grad_input", TORCH_FN(upsample_bilinear2d_backward_out));
}

}  // namespace raccel::python
