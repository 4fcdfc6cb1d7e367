// The torch device's reductions to values and positions (amax, argmax, max/min, var,
// std, norms) and its sorts (sort, topk, kthvalue, median, cummax/cummin).
#include "vmfrontend/python/torch_device.h"

namespace raccel::python {

// ---- Reductions to values and positions -------------------------------------------------

void reduceInto(TensorFn fn, const at::Tensor& out, const at::Tensor& self, uint32_t mask, bool keepdim) {
  for (int64_t d = 0; d < self.dim(); ++d)
    TORCH_CHECK(!(mask >> d & 1) || self.size(d) > 0, "raccel: a reduction over dimension ", d,
                " of size 0 (it has no largest or smallest element)");
  std::vector<uint64_t> shape;
  std::vector<int64_t> inStrides, outStrides;
  for (int pass = 0; pass < 2; ++pass)
    for (int64_t d = 0, o = 0; d < std::max<int64_t>(self.dim(), 1); ++d) {
      const bool reduced = mask >> d & 1;
      const int64_t outStride = reduced ? 0 : out.stride(o);
      if (!reduced || keepdim) ++o;
      if (reduced != bool(pass)) continue;
      shape.push_back(self.dim() ? static_cast<uint64_t>(self.size(d)) : 1);
      inStrides.push_back(self.dim() ? self.stride(d) : 0);
      outStrides.push_back(outStride);
    }
  Locked s;
  client::TensorOp op;
  op.fn = fn;
  op.shape = shape;
  op.operands = {operand(out, outStrides), operand(self, inStrides)};
  const unsigned reducedDims = std::popcount(mask);
  op.reduceMask = ((1u << reducedDims) - 1) << (shape.size() - reducedDims);
  send(*s, op);
  if (fn == TensorFn::argmax || fn == TensorFn::argmin) {
    int64_t n = 1;
    for (size_t d = shape.size() - reducedDims; d < shape.size(); ++d) n *= int64_t(shape[d]);
    notePositions(out, n);
  }
}

namespace {

// Over f32, i64 or bool on the device (integers compared exactly), into an output of
// `dtype` there (or nothing: on the host).
bool reducible(const at::Tensor& self, const at::Tensor& out, at::ScalarType dtype) {
  return typed(self) && onDevice(out) && out.scalar_type() == dtype;
}

#define RACCEL_EXTREMUM(op, fn)                                                                                       \
  at::Tensor& op##_out(const at::Tensor& self, c10::IntArrayRef dims, bool keepdim, at::Tensor& out) {                \
    if (!reducible(self, out, self.scalar_type()))                                                                    \
      return orHostInto("aten::" #op, out, {&self, &out}, [&](auto in) { return at::op(in(self), dims, keepdim); });  \
    const uint32_t mask = maskOf(dims, self.dim());                                                                   \
    at::native::resize_output(out, reducedShape(self, mask, keepdim));                                               \
    reduceInto(fn, out, self, mask, keepdim);                                                                         \
    return out;                                                                                                       \
  }                                                                                                                   \
  at::Tensor op(const at::Tensor& self, c10::IntArrayRef dims, bool keepdim) {                                        \
    auto out = emptyOn({0}, self.scalar_type());                                                                      \
    return python::op##_out(self, dims, keepdim, out);                                                                \
  }
RACCEL_EXTREMUM(amax, TensorFn::amax)
RACCEL_EXTREMUM(amin, TensorFn::amin)
#undef RACCEL_EXTREMUM

#define RACCEL_POSITION(op, fn)                                                                                       \
  at::Tensor& op##_out(const at::Tensor& self, c10::optional<int64_t> dim, bool keepdim, at::Tensor& out) {           \
    if (!reducible(self, out, at::kLong)) /* (reduced floats compared in f32: the same order) */                      \
      return orHostInto("aten::" #op, out, {&self}, [&](auto in) { return at::op(in(self), dim, keepdim); });         \
    /* no dim: the position in the flattened tensor, over every dimension */                                         \
    const uint32_t mask = dim ? 1u << c10::maybe_wrap_dim(*dim, std::max<int64_t>(self.dim(), 1)) : everyDim(self.dim()); \
    at::native::resize_output(out, reducedShape(self, mask, keepdim && dim));                                         \
    reduceInto(fn, out, self, mask, keepdim && dim);                                                                  \
    return out;                                                                                                       \
  }                                                                                                                   \
  at::Tensor op(const at::Tensor& self, c10::optional<int64_t> dim, bool keepdim) {                                   \
    auto out = emptyOn({0}, at::kLong);                                                                               \
    return python::op##_out(self, dim, keepdim, out);                                                                 \
  }
RACCEL_POSITION(argmax, TensorFn::argmax)
RACCEL_POSITION(argmin, TensorFn::argmin)
#undef RACCEL_POSITION

// A selection (sort, topk, kthvalue, median, max/min along a dim) made over `wide`, a
// copy of the input in a type the card sorts (bool as i64; f16 and bf16 as f32, exact and
// in the same order), its values (each one of the input's) converted back into `values`
// exactly.
template <class Select>
std::tuple<at::Tensor&, at::Tensor&> selectedFrom(const at::Tensor& wide, at::Tensor& values, at::Tensor& indices,
                                                  Select select) {
  auto picked = emptyOn({0}, wide.scalar_type());
  select(wide, picked);
  resultInto(values, picked);
  return {values, indices};
}
// max/min over a dimension: the values and their positions (two reductions).
#define RACCEL_VALUES_AND_POSITIONS(op, values, positions)                                                            \
  std::tuple<at::Tensor&, at::Tensor&> op##_dim_out(const at::Tensor& self, int64_t dim, bool keepdim, at::Tensor& value, \
                                                    at::Tensor& position) {                                           \
    if (reducedFloats({&self, &value})) /* widened once for both reductions */                                   \
      return selectedFrom(widened(self, self.scalar_type()), value, position,                                         \
                          [&](const at::Tensor& x, at::Tensor& v) { python::op##_dim_out(x, dim, keepdim, v, position); }); \
    if (!reducible(self, value, self.scalar_type()) || !onDevice(position) || position.scalar_type() != at::kLong) {   \
      countFallback("aten::" #op ".dim");                                                                             \
      auto [v, p] = at::op(host(self), dim, keepdim);                                                                 \
      at::native::resize_output(value, v.sizes());                                                                    \
      at::native::resize_output(position, p.sizes());                                                                 \
      value.copy_(v), position.copy_(p);                                                                              \
      return {value, position};                                                                                       \
    }                                                                                                                 \
    python::values##_out(self, dim, keepdim, value);                                                                  \
    python::positions##_out(self, dim, keepdim, position);                                                            \
    return {value, position};                                                                                         \
  }                                                                                                                   \
  std::tuple<at::Tensor, at::Tensor> op##_dim(const at::Tensor& self, int64_t dim, bool keepdim) {                     \
    auto value = emptyOn({0}, self.scalar_type()), position = emptyOn({0}, at::kLong);                                \
    python::op##_dim_out(self, dim, keepdim, value, position);                                                        \
    return {value, position};                                                                                         \
  }                                                                                                                   \
  at::Tensor op##_all(const at::Tensor& self) { return python::values(self, {}, false); }
RACCEL_VALUES_AND_POSITIONS(max, amax, argmax)
RACCEL_VALUES_AND_POSITIONS(min, amin, argmin)
#undef RACCEL_VALUES_AND_POSITIONS

// var = sum((x - mean)^2) / (n - correction); std = its square root.
at::Tensor& var_out(const at::Tensor& self, at::OptionalIntArrayRef dims, Correction correction, bool keepdim,
                    at::Tensor& out) {
  if (!supported({&self, &out}))
    return orHostInto("aten::var.correction", out, {&self, &out},
                      [&](auto in) { return at::var(in(self), dims, correction, keepdim); });
  const uint32_t mask = maskOf(dims, self.dim());
  auto mean = emptyOn({0});
  python::mean_out(self, dims, true, c10::nullopt, mean);
  auto squares = emptyOn(self.sizes());
  elementwise(TensorFn::add, squares, &self, &mean, -1);
  elementwise(TensorFn::mul, squares, &squares, &squares);
  at::native::resize_output(out, reducedShape(self, mask, keepdim));
  if (out.numel() == 0) return out;
  const int64_t n = self.numel() / out.numel();
  const double divisor = std::max<double>(0, double(n) - correctionOf(correction));
  if (n == 0) return out.fill_(NAN);
  sumInto(out, squares, self.dim() ? mask : 1, keepdim, static_cast<float>(1.0 / divisor));
  return out;
}
at::Tensor var_correction(const at::Tensor& self, at::OptionalIntArrayRef dims, Correction correction, bool keepdim) {
  auto out = emptyOn({0}, floatResult(self.scalar_type()));
  return python::var_out(self, dims, correction, keepdim, out);
}
at::Tensor& std_out(const at::Tensor& self, at::OptionalIntArrayRef dims, Correction correction, bool keepdim,
                    at::Tensor& out) {
  if (!supported({&self, &out}))
    return orHostInto("aten::std.correction", out, {&self, &out},
                      [&](auto in) { return at::std(in(self), dims, correction, keepdim); });
  python::var_out(self, dims, correction, keepdim, out);
  elementwise(TensorFn::sqrt, out, &out, nullptr);
  return out;
}
at::Tensor std_correction(const at::Tensor& self, at::OptionalIntArrayRef dims, Correction correction, bool keepdim) {
  auto out = emptyOn({0}, floatResult(self.scalar_type()));
  return python::std_out(self, dims, correction, keepdim, out);
}
// (var or std, mean) over the same dimensions.
std::tuple<at::Tensor, at::Tensor> var_mean_correction(const at::Tensor& self, at::OptionalIntArrayRef dims, Correction correction,
                                                       bool keepdim) {
  return {python::var_correction(self, dims, correction, keepdim), at::mean(self, dims ? *dims : at::IntArrayRef{}, keepdim)};
}
std::tuple<at::Tensor, at::Tensor> std_mean_correction(const at::Tensor& self, at::OptionalIntArrayRef dims, Correction correction,
                                                       bool keepdim) {
  return {python::std_correction(self, dims, correction, keepdim), at::mean(self, dims ? *dims : at::IntArrayRef{}, keepdim)};
}

// The vector norms training uses (gradient clipping): ord 1, 2, +-inf and any other p > 0.
at::Tensor& linalg_vector_norm_out(const at::Tensor& self, const at::Scalar& ord, at::OptionalIntArrayRef dims, bool keepdim,
                                   c10::optional<at::ScalarType> dtype, at::Tensor& out) {
  const double p = ord.toDouble();
  if (!supported({&self, &out}) || (dtype && *dtype != at::kFloat) || !(p > 0) || self.numel() == 0)
    return orHostInto("aten::linalg_vector_norm", out, {&self, &out}, [&](auto in) {
      const auto x = in(self);
      return at::linalg_vector_norm(x, ord, dims, keepdim, onDevice(x) ? c10::nullopt : dtype);
    });
  const uint32_t mask = maskOf(dims, self.dim());
  auto magnitude = emptyOn(self.sizes());
  elementwise(TensorFn::abs, magnitude, &self, nullptr);
  at::native::resize_output(out, reducedShape(self, mask, keepdim));
  if (std::isinf(p)) {
    reduceInto(TensorFn::amax, out, magnitude, self.dim() ? mask : 1, keepdim);
    return out;
  }
  if (p != 1) elementwise(TensorFn::pow, magnitude, &magnitude, nullptr, static_cast<float>(p));
  sumInto(out, magnitude, self.dim() ? mask : 1, keepdim, 1);
  if (p != 1) elementwise(TensorFn::pow, out, &out, nullptr, static_cast<float>(1 / p));
  return out;
}
// torch.norm's older entry point: the same norms.
at::Tensor& norm_out(const at::Tensor& self, const c10::optional<at::Scalar>& p, c10::IntArrayRef dims, bool keepdim, at::Tensor& out) {
  return python::linalg_vector_norm_out(self, p.value_or(2), dims, keepdim, c10::nullopt, out);
}
at::Tensor norm(const at::Tensor& self, const c10::optional<at::Scalar>& p, c10::IntArrayRef dims, bool keepdim) {
  auto out = emptyOn({0}, floatResult(self.scalar_type()));
  return python::norm_out(self, p, dims, keepdim, out);
}
at::Tensor linalg_vector_norm(const at::Tensor& self, const at::Scalar& ord, at::OptionalIntArrayRef dims, bool keepdim,
                              c10::optional<at::ScalarType> dtype) {
  auto out = emptyOn({0}, dtype.value_or(floatResult(self.scalar_type())));
  return python::linalg_vector_norm_out(self, ord, dims, keepdim, dtype, out);
}

// ---- Sorting: one sort op a row --------------------------------------------------------

// values and indices = self's rows along `dim` in order (a stable sort: equal values keep
// their order, which PyTorch's unstable default leaves open; a NaN above every number).
// f32 and i64 on the card; other dtypes, and outs of other types, on the host.
bool sortOnCard(const at::Tensor& self, const at::Tensor& values, const at::Tensor& indices) {
  return typed(self) && self.scalar_type() != at::kBool && typed(values) && values.scalar_type() == self.scalar_type() &&
         typed(indices) && indices.scalar_type() == at::kLong;
}
// The host's (values, indices) copied into the outs.
std::tuple<at::Tensor&, at::Tensor&> hostPairInto(const char* name, at::Tensor& values, at::Tensor& indices,
                                                  const std::tuple<at::Tensor, at::Tensor>& result) {
  hostInto(name, values, std::get<0>(result));
  at::native::resize_output(indices, std::get<1>(result).sizes());
  indices.copy_(std::get<1>(result));
  return {values, indices};
}
void sortRows(const at::Tensor& self, int64_t dim, bool descending, at::Tensor& values, at::Tensor& indices) {
  at::native::resize_output(values, self.sizes());
  at::native::resize_output(indices, self.sizes());
  if (self.numel() == 0) return;
  const int64_t last = std::max<int64_t>(self.dim(), 1) - 1;
  auto x = self.dim() == 0 ? self.reshape({1}) : self.movedim(dim, last);
  auto v = values.dim() == 0 ? values.view({1}) : values.movedim(dim, last);
  auto i = indices.dim() == 0 ? indices.view({1}) : indices.movedim(dim, last);
  auto scratch = emptyOn(x.sizes(), at::kLong);
  Locked s;
  client::TensorOp op;
  op.fn = TensorFn::sort;
  op.shape = shapeOf(x.sizes());
  op.operands = {operand(v, v.strides()), operand(x, x.strides()), operand(i, i.strides()), operand(scratch, scratch.strides())};
  op.alpha = descending ? 1 : 0;
  send(*s, op);
  notePositions(indices, x.size(last));
}
std::tuple<at::Tensor&, at::Tensor&> sort_values_stable(const at::Tensor& self, c10::optional<bool> stable, int64_t dim,
                                                        bool descending, at::Tensor& values, at::Tensor& indices) {
  // bool: sorted as i64 (false before true), the values made bool again on the card.
  auto isBool = [](const at::Tensor& t) { return typed(t) && t.scalar_type() == at::kBool; };
  auto sorted = [&](const at::Tensor& x, at::Tensor& v) { python::sort_values_stable(x, stable, dim, descending, v, indices); };
  if (isBool(self) && isBool(values) && typed(indices) && indices.scalar_type() == at::kLong)
    return selectedFrom(self.to(at::kLong), values, indices, sorted);
  if (reducedFloats({&self, &values})) return selectedFrom(widened(self, self.scalar_type()), values, indices, sorted);
  if (!sortOnCard(self, values, indices))
    return hostPairInto("aten::sort", values, indices, at::sort(host(self), stable, dim, descending));
  dim = c10::maybe_wrap_dim(dim, self.dim());
  TORCH_CHECK(self.dim() == 0 || !values.is_same(self), "raccel: sort into its own input");
  sortRows(self, dim, descending, values, indices);
  return {values, indices};
}
std::tuple<at::Tensor, at::Tensor> sort_stable(const at::Tensor& self, c10::optional<bool> stable, int64_t dim, bool descending) {
  auto values = emptyOn({0}, self.scalar_type()), indices = emptyOn({0}, at::kLong);
  python::sort_values_stable(self, stable, dim, descending, values, indices);
  return {values, indices};
}
// topk: the first k of a sort (largest: descending), so its order among equal values is
// the stable sort's.
std::tuple<at::Tensor&, at::Tensor&> topk_values(const at::Tensor& self, int64_t k, int64_t dim, bool largest, bool sorted,
                                                 at::Tensor& values, at::Tensor& indices) {
  if (reducedFloats({&self, &values}))
    return selectedFrom(widened(self, self.scalar_type()), values, indices,
                        [&](const at::Tensor& x, at::Tensor& v) { python::topk_values(x, k, dim, largest, sorted, v, indices); });
  if (!sortOnCard(self, values, indices))
    return hostPairInto("aten::topk", values, indices, at::topk(host(self), k, dim, largest, sorted));
  dim = c10::maybe_wrap_dim(dim, self.dim());
  const int64_t n = self.dim() == 0 ? 1 : self.size(dim);
  TORCH_CHECK(k >= 0 && k <= n, "selected index k out of range");
  auto allValues = emptyOn({0}, self.scalar_type()), allIndices = emptyOn({0}, at::kLong);
  sortRows(self, dim, largest, allValues, allIndices);
  auto firstValues = self.dim() == 0 ? allValues : allValues.narrow(dim, 0, k);
  auto firstIndices = self.dim() == 0 ? allIndices : allIndices.narrow(dim, 0, k);
  at::native::resize_output(values, firstValues.sizes());
  at::native::resize_output(indices, firstIndices.sizes());
  values.copy_(firstValues);
  indices.copy_(firstIndices);
  notePositions(indices, n);
  return {values, indices};
}
std::tuple<at::Tensor, at::Tensor> topk(const at::Tensor& self, int64_t k, int64_t dim, bool largest, bool sorted) {
  auto values = emptyOn({0}, self.scalar_type()), indices = emptyOn({0}, at::kLong);
  python::topk_values(self, k, dim, largest, sorted, values, indices);
  return {values, indices};
}
// kthvalue (k from 1) and the median ((n - 1) / 2 from 0) over a dimension: the row
// sorted on the card, then the element at that place and its position. A row with a NaN
// has NaN as its median, at its first NaN, as on PyTorch's CPU (a NaN sorts above every
// number, so kthvalue counts it the largest, as the CPU does). Among equal values the
// position is the first in the row's order; PyTorch leaves which one open (its CPU's
// selection may give another). nanmedian's place counts the row's numbers alone (NaNs
// sort last): (numbers - 1) / 2, the first place where all are NaN.
enum class Place { fixed, median, nanmedian };
void pickSorted(const at::Tensor& self, int64_t place, Place how, int64_t dim, bool keepdim, at::Tensor& values,
                at::Tensor& indices) {
  auto all = emptyOn({0}, self.scalar_type()), positions = emptyOn({0}, at::kLong);
  sortRows(self, dim, false, all, positions);
  const int64_t n = self.dim() == 0 ? 1 : self.size(dim);
  auto pick = at::full(self.dim() == 0 ? std::vector<int64_t>{1} : reducedShape(self, 1u << dim, true), place,
                       positions.options());
  if (how != Place::fixed && self.is_floating_point()) {
    auto nans = at::isnan(self).sum(dim, /*keepdim=*/true);
    if (how == Place::median) pick = pick + (nans > 0) * ((n - nans) - place);  // the first NaN's place: n less the NaNs
    else pick = (n - 1 - nans).clamp_min(0).div(2, "floor");
  }
  TrustedIndices inRange;  // (pick: a place in each row)
  auto v = self.dim() == 0 ? all : all.gather(dim, pick), i = self.dim() == 0 ? positions : positions.gather(dim, pick);
  if (!keepdim && self.dim() > 0) v = v.squeeze(dim), i = i.squeeze(dim);
  at::native::resize_output(values, v.sizes());
  at::native::resize_output(indices, i.sizes());
  values.copy_(v);
  indices.copy_(i);
  notePositions(indices, n);
}
std::tuple<at::Tensor&, at::Tensor&> kthvalue_values(const at::Tensor& self, int64_t k, int64_t dim, bool keepdim,
                                                     at::Tensor& values, at::Tensor& indices) {
  if (reducedFloats({&self, &values}))
    return selectedFrom(widened(self, self.scalar_type()), values, indices,
                        [&](const at::Tensor& x, at::Tensor& v) { python::kthvalue_values(x, k, dim, keepdim, v, indices); });
  if (!sortOnCard(self, values, indices) || self.numel() == 0)
    return hostPairInto("aten::kthvalue.values", values, indices, at::kthvalue(host(self), k, dim, keepdim));
  dim = c10::maybe_wrap_dim(dim, std::max<int64_t>(self.dim(), 1));
  const int64_t n = self.dim() == 0 ? 1 : self.size(dim);
  TORCH_CHECK(k >= 1 && k <= n, "kthvalue(): selected number k out of range for dimension ", dim);
  pickSorted(self, k - 1, Place::fixed, dim, keepdim, values, indices);
  return {values, indices};
}
std::tuple<at::Tensor&, at::Tensor&> middleInto(const char* name, Place how, const at::Tensor& self, int64_t dim, bool keepdim,
                                                at::Tensor& values, at::Tensor& indices) {
  if (reducedFloats({&self, &values}))
    return selectedFrom(widened(self, self.scalar_type()), values, indices,
                        [&](const at::Tensor& x, at::Tensor& v) { middleInto(name, how, x, dim, keepdim, v, indices); });
  if (!sortOnCard(self, values, indices) || self.numel() == 0)
    return hostPairInto(name, values, indices,
                        how == Place::median ? at::median(host(self), dim, keepdim) : at::nanmedian(host(self), dim, keepdim));
  dim = c10::maybe_wrap_dim(dim, std::max<int64_t>(self.dim(), 1));
  const int64_t n = self.dim() == 0 ? 1 : self.size(dim);
  pickSorted(self, (n - 1) / 2, how, dim, keepdim, values, indices);
  return {values, indices};
}
std::tuple<at::Tensor&, at::Tensor&> median_dim_values(const at::Tensor& self, int64_t dim, bool keepdim, at::Tensor& values,
                                                       at::Tensor& indices) {
  return middleInto("aten::median.dim_values", Place::median, self, dim, keepdim, values, indices);
}
std::tuple<at::Tensor&, at::Tensor&> nanmedian_dim_values(const at::Tensor& self, int64_t dim, bool keepdim, at::Tensor& values,
                                                          at::Tensor& indices) {
  return middleInto("aten::nanmedian.dim_values", Place::nanmedian, self, dim, keepdim, values, indices);
}
// bucketize and searchsorted over 1-d f32 boundaries: for each element, the count of
// boundaries below it (right: at or below it), which is where PyTorch's binary search puts
// it among sorted boundaries; a NaN, which compares false, goes past them all, as there.
// One comparison of each element with each boundary, so only while those are few
// (withinComposedElements); i32 results (out_int32) and sorters stay on the host.
bool bucketsOnCard(const at::Tensor& self, const at::Tensor& boundaries, bool outInt32) {
  return !outInt32 && isF32(self) && self.dim() < 6 && isF32(boundaries) && boundaries.dim() == 1 &&
         withinComposedElements(self.numel(), boundaries.numel());
}
at::Tensor bucketOf(const at::Tensor& self, const at::Tensor& boundaries, bool right) {
  auto x = self.unsqueeze(-1);
  return (right ? at::lt(x, boundaries) : at::le(x, boundaries)).logical_not().sum(-1);
}
at::Tensor bucketize(const at::Tensor& self, const at::Tensor& boundaries, bool outInt32, bool right) {
  if (!bucketsOnCard(self, boundaries, outInt32))
    return onHost("aten::bucketize.Tensor",
                  [&] { return at::bucketize(host(self), host(boundaries), outInt32, right).to(self.device()); });
  return bucketOf(self, boundaries, right);
}
at::Tensor searchsorted(const at::Tensor& sorted, const at::Tensor& self, bool outInt32, bool right,
                        c10::optional<c10::string_view> side, const c10::optional<at::Tensor>& sorter) {
  // (side and right that disagree are PyTorch's error, raised on the host)
  const bool agreed = !side || !(right && *side == "left");
  if (present(sorter) || !agreed || !bucketsOnCard(self, sorted, outInt32))
    return onHost("aten::searchsorted.Tensor", [&] {
      return at::searchsorted(host(sorted), host(self), outInt32, right, side,
                              present(sorter) ? c10::optional<at::Tensor>(host(*sorter)) : c10::nullopt)
          .to(self.device());
    });
  return bucketOf(self, sorted, right || (side && *side == "right"));
}

// The runs of equal neighbours in `flat` (1-D, not empty): where each starts (i64, read
// to size them: one wait, as nonzero's), each element's run, and each run's length.
struct Runs {
  at::Tensor firsts, starts;
};
Runs runsOf(const at::Tensor& flat) {
  const int64_t n = flat.numel();
  auto firsts = at::ones({1}, flat.options().dtype(at::kBool));
  if (n > 1) firsts = at::cat({firsts, at::ne(flat.narrow(0, 1, n - 1), flat.narrow(0, 0, n - 1))});
  return {firsts, at::nonzero(firsts).reshape({-1})};
}
at::Tensor runOfEach(const Runs& r) { return at::cumsum(r.firsts, 0) - 1; }
at::Tensor runLengths(const Runs& r, int64_t n) {
  const int64_t runs = r.starts.numel();
  return at::cat({r.starts.narrow(0, 1, runs - 1), at::full({1}, n, r.starts.options())}) - r.starts;
}
bool runsOnCard(const at::Tensor& self) { return typed(self) && self.scalar_type() != at::kBool && self.numel() > 0; }

// unique (torch.unique without a dim): the first of each run of equal values in the
// sorted elements. The inverse is each run's number scattered back through the sort's
// positions; the counts are the runs' lengths. Sorted either way (PyTorch's CPU leaves
// the order open when sorted=False); each NaN is a value of its own, last, with a count
// of 1 (PyTorch 1.13's CPU puts NaNs among the values with counts of 0).
constexpr int64_t kExactF32 = int64_t{1} << 24;  // every integer up to this is an f32
std::tuple<at::Tensor, at::Tensor, at::Tensor> _unique2(const at::Tensor& self, bool sorted, bool returnInverse,
                                                        bool returnCounts) {
  if (!runsOnCard(self))
    return onHost("aten::_unique2", [&] {
      auto [values, inverse, counts] = at::_unique2(host(self), sorted, returnInverse, returnCounts);
      return std::make_tuple(values.to(self.device()), inverse.to(self.device()), counts.to(self.device()));
    });
  const int64_t n = self.numel();
  auto [values, order] = at::sort(self.reshape({-1}), /*stable=*/true, 0, false);
  const auto r = runsOf(values);
  auto inverse = emptyOn({0}, at::kLong), counts = emptyOn({0}, at::kLong);
  if (returnInverse) {  // (as f32, exact up to 2^24 elements, where the card scatters a src; past that, as i64)
    auto run = runOfEach(r);
    inverse = n <= kExactF32 ? at::zeros({n}, self.options().dtype(at::kFloat)).scatter_(0, order, run.to(at::kFloat)).to(at::kLong)
                             : at::zeros({n}, run.options()).scatter_(0, order, run);
    inverse = inverse.reshape(self.sizes());
  }
  if (returnCounts) counts = runLengths(r, n);
  return {values.index_select(0, r.starts), inverse, counts};
}
// unique_consecutive without a dim (CTC's greedy decoding collapses its repeats so): the
// same runs over the elements in their order; each NaN a run of its own, as PyTorch's CPU
// compares with !=. Over a dim, bool, or no elements: the host.
std::tuple<at::Tensor, at::Tensor, at::Tensor> unique_consecutive(const at::Tensor& self, bool returnInverse, bool returnCounts,
                                                                  c10::optional<int64_t> dim) {
  if (!runsOnCard(self) || dim)
    return onHost("aten::unique_consecutive", [&] {
      auto [values, inverse, counts] = at::unique_consecutive(host(self), returnInverse, returnCounts, dim);
      return std::make_tuple(values.to(self.device()), inverse.to(self.device()), counts.to(self.device()));
    });
  const auto flat = self.reshape({-1});
  const auto r = runsOf(flat);
  auto inverse = returnInverse ? runOfEach(r).reshape(self.sizes()) : emptyOn({0}, at::kLong);
  auto counts = returnCounts ? runLengths(r, flat.numel()) : emptyOn({0}, at::kLong);
  return {flat.index_select(0, r.starts), inverse, counts};
}

at::Tensor middleOfAll(const char* name, Place how, const at::Tensor& self) {
  if (!(typed(self) || reducedFloats({&self})) || self.scalar_type() == at::kBool || self.numel() == 0)
    return onHost(name, [&] { return (how == Place::median ? at::median(host(self)) : at::nanmedian(host(self))).to(self.device()); });
  auto values = emptyOn({0}, self.scalar_type()), indices = emptyOn({0}, at::kLong);
  middleInto(name, how, self.reshape({-1}), 0, false, values, indices);
  return values;
}
at::Tensor median(const at::Tensor& self) { return middleOfAll("aten::median", Place::median, self); }  // of every element
at::Tensor nanmedian(const at::Tensor& self) { return middleOfAll("aten::nanmedian", Place::nanmedian, self); }

// cummax and cummin along a dimension: the running largest (smallest) value and its
// position, as PyTorch's CPU loop keeps them: an equal value takes over (a tie goes to
// the later position), and a NaN takes over and stays until the next NaN. A Hillis-
// Steele scan of log2(n) rounds, each combining every prefix's pair with the pair 2^k
// before it by that same rule (which combines two runs' results exactly as the loop
// would run on through both).
void cumulativeExtremum(const char* name, bool largest, const at::Tensor& self, at::Tensor& values, at::Tensor& indices,
                        int64_t dim) {
  const bool ok = typed(self) && self.scalar_type() != at::kBool && onDevice(values) &&
                  values.scalar_type() == self.scalar_type() && onDevice(indices) && indices.scalar_type() == at::kLong &&
                  self.dim() > 0;
  if (!ok) {
    countFallback(name);
    auto hostValues = at::empty(self.sizes(), self.options().device(at::kCPU));
    auto hostIndices = at::empty(self.sizes(), self.options().device(at::kCPU).dtype(at::kLong));
    if (largest) at::_cummax_helper(host(self), hostValues, hostIndices, dim);
    else at::_cummin_helper(host(self), hostValues, hostIndices, dim);
    values.copy_(hostValues);
    indices.copy_(hostIndices);
    return;
  }
  const int64_t n = self.size(dim);
  std::vector<int64_t> along(self.dim(), 1);
  along[dim] = n;
  auto v = self.contiguous().clone();
  auto i = at::arange(n, at::kLong).to(self.device()).view(along).expand(self.sizes()).contiguous();
  for (int64_t s = 1; s < n; s *= 2) {  // every prefix's pair after the pair s before it
    auto av = v.narrow(dim, 0, n - s), ai = i.narrow(dim, 0, n - s);
    auto bv = v.narrow(dim, s, n - s), bi = i.narrow(dim, s, n - s);
    auto take = at::isnan(bv).logical_or(at::isnan(av).logical_not().logical_and(largest ? bv >= av : bv <= av));
    auto nextValues = at::where(take, bv, av), nextIndices = at::where(take, bi, ai);  // (made before either is written)
    bv.copy_(nextValues);
    bi.copy_(nextIndices);
  }
  values.copy_(v);
  indices.copy_(i);
  notePositions(indices, n);
}
void _cummax_helper(const at::Tensor& self, at::Tensor& values, at::Tensor& indices, int64_t dim) {
  cumulativeExtremum("aten::_cummax_helper", true, self, values, indices, dim);
}
void _cummin_helper(const at::Tensor& self, at::Tensor& values, at::Tensor& indices, int64_t dim) {
  cumulativeExtremum("aten::_cummin_helper", false, self, values, indices, dim);
}

// nansum: the sum with NaNs counted as 0 (nanmean divides it by the count of the others).
at::Tensor& nansum_out(const at::Tensor& self, at::OptionalIntArrayRef dims, bool keepdim, c10::optional<at::ScalarType> dtype,
                       at::Tensor& out) {
  if (!supported({&self}) || (dtype && *dtype != at::kFloat))
    return hostInto("aten::nansum", out, at::nansum(host(self), dims, keepdim, dtype));
  return python::sum_out(at::where(self != self, at::zeros({}, self.options()), self), dims, keepdim, dtype, out);
}
at::Tensor nansum(const at::Tensor& self, at::OptionalIntArrayRef dims, bool keepdim, c10::optional<at::ScalarType> dtype) {
  auto out = emptyOn({0}, dtype.value_or(self.scalar_type()));
  return python::nansum_out(self, dims, keepdim, dtype, out);
}
// aminmax: amin and amax, over a dimension or everything.
std::tuple<at::Tensor&, at::Tensor&> aminmax_out(const at::Tensor& self, c10::optional<int64_t> dim, bool keepdim, at::Tensor& min,
                                                 at::Tensor& max) {
  if (!typed(self) || self.scalar_type() == at::kBool || self.numel() == 0) {
    countFallback("aten::aminmax.out");
    auto [lo, hi] = at::aminmax(host(self), dim, keepdim);
    resultInto(min, lo), resultInto(max, hi);
    return {min, max};
  }
  if (dim) {
    resultInto(min, self.amin(*dim, keepdim)), resultInto(max, self.amax(*dim, keepdim));
  } else {
    auto flat = self.reshape({-1});
    resultInto(min, keepdim ? flat.amin().reshape(std::vector<int64_t>(self.dim(), 1)) : flat.amin());
    resultInto(max, keepdim ? flat.amax().reshape(std::vector<int64_t>(self.dim(), 1)) : flat.amax());
  }
  return {min, max};
}

// ---- Counts: bincount and histc --------------------------------------------------------

// Each position's count, added on the card: ones at `bin` (i64 in [0, bins)), weighted by
// `weight` where given (a 0/1 mask, or bincount's weights), into f32 counts (exact: at most 2^24 are counted).
at::Tensor binCounts(const at::Tensor& bin, int64_t bins, const at::Tensor* weight) {
  auto counts = emptyOn({bins}).zero_();
  TrustedIndices inRange;  // (the callers made or checked bin)
  return counts.index_add_(0, bin, weight ? *weight : at::ones({bin.numel()}, counts.options()));
}
constexpr int64_t kMaxCounted = int64_t{1} << 24;

// bincount of non-negative i64: i64 counts, or with f32 weights their f32 sums (as
// PyTorch's CPU), as many as the largest value + 1 or minlength (the largest value read
// back: it sets the result's size), below 2^24. Weights must be one a value, as PyTorch
// checks.
at::Tensor bincount(const at::Tensor& self, const c10::optional<at::Tensor>& weights, int64_t minlength) {
  const bool weighted = present(weights);
  const bool ok = typed(self) && self.scalar_type() == at::kLong && self.dim() == 1 && minlength >= 0 &&
                  self.numel() <= kMaxCounted && (!weighted || (isF32(*weights) && weights->dim() == 1));
  auto onTheHost = [&] {
    return onHost("aten::bincount", [&] {
      return at::bincount(host(self), weighted ? c10::optional<at::Tensor>(host(*weights)) : c10::nullopt, minlength)
          .to(self.device());
    });
  };
  if (!ok) return onTheHost();
  TORCH_CHECK(!weighted || weights->size(0) == self.size(0), "weights should be 1-d and have the same length as input");
  const auto type = weighted ? at::kFloat : at::kLong;
  if (self.numel() == 0) return emptyOn({minlength}, type).zero_();
  auto read = extremesOnHost(self);
  const int64_t lo = read[0].item<int64_t>(), hi = read[1].item<int64_t>();
  TORCH_CHECK(lo >= 0, "bincount only supports 1-d non-negative integral inputs.");
  if (hi >= kMaxCounted) return onTheHost();  // (more bins than values: the host's, as PyTorch's CPU allocates them)
  notePositions(self, hi + 1);
  auto counts = binCounts(self, std::max(hi + 1, minlength), weighted ? &*weights : nullptr);
  return weighted ? counts : counts.to(at::kLong);
}

// histc: f32 counts of `bins` equal bins over [min, max] (the input's own extremes, read
// back, where min == max), each element's bin as PyTorch's CPU computes it,
// (x - min) * bins / (max - min) in f32 and truncated, the last bin closed; elements
// outside and NaN counted nowhere.
at::Tensor& histc_out(const at::Tensor& self, int64_t bins, const at::Scalar& min, const at::Scalar& max, at::Tensor& out) {
  const bool ok = supported({&self, &out}) && bins > 0 && bins <= kMaxCounted && self.numel() <= kMaxCounted;
  if (!ok) return hostInto("aten::histc", out, at::histc(host(self), bins, min, max));
  double lo = min.toDouble(), hi = max.toDouble();
  if (lo == hi && self.numel() > 0) {
    auto read = extremesOnHost(self);
    lo = read[0].item<float>(), hi = read[1].item<float>();
  }
  if (lo == hi) lo -= 1, hi += 1;
  TORCH_CHECK(std::isfinite(lo) && std::isfinite(hi), "torch.histc: range of [", lo, ", ", hi, "] is not finite");
  TORCH_CHECK(lo < hi, "torch.histc: max must be larger than min");
  at::native::resize_output(out, {bins});
  if (self.numel() == 0) return out.zero_();
  const float left = static_cast<float>(lo), right = static_cast<float>(hi);
  auto x = self.reshape({-1});
  auto width = at::full({}, right - left, x.options());  // (a tensor: a true division, not a product by its inverse)
  auto position = at::trunc((x - left) * static_cast<float>(bins) / width).clamp_max(bins - 1);
  auto counted = (x >= left) & (x <= right);
  auto bin = at::where(counted, position, at::zeros({}, x.options())).to(at::kLong);
  auto weight = counted.to(at::kFloat);
  return out.copy_(binCounts(bin, bins, &weight));
}
at::Tensor histc(const at::Tensor& self, int64_t bins, const at::Scalar& min, const at::Scalar& max) {
  auto out = emptyOn({0});
  return python::histc_out(self, bins, min, max, out);
}

}  // namespace

// Reductions and sorting, and counts.
void registerReductions(torch::Library& m) {
  m.impl("bincount", TORCH_FN(python::bincount));
  m.impl("nansum", TORCH_FN(python::nansum));
  m.impl("nansum.out", TORCH_FN(nansum_out));
  m.impl("aminmax.out", TORCH_FN(aminmax_out));
  m.impl("histc.out", TORCH_FN(histc_out));
  m.impl("histc", TORCH_FN(python::histc));
  m.impl("_unique2", TORCH_FN(python::_unique2));
  m.impl("unique_consecutive", TORCH_FN(python::unique_consecutive));
  m.impl("bucketize.Tensor", TORCH_FN(python::bucketize));
  m.impl("searchsorted.Tensor", TORCH_FN(python::searchsorted));
  m.impl("_cummax_helper", TORCH_FN(python::_cummax_helper));
  m.impl("_cummin_helper", TORCH_FN(python::_cummin_helper));
  m.impl("sort.values_stable", TORCH_FN(sort_values_stable));
  m.impl("sort.stable", TORCH_FN(python::sort_stable));
  m.impl("topk.values", TORCH_FN(topk_values));
  m.impl("kthvalue.values", TORCH_FN(kthvalue_values));
  m.impl("median.dim_values", TORCH_FN(median_dim_values));
  m.impl("median", TORCH_FN(python::median));
  m.impl("nanmedian.dim_values", TORCH_FN(nanmedian_dim_values));
  m.impl("nanmedian", TORCH_FN(python::nanmedian));
  m.impl("topk", TORCH_FN(python::topk));
  m.impl("amax.out", TORCH_FN(amax_out));
  m.impl("amax", TORCH_FN(python::amax));
  m.impl("amin.out", TORCH_FN(amin_out));
  m.impl("amin", TORCH_FN(python::amin));
  m.impl("argmax.out", TORCH_FN(argmax_out));
  m.impl("argmax", TORCH_FN(python::argmax));
  m.impl("argmin.out", TORCH_FN(argmin_out));
  m.impl("argmin", TORCH_FN(python::argmin));
  m.impl("max.dim_max", TORCH_FN(max_dim_out));
  m.impl("max.dim", TORCH_FN(max_dim));
  m.impl("max", TORCH_FN(max_all));
  m.impl("min.dim_min", TORCH_FN(min_dim_out));
  m.impl("min.dim", TORCH_FN(min_dim));
  m.impl("min", TORCH_FN(min_all));
  m.impl("var.correction_out", TORCH_FN(var_out));
  m.impl("var.correction", TORCH_FN(var_correction));
  m.impl("std.correction_out", TORCH_FN(std_out));
  m.impl("std.correction", TORCH_FN(std_correction));
  m.impl("var_mean.correction", TORCH_FN(var_mean_correction));
  m.impl("std_mean.correction", TORCH_FN(std_mean_correction));
  m.impl("linalg_vector_norm.out", TORCH_FN(linalg_vector_norm_out));
  m.impl("linalg_vector_norm", TORCH_FN(python::linalg_vector_norm));
  m.impl("norm.out", TORCH_FN(norm_out));
  m.impl("norm.ScalarOpt_dim", TORCH_FN(python::norm));
}

}  // namespace raccel::python
