// The vocabulary the torch device's files share (torch_device.cc says what the device
// is). Each torch_<family>.cc defines the kernels of one family of ops and registers them
// in its register<Family>(); what a family needs of another is declared here. Every
// function that touches the session takes its lock (Locked), on whichever thread
// PyTorch calls it from.
#pragma once

#include <ATen/ATen.h>
#include <ATen/ExpandUtils.h>
#include <ATen/native/Resize.h>
#include <pybind11/pybind11.h>
#include <torch/library.h>
#include <torch/version.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "vmfrontend/python/known_values.h"
#include "vmfrontend/python/shared_session.h"

namespace raccel::python {

using client::Handle;
using client::TensorFn;
constexpr c10::DeviceType kDevice = c10::DeviceType::PrivateUse1;

// Two PyTorch lines build the device: Debian's 1.13 (the package) and 2.x (a GPU
// machine's, scripts/gpu-checks.sh). Where their interfaces differ:
//  - from 2.3 an allocator's allocate() is not const, and copy_data() (a storage's
//    clone) is asked of it (torch_memory.cc);
//  - from 2.1 var and std take their correction as a Scalar, not an int.
#define RACCEL_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) || (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))
#if RACCEL_TORCH_AT_LEAST(2, 1)
using Correction = const c10::optional<at::Scalar>&;
inline double correctionOf(Correction c) { return c ? c->toDouble() : 1.0; }
#else
using Correction = c10::optional<int64_t>;
inline double correctionOf(Correction c) { return double(c.value_or(1)); }
#endif

// ---- The session (torch_memory.cc) ----------------------------------------------------

// Never destroyed: tensors may be freed after Python's shutdown has begun.
struct State {
  std::shared_ptr<SharedSession> shared;
  std::mutex countsMu;
  std::map<std::string, uint64_t> fallbacks;
  std::atomic<uint64_t> indexReads{0};  // index checks that read the index's bounds from the card
};
State& state();

// Holds the session's lock for one op.
class Locked {
 public:
  Locked() : shared_(state().shared) {
    TORCH_CHECK(shared_ && shared_->session, "raccel: no session; call raccel.torch.device() before using the device");
    lock_ = std::unique_lock(shared_->mu);
  }
  client::Session* operator->() { return shared_->session.get(); }
  client::Session& operator*() { return *shared_->session; }

