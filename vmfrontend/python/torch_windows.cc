// Sliding windows over [N, C, H, W] and their index tables, and depth slices of
// [N, C, D, H, W]: what convolutions and pools share (torch_device.h).
#include "vmfrontend/python/torch_device.h"

namespace raccel::python {

Window2d ceiled(Window2d w, const at::Tensor& self, bool ceilMode) {
  if (!ceilMode || self.dim() != 4 || !w.sane()) return w;
  auto extra = [](int64_t in, int64_t k, int64_t s, int64_t p, int64_t d) -> int64_t {
    const int64_t span = in + 2 * p - d * (k - 1) - 1;
    if (span < 0) return 0;
    int64_t out = (span + s - 1) / s + 1;
    if ((out - 1) * s >= in + p) --out;
    return std::max<int64_t>(0, (out - 1) * s + d * (k - 1) + 1 - (in + 2 * p));
  };
  w.eh = extra(self.size(2), w.kh, w.sh, w.ph, w.dh);
  w.ew = extra(self.size(3), w.kw, w.sw, w.pw, w.dw);
  return w;
}
at::Tensor padded(const at::Tensor& x, const Window2d& w, double value) {
  if (w.ph == 0 && w.pw == 0 && w.eh == 0 && w.ew == 0) return x.contiguous();
  auto out = at::full({x.size(0), x.size(1), x.size(2) + 2 * w.ph + w.eh, x.size(3) + 2 * w.pw + w.ew}, value, x.options());
  out.narrow(2, w.ph, x.size(2)).narrow(3, w.pw, x.size(3)).copy_(x);
  return out;
}
at::Tensor windows(const at::Tensor& p, const Window2d& w) {
  const int64_t oh = (p.size(2) - w.dh * (w.kh - 1) - 1) / w.sh + 1, ow = (p.size(3) - w.dw * (w.kw - 1) - 1) / w.sw + 1;
  return p.as_strided({p.size(0), p.size(1), oh, ow, w.kh, w.kw},
                      {p.stride(0), p.stride(1), w.sh * p.stride(2), w.sw * p.stride(3), w.dh * p.stride(2), w.dw * p.stride(3)});
}

namespace {

constexpr size_t kMaxTables = 64;  // geometries kept; past that the cache starts again

struct TableCache {
  std::mutex mu;
  std::map<std::array<int64_t, 13>, at::Tensor> tables;
};
TableCache& tableCache() {
  static auto* c = new TableCache;  // never destroyed, like the session's State
  return *c;
}

at::Tensor buildTable(int64_t h, int64_t wd, const Window2d& w, Table kind) {
  const int64_t oh = w.outH(h), ow = w.outW(wd), ohw = oh * ow, kk = w.kh * w.kw;
  std::vector<int64_t> sources(kk * ohw);
  std::vector<std::vector<int64_t>> readers(h * wd);
  for (int64_t e = 0; e < kk; ++e)
    for (int64_t o = 0; o < ohw; ++o) {
      const int64_t y = o / ow * w.sh - w.ph + e / w.kw * w.dh, x = o % ow * w.sw - w.pw + e % w.kw * w.dw;
      const int64_t at = y < 0 || y >= h || x < 0 || x >= wd ? -1 : y * wd + x;
      sources[e * ohw + o] = at;
      if (at >= 0) readers[at].push_back(kind == Table::outputs ? o : e * ohw + o);
    }
  if (kind == Table::sources) return at::tensor(sources, at::kLong).reshape({kk, ohw});
  size_t picks = 1;
  for (auto& r : readers) picks = std::max(picks, r.size());
  auto table = at::full({h * wd, int64_t(picks)}, -1, at::kLong);
  auto* t = table.data_ptr<int64_t>();
  for (size_t at = 0; at < readers.size(); ++at) std::copy(readers[at].begin(), readers[at].end(), t + at * picks);
  return table;
}
}  // namespace

at::Tensor cachedTable(const std::array<int64_t, 13>& key, const std::function<at::Tensor()>& build) {
  auto& cache = tableCache();
  std::lock_guard lock(cache.mu);  // taken before the session's lock (the copy below), never inside it
  if (auto found = cache.tables.find(key); found != cache.tables.end()) return found->second;
  if (cache.tables.size() >= kMaxTables) cache.tables.clear();
  auto table = build().to(c10::Device(kDevice, 0));
  cache.tables.emplace(key, table);
  return table;
}
at::Tensor windowTable(int64_t h, int64_t wd, const Window2d& w, Table kind) {
  return cachedTable({h, wd, w.kh, w.kw, w.sh, w.sw, w.ph, w.pw, w.dh, w.dw, w.eh, w.ew, int64_t(kind)},
                     [&] { return buildTable(h, wd, w, kind); });
}

void gatherSum(const at::Tensor& out, std::vector<int64_t> shape, c10::IntArrayRef outStrides, const at::Tensor& a,
               c10::IntArrayRef aStrides, const at::Tensor& index, c10::IntArrayRef indexStrides, float alpha, float beta) {
  Locked s;
  client::TensorOp op;
  op.fn = TensorFn::gatherSum;
  op.shape = shapeOf(shape);
  op.operands = {operand(out, outStrides), operand(a, aStrides), operand(index, indexStrides)};
  op.alpha = alpha, op.beta = beta;
  send(*s, op);
}
// The columns of x [N, C, H, W] (im2col): [C * KK, N * OH * OW], 0 where a window lies in
// the padding.

// ---- Depth (3-D convolution and pooling as 2-D ones per depth offset) ------------------

at::Tensor depthPicks(const Depth& z, int64_t kd, const at::Tensor& like) {
  auto at = at::arange(z.out, at::kLong) * z.s + (kd * z.d - z.p);
  return at::where((at >= 0) & (at < z.in), at, at::full({}, z.in, at::kLong)).to(like.device());
}
at::Tensor depthSlices(const at::Tensor& padded, const at::Tensor& picks) {
  TrustedIndices inRange;  // (depthPicks: in [0, D])
  return asDepthSlices(padded.index_select(2, picks));
}
at::Tensor asDepthSlices(const at::Tensor& t) {
  return t.permute({0, 2, 1, 3, 4}).reshape({-1, t.size(1), t.size(3), t.size(4)});
}
at::Tensor withSlab(const at::Tensor& input, double value) {
  return at::cat({input, at::full({input.size(0), input.size(1), 1, input.size(3), input.size(4)}, value, input.options())}, 2);
}
at::Tensor depthSlicesAsPlanes(const at::Tensor& t, int64_t n) {
  return t.view({n, t.size(0) / n, t.size(1), t.size(2), t.size(3)}).permute({0, 2, 1, 3, 4});
}
at::Tensor fromDepthSlices(const at::Tensor& t, int64_t n) { return depthSlicesAsPlanes(t, n).contiguous(); }

}  // namespace raccel::python
