// Tensors as tensor-op operands, the ops' sending, the counted CPU fallback, and the
// index checks (torch_device.h).
#include "vmfrontend/python/torch_device.h"

namespace raccel::python {

// ---- Operands -------------------------------------------------------------------------

std::optional<client::TensorType> typeOf(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return client::TensorType::f32;
    case at::kLong: return client::TensorType::i64;
    case at::kBool: return client::TensorType::boolean;
    default: return std::nullopt;
  }
}
std::optional<client::TensorType> storageTypeOf(at::ScalarType t) {
  switch (t) {
    case at::kInt: return client::TensorType::i32;
    case at::kDouble: return client::TensorType::f64;
    case at::kHalf: return client::TensorType::f16;
    case at::kBFloat16: return client::TensorType::bf16;
    default: return typeOf(t);
  }
}

void countFallback(const std::string& op) {
  std::lock_guard lock(state().countsMu);
  ++state().fallbacks[op];
}

client::TensorOperand operand(const at::Tensor& t, c10::IntArrayRef strides) {
  client::TensorOperand o;
  if (t.numel() > 0) {
    auto [handle, byteOffset] = locate(t.data_ptr());
    o.buffer = handle;
    o.offset = byteOffset / t.element_size();
  }
  o.type = storageTypeOf(t.scalar_type()).value_or(client::TensorType::f32);  // other dtypes never reach an op
  for (auto s : strides) {
    TORCH_CHECK(s >= 0, "raccel: negative strides are not supported");
    o.strides.push_back(static_cast<uint64_t>(s));
  }
  if (o.strides.empty()) o.strides.push_back(0);
  return o;
}
std::vector<uint64_t> shapeOf(c10::IntArrayRef sizes) {
  std::vector<uint64_t> shape(sizes.begin(), sizes.end());
  if (shape.empty()) shape.push_back(1);
  return shape;
}

namespace {

// Tensor ops go out in runs of kOpsPerSend (the session's link would keep them until 256
// KiB or a wait: a training step's ops until its end), so that the card works on a step's
// first ops while Python makes the rest: the tiny transformer's step here took 15-25%
// less. (Runs of 8 or 32 gained less; an OpenCL program's tiny kernels lost by it, and
// the ICD keeps its runs to clFlush.)
constexpr unsigned kOpsPerSend = 16;
void forgetWritten(const client::TensorOp& op);
}  // namespace

void send(client::Session& s, client::TensorOp op) {
  for (auto d : op.shape)
    if (d == 0) return;  // nothing to compute
  forgetWritten(op);
  s.tensor(op);
  static unsigned unsent = 0;  // (under the session's lock, as every send)
  if (++unsent == kOpsPerSend) {
    unsent = 0;
    (void)s.sendQueued();  // a lost link is the next wait's error
  }
}

namespace {

// An elementwise op over as few dimensions as its operands allow, the same elements paired
// in the same places: dimensions of size 1 dropped, and a dimension merged into the one
// inside it where every operand steps over both as over one (a contiguous [N, C, H, W] is
// one dimension; repeat's views of 2 x rank dimensions mostly fit). Past the tensor ops'
// six, one op per index of the leading dimension.
constexpr size_t kMaxOpDims = 6;
void coalesce(client::TensorOp& op) {
  std::vector<uint64_t> shape;  // innermost first while built
  std::vector<std::vector<uint64_t>> strides(op.operands.size());
  for (size_t d = op.shape.size(); d-- > 0;) {
    if (op.shape[d] == 1) continue;
    bool merges = !shape.empty();
    for (size_t k = 0; merges && k < op.operands.size(); ++k)
      merges = op.operands[k].strides[d] == strides[k].back() * shape.back();
    if (merges) {
      shape.back() *= op.shape[d];
      continue;
    }
    shape.push_back(op.shape[d]);
    for (size_t k = 0; k < op.operands.size(); ++k) strides[k].push_back(op.operands[k].strides[d]);
  }
  if (shape.empty()) {
    shape.push_back(1);
    for (auto& st : strides) st.push_back(0);
  }
  op.shape.assign(shape.rbegin(), shape.rend());
  for (size_t k = 0; k < op.operands.size(); ++k) op.operands[k].strides.assign(strides[k].rbegin(), strides[k].rend());
}
void sendElementwise(client::Session& s, const client::TensorOp& op) {
  if (op.shape.size() <= kMaxOpDims) return send(s, op);
  client::TensorOp inner = op;
  inner.shape.erase(inner.shape.begin());
  for (auto& o : inner.operands) o.strides.erase(o.strides.begin());
  for (uint64_t i = 0; i < op.shape[0]; ++i) {
    for (size_t k = 0; k < op.operands.size(); ++k) inner.operands[k].offset = op.operands[k].offset + i * op.operands[k].strides[0];
    sendElementwise(s, inner);
  }
}

}  // namespace

