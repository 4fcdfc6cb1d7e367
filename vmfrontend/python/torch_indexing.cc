// The torch device's joining and indexing: cat, index_select, embeddings and their bags,
// gathers, scatters, index_add and index_fill, advanced indexing and its puts, masked
// selects.
#include "vmfrontend/python/torch_device.h"

namespace raccel::python {

namespace {

// ---- Joining ---------------------------------------------------------------------------

// Each tensor copied into its run of `out` along `dim` (1-d empty tensors skipped, as
// PyTorch does), converted to out's dtype: any of the storage types.
at::Tensor& cat_out(const at::ITensorListRef& tensors, int64_t dim, at::Tensor& out) {
  std::vector<at::Tensor> parts;
  for (const at::Tensor& t : tensors) parts.push_back(t);
  bool ok = stored(out);
  const at::Tensor* first = nullptr;
  for (auto& t : parts) {
    if (t.dim() == 1 && t.numel() == 0) continue;
    ok = ok && stored(t);  // (another dtype than out's converted by the copy)
    if (!first) first = &t;
  }
  if (!ok || !first) {
    std::vector<at::Tensor> onHostParts;
    for (auto& t : parts) onHostParts.push_back(host(t));
    return hostInto("aten::cat", out, at::cat(onHostParts, dim));
  }
  dim = c10::maybe_wrap_dim(dim, first->dim());
  auto shape = first->sizes().vec();
  shape[dim] = 0;
  for (auto& t : parts) {
    if (t.dim() == 1 && t.numel() == 0) continue;
    TORCH_CHECK(t.dim() == first->dim(), "raccel: cat of tensors of ", first->dim(), " and ", t.dim(), " dimensions");
    for (int64_t d = 0; d < t.dim(); ++d)
      TORCH_CHECK(d == dim || t.size(d) == first->size(d), "raccel: cat along ", dim, " of ", first->sizes(), " and ", t.sizes());
    shape[dim] += t.size(dim);
  }
  at::native::resize_output(out, shape);
  int64_t at = 0;
  for (auto& t : parts) {
    if (t.dim() == 1 && t.numel() == 0) continue;
    auto run = out.narrow(dim, at, t.size(dim));
    elementwise(TensorFn::copy, run, &t, nullptr);
    at += t.size(dim);
  }
  return out;
}
// PyTorch's result type: every input's dtype promoted (an i64 and an f32 give f32).
at::Tensor cat(const at::ITensorListRef& tensors, int64_t dim) {
  c10::optional<at::ScalarType> dtype;
  for (const at::Tensor& t : tensors) dtype = dtype ? at::promote_types(*dtype, t.scalar_type()) : t.scalar_type();
  auto out = emptyOn({0}, dtype.value_or(at::kFloat));
  return python::cat_out(tensors, dim, out);
}

// ---- Indexing and embeddings -----------------------------------------------------------

// out = self's entries at `index` along `dim` (index i64 on the device, one dimension), of
// any of the card's types (a pick moves an element's bits).
at::Tensor& index_select_out(const at::Tensor& self0, int64_t dim, const at::Tensor& index, at::Tensor& out) {
  const bool ok = stored(self0) && stored(out) && out.scalar_type() == self0.scalar_type() && typed(index) &&
                  index.scalar_type() == at::kLong && index.dim() <= 1;
  if (!ok) return hostInto("aten::index_select", out, at::index_select(host(self0), dim, host(index)));
  dim = c10::maybe_wrap_dim(dim, std::max<int64_t>(self0.dim(), 1));
  const at::Tensor self = self0.dim() == 0 ? self0.reshape({1}) : self0.contiguous();
  const int64_t rows = self.size(dim), picks = index.numel();
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < dim; ++d) outer *= self.size(d);
  for (int64_t d = dim + 1; d < self.dim(); ++d) inner *= self.size(d);
  auto shape = self.sizes().vec();
  shape[dim] = picks;
  at::native::resize_output(out, self0.dim() == 0 ? std::vector<int64_t>{} : shape);
  checkPicks(index, rows);
  auto flat = out.is_contiguous() ? out : emptyOn(out.sizes(), out.scalar_type());
  Locked s;
  client::TensorOp op;
  op.fn = TensorFn::indexSelect;
  op.shape = {uint64_t(outer), uint64_t(picks), uint64_t(inner), uint64_t(rows)};
  op.operands = {operand(flat, {picks * inner, inner, 1, 0}), operand(self, {rows * inner, 0, 1, inner}),
                 operand(index, {0, index.dim() ? index.stride(0) : 0, 0, 0})};
  send(*s, op);
  if (!flat.is_same(out)) out.copy_(flat);
  return out;
}
at::Tensor index_select(const at::Tensor& self, int64_t dim, const at::Tensor& index) {
  auto out = emptyOn({0}, self.scalar_type());
  return python::index_select_out(self, dim, index, out);
}

// Along `dim`, for the positions of src's shape (index of src's shape, or a view expanded
// to it; out's other dimensions at least src's, its other elements untouched), one op over
// the other dimensions, then the rows, then the positions: indexAdd (out[.., index[.., i,
// ..], ..] = beta * out + alpha * src[.., i, ..] summed over i; an index equal to `padding`
// adds nothing) or indexReduce (alpha the reduction, beta whether out's own value is in
// it). An index outside out's rows adds nothing. src must not share out's storage.
void atIndex(TensorFn fn, const at::Tensor& out, int64_t dim, const at::Tensor& index, const at::Tensor& src, float alpha,
             float beta, int64_t padding = -1) {
  std::vector<int64_t> shape, outStrides, srcStrides, indexStrides;
  for (int64_t d = 0; d < src.dim(); ++d)
    if (d != dim) {
      shape.push_back(src.size(d));
      outStrides.push_back(out.stride(d)), srcStrides.push_back(src.stride(d)), indexStrides.push_back(index.stride(d));
    }
  shape.push_back(out.size(dim)), outStrides.push_back(out.stride(dim)), srcStrides.push_back(0), indexStrides.push_back(0);
  shape.push_back(src.size(dim)), outStrides.push_back(0), srcStrides.push_back(src.stride(dim)), indexStrides.push_back(index.stride(dim));
  Locked s;
  client::TensorOp op;
  op.fn = fn;
  op.shape = shapeOf(shape);
  op.operands = {operand(out, outStrides), operand(src, srcStrides), operand(index, indexStrides)};
  op.alpha = alpha, op.beta = beta;
  op.ignoreIndex = padding;
  send(*s, op);
}
void addAtIndex(const at::Tensor& out, int64_t dim, const at::Tensor& index, const at::Tensor& src, float alpha, bool accumulate,
                int64_t padding = -1) {
  atIndex(TensorFn::indexAdd, out, dim, index, src, alpha, accumulate ? 1 : 0, padding);
}
// indexReduce's reductions (alpha).
enum class Reduce { product = 0, largest = 1, smallest = 2, last = 3 };
void reduceAtIndex(const at::Tensor& out, int64_t dim, const at::Tensor& index, const at::Tensor& src, Reduce how, bool includeSelf) {
  atIndex(TensorFn::indexReduce, out, dim, index, src, float(how), includeSelf ? 1 : 0);
}

// The embedding table's gradient: each row the sum of the gradients of the positions
// that picked it (the padding row's 0).
at::Tensor embedding_dense_backward(const at::Tensor& grad, const at::Tensor& indices, int64_t numWeights, int64_t paddingIdx,
                                    bool scaleGradByFreq) {
  if (!supported({&grad}) || !typed(indices) || indices.scalar_type() != at::kLong || scaleGradByFreq)
    return orOnHost("aten::embedding_dense_backward", {&grad}, grad.scalar_type(), grad.device(), [&](auto in) {
      return at::embedding_dense_backward(in(grad), in(indices), numWeights, paddingIdx, scaleGradByFreq);
    });
  const int64_t dim = grad.size(-1), n = indices.numel();
  auto g = grad.reshape({n, dim}), idx = indices.reshape({n, 1}).expand({n, dim});
  auto out = emptyOn({numWeights, dim});
  if (n == 0) return out.zero_();
  addAtIndex(out, 0, idx, g, 1, false, paddingIdx < 0 ? -1 : paddingIdx);
  return out;
}

// embedding_renorm_ (nn.Embedding's max_norm): each row that indices pick whose norm is
// above max_norm scaled to it, by PyTorch's factor max_norm / (norm + 1e-7). A row picked
// twice is written twice with the same values, so no unique rows are read back.
at::Tensor& embedding_renorm_(at::Tensor& self, const at::Tensor& indices, double maxNorm, double normType) {
  if (!supported({&self}) || self.dim() != 2 || !typed(indices) || indices.scalar_type() != at::kLong || !(normType > 0)) {
    countFallback("aten::embedding_renorm_");
    auto result = host(self);
    at::embedding_renorm_(result, host(indices), maxNorm, normType);
    return self.copy_(result);
  }
  if (indices.numel() == 0) return self;
  auto picks = indices.reshape({-1});
  checkPicks(picks, self.size(0));
  TrustedIndices inRange;  // (checked)
  auto rows = python::index_select(self, 0, picks);
  auto norms = at::linalg_vector_norm(rows, normType, {1}, true);
  auto scale = at::where(norms > maxNorm, maxNorm / (norms + 1e-7), at::ones({}, norms.options()));
  self.index_put_({picks}, rows * scale);
  return self;
}

// EmbeddingBag's sum and mean (recommenders, bag-of-words text models): each bag the sum
// (or mean) of its positions' rows, positions [offsets[b], offsets[b + 1]) (the last to
// the end, or to the offsets' last with include_last_offset), times per-sample weights
// if given; positions at padding_idx left out, of the mean's count too; an empty bag 0.
// offset2bag (each position's bag) is the offsets counted into place and summed
// (PyTorch's own way), on the card; the rows are one index_select and one index_add.
// Like PyTorch's CUDA kernel, a first offset other than 0 is not checked: the positions
// before it fall in no bag. Max mode and scale_grad_by_freq run on the host.
bool bagsOnCard(const at::Tensor& weight, const at::Tensor& indices, const at::Tensor& offsets, bool byFreq, int64_t mode,
                bool sparse, const c10::optional<at::Tensor>& perSample) {
  return supported({&weight, present(perSample)}) && weight.dim() == 2 && typed(indices) && indices.scalar_type() == at::kLong &&
         indices.dim() == 1 && typed(offsets) && offsets.scalar_type() == at::kLong && offsets.dim() == 1 && !byFreq &&
         (mode == 0 || mode == 1) && !sparse;
}
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> _embedding_bag(
    const at::Tensor& weight, const at::Tensor& indices, const at::Tensor& offsets, bool byFreq, int64_t mode, bool sparse,
    const c10::optional<at::Tensor>& perSample, bool includeLastOffset, int64_t paddingIdx) {
  if (reducedFloats({&weight, present(perSample)})) {  // in f32 on the card (as CUDA; PyTorch's CPU refuses bf16), rounded once
    auto [out, o2b, size, maxIndices] = python::_embedding_bag(widened(weight, weight.scalar_type()), indices, offsets, byFreq,
                                                               mode, sparse, widenedOrNone(perSample), includeLastOffset, paddingIdx);
    return {out.to(weight.scalar_type()), o2b, size, maxIndices};
  }
  if (!bagsOnCard(weight, indices, offsets, byFreq, mode, sparse, perSample)) {
    countFallback("aten::_embedding_bag");
    auto [out, o2b, size, maxIndices] = at::_embedding_bag(host(weight), host(indices), host(offsets), byFreq, mode, sparse,
                                                           present(perSample) ? host(*perSample) : at::Tensor(),
                                                           includeLastOffset, paddingIdx);
    return {out.to(weight.device()), o2b.to(weight.device()), size.to(weight.device()), maxIndices.to(weight.device())};
  }
  const int64_t positions = indices.numel(), bags = offsets.numel() - (includeLastOffset ? 1 : 0);
  TORCH_CHECK(bags >= 0, "embedding_bag: include_last_offset needs at least one offset");
  TORCH_CHECK(!present(perSample) || (mode == 0 && perSample->sizes() == indices.sizes()),
              "embedding_bag: per_sample_weights are for mode 'sum', one a position");
  checkPicks(indices, weight.size(0));
  checkIndex(offsets, 0, positions, std::nullopt,
             [&](int64_t v) { TORCH_CHECK_INDEX(false, "embedding_bag: offset ", v, " is past the ", positions, " indices"); });
  TrustedIndices checked;
  const auto f32 = weight.options();
  auto starts = at::zeros({positions + 1}, f32).index_add_(0, offsets, at::ones({offsets.numel()}, f32));
  auto offset2bag = (starts.cumsum(0) - 1).narrow(0, 0, positions).to(at::kLong);
  auto rows = weight.index_select(0, indices);
  if (present(perSample)) rows = rows * perSample->unsqueeze(1);
  auto counted = at::ones({positions}, f32);
  if (paddingIdx >= 0) {
    auto kept = indices != paddingIdx;
    rows = at::where(kept.unsqueeze(1), rows, at::zeros({}, f32));
    counted = kept.to(at::kFloat);
  }
  auto out = at::zeros({bags, weight.size(1)}, f32).index_add_(0, offset2bag, rows);
  auto sizes = at::zeros({bags}, f32).index_add_(0, offset2bag, counted);
  if (mode == 1) out = out / sizes.clamp_min(1).unsqueeze(1);
  return {out, offset2bag, sizes.to(at::kLong), at::zeros({bags}, offsets.options())};
}
// Its backward: each position's bag's gradient (over the bag's count for the mean, times
// its weight) added into its row of the table; the padding row's stays 0.
at::Tensor _embedding_bag_dense_backward(const at::Tensor& grad, const at::Tensor& indices, const at::Tensor& offset2bag,
                                         const at::Tensor& bagSize, const at::Tensor& maxIndices, int64_t numWeights,
                                         bool byFreq, int64_t mode, const c10::optional<at::Tensor>& perSample,
                                         int64_t paddingIdx) {
  if (reducedFloats({&grad, present(perSample)}))  // in f32 on the card, rounded once
    return python::_embedding_bag_dense_backward(widened(grad, grad.scalar_type()), indices, offset2bag, bagSize, maxIndices,
                                                 numWeights, byFreq, mode, widenedOrNone(perSample), paddingIdx)
        .to(grad.scalar_type());
  const bool ok = supported({&grad, present(perSample)}) && grad.dim() == 2 && typed(indices) &&
                  indices.scalar_type() == at::kLong && typed(offset2bag) && typed(bagSize) && !byFreq && (mode == 0 || mode == 1);
  if (!ok)
    return onHost("aten::_embedding_bag_dense_backward", [&] {
      return at::_embedding_bag_dense_backward(host(grad), host(indices), host(offset2bag), host(bagSize), host(maxIndices),
                                               numWeights, byFreq, mode, present(perSample) ? host(*perSample) : at::Tensor(),
                                               paddingIdx).to(grad.device());
    });
  TrustedIndices made;  // (offset2bag and the indices: the forward's, checked there)
  auto g = grad.index_select(0, offset2bag);
  if (mode == 1) g = g / bagSize.index_select(0, offset2bag).to(at::kFloat).clamp_min(1).unsqueeze(1);
  if (present(perSample)) g = g * perSample->unsqueeze(1);
  auto out = at::zeros({numWeights, grad.size(1)}, grad.options()).index_add_(0, indices, g);
  if (paddingIdx >= 0 && paddingIdx < numWeights) out.select(0, paddingIdx).zero_();
  return out;
}
// The per-sample weights' gradient: each position's row of the table against its bag's
// gradient (0 at padding_idx).
at::Tensor _embedding_bag_per_sample_weights_backward(const at::Tensor& grad, const at::Tensor& weight, const at::Tensor& indices,
                                                      const at::Tensor& offsets, const at::Tensor& offset2bag, int64_t mode,
                                                      int64_t paddingIdx) {
  if (reducedFloats({&grad, &weight}))  // in f32 on the card, rounded once
    return python::_embedding_bag_per_sample_weights_backward(widened(grad, grad.scalar_type()), widened(weight, weight.scalar_type()),
                                                              indices, offsets, offset2bag, mode, paddingIdx)
        .to(grad.scalar_type());
  const bool ok = supported({&grad, &weight}) && typed(indices) && indices.scalar_type() == at::kLong && typed(offset2bag) && mode == 0;
  if (!ok)
    return onHost("aten::_embedding_bag_per_sample_weights_backward", [&] {
      return at::_embedding_bag_per_sample_weights_backward(host(grad), host(weight), host(indices), host(offsets),
                                                            host(offset2bag), mode, paddingIdx).to(grad.device());
    });
  TrustedIndices made;
  auto terms = (grad.index_select(0, offset2bag) * weight.index_select(0, indices)).sum(1);
  return paddingIdx >= 0 ? at::where(indices == paddingIdx, at::zeros({}, terms.options()), terms) : terms;
}

// src, or a copy of it where it shares out's storage (an op's output is never an input).
at::Tensor apart(const at::Tensor& src, const at::Tensor& out) { return sharesStorage(src, out) ? src.clone() : src; }

// out = self, then out[.., index[.., i, ..], ..] += src[.., i, ..] along `dim` (gather's
// backward). An index outside self's dimension raises PyTorch's error (checkAlong).
at::Tensor& scatter_add_out(const at::Tensor& self, int64_t dim, const at::Tensor& index, const at::Tensor& src, at::Tensor& out) {
  const bool ok = supported({&self, &src, &out}) && onDevice(self) && onDevice(src) && onDevice(out) && typed(index) &&
                  index.scalar_type() == at::kLong && self.dim() >= 1 && self.dim() <= 5 && index.dim() == self.dim() &&
                  src.dim() == self.dim();
  if (!ok)
    return orHostInto("aten::scatter_add", out, {&self, &src, &out},
                      [&](auto in) { return at::scatter_add(in(self), dim, in(index), in(src)); });
  dim = c10::maybe_wrap_dim(dim, self.dim());
  for (int64_t d = 0; d < self.dim(); ++d) {
    TORCH_CHECK(index.size(d) <= src.size(d), "raccel: scatter_add: index ", index.sizes(), " is larger than src ", src.sizes(),
                " in dimension ", d);
    TORCH_CHECK(d == dim || index.size(d) <= self.size(d), "raccel: scatter_add: index ", index.sizes(), " is larger than self ",
                self.sizes(), " in dimension ", d);
  }
  checkAlong(index, dim, self.size(dim));
  at::native::resize_output(out, self.sizes());
  if (!out.is_same(self)) out.copy_(self);
  if (index.numel() == 0) return out;
  auto from = src;
  for (int64_t d = 0; d < src.dim(); ++d) from = from.narrow(d, 0, index.size(d));
  addAtIndex(out, dim, index, apart(from, out), 1, true);
  return out;
}
at::Tensor scatter_add(const at::Tensor& self, int64_t dim, const at::Tensor& index, const at::Tensor& src) {
  auto out = emptyOn({0}, self.scalar_type());
  return python::scatter_add_out(self, dim, index, src, out);
}
at::Tensor& scatter_add_(at::Tensor& self, int64_t dim, const at::Tensor& index, const at::Tensor& src) {
  return python::scatter_add_out(self, dim, index, src, self);
}

// out = self, then out[.., index[.., i, ..], ..] = value, or src[.., i, ..], along `dim`.
// A value: the positions picked (an index_add of ones there) take it, in f32 or i64
// (one_hot's ones). A src (f32, or i64 into i64): an indexReduce taking the last pick,
// which is the one PyTorch's CPU loop leaves where several meet. An index outside self's dimension raises
// PyTorch's error.
at::Tensor& scatterInto(const char* name, const at::Tensor& self, int64_t dim, const at::Tensor& index, const at::Tensor* src,
                        const at::Scalar& value, at::Tensor& out) {
  const bool integers = bothI64(self, out) && (!src || (typed(*src) && src->scalar_type() == at::kLong));
  const bool ok = (integers || supported({&self, src, &out})) && onDevice(self) && onDevice(out) && (!src || onDevice(*src)) &&
                  typed(index) && index.scalar_type() == at::kLong && self.dim() >= 1 && self.dim() <= 5 &&
                  index.dim() == self.dim() && (!src || src->dim() == self.dim());
  if (!ok)
    return hostInto(name, out, src ? at::scatter(host(self), dim, host(index), host(*src)) : at::scatter(host(self), dim, host(index), value));
  dim = c10::maybe_wrap_dim(dim, self.dim());
  checkAlong(index, dim, self.size(dim));
  TrustedIndices checked;
  if (src) {
    auto from = *src;
    for (int64_t d = 0; d < from.dim(); ++d) from = from.narrow(d, 0, index.size(d));
    from = apart(from, out);
    resultInto(out, self);
    if (index.numel() > 0) reduceAtIndex(out, dim, index, from, Reduce::last, true);
    return out;
  }
  const auto counts = self.options().dtype(at::kFloat);
  auto hit = python::scatter_add(at::zeros(self.sizes(), counts), dim, index, at::ones(index.sizes(), counts));
  return resultInto(out, self.masked_fill(hit > 0, value));
}
at::Tensor& scatter_src_out(const at::Tensor& self, int64_t dim, const at::Tensor& index, const at::Tensor& src, at::Tensor& out) {
  return scatterInto("aten::scatter.src_out", self, dim, index, &src, 0, out);
}
at::Tensor& scatter_value_out(const at::Tensor& self, int64_t dim, const at::Tensor& index, const at::Scalar& value, at::Tensor& out) {
  return scatterInto("aten::scatter.value_out", self, dim, index, nullptr, value, out);
}

// scatter_reduce along `dim` (f32): sum and mean as sums of the picks (after zeroing the
// positions picked, without self) and their counts; prod, amax and amin one indexReduce.
// As PyTorch's CPU: a mean divides by the picks (and self) where any, and a position
// nothing picks keeps self's value.
at::Tensor& scatterReduceInto(const char* name, const at::Tensor& self, int64_t dim, const at::Tensor& index, const at::Tensor& src,
                              c10::string_view reduce, bool includeSelf, at::Tensor& out,
                              const std::function<at::Tensor()>& reference) {
  const bool known = reduce == "sum" || reduce == "mean" || reduce == "prod" || reduce == "amax" || reduce == "amin";
  const bool ok = known && supported({&self, &src, &out}) && onDevice(self) && onDevice(src) && onDevice(out) && typed(index) &&
                  index.scalar_type() == at::kLong && self.dim() >= 1 && self.dim() <= 5 && index.dim() == self.dim() &&
                  src.dim() == self.dim();
  if (!ok) return hostInto(name, out, reference());
  dim = c10::maybe_wrap_dim(dim, self.dim());
  checkAlong(index, dim, self.size(dim));
  TrustedIndices checked;
  auto from = src;
  for (int64_t d = 0; d < from.dim(); ++d) from = from.narrow(d, 0, index.size(d));
  from = apart(from, out);
  if (reduce == "prod" || reduce == "amax" || reduce == "amin") {
    resultInto(out, self);
    if (index.numel() > 0)
      reduceAtIndex(out, dim, index, from, reduce == "prod" ? Reduce::product : reduce == "amax" ? Reduce::largest : Reduce::smallest,
                    includeSelf);
    return out;
  }
  if (reduce == "sum" && includeSelf) return resultInto(out, python::scatter_add(self, dim, index, from));
  auto picks = python::scatter_add(at::zeros_like(self), dim, index, at::ones(index.sizes(), self.options()));
  auto base = includeSelf ? self : self.masked_fill(picks > 0, 0);
  auto sum = python::scatter_add(base, dim, index, from);
  if (reduce == "sum") return resultInto(out, sum);
  auto count = includeSelf ? picks + 1 : picks;
  return resultInto(out, sum / count.masked_fill(count == 0, 1));
}
at::Tensor& scatter_reduce_two_out(const at::Tensor& self, int64_t dim, const at::Tensor& index, const at::Tensor& src,
                                   c10::string_view reduce, bool includeSelf, at::Tensor& out) {
  return scatterReduceInto("aten::scatter_reduce.two_out", self, dim, index, src, reduce, includeSelf, out,
                           [&] { return at::scatter_reduce(host(self), dim, host(index), host(src), reduce, includeSelf); });
}
// index_reduce: scatter_reduce with one index along `dim` (prod, mean, amax, amin).
at::Tensor& index_reduce_out(const at::Tensor& self, int64_t dim, const at::Tensor& index, const at::Tensor& source,
                             c10::string_view reduce, bool includeSelf, at::Tensor& out) {
  auto reference = [&] { return at::index_reduce(host(self), dim, host(index), host(source), reduce, includeSelf); };
  if (!typed(index) || index.dim() > 1 || !onDevice(source) || source.dim() != self.dim() || self.dim() < 1)
    return hostInto("aten::index_reduce", out, reference());
  dim = c10::maybe_wrap_dim(dim, self.dim());
  TORCH_CHECK(source.size(dim) == index.numel(), "index_reduce_(): Number of indices (", index.numel(),
              ") should be equal to source.size(dim) (", source.size(dim), ")");
  std::vector<int64_t> along(source.dim(), 1);
  along[dim] = index.numel();
  return scatterReduceInto("aten::index_reduce", self, dim, index.reshape(along).expand(source.sizes()), source, reduce,
                           includeSelf, out, reference);
}
// scatter(..., reduce="add" | "multiply"): scatter_reduce's sum and prod with self.
at::Tensor& scatter_reduce_out(const at::Tensor& self, int64_t dim, const at::Tensor& index, const at::Tensor& src,
                               c10::string_view reduce, at::Tensor& out) {
  return scatterReduceInto("aten::scatter.reduce_out", self, dim, index, src, reduce == "add" ? "sum" : reduce == "multiply" ? "prod" : "",
                           true, out, [&] { return at::scatter(host(self), dim, host(index), host(src), reduce); });
}

// self's positions along `dim` that index names (negative: from the end) take the value
// (trace's backward): a where by those positions, counted on the card (an index_add of
// ones).
at::Tensor& indexFill(at::Tensor& self, int64_t dim, const at::Tensor& index, const at::Tensor& value) {
  const bool ok = supported({&self}) && typed(index) && index.scalar_type() == at::kLong && index.dim() <= 1 &&
                  self.dim() >= 1 && value.numel() == 1;
  if (!ok) {
    countFallback("aten::index_fill_");
    auto result = host(self);
    result.index_fill_(dim, host(index), host(value).reshape({}));
    return self.copy_(result);
  }
  dim = c10::maybe_wrap_dim(dim, self.dim());
  checkIndexing(index, dim, self.size(dim));  // (a negative index counts from the end)
  TrustedIndices checked;
  auto picks = fromEnd(index, self.size(dim)).reshape({-1});
  auto hit = at::zeros({self.size(dim)}, self.options()).index_add_(0, picks, at::ones({index.numel()}, self.options()));
  std::vector<int64_t> along(self.dim(), 1);
  along[dim] = self.size(dim);
  return self.copy_(at::where(hit.view(along) > 0, value.reshape({}).to(self.device(), at::kFloat), self));
}
at::Tensor& index_fill_scalar_(at::Tensor& self, int64_t dim, const at::Tensor& index, const at::Scalar& value) {
  return indexFill(self, dim, index, at::scalar_tensor(value, at::kFloat));
}
at::Tensor& index_fill_tensor_(at::Tensor& self, int64_t dim, const at::Tensor& index, const at::Tensor& value) {
  return indexFill(self, dim, index, value);
}

// out = self, then out[.., index[i], ..] += alpha * source[.., i, ..] along `dim`
// (index_select's backward).
at::Tensor& index_add_out(const at::Tensor& self, int64_t dim, const at::Tensor& index, const at::Tensor& source,
                          const at::Scalar& alpha, at::Tensor& out) {
  const bool ok = supported({&self, &source, &out}) && onDevice(self) && onDevice(source) && onDevice(out) && typed(index) &&
                  index.scalar_type() == at::kLong && index.dim() <= 1 && self.dim() >= 1 && self.dim() <= 5 &&
                  source.dim() == self.dim();
  if (!ok)
    return orHostInto("aten::index_add", out, {&self, &source, &out}, [&](auto in) {
      return at::index_add(in(self), dim, in(index), in(source), roundedTo(alpha, out.scalar_type()));
    });
  dim = c10::maybe_wrap_dim(dim, self.dim());
  for (int64_t d = 0; d < self.dim(); ++d)
    TORCH_CHECK(d == dim ? source.size(d) == index.numel() : source.size(d) == self.size(d), "raccel: index_add: source ",
                source.sizes(), " does not fit self ", self.sizes(), " and an index of ", index.numel(), " along dimension ", dim);
  checkPicks(index, self.size(dim));
  at::native::resize_output(out, self.sizes());
  if (!out.is_same(self)) out.copy_(self);
  if (index.numel() == 0) return out;
  std::vector<int64_t> along(source.dim(), 1);
  along[dim] = index.numel();
  addAtIndex(out, dim, index.reshape(along).expand(source.sizes()), apart(source, out), alpha.toFloat(), true);
  return out;
}
at::Tensor index_add(const at::Tensor& self, int64_t dim, const at::Tensor& index, const at::Tensor& source, const at::Scalar& alpha) {
  auto out = emptyOn({0}, self.scalar_type());
  return python::index_add_out(self, dim, index, source, alpha, out);
}
at::Tensor& index_add_(at::Tensor& self, int64_t dim, const at::Tensor& index, const at::Tensor& source, const at::Scalar& alpha) {
  return python::index_add_out(self, dim, index, source, alpha, self);
}

// A bool mask broadcast to `shape`, read to the host and flattened: which positions a
// masked op takes is data, so it is known only once the card has made the mask (the
// one wait these ops add; the values stay on the card).
at::Tensor hostMask(const at::Tensor& mask, c10::IntArrayRef shape) { return host(mask.expand(shape)).reshape({-1}); }

}  // namespace