 private:
  std::shared_ptr<SharedSession> shared_;
  std::unique_lock<std::recursive_mutex> lock_;
};

// ---- Memory (torch_memory.cc) ---------------------------------------------------------

// The buffer and byte offset a device address names.
std::pair<Handle, uint64_t> locate(const void* p);
// What is known of the i64 values in the device's memory (known_values.h; the index
// checks): every write into that memory forgets what it overwrote. Under the session's
// lock.
KnownValues& knownValues();
at::Tensor emptyOn(c10::IntArrayRef sizes, at::ScalarType dtype = at::kFloat);
// Host bytes laid out as dst is (dense) into dst; of i64, their bounds are noted as they
// pass (the index checks' usual source: targets and token ids come from the host).
void writeFrom(const at::Tensor& hostSrc, const at::Tensor& dst);
// A device storage's bytes (raccel.torch's read_storage).
pybind11::bytes readStorage(uintptr_t dataPtr, uint64_t nbytes);

// ---- Operands and sending (torch_operands.cc) -----------------------------------------

inline bool onDevice(const at::Tensor& t) { return t.defined() && t.device().type() == kDevice; }
inline bool isF32(const at::Tensor& t) { return onDevice(t) && t.scalar_type() == at::kFloat; }
// The element types tensor ops take: f32, and i64 and bool where an op says so.
std::optional<client::TensorType> typeOf(at::ScalarType t);
// The same with the storage types, which copies, fills and picks alone take: int32
// (linear algebra's pivots and infos), float64, float16 and bfloat16 (conversions, joins,
// strided reads and writes, indexing, where).
std::optional<client::TensorType> storageTypeOf(at::ScalarType t);
inline bool isIntegral(const at::Tensor& t) { return t.scalar_type() == at::kLong || t.scalar_type() == at::kBool; }
// On the device, of a type tensor ops take, in at most 6 dimensions.
inline bool typed(const at::Tensor& t) { return onDevice(t) && t.dim() <= 6 && typeOf(t.scalar_type()); }
// The same, or a storage type (which copies, fills and picks alone take).
inline bool stored(const at::Tensor& t) { return onDevice(t) && t.dim() <= 6 && storageTypeOf(t.scalar_type()); }
// A number PyTorch wrapped as a CPU tensor (x + 2, x * 0.5).
inline bool isHostScalar(const at::Tensor& t) { return t.defined() && t.device().is_cpu() && t.dim() == 0; }
// Both on the device as i64: an op the card runs exactly over integers (abs, sub, a scatter
// of a number).
inline bool bothI64(const at::Tensor& a, const at::Tensor& out) {
  return typed(a) && a.scalar_type() == at::kLong && typed(out) && out.scalar_type() == at::kLong;
}
// The dtype of a float function's result (sqrt, exp, true division, a statistic, a
// loss...), as PyTorch's: the type itself for a float one, the default float type for an
// integer or bool one.
inline at::ScalarType floatResult(at::ScalarType type) {
  return at::isIntegralType(type, /*includeBool=*/true) ? c10::typeMetaToScalarType(at::get_default_dtype()) : type;
}
// An optional tensor that is there, or null.
inline const at::Tensor* present(const c10::optional<at::Tensor>& t) { return t && t->defined() ? &*t : nullptr; }
// Every defined one of `tensors` f32 on the device, in at most 6 dimensions.
bool supported(std::initializer_list<const at::Tensor*> tensors);

// An empty tensor has no storage on the device: its operand names no buffer, and the op
// it is in has a zero in its shape, so send() drops it.
client::TensorOperand operand(const at::Tensor& t, c10::IntArrayRef strides);
std::vector<uint64_t> shapeOf(c10::IntArrayRef sizes);
// Queues a tensor op on the session (under its lock), sending a run of them every
// kOpsPerSend; what it writes is known no longer.
void send(client::Session& s, client::TensorOp op);
// out = fn(a, b, c) elementwise over out's shape, the inputs broadcast to it.
void elementwise(TensorFn fn, const at::Tensor& out, const at::Tensor* a, const at::Tensor* b, float alpha = 1,
                 float beta = 0, const at::Tensor* c = nullptr);

// ---- PyTorch's CPU fallback, counted (torch_operands.cc) ------------------------------

void countFallback(const std::string& op);
// An op that runs on the host: its tensors copied there and its result copied back.
template <class F>
auto onHost(const char* name, F compute) {
  countFallback(name);
  return compute();
}
// The same for an out variant: the host's result copied into `out`, resized to it.
at::Tensor& hostInto(const char* name, at::Tensor& out, const at::Tensor& result);
// Whether a composed op may make `rows` x `perRow` elements on the card (a comparison of
// each element with each boundary, every pair's difference): at most 2^24.
inline bool withinComposedElements(int64_t rows, int64_t perRow) {
  constexpr int64_t kMaxComposedElements = int64_t{1} << 24;
  return rows <= kMaxComposedElements / std::max<int64_t>(perRow, 1);
}
// A result made of other ops copied into an out variant's `out`, resized to it.
at::Tensor& resultInto(at::Tensor& out, const at::Tensor& result);
inline at::Tensor host(const at::Tensor& t) { return t.defined() && onDevice(t) ? t.cpu() : t; }

// ---- Reduced floats: f16 and bf16 computed in f32 on the card (torch_operands.cc) -----
//
// PyTorch's CPU computes most bf16 ops (and CUDA its f16 ones) in f32 and rounds once to
// the result's type, taking a number operand in that type (x * 0.1 multiplies by
// bf16(0.1)). The card does the same with the f32 function it has: the reduced operands
// converted to f32 on the card, the op run in f32, its result converted into out.

// Every defined one of `tensors` f32, f16 or bf16 on the device in at most 6 dimensions,
// or a host number, and at least one of them f16 or bf16.
bool reducedFloats(std::initializer_list<const at::Tensor*> tensors);
// An operand of such an op in f32: a device f16 or bf16 tensor converted on the card (any
// other as it is: an index stays i64), a host number rounded to `type` first where that is
// f16 or bf16.
at::Tensor widened(const at::Tensor& t, at::ScalarType type);
// An optional operand (a weight, a bias) so: in f32 where it is there.
inline c10::optional<at::Tensor> widenedOrNone(const c10::optional<at::Tensor>& t) {
  return present(t) ? c10::optional<at::Tensor>(widened(*t, t->scalar_type())) : c10::nullopt;
}
// A result computed in f32 rounded once into `type` (one of several an op returns: a
// gradient that was not asked for, undefined, stays so).
inline at::Tensor narrowedTo(const at::Tensor& t, at::ScalarType type) { return t.defined() ? t.to(type) : t; }
// A number rounded to `type` where that is f16 or bf16 (add's alpha, as PyTorch's CPU).
at::Scalar roundedTo(const at::Scalar& number, at::ScalarType type);
// An out variant's fallback: where `tensors` (out among them) are reduced floats,
// op(widen) on the card in f32, rounded once into out; else op(host) on the host, counted
// as `name`. `op` takes the function that gives each tensor operand as it must be passed.
template <class Op>
at::Tensor& orHostInto(const char* name, at::Tensor& out, std::initializer_list<const at::Tensor*> tensors, Op op) {
  if (reducedFloats(tensors)) {
    const auto type = out.scalar_type();
    return resultInto(out, op([type](const at::Tensor& t) { return widened(t, type); }));
  }
  return hostInto(name, out, op([](const at::Tensor& t) { return host(t); }));
}
// The same for an op that returns a new tensor of `type` on `device`.
template <class Op>
at::Tensor orOnHost(const char* name, std::initializer_list<const at::Tensor*> tensors, at::ScalarType type,
                    c10::Device device, Op op) {
  if (reducedFloats(tensors)) return op([type](const at::Tensor& t) { return widened(t, type); }).to(type);
  return onHost(name, [&] { return op([](const at::Tensor& t) { return host(t); }).to(device); });
}

// ---- Index checks (torch_operands.cc) -------------------------------------------------
//
// PyTorch's CPU raises where an index lies outside its dimension; the card's kernels read
// NaN there, or write nowhere. So an op that picks by its caller's index checks it first:
// against the bounds known of that memory (knownValues(): counted on the host as a copy
// wrote it, or read by an earlier check), else by reading the index's smallest and
// largest values from the card (one wait; the bounds are then kept). An op made of other
// ops, picking by indices it made in range, holds TrustedIndices around them so they are
// not checked again.

// The bytes [begin, end) of a buffer that a tensor's elements lie in (numel > 0).
struct ByteSpan {
  Handle buffer;
  uint64_t begin, end;
};
ByteSpan spanOf(const at::Tensor& t);

struct TrustedIndices {
  TrustedIndices();
  ~TrustedIndices();
  TrustedIndices(const TrustedIndices&) = delete;
  TrustedIndices& operator=(const TrustedIndices&) = delete;
};
// Calls fail(value) (which raises PyTorch's error) for a value of `index` (i64 on the
// device) outside [first, last] that is not `ignored`, unless TrustedIndices holds.
void checkIndex(const at::Tensor& index, int64_t first, int64_t last, std::optional<int64_t> ignored,
                const std::function<void(int64_t)>& fail);
// The checks of PyTorch's CPU kernels, with their errors: index_select's, embedding's and
// index_add's (IndexError), gather's and scatter's (RuntimeError), indexing's
// (IndexError), along a dimension of `size`.
void checkPicks(const at::Tensor& index, int64_t size);
void checkAlong(const at::Tensor& index, int64_t dim, int64_t size);
void checkIndexing(const at::Tensor& index, int64_t dim, int64_t size);  // from the end where negative
// A checked index that counts from the end where negative, as positions in [0, size).
inline at::Tensor fromEnd(const at::Tensor& index, int64_t size) { return at::where(index < 0, index + size, index); }
// A tensor's smallest and largest values, read back from the card (one wait): a CPU
// tensor of two.
inline at::Tensor extremesOnHost(const at::Tensor& t) { return at::stack({t.amin(), t.amax()}).cpu(); }
// Whether an i64 tensor on the device is known to hold no 0 (its known bounds are of one
// sign), without a wait.
bool knownNonzero(const at::Tensor& t);
// Positions an op just made, each in [0, n) (argmax's, sort's): noted, so that picking
// by them (their backwards scatter through them) reads nothing back.
void notePositions(const at::Tensor& positions, int64_t n);

// ---- Arithmetic, sums and matmuls (torch_arithmetic.cc) -------------------------------

std::vector<int64_t> broadcastShape(const at::Tensor& a, const at::Tensor& b);
// resize_output for an op over broadcast inputs: an output that shares memory with one of
// them (an in-place op, or out= an input) must already have the broadcast shape, as
// PyTorch's TensorIterator requires (its error); any other output is resized as
// resize_output does.
void resizeBroadcast(const at::Tensor& out, c10::IntArrayRef shape, std::initializer_list<const at::Tensor*> inputs);
// An in-place op's check, PyTorch's (its error): self must already have the broadcast
// shape of itself and its tensor operands. Before anything runs, on the card or the host.
void checkInPlace(const at::Tensor& self, std::initializer_list<const at::Tensor*> operands);
// `x` as f32 where the result is (PyTorch promotes i64 and bool operands of a float op):
// itself, or an f32 copy made on the card.
at::Tensor promoted(const at::Tensor& x, const at::Tensor& out);
// A host number as a one-element device tensor of `dtype` (written, not computed: exact
// for every i64), or nothing where the conversion would change its meaning (a fraction
// compared with integers).
c10::optional<at::Tensor> deviceNumber(const at::Tensor& number, at::ScalarType dtype);
// b as the second operand of an exact integer op (out, a and b i64 or bool; b may be a
// host integer; alpha an integer), or nothing.
c10::optional<at::Tensor> integerSide(const at::Tensor& a, const at::Tensor& b, const at::Tensor& out, double alpha);
bool sharesStorage(const at::Tensor& x, const at::Tensor& y);

// The reduceMask of every dimension of a tensor of `rank` (a 0-dim one is shape [1]).
uint32_t everyDim(int64_t rank);
// The reduceMask of `dims` (every dimension when none are named).
uint32_t maskOf(at::OptionalIntArrayRef dims, int64_t rank);
// A reduction's output shape: the reduced dimensions kept as 1 (keepdim) or gone.
std::vector<int64_t> reducedShape(const at::Tensor& self, uint32_t mask, bool keepdim);
// out = alpha * the sum of self over the dimensions in `mask`; out is already shaped
// (its summed dimensions kept as 1 when `keepdim`, else gone).
void sumInto(const at::Tensor& out, const at::Tensor& self, uint32_t mask, bool keepdim, float alpha);
at::Tensor& sum_out(const at::Tensor& self, at::OptionalIntArrayRef dims, bool keepdim, c10::optional<at::ScalarType> dtype,
                    at::Tensor& out);
// The mean: the sum scaled by the count of the elements summed (NaN for none, as PyTorch).
at::Tensor& mean_out(const at::Tensor& self, at::OptionalIntArrayRef dims, bool keepdim, c10::optional<at::ScalarType> dtype,
                     at::Tensor& out);
// Batched, as one op: a: [B, m, k], b: [B, k, n], out: [B, m, n].
void batchedMatmul(const at::Tensor& out, const at::Tensor& a, const at::Tensor& b, float alpha, float beta);

// ---- Reductions, selection, indexing (their own files) --------------------------------

// out = fn over the dimensions in `mask` of self: the op walks self's kept dimensions
// first and its reduced ones after (tensor ops take them in that order).
void reduceInto(TensorFn fn, const at::Tensor& out, const at::Tensor& self, uint32_t mask, bool keepdim);
// self = mask ? value : self
at::Tensor& masked_fill_(at::Tensor& self, const at::Tensor& mask, const at::Tensor& value);
// Advanced indexing's index tensors on the host, for PyTorch's own kernels there (its CPU
// fallback moves tensors and tensor lists, not lists of optional tensors).
c10::List<c10::optional<at::Tensor>> hostIndices(const c10::List<c10::optional<at::Tensor>>& indices);

// ---- Sliding windows over [N, C, H, W] (torch_windows.cc) -----------------------------

// A window's value along dimension i as PyTorch's pooling and convolution arguments give
// it: `otherwise` when none is given, the one value for every dimension when one is.
inline int64_t windowValue(c10::IntArrayRef v, size_t i, int64_t otherwise) {
  return v.empty() ? otherwise : v[v.size() > i ? i : 0];
}
struct Window2d {
  int64_t kh, kw, sh, sw, ph, pw, dh, dw, eh = 0, ew = 0;
  static Window2d of(c10::IntArrayRef kernel, c10::IntArrayRef stride, c10::IntArrayRef padding, c10::IntArrayRef dilation) {
    const auto pick = windowValue;
    Window2d w;
    w.kh = pick(kernel, 0, 1), w.kw = pick(kernel, 1, 1);
    w.sh = pick(stride, 0, w.kh), w.sw = pick(stride, 1, w.kw);
    w.ph = pick(padding, 0, 0), w.pw = pick(padding, 1, 0);
    w.dh = pick(dilation, 0, 1), w.dw = pick(dilation, 1, 1);
    return w;
  }
  // Every number in its range (at most 2^20: beyond, the host's checks and arithmetic),
  // checked before any other arithmetic on them.
  static constexpr int64_t kMax = int64_t{1} << 20;
  bool sane() const {
    auto in = [](int64_t v, int64_t low) { return v >= low && v <= kMax; };
    return in(kh, 1) && in(kw, 1) && in(sh, 1) && in(sw, 1) && in(ph, 0) && in(pw, 0) && in(dh, 1) && in(dw, 1) && in(eh, 0) &&
           in(ew, 0);
  }
  bool operator==(const Window2d&) const = default;
  int64_t outH(int64_t h) const { return (h + 2 * ph + eh - dh * (kh - 1) - 1) / sh + 1; }
  int64_t outW(int64_t w) const { return (w + 2 * pw + ew - dw * (kw - 1) - 1) / sw + 1; }
};
// With ceil_mode, the rows and columns its last windows add past the padding (PyTorch's
// pooling_output_shape: a last window that starts in the input or the left padding).
Window2d ceiled(Window2d w, const at::Tensor& self, bool ceilMode);
// x [N, C, H, W] padded on each side with `value`, and past the bottom and right by the
// window's extra (x itself, contiguous, when no padding).
at::Tensor padded(const at::Tensor& x, const Window2d& w, double value);
// The windows of a padded [N, C, H, W]: a strided view [N, C, OH, OW, KH, KW].
at::Tensor windows(const at::Tensor& p, const Window2d& w);

// Index tables of a window geometry over an [H, W] plane (i64, on the device), built on
// the host once per geometry and kept: a training step asks for the same few every time.
//   sources: [KK, OH * OW], the input position (y * W + x) that window element kk of
//     output position ohw reads, or -1 where it lies in the padding.
//   readers: [H * W, picks], for each input position the column elements (kk * OH * OW +
//     ohw) whose windows read it, -1 past its count (picks: the most any position has).
//   outputs: the same with the output position ohw alone (the windows, not their elements).
enum class Table { sources, readers, outputs };
at::Tensor windowTable(int64_t h, int64_t wd, const Window2d& w, Table kind);
// The table under `key`, built on the host by build() and written to the device the first
// time it is asked for (kept for the geometries most recently asked for).
at::Tensor cachedTable(const std::array<int64_t, 13>& key, const std::function<at::Tensor()>& build);
// out = beta * out + alpha * (the sum over the picks of a at index's row), one tensor op
// (schema/guest.capnp, gatherSum): `shape` ends in [picks, rows]; the strides are each
// tensor's over that shape.
void gatherSum(const at::Tensor& out, std::vector<int64_t> shape, c10::IntArrayRef outStrides, const at::Tensor& a,
               c10::IntArrayRef aStrides, const at::Tensor& index, c10::IntArrayRef indexStrides, float alpha, float beta);

// ---- Depth: 3-D convolution and pooling as 2-D ones, one per depth offset --------------
//
// A window along the depth of [N, C, D, H, W]: kernel, stride, padding, dilation, the input's
// depth and the output's. Each kernel offset kd reads, for every output depth, one input
// depth (or the padding): those slices, stacked into the batch, are a 2-D op's input.
struct Depth {
  int64_t k, s, p, d, in, out;
  // The window over an input depth `in`, its output depth (below 1: no window fits); with
  // ceil_mode PyTorch's pooling_output_shape: a last, partial window where one starts
  // inside the input or its left padding.
  static Depth of(int64_t k, int64_t s, int64_t p, int64_t d, int64_t in, bool ceil = false) {
    const int64_t span = in + 2 * p - d * (k - 1) - 1 + (ceil ? s - 1 : 0);
    int64_t out = span / s - (span < 0 && span % s != 0 ? 1 : 0) + 1;  // (rounded down, as PyTorch's div_rtn)
    if (ceil && (out - 1) * s >= in + p) --out;
    return {k, s, p, d, in, out};
  }
};
// The input depths offset kd reads for each output depth, i64 on `like`'s device: `in`
// (the slab withSlab() appends) where they lie in the padding.
at::Tensor depthPicks(const Depth& z, int64_t kd, const at::Tensor& like);
// [N, C, D + 1, H, W] picked at `picks` along depth into [N * Do, C, H, W].
at::Tensor depthSlices(const at::Tensor& padded, const at::Tensor& picks);
// [N, C, D, H, W] with one slab of `value` appended along depth (what the padding reads).
at::Tensor withSlab(const at::Tensor& input, double value);
// [N, C, Do, H, W] as [N * Do, C, H, W] (a copy), and the way back: a 2-D op's
// [N * Do, C', H', W'] seen as [N, C', Do, H', W'] (a view), and made so.
at::Tensor asDepthSlices(const at::Tensor& t);
at::Tensor depthSlicesAsPlanes(const at::Tensor& t, int64_t n);
at::Tensor fromDepthSlices(const at::Tensor& t, int64_t n);

// ---- Registration: each family's kernels, in its own file -----------------------------

// Most elementwise ops come as three kernels: `op.out`, `op` and `op_`; a backward as two.
#define RACCEL_IMPL_OUT_NEW_INPLACE(op)              \
  m.impl(#op ".out", TORCH_FN(op##_out));            \
  m.impl(#op, TORCH_FN(python::op));                 \
  m.impl(#op "_", TORCH_FN(op##_));
#define RACCEL_IMPL_BACKWARD(op)                                         \
  m.impl(#op "_backward.grad_input", TORCH_FN(op##_backward_out));       \
  m.impl(#op "_backward", TORCH_FN(python::op##_backward));

void registerTensors(torch::Library& m);
void registerArithmetic(torch::Library& m);
void registerElementwise(torch::Library& m);
void registerComparisons(torch::Library& m);
void registerReductions(torch::Library& m);
void registerComposed(torch::Library& m);
void registerIndexing(torch::Library& m);
void registerCreation(torch::Library& m);
void registerConvolutions(torch::Library& m);
void registerPooling(torch::Library& m);
void registerResampling(torch::Library& m);
void registerNormsAndLosses(torch::Library& m);
void registerLinalg(torch::Library& m);
void registerCtc(torch::Library& m);

}  // namespace raccel::python