void elementwise(TensorFn fn, const at::Tensor& out, const at::Tensor* a, const at::Tensor* b, float alpha, float beta,
                 const at::Tensor* c) {
  Locked s;
  client::TensorOp op;
  op.fn = fn;
  op.shape = shapeOf(out.sizes());
  op.operands.push_back(operand(out, out.strides()));
  for (const at::Tensor* x : {a, b, c})
    if (x) op.operands.push_back(operand(*x, at::inferExpandGeometry_dimvector(x->sizes(), x->strides(), out.sizes()).strides));
  op.alpha = alpha, op.beta = beta;
  for (auto d : op.shape)
    if (d == 0) return;  // nothing to compute (and no element to place)
  coalesce(op);
  sendElementwise(*s, op);
}

bool supported(std::initializer_list<const at::Tensor*> tensors) {
  for (auto* t : tensors)
    if (t && t->defined() && !(isF32(*t) && t->dim() <= 6)) return false;
  return true;
}


at::Tensor& hostInto(const char* name, at::Tensor& out, const at::Tensor& result) {
  countFallback(name);
  return resultInto(out, result);
}
at::Tensor& resultInto(at::Tensor& out, const at::Tensor& result) {
  at::native::resize_output(out, result.sizes());
  return out.copy_(result);
}

// ---- Reduced floats (torch_device.h) --------------------------------------------------

namespace {
bool isReduced(at::ScalarType t) { return t == at::kHalf || t == at::kBFloat16; }
}  // namespace
bool reducedFloats(std::initializer_list<const at::Tensor*> tensors) {
  bool reduced = false;
  for (auto* t : tensors) {
    if (!t || !t->defined() || isHostScalar(*t)) continue;
    const auto type = t->scalar_type();
    if (!onDevice(*t) || t->dim() > 6 || !(type == at::kFloat || isReduced(type))) return false;
    reduced = reduced || isReduced(type);
  }
  return reduced;
}
at::Tensor widened(const at::Tensor& t, at::ScalarType type) {
  if (!t.defined()) return t;
  if (isHostScalar(t)) return isReduced(type) && t.is_floating_point() ? t.to(type).to(at::kFloat) : t;
  return isReduced(t.scalar_type()) ? t.to(at::kFloat) : t;
}
at::Scalar roundedTo(const at::Scalar& number, at::ScalarType type) {
  if (type == at::kHalf) return at::Scalar(static_cast<double>(static_cast<float>(c10::Half(number.toFloat()))));
  if (type == at::kBFloat16) return at::Scalar(static_cast<double>(static_cast<float>(c10::BFloat16(number.toFloat()))));
  return number;
}

// ---- Index checks (torch_device.h) ---------------------------------------------------