c10::List<c10::optional<at::Tensor>> hostIndices(const c10::List<c10::optional<at::Tensor>>& indices) {
  c10::List<c10::optional<at::Tensor>> out;
  for (size_t i = 0; i < indices.size(); ++i) {
    auto t = indices.get(i);
    out.push_back(t && t->defined() ? c10::optional<at::Tensor>(host(*t)) : t);
  }
  return out;
}

namespace {

// Advanced indexing (self[indices]) where the index tensors sit in neighbouring
// dimensions, `count` of them from `first` (a None before them is ':', as is any after):
// the picks' positions in those dimensions merged into one (i0 * size1 + i1 ...), of the
// indices' broadcast shape. A bool mask stands for the positions where it is true (read to
// the host: which they are is data, the one wait this adds) and a negative index counts
// from the dimension's end. An index outside its dimension raises PyTorch's error
// (checkIndexing). Anything else (indices apart, other dtypes): nothing, and the caller
// runs PyTorch's own kernel on the host.
struct MergedIndex {
  int64_t first = 0, count = 0;
  int64_t rows = 1;            // the indexed dimensions' product: the merged one's size
  at::Tensor flat;             // i64 on the device, one dimension
  std::vector<int64_t> shape;  // the indices' broadcast shape
  // self's shape with the indexed dimensions replaced by `shape`.
  std::vector<int64_t> resultShape(c10::IntArrayRef self) const {
    std::vector<int64_t> out(self.begin(), self.begin() + first);
    out.insert(out.end(), shape.begin(), shape.end());
    out.insert(out.end(), self.begin() + first + count, self.end());
    return out;
  }
  // self's shape with the indexed dimensions merged into one of `merged` (rows: self's).
  std::vector<int64_t> mergedShape(c10::IntArrayRef self, int64_t merged) const {
    std::vector<int64_t> out(self.begin(), self.begin() + first);
    out.push_back(merged);
    out.insert(out.end(), self.begin() + first + count, self.end());
    return out;
  }
};
std::optional<MergedIndex> mergedIndex(const at::Tensor& self, const c10::List<c10::optional<at::Tensor>>& indices) {
  std::vector<at::Tensor> picks;  // i64 on the device, one per indexed dimension
  int64_t dim = 0, first = -1;
  bool gap = false;
  for (size_t i = 0; i < indices.size(); ++i) {
    auto t = indices.get(i);
    if (!t || !t->defined()) {
      gap = first >= 0;
      ++dim;
      continue;
    }
    if (gap || !typed(*t)) return std::nullopt;
    if (first < 0) first = dim;
    if (t->scalar_type() == at::kBool) {
      const int64_t k = t->dim();
      if (k == 0 || dim + k > self.dim() || t->sizes() != self.sizes().slice(dim, k)) return std::nullopt;
      auto positions = host(*t).nonzero();  // [true positions, k]
      for (int64_t j = 0; j < k; ++j) picks.push_back(positions.select(1, j).contiguous().to(self.device()));
      dim += k;
    } else if (t->scalar_type() == at::kLong && dim < self.dim()) {
      checkIndexing(*t, dim, self.size(dim));
      picks.push_back(fromEnd(*t, self.size(dim)));
      ++dim;
    } else {
      return std::nullopt;
    }
  }
  if (picks.empty() || dim > self.dim()) return std::nullopt;
  MergedIndex m;
  m.first = first, m.count = int64_t(picks.size());
  for (int64_t d = first; d < first + m.count; ++d) m.rows *= self.size(d);
  auto broadcast = at::broadcast_tensors(picks);
  m.shape = broadcast[0].sizes().vec();
  m.flat = broadcast[0];
  for (int64_t j = 1; j < m.count; ++j) m.flat = m.flat * self.size(first + j) + broadcast[j];
  m.flat = m.flat.reshape({-1});
  return m;
}

// Tensor.unfold's backward: each window's gradient added back at the positions it
// viewed, one strided add per offset in the window (the windows of one offset never meet).
at::Tensor unfold_backward(const at::Tensor& grad, c10::IntArrayRef inputSizes, int64_t dim, int64_t size, int64_t step) {
  if (!supported({&grad}) || inputSizes.empty() || grad.dim() != int64_t(inputSizes.size()) + 1 || step <= 0)
    return onHost("aten::unfold_backward",
                  [&] { return at::unfold_backward(host(grad), inputSizes, dim, size, step).to(grad.device()); });
  dim = c10::maybe_wrap_dim(dim, int64_t(inputSizes.size()));
  auto out = emptyOn(inputSizes).zero_();
  const int64_t windows = grad.size(dim), span = (windows - 1) * step + 1;
  for (int64_t j = 0; j < size && windows > 0; ++j) out.narrow(dim, j, span).slice(dim, 0, span, step).add_(grad.select(-1, j));
  return out;
}

// Advanced indexing whose index tensors are apart (x[a, :, c]): PyTorch puts the picked
// dimensions first, then self's others in order, which is indexing a view of self with
// the indexed dimensions moved to the front, where they are neighbours. Nothing where
// they are neighbours already (or the indices do not fit self).
struct Fronted {
  std::vector<int64_t> order;                    // self's dimensions, the indexed ones first
  c10::List<c10::optional<at::Tensor>> indices;  // the same picks, of self.permute(order)
};
std::optional<Fronted> indexedFirst(const at::Tensor& self, const c10::List<c10::optional<at::Tensor>>& indices) {
  std::vector<int64_t> indexed, others;
  Fronted f;
  int64_t dim = 0;
  for (size_t i = 0; i < indices.size(); ++i) {
    auto t = indices.get(i);
    const bool picks = t && t->defined();
    const int64_t k = picks && (t->scalar_type() == at::kBool || t->scalar_type() == at::kByte) ? t->dim() : 1;
    if (k == 0 || dim + k > self.dim()) return std::nullopt;
    for (int64_t j = 0; j < k; ++j) (picks ? indexed : others).push_back(dim + j);
    if (picks) f.indices.push_back(t);
    dim += k;
  }
  for (; dim < self.dim(); ++dim) others.push_back(dim);
  if (indexed.empty() || indexed.back() - indexed.front() + 1 == int64_t(indexed.size())) return std::nullopt;
  f.order = indexed;
  f.order.insert(f.order.end(), others.begin(), others.end());
  return f;
}

// self[indices]: one index_select over the indexed dimensions merged (any of the card's
// types).
at::Tensor index(const at::Tensor& self, const c10::List<c10::optional<at::Tensor>>& indices) {
  if (auto f = stored(self) ? indexedFirst(self, indices) : std::nullopt) return python::index(self.permute(f->order), f->indices);
  auto m = stored(self) ? mergedIndex(self, indices) : std::nullopt;
  if (!m)
    return onHost("aten::index.Tensor", [&] { return at::index(host(self), hostIndices(indices)).to(self.device()); });
  const auto merged = self.reshape(m->mergedShape(self.sizes(), m->rows));
  TrustedIndices checked;  // (by mergedIndex)
  return python::index_select(merged, m->first, m->flat).view(m->resultShape(self.sizes()));
}

// repeat_interleave of a repeats tensor: each position i, repeats[i] times, as i64 (what
// x.repeat_interleave(n, dim) picks rows by). Its length is data, so the repeats are
// read, but where they are known to be all one number (Tensor.repeat_interleave(n)
// writes n from the host, counted as it passed) nothing waits. Made on the host, written.
at::Tensor repeat_interleave_Tensor(const at::Tensor& repeats, c10::optional<int64_t> outputSize) {
  if (!typed(repeats) || repeats.scalar_type() != at::kLong || repeats.dim() > 1)
    return onHost("aten::repeat_interleave.Tensor", [&] { return at::repeat_interleave(host(repeats), outputSize).to(repeats.device()); });
  std::optional<int64_t> each;
  if (repeats.numel() > 0) {
    Locked s;
    auto span = spanOf(repeats);
    if (auto known = knownValues().find(span.buffer, span.begin, span.end); known && known->lo == known->hi) each = known->lo;
  }
  auto counts = each ? at::full({repeats.numel()}, *each, at::kLong) : host(repeats).reshape({-1});
  return at::repeat_interleave(counts, outputSize).to(repeats.device());  // (PyTorch's checks: no negative repeat)
}

// The positions of self's nonzero elements, [count, dims] (i64, each in its dimension):
// the card compares, the mask is read (the one wait of the masked ops) and the positions
// made from it on the host are written back.
at::Tensor nonzero(const at::Tensor& self) {
  if (!typed(self)) return onHost("aten::nonzero", [&] { return at::nonzero(host(self)).to(self.device()); });
  auto mask = self.scalar_type() == at::kBool ? self : at::ne(self, 0);
  return host(mask).nonzero().to(self.device());
}

// self's elements where mask is true, in order, as one dimension.
at::Tensor masked_select(const at::Tensor& self, const at::Tensor& mask) {
  if (!stored(self) || !typed(mask) || mask.scalar_type() != at::kBool)
    return onHost("aten::masked_select", [&] { return at::masked_select(host(self), host(mask)).to(self.device()); });
  const auto shape = broadcastShape(self, mask);
  auto positions = hostMask(mask, shape).nonzero().reshape({-1});
  auto out = emptyOn({positions.numel()}, self.scalar_type());
  if (positions.numel() == 0) return out;
  TrustedIndices inRange;  // (the mask's own positions)
  return python::index_select_out(self.expand(shape).reshape({-1}), 0, positions.to(self.device()), out);
}

// self's elements where mask is true take source's first ones, in order (masked_select's
// backward).
at::Tensor& masked_scatter_(at::Tensor& self, const at::Tensor& mask, const at::Tensor& source) {
  if (!typed(self) || !typed(source) || source.scalar_type() != self.scalar_type() || !typed(mask) ||
      mask.scalar_type() != at::kBool) {
    countFallback("aten::masked_scatter_");
    auto result = host(self);
    result.masked_scatter_(host(mask), host(source));
    return self.copy_(result);
  }
  auto flat = hostMask(mask, self.sizes());
  const int64_t taken = flat.sum().item<int64_t>();
  TORCH_CHECK(source.numel() >= taken, "raccel: masked_scatter_: the mask takes ", taken, " elements, source has ",
              source.numel());
  if (taken == 0) return self;
  // Each position's element of source: how many true positions come before it.
  auto rank = (flat.cumsum(0) - 1).clamp_min(0);
  TrustedIndices inRange;  // (below source.numel(), checked above)
  auto picked = python::index_select(source.reshape({-1}), 0, rank.to(self.device())).view(self.sizes());
  return self.copy_(at::where(mask.expand(self.sizes()), picked, self));
}

// out[..., i, ...] = self[..., index[..., i, ...], ...] along `dim` (index of out's shape;
// any of the card's types).
at::Tensor& gather_out(const at::Tensor& self, int64_t dim, const at::Tensor& index, bool sparseGrad, at::Tensor& out) {
  const bool ok = stored(self) && stored(out) && out.scalar_type() == self.scalar_type() && typed(index) &&
                  index.scalar_type() == at::kLong && self.dim() >= 1 && self.dim() <= 5 && index.dim() == self.dim() && !sparseGrad;
  if (!ok) return hostInto("aten::gather", out, at::gather(host(self), dim, host(index), sparseGrad));
  dim = c10::maybe_wrap_dim(dim, self.dim());
  for (int64_t d = 0; d < self.dim(); ++d)
    TORCH_CHECK(d == dim || index.size(d) <= self.size(d), "raccel: gather: index ", index.sizes(), " is larger than ",
                self.sizes(), " in dimension ", d);
  at::native::resize_output(out, index.sizes());
  if (out.numel() == 0) return out;
  checkAlong(index, dim, self.size(dim));
  auto shape = index.sizes().vec();
  shape.push_back(self.size(dim));
  auto outStrides = out.strides().vec(), selfStrides = self.strides().vec(), indexStrides = index.strides().vec();
  outStrides.push_back(0), indexStrides.push_back(0);
  selfStrides[dim] = 0;
  selfStrides.push_back(self.stride(dim));
  Locked s;
  client::TensorOp op;
  op.fn = TensorFn::indexSelect;
  op.shape = shapeOf(shape);
  op.operands = {operand(out, outStrides), operand(self, selfStrides), operand(index, indexStrides)};
  send(*s, op);
  return out;
}
at::Tensor gather(const at::Tensor& self, int64_t dim, const at::Tensor& index, bool sparseGrad) {
  auto out = emptyOn({0}, self.scalar_type());
  return python::gather_out(self, dim, index, sparseGrad, out);
}

// self[indices] = values without accumulate, over the indexed dimensions merged
// (`merged`: self's view; `m`: its index): one indexReduce taking the last pick, so where
// the index names a row twice the last value named wins, as in PyTorch's CPU loop (exact
// for integers).
void putLastWins(at::Tensor& merged, const MergedIndex& m, const at::Tensor& values) {
  const int64_t k = m.flat.numel();
  if (k == 0) return;
  std::vector<int64_t> along(merged.dim(), 1);
  along[m.first] = k;
  reduceAtIndex(merged, m.first, m.flat.reshape(along).expand(values.sizes()), values, Reduce::last, true);
}

// self[indices] = values (index_put_): a bool mask and one value is masked_fill_; with
// accumulate (indexing's backward), one index_add over the indexed dimensions merged;
// without, putLastWins (f32, i64 or bool values of self's type).
at::Tensor& _index_put_impl_(at::Tensor& self, const c10::List<c10::optional<at::Tensor>>& indices, const at::Tensor& values,
                             bool accumulate, bool unsafe) {
  const bool mask = indices.size() == 1 && indices.get(0).has_value() && typed(*indices.get(0)) &&
                    indices.get(0)->scalar_type() == at::kBool && values.numel() == 1 && !accumulate;
  if (mask) return python::masked_fill_(self, *indices.get(0), values.reshape({}));
  const bool added = accumulate && typed(self) && typed(values) && values.scalar_type() == self.scalar_type() &&
                     !sharesStorage(values, self);
  const bool put = !accumulate && typed(self) && self.dim() <= 5 && typed(values) && values.scalar_type() == self.scalar_type();
  auto fronted = added || put ? indexedFirst(self, indices) : std::nullopt;
  if ((added || put) && (fronted || !self.is_contiguous())) {  // into a contiguous copy, then back
    auto target = fronted ? self.permute(fronted->order) : self;
    auto work = target.contiguous();
    python::_index_put_impl_(work, fronted ? fronted->indices : indices, values, accumulate, unsafe);
    target.copy_(work);
    return self;
  }
  if (auto m = added || put ? mergedIndex(self, indices) : std::nullopt) {
    TrustedIndices checked;  // (by mergedIndex)
    auto merged = self.view(m->mergedShape(self.sizes(), m->rows));
    auto shape = m->mergedShape(self.sizes(), m->flat.numel());
    auto spread = apart(values, self).expand(m->resultShape(self.sizes())).reshape(shape);
    if (accumulate) python::index_add_out(merged, m->first, m->flat, spread, 1, merged);
    else putLastWins(merged, *m, spread);
    return self;
  }
  countFallback("aten::_index_put_impl_");
  auto result = host(self);
  at::_index_put_impl_(result, hostIndices(indices), host(values), accumulate, unsafe);
  return self.copy_(result);
}

// take and put_: self's elements in row-major order picked by index (negative from the
// end), with PyTorch's error for a pick outside them. The picks, checked and moved into
// [0, n), flat.
at::Tensor flatPicks(const at::Tensor& index, int64_t n) {
  checkIndex(index, -n, n - 1, std::nullopt, [&](int64_t v) {
    TORCH_CHECK_INDEX(false, "out of range: tried to access index ", v, " on a tensor of ", n, " elements.");
  });
  return fromEnd(index.reshape({-1}), n);
}
// A flat pick of a non-empty self by an i64 index on the device (self's type each caller
// checks: take any of the card's, put_ f32, i64 or bool).
bool flatlyPicked(const at::Tensor& self, const at::Tensor& index) {
  return self.numel() > 0 && typed(index) && index.scalar_type() == at::kLong;
}
at::Tensor& take_out(const at::Tensor& self, const at::Tensor& index, at::Tensor& out) {
  if (!stored(self) || !flatlyPicked(self, index) || !stored(out) || out.scalar_type() != self.scalar_type())
    return hostInto("aten::take", out, at::take(host(self), host(index)));
  auto picks = flatPicks(index, self.numel());
  TrustedIndices inRange;
  return resultInto(out, python::index_select(self.reshape({-1}), 0, picks).view(index.sizes()));
}
// put_ (take's backward puts with accumulate): an index_put_ of the flat picks, on the
// card where index_put_ runs there.
at::Tensor& put_(at::Tensor& self, const at::Tensor& index, const at::Tensor& source, bool accumulate) {
  if (!typed(self) || !flatlyPicked(self, index) || !typed(source) || source.scalar_type() != self.scalar_type() ||
      source.numel() != index.numel()) {
    countFallback("aten::put_");
    auto result = host(self);
    result.put_(host(index), host(source), accumulate);
    return self.copy_(result);
  }
  auto picks = flatPicks(index, self.numel());
  TrustedIndices inRange;
  auto flat = self.is_contiguous() ? self.view({-1}) : self.contiguous().view({-1});
  flat.index_put_({picks}, source.reshape({-1}), accumulate);
  if (!flat.is_alias_of(self)) self.copy_(flat.view(self.sizes()));
  return self;
}
at::Tensor take(const at::Tensor& self, const at::Tensor& index) {
  auto out = emptyOn({0}, self.scalar_type());
  return python::take_out(self, index, out);
}

}  // namespace