ByteSpan spanOf(const at::Tensor& t) {  // numel > 0; the device's strides are never negative
  auto [handle, begin] = locate(t.data_ptr());
  uint64_t last = 0;
  for (int64_t d = 0; d < t.dim(); ++d) last += uint64_t(t.size(d) - 1) * uint64_t(t.stride(d));
  return {handle, begin, begin + (last + 1) * uint64_t(t.element_size())};
}
namespace {

// The bytes of a buffer that an operand's elements lie in.
ByteSpan operandSpan(const client::TensorOperand& o, const std::vector<uint64_t>& shape) {  // every size > 0
  const uint64_t size = tensorTypeBytes(o.type);
  uint64_t last = o.offset;
  for (size_t d = 0; d < shape.size() && d < o.strides.size(); ++d) last += (shape[d] - 1) * o.strides[d];
  return {o.buffer, o.offset * size, (last + 1) * size};
}
// What an op is about to write is known no longer (send(), under the session's lock).
void forgetWritten(const client::TensorOp& op) {
  auto& known = knownValues();
  if (known.empty()) return;
  const unsigned written = writtenOperands(op.fn);
  for (size_t i = 0; i < op.operands.size(); ++i)
    if (written >> i & 1) {
      auto span = operandSpan(op.operands[i], op.shape);
      known.forget(span.buffer, span.begin, span.end);
    }
}

thread_local int t_trustedIndices = 0;
}  // namespace

TrustedIndices::TrustedIndices() { ++t_trustedIndices; }
TrustedIndices::~TrustedIndices() { --t_trustedIndices; }

namespace {

// The bounds of an i64 tensor's values on the device, read from the card (one wait), with
// `ignored` (if any) counted as `stand` instead; kept for its span when they are its own
// and it is dense (a strided view's span holds elements it does not).
ValueBounds boundsOnCard(const at::Tensor& index, std::optional<int64_t> ignored, int64_t stand) {
  ValueBounds b;
  {
    TrustedIndices trusted;  // (the ops below pick by nothing)
    auto x = ignored ? at::where(index == *ignored, at::full({}, stand, index.options()), index) : index;
    auto lowest = at::full({}, std::numeric_limits<int64_t>::min(), index.options());
    auto read = at::stack({x.amin(), x.amax(), at::where(x < 0, x, lowest).amax()}).cpu();
    const auto* v = read.data_ptr<int64_t>();
    b = {v[0], v[1], v[0] < 0 ? std::optional(v[2]) : std::nullopt};
    ++state().indexReads;
  }
  if (!ignored && index.is_non_overlapping_and_dense()) {
    Locked s;
    auto span = spanOf(index);
    knownValues().note(span.buffer, span.begin, span.end, b);
  }
  return b;
}

}  // namespace

void checkIndex(const at::Tensor& index, int64_t first, int64_t last, std::optional<int64_t> ignored,
                const std::function<void(int64_t)>& fail) {
  if (t_trustedIndices > 0 || index.numel() == 0) return;
  {
    Locked s;
    auto span = spanOf(index);
    if (auto known = knownValues().find(span.buffer, span.begin, span.end); known && known->allWithin(first, last, ignored))
      return;
  }
  if (auto bad = boundsOnCard(index, ignored, first).outside(first, last)) fail(*bad);
}
void checkPicks(const at::Tensor& index, int64_t size) {
  checkIndex(index, 0, size - 1, std::nullopt, [](int64_t) { TORCH_CHECK_INDEX(false, "index out of range in self"); });
}
void checkAlong(const at::Tensor& index, int64_t dim, int64_t size) {
  checkIndex(index, 0, size - 1, std::nullopt, [&](int64_t v) {
    TORCH_CHECK(false, "index ", v, " is out of bounds for dimension ", dim, " with size ", size);
  });
}
void checkIndexing(const at::Tensor& index, int64_t dim, int64_t size) {
  checkIndex(index, -size, size - 1, std::nullopt, [&](int64_t v) {
    TORCH_CHECK_INDEX(false, "index ", v, " is out of bounds for dimension ", dim, " with size ", size);
  });
}
bool knownNonzero(const at::Tensor& t) {
  if (t.numel() == 0) return true;
  Locked s;
  auto span = spanOf(t);
  auto known = knownValues().find(span.buffer, span.begin, span.end);
  return known && (known->lo > 0 || known->hi < 0);
}
void notePositions(const at::Tensor& positions, int64_t n) {
  if (positions.numel() == 0 || n <= 0 || !positions.is_non_overlapping_and_dense()) return;
  Locked s;
  auto span = spanOf(positions);
  knownValues().note(span.buffer, span.begin, span.end, {0, n - 1, std::nullopt});
}


}  // namespace raccel::python