// Joining, indexing, gathers and scatters (embeddings), take and put_.
void registerIndexing(torch::Library& m) {
  m.impl("take.out", TORCH_FN(take_out));
  m.impl("take", TORCH_FN(python::take));
  m.impl("put_", TORCH_FN(python::put_));
  m.impl("cat.out", TORCH_FN(cat_out));
  m.impl("cat", TORCH_FN(python::cat));
  m.impl("repeat_interleave.Tensor", TORCH_FN(repeat_interleave_Tensor));
  m.impl("_embedding_bag", TORCH_FN(python::_embedding_bag));
  m.impl("_embedding_bag_forward_only", TORCH_FN(python::_embedding_bag));
  m.impl("_embedding_bag_dense_backward", TORCH_FN(python::_embedding_bag_dense_backward));
  m.impl("_embedding_bag_per_sample_weights_backward", TORCH_FN(python::_embedding_bag_per_sample_weights_backward));
  m.impl("index_fill_.int_Scalar", TORCH_FN(index_fill_scalar_));
  m.impl("index_fill_.int_Tensor", TORCH_FN(index_fill_tensor_));
  m.impl("gather.out", TORCH_FN(gather_out));
  m.impl("gather", TORCH_FN(python::gather));
  m.impl("_index_put_impl_", TORCH_FN(python::_index_put_impl_));
  m.impl("index.Tensor", TORCH_FN(python::index));
  m.impl("unfold_backward", TORCH_FN(python::unfold_backward));
  m.impl("index_select.out", TORCH_FN(index_select_out));
  m.impl("index_select", TORCH_FN(python::index_select));
  m.impl("embedding_dense_backward", TORCH_FN(embedding_dense_backward));
  m.impl("embedding_renorm_", TORCH_FN(python::embedding_renorm_));
  RACCEL_IMPL_OUT_NEW_INPLACE(scatter_add)
  m.impl("scatter.src_out", TORCH_FN(scatter_src_out));
  m.impl("scatter.value_out", TORCH_FN(scatter_value_out));
  m.impl("scatter.reduce_out", TORCH_FN(scatter_reduce_out));
  m.impl("scatter_reduce.two_out", TORCH_FN(scatter_reduce_two_out));
  m.impl("index_reduce.out", TORCH_FN(index_reduce_out));
  RACCEL_IMPL_OUT_NEW_INPLACE(index_add)
  m.impl("masked_select", TORCH_FN(masked_select));
  m.impl("nonzero", TORCH_FN(python::nonzero));
  m.impl("masked_scatter_", TORCH_FN(masked_scatter_));
}

}  // namespace raccel::python
