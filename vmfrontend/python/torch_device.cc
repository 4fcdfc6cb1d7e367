// raccel._torch: PyTorch's out-of-tree device (torch 1.13 calls it `privateuseone`)
// over a raccel session, so an unchanged training loop runs on the virtual accelerator.
//
// Memory: a tensor's storage is a range of a larger raccel buffer (chunks of 4 MiB, each
// twice the last up to 64 MiB: a small model's session holds, and its failover
// checkpoints read back, little more than it uses; a storage past 16 MiB gets a buffer
// of its own), so a tensor is no round trip. Its
// data pointer is an address in a private space, (chunk + 1) << 40 | byte offset, that
// is never dereferenced on the host: every kernel here turns it back into a buffer
// handle and an element offset.
//
// Compute: the training step's ops are raccel tensor ops (schema/guest.capnp TensorOp),
// sent asynchronously; only reading a value (.item(), .cpu(), printing) waits. Every
// other op goes to PyTorch's CPU fallback, which copies its operands to the host and
// back; each such op is counted (fallbacks(), and RACCEL_TORCH_FALLBACKS=1 prints them
// at exit). Ops on dtypes other than f32 (and i64 targets) fall back the same way.
//
// Threads: PyTorch's autograd engine runs backward on a thread of its own; every call
// on the session holds its lock (shared_session.h).
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/EmptyTensor.h>
#include <ATen/ExpandUtils.h>
#include <ATen/ScalarOps.h>
#include <ATen/native/CPUFallback.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/unfold_native.h>
#include <ATen/ops/view_native.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>
#include <torch/version.h>

#include <atomic>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <unordered_map>

#include "vmfrontend/python/known_values.h"
#include "vmfrontend/python/shared_session.h"

namespace py = pybind11;

namespace raccel::python {
namespace {

using client::Handle;
using client::TensorFn;
constexpr c10::DeviceType kDevice = c10::DeviceType::PrivateUse1;

// Two PyTorch lines build this file: Debian's 1.13 (the package) and 2.x (a GPU
// machine's, scripts/gpu-checks.sh). Where their interfaces differ:
//  - from 2.3 an allocator's allocate() is not const, and copy_data() (a storage's
//    clone) is asked of it;
//  - from 2.1 var and std take their correction as a Scalar, not an int.
#define RACCEL_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) || (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))
#if RACCEL_TORCH_AT_LEAST(2, 3)
#define RACCEL_ALLOCATE_CONST
#else
#define RACCEL_ALLOCATE_CONST const
#endif
#if RACCEL_TORCH_AT_LEAST(2, 1)
using Correction = const c10::optional<at::Scalar>&;
double correctionOf(Correction c) { return c ? c->toDouble() : 1.0; }
#else
using Correction = c10::optional<int64_t>;
double correctionOf(Correction c) { return double(c.value_or(1)); }
#endif

// ---- The session ----------------------------------------------------------------------

// Never destroyed: tensors may be freed after Python's shutdown has begun.
struct State {
  std::shared_ptr<SharedSession> shared;
  std::mutex countsMu;
  std::map<std::string, uint64_t> fallbacks;
  std::atomic<uint64_t> indexReads{0};  // index checks that read the index's bounds from the card
};
State& state() {
  static auto* s = new State;
  return *s;
}

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

[[noreturn]] void raise(const Error& e) { TORCH_CHECK(false, "raccel: ", codeName(e.code), ": ", e.message); }

// ---- Memory: storages as ranges of larger buffers -----------------------------------

class Arena {
 public:
  static constexpr uint64_t kFirstChunk = 4ull << 20, kChunk = 64ull << 20, kOwnBuffer = 16ull << 20, kAlign = 256;
  static constexpr int kShift = 40;
  static constexpr uint64_t kOffsetMask = (1ull << kShift) - 1;

  void* allocate(client::Session& s, uint64_t bytes) {
    bytes = (std::max<uint64_t>(bytes, 1) + kAlign - 1) / kAlign * kAlign;
    TORCH_CHECK(bytes <= kOffsetMask, "raccel: a storage of ", bytes, " bytes is larger than this device addresses");
    if (bytes <= kOwnBuffer)
      for (size_t i = 0; i < chunks_.size(); ++i) {
        Chunk& c = chunks_[i];
        if (c.own || !c.handle) continue;
        for (auto it = c.free.begin(); it != c.free.end(); ++it)
          if (it->second >= bytes) {
            uint64_t at = it->first, left = it->second - bytes;
            c.free.erase(it);
            if (left) c.free[at + bytes] = left;
            return address(i, at, bytes);
          }
      }
    Chunk c;
    c.own = bytes > kOwnBuffer;
    c.size = c.own ? bytes : std::max(bytes, nextChunk_);
    if (!c.own) nextChunk_ = std::min(kChunk, 2 * nextChunk_);
    c.handle = s.alloc(c.size);
    if (!c.own && bytes < c.size) c.free[bytes] = c.size - bytes;
    chunks_.push_back(std::move(c));
    TORCH_CHECK(chunks_.size() < (1ull << (63 - kShift)), "raccel: too many device buffers");
    return address(chunks_.size() - 1, 0, bytes);
  }

  // Frees the storage at p: where it lay (bytes 0: none lives there).
  struct Freed {
    Handle buffer = 0;
    uint64_t offset = 0, bytes = 0;
  };
  Freed release(client::Session& s, void* p) {
    auto it = live_.find(reinterpret_cast<uintptr_t>(p));
    if (it == live_.end()) return {};
    const uint64_t bytes = it->second;
    live_.erase(it);
    const size_t index = chunkOf(p);
    Chunk& c = chunks_[index];
    const Freed freed{c.handle, reinterpret_cast<uintptr_t>(p) & kOffsetMask, bytes};
    if (c.own) {  // its own buffer: gone with it
      s.free(c.handle);
      c.handle = 0;
      return freed;
    }
    uint64_t at = reinterpret_cast<uintptr_t>(p) & kOffsetMask, size = bytes;
    auto next = c.free.lower_bound(at);
    if (next != c.free.end() && next->first == at + size) {
      size += next->second;
      next = c.free.erase(next);
    }
    if (next != c.free.begin()) {
      auto prev = std::prev(next);
      if (prev->first + prev->second == at) {
        prev->second += size;
        return freed;
      }
    }
    c.free[at] = size;
    return freed;
  }

  // The buffer and byte offset an address names.
  std::pair<Handle, uint64_t> locate(const void* p) const {
    const size_t index = chunkOf(p);
    TORCH_CHECK(index < chunks_.size() && chunks_[index].handle, "raccel: a tensor whose storage is not on this device");
    return {chunks_[index].handle, reinterpret_cast<uintptr_t>(p) & kOffsetMask};
  }

 private:
  struct Chunk {
    Handle handle = 0;
    uint64_t size = 0;
    bool own = false;
    std::map<uint64_t, uint64_t> free;  // offset -> bytes
  };
  static size_t chunkOf(const void* p) { return (reinterpret_cast<uintptr_t>(p) >> kShift) - 1; }
  void* address(size_t index, uint64_t offset, uint64_t bytes) {
    auto* p = reinterpret_cast<void*>(((index + 1) << kShift) | offset);
    live_[reinterpret_cast<uintptr_t>(p)] = bytes;
    return p;
  }
  std::vector<Chunk> chunks_;
  uint64_t nextChunk_ = kFirstChunk;  // the next shared chunk's size
  std::unordered_map<uintptr_t, uint64_t> live_;
};

Arena& arena() {
  static auto* a = new Arena;
  return *a;
}

// What is known of the i64 values in the device's memory (known_values.h; "Index checks"
// below): every write into that memory forgets what it overwrote. Under the session's
// lock.
KnownValues& knownValues() {
  static auto* k = new KnownValues;  // never destroyed, like the session's State
  return *k;
}

void releaseStorage(void* p) {
  auto shared = state().shared;
  if (!p || !shared) return;
  std::lock_guard lock(shared->mu);
  if (!shared->session) return;
  auto freed = arena().release(*shared->session, p);
  if (freed.bytes) knownValues().forget(freed.buffer, freed.offset, freed.offset + freed.bytes);
}

// `bytes` from one of the device's storages to another, on the card.
void copyOnCard(void* to, const void* from, uint64_t bytes) {
  auto [src, srcOffset] = arena().locate(from);
  auto [dst, dstOffset] = arena().locate(to);
  Locked s;
  knownValues().forget(dst, dstOffset, dstOffset + bytes);
  s->copy(dst, dstOffset, src, srcOffset, bytes);
}

struct Allocator final : c10::Allocator {
  c10::DataPtr allocate(size_t bytes) RACCEL_ALLOCATE_CONST override {
    if (bytes == 0) return {nullptr, nullptr, &releaseStorage, c10::Device(kDevice, 0)};
    Locked s;
    void* p = arena().allocate(*s, bytes);
    return {p, p, &releaseStorage, c10::Device(kDevice, 0)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &releaseStorage; }
#if RACCEL_TORCH_AT_LEAST(2, 3)
  void copy_data(void* to, const void* from, std::size_t bytes) const override {
    if (bytes) copyOnCard(to, from, bytes);
  }
#endif
};
Allocator g_allocator;
REGISTER_ALLOCATOR(kDevice, &g_allocator);

// ---- The device guard (one device, one in-order stream) -----------------------------

struct Guard final : c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return kDevice; }
  c10::Device exchangeDevice(c10::Device) const override { return c10::Device(kDevice, 0); }
  c10::Device getDevice() const override { return c10::Device(kDevice, 0); }
  void setDevice(c10::Device d) const override {
    TORCH_CHECK(d.index() <= 0, "raccel: there is one raccel device (privateuseone:0); asked for ", d.index());
  }
  void uncheckedSetDevice(c10::Device) const noexcept override {}
  c10::Stream getStream(c10::Device d) const noexcept override { return c10::Stream(c10::Stream::DEFAULT, d); }
  c10::Stream exchangeStream(c10::Stream s) const noexcept override { return s; }
  c10::DeviceIndex deviceCount() const noexcept override { return 1; }
};
C10_REGISTER_GUARD_IMPL(PrivateUse1, Guard);

// ---- Operands -------------------------------------------------------------------------

bool onDevice(const at::Tensor& t) { return t.defined() && t.device().type() == kDevice; }
bool isF32(const at::Tensor& t) { return onDevice(t) && t.scalar_type() == at::kFloat; }
// The element types tensor ops take: f32, and i64 and bool where an op says so.
std::optional<client::TensorType> typeOf(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return client::TensorType::f32;
    case at::kLong: return client::TensorType::i64;
    case at::kBool: return client::TensorType::boolean;
    default: return std::nullopt;
  }
}
bool isIntegral(const at::Tensor& t) { return t.scalar_type() == at::kLong || t.scalar_type() == at::kBool; }
// On the device, of a type tensor ops take, in at most 6 dimensions.
bool typed(const at::Tensor& t) { return onDevice(t) && t.dim() <= 6 && typeOf(t.scalar_type()); }
// A number PyTorch wrapped as a CPU tensor (x + 2, x * 0.5).
bool isHostScalar(const at::Tensor& t) { return t.defined() && t.device().is_cpu() && t.dim() == 0; }
// Both on the device as i64: an op the card runs exactly over integers (abs, sub, a scatter
// of a number).
bool bothI64(const at::Tensor& a, const at::Tensor& out) {
  return typed(a) && a.scalar_type() == at::kLong && typed(out) && out.scalar_type() == at::kLong;
}

void countFallback(const std::string& op) {
  std::lock_guard lock(state().countsMu);
  ++state().fallbacks[op];
}

// An empty tensor has no storage on the device: its operand names no buffer, and the op
// it is in has a zero in its shape, so send() drops it.
client::TensorOperand operand(const at::Tensor& t, c10::IntArrayRef strides) {
  client::TensorOperand o;
  if (t.numel() > 0) {
    auto [handle, byteOffset] = arena().locate(t.data_ptr());
    o.buffer = handle;
    o.offset = byteOffset / t.element_size();
  }
  o.type = typeOf(t.scalar_type()).value_or(client::TensorType::f32);  // other dtypes never reach an op
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

// Tensor ops go out in runs of kOpsPerSend (the session's link would keep them until 256
// KiB or a wait: a training step's ops until its end), so that the card works on a step's
// first ops while Python makes the rest: the tiny transformer's step here took 15-25%
// less. (Runs of 8 or 32 gained less; an OpenCL program's tiny kernels lost by it, and
// the ICD keeps its runs to clFlush.)
constexpr unsigned kOpsPerSend = 16;
void forgetWritten(const client::TensorOp& op);
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

// out = fn(a, b, c) elementwise over out's shape, the inputs broadcast to it.
void elementwise(TensorFn fn, const at::Tensor& out, const at::Tensor* a, const at::Tensor* b, float alpha = 1,
                 float beta = 0, const at::Tensor* c = nullptr) {
  Locked s;
  client::TensorOp op;
  op.fn = fn;
  op.shape = shapeOf(out.sizes());
  op.operands.push_back(operand(out, out.strides()));
  for (const at::Tensor* x : {a, b, c})
    if (x) op.operands.push_back(operand(*x, at::inferExpandGeometry_dimvector(x->sizes(), x->strides(), out.sizes()).strides));
  op.alpha = alpha, op.beta = beta;
  send(*s, op);
}

// An optional tensor that is there, or null.
const at::Tensor* present(const c10::optional<at::Tensor>& t) { return t && t->defined() ? &*t : nullptr; }
bool supported(std::initializer_list<const at::Tensor*> tensors) {
  for (auto* t : tensors)
    if (t && t->defined() && !(isF32(*t) && t->dim() <= 6)) return false;
  return true;
}

at::Tensor emptyOn(c10::IntArrayRef sizes, at::ScalarType dtype = at::kFloat) {
  return at::detail::empty_generic(sizes, &g_allocator, c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), dtype,
                                   c10::nullopt);
}

// An op that runs on the host: its tensors copied there and its result copied back.
template <class F>
auto onHost(const char* name, F compute) {
  countFallback(name);
  return compute();
}
// The same for an out variant: the host's result copied into `out`, resized to it.
at::Tensor& hostInto(const char* name, at::Tensor& out, const at::Tensor& result) {
  countFallback(name);
  at::native::resize_output(out, result.sizes());
  return out.copy_(result);
}
at::Tensor host(const at::Tensor& t) { return t.defined() && onDevice(t) ? t.cpu() : t; }

// ---- Index checks ------------------------------------------------------------------------
//
// PyTorch's CPU raises where an index lies outside its dimension; the card's kernels read
// NaN there, or write nowhere. So an op that picks by its caller's index checks it first:
// against the bounds known of that memory (knownValues(): counted on the host as a copy
// wrote it, or read by an earlier check), else by reading the index's smallest and
// largest values from the card (one wait; the bounds are then kept). An op made of other
// ops, picking by indices it made in range, holds TrustedIndices around them so they are
// not checked again.

// The bytes [begin, end) of a buffer that a tensor's or an operand's elements lie in.
struct ByteSpan {
  Handle buffer;
  uint64_t begin, end;
};
ByteSpan spanOf(const at::Tensor& t) {  // numel > 0; the device's strides are never negative
  auto [handle, begin] = arena().locate(t.data_ptr());
  uint64_t last = 0;
  for (int64_t d = 0; d < t.dim(); ++d) last += uint64_t(t.size(d) - 1) * uint64_t(t.stride(d));
  return {handle, begin, begin + (last + 1) * uint64_t(t.element_size())};
}
ByteSpan spanOf(const client::TensorOperand& o, const std::vector<uint64_t>& shape) {  // every size > 0
  const uint64_t size = o.type == client::TensorType::i64 ? 8 : o.type == client::TensorType::boolean ? 1 : 4;
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
      auto span = spanOf(op.operands[i], op.shape);
      known.forget(span.buffer, span.begin, span.end);
    }
}

thread_local int t_trustedIndices = 0;
struct TrustedIndices {
  TrustedIndices() { ++t_trustedIndices; }
  ~TrustedIndices() { --t_trustedIndices; }
  TrustedIndices(const TrustedIndices&) = delete;
  TrustedIndices& operator=(const TrustedIndices&) = delete;
};

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

// Calls fail(value) (which raises PyTorch's error) for a value of `index` (i64 on the
// device) outside [first, last] that is not `ignored`, unless TrustedIndices holds.
template <class Fail>
void checkIndex(const at::Tensor& index, int64_t first, int64_t last, std::optional<int64_t> ignored, Fail fail) {
  if (t_trustedIndices > 0 || index.numel() == 0) return;
  {
    Locked s;
    auto span = spanOf(index);
    if (auto known = knownValues().find(span.buffer, span.begin, span.end); known && known->allWithin(first, last, ignored))
      return;
  }
  if (auto bad = boundsOnCard(index, ignored, first).outside(first, last)) fail(*bad);
}
// The checks of PyTorch's CPU kernels, with their errors: index_select's, embedding's and
// index_add's (IndexError), gather's and scatter's (RuntimeError), indexing's
// (IndexError), along a dimension of `size`.
void checkPicks(const at::Tensor& index, int64_t size) {
  checkIndex(index, 0, size - 1, std::nullopt, [](int64_t) { TORCH_CHECK_INDEX(false, "index out of range in self"); });
}
void checkAlong(const at::Tensor& index, int64_t dim, int64_t size) {
  checkIndex(index, 0, size - 1, std::nullopt, [&](int64_t v) {
    TORCH_CHECK(false, "index ", v, " is out of bounds for dimension ", dim, " with size ", size);
  });
}
void checkIndexing(const at::Tensor& index, int64_t dim, int64_t size) {  // from the end where negative
  checkIndex(index, -size, size - 1, std::nullopt, [&](int64_t v) {
    TORCH_CHECK_INDEX(false, "index ", v, " is out of bounds for dimension ", dim, " with size ", size);
  });
}
// Positions an op just made, each in [0, n) (argmax's, sort's): noted, so that picking
// by them (their backwards scatter through them) reads nothing back.
void notePositions(const at::Tensor& positions, int64_t n) {
  if (positions.numel() == 0 || n <= 0 || !positions.is_non_overlapping_and_dense()) return;
  Locked s;
  auto span = spanOf(positions);
  knownValues().note(span.buffer, span.begin, span.end, {0, n - 1, std::nullopt});
}

// ---- Allocation, views, copies ----------------------------------------------------------

at::Tensor empty_memory_format(c10::IntArrayRef size, c10::optional<at::ScalarType> dtype, c10::optional<at::Layout>,
                               c10::optional<at::Device>, c10::optional<bool>, c10::optional<at::MemoryFormat> format) {
  return at::detail::empty_generic(size, &g_allocator, c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                   c10::dtype_or_default(dtype), format);
}

at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride, c10::optional<at::ScalarType> dtype,
                         c10::optional<at::Layout>, c10::optional<at::Device>, c10::optional<bool>) {
  return at::detail::empty_strided_generic(size, stride, &g_allocator, c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                           c10::dtype_or_default(dtype));
}

// Device bytes of a dense tensor into a host tensor of its dtype laid out the same (waits).
void readInto(const at::Tensor& src, const at::Tensor& hostDst) {
  if (src.numel() == 0) return;
  auto [handle, byteOffset] = arena().locate(src.data_ptr());
  Status st;
  {
    Locked s;
    st = s->read(handle, byteOffset, std::span(static_cast<std::byte*>(hostDst.data_ptr()), src.nbytes()));
    // An op sent before that the card refused: the value read may be wrong, so say why.
    if (auto e = s->takeError(); st && e) st = fail(*e);
  }
  if (!st) raise(st.error());
}

// Host bytes laid out as dst is (dense) into dst; of i64, their bounds are noted as they
// pass (the index checks' usual source: targets and token ids come from the host).
void writeFrom(const at::Tensor& hostSrc, const at::Tensor& dst) {
  if (dst.numel() == 0) return;
  auto [handle, byteOffset] = arena().locate(dst.data_ptr());
  const uint64_t end = byteOffset + hostSrc.nbytes();
  Locked s;
  if (hostSrc.scalar_type() == at::kLong)
    knownValues().note(handle, byteOffset, end, boundsOf({hostSrc.data_ptr<int64_t>(), size_t(hostSrc.numel())}));
  else
    knownValues().forget(handle, byteOffset, end);
  s->write(handle, byteOffset, std::span(static_cast<const std::byte*>(hostSrc.data_ptr()), hostSrc.nbytes()));
}

at::Tensor _copy_from(const at::Tensor& self, const at::Tensor& dst, bool /*non_blocking*/) {
  TORCH_CHECK(self.sizes() == dst.sizes() || at::is_expandable_to(self.sizes(), dst.sizes()),
              "raccel: copy from ", self.sizes(), " to ", dst.sizes());
  if (dst.numel() == 0) return dst;
  if (!onDevice(self)) {  // host -> device
    auto src = self.to(dst.scalar_type()).expand(dst.sizes()).contiguous();
    if (dst.is_contiguous()) {
      writeFrom(src, dst);
    } else if (dst.is_non_overlapping_and_dense()) {  // a dense block in another order (a transpose): laid out as it is
      auto laid = at::empty_strided(dst.sizes(), dst.strides(), src.options());
      laid.copy_(src);
      writeFrom(laid, dst);
    } else {
      TORCH_CHECK(typeOf(dst.scalar_type()), "raccel: copying into a non-contiguous ", dst.scalar_type(),
                  " tensor is not supported");
      auto staged = emptyOn(dst.sizes(), dst.scalar_type());
      writeFrom(src, staged);
      elementwise(TensorFn::copy, dst, &staged, nullptr);
    }
    return dst;
  }
  if (!onDevice(dst)) {  // device -> host
    auto src = self.expand(dst.sizes());
    if (!src.is_contiguous() && src.is_non_overlapping_and_dense()) {  // read as laid out
      auto laid = at::empty_strided(src.sizes(), src.strides(), src.options().device(at::kCPU));
      readInto(src, laid);
      dst.copy_(laid);
      return dst;
    }
    if (!src.is_contiguous()) {
      TORCH_CHECK(typeOf(src.scalar_type()), "raccel: reading a non-contiguous ", src.scalar_type(),
                  " tensor is not supported");
      auto staged = emptyOn(src.sizes(), src.scalar_type());
      elementwise(TensorFn::copy, staged, &src, nullptr);
      src = staged;
    }
    auto hostCopy = at::empty(src.sizes(), src.options().device(at::kCPU));
    readInto(src, hostCopy);
    dst.copy_(hostCopy);
    return dst;
  }
  // device -> device
  if (typed(self) && typed(dst)) {  // a conversion where the dtypes differ (exact between integers)
    elementwise(TensorFn::copy, dst, &self, nullptr);
  } else if (self.scalar_type() == dst.scalar_type() && self.is_contiguous() && dst.is_contiguous() &&
             self.sizes() == dst.sizes()) {
    copyOnCard(dst.data_ptr(), self.data_ptr(), self.nbytes());
  } else {
    countFallback("aten::_copy_from (dtype conversion)");
    dst.copy_(self.cpu().to(dst.scalar_type()));
  }
  return dst;
}

at::Tensor _copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  dst.resize_(self.sizes());
  return python::_copy_from(self, dst, false);
}

// As PyTorch's: a tensor that has the size asked keeps its strides (an op's `out` that is
// a view, such as x[:, 2].floor_()'s, is written where the view is); another is made
// contiguous at that size, its storage grown if it must be.
const at::Tensor& resize_(const at::Tensor& self, c10::IntArrayRef size, c10::optional<at::MemoryFormat> format) {
  if (self.sizes() == size && !format) return self;
  auto* impl = self.unsafeGetTensorImpl();
  int64_t numel = 1;
  for (auto d : size) {
    TORCH_CHECK(d >= 0, "raccel: resize to a negative size");
    numel *= d;
  }
  const uint64_t needed = static_cast<uint64_t>(self.storage_offset() + numel) * self.element_size();
  auto storage = impl->storage();
  if (numel > 0 && needed > storage.nbytes()) {
    at::DataPtr fresh = g_allocator.allocate(needed);
    if (storage.nbytes() > 0 && storage.data()) copyOnCard(fresh.get(), storage.data(), storage.nbytes());
    storage.set_data_ptr_noswap(std::move(fresh));
    storage.set_nbytes(needed);
  }
  impl->set_sizes_contiguous(size);
  return self;
}

// A storage's bytes, read to the host (torch.save of the device's tensors).
py::bytes readStorage(uintptr_t dataPtr, uint64_t nbytes) {
  std::string bytes(nbytes, '\0');
  if (nbytes == 0) return py::bytes(bytes);
  auto [handle, byteOffset] = arena().locate(reinterpret_cast<void*>(dataPtr));
  Status st;
  {
    py::gil_scoped_release unlocked;
    Locked s;
    st = s->read(handle, byteOffset, std::span(reinterpret_cast<std::byte*>(bytes.data()), nbytes));
  }
  if (!st) raise(st.error());
  return py::bytes(bytes);
}

at::Tensor& fill_(at::Tensor& self, const at::Scalar& value) {
  if (self.numel() == 0) return self;
  const bool exact = isF32(self) || (typed(self) && value.toDouble() == double(value.toFloat()));  // i64 past 2^24 is not
  if (exact) {
    elementwise(TensorFn::fill, self, nullptr, nullptr, value.toFloat());
  } else if (value.toDouble() == 0 && self.is_contiguous()) {
    auto [handle, offset] = arena().locate(self.data_ptr());
    Locked s;
    knownValues().forget(handle, offset, offset + self.nbytes());
    s->fill(handle, offset, self.nbytes(), 0);
  } else {
    countFallback("aten::fill_.Scalar");
    self.copy_(at::full(self.sizes(), value, self.options().device(at::kCPU)));
  }
  return self;
}

at::Tensor& zero_(at::Tensor& self) { return python::fill_(self, 0); }

at::Scalar _local_scalar_dense(const at::Tensor& self) {
  auto hostCopy = at::empty({}, self.options().device(at::kCPU));
  readInto(self, hostCopy);
  return hostCopy.item();
}

// ---- Compute ----------------------------------------------------------------------------

std::vector<int64_t> broadcastShape(const at::Tensor& a, const at::Tensor& b) { return at::infer_size(a.sizes(), b.sizes()); }

// `x` as f32 where the result is (PyTorch promotes i64 and bool operands of a float op):
// itself, or an f32 copy made on the card.
at::Tensor promoted(const at::Tensor& x, const at::Tensor& out) {
  if (!isF32(out) || !typed(x) || x.scalar_type() == at::kFloat) return x;
  auto f = emptyOn(x.sizes());
  elementwise(TensorFn::copy, f, &x, nullptr);
  return f;
}

// A host number as a one-element device tensor of `dtype` (written, not computed: exact
// for every i64), or nothing where the conversion would change its meaning (a fraction
// compared with integers).
c10::optional<at::Tensor> deviceNumber(const at::Tensor& number, at::ScalarType dtype) {
  if (dtype != at::kFloat && number.is_floating_point()) return c10::nullopt;
  auto t = emptyOn({}, dtype);
  writeFrom(number.to(dtype).contiguous(), t);
  return t;
}
// b as the second operand of an exact integer op (out, a and b i64 or bool; b may be a
// host integer; alpha an integer), or nothing.
c10::optional<at::Tensor> integerSide(const at::Tensor& a, const at::Tensor& b, const at::Tensor& out, double alpha) {
  if (!typed(out) || !isIntegral(out) || !typed(a) || !isIntegral(a) || alpha != std::trunc(alpha) || std::fabs(alpha) > 16777216)
    return c10::nullopt;
  if (isHostScalar(b)) return deviceNumber(b, at::kLong);
  if (typed(b) && isIntegral(b)) return b;
  return c10::nullopt;
}

// out = a + alpha * b (either may be a host number).
at::Tensor& add_out(const at::Tensor& a0, const at::Tensor& b0, const at::Scalar& alpha, at::Tensor& out) {
  const at::Tensor a = promoted(a0, out), b = promoted(b0, out);
  if (isHostScalar(b) && supported({&a, &out})) {
    at::native::resize_output(out, a.sizes());
    elementwise(TensorFn::affine, out, &a, nullptr, 1, static_cast<float>(alpha.toDouble() * b.item<double>()));
  } else if (isHostScalar(a) && supported({&b, &out})) {
    at::native::resize_output(out, b.sizes());
    elementwise(TensorFn::affine, out, &b, nullptr, alpha.toFloat(), a.item<float>());
  } else if (supported({&a, &b, &out})) {
    at::native::resize_output(out, broadcastShape(a, b));
    elementwise(TensorFn::add, out, &a, &b, alpha.toFloat());
  } else if (auto y = integerSide(a, b, out, alpha.toDouble())) {
    at::native::resize_output(out, broadcastShape(a, *y));
    elementwise(TensorFn::add, out, &a, &*y, alpha.toFloat());
  } else if (auto x = isHostScalar(a) ? integerSide(b, a, out, alpha.toDouble()) : c10::nullopt) {  // a number first
    at::native::resize_output(out, b.sizes());
    elementwise(TensorFn::add, out, &*x, &b, alpha.toFloat());
  } else {
    return hostInto("aten::add.out", out, at::add(host(a), host(b), alpha));
  }
  return out;
}
at::Tensor add(const at::Tensor& a, const at::Tensor& b, const at::Scalar& alpha) {
  auto out = emptyOn({0}, at::result_type(a, b));
  return python::add_out(a, b, alpha, out);
}
at::Tensor& add_(at::Tensor& self, const at::Tensor& other, const at::Scalar& alpha) { return python::add_out(self, other, alpha, self); }

// out = a - alpha * b: add with -alpha (over f32, either side a host number, as in
// `1 - x`; or over i64 exactly; PyTorch refuses a bool side, on the host).
at::Tensor& sub_out(const at::Tensor& a, const at::Tensor& b, const at::Scalar& alpha, at::Tensor& out) {
  const bool integers = (bothI64(a, out) || (isHostScalar(a) && bothI64(b, out))) && b.scalar_type() != at::kBool;
  const bool floats = supported({&a, &out}) || (isHostScalar(a) && typed(b) && supported({&b, &out}));
  if (!(floats || integers) || !(typed(b) || isHostScalar(b)))
    return hostInto("aten::sub.out", out, at::sub(host(a), host(b), alpha));
  return python::add_out(a, b, -alpha.toDouble(), out);
}
at::Tensor sub(const at::Tensor& a, const at::Tensor& b, const at::Scalar& alpha) {
  auto out = emptyOn({0}, at::result_type(a, b));
  return python::sub_out(a, b, alpha, out);
}
at::Tensor& sub_(at::Tensor& self, const at::Tensor& other, const at::Scalar& alpha) { return python::sub_out(self, other, alpha, self); }

// out = a * b (either may be a host number).
at::Tensor& mul_out(const at::Tensor& a0, const at::Tensor& b0, at::Tensor& out) {
  const at::Tensor a = promoted(a0, out), b = promoted(b0, out);
  if (isHostScalar(b) && supported({&a, &out})) {
    at::native::resize_output(out, a.sizes());
    elementwise(TensorFn::affine, out, &a, nullptr, b.item<float>(), 0);
  } else if (isHostScalar(a) && supported({&b, &out})) {
    at::native::resize_output(out, b.sizes());
    elementwise(TensorFn::affine, out, &b, nullptr, a.item<float>(), 0);
  } else if (supported({&a, &b, &out})) {
    at::native::resize_output(out, broadcastShape(a, b));
    elementwise(TensorFn::mul, out, &a, &b);
  } else if (auto y = integerSide(a, b, out, 1)) {
    at::native::resize_output(out, broadcastShape(a, *y));
    elementwise(TensorFn::mul, out, &a, &*y);
  } else {
    return hostInto("aten::mul.out", out, at::mul(host(a), host(b)));
  }
  return out;
}
at::Tensor mul(const at::Tensor& a, const at::Tensor& b) {
  auto out = emptyOn({0}, at::result_type(a, b));
  return python::mul_out(a, b, out);
}
at::Tensor& mul_(at::Tensor& self, const at::Tensor& other) { return python::mul_out(self, other, self); }

// The reduceMask of every dimension of a tensor of `rank` (a 0-dim one is shape [1]).
uint32_t everyDim(int64_t rank) { return rank ? (1u << rank) - 1 : 1; }

// out = alpha * the sum of self over the dimensions in `mask`; out is already shaped
// (its summed dimensions kept as 1 when `keepdim`, else gone).
void sumInto(const at::Tensor& out, const at::Tensor& self, uint32_t mask, bool keepdim, float alpha) {
  // out's strides over self's shape: 0 on the summed dimensions.
  std::vector<int64_t> outStrides;
  for (int64_t d = 0, o = 0; d < self.dim(); ++d) {
    if (mask >> d & 1) {
      outStrides.push_back(0);
      if (keepdim) ++o;
    } else {
      outStrides.push_back(out.stride(o++));
    }
  }
  Locked s;
  client::TensorOp op;
  op.fn = TensorFn::sum;
  op.shape = shapeOf(self.sizes());
  op.operands = {operand(out, outStrides), operand(self, self.strides())};
  op.reduceMask = mask;
  op.alpha = alpha;
  send(*s, op);
}

// The reduceMask of `dims` (every dimension when none are named).
uint32_t maskOf(at::OptionalIntArrayRef dims, int64_t rank) {
  if (!dims || dims->empty()) return everyDim(rank);
  uint32_t mask = 0;
  for (auto d : *dims) mask |= 1u << c10::maybe_wrap_dim(d, std::max<int64_t>(rank, 1));
  return mask;
}
// A reduction's output shape: the reduced dimensions kept as 1 (keepdim) or gone.
std::vector<int64_t> reducedShape(const at::Tensor& self, uint32_t mask, bool keepdim) {
  std::vector<int64_t> shape;
  for (int64_t d = 0; d < self.dim(); ++d) {
    if (!(mask >> d & 1)) shape.push_back(self.size(d));
    else if (keepdim) shape.push_back(1);
  }
  return shape;
}

// A sum over f32 is f32; over i64 or bool, an exact i64 (PyTorch's integer sum).
bool sumOnDevice(const at::Tensor& self, c10::optional<at::ScalarType> dtype, const at::Tensor& out) {
  if (!typed(self)) return false;
  const at::ScalarType want = isIntegral(self) ? at::kLong : at::kFloat;
  return dtype.value_or(want) == want && (!out.defined() || (onDevice(out) && out.scalar_type() == want));
}

at::Tensor& sum_out(const at::Tensor& self, at::OptionalIntArrayRef dims, bool keepdim, c10::optional<at::ScalarType> dtype,
                    at::Tensor& out) {
  if (!sumOnDevice(self, dtype, out)) {
    return hostInto("aten::sum.IntList_out", out,
                    dims ? at::sum(host(self), *dims, keepdim, dtype) : at::sum(host(self), dtype));
  }
  const uint32_t mask = maskOf(dims, self.dim());
  at::native::resize_output(out, reducedShape(self, mask, keepdim));
  if (self.numel() == 0) return out.zero_();
  sumInto(out, self, mask, keepdim, 1);
  return out;
}
at::Tensor sum_dim(const at::Tensor& self, at::OptionalIntArrayRef dims, bool keepdim, c10::optional<at::ScalarType> dtype) {
  auto out = emptyOn({0}, dtype.value_or(at::isIntegralType(self.scalar_type(), /*includeBool=*/true) ? at::kLong : self.scalar_type()));
  return python::sum_out(self, dims, keepdim, dtype, out);
}
at::Tensor sum_all(const at::Tensor& self, c10::optional<at::ScalarType> dtype) { return python::sum_dim(self, c10::nullopt, false, dtype); }

// The mean: the sum scaled by the count of the elements summed (NaN for none, as PyTorch).
at::Tensor& mean_out(const at::Tensor& self, at::OptionalIntArrayRef dims, bool keepdim, c10::optional<at::ScalarType> dtype,
                     at::Tensor& out) {
  if (!supported({&self}) || (dtype && *dtype != at::kFloat) || (out.defined() && !isF32(out))) {
    return hostInto("aten::mean.out", out, dims ? at::mean(host(self), *dims, keepdim, dtype) : at::mean(host(self), dtype));
  }
  python::sum_out(self, dims, keepdim, dtype, out);
  const int64_t count = out.numel() == 0 ? 0 : self.numel() / out.numel();
  if (count == 0) return out.fill_(NAN);
  if (count != 1) elementwise(TensorFn::affine, out, &out, nullptr, 1.0f / static_cast<float>(count), 0);
  return out;
}
at::Tensor mean_dim(const at::Tensor& self, at::OptionalIntArrayRef dims, bool keepdim, c10::optional<at::ScalarType> dtype) {
  auto out = emptyOn({0}, dtype.value_or(self.scalar_type()));
  return python::mean_out(self, dims, keepdim, dtype, out);
}
at::Tensor mean_all(const at::Tensor& self, c10::optional<at::ScalarType> dtype) { return python::mean_dim(self, c10::nullopt, false, dtype); }

// out = alpha * a b + beta * out (out not read when beta is 0); a: [m, k], b: [k, n].
void matmul(const at::Tensor& out, const at::Tensor& a, const at::Tensor& b, float alpha, float beta) {
  Locked s;
  client::TensorOp op;
  op.fn = TensorFn::matmul;
  op.shape = {static_cast<uint64_t>(a.size(0)), static_cast<uint64_t>(b.size(1)), static_cast<uint64_t>(a.size(1))};
  op.operands = {operand(out, {out.stride(0), out.stride(1), 0}), operand(a, {a.stride(0), 0, a.stride(1)}),
                 operand(b, {0, b.stride(1), b.stride(0)})};
  op.alpha = alpha, op.beta = beta;
  send(*s, op);
}
bool sharesStorage(const at::Tensor& x, const at::Tensor& y) { return x.storage().is_alias_of(y.storage()); }

at::Tensor& mm_out(const at::Tensor& a, const at::Tensor& b, at::Tensor& out) {
  TORCH_CHECK(a.dim() == 2 && b.dim() == 2 && a.size(1) == b.size(0), "raccel: mm of ", a.sizes(), " and ", b.sizes());
  if (!supported({&a, &b, &out})) {
    return hostInto("aten::mm.out", out, at::mm(host(a), host(b)));
  }
  at::native::resize_output(out, {a.size(0), b.size(1)});
  if (out.numel() == 0) return out;
  if (a.size(1) == 0) return out.zero_();
  if (sharesStorage(out, a) || sharesStorage(out, b)) {
    auto fresh = emptyOn(out.sizes());
    matmul(fresh, a, b, 1, 0);
    return out.copy_(fresh);
  }
  matmul(out, a, b, 1, 0);
  return out;
}
at::Tensor mm(const at::Tensor& a, const at::Tensor& b) {
  auto out = emptyOn({0}, a.scalar_type());  // PyTorch takes one dtype: an integer mm runs on the host
  return python::mm_out(a, b, out);
}

// Batched, as one op: a: [B, m, k], b: [B, k, n], out: [B, m, n].
void batchedMatmul(const at::Tensor& out, const at::Tensor& a, const at::Tensor& b, float alpha, float beta) {
  Locked s;
  client::TensorOp op;
  op.fn = TensorFn::matmul;
  op.shape = {static_cast<uint64_t>(a.size(0)), static_cast<uint64_t>(a.size(1)), static_cast<uint64_t>(b.size(2)),
              static_cast<uint64_t>(a.size(2))};
  op.operands = {operand(out, {out.stride(0), out.stride(1), out.stride(2), 0}),
                 operand(a, {a.stride(0), a.stride(1), 0, a.stride(2)}), operand(b, {b.stride(0), 0, b.stride(2), b.stride(1)})};
  op.alpha = alpha, op.beta = beta;
  send(*s, op);
}

// out = beta * self + alpha * a b, batched (self broadcast to [B, m, n]); bmm is beta 0.
at::Tensor& baddbmm_out(const at::Tensor& self, const at::Tensor& a, const at::Tensor& b, const at::Scalar& beta,
                        const at::Scalar& alpha, at::Tensor& out) {
  TORCH_CHECK(a.dim() == 3 && b.dim() == 3 && a.size(0) == b.size(0) && a.size(2) == b.size(1), "raccel: bmm of ",
              a.sizes(), " and ", b.sizes());
  const float betaF = beta.toFloat();
  if (!supported({betaF != 0 ? &self : nullptr, &a, &b, &out}))
    return hostInto("aten::baddbmm.out", out, at::baddbmm(betaF != 0 ? host(self) : at::zeros({1}), host(a), host(b), beta, alpha));
  at::native::resize_output(out, {a.size(0), a.size(1), b.size(2)});
  if (out.numel() == 0) return out;
  at::Tensor target = (sharesStorage(out, a) || sharesStorage(out, b)) ? emptyOn(out.sizes()) : out;
  if (betaF != 0) elementwise(TensorFn::affine, target, &self, nullptr, betaF, 0);
  if (a.size(2) > 0) batchedMatmul(target, a, b, alpha.toFloat(), betaF != 0 ? 1.0f : 0.0f);
  else if (betaF == 0) target.zero_();
  if (!target.is_same(out)) out.copy_(target);
  return out;
}
at::Tensor baddbmm(const at::Tensor& self, const at::Tensor& a, const at::Tensor& b, const at::Scalar& beta, const at::Scalar& alpha) {
  auto out = emptyOn({0}, a.scalar_type());
  return python::baddbmm_out(self, a, b, beta, alpha, out);
}
at::Tensor& baddbmm_(at::Tensor& self, const at::Tensor& a, const at::Tensor& b, const at::Scalar& beta, const at::Scalar& alpha) {
  return python::baddbmm_out(self, a, b, beta, alpha, self);
}
at::Tensor& bmm_out(const at::Tensor& a, const at::Tensor& b, at::Tensor& out) { return python::baddbmm_out(out, a, b, 0, 1, out); }
at::Tensor bmm(const at::Tensor& a, const at::Tensor& b) {
  auto out = emptyOn({0}, a.scalar_type());
  return python::bmm_out(a, b, out);
}

// out = beta * self + alpha * a b
at::Tensor& addmm_out(const at::Tensor& self, const at::Tensor& a, const at::Tensor& b, const at::Scalar& beta,
                      const at::Scalar& alpha, at::Tensor& out) {
  TORCH_CHECK(a.dim() == 2 && b.dim() == 2 && a.size(1) == b.size(0), "raccel: addmm of ", a.sizes(), " and ", b.sizes());
  if (!supported({&self, &a, &b, &out})) {
    return hostInto("aten::addmm.out", out, at::addmm(host(self), host(a), host(b), beta, alpha));
  }
  at::native::resize_output(out, {a.size(0), b.size(1)});
  if (out.numel() == 0) return out;
  at::Tensor target = (sharesStorage(out, a) || sharesStorage(out, b)) ? emptyOn(out.sizes()) : out;
  const float betaF = beta.toFloat();
  if (betaF != 0) elementwise(TensorFn::affine, target, &self, nullptr, betaF, 0);
  if (a.size(1) > 0) matmul(target, a, b, alpha.toFloat(), betaF != 0 ? 1.0f : 0.0f);
  else if (betaF == 0) target.zero_();
  if (!target.is_same(out)) out.copy_(target);
  return out;
}
at::Tensor addmm(const at::Tensor& self, const at::Tensor& a, const at::Tensor& b, const at::Scalar& beta,
                 const at::Scalar& alpha) {
  auto out = emptyOn({0}, a.scalar_type());
  return python::addmm_out(self, a, b, beta, alpha, out);
}
at::Tensor& addmm_(at::Tensor& self, const at::Tensor& a, const at::Tensor& b, const at::Scalar& beta, const at::Scalar& alpha) {
  return python::addmm_out(self, a, b, beta, alpha, self);
}

// out = beta * self + alpha * mat vec (so mv, x @ v): addmm over vec as one column.
at::Tensor& addmv_out(const at::Tensor& self, const at::Tensor& mat, const at::Tensor& vec, const at::Scalar& beta,
                      const at::Scalar& alpha, at::Tensor& out) {
  TORCH_CHECK(mat.dim() == 2 && vec.dim() == 1 && mat.size(1) == vec.size(0), "raccel: addmv of ", mat.sizes(), " and ",
              vec.sizes());
  if (!supported({&self, &mat, &vec, &out}) || !at::is_expandable_to(self.sizes(), {mat.size(0)}))
    return hostInto("aten::addmv.out", out, at::addmv(host(self), host(mat), host(vec), beta, alpha));
  at::native::resize_output(out, {mat.size(0)});
  auto column = out.view({mat.size(0), 1});
  python::addmm_out(self.expand({mat.size(0)}).unsqueeze(1), mat, vec.unsqueeze(1), beta, alpha, column);
  return out;
}
// trace: the diagonal's sum; diag: a matrix's k-th diagonal, or a vector set on one.
at::Tensor trace(const at::Tensor& self) {
  TORCH_CHECK(self.dim() == 2, "trace: expected a matrix, but got tensor with dim ", self.dim());
  if (!typed(self)) return onHost("aten::trace", [&] { return at::trace(host(self)).to(self.device()); });
  return self.diagonal().sum();
}
at::Tensor& diag_out(const at::Tensor& self, int64_t k, at::Tensor& out) {
  TORCH_CHECK(self.dim() == 1 || self.dim() == 2, "diag(): Supports 1D or 2D tensors. Got ", self.dim(), "D");
  if (!typed(self) || !onDevice(out) || out.scalar_type() != self.scalar_type())
    return hostInto("aten::diag.out", out, at::diag(host(self), k));
  if (self.dim() == 2) {
    auto d = self.diagonal(k);
    at::native::resize_output(out, d.sizes());
    return out.copy_(d);
  }
  const int64_t n = self.size(0) + std::abs(k);
  at::native::resize_output(out, {n, n});
  out.zero_();
  out.diagonal(k).copy_(self);
  return out;
}
// The dot product of two vectors: a 1 x n by n x 1 matmul.
at::Tensor dot(const at::Tensor& a, const at::Tensor& b) {
  TORCH_CHECK(a.dim() == 1 && b.dim() == 1, "1D tensors expected, but got ", a.dim(), "D and ", b.dim(), "D tensors");
  TORCH_CHECK(a.numel() == b.numel(), "inconsistent tensor size, expected tensor [", a.numel(), "] and src [", b.numel(),
              "] to have the same number of elements, but got ", a.numel(), " and ", b.numel(), " elements respectively");
  if (!supported({&a, &b})) return onHost("aten::dot", [&] { return at::dot(host(a), host(b)).to(a.device()); });
  return python::mm(a.unsqueeze(0), b.unsqueeze(1)).reshape({});
}

at::Tensor relu(const at::Tensor& self) {
  if (!supported({&self})) return onHost("aten::relu", [&] { return at::relu(host(self)).to(self.device()); });
  auto out = emptyOn(self.sizes());
  elementwise(TensorFn::relu, out, &self, nullptr);
  return out;
}
at::Tensor& relu_(at::Tensor& self) {
  if (!supported({&self})) {
    return hostInto("aten::relu_", self, at::relu(host(self)));
  }
  elementwise(TensorFn::relu, self, &self, nullptr);
  return self;
}

at::Tensor& threshold_backward_out(const at::Tensor& grad, const at::Tensor& self, const at::Scalar& threshold,
                                   at::Tensor& gradInput) {
  if (!supported({&grad, &self, &gradInput})) {
    return hostInto("aten::threshold_backward", gradInput, at::threshold_backward(host(grad), host(self), threshold));
  }
  at::native::resize_output(gradInput, broadcastShape(grad, self));
  elementwise(TensorFn::thresholdBackward, gradInput, &grad, &self, threshold.toFloat());
  return gradInput;
}
at::Tensor threshold_backward(const at::Tensor& grad, const at::Tensor& self, const at::Scalar& threshold) {
  auto out = emptyOn({0}, grad.scalar_type());
  return python::threshold_backward_out(grad, self, threshold, out);
}

// ---- Elementwise families (optimizers' steps, activations and their backwards) ----------

// out = fn(self) (alpha and beta as the function takes them), or the host's `reference`
// counted.
template <class Host>
at::Tensor& unaryOut(TensorFn fn, const char* name, const at::Tensor& self0, at::Tensor& out, float alpha, Host reference,
                     float beta = 0) {
  const at::Tensor self = promoted(self0, out);
  if (fn == TensorFn::affine && alpha == -1 && beta == 0 && bothI64(self, out)) {  // neg of i64: times -1, exactly
    auto minusOne = *deviceNumber(at::scalar_tensor(-1, at::kLong), at::kLong);
    at::native::resize_output(out, self.sizes());
    elementwise(TensorFn::mul, out, &self, &minusOne);
    return out;
  }
  const bool exactInteger = fn == TensorFn::abs && bothI64(self, out);  // (the card's abs over i64)
  if (!exactInteger && !supported({&self, &out})) return hostInto(name, out, reference(host(self)));
  at::native::resize_output(out, self.sizes());
  elementwise(fn, out, &self, nullptr, alpha, beta);
  return out;
}
// The dtype of a float function's result (sqrt, exp, true division...), as PyTorch's:
// the default float type for an integer or bool one. An out that cannot hold an op's
// result type is refused, with PyTorch's message.
at::ScalarType floatResult(at::ScalarType type) {
  return at::isIntegralType(type, /*includeBool=*/true) ? c10::typeMetaToScalarType(at::get_default_dtype()) : type;
}
void checkOutHolds(at::ScalarType result, const at::Tensor& out) {
  TORCH_CHECK(at::canCast(result, out.scalar_type()), "result type ", result, " can't be cast to the desired output type ",
              out.scalar_type());
}

// `floats`: a float function, whose result on integers is the default float type.
#define RACCEL_UNARY(op, fn, alpha, floats)                                                                  \
  at::Tensor& op##_out(const at::Tensor& self, at::Tensor& out) {                                              \
    if (floats) checkOutHolds(floatResult(self.scalar_type()), out);                                           \
    return unaryOut(fn, "aten::" #op, self, out, alpha, [](const at::Tensor& x) { return at::op(x); });        \
  }                                                                                                            \
  at::Tensor op(const at::Tensor& self) {                                                                      \
    auto out = emptyOn({0}, floats ? floatResult(self.scalar_type()) : self.scalar_type());                    \
    return python::op##_out(self, out);                                                                        \
  }                                                                                                            \
  at::Tensor& op##_(at::Tensor& self) { return python::op##_out(self, self); }
RACCEL_UNARY(sqrt, TensorFn::sqrt, 1, true)
RACCEL_UNARY(tanh, TensorFn::tanh, 1, true)
RACCEL_UNARY(sigmoid, TensorFn::sigmoid, 1, true)
RACCEL_UNARY(abs, TensorFn::abs, 1, false)
RACCEL_UNARY(neg, TensorFn::affine, -1, false)
RACCEL_UNARY(sign, TensorFn::sign, 1, false)
RACCEL_UNARY(sgn, TensorFn::sign, 1, false)  // for real numbers, sign (abs's backward)
RACCEL_UNARY(exp, TensorFn::exp, 1, true)
RACCEL_UNARY(log, TensorFn::log, 1, true)
RACCEL_UNARY(log1p, TensorFn::log1p, 1, true)
RACCEL_UNARY(reciprocal, TensorFn::reciprocal, 1, true)
RACCEL_UNARY(rsqrt, TensorFn::rsqrt, 1, true)
RACCEL_UNARY(floor, TensorFn::floor, 1, false)
RACCEL_UNARY(ceil, TensorFn::ceil, 1, false)
RACCEL_UNARY(round, TensorFn::round, 1, false)
RACCEL_UNARY(trunc, TensorFn::trunc, 1, false)
RACCEL_UNARY(frac, TensorFn::frac, 1, false)
RACCEL_UNARY(sin, TensorFn::sin, 1, true)
RACCEL_UNARY(cos, TensorFn::cos, 1, true)
RACCEL_UNARY(tan, TensorFn::tan, 1, true)
RACCEL_UNARY(asin, TensorFn::asin, 1, true)
RACCEL_UNARY(acos, TensorFn::acos, 1, true)
RACCEL_UNARY(atan, TensorFn::atan, 1, true)
RACCEL_UNARY(sinh, TensorFn::sinh, 1, true)
RACCEL_UNARY(cosh, TensorFn::cosh, 1, true)
RACCEL_UNARY(erf, TensorFn::erf, 1, true)
RACCEL_UNARY(erfc, TensorFn::erfc, 1, true)
RACCEL_UNARY(expm1, TensorFn::expm1, 1, true)
RACCEL_UNARY(log2, TensorFn::log2, 1, true)
RACCEL_UNARY(log10, TensorFn::log10, 1, true)
RACCEL_UNARY(exp2, TensorFn::exp2, 1, true)
#undef RACCEL_UNARY

at::Tensor& pow_out(const at::Tensor& self, const at::Scalar& exponent, at::Tensor& out) {
  checkOutHolds(at::result_type(self, exponent), out);
  return unaryOut(TensorFn::pow, "aten::pow.Tensor_Scalar", self, out, exponent.toFloat(),
                  [&](const at::Tensor& x) { return at::pow(x, exponent); });
}
at::Tensor pow(const at::Tensor& self, const at::Scalar& exponent) {
  // PyTorch's result type: an integer to an integer power stays an integer (on the host
  // here, as the kernels' powers are f32), to a fractional one it is the default float.
  auto out = emptyOn({0}, at::result_type(self, exponent));
  return python::pow_out(self, exponent, out);
}
at::Tensor& pow_(at::Tensor& self, const at::Scalar& exponent) { return python::pow_out(self, exponent, self); }

// A host float number as a one-element tensor on the card (written, no wait); any other
// tensor as it is.
at::Tensor onCardSide(const at::Tensor& t) { return isHostScalar(t) && t.is_floating_point() ? *deviceNumber(t, at::kFloat) : t; }
// out = fn(a, b) over their broadcast shape (either a host number), or the host's
// `reference` counted.
template <class Host>
at::Tensor& binaryOut(TensorFn fn, const char* name, const at::Tensor& a0, const at::Tensor& b0, at::Tensor& out,
                      Host reference, float alpha = 1, float beta = 0) {
  const at::Tensor a = promoted(onCardSide(a0), out), b = promoted(onCardSide(b0), out);
  if (!supported({&a, &b, &out})) return hostInto(name, out, reference(host(a), host(b)));
  at::native::resize_output(out, broadcastShape(a, b));
  elementwise(fn, out, &a, &b, alpha, beta);
  return out;
}

#define RACCEL_BINARY(op, fn, name)                                                                            \
  at::Tensor& op##_out(const at::Tensor& a, const at::Tensor& b, at::Tensor& out) {                            \
    return binaryOut(fn, name, a, b, out, [](const at::Tensor& x, const at::Tensor& y) { return at::op(x, y); }); \
  }                                                                                                            \
  at::Tensor op(const at::Tensor& a, const at::Tensor& b) {                                                    \
    auto out = emptyOn({0}, at::result_type(a, b));                                                            \
    return python::op##_out(a, b, out);                                                                        \
  }
RACCEL_BINARY(maximum, TensorFn::maximum, "aten::maximum")
RACCEL_BINARY(minimum, TensorFn::minimum, "aten::minimum")
RACCEL_BINARY(tanh_backward, TensorFn::tanhBackward, "aten::tanh_backward")
RACCEL_BINARY(sigmoid_backward, TensorFn::sigmoidBackward, "aten::sigmoid_backward")
RACCEL_BINARY(atan2, TensorFn::atan2, "aten::atan2.out")  // C's math of two f32 inputs
RACCEL_BINARY(hypot, TensorFn::hypot, "aten::hypot.out")
RACCEL_BINARY(copysign, TensorFn::copysign, "aten::copysign.out")
RACCEL_BINARY(fmod, TensorFn::fmod, "aten::fmod.Tensor_out")
#undef RACCEL_BINARY

// out = a / b (b may be a host number: a times its inverse). True division: integers
// divide as the default float type, and an integer out is refused, as PyTorch does.
at::Tensor& div_out(const at::Tensor& a, const at::Tensor& b, at::Tensor& out) {
  checkOutHolds(floatResult(out.scalar_type()), out);
  if (isHostScalar(b) && supported({&a, &out})) {
    at::native::resize_output(out, a.sizes());
    elementwise(TensorFn::affine, out, &a, nullptr, static_cast<float>(1.0 / b.item<double>()), 0);
    return out;
  }
  return binaryOut(TensorFn::div, "aten::div.out", a, b, out, [](const at::Tensor& x, const at::Tensor& y) { return at::div(x, y); });
}
at::Tensor div(const at::Tensor& a, const at::Tensor& b) {
  auto out = emptyOn({0}, floatResult(at::result_type(a, b)));
  return python::div_out(a, b, out);
}
at::Tensor& div_(at::Tensor& self, const at::Tensor& other) { return python::div_out(self, other, self); }

// remainder over f32: fmod moved to the divisor's sign, as PyTorch's (Python's %).
at::Tensor& remainder_out(const at::Tensor& a0, const at::Tensor& b0, at::Tensor& out) {
  const at::Tensor a = onCardSide(a0), b = onCardSide(b0);
  if (!supported({&a, &b, &out})) return hostInto("aten::remainder.Tensor_out", out, at::remainder(host(a), host(b)));
  auto mod = at::fmod(a, b);
  auto result = at::where((mod != 0).logical_and((b < 0).logical_xor(mod < 0)), mod + b, mod);
  at::native::resize_output(out, result.sizes());
  return out.copy_(result);
}
// Division rounded down (floor) or toward zero (trunc), over f32, by PyTorch's CPU rules:
// floor from fmod, so that a / b's own rounding cannot cross an integer (div_floor).
at::Tensor floorDivided(const at::Tensor& a, const at::Tensor& b) {
  auto mod = at::fmod(a, b);
  auto div = (a - mod) / b;
  div = at::where((mod != 0).logical_and((b < 0).logical_xor(mod < 0)), div - 1, div);
  auto floored = at::floor(div);
  floored = at::where(div - floored > 0.5, floored + 1, floored);
  auto quotient = a / b;
  auto result = at::where(div != 0, floored, at::copysign(at::zeros({}, quotient.options()), quotient));
  return at::where(b == 0, quotient, result);
}
at::Tensor& div_out_mode(const at::Tensor& a0, const at::Tensor& b0, c10::optional<c10::string_view> mode, at::Tensor& out) {
  const at::Tensor a = onCardSide(a0), b = onCardSide(b0);
  if (!mode) return python::div_out(a, b, out);
  if (!supported({&a, &b, &out})) return hostInto("aten::div.out_mode", out, at::div(host(a), host(b), mode));
  auto result = *mode == "trunc" ? at::trunc(a / b) : floorDivided(a, b);
  at::native::resize_output(out, result.sizes());
  return out.copy_(result);
}
at::Tensor& floor_divide_out(const at::Tensor& a, const at::Tensor& b, at::Tensor& out) {
  return python::div_out_mode(a, b, "floor", out);
}
at::Tensor floor_divide(const at::Tensor& a, const at::Tensor& b) {
  auto out = emptyOn({0}, at::result_type(a, b));
  return python::floor_divide_out(a, b, out);
}
at::Tensor& floor_divide_(at::Tensor& self, const at::Tensor& other) { return python::floor_divide_out(self, other, self); }

// Activations with parameters, and their backwards (grad, the forward's input).
float geluForm(c10::string_view approximate) {
  TORCH_CHECK(approximate == "none" || approximate == "tanh", "raccel: gelu approximate='", std::string(approximate),
              "' (none or tanh)");
  return approximate == "tanh" ? 1.0f : 0.0f;
}
at::Tensor& gelu_out(const at::Tensor& self, c10::string_view approximate, at::Tensor& out) {
  return unaryOut(TensorFn::gelu, "aten::gelu", self, out, geluForm(approximate),
                  [&](const at::Tensor& x) { return at::gelu(x, approximate); });
}
at::Tensor gelu(const at::Tensor& self, c10::string_view approximate) {
  auto out = emptyOn({0}, self.scalar_type());
  return python::gelu_out(self, approximate, out);
}
at::Tensor& gelu_(at::Tensor& self, c10::string_view approximate) { return python::gelu_out(self, approximate, self); }
at::Tensor& gelu_backward_out(const at::Tensor& grad, const at::Tensor& self, c10::string_view approximate, at::Tensor& out) {
  return binaryOut(TensorFn::geluBackward, "aten::gelu_backward", grad, self, out,
                   [&](const at::Tensor& g, const at::Tensor& x) { return at::gelu_backward(g, x, approximate); },
                   geluForm(approximate));
}
at::Tensor gelu_backward(const at::Tensor& grad, const at::Tensor& self, c10::string_view approximate) {
  auto out = emptyOn({0}, grad.scalar_type());
  return python::gelu_backward_out(grad, self, approximate, out);
}

// An activation without parameters and its backward, each one map of its own: op_out,
// op, op_ and op_backward_out, op_backward (the gradient, then the forward's input).
#define RACCEL_PLAIN_ACTIVATION(op, fn, backwardFn)                                                              \
  at::Tensor& op##_out(const at::Tensor& self, at::Tensor& out) {                                               \
    return unaryOut(fn, "aten::" #op, self, out, 1, [](const at::Tensor& x) { return at::op(x); });             \
  }                                                                                                             \
  at::Tensor op(const at::Tensor& self) {                                                                       \
    auto out = emptyOn({0}, self.scalar_type());                                                                \
    return python::op##_out(self, out);                                                                         \
  }                                                                                                             \
  at::Tensor& op##_(at::Tensor& self) { return python::op##_out(self, self); }                                  \
  at::Tensor& op##_backward_out(const at::Tensor& grad, const at::Tensor& self, at::Tensor& out) {              \
    return binaryOut(backwardFn, "aten::" #op "_backward", grad, self, out,                                     \
                     [](const at::Tensor& g, const at::Tensor& x) { return at::op##_backward(g, x); });         \
  }                                                                                                             \
  at::Tensor op##_backward(const at::Tensor& grad, const at::Tensor& self) {                                    \
    auto out = emptyOn({0}, grad.scalar_type());                                                                \
    return python::op##_backward_out(grad, self, out);                                                          \
  }
RACCEL_PLAIN_ACTIVATION(silu, TensorFn::silu, TensorFn::siluBackward)
RACCEL_PLAIN_ACTIVATION(hardswish, TensorFn::hardswish, TensorFn::hardswishBackward)
RACCEL_PLAIN_ACTIVATION(hardsigmoid, TensorFn::hardsigmoid, TensorFn::hardsigmoidBackward)
RACCEL_PLAIN_ACTIVATION(mish, TensorFn::mish, TensorFn::mishBackward)
#undef RACCEL_PLAIN_ACTIVATION

at::Tensor& leaky_relu_out(const at::Tensor& self, const at::Scalar& slope, at::Tensor& out) {
  return unaryOut(TensorFn::leakyRelu, "aten::leaky_relu", self, out, slope.toFloat(),
                  [&](const at::Tensor& x) { return at::leaky_relu(x, slope); });
}
at::Tensor leaky_relu(const at::Tensor& self, const at::Scalar& slope) {
  auto out = emptyOn({0}, self.scalar_type());
  return python::leaky_relu_out(self, slope, out);
}
at::Tensor& leaky_relu_(at::Tensor& self, const at::Scalar& slope) { return python::leaky_relu_out(self, slope, self); }
// (With a positive slope the result has its input's sign, so self_is_result changes nothing.)
at::Tensor& leaky_relu_backward_out(const at::Tensor& grad, const at::Tensor& self, const at::Scalar& slope, bool isResult,
                                    at::Tensor& out) {
  return binaryOut(TensorFn::leakyReluBackward, "aten::leaky_relu_backward", grad, self, out,
                   [&](const at::Tensor& g, const at::Tensor& x) { return at::leaky_relu_backward(g, x, slope, isResult); },
                   slope.toFloat());
}
at::Tensor leaky_relu_backward(const at::Tensor& grad, const at::Tensor& self, const at::Scalar& slope, bool isResult) {
  auto out = emptyOn({0}, grad.scalar_type());
  return python::leaky_relu_backward_out(grad, self, slope, isResult, out);
}

at::Tensor& softplus_out(const at::Tensor& self, const at::Scalar& beta, const at::Scalar& threshold, at::Tensor& out) {
  return unaryOut(TensorFn::softplus, "aten::softplus", self, out, beta.toFloat(),
                  [&](const at::Tensor& x) { return at::softplus(x, beta, threshold); }, threshold.toFloat());
}
at::Tensor softplus(const at::Tensor& self, const at::Scalar& beta, const at::Scalar& threshold) {
  auto out = emptyOn({0}, self.scalar_type());
  return python::softplus_out(self, beta, threshold, out);
}
at::Tensor& softplus_backward_out(const at::Tensor& grad, const at::Tensor& self, const at::Scalar& beta,
                                  const at::Scalar& threshold, at::Tensor& out) {
  return binaryOut(TensorFn::softplusBackward, "aten::softplus_backward", grad, self, out,
                   [&](const at::Tensor& g, const at::Tensor& x) { return at::softplus_backward(g, x, beta, threshold); },
                   beta.toFloat(), threshold.toFloat());
}
at::Tensor softplus_backward(const at::Tensor& grad, const at::Tensor& self, const at::Scalar& beta, const at::Scalar& threshold) {
  auto out = emptyOn({0}, grad.scalar_type());
  return python::softplus_backward_out(grad, self, beta, threshold, out);
}

at::Tensor& hardtanh_out(const at::Tensor& self, const at::Scalar& low, const at::Scalar& high, at::Tensor& out) {
  return unaryOut(TensorFn::hardtanh, "aten::hardtanh", self, out, low.toFloat(),
                  [&](const at::Tensor& x) { return at::hardtanh(x, low, high); }, high.toFloat());
}
at::Tensor hardtanh(const at::Tensor& self, const at::Scalar& low, const at::Scalar& high) {
  auto out = emptyOn({0}, self.scalar_type());
  return python::hardtanh_out(self, low, high, out);
}
at::Tensor& hardtanh_(at::Tensor& self, const at::Scalar& low, const at::Scalar& high) {
  return python::hardtanh_out(self, low, high, self);
}
at::Tensor& hardtanh_backward_out(const at::Tensor& grad, const at::Tensor& self, const at::Scalar& low, const at::Scalar& high,
                                  at::Tensor& out) {
  return binaryOut(TensorFn::hardtanhBackward, "aten::hardtanh_backward", grad, self, out,
                   [&](const at::Tensor& g, const at::Tensor& x) { return at::hardtanh_backward(g, x, low, high); },
                   low.toFloat(), high.toFloat());
}
at::Tensor hardtanh_backward(const at::Tensor& grad, const at::Tensor& self, const at::Scalar& low, const at::Scalar& high) {
  auto out = emptyOn({0}, grad.scalar_type());
  return python::hardtanh_backward_out(grad, self, low, high, out);
}

// out = self + value * t1 (* or /) t2: Adam's and RMSprop's steps.
template <class Host>
at::Tensor& ternaryOut(TensorFn fn, const char* name, const at::Tensor& self, const at::Tensor& t1, const at::Tensor& t2,
                       const at::Scalar& value, at::Tensor& out, Host reference) {
  if (!supported({&self, &t1, &t2, &out})) return hostInto(name, out, reference(host(self), host(t1), host(t2)));
  at::native::resize_output(out, at::infer_size(self.sizes(), broadcastShape(t1, t2)));
  elementwise(fn, out, &self, &t1, value.toFloat(), 0, &t2);
  return out;
}

#define RACCEL_TERNARY(op, fn)                                                                                         \
  at::Tensor& op##_out(const at::Tensor& self, const at::Tensor& t1, const at::Tensor& t2, const at::Scalar& value,   \
                       at::Tensor& out) {                                                                            \
    return ternaryOut(fn, "aten::" #op, self, t1, t2, value, out,                                                    \
                      [&](const at::Tensor& x, const at::Tensor& y, const at::Tensor& z) { return at::op(x, y, z, value); }); \
  }                                                                                                                  \
  at::Tensor op(const at::Tensor& self, const at::Tensor& t1, const at::Tensor& t2, const at::Scalar& value) {        \
    auto out = emptyOn({0}, self.scalar_type());                                                                     \
    return python::op##_out(self, t1, t2, value, out);                                                               \
  }                                                                                                                  \
  at::Tensor& op##_(at::Tensor& self, const at::Tensor& t1, const at::Tensor& t2, const at::Scalar& value) {         \
    return python::op##_out(self, t1, t2, value, self);                                                              \
  }
RACCEL_TERNARY(addcmul, TensorFn::addcmul)
RACCEL_TERNARY(addcdiv, TensorFn::addcdiv)
#undef RACCEL_TERNARY

// ---- Clamps, interpolation, ELU ---------------------------------------------------------

at::Tensor& clamp_out(const at::Tensor& self, const c10::optional<at::Scalar>& low, const c10::optional<at::Scalar>& high,
                      at::Tensor& out) {
  return unaryOut(TensorFn::clamp, "aten::clamp", self, out, low ? low->toFloat() : -INFINITY,
                  [&](const at::Tensor& x) { return at::clamp(x, low, high); }, high ? high->toFloat() : INFINITY);
}
at::Tensor clamp(const at::Tensor& self, const c10::optional<at::Scalar>& low, const c10::optional<at::Scalar>& high) {
  auto out = emptyOn({0}, self.scalar_type());
  return python::clamp_out(self, low, high, out);
}
at::Tensor& clamp_(at::Tensor& self, const c10::optional<at::Scalar>& low, const c10::optional<at::Scalar>& high) {
  return python::clamp_out(self, low, high, self);
}
at::Tensor& clamp_min_out(const at::Tensor& self, const at::Scalar& low, at::Tensor& out) {
  return python::clamp_out(self, low, c10::nullopt, out);
}
at::Tensor clamp_min(const at::Tensor& self, const at::Scalar& low) { return python::clamp(self, low, c10::nullopt); }
at::Tensor& clamp_min_(at::Tensor& self, const at::Scalar& low) { return python::clamp_out(self, low, c10::nullopt, self); }
at::Tensor& clamp_max_out(const at::Tensor& self, const at::Scalar& high, at::Tensor& out) {
  return python::clamp_out(self, c10::nullopt, high, out);
}
at::Tensor clamp_max(const at::Tensor& self, const at::Scalar& high) { return python::clamp(self, c10::nullopt, high); }
at::Tensor& clamp_max_(at::Tensor& self, const at::Scalar& high) { return python::clamp_out(self, c10::nullopt, high, self); }

// out = self + weight * (end - self)
at::Tensor& lerp_out(const at::Tensor& self, const at::Tensor& end, const at::Scalar& weight, at::Tensor& out) {
  return binaryOut(TensorFn::lerp, "aten::lerp.Scalar", self, end, out,
                   [&](const at::Tensor& x, const at::Tensor& y) { return at::lerp(x, y, weight); }, weight.toFloat());
}
at::Tensor lerp(const at::Tensor& self, const at::Tensor& end, const at::Scalar& weight) {
  auto out = emptyOn({0}, self.scalar_type());
  return python::lerp_out(self, end, weight, out);
}
at::Tensor& lerp_(at::Tensor& self, const at::Tensor& end, const at::Scalar& weight) {
  return python::lerp_out(self, end, weight, self);
}

// clamp by tensors: maximum with the low bound, then minimum with the high one (a NaN on
// either side is NaN, and a low bound above the high one gives the high, as PyTorch's).
at::Tensor& clamp_Tensor_out(const at::Tensor& self, const c10::optional<at::Tensor>& low, const c10::optional<at::Tensor>& high,
                             at::Tensor& out) {
  if (!supported({&self, present(low), present(high), &out}) || (!present(low) && !present(high)))
    return hostInto("aten::clamp.Tensor_out", out,
                    at::clamp(host(self), present(low) ? c10::optional<at::Tensor>(host(*low)) : c10::nullopt,
                              present(high) ? c10::optional<at::Tensor>(host(*high)) : c10::nullopt));
  auto result = present(low) ? at::maximum(self, *low) : self;
  if (present(high)) result = at::minimum(result, *high);
  at::native::resize_output(out, result.sizes());
  return out.copy_(result);
}
// lerp by a tensor of weights, PyTorch's formula: from the nearer end (|w| < 0.5: start).
at::Tensor& lerp_Tensor_out(const at::Tensor& self, const at::Tensor& end, const at::Tensor& weight, at::Tensor& out) {
  if (!supported({&self, &end, &weight, &out}))
    return hostInto("aten::lerp.Tensor_out", out, at::lerp(host(self), host(end), host(weight)));
  auto span = end - self;
  auto result = at::where(weight.abs() < 0.5, self + weight * span, end - span * (1 - weight));
  at::native::resize_output(out, result.sizes());
  return out.copy_(result);
}

// ELU with PyTorch's default scales (scale and input_scale 1; others run on the host).
// elu with PyTorch's scale (selu's) is the plain one scaled after it, and so is its
// backward; an input scale other than 1 runs on the host.
bool cardElu(const at::Scalar& inputScale) { return inputScale.toDouble() == 1; }
at::Tensor& scaledBy(at::Tensor& out, const at::Scalar& scale) { return scale.toDouble() == 1 ? out : out.mul_(scale); }
at::Tensor& elu_out(const at::Tensor& self, const at::Scalar& alpha, const at::Scalar& scale, const at::Scalar& inputScale,
                    at::Tensor& out) {
  auto reference = [&](const at::Tensor& x) { return at::elu(x, alpha, scale, inputScale); };
  if (!cardElu(inputScale) || !supported({&self, &out})) return hostInto("aten::elu", out, reference(host(self)));
  return scaledBy(unaryOut(TensorFn::elu, "aten::elu", self, out, alpha.toFloat(), reference), scale);
}
at::Tensor elu(const at::Tensor& self, const at::Scalar& alpha, const at::Scalar& scale, const at::Scalar& inputScale) {
  auto out = emptyOn({0}, self.scalar_type());
  return python::elu_out(self, alpha, scale, inputScale, out);
}
at::Tensor& elu_(at::Tensor& self, const at::Scalar& alpha, const at::Scalar& scale, const at::Scalar& inputScale) {
  return python::elu_out(self, alpha, scale, inputScale, self);
}
at::Tensor& elu_backward_out(const at::Tensor& grad, const at::Scalar& alpha, const at::Scalar& scale,
                             const at::Scalar& inputScale, bool isResult, const at::Tensor& selfOrResult, at::Tensor& out) {
  auto reference = [&](const at::Tensor& g, const at::Tensor& x) {
    return at::elu_backward(g, alpha, scale, inputScale, isResult, x);
  };
  if (!cardElu(inputScale) || isResult || !supported({&grad, &selfOrResult, &out}))
    return hostInto("aten::elu_backward", out, reference(host(grad), host(selfOrResult)));
  return scaledBy(binaryOut(TensorFn::eluBackward, "aten::elu_backward", grad, selfOrResult, out, reference, alpha.toFloat()), scale);
}
at::Tensor elu_backward(const at::Tensor& grad, const at::Scalar& alpha, const at::Scalar& scale, const at::Scalar& inputScale,
                        bool isResult, const at::Tensor& selfOrResult) {
  auto out = emptyOn({0}, grad.scalar_type());
  return python::elu_backward_out(grad, alpha, scale, inputScale, isResult, selfOrResult, out);
}

// ---- Joining ---------------------------------------------------------------------------

// Each tensor copied into its run of `out` along `dim` (1-d empty tensors skipped, as
// PyTorch does); tensors of another dtype than out's run on the host.
at::Tensor& cat_out(const at::ITensorListRef& tensors, int64_t dim, at::Tensor& out) {
  std::vector<at::Tensor> parts;
  for (const at::Tensor& t : tensors) parts.push_back(t);
  bool ok = typed(out);
  const at::Tensor* first = nullptr;
  for (auto& t : parts) {
    if (t.dim() == 1 && t.numel() == 0) continue;
    ok = ok && typed(t);  // (another dtype than out's converted by the copy)
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

// out = self's entries at `index` along `dim` (index i64 on the device, one dimension).
at::Tensor& index_select_out(const at::Tensor& self0, int64_t dim, const at::Tensor& index, at::Tensor& out) {
  const bool ok = typed(self0) && typed(out) && out.scalar_type() == self0.scalar_type() && typed(index) &&
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

// Along `dim`: out[.., index[.., i, ..], ..] = (accumulate ? out : 0) + alpha * src[.., i, ..]
// summed over i, for the positions of src's shape (index of src's shape, or a view
// expanded to it; out's other dimensions at least src's, its other elements untouched);
// an index equal to `padding` or outside out's rows adds nothing. One indexAdd op: the
// other dimensions, then the rows, then the positions. src must not share out's storage.
void addAtIndex(const at::Tensor& out, int64_t dim, const at::Tensor& index, const at::Tensor& src, float alpha, bool accumulate,
                int64_t padding = -1) {
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
  op.fn = TensorFn::indexAdd;
  op.shape = shapeOf(shape);
  op.operands = {operand(out, outStrides), operand(src, srcStrides), operand(index, indexStrides)};
  op.alpha = alpha, op.beta = accumulate ? 1 : 0;
  op.ignoreIndex = padding;
  send(*s, op);
}

// The embedding table's gradient: each row the sum of the gradients of the positions
// that picked it (the padding row's 0).
at::Tensor embedding_dense_backward(const at::Tensor& grad, const at::Tensor& indices, int64_t numWeights, int64_t paddingIdx,
                                    bool scaleGradByFreq) {
  if (!supported({&grad}) || !typed(indices) || indices.scalar_type() != at::kLong || scaleGradByFreq)
    return onHost("aten::embedding_dense_backward", [&] {
      return at::embedding_dense_backward(host(grad), host(indices), numWeights, paddingIdx, scaleGradByFreq).to(grad.device());
    });
  const int64_t dim = grad.size(-1), n = indices.numel();
  auto g = grad.reshape({n, dim}), idx = indices.reshape({n, 1}).expand({n, dim});
  auto out = emptyOn({numWeights, dim});
  if (n == 0) return out.zero_();
  addAtIndex(out, 0, idx, g, 1, false, paddingIdx < 0 ? -1 : paddingIdx);
  return out;
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
  if (!ok) return hostInto("aten::scatter_add", out, at::scatter_add(host(self), dim, host(index), host(src)));
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

// Index tensors whose picks are distinct in each row along a dimension: sort's and topk's
// (their backwards scatter the gradient through them). Held weakly, so an entry ends
// with its tensor; a write to the tensor (its version) voids it.
struct DistinctIndex {
  c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl> tensor;
  uint32_t version;
  int64_t dim;
};
struct DistinctIndices {
  std::mutex mu;
  std::deque<DistinctIndex> kept;  // the newest last; at most kMax
  static constexpr size_t kMax = 64;
};
DistinctIndices& distinctIndices() {
  static auto* d = new DistinctIndices;  // never destroyed, like the session's State
  return *d;
}
void noteDistinct(const at::Tensor& index, int64_t dim) {
  auto& d = distinctIndices();
  std::lock_guard lock(d.mu);
  if (d.kept.size() >= DistinctIndices::kMax) d.kept.pop_front();
  d.kept.push_back({c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>(index.getIntrusivePtr()),
                    index._version(), dim});
}
bool distinctAlong(const at::Tensor& index, int64_t dim) {
  auto& d = distinctIndices();
  std::lock_guard lock(d.mu);
  for (auto& e : d.kept)
    if (e.dim == dim && e.version == index._version() && e.tensor.lock().get() == index.unsafeGetTensorImpl()) return true;
  return false;
}

// out = self, then out[.., index[.., i, ..], ..] = value, or src[.., i, ..], along `dim`:
// the positions picked (an index_add of ones there) take the value or the sum of the src
// picked into them. With src only where no two picks can meet a position (index one long
// along dim: a max's or min's backward; or sort's or topk's indices), as PyTorch leaves
// open which of several wins and a sum is none of them; the others run on the host. A
// value goes into f32 or i64 (one_hot's ones).
at::Tensor& scatterInto(const char* name, const at::Tensor& self, int64_t dim, const at::Tensor& index, const at::Tensor* src,
                        const at::Scalar& value, at::Tensor& out) {
  const bool integers = !src && bothI64(self, out);
  const bool ok = (integers || supported({&self, src, &out})) && onDevice(self) && onDevice(out) && (!src || onDevice(*src)) &&
                  typed(index) && index.scalar_type() == at::kLong && self.dim() >= 1 && self.dim() <= 5 &&
                  index.dim() == self.dim() &&
                  (!src || (src->dim() == self.dim() && (index.size(c10::maybe_wrap_dim(dim, self.dim())) <= 1 ||
                                                         distinctAlong(index, c10::maybe_wrap_dim(dim, self.dim())))));
  if (!ok)
    return hostInto(name, out, src ? at::scatter(host(self), dim, host(index), host(*src)) : at::scatter(host(self), dim, host(index), value));
  dim = c10::maybe_wrap_dim(dim, self.dim());
  checkAlong(index, dim, self.size(dim));
  TrustedIndices checked;
  const auto counts = self.options().dtype(at::kFloat);
  auto hit = python::scatter_add(at::zeros(self.sizes(), counts), dim, index, at::ones(index.sizes(), counts));
  auto result = src ? at::where(hit > 0, python::scatter_add(at::zeros_like(self), dim, index, *src), self)
                    : self.masked_fill(hit > 0, value);
  at::native::resize_output(out, self.sizes());
  return out.copy_(result);
}
at::Tensor& scatter_src_out(const at::Tensor& self, int64_t dim, const at::Tensor& index, const at::Tensor& src, at::Tensor& out) {
  return scatterInto("aten::scatter.src_out", self, dim, index, &src, 0, out);
}
at::Tensor& scatter_value_out(const at::Tensor& self, int64_t dim, const at::Tensor& index, const at::Scalar& value, at::Tensor& out) {
  return scatterInto("aten::scatter.value_out", self, dim, index, nullptr, value, out);
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
  auto picks = at::where(index < 0, index + self.size(dim), index).reshape({-1});
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
  if (!ok) return hostInto("aten::index_add", out, at::index_add(host(self), dim, host(index), host(source), alpha));
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

// Advanced indexing's index tensors on the host, for PyTorch's own kernels there (its CPU
// fallback moves tensors and tensor lists, not lists of optional tensors).
c10::List<c10::optional<at::Tensor>> hostIndices(const c10::List<c10::optional<at::Tensor>>& indices) {
  c10::List<c10::optional<at::Tensor>> out;
  for (size_t i = 0; i < indices.size(); ++i) {
    auto t = indices.get(i);
    out.push_back(t && t->defined() ? c10::optional<at::Tensor>(host(*t)) : t);
  }
  return out;
}

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
      picks.push_back(at::where(*t < 0, *t + self.size(dim), *t));
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

// arange: made on the host (PyTorch's own checks of the range) and written to the card,
// a write that does not wait.
at::Tensor& arange_out(const at::Scalar& start, const at::Scalar& end, const at::Scalar& step, at::Tensor& out) {
  auto made = at::arange(start, end, step, at::TensorOptions().dtype(out.scalar_type()));
  at::native::resize_output(out, made.sizes());
  return out.copy_(made);
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

// self[indices]: one index_select over the indexed dimensions merged.
at::Tensor index(const at::Tensor& self, const c10::List<c10::optional<at::Tensor>>& indices) {
  if (auto f = typed(self) ? indexedFirst(self, indices) : std::nullopt) return python::index(self.permute(f->order), f->indices);
  auto m = typed(self) ? mergedIndex(self, indices) : std::nullopt;
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

// self's elements where mask is true, in order, as one dimension.
at::Tensor masked_select(const at::Tensor& self, const at::Tensor& mask) {
  if (!typed(self) || !typed(mask) || mask.scalar_type() != at::kBool)
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

// ---- Random numbers on the card (keyed from PyTorch's generator) -----------------------

// A Philox key for one op, drawn from `generator` (a CPU one) or PyTorch's default, so
// torch.manual_seed makes the device's draws reproducible.
int64_t randomKey(const c10::optional<at::Generator>& generator) {
  auto* g = at::get_generator_or_default<at::CPUGeneratorImpl>(generator, at::detail::getDefaultCPUGenerator());
  std::lock_guard<std::mutex> lock(g->mutex_);
  return static_cast<int64_t>(g->random64());
}
at::Tensor& randomInto(TensorFn fn, at::Tensor& self, float alpha, float beta, const c10::optional<at::Generator>& generator) {
  Locked s;
  client::TensorOp op;
  op.fn = fn;
  op.shape = shapeOf(self.sizes());
  op.operands = {operand(self, self.strides())};
  op.alpha = alpha, op.beta = beta;
  op.ignoreIndex = randomKey(generator);
  send(*s, op);
  return self;
}
bool cpuGenerator(const c10::optional<at::Generator>& generator) {
  return !generator || !generator->defined() || generator->device().is_cpu();
}
at::Tensor& bernoulli_(at::Tensor& self, double p, c10::optional<at::Generator> generator) {
  if (!supported({&self}) || !cpuGenerator(generator))
    return hostInto("aten::bernoulli_.float", self, host(self).bernoulli_(p, generator));
  return randomInto(TensorFn::bernoulli, self, static_cast<float>(p), 0, generator);
}
at::Tensor& uniform_(at::Tensor& self, double from, double to, c10::optional<at::Generator> generator) {
  if (!supported({&self}) || !cpuGenerator(generator))
    return hostInto("aten::uniform_", self, host(self).uniform_(from, to, generator));
  return randomInto(TensorFn::uniform, self, static_cast<float>(from), static_cast<float>(to), generator);
}
at::Tensor& normal_(at::Tensor& self, double mean, double std, c10::optional<at::Generator> generator) {
  if (!supported({&self}) || !cpuGenerator(generator))
    return hostInto("aten::normal_", self, host(self).normal_(mean, std, generator));
  return randomInto(TensorFn::normal, self, static_cast<float>(mean), static_cast<float>(std), generator);
}

// ---- Comparisons and selection (bool masks; f32 and exact i64) --------------------------

// `x` as an operand of `dtype`: itself when on the device with that dtype, a written
// host number, or nothing (the op runs on the host).
c10::optional<at::Tensor> sideOf(const at::Tensor& x, at::ScalarType dtype) {
  if (isHostScalar(x)) return deviceNumber(x, dtype);
  if (typed(x) && x.scalar_type() == dtype) return x;
  return c10::nullopt;
}

template <class Host>
at::Tensor& compareOut(TensorFn fn, const char* name, const at::Tensor& a, const at::Tensor& b, at::Tensor& out, Host reference) {
  c10::optional<at::Tensor> side;
  if (typed(a) && onDevice(out) && out.scalar_type() == at::kBool) side = sideOf(b, a.scalar_type());
  if (!side) return hostInto(name, out, reference(host(a), host(b)));
  at::native::resize_output(out, broadcastShape(a, *side));
  elementwise(fn, out, &a, &*side);
  return out;
}

#define RACCEL_COMPARE(op, fn)                                                                                       \
  at::Tensor& op##_out(const at::Tensor& a, const at::Tensor& b, at::Tensor& out) {                                   \
    return compareOut(fn, "aten::" #op, a, b, out, [](const at::Tensor& x, const at::Tensor& y) { return at::op(x, y); }); \
  }                                                                                                                   \
  at::Tensor op(const at::Tensor& a, const at::Tensor& b) {                                                           \
    auto out = emptyOn({0}, at::kBool);                                                                               \
    return python::op##_out(a, b, out);                                                                               \
  }                                                                                                                   \
  at::Tensor& op##_scalar_out(const at::Tensor& a, const at::Scalar& b, at::Tensor& out) {                            \
    return python::op##_out(a, at::scalar_to_tensor(b), out);                                                        \
  }                                                                                                                   \
  at::Tensor op##_scalar(const at::Tensor& a, const at::Scalar& b) { return python::op(a, at::scalar_to_tensor(b)); }
RACCEL_COMPARE(eq, TensorFn::eq)
RACCEL_COMPARE(ne, TensorFn::ne)
RACCEL_COMPARE(lt, TensorFn::lt)
RACCEL_COMPARE(le, TensorFn::le)
RACCEL_COMPARE(gt, TensorFn::gt)
RACCEL_COMPARE(ge, TensorFn::ge)
#undef RACCEL_COMPARE

// not x: x == 0
at::Tensor& logical_not_out(const at::Tensor& self, at::Tensor& out) {
  return compareOut(TensorFn::eq, "aten::logical_not", self, at::scalar_to_tensor(0), out,
                    [](const at::Tensor& x, const at::Tensor&) { return at::logical_not(x); });
}
at::Tensor logical_not(const at::Tensor& self) {
  auto out = emptyOn({0}, at::kBool);
  return python::logical_not_out(self, out);
}
// torch.equal: the same sizes and every element equal (NaN never is), compared on the
// card with one bool read back, not both tensors.
bool equal(const at::Tensor& self, const at::Tensor& other) {
  if (!typed(self) || !typed(other)) {
    countFallback("aten::equal");
    return at::equal(host(self), host(other));
  }
  return self.sizes() == other.sizes() && at::eq(self, other).all().item<bool>();
}
// How many elements are not 0 along dims: an exact i64 sum of their truths.
at::Tensor count_nonzero_dims(const at::Tensor& self, at::IntArrayRef dims) {
  if (!typed(self)) return onHost("aten::count_nonzero.dim_IntList", [&] { return at::count_nonzero(host(self), dims).to(self.device()); });
  return (self != 0).sum(dims.empty() ? at::OptionalIntArrayRef() : at::OptionalIntArrayRef(dims), false, at::kLong);
}
// NaN is the one value not equal to itself.
at::Tensor isnan(const at::Tensor& self) { return at::ne(self, self); }

// Over bools (or i64s: nonzero is true), as an exact integer mul (and) or add (or).
#define RACCEL_LOGICAL(op, fn)                                                                                        \
  at::Tensor& op##_out(const at::Tensor& a, const at::Tensor& b, at::Tensor& out) {                                   \
    auto y = integerSide(a, b, out, 1);                                                                               \
    if (!y || out.scalar_type() != at::kBool) return hostInto("aten::" #op, out, at::op(host(a), host(b)));          \
    at::native::resize_output(out, broadcastShape(a, *y));                                                            \
    elementwise(fn, out, &a, &*y);                                                                                    \
    return out;                                                                                                       \
  }                                                                                                                   \
  at::Tensor op(const at::Tensor& a, const at::Tensor& b) {                                                           \
    auto out = emptyOn({0}, at::kBool);                                                                               \
    return python::op##_out(a, b, out);                                                                               \
  }                                                                                                                   \
  at::Tensor& op##_(at::Tensor& self, const at::Tensor& other) { return python::op##_out(self, other, self); }
RACCEL_LOGICAL(logical_and, TensorFn::mul)
RACCEL_LOGICAL(logical_or, TensorFn::add)
#undef RACCEL_LOGICAL

// Exclusive or, over bools (or i64s: nonzero is true): the two sides' truths unequal.
at::Tensor& logical_xor_out(const at::Tensor& a, const at::Tensor& b, at::Tensor& out) {
  if (!typed(a) || !typed(b) || isF32(a) || isF32(b) || out.scalar_type() != at::kBool)
    return hostInto("aten::logical_xor", out, at::logical_xor(host(a), host(b)));
  auto truth = [](const at::Tensor& t) { return t.scalar_type() == at::kBool ? t : t != 0; };
  at::native::resize_output(out, broadcastShape(a, b));
  return at::ne_out(out, truth(a), truth(b));
}
at::Tensor& bitwise_xor_out(const at::Tensor& a, const at::Tensor& b, at::Tensor& out) {
  if (a.scalar_type() == at::kBool && b.scalar_type() == at::kBool && out.scalar_type() == at::kBool)
    return python::logical_xor_out(a, b, out);
  return hostInto("aten::bitwise_xor", out, at::bitwise_xor(host(a), host(b)));
}

// x & y and x | y: over bools and and or; over integers the host's bitwise ops (an i64's
// bits are not the kernels' arithmetic).
#define RACCEL_BITWISE(op, logical)                                                                                   \
  at::Tensor& op##_out(const at::Tensor& a, const at::Tensor& b, at::Tensor& out) {                                   \
    if (a.scalar_type() == at::kBool && b.scalar_type() == at::kBool && out.scalar_type() == at::kBool)               \
      return python::logical##_out(a, b, out);                                                                        \
    return hostInto("aten::" #op, out, at::op(host(a), host(b)));                                                     \
  }
RACCEL_BITWISE(bitwise_and, logical_and)
RACCEL_BITWISE(bitwise_or, logical_or)
#undef RACCEL_BITWISE

// ~x of a bool: not x (other dtypes' bitwise not runs on the host).
at::Tensor& bitwise_not_out(const at::Tensor& self, at::Tensor& out) {
  if (!(typed(self) && self.scalar_type() == at::kBool)) return hostInto("aten::bitwise_not", out, at::bitwise_not(host(self)));
  return python::logical_not_out(self, out);
}

// out = condition ? self : other (either side may be a host number).
at::Tensor& where_out(const at::Tensor& condition, const at::Tensor& self, const at::Tensor& other, at::Tensor& out) {
  c10::optional<at::Tensor> x, y;
  const bool ok = typed(condition) && condition.scalar_type() == at::kBool && onDevice(out) &&
                  (out.scalar_type() == at::kFloat || out.scalar_type() == at::kLong);
  if (ok) x = sideOf(self, out.scalar_type()), y = sideOf(other, out.scalar_type());
  if (!x || !y) return hostInto("aten::where.self", out, at::where(host(condition), host(self), host(other)));
  at::native::resize_output(out, at::infer_size(condition.sizes(), broadcastShape(*x, *y)));
  elementwise(TensorFn::where, out, &condition, &*x, 0, 0, &*y);
  return out;
}
at::Tensor where(const at::Tensor& condition, const at::Tensor& self, const at::Tensor& other) {
  auto out = emptyOn({0}, at::result_type(self, other));
  return python::where_out(condition, self, other, out);
}

// self = mask ? value : self
at::Tensor& masked_fill_(at::Tensor& self, const at::Tensor& mask, const at::Tensor& value) {
  TORCH_CHECK(value.dim() == 0, "raccel: masked_fill_ takes a 0-dimensional value, not one of ", value.sizes());
  c10::optional<at::Tensor> v;
  if (typed(mask) && mask.scalar_type() == at::kBool && typed(self) && self.scalar_type() != at::kBool)
    v = sideOf(value, self.scalar_type());
  if (!v) return hostInto("aten::masked_fill_", self, host(self).masked_fill(host(mask), host(value)));
  elementwise(TensorFn::where, self, &mask, &*v, 0, 0, &self);
  return self;
}
at::Tensor& masked_fill_scalar_(at::Tensor& self, const at::Tensor& mask, const at::Scalar& value) {
  return python::masked_fill_(self, mask, at::scalar_to_tensor(value));
}

// ---- all / any: counts of the true elements --------------------------------------------

// all: the count of nonzero elements over `mask` is every one; any: it is not 0.
at::Tensor& allOrAny(bool all, const at::Tensor& self, uint32_t mask, bool keepdim, at::Tensor& out) {
  std::vector<int64_t> dims;
  for (int64_t d = 0; d < std::max<int64_t>(self.dim(), 1); ++d)
    if (mask >> d & 1) dims.push_back(d);
  int64_t each = 1;  // elements per count
  for (int64_t d : dims) each *= self.dim() ? self.size(d) : 1;
  if (!typed(self) || !typed(out) || out.scalar_type() != at::kBool) {
    auto count = host(self).ne(0).sum(self.dim() ? at::IntArrayRef(dims) : at::IntArrayRef{}, keepdim);
    return hostInto(all ? "aten::all" : "aten::any", out, all ? count.eq(each) : count.gt(0));
  }
  at::Tensor nonzero = self.scalar_type() == at::kBool ? self : python::ne(self, at::scalar_to_tensor(0));
  auto count = emptyOn({0}, at::kLong);
  python::sum_out(nonzero, dims, keepdim, c10::nullopt, count);
  return all ? python::eq_out(count, at::scalar_to_tensor(each), out) : python::gt_out(count, at::scalar_to_tensor(0), out);
}
at::Tensor all(const at::Tensor& self) {
  auto out = emptyOn({0}, at::kBool);
  return allOrAny(true, self, everyDim(self.dim()), false, out);
}
at::Tensor any(const at::Tensor& self) {
  auto out = emptyOn({0}, at::kBool);
  return allOrAny(false, self, everyDim(self.dim()), false, out);
}
at::Tensor& all_dim_out(const at::Tensor& self, int64_t dim, bool keepdim, at::Tensor& out) {
  return allOrAny(true, self, 1u << c10::maybe_wrap_dim(dim, std::max<int64_t>(self.dim(), 1)), keepdim, out);
}
at::Tensor all_dim(const at::Tensor& self, int64_t dim, bool keepdim) {
  auto out = emptyOn({0}, at::kBool);
  return python::all_dim_out(self, dim, keepdim, out);
}
at::Tensor& any_dim_out(const at::Tensor& self, int64_t dim, bool keepdim, at::Tensor& out) {
  return allOrAny(false, self, 1u << c10::maybe_wrap_dim(dim, std::max<int64_t>(self.dim(), 1)), keepdim, out);
}
at::Tensor any_dim(const at::Tensor& self, int64_t dim, bool keepdim) {
  auto out = emptyOn({0}, at::kBool);
  return python::any_dim_out(self, dim, keepdim, out);
}

// ---- Reductions to values and positions -------------------------------------------------

// out = fn over the dimensions in `mask` of self: the op walks self's kept dimensions
// first and its reduced ones after (tensor ops take them in that order).
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

// Over f32, i64 or bool on the device (integers compared exactly), into an output of
// `dtype` there (or nothing: on the host).
bool reducible(const at::Tensor& self, const at::Tensor& out, at::ScalarType dtype) {
  return typed(self) && onDevice(out) && out.scalar_type() == dtype;
}

#define RACCEL_EXTREMUM(op, fn)                                                                                       \
  at::Tensor& op##_out(const at::Tensor& self, c10::IntArrayRef dims, bool keepdim, at::Tensor& out) {                \
    if (!reducible(self, out, self.scalar_type())) return hostInto("aten::" #op, out, at::op(host(self), dims, keepdim)); \
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
    if (!reducible(self, out, at::kLong)) return hostInto("aten::" #op, out, at::op(host(self), dim, keepdim));        \
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

// max/min over a dimension: the values and their positions (two reductions).
#define RACCEL_VALUES_AND_POSITIONS(op, values, positions)                                                            \
  std::tuple<at::Tensor&, at::Tensor&> op##_dim_out(const at::Tensor& self, int64_t dim, bool keepdim, at::Tensor& value, \
                                                    at::Tensor& position) {                                           \
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
  if (!supported({&self, &out})) return hostInto("aten::var.correction", out, at::var(host(self), dims, correction, keepdim));
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
  auto out = emptyOn({0});
  return python::var_out(self, dims, correction, keepdim, out);
}
at::Tensor& std_out(const at::Tensor& self, at::OptionalIntArrayRef dims, Correction correction, bool keepdim,
                    at::Tensor& out) {
  if (!supported({&self, &out})) return hostInto("aten::std.correction", out, at::std(host(self), dims, correction, keepdim));
  python::var_out(self, dims, correction, keepdim, out);
  elementwise(TensorFn::sqrt, out, &out, nullptr);
  return out;
}
at::Tensor std_correction(const at::Tensor& self, at::OptionalIntArrayRef dims, Correction correction, bool keepdim) {
  auto out = emptyOn({0});
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
    return hostInto("aten::linalg_vector_norm", out, at::linalg_vector_norm(host(self), ord, dims, keepdim, dtype));
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
  auto out = emptyOn({0});
  return python::norm_out(self, p, dims, keepdim, out);
}
at::Tensor linalg_vector_norm(const at::Tensor& self, const at::Scalar& ord, at::OptionalIntArrayRef dims, bool keepdim,
                              c10::optional<at::ScalarType> dtype) {
  auto out = emptyOn({0});
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
  if (!sortOnCard(self, values, indices))
    return hostPairInto("aten::sort", values, indices, at::sort(host(self), stable, dim, descending));
  dim = c10::maybe_wrap_dim(dim, self.dim());
  TORCH_CHECK(self.dim() == 0 || !values.is_same(self), "raccel: sort into its own input");
  sortRows(self, dim, descending, values, indices);
  if (self.dim() > 0) noteDistinct(indices, dim);
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
  if (self.dim() > 0) noteDistinct(indices, dim);
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
// selection may give another).
void pickSorted(const at::Tensor& self, int64_t place, bool median, int64_t dim, bool keepdim, at::Tensor& values,
                at::Tensor& indices) {
  auto all = emptyOn({0}, self.scalar_type()), positions = emptyOn({0}, at::kLong);
  sortRows(self, dim, false, all, positions);
  const int64_t n = self.dim() == 0 ? 1 : self.size(dim);
  auto pick = at::full(self.dim() == 0 ? std::vector<int64_t>{1} : reducedShape(self, 1u << dim, true), place,
                       positions.options());
  if (median && self.is_floating_point()) {  // the first NaN's place: n less the NaNs
    auto nans = at::isnan(self).sum(dim, /*keepdim=*/true);
    pick = pick + (nans > 0) * ((n - nans) - place);
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
  if (!sortOnCard(self, values, indices) || self.numel() == 0)
    return hostPairInto("aten::kthvalue.values", values, indices, at::kthvalue(host(self), k, dim, keepdim));
  dim = c10::maybe_wrap_dim(dim, std::max<int64_t>(self.dim(), 1));
  const int64_t n = self.dim() == 0 ? 1 : self.size(dim);
  TORCH_CHECK(k >= 1 && k <= n, "kthvalue(): selected number k out of range for dimension ", dim);
  pickSorted(self, k - 1, false, dim, keepdim, values, indices);
  return {values, indices};
}
std::tuple<at::Tensor&, at::Tensor&> median_dim_values(const at::Tensor& self, int64_t dim, bool keepdim, at::Tensor& values,
                                                       at::Tensor& indices) {
  if (!sortOnCard(self, values, indices) || self.numel() == 0)
    return hostPairInto("aten::median.dim_values", values, indices, at::median(host(self), dim, keepdim));
  dim = c10::maybe_wrap_dim(dim, std::max<int64_t>(self.dim(), 1));
  const int64_t n = self.dim() == 0 ? 1 : self.size(dim);
  pickSorted(self, (n - 1) / 2, true, dim, keepdim, values, indices);
  return {values, indices};
}
at::Tensor median(const at::Tensor& self) {  // of every element
  if (!typed(self) || self.scalar_type() == at::kBool || self.numel() == 0)
    return onHost("aten::median", [&] { return at::median(host(self)).to(self.device()); });
  auto values = emptyOn({0}, self.scalar_type()), indices = emptyOn({0}, at::kLong);
  python::median_dim_values(self.reshape({-1}), 0, false, values, indices);
  return values;
}

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

// ---- GLU, PReLU, flips and cumulative sums, composed of the ops above --------------------

// glu: the first half of `dim` times the sigmoid of the second, as PyTorch's a * sigmoid(b).
bool cardGlu(const at::Tensor& self, int64_t dim) {
  return self.dim() > 0 && self.size(c10::maybe_wrap_dim(dim, self.dim())) % 2 == 0;  // else PyTorch's own error
}
std::pair<at::Tensor, at::Tensor> gluHalves(const at::Tensor& t, int64_t dim) {
  dim = c10::maybe_wrap_dim(dim, t.dim());
  const int64_t h = t.size(dim) / 2;
  return {t.narrow(dim, 0, h), t.narrow(dim, h, h)};
}
at::Tensor& glu_out(const at::Tensor& self, int64_t dim, at::Tensor& out) {
  if (!supported({&self, &out}) || !cardGlu(self, dim)) return hostInto("aten::glu", out, at::glu(host(self), dim));
  auto [a, b] = gluHalves(self, dim);
  at::native::resize_output(out, a.sizes());
  elementwise(TensorFn::sigmoid, out, &b, nullptr);
  elementwise(TensorFn::mul, out, &out, &a);
  return out;
}
at::Tensor glu(const at::Tensor& self, int64_t dim) {
  auto out = emptyOn({0}, self.scalar_type());
  return python::glu_out(self, dim, out);
}
// d/da = sigmoid(b), d/db = a sigmoid(b) (1 - sigmoid(b)), each times the gradient.
at::Tensor& glu_backward_out(const at::Tensor& grad, const at::Tensor& self, int64_t dim, at::Tensor& gradInput) {
  if (!supported({&grad, &self, &gradInput}) || !cardGlu(self, dim) || !grad.sizes().equals(gluHalves(self, dim).first.sizes()))
    return hostInto("aten::glu_backward", gradInput, at::glu_backward(host(grad), host(self), dim));
  auto [a, b] = gluHalves(self, dim);
  at::native::resize_output(gradInput, self.sizes());
  auto [ga, gb] = gluHalves(gradInput, dim);
  elementwise(TensorFn::sigmoid, ga, &b, nullptr);
  elementwise(TensorFn::mul, gb, &grad, &a);
  elementwise(TensorFn::sigmoidBackward, gb, &gb, &ga);
  elementwise(TensorFn::mul, ga, &ga, &grad);
  return gradInput;
}
at::Tensor glu_backward(const at::Tensor& grad, const at::Tensor& self, int64_t dim) {
  auto out = emptyOn({0}, grad.scalar_type());
  return python::glu_backward_out(grad, self, dim, out);
}

// log_sigmoid as PyTorch's CPU computes it: min(x, 0) - log1p(exp(-|x|)); its backward
// from x alone (the CPU's buffer, exp(-|x|), is made again: the forward keeps none).
std::tuple<at::Tensor, at::Tensor> log_sigmoid_forward(const at::Tensor& self) {
  if (!supported({&self})) {
    countFallback("aten::log_sigmoid_forward");
    auto [out, buffer] = at::log_sigmoid_forward(host(self));
    return {out.to(self.device()), buffer.to(self.device())};
  }
  auto out = at::minimum(self, at::zeros({}, self.options())) - at::log1p(at::exp(-at::abs(self)));
  return {out, emptyOn({0})};
}
at::Tensor log_sigmoid_backward(const at::Tensor& grad, const at::Tensor& self, const at::Tensor& buffer) {
  if (!supported({&grad, &self}))
    return onHost("aten::log_sigmoid_backward", [&] {
      return at::log_sigmoid_backward(host(grad), host(self), at::exp(-at::abs(host(self)))).to(self.device());
    });
  auto z = at::exp(-at::abs(self));
  auto share = z / (z + 1);
  return at::where(self < 0, 1 - share, share) * grad;
}

// nan_to_num: NaN, +inf and -inf replaced (by 0, f32's largest and lowest unless given).
at::Tensor& nan_to_num_out(const at::Tensor& self, c10::optional<double> nan, c10::optional<double> posinf,
                           c10::optional<double> neginf, at::Tensor& out) {
  if (!supported({&self, &out}))
    return hostInto("aten::nan_to_num.out", out, at::nan_to_num(host(self), nan, posinf, neginf));
  auto number = [&](double v) { return at::full({}, v, self.options()); };
  const double inf = std::numeric_limits<double>::infinity();
  auto result = at::where(at::isnan(self), number(nan.value_or(0.0)), self);
  result = at::where(self == inf, number(posinf.value_or(std::numeric_limits<float>::max())), result);
  result = at::where(self == -inf, number(neginf.value_or(std::numeric_limits<float>::lowest())), result);
  at::native::resize_output(out, self.sizes());
  return out.copy_(result);
}

// xlogy: self * log(other), 0 where self is 0 and other is not NaN (the Kullback-Leibler
// divergence's x log x), NaN where other is.
at::Tensor& xlogy_out(const at::Tensor& self, const at::Tensor& other, at::Tensor& out) {
  if (!supported({&self, &other, &out}))
    return hostInto("aten::xlogy.OutTensor", out, at::xlogy(host(self), host(other)));
  auto zero = at::zeros({}, out.options());
  auto value = at::where(self == 0, zero, self * at::log(other));
  auto result = at::where(at::isnan(other), at::full({}, NAN, out.options()), value);
  at::native::resize_output(out, result.sizes());
  return out.copy_(result);
}
at::Tensor xlogy(const at::Tensor& self, const at::Tensor& other) {
  auto out = emptyOn({0});
  return python::xlogy_out(self, other, out);
}
at::Tensor& xlogy_(at::Tensor& self, const at::Tensor& other) { return python::xlogy_out(self, other, self); }

// prelu: x where x > 0, else weight * x, with one weight for all or one per channel (dim
// 1). Any other weight goes to the host, whose check gives PyTorch's error.
std::optional<at::Tensor> preluWeight(const at::Tensor& self, const at::Tensor& weight) {
  if (!supported({&self, &weight}) || weight.dim() > 1) return std::nullopt;
  if (weight.numel() == 1) return weight.reshape({});
  if (self.dim() < 2 || weight.numel() != self.size(1)) return std::nullopt;
  std::vector<int64_t> shape(self.dim(), 1);
  shape[1] = self.size(1);
  return weight.reshape(shape);
}
at::Tensor prelu(const at::Tensor& self, const at::Tensor& weight) {
  auto w = preluWeight(self, weight);
  if (!w) return onHost("aten::prelu", [&] { return at::prelu(host(self), host(weight)).to(self.device()); });
  return at::where(self > 0, self, self * *w);
}
// The input's gradient: the gradient where x > 0, else weight times it; the weight's: x
// times the gradient where x <= 0, summed over all but the channel.
std::tuple<at::Tensor, at::Tensor> prelu_backward(const at::Tensor& grad, const at::Tensor& self, const at::Tensor& weight) {
  auto w = preluWeight(self, weight);
  if (!w || !supported({&grad}) || !grad.sizes().equals(self.sizes()))
    return onHost("aten::prelu_backward", [&] {
      auto [gi, gw] = at::prelu_backward(host(grad), host(self), host(weight));
      return std::make_tuple(gi.to(self.device()), gw.to(self.device()));
    });
  auto positive = self > 0;
  auto gradInput = at::where(positive, grad, grad * *w);
  auto terms = (self * grad).masked_fill_(positive, 0);
  std::vector<int64_t> dims;
  for (int64_t d = 0; d < self.dim(); ++d)
    if (d != 1 || weight.numel() == 1) dims.push_back(d);
  return {gradInput, terms.sum(dims).reshape(weight.sizes())};
}

// flip: an index_select of the reversed positions along each flipped dimension.
at::Tensor flip(const at::Tensor& self, at::IntArrayRef dims) {
  if (!typed(self)) return onHost("aten::flip", [&] { return at::flip(host(self), dims).to(self.device()); });
  auto out = self;
  std::vector<bool> seen(std::max<int64_t>(self.dim(), 1), false);
  for (auto d0 : dims) {
    const int64_t d = c10::maybe_wrap_dim(d0, self.dim());
    TORCH_CHECK(!seen[d], "dim ", d, " appears multiple times in the list of dims");
    seen[d] = true;
    if (self.dim() == 0 || self.size(d) < 2) continue;
    auto reversed = at::arange(self.size(d) - 1, -1, -1, at::kLong).to(self.device());
    TrustedIndices inRange;
    out = at::index_select(out, d, reversed);
  }
  return out.is_same(self) ? self.clone() : out;
}

// roll: along each dimension, the last `shift` elements (mod its size) first: a cat of
// two narrowed views. With no dimensions, over the flattened tensor. (Its backward is
// PyTorch's formula: the gradient rolled back.)
at::Tensor roll(const at::Tensor& self, at::IntArrayRef shifts, at::IntArrayRef dims) {
  if (!typed(self) || (dims.empty() ? shifts.size() != 1 : shifts.size() != dims.size()))
    return onHost("aten::roll", [&] { return at::roll(host(self), shifts, dims).to(self.device()); });
  if (dims.empty()) return python::roll(self.reshape({-1}), shifts, {0}).view(self.sizes());
  at::Tensor out = self;
  for (size_t k = 0; k < dims.size(); ++k) {
    const int64_t d = c10::maybe_wrap_dim(dims[k], self.dim()), n = self.size(d);
    if (n == 0) continue;
    const int64_t shift = ((shifts[k] % n) + n) % n;
    if (shift != 0) out = at::cat({out.narrow(d, n - shift, shift), out.narrow(d, 0, n - shift)}, d);
  }
  return out.is_same(self) ? self.clone() : out;
}

// triu and tril: the elements of the last two dimensions on or above (upper) or on or
// below the `diagonal`-th diagonal, 0 elsewhere: a where by a mask made on the host
// (written, no wait), or an and of a bool tensor with it.
at::Tensor& triangleInto(const char* name, bool upper, const at::Tensor& self, int64_t diagonal, at::Tensor& out) {
  const bool ok = typed(self) && onDevice(out) && out.scalar_type() == self.scalar_type() && self.dim() >= 2 &&
                  (out.is_same(self) || !sharesStorage(out, self));
  if (!ok) return hostInto(name, out, upper ? at::triu(host(self), diagonal) : at::tril(host(self), diagonal));
  at::native::resize_output(out, self.sizes());
  if (out.numel() == 0) return out;
  auto all = at::ones({self.size(-2), self.size(-1)}, at::kBool);
  auto keep = (upper ? all.triu(diagonal) : all.tril(diagonal)).to(self.device());
  if (self.scalar_type() == at::kBool) {
    elementwise(TensorFn::mul, out, &self, &keep);  // (and, over bools)
  } else {
    auto zero = at::zeros({}, self.options());
    elementwise(TensorFn::where, out, &keep, &self, 0, 0, &zero);
  }
  return out;
}
#define RACCEL_TRIANGLE(op, upper)                                                                          \
  at::Tensor& op##_out(const at::Tensor& self, int64_t diagonal, at::Tensor& out) {                         \
    return triangleInto("aten::" #op, upper, self, diagonal, out);                                          \
  }                                                                                                         \
  at::Tensor op(const at::Tensor& self, int64_t diagonal) {                                                 \
    auto out = emptyOn({0}, self.scalar_type());                                                            \
    return op##_out(self, diagonal, out);                                                                   \
  }                                                                                                         \
  at::Tensor& op##_(at::Tensor& self, int64_t diagonal) { return op##_out(self, diagonal, self); }
RACCEL_TRIANGLE(triu, true)
RACCEL_TRIANGLE(tril, false)
#undef RACCEL_TRIANGLE

// cumsum and cumprod: a Hillis-Steele scan, log2(n) rounds of out[k:] = out[k:] fn
// out[:-k] (each from a copy of the round's start): exact for integers (wrapping as
// PyTorch's CPU); f32 rounded in a tree of adds or products rather than PyTorch's running
// one in double (a few ulps apart over long rows). Integers and bools scan as i64.
template <class Host>
at::Tensor& scanOut(TensorFn fn, const char* name, const at::Tensor& self, int64_t dim, c10::optional<at::ScalarType> dtype,
                    at::Tensor& out, Host reference) {
  const auto type = dtype ? *dtype : (isIntegral(self) ? at::kLong : self.scalar_type());
  if (!typed(self) || !typed(out) || out.scalar_type() != type || !typeOf(type) || type == at::kBool)
    return hostInto(name, out, reference(host(self)));
  dim = c10::maybe_wrap_dim(dim, std::max<int64_t>(self.dim(), 1));
  at::native::resize_output(out, self.sizes());
  elementwise(TensorFn::copy, out, &self, nullptr);
  const int64_t n = self.dim() == 0 ? 1 : self.size(dim);
  for (int64_t k = 1; k < n; k *= 2) {
    auto before = out.narrow(dim, 0, n - k).clone();
    auto after = out.narrow(dim, k, n - k);
    elementwise(fn, after, &after, &before);
  }
  return out;
}
#define RACCEL_SCAN(op, fn)                                                                                           \
  at::Tensor& op##_out(const at::Tensor& self, int64_t dim, c10::optional<at::ScalarType> dtype, at::Tensor& out) {  \
    return scanOut(fn, "aten::" #op, self, dim, dtype, out, [&](const at::Tensor& x) { return at::op(x, dim, dtype); }); \
  }                                                                                                                   \
  at::Tensor op(const at::Tensor& self, int64_t dim, c10::optional<at::ScalarType> dtype) {                           \
    auto out = emptyOn({0}, dtype ? *dtype : (isIntegral(self) ? at::kLong : self.scalar_type()));                   \
    return python::op##_out(self, dim, dtype, out);                                                                   \
  }                                                                                                                   \
  at::Tensor& op##_(at::Tensor& self, int64_t dim, c10::optional<at::ScalarType> dtype) {                             \
    return python::op##_out(self, dim, dtype, self);                                                                  \
  }
RACCEL_SCAN(cumsum, TensorFn::add)
RACCEL_SCAN(cumprod, TensorFn::mul)
#undef RACCEL_SCAN

// Reflection and replication padding: an index_select of the reflected (or the edge's
// repeated) positions along each padded dimension (the last, then the one before it);
// its backward, index_adds of the gradient back along them. Paddings PyTorch refuses
// (a reflection of a dimension's size or more) and negative ones go to the host.
std::optional<at::Tensor> paddedPositions(int64_t n, int64_t before, int64_t after, bool replicate, const at::Tensor& like) {
  if (before < 0 || after < 0 || n == 0 || (!replicate && (before >= n || after >= n))) return std::nullopt;
  std::vector<int64_t> picks;
  for (int64_t i = -before; i < n + after; ++i)
    picks.push_back(replicate ? std::clamp<int64_t>(i, 0, n - 1) : i < 0 ? -i : (i >= n ? 2 * (n - 1) - i : i));
  return at::tensor(picks, at::kLong).to(like.device());
}
// The positions for each padded dimension, last first; none when the host must pad.
std::optional<std::vector<at::Tensor>> paddings(const at::Tensor& self, at::IntArrayRef padding, bool replicate) {
  const int64_t dims = static_cast<int64_t>(padding.size()) / 2;
  if (!supported({&self}) || padding.size() % 2 || self.dim() < dims + 1 || self.numel() == 0) return std::nullopt;
  std::vector<at::Tensor> each;
  for (int64_t k = 0; k < dims; ++k) {
    auto picks = paddedPositions(self.size(-1 - k), padding[2 * k], padding[2 * k + 1], replicate, self);
    if (!picks) return std::nullopt;
    each.push_back(*picks);
  }
  return each;
}
at::Tensor hostPadded(bool replicate, const at::Tensor& self, at::IntArrayRef padding) {
  const bool one = padding.size() == 2;
  return replicate ? (one ? at::replication_pad1d(host(self), padding) : at::replication_pad2d(host(self), padding))
                   : (one ? at::reflection_pad1d(host(self), padding) : at::reflection_pad2d(host(self), padding));
}
at::Tensor hostPaddedBackward(bool replicate, const at::Tensor& grad, const at::Tensor& self, at::IntArrayRef padding) {
  const bool one = padding.size() == 2;
  auto g = host(grad), x = host(self);
  return replicate ? (one ? at::replication_pad1d_backward(g, x, padding) : at::replication_pad2d_backward(g, x, padding))
                   : (one ? at::reflection_pad1d_backward(g, x, padding) : at::reflection_pad2d_backward(g, x, padding));
}
at::Tensor& padInto(const char* name, bool replicate, const at::Tensor& self, at::IntArrayRef padding, at::Tensor& out) {
  auto each = paddings(self, padding, replicate);
  if (!each || !supported({&out})) return hostInto(name, out, hostPadded(replicate, self, padding));
  at::Tensor t = self;
  TrustedIndices inRange;  // (the padding's positions)
  for (size_t k = 0; k < each->size(); ++k) t = at::index_select(t, -1 - static_cast<int64_t>(k), (*each)[k]);
  at::native::resize_output(out, t.sizes());
  return out.copy_(t);
}
at::Tensor& padBackwardInto(const char* name, bool replicate, const at::Tensor& grad, const at::Tensor& self,
                            at::IntArrayRef padding, at::Tensor& gradInput) {
  auto each = paddings(self, padding, replicate);
  if (!each || !supported({&grad, &gradInput})) return hostInto(name, gradInput, hostPaddedBackward(replicate, grad, self, padding));
  at::Tensor t = grad;
  TrustedIndices inRange;  // (the padding's positions)
  for (int64_t k = static_cast<int64_t>(each->size()) - 1; k >= 0; --k) {  // the last select undone first
    auto sizes = t.sizes().vec();
    sizes[sizes.size() - 1 - k] = self.size(-1 - k);
    t = at::zeros(sizes, grad.options()).index_add_(-1 - k, (*each)[k], t);
  }
  at::native::resize_output(gradInput, self.sizes());
  return gradInput.copy_(t);
}
#define RACCEL_PAD(op, replicate)                                                                                      \
  at::Tensor& op##_out(const at::Tensor& self, at::IntArrayRef padding, at::Tensor& out) {                            \
    return padInto("aten::" #op, replicate, self, padding, out);                                                       \
  }                                                                                                                    \
  at::Tensor op(const at::Tensor& self, at::IntArrayRef padding) {                                                     \
    auto out = emptyOn({0}, self.scalar_type());                                                                       \
    return padInto("aten::" #op, replicate, self, padding, out);                                                       \
  }                                                                                                                    \
  at::Tensor& op##_backward_out(const at::Tensor& grad, const at::Tensor& self, at::IntArrayRef padding,              \
                                at::Tensor& gradInput) {                                                               \
    return padBackwardInto("aten::" #op "_backward", replicate, grad, self, padding, gradInput);                       \
  }                                                                                                                    \
  at::Tensor op##_backward(const at::Tensor& grad, const at::Tensor& self, at::IntArrayRef padding) {                 \
    auto out = emptyOn({0}, grad.scalar_type());                                                                       \
    return padBackwardInto("aten::" #op "_backward", replicate, grad, self, padding, out);                             \
  }
RACCEL_PAD(reflection_pad1d, false)
RACCEL_PAD(reflection_pad2d, false)
RACCEL_PAD(replication_pad1d, true)
RACCEL_PAD(replication_pad2d, true)
#undef RACCEL_PAD

// ---- Batch norm, convolution and pooling, composed of the ops above ----------------------
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
struct Window2d {
  int64_t kh, kw, sh, sw, ph, pw, dh, dw, eh = 0, ew = 0;
  static Window2d of(c10::IntArrayRef kernel, c10::IntArrayRef stride, c10::IntArrayRef padding, c10::IntArrayRef dilation) {
    auto pick = [](c10::IntArrayRef v, size_t i, int64_t otherwise) { return v.empty() ? otherwise : v[v.size() > i ? i : 0]; };
    Window2d w;
    w.kh = pick(kernel, 0, 1), w.kw = pick(kernel, 1, 1);
    w.sh = pick(stride, 0, w.kh), w.sw = pick(stride, 1, w.kw);
    w.ph = pick(padding, 0, 0), w.pw = pick(padding, 1, 0);
    w.dh = pick(dilation, 0, 1), w.dw = pick(dilation, 1, 1);
    return w;
  }
  bool sane() const { return kh > 0 && kw > 0 && sh > 0 && sw > 0 && ph >= 0 && pw >= 0 && dh > 0 && dw > 0 && eh >= 0 && ew >= 0; }
  bool operator==(const Window2d&) const = default;
  int64_t outH(int64_t h) const { return (h + 2 * ph + eh - dh * (kh - 1) - 1) / sh + 1; }
  int64_t outW(int64_t w) const { return (w + 2 * pw + ew - dw * (kw - 1) - 1) / sw + 1; }
};
// With ceil_mode, the rows and columns its last windows add past the padding (PyTorch's
// pooling_output_shape: a last window that starts in the input or the left padding).
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
// x [N, C, H, W] padded on each side with `value`, and past the bottom and right by the
// window's extra (x itself, contiguous, when no padding).
at::Tensor padded(const at::Tensor& x, const Window2d& w, double value) {
  if (w.ph == 0 && w.pw == 0 && w.eh == 0 && w.ew == 0) return x.contiguous();
  auto out = at::full({x.size(0), x.size(1), x.size(2) + 2 * w.ph + w.eh, x.size(3) + 2 * w.pw + w.ew}, value, x.options());
  out.narrow(2, w.ph, x.size(2)).narrow(3, w.pw, x.size(3)).copy_(x);
  return out;
}
// The windows of a padded [N, C, H, W]: a strided view [N, C, OH, OW, KH, KW].
at::Tensor windows(const at::Tensor& p, const Window2d& w) {
  const int64_t oh = (p.size(2) - w.dh * (w.kh - 1) - 1) / w.sh + 1, ow = (p.size(3) - w.dw * (w.kw - 1) - 1) / w.sw + 1;
  return p.as_strided({p.size(0), p.size(1), oh, ow, w.kh, w.kw},
                      {p.stride(0), p.stride(1), w.sh * p.stride(2), w.sw * p.stride(3), w.dh * p.stride(2), w.dw * p.stride(3)});
}

// Index tables of a window geometry over an [H, W] plane (i64, on the device), built on
// the host once per geometry and kept: a training step asks for the same few every time.
//   sources: [KK, OH * OW], the input position (y * W + x) that window element kk of
//     output position ohw reads, or -1 where it lies in the padding.
//   readers: [H * W, picks], for each input position the column elements (kk * OH * OW +
//     ohw) whose windows read it, -1 past its count (picks: the most any position has).
//   outputs: the same with the output position ohw alone (the windows, not their elements).
enum class Table { sources, readers, outputs };
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
// The table under `key`, built on the host by build() and written to the device the first
// time it is asked for.
template <class Build>
at::Tensor cachedTable(const std::array<int64_t, 13>& key, Build build) {
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

// out = beta * out + alpha * (the sum over the picks of a at index's row), one tensor op
// (schema/guest.capnp, gatherSum): `shape` ends in [picks, rows]; the strides are each
// tensor's over that shape.
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
// Transposed (ungrouped; an output padding below the stride): the gradient of a
// convolution by the same window with respect to its input. Each input position's
// [Cout * KK] contributions (one batched matmul by the weight [Cin, Cout * KK]
// transposed), summed into the output positions whose windows read them (col2im). Its
// backward: the input's gradient is the convolution of the output's gradient by the same
// weight (as [Cin, Cout, KH, KW]), the weight's the input times the gradient's columns.
bool transposedOnCard(const at::Tensor& input, const at::Tensor& weight, const at::Tensor* bias, c10::IntArrayRef stride,
                      c10::IntArrayRef padding, c10::IntArrayRef dilation, c10::IntArrayRef outputPadding, int64_t groups) {
  if (!supported({&input, &weight, bias}) || input.dim() != 4 || weight.dim() != 4 || groups != 1 ||
      input.size(1) != weight.size(0) || outputPadding.size() > 2)
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
                                    c10::IntArrayRef outputPadding, int64_t groups) {
  if (transposed && transposedOnCard(input, weight, present(bias), stride, padding, dilation, outputPadding, groups))
    return transposedConvolution(input, weight, bias, stride, padding, dilation, outputPadding);
  if (!convOnCard(input, weight, present(bias), stride, padding, dilation, transposed, groups))
    return onHost("aten::convolution_overrideable", [&] {
      return at::convolution(host(input), host(weight), present(bias) ? host(*bias) : at::Tensor(), stride, padding, dilation,
                             transposed, outputPadding, groups).to(input.device());
    });
  if (groups > 1) {
    const int64_t cg = weight.size(1), og = weight.size(0) / groups;
    std::vector<at::Tensor> outs;
    for (int64_t g = 0; g < groups; ++g) {
      auto b = present(bias) ? c10::optional<at::Tensor>(bias->narrow(0, g * og, og)) : c10::nullopt;
      outs.push_back(python::convolution_overrideable(input.narrow(1, g * cg, cg), weight.narrow(0, g * og, og), b, stride,
                                                      padding, dilation, false, outputPadding, 1));
    }
    return at::cat(outs, 1);
  }
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
  if (transposed && supported({&grad}) && grad.dim() == 4 &&
      transposedOnCard(input, weight, nullptr, stride, padding, dilation, outputPadding, groups))
    return transposedConvolutionBackward(grad, input, weight, stride, padding, dilation, mask);
  if (!supported({&grad}) || !convOnCard(input, weight, nullptr, stride, padding, dilation, transposed, groups)) {
    countFallback("aten::convolution_backward_overrideable");
    std::vector<int64_t> biasSizes = {weight.size(0)};
    auto [gi, gw, gb] = at::convolution_backward(host(grad), host(input), host(weight), at::OptionalIntArrayRef(biasSizes),
                                                 stride, padding, dilation, transposed, outputPadding, groups, mask);
    auto back = [&](const at::Tensor& t) { return t.defined() ? t.to(input.device()) : t; };
    return {back(gi), back(gw), back(gb)};
  }
  if (groups > 1) {
    const int64_t cg = weight.size(1), og = weight.size(0) / groups;
    std::vector<at::Tensor> gradInputs, gradWeights;
    for (int64_t g = 0; g < groups; ++g) {
      auto [gi, gw, gb] = python::convolution_backward_overrideable(
          grad.narrow(1, g * og, og), input.narrow(1, g * cg, cg), weight.narrow(0, g * og, og), stride, padding, dilation,
          false, outputPadding, 1, {mask[0], mask[1], false});
      gradInputs.push_back(gi), gradWeights.push_back(gw);
    }
    return {mask[0] ? at::cat(gradInputs, 1) : at::Tensor(), mask[1] ? at::cat(gradWeights, 0) : at::Tensor(),
            mask[2] ? at::sum(grad, {0, 2, 3}) : at::Tensor()};
  }
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
  const auto w = ceiled(Window2d::of(kernel, stride, padding, dilation), self, ceilMode);
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
  const auto w = ceiled(Window2d::of(kernel, stride, padding, dilation), self, ceilMode);
  const bool onCard = poolOnCard(self, w, false) && supported({&grad}) && typed(indices) &&
                      indices.scalar_type() == at::kLong && indices.sizes() == grad.sizes();
  if (!onCard)
    return onHost("aten::max_pool2d_with_indices_backward", [&] {
      return at::max_pool2d_with_indices_backward(host(grad), host(self), kernel, stride, padding, dilation, ceilMode,
                                                  host(indices)).to(self.device());
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
  at::native::resize_output(out, result.sizes());
  return out.copy_(result);
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
//     past its size (K: the largest window's);
//   readers: [H * W, R], the outputs whose windows read each input position, in order;
//   sizes: [OH, 1] and [1, OW] (f32), the windows' heights and widths.
std::pair<int64_t, int64_t> adaptiveSpan(int64_t o, int64_t in, int64_t n) { return {o * in / n, ((o + 1) * in + n - 1) / n}; }
enum class Adaptive { sources, readers, heights, widths };
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
  auto& lists = kind == Adaptive::sources ? windowsOf : readers;
  size_t picks = 1;
  for (auto& l : lists) picks = std::max(picks, l.size());
  auto table = at::full({int64_t(lists.size()), int64_t(picks)}, -1, at::kLong);
  auto* t = table.data_ptr<int64_t>();
  for (size_t i = 0; i < lists.size(); ++i) std::copy(lists[i].begin(), lists[i].end(), t + i * picks);
  return kind == Adaptive::sources ? table.t().contiguous() : table;  // sources: [K, OH * OW]
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
  if (!adaptiveOnCard(self, size))
    return onHost("aten::_adaptive_avg_pool2d", [&] { return at::_adaptive_avg_pool2d(host(self), size).to(self.device()); });
  if (auto k = adaptiveKernel(self, size)) return python::avg_pool2d(self, *k, *k, {0, 0}, false, true, c10::nullopt);
  return adaptiveAverage(self, size[0], size[1]);
}
at::Tensor _adaptive_avg_pool2d_backward(const at::Tensor& grad, const at::Tensor& self) {
  if (grad.dim() != 4 || !supported({&grad}) || !adaptiveOnCard(self, {grad.size(2), grad.size(3)}))
    return onHost("aten::_adaptive_avg_pool2d_backward",
                  [&] { return at::_adaptive_avg_pool2d_backward(host(grad), host(self)).to(self.device()); });
  if (auto k = adaptiveKernel(self, {grad.size(-2), grad.size(-1)}))
    return python::avg_pool2d_backward(grad, self, *k, *k, {0, 0}, false, true, c10::nullopt);
  return adaptiveAverageBackward(grad, self);
}

// PyTorch's loss reductions (at::Reduction).
constexpr int64_t kNone = 0, kMean = 1, kSum = 2;

// out[..., i, ...] = self[..., index[..., i, ...], ...] along `dim` (index of out's shape).
at::Tensor& gather_out(const at::Tensor& self, int64_t dim, const at::Tensor& index, bool sparseGrad, at::Tensor& out) {
  const bool ok = typed(self) && typed(out) && out.scalar_type() == self.scalar_type() && typed(index) &&
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

// self[indices] = values without accumulate, f32, over the indexed dimensions merged
// (`merged`: self's view; `m`: its index): where the index names a row twice the last
// value named wins, as in PyTorch's CPU loop. The picks are sorted by row (stable), each
// row's last pick (its row differs from the next one's) adds its values into rows of
// -0.0 and the others add -0.0 (x + -0.0 is x to the bit, -0.0 and NaN included), and
// the rows picked take those sums.
void putLastWins(at::Tensor& merged, const MergedIndex& m, const at::Tensor& values) {
  const int64_t k = m.flat.numel();
  if (k == 0) return;
  auto [rows, order] = at::sort(m.flat, /*stable=*/true, 0, false);
  auto last = at::ones({k}, rows.options().dtype(at::kBool));
  if (k > 1) last.narrow(0, 0, k - 1).copy_(rows.narrow(0, 0, k - 1) != rows.narrow(0, 1, k - 1));
  std::vector<int64_t> along(merged.dim(), 1);
  along[m.first] = k;
  auto sorted = values.index_select(m.first, order);
  auto kept = at::where(last.view(along), sorted, at::full({}, -0.0f, sorted.options()));
  auto sums = at::full(merged.sizes(), -0.0f, merged.options());
  python::index_add_out(sums, m.first, rows, kept, 1, sums);
  auto hit = at::zeros({merged.size(m.first)}, merged.options());
  python::index_add_out(hit, 0, rows, last.to(at::kFloat), 1, hit);
  along[m.first] = merged.size(m.first);
  merged.copy_(at::where(hit.view(along) > 0, sums, merged));
}

// self[mask] = value, the one form of index_put_ training code uses (label smoothing's
// ignored targets): a single bool mask and a single value; other forms run on the host.
// self[indices] = values (index_put_): a bool mask and one value is masked_fill_; with
// accumulate (indexing's backward), one index_add over the indexed dimensions merged;
// without, over f32, putLastWins.
at::Tensor& _index_put_impl_(at::Tensor& self, const c10::List<c10::optional<at::Tensor>>& indices, const at::Tensor& values,
                             bool accumulate, bool unsafe) {
  const bool mask = indices.size() == 1 && indices.get(0).has_value() && typed(*indices.get(0)) &&
                    indices.get(0)->scalar_type() == at::kBool && values.numel() == 1 && !accumulate;
  if (mask) return python::masked_fill_(self, *indices.get(0), values.reshape({}));
  const bool added = accumulate && typed(self) && typed(values) && values.scalar_type() == self.scalar_type() &&
                     !sharesStorage(values, self);
  const bool put = !accumulate && isF32(self) && isF32(values);
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

// ---- Losses composed of the ops above ----------------------------------------------------

at::Tensor reduced(const at::Tensor& losses, int64_t reduction) {
  return reduction == kNone ? losses : reduction == kSum ? losses.sum() : losses.mean();
}
// The gradient of a reduced loss with respect to each element's loss.
at::Tensor unreduced(const at::Tensor& grad, const at::Tensor& like, int64_t reduction) {
  return reduction == kMean ? grad / static_cast<double>(std::max<int64_t>(like.numel(), 1)) : grad;
}
bool lossOnCard(std::initializer_list<const at::Tensor*> tensors) { return supported(tensors); }

// smooth L1 (beta) and Huber (delta): quadratic inside the bound, linear outside.
at::Tensor smoothLoss(const at::Tensor& self, const at::Tensor& target, double bound, bool huber) {
  auto diff = self - target;
  auto size = diff.abs();
  if (bound == 0) return size;
  auto inside = huber ? diff * diff * 0.5 : diff * diff * (0.5 / bound);
  auto outside = huber ? (size - 0.5 * bound) * bound : size - 0.5 * bound;
  return at::where(huber ? size <= bound : size < bound, inside, outside);
}
at::Tensor smoothGrad(const at::Tensor& grad, const at::Tensor& self, const at::Tensor& target, double bound, bool huber,
                      int64_t reduction) {
  auto diff = self - target;
  auto size = diff.abs();
  auto slope = bound == 0 ? diff.sign()
                          : at::where(huber ? size <= bound : size < bound, huber ? diff : diff / bound,
                                      huber ? diff.sign() * bound : diff.sign());
  return slope * unreduced(grad, self, reduction);
}
at::Tensor& smooth_l1_loss_out(const at::Tensor& self, const at::Tensor& target, int64_t reduction, double beta, at::Tensor& out) {
  if (!lossOnCard({&self, &target, &out}) || beta < 0)
    return hostInto("aten::smooth_l1_loss", out, at::smooth_l1_loss(host(self), host(target), reduction, beta));
  auto loss = reduced(smoothLoss(self, target, beta, false), reduction);
  at::native::resize_output(out, loss.sizes());
  return out.copy_(loss);
}
at::Tensor smooth_l1_loss(const at::Tensor& self, const at::Tensor& target, int64_t reduction, double beta) {
  auto out = emptyOn({0});
  return python::smooth_l1_loss_out(self, target, reduction, beta, out);
}
at::Tensor& smooth_l1_loss_backward_out(const at::Tensor& grad, const at::Tensor& self, const at::Tensor& target,
                                        int64_t reduction, double beta, at::Tensor& out) {
  if (!lossOnCard({&grad, &self, &target, &out}) || beta < 0)
    return hostInto("aten::smooth_l1_loss_backward", out,
                    at::smooth_l1_loss_backward(host(grad), host(self), host(target), reduction, beta));
  auto g = smoothGrad(grad, self, target, beta, false, reduction);
  at::native::resize_output(out, g.sizes());
  return out.copy_(g);
}
at::Tensor smooth_l1_loss_backward(const at::Tensor& grad, const at::Tensor& self, const at::Tensor& target, int64_t reduction,
                                   double beta) {
  auto out = emptyOn({0});
  return python::smooth_l1_loss_backward_out(grad, self, target, reduction, beta, out);
}
at::Tensor& huber_loss_out(const at::Tensor& self, const at::Tensor& target, int64_t reduction, double delta, at::Tensor& out) {
  if (!lossOnCard({&self, &target, &out}) || !(delta > 0))
    return hostInto("aten::huber_loss", out, at::huber_loss(host(self), host(target), reduction, delta));
  auto loss = reduced(smoothLoss(self, target, delta, true), reduction);
  at::native::resize_output(out, loss.sizes());
  return out.copy_(loss);
}
at::Tensor huber_loss(const at::Tensor& self, const at::Tensor& target, int64_t reduction, double delta) {
  auto out = emptyOn({0});
  return python::huber_loss_out(self, target, reduction, delta, out);
}
at::Tensor& huber_loss_backward_out(const at::Tensor& grad, const at::Tensor& self, const at::Tensor& target, int64_t reduction,
                                    double delta, at::Tensor& out) {
  if (!lossOnCard({&grad, &self, &target, &out}) || !(delta > 0))
    return hostInto("aten::huber_loss_backward", out,
                    at::huber_loss_backward(host(grad), host(self), host(target), reduction, delta));
  auto g = smoothGrad(grad, self, target, delta, true, reduction);
  at::native::resize_output(out, g.sizes());
  return out.copy_(g);
}

// Binary cross-entropy over probabilities, each log clamped at -100 as PyTorch does.
at::Tensor binary_cross_entropy(const at::Tensor& self, const at::Tensor& target, const c10::optional<at::Tensor>& weight,
                                int64_t reduction) {
  if (!lossOnCard({&self, &target, present(weight)}))
    return onHost("aten::binary_cross_entropy", [&] {
      return at::binary_cross_entropy(host(self), host(target), present(weight) ? host(*weight) : at::Tensor(), reduction)
          .to(self.device());
    });
  auto loss = -(target * self.log().clamp_min(-100) + (1 - target) * (1 - self).log().clamp_min(-100));
  if (present(weight)) loss = loss * *weight;
  return reduced(loss, reduction);
}
at::Tensor binary_cross_entropy_backward(const at::Tensor& grad, const at::Tensor& self, const at::Tensor& target,
                                         const c10::optional<at::Tensor>& weight, int64_t reduction) {
  if (!lossOnCard({&grad, &self, &target, present(weight)}))
    return onHost("aten::binary_cross_entropy_backward", [&] {
      return at::binary_cross_entropy_backward(host(grad), host(self), host(target),
                                               present(weight) ? host(*weight) : at::Tensor(), reduction)
          .to(self.device());
    });
  auto g = (self - target) / ((1 - self) * self).clamp_min(1e-12) * unreduced(grad, self, reduction);
  return present(weight) ? g * *weight : g;
}


at::Tensor& mse_loss_out(const at::Tensor& self, const at::Tensor& target, int64_t reduction, at::Tensor& out) {
  if (!supported({&self, &target, &out})) {
    return hostInto("aten::mse_loss", out, at::mse_loss(host(self), host(target), reduction));
  }
  auto shape = broadcastShape(self, target);
  auto diff = emptyOn(shape);
  elementwise(TensorFn::add, diff, &self, &target, -1);
  elementwise(TensorFn::mul, diff, &diff, &diff);
  if (reduction == kNone) {
    at::native::resize_output(out, shape);
    return out.copy_(diff);
  }
  at::native::resize_output(out, {});
  if (diff.numel() == 0) return out.fill_(reduction == kMean ? NAN : 0.0);
  sumInto(out, diff, everyDim(diff.dim()), false, reduction == kMean ? 1.0f / static_cast<float>(diff.numel()) : 1.0f);
  return out;
}
at::Tensor mse_loss(const at::Tensor& self, const at::Tensor& target, int64_t reduction) {
  auto out = emptyOn({0});
  return python::mse_loss_out(self, target, reduction, out);
}

// grad_input = 2 (self - target) grad (/ n for the mean)
at::Tensor& mse_loss_backward_out(const at::Tensor& grad, const at::Tensor& self, const at::Tensor& target,
                                  int64_t reduction, at::Tensor& gradInput) {
  if (!supported({&grad, &self, &target, &gradInput})) {
    return hostInto("aten::mse_loss_backward", gradInput,
                    at::mse_loss_backward(host(grad), host(self), host(target), reduction));
  }
  at::native::resize_output(gradInput, self.sizes());
  auto diff = emptyOn(self.sizes());
  elementwise(TensorFn::add, diff, &self, &target, -1);
  const float scale = reduction == kMean ? 2.0f / static_cast<float>(std::max<int64_t>(self.numel(), 1)) : 2.0f;
  elementwise(TensorFn::mul, gradInput, &diff, &grad, scale);
  return gradInput;
}
at::Tensor mse_loss_backward(const at::Tensor& grad, const at::Tensor& self, const at::Tensor& target, int64_t reduction) {
  auto out = emptyOn({0});
  return python::mse_loss_backward_out(grad, self, target, reduction, out);
}

// Runs a rows op (logSoftmax and its backward) over `dim`, moved last and flattened.
at::Tensor rowsOp(TensorFn fn, const at::Tensor& x, const at::Tensor* y, int64_t dim) {
  dim = c10::maybe_wrap_dim(dim, x.dim());
  auto moved = [&](const at::Tensor& t) { return x.dim() == 0 ? t.reshape({1, 1}) : t.movedim(dim, -1).reshape({-1, t.size(dim)}); };
  auto a = moved(x);
  at::Tensor b = y ? moved(*y) : at::Tensor();
  auto out = emptyOn(a.sizes());
  if (out.numel() > 0) {
    Locked s;
    client::TensorOp op;
    op.fn = fn;
    op.shape = shapeOf(a.sizes());
    op.operands = {operand(out, out.strides()), operand(a, a.strides())};
    if (y) op.operands.push_back(operand(b, b.strides()));
    send(*s, op);
  }
  if (x.dim() == 0) return out.reshape({});
  auto movedShape = x.movedim(dim, -1).sizes().vec();
  return out.view(movedShape).movedim(-1, dim);
}

at::Tensor _log_softmax(const at::Tensor& self, int64_t dim, bool halfToFloat) {
  if (!supported({&self}) || halfToFloat)
    return onHost("aten::_log_softmax", [&] { return at::_log_softmax(host(self), dim, halfToFloat).to(self.device()); });
  return rowsOp(TensorFn::logSoftmax, self, nullptr, dim);
}
at::Tensor _log_softmax_backward_data(const at::Tensor& grad, const at::Tensor& output, int64_t dim, at::ScalarType inputDtype) {
  if (!supported({&grad, &output}) || inputDtype != at::kFloat)
    return onHost("aten::_log_softmax_backward_data", [&] {
      return at::_log_softmax_backward_data(host(grad), host(output), dim, inputDtype).to(grad.device());
    });
  return rowsOp(TensorFn::logSoftmaxBackward, grad, &output, dim);
}

at::Tensor _softmax(const at::Tensor& self, int64_t dim, bool halfToFloat) {
  if (!supported({&self}) || halfToFloat)
    return onHost("aten::_softmax", [&] { return at::_softmax(host(self), dim, halfToFloat).to(self.device()); });
  return rowsOp(TensorFn::softmax, self, nullptr, dim);
}
at::Tensor _softmax_backward_data(const at::Tensor& grad, const at::Tensor& output, int64_t dim, at::ScalarType inputDtype) {
  if (!supported({&grad, &output}) || inputDtype != at::kFloat)
    return onHost("aten::_softmax_backward_data", [&] {
      return at::_softmax_backward_data(host(grad), host(output), dim, inputDtype).to(grad.device());
    });
  return rowsOp(TensorFn::softmaxBackward, grad, &output, dim);
}

// ---- LayerNorm: a rows op over the normalized (last) dimensions ----------------------

// The rows a LayerNorm over `normalized` trailing dimensions of `input` works on: [M, N].
std::pair<int64_t, int64_t> layerNormRows(const at::Tensor& input, c10::IntArrayRef normalized) {
  const int64_t axis = input.dim() - static_cast<int64_t>(normalized.size());
  TORCH_CHECK(axis >= 0 && input.sizes().slice(axis).equals(normalized), "raccel: layer_norm over ", normalized,
              " of an input of ", input.sizes());
  int64_t n = 1;
  for (auto d : normalized) n *= d;
  return {n == 0 ? 0 : input.numel() / n, n};
}
// mean and rstd's shape: the input's leading dimensions, then a 1 for each normalized one.
std::vector<int64_t> statsShape(const at::Tensor& input, size_t normalized) {
  auto shape = input.sizes().vec();
  for (size_t i = shape.size() - normalized; i < shape.size(); ++i) shape[i] = 1;
  return shape;
}
bool layerNormSupported(const at::Tensor& input, const c10::optional<at::Tensor>& weight, const c10::optional<at::Tensor>& bias) {
  const at::Tensor* w = weight && weight->defined() ? &*weight : nullptr;
  const at::Tensor* b = bias && bias->defined() ? &*bias : nullptr;
  return supported({&input, w, b});
}
// One rows op over [M, N]: out and a are [M, N]; `third` is [M, N] or one element per
// row ([M]); perRow is one element per row.
void rowsOf(TensorFn fn, const at::Tensor& out, const at::Tensor& a, const at::Tensor& third, const at::Tensor& perRow,
            float alpha) {
  Locked s;
  client::TensorOp op;
  op.fn = fn;
  op.shape = {static_cast<uint64_t>(a.size(0)), static_cast<uint64_t>(a.size(1))};
  op.operands = {operand(out, out.strides()), operand(a, a.strides()),
                 operand(third, third.dim() == 2 ? third.strides() : c10::IntArrayRef{third.stride(0), 0}),
                 operand(perRow, {perRow.stride(0), 0})};
  op.alpha = alpha;
  send(*s, op);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> native_layer_norm(const at::Tensor& input, c10::IntArrayRef normalized,
                                                                 const c10::optional<at::Tensor>& weight,
                                                                 const c10::optional<at::Tensor>& bias, double eps) {
  if (!layerNormSupported(input, weight, bias)) {
    countFallback("aten::native_layer_norm");
    auto [out, mean, rstd] = at::native_layer_norm(host(input), normalized, weight ? host(*weight) : at::Tensor(),
                                                   bias ? host(*bias) : at::Tensor(), eps);
    return {out.to(input.device()), mean.to(input.device()), rstd.to(input.device())};
  }
  auto [m, n] = layerNormRows(input, normalized);
  auto out = emptyOn(input.sizes()), mean = emptyOn({m}), rstd = emptyOn({m});
  if (m > 0 && n > 0) {
    auto rows = input.reshape({m, n}), outRows = out.view({m, n});
    rowsOf(TensorFn::layerNorm, outRows, rows, mean, rstd, static_cast<float>(eps));
    const bool w = weight && weight->defined(), b = bias && bias->defined();
    if (w && b) elementwise(TensorFn::addcmul, out, &*bias, &out, 1, 0, &*weight);  // bias + out * weight
    else if (w) elementwise(TensorFn::mul, out, &out, &*weight);
    else if (b) elementwise(TensorFn::add, out, &out, &*bias);
  }
  auto shape = statsShape(input, normalized.size());
  return {out, mean.view(shape), rstd.view(shape)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> native_layer_norm_backward(
    const at::Tensor& grad, const at::Tensor& input, c10::IntArrayRef normalized, const at::Tensor& mean,
    const at::Tensor& rstd, const c10::optional<at::Tensor>& weight, const c10::optional<at::Tensor>& bias,
    std::array<bool, 3> mask) {
  if (!layerNormSupported(input, weight, bias) || !supported({&grad, &mean, &rstd})) {
    countFallback("aten::native_layer_norm_backward");
    auto [gi, gw, gb] = at::native_layer_norm_backward(host(grad), host(input), normalized, host(mean), host(rstd),
                                                       weight ? host(*weight) : at::Tensor(), bias ? host(*bias) : at::Tensor(), mask);
    auto back = [&](const at::Tensor& t) { return t.defined() ? t.to(input.device()) : t; };
    return {back(gi), back(gw), back(gb)};
  }
  auto [m, n] = layerNormRows(input, normalized);
  const bool w = weight && weight->defined();
  at::Tensor gradInput, gradWeight, gradBias;
  auto g = grad.reshape({m, n}), x = input.reshape({m, n}), mu = mean.reshape({m, 1}), r = rstd.reshape({m, 1});
  // The normalized values again: (x - mean) * rstd.
  auto xhat = emptyOn({m, n});
  if (m > 0 && n > 0) {
    elementwise(TensorFn::add, xhat, &x, &mu, -1);
    elementwise(TensorFn::mul, xhat, &xhat, &r);
  }
  if (mask[0]) {
    gradInput = emptyOn(input.sizes());
    if (m > 0 && n > 0) {
      at::Tensor gw = g;
      if (w) {
        gw = emptyOn({m, n});
        auto weightRow = weight->reshape({1, n});
        elementwise(TensorFn::mul, gw, &g, &weightRow);
      }
      rowsOf(TensorFn::layerNormBackward, gradInput.view({m, n}), gw, xhat, rstd.reshape({m}), 0);
    }
  }
  if (mask[1] && w) {
    gradWeight = emptyOn(weight->sizes());
    auto product = emptyOn({m, n});
    if (m > 0 && n > 0) elementwise(TensorFn::mul, product, &g, &xhat);
    if (m == 0) gradWeight.zero_();
    else sumInto(gradWeight.view({n}), product, 1, false, 1);
  }
  if (mask[2] && bias && bias->defined()) {
    gradBias = emptyOn(bias->sizes());
    if (m == 0) gradBias.zero_();
    else sumInto(gradBias.view({n}), g, 1, false, 1);
  }
  return {gradInput, gradWeight, gradBias};
}

// GroupNorm's backward (its forward is PyTorch's own composition, over batch norm): each
// (sample, group) a row of C / group channels x HxW positions, layer norm's backward over
// it; the weight's and bias's gradients summed per channel.
std::tuple<at::Tensor, at::Tensor, at::Tensor> native_group_norm_backward(
    const at::Tensor& grad, const at::Tensor& input, const at::Tensor& mean, const at::Tensor& rstd,
    const c10::optional<at::Tensor>& weight, int64_t n, int64_t c, int64_t hw, int64_t group, std::array<bool, 3> mask) {
  const bool ok = supported({&grad, &input, &mean, &rstd, present(weight)}) && group > 0 && c % group == 0 &&
                  input.numel() == n * c * hw && input.numel() > 0;
  if (!ok) {
    countFallback("aten::native_group_norm_backward");
    auto [gi, gw, gb] = at::native_group_norm_backward(host(grad), host(input), host(mean), host(rstd),
                                                       present(weight) ? host(*weight) : at::Tensor(), n, c, hw, group, mask);
    auto back = [&](const at::Tensor& t) { return t.defined() ? t.to(input.device()) : t; };
    return {back(gi), back(gw), back(gb)};
  }
  const int64_t rows = n * group, span = c / group * hw;
  auto g = grad.reshape({n, c, hw});
  auto xhat = ((input.reshape({n, group, span}) - mean.reshape({n, group, 1})) * rstd.reshape({n, group, 1})).reshape({n, c, hw});
  at::Tensor gradInput, gradWeight, gradBias;
  if (mask[0]) {
    auto scaled = (present(weight) ? g * weight->reshape({1, c, 1}) : g).contiguous();
    gradInput = emptyOn(input.sizes());
    rowsOf(TensorFn::layerNormBackward, gradInput.view({rows, span}), scaled.view({rows, span}), xhat.reshape({rows, span}),
           rstd.reshape({rows}), 0);
  }
  if (mask[1]) gradWeight = (g * xhat).sum(at::IntArrayRef{0, 2});
  if (mask[2]) gradBias = g.sum(at::IntArrayRef{0, 2});
  return {gradInput, gradWeight, gradBias};
}

bool nllSupported(const at::Tensor& self, const at::Tensor& target, const c10::optional<at::Tensor>& weight,
                  int64_t reduction) {
  return supported({&self}) && onDevice(target) && target.scalar_type() == at::kLong && (!weight || !weight->defined()) &&
         reduction != kNone && self.dim() >= 1 && self.dim() <= 2 && target.dim() == self.dim() - 1;
}

// nllLoss and its backward: `rows` is [n, classes] or [classes] (the log-probabilities,
// or the gradient written), `loss` the loss (written, or its gradient read), `total`
// the total weight (written, or read).
void sendNll(TensorFn fn, const at::Tensor& rows, const at::Tensor& loss, const at::Tensor& target,
             const at::Tensor& total, int64_t ignoreIndex, int64_t reduction) {
  auto x = rows.dim() == 1 ? rows.unsqueeze(0) : rows;
  auto t = target.dim() == 0 ? target.unsqueeze(0) : target;
  Locked s;  // before operand(): the arena is the session's
  auto scalar = operand(loss, {0, 0}), matrix = operand(x, x.strides());
  client::TensorOp op;
  op.fn = fn;
  op.shape = shapeOf(x.sizes());
  op.operands = {fn == TensorFn::nllLoss ? scalar : matrix, fn == TensorFn::nllLoss ? matrix : scalar,
                 operand(t, {t.stride(0), 0}), operand(total, {0, 0})};
  op.ignoreIndex = ignoreIndex;
  op.mean = reduction == kMean;
  send(*s, op);
}

// With class weights or reduction 'none': composed of gather and selections. Each
// sample's picked log-probability and its weight, both 0 where the target is ignored.
bool nllComposable(const at::Tensor& self, const at::Tensor& target, const c10::optional<at::Tensor>& weight) {
  return supported({&self, present(weight)}) && typed(target) && target.scalar_type() == at::kLong && self.dim() >= 1 &&
         self.dim() <= 2 && target.dim() == self.dim() - 1;
}
std::pair<at::Tensor, at::Tensor> nllTerms(const at::Tensor& self, const at::Tensor& target,
                                           const c10::optional<at::Tensor>& weight, int64_t ignoreIndex) {
  auto rows = self.dim() == 1 ? self.unsqueeze(0) : self;
  auto t = target.reshape({-1, 1});
  TrustedIndices checked;  // (by the forward; an ignored target picks what is then dropped)
  auto ignored = t == ignoreIndex;
  auto zero = at::zeros({}, self.options());
  auto picked = at::where(ignored, zero, at::gather(rows, 1, t)).squeeze(1);
  auto w = present(weight) ? at::index_select(*weight, 0, t.squeeze(1)).unsqueeze(1) : at::ones({t.size(0), 1}, self.options());
  return {picked, at::where(ignored, zero, w).squeeze(1)};
}
std::tuple<at::Tensor, at::Tensor> nllComposed(const at::Tensor& self, const at::Tensor& target,
                                               const c10::optional<at::Tensor>& weight, int64_t reduction, int64_t ignoreIndex) {
  auto [picked, w] = nllTerms(self, target, weight, ignoreIndex);
  auto losses = -(picked * w);
  auto total = w.sum();
  if (reduction == kNone) return {self.dim() == 1 ? losses.squeeze(0) : losses, total};
  auto sum = losses.sum();
  return {reduction == kMean ? sum / total : sum, total};
}

std::tuple<at::Tensor, at::Tensor> nll_loss_forward(const at::Tensor& self, const at::Tensor& target,
                                                    const c10::optional<at::Tensor>& weight, int64_t reduction,
                                                    int64_t ignoreIndex) {
  const bool onCard = nllSupported(self, target, weight, reduction) || nllComposable(self, target, weight);
  if (onCard && self.dim() > 0)
    checkIndex(target, 0, self.size(-1) - 1, ignoreIndex, [](int64_t v) { TORCH_CHECK_INDEX(false, "Target ", v, " is out of bounds."); });
  if (!nllSupported(self, target, weight, reduction) && nllComposable(self, target, weight))
    return nllComposed(self, target, weight, reduction, ignoreIndex);
  if (!nllSupported(self, target, weight, reduction)) {
    countFallback("aten::nll_loss_forward");
    auto [out, total] = at::nll_loss_forward(host(self), host(target), weight ? host(*weight) : at::Tensor(), reduction, ignoreIndex);
    return {out.to(self.device()), total.to(self.device())};
  }
  auto out = emptyOn({}), total = emptyOn({});
  sendNll(TensorFn::nllLoss, self, out, target, total, ignoreIndex, reduction);
  return {out, total};
}

at::Tensor nll_loss_backward(const at::Tensor& grad, const at::Tensor& self, const at::Tensor& target,
                             const c10::optional<at::Tensor>& weight, int64_t reduction, int64_t ignoreIndex,
                             const at::Tensor& totalWeight) {
  if (!nllSupported(self, target, weight, reduction) && nllComposable(self, target, weight) && isF32(grad) &&
      isF32(totalWeight)) {
    // grad_input[i, c] = -w_i * g_i (/ total for the mean) where c is row i's target.
    auto [picked, w] = nllTerms(self, target, weight, ignoreIndex);
    auto scale = reduction == kNone ? -(w * grad.reshape({-1})) : -(w * grad.reshape({}));
    if (reduction == kMean) scale = scale / totalWeight;
    const int64_t classes = self.size(-1);
    auto columns = at::arange(classes, at::kLong).to(self.device()).reshape({1, classes});
    auto rows = at::where(columns == target.reshape({-1, 1}), scale.reshape({-1, 1}), at::zeros({}, self.options()));
    return self.dim() == 1 ? rows.squeeze(0) : rows;
  }
  if (!nllSupported(self, target, weight, reduction) || !isF32(grad) || grad.numel() != 1 || !isF32(totalWeight)) {
    return onHost("aten::nll_loss_backward", [&] {
      return at::nll_loss_backward(host(grad), host(self), host(target), weight ? host(*weight) : at::Tensor(), reduction,
                                   ignoreIndex, host(totalWeight))
          .to(self.device());
    });
  }
  auto gradInput = emptyOn(self.sizes());
  sendNll(TensorFn::nllLossBackward, gradInput, grad, target, totalWeight, ignoreIndex, reduction);
  return gradInput;
}

// The 2-D loss of a segmentation ([N, C, H, W] against [N, H, W], and cross entropy over
// [N, C, d] through it): the classes moved last, one row per position, and the losses
// above over those rows.
bool nll2dShaped(const at::Tensor& self, const at::Tensor& target) {
  return typed(self) && self.dim() == 4 && typed(target) && target.dim() == 3 && target.size(0) == self.size(0) &&
         target.size(1) == self.size(2) && target.size(2) == self.size(3);
}
at::Tensor classesLast(const at::Tensor& self) { return self.permute({0, 2, 3, 1}).reshape({-1, self.size(1)}); }
std::tuple<at::Tensor, at::Tensor> nll_loss2d_forward(const at::Tensor& self, const at::Tensor& target,
                                                      const c10::optional<at::Tensor>& weight, int64_t reduction,
                                                      int64_t ignoreIndex) {
  if (!nll2dShaped(self, target)) {
    countFallback("aten::nll_loss2d_forward");
    auto [out, total] = at::nll_loss2d_forward(host(self), host(target), weight ? host(*weight) : at::Tensor(), reduction, ignoreIndex);
    return {out.to(self.device()), total.to(self.device())};
  }
  auto [out, total] = python::nll_loss_forward(classesLast(self), target.reshape({-1}), weight, reduction, ignoreIndex);
  return {reduction == kNone ? out.reshape(target.sizes()) : out, total};
}
at::Tensor nll_loss2d_backward(const at::Tensor& grad, const at::Tensor& self, const at::Tensor& target,
                               const c10::optional<at::Tensor>& weight, int64_t reduction, int64_t ignoreIndex,
                               const at::Tensor& totalWeight) {
  if (!nll2dShaped(self, target))
    return onHost("aten::nll_loss2d_backward", [&] {
      return at::nll_loss2d_backward(host(grad), host(self), host(target), weight ? host(*weight) : at::Tensor(), reduction,
                                     ignoreIndex, host(totalWeight))
          .to(self.device());
    });
  auto rows = python::nll_loss_backward(reduction == kNone ? grad.reshape({-1}) : grad, classesLast(self), target.reshape({-1}),
                                        weight, reduction, ignoreIndex, totalWeight);
  return rows.reshape({self.size(0), self.size(2), self.size(3), self.size(1)}).permute({0, 3, 1, 2}).contiguous();
}

// ---- Gradients of a tensor times or over a number ---------------------------------------

// PyTorch 1.13 differentiates mul.Scalar and div.Scalar (what C++ code calls: cross
// entropy's label smoothing, for one) through the number made a float64 CPU tensor that
// is no wrapped number, so a 0-dim gradient times it comes out float64: on the card, a
// CPU fallback and a conversion back, a round trip each, every step. Here their gradient
// is the upstream one times (or over) the number itself, float32 as the input.
struct ByNumber : public torch::autograd::Function<ByNumber> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& self, const at::Scalar& number,
                            bool divide) {
    ctx->saved_data["number"] = number;
    ctx->saved_data["divide"] = divide;
    at::AutoDispatchBelowADInplaceOrView below;
    return divide ? at::div(self, number) : at::mul(self, number);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx, torch::autograd::variable_list grads) {
    const at::Scalar number = ctx->saved_data["number"].toScalar();
    const at::Tensor& g = grads[0];
    return {ctx->saved_data["divide"].toBool() ? g.div(number) : g.mul(number), at::Tensor(), at::Tensor()};
  }
};
at::Tensor mulNumber(const at::Tensor& self, const at::Scalar& number) { return ByNumber::apply(self, number, false); }
at::Tensor divNumber(const at::Tensor& self, const at::Scalar& number) { return ByNumber::apply(self, number, true); }

TORCH_LIBRARY_IMPL(aten, AutogradPrivateUse1, m) {
  m.impl("mul.Scalar", TORCH_FN(mulNumber));
  m.impl("div.Scalar", TORCH_FN(divNumber));
}

// ---- Everything else: PyTorch's CPU fallback, counted ----------------------------------

void fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& name = op.schema().operator_name();
  // The _foreach_ ops (the optimizers' foreach paths, zero_grad's) are, on the CPU, loops
  // over the per-tensor ops: run here, each of those dispatches to this device's own. Not
  // a fallback: nothing leaves the card. (Through PyTorch's CPU fallback their in-place
  // forms changed CPU copies: the parameters never moved.)
  if (name.name.rfind("aten::_foreach_", 0) == 0) return op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);
  // Nor does that fallback copy back a list of tensors an op writes: refused, not wrong.
  for (const auto& arg : op.schema().arguments())
    TORCH_CHECK(!(arg.alias_info() && arg.alias_info()->isWrite() && arg.type()->kind() == c10::TypeKind::ListType),
                "raccel: ", name.name, " writes a list of tensors (", arg.name(), "), which the device cannot run on the host");
  countFallback(name.name + (name.overload_name.empty() ? "" : "." + name.overload_name));
  const size_t arguments = op.schema().arguments().size();
  for (size_t i = stack->size() - std::min(arguments, stack->size()); i < stack->size(); ++i)
    if ((*stack)[i].isOptionalTensorList()) (*stack)[i] = hostIndices((*stack)[i].toOptionalTensorList());
  at::native::cpu_fallback(op, stack);
}

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) { m.fallback(torch::CppFunction::makeFromBoxedFunction<&fallback>()); }

// The ops that run on the card, registered by family (the issue's list). Most elementwise
// ops come as three kernels: `op.out`, `op` and `op_`; a backward as two.
#define RACCEL_IMPL_OUT_NEW_INPLACE(op)              \
  m.impl(#op ".out", TORCH_FN(op##_out));            \
  m.impl(#op, TORCH_FN(python::op));                 \
  m.impl(#op "_", TORCH_FN(op##_));
#define RACCEL_IMPL_BACKWARD(op)                                         \
  m.impl(#op "_backward.grad_input", TORCH_FN(op##_backward_out));       \
  m.impl(#op "_backward", TORCH_FN(python::op##_backward));

// Storage, views, copies and fills.
void registerTensors(torch::Library& m) {
  m.impl("empty.memory_format", TORCH_FN(empty_memory_format));
  m.impl("empty_strided", TORCH_FN(empty_strided));
  m.impl("as_strided", TORCH_FN(at::native::as_strided_tensorimpl));
  m.impl("view", TORCH_FN(at::native::view));
  m.impl("_reshape_alias", TORCH_FN(at::native::_reshape_alias));
  m.impl("unfold", TORCH_FN(at::native::unfold));
  m.impl("_copy_from", TORCH_FN(_copy_from));
  m.impl("_copy_from_and_resize", TORCH_FN(_copy_from_and_resize));
  m.impl("resize_", TORCH_FN(resize_));
  m.impl("fill_.Scalar", TORCH_FN(fill_));
  m.impl("zero_", TORCH_FN(zero_));
  m.impl("_local_scalar_dense", TORCH_FN(_local_scalar_dense));
  m.impl("cat.out", TORCH_FN(cat_out));
  m.impl("cat", TORCH_FN(python::cat));
}

// Arithmetic, and what optimizers are made of.
void registerArithmetic(torch::Library& m) {
  m.impl("add.out", TORCH_FN(add_out));
  m.impl("add.Tensor", TORCH_FN(add));
  m.impl("add_.Tensor", TORCH_FN(add_));
  m.impl("mul.out", TORCH_FN(mul_out));
  m.impl("mul.Tensor", TORCH_FN(mul));
  m.impl("mul_.Tensor", TORCH_FN(mul_));
  m.impl("sub.out", TORCH_FN(sub_out));
  m.impl("sub.Tensor", TORCH_FN(python::sub));
  m.impl("sub_.Tensor", TORCH_FN(sub_));
  m.impl("div.out", TORCH_FN(div_out));
  m.impl("div.Tensor", TORCH_FN(python::div));
  m.impl("div_.Tensor", TORCH_FN(div_));
  m.impl("pow.Tensor_Scalar_out", TORCH_FN(pow_out));
  m.impl("pow.Tensor_Scalar", TORCH_FN(python::pow));
  m.impl("pow_.Scalar", TORCH_FN(pow_));
  m.impl("maximum.out", TORCH_FN(maximum_out));
  m.impl("maximum", TORCH_FN(python::maximum));
  m.impl("minimum.out", TORCH_FN(minimum_out));
  m.impl("minimum", TORCH_FN(python::minimum));
  m.impl("lerp.Scalar_out", TORCH_FN(lerp_out));
  m.impl("lerp.Scalar", TORCH_FN(python::lerp));
  m.impl("lerp_.Scalar", TORCH_FN(lerp_));
  RACCEL_IMPL_OUT_NEW_INPLACE(sqrt)
  RACCEL_IMPL_OUT_NEW_INPLACE(rsqrt)
  RACCEL_IMPL_OUT_NEW_INPLACE(addcmul)
  RACCEL_IMPL_OUT_NEW_INPLACE(addcdiv)
  RACCEL_IMPL_OUT_NEW_INPLACE(exp)
  RACCEL_IMPL_OUT_NEW_INPLACE(log)
  RACCEL_IMPL_OUT_NEW_INPLACE(log1p)
  RACCEL_IMPL_OUT_NEW_INPLACE(floor)
  RACCEL_IMPL_OUT_NEW_INPLACE(ceil)
  RACCEL_IMPL_OUT_NEW_INPLACE(round)
  RACCEL_IMPL_OUT_NEW_INPLACE(trunc)
  RACCEL_IMPL_OUT_NEW_INPLACE(frac)
  RACCEL_IMPL_OUT_NEW_INPLACE(sin)
  RACCEL_IMPL_OUT_NEW_INPLACE(cos)
  RACCEL_IMPL_OUT_NEW_INPLACE(tan)
  RACCEL_IMPL_OUT_NEW_INPLACE(asin)
  RACCEL_IMPL_OUT_NEW_INPLACE(acos)
  RACCEL_IMPL_OUT_NEW_INPLACE(atan)
  RACCEL_IMPL_OUT_NEW_INPLACE(sinh)
  RACCEL_IMPL_OUT_NEW_INPLACE(cosh)
  RACCEL_IMPL_OUT_NEW_INPLACE(erf)
  RACCEL_IMPL_OUT_NEW_INPLACE(erfc)
  RACCEL_IMPL_OUT_NEW_INPLACE(expm1)
  RACCEL_IMPL_OUT_NEW_INPLACE(log2)
  RACCEL_IMPL_OUT_NEW_INPLACE(log10)
  RACCEL_IMPL_OUT_NEW_INPLACE(exp2)
  RACCEL_IMPL_OUT_NEW_INPLACE(reciprocal)
  RACCEL_IMPL_OUT_NEW_INPLACE(abs)
  RACCEL_IMPL_OUT_NEW_INPLACE(neg)
  RACCEL_IMPL_OUT_NEW_INPLACE(sign)
  RACCEL_IMPL_OUT_NEW_INPLACE(sgn)
  RACCEL_IMPL_OUT_NEW_INPLACE(clamp)
  RACCEL_IMPL_OUT_NEW_INPLACE(clamp_min)
  RACCEL_IMPL_OUT_NEW_INPLACE(clamp_max)
}

void registerMatmuls(torch::Library& m) {
  m.impl("mm.out", TORCH_FN(mm_out));
  m.impl("mm", TORCH_FN(mm));
  m.impl("addmm.out", TORCH_FN(addmm_out));
  m.impl("addmm", TORCH_FN(addmm));
  m.impl("addmm_", TORCH_FN(addmm_));
  m.impl("addmv.out", TORCH_FN(addmv_out));
  m.impl("dot", TORCH_FN(python::dot));
  m.impl("bmm.out", TORCH_FN(bmm_out));
  m.impl("bmm", TORCH_FN(python::bmm));
  RACCEL_IMPL_OUT_NEW_INPLACE(baddbmm)
}

// Activations, each with its backward.
void registerActivations(torch::Library& m) {
  m.impl("relu", TORCH_FN(relu));
  m.impl("relu_", TORCH_FN(relu_));
  m.impl("threshold_backward.grad_input", TORCH_FN(threshold_backward_out));
  m.impl("threshold_backward", TORCH_FN(threshold_backward));
  m.impl("softplus.out", TORCH_FN(softplus_out));
  m.impl("softplus", TORCH_FN(python::softplus));
  RACCEL_IMPL_BACKWARD(softplus)
  RACCEL_IMPL_OUT_NEW_INPLACE(gelu)
  RACCEL_IMPL_BACKWARD(gelu)
  RACCEL_IMPL_OUT_NEW_INPLACE(silu)
  RACCEL_IMPL_BACKWARD(silu)
  RACCEL_IMPL_OUT_NEW_INPLACE(hardswish)
  m.impl("hardswish_backward.out", TORCH_FN(hardswish_backward_out));
  m.impl("hardswish_backward", TORCH_FN(python::hardswish_backward));
  RACCEL_IMPL_OUT_NEW_INPLACE(hardsigmoid)
  RACCEL_IMPL_BACKWARD(hardsigmoid)
  RACCEL_IMPL_OUT_NEW_INPLACE(mish)
  m.impl("mish_backward", TORCH_FN(python::mish_backward));  // (no out overload)
  m.impl("glu.out", TORCH_FN(glu_out));
  m.impl("glu", TORCH_FN(python::glu));
  m.impl("glu_backward.grad_input", TORCH_FN(glu_backward_out));
  m.impl("glu_backward", TORCH_FN(python::glu_backward));
  m.impl("log_sigmoid_forward", TORCH_FN(log_sigmoid_forward));
  m.impl("log_sigmoid_backward", TORCH_FN(log_sigmoid_backward));
  m.impl("xlogy.OutTensor", TORCH_FN(xlogy_out));
  m.impl("nan_to_num.out", TORCH_FN(nan_to_num_out));
  m.impl("xlogy.Tensor", TORCH_FN(python::xlogy));
  m.impl("xlogy_.Tensor", TORCH_FN(xlogy_));
  m.impl("roll", TORCH_FN(python::roll));
  m.impl("repeat_interleave.Tensor", TORCH_FN(repeat_interleave_Tensor));
  m.impl("_cummax_helper", TORCH_FN(python::_cummax_helper));
  m.impl("_cummin_helper", TORCH_FN(python::_cummin_helper));
  m.impl("_embedding_bag", TORCH_FN(python::_embedding_bag));
  m.impl("_embedding_bag_forward_only", TORCH_FN(python::_embedding_bag));
  m.impl("_embedding_bag_dense_backward", TORCH_FN(python::_embedding_bag_dense_backward));
  m.impl("_embedding_bag_per_sample_weights_backward", TORCH_FN(python::_embedding_bag_per_sample_weights_backward));
  RACCEL_IMPL_OUT_NEW_INPLACE(triu)
  RACCEL_IMPL_OUT_NEW_INPLACE(tril)
  m.impl("native_group_norm_backward", TORCH_FN(native_group_norm_backward));
  m.impl("prelu", TORCH_FN(python::prelu));
  m.impl("prelu_backward", TORCH_FN(python::prelu_backward));
  RACCEL_IMPL_OUT_NEW_INPLACE(leaky_relu)
  RACCEL_IMPL_BACKWARD(leaky_relu)
  RACCEL_IMPL_OUT_NEW_INPLACE(hardtanh)
  RACCEL_IMPL_BACKWARD(hardtanh)
  RACCEL_IMPL_OUT_NEW_INPLACE(tanh)
  RACCEL_IMPL_BACKWARD(tanh)
  RACCEL_IMPL_OUT_NEW_INPLACE(sigmoid)
  RACCEL_IMPL_BACKWARD(sigmoid)
  RACCEL_IMPL_OUT_NEW_INPLACE(elu)
  RACCEL_IMPL_BACKWARD(elu)
}

// Normalization and losses.
void registerNormsAndLosses(torch::Library& m) {
  m.impl("native_layer_norm", TORCH_FN(native_layer_norm));
  m.impl("native_layer_norm_backward", TORCH_FN(native_layer_norm_backward));
  m.impl("native_batch_norm", TORCH_FN(native_batch_norm));
  m.impl("native_batch_norm_backward", TORCH_FN(native_batch_norm_backward));
  m.impl("_softmax", TORCH_FN(_softmax));
  m.impl("_softmax_backward_data", TORCH_FN(_softmax_backward_data));
  m.impl("_log_softmax", TORCH_FN(_log_softmax));
  m.impl("_log_softmax_backward_data", TORCH_FN(_log_softmax_backward_data));
  m.impl("nll_loss_forward", TORCH_FN(nll_loss_forward));
  m.impl("nll_loss_backward", TORCH_FN(nll_loss_backward));
  m.impl("nll_loss2d_forward", TORCH_FN(nll_loss2d_forward));
  m.impl("nll_loss2d_backward", TORCH_FN(nll_loss2d_backward));
  m.impl("mse_loss.out", TORCH_FN(mse_loss_out));
  m.impl("mse_loss", TORCH_FN(mse_loss));
  m.impl("mse_loss_backward.grad_input", TORCH_FN(mse_loss_backward_out));
  m.impl("mse_loss_backward", TORCH_FN(mse_loss_backward));
  m.impl("smooth_l1_loss.out", TORCH_FN(smooth_l1_loss_out));
  m.impl("smooth_l1_loss", TORCH_FN(python::smooth_l1_loss));
  RACCEL_IMPL_BACKWARD(smooth_l1_loss)
  m.impl("huber_loss.out", TORCH_FN(huber_loss_out));
  m.impl("huber_loss", TORCH_FN(python::huber_loss));
  m.impl("huber_loss_backward.out", TORCH_FN(huber_loss_backward_out));
  m.impl("binary_cross_entropy", TORCH_FN(python::binary_cross_entropy));
  m.impl("binary_cross_entropy_backward", TORCH_FN(python::binary_cross_entropy_backward));
}

void registerReductions(torch::Library& m) {
  m.impl("sum.IntList_out", TORCH_FN(sum_out));
  m.impl("sum.dim_IntList", TORCH_FN(sum_dim));
  m.impl("sum", TORCH_FN(sum_all));
  m.impl("sort.values_stable", TORCH_FN(sort_values_stable));
  m.impl("sort.stable", TORCH_FN(python::sort_stable));
  m.impl("topk.values", TORCH_FN(topk_values));
  m.impl("kthvalue.values", TORCH_FN(kthvalue_values));
  m.impl("median.dim_values", TORCH_FN(median_dim_values));
  m.impl("median", TORCH_FN(python::median));
  m.impl("topk", TORCH_FN(python::topk));
  m.impl("cumsum.out", TORCH_FN(cumsum_out));
  m.impl("cumsum", TORCH_FN(python::cumsum));
  m.impl("cumprod.out", TORCH_FN(cumprod_out));
  m.impl("cumprod", TORCH_FN(python::cumprod));
  m.impl("cumsum_", TORCH_FN(python::cumsum_));
  m.impl("cumprod_", TORCH_FN(python::cumprod_));
  m.impl("mean.out", TORCH_FN(mean_out));
  m.impl("mean.dim", TORCH_FN(mean_dim));
  m.impl("mean", TORCH_FN(mean_all));
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
  m.impl("all", TORCH_FN(python::all));
  m.impl("any", TORCH_FN(python::any));
  m.impl("all.out", TORCH_FN(all_dim_out));
  m.impl("all.dim", TORCH_FN(all_dim));
  m.impl("any.out", TORCH_FN(any_dim_out));
  m.impl("any.dim", TORCH_FN(any_dim));
}

// Comparisons, selection and the boolean ops masks need.
void registerComparisons(torch::Library& m) {
#define RACCEL_IMPL_COMPARE(op)                                 \
  m.impl(#op ".Tensor_out", TORCH_FN(op##_out));                \
  m.impl(#op ".Tensor", TORCH_FN(python::op));                  \
  m.impl(#op ".Scalar_out", TORCH_FN(op##_scalar_out));         \
  m.impl(#op ".Scalar", TORCH_FN(op##_scalar));
  RACCEL_IMPL_COMPARE(eq)
  RACCEL_IMPL_COMPARE(ne)
  RACCEL_IMPL_COMPARE(lt)
  RACCEL_IMPL_COMPARE(le)
  RACCEL_IMPL_COMPARE(gt)
  RACCEL_IMPL_COMPARE(ge)
#undef RACCEL_IMPL_COMPARE
  m.impl("where.self_out", TORCH_FN(where_out));
  m.impl("where.self", TORCH_FN(python::where));
  m.impl("masked_fill_.Scalar", TORCH_FN(masked_fill_scalar_));
  m.impl("masked_fill_.Tensor", TORCH_FN(masked_fill_));
  m.impl("logical_not.out", TORCH_FN(logical_not_out));
  m.impl("logical_not", TORCH_FN(python::logical_not));
  m.impl("isnan", TORCH_FN(python::isnan));
  m.impl("equal", TORCH_FN(python::equal));
  RACCEL_IMPL_OUT_NEW_INPLACE(logical_and)
  RACCEL_IMPL_OUT_NEW_INPLACE(logical_or)
  m.impl("bitwise_not.out", TORCH_FN(bitwise_not_out));
  m.impl("bitwise_and.Tensor_out", TORCH_FN(bitwise_and_out));
  m.impl("bitwise_or.Tensor_out", TORCH_FN(bitwise_or_out));
  m.impl("bitwise_xor.Tensor_out", TORCH_FN(bitwise_xor_out));
  m.impl("logical_xor.out", TORCH_FN(logical_xor_out));
  m.impl("clamp.Tensor_out", TORCH_FN(clamp_Tensor_out));
  m.impl("lerp.Tensor_out", TORCH_FN(lerp_Tensor_out));
  m.impl("count_nonzero.dim_IntList", TORCH_FN(count_nonzero_dims));
  m.impl("trace", TORCH_FN(python::trace));
  m.impl("atan2.out", TORCH_FN(atan2_out));
  m.impl("atan2", TORCH_FN(python::atan2));
  m.impl("hypot.out", TORCH_FN(hypot_out));
  m.impl("hypot", TORCH_FN(python::hypot));
  m.impl("copysign.out", TORCH_FN(copysign_out));
  m.impl("copysign.Tensor", TORCH_FN(python::copysign));
  m.impl("fmod.Tensor_out", TORCH_FN(fmod_out));
  m.impl("fmod.Tensor", TORCH_FN(python::fmod));
  m.impl("remainder.Tensor_out", TORCH_FN(remainder_out));
  m.impl("div.out_mode", TORCH_FN(div_out_mode));
  m.impl("floor_divide.out", TORCH_FN(floor_divide_out));
  m.impl("floor_divide", TORCH_FN(python::floor_divide));
  m.impl("floor_divide_.Tensor", TORCH_FN(floor_divide_));
  m.impl("im2col", TORCH_FN(python::im2col));
  m.impl("col2im", TORCH_FN(python::col2im));
  m.impl("index_fill_.int_Scalar", TORCH_FN(index_fill_scalar_));
  m.impl("index_fill_.int_Tensor", TORCH_FN(index_fill_tensor_));
  m.impl("diag.out", TORCH_FN(diag_out));
}

// Indexing, gathers and scatters (embeddings), and random numbers.
void registerIndexingAndRandom(torch::Library& m) {
  m.impl("gather.out", TORCH_FN(gather_out));
  m.impl("gather", TORCH_FN(python::gather));
  m.impl("_index_put_impl_", TORCH_FN(python::_index_put_impl_));
  m.impl("index.Tensor", TORCH_FN(python::index));
  m.impl("unfold_backward", TORCH_FN(python::unfold_backward));
  m.impl("arange.start_out", TORCH_FN(arange_out));
  m.impl("index_select.out", TORCH_FN(index_select_out));
  m.impl("index_select", TORCH_FN(python::index_select));
  m.impl("flip", TORCH_FN(python::flip));
  m.impl("embedding_dense_backward", TORCH_FN(embedding_dense_backward));
  RACCEL_IMPL_OUT_NEW_INPLACE(scatter_add)
  m.impl("scatter.src_out", TORCH_FN(scatter_src_out));
  m.impl("scatter.value_out", TORCH_FN(scatter_value_out));
  RACCEL_IMPL_OUT_NEW_INPLACE(index_add)
  m.impl("masked_select", TORCH_FN(masked_select));
  m.impl("masked_scatter_", TORCH_FN(masked_scatter_));
  m.impl("bernoulli_.float", TORCH_FN(bernoulli_));
  m.impl("uniform_", TORCH_FN(uniform_));
  m.impl("normal_", TORCH_FN(normal_));
}

void registerConvolutionsAndPooling(torch::Library& m) {
  m.impl("reflection_pad1d.out", TORCH_FN(reflection_pad1d_out));
  m.impl("reflection_pad1d", TORCH_FN(python::reflection_pad1d));
  RACCEL_IMPL_BACKWARD(reflection_pad1d)
  m.impl("reflection_pad2d.out", TORCH_FN(reflection_pad2d_out));
  m.impl("reflection_pad2d", TORCH_FN(python::reflection_pad2d));
  RACCEL_IMPL_BACKWARD(reflection_pad2d)
  m.impl("replication_pad1d.out", TORCH_FN(replication_pad1d_out));
  m.impl("replication_pad1d", TORCH_FN(python::replication_pad1d));
  RACCEL_IMPL_BACKWARD(replication_pad1d)
  m.impl("replication_pad2d.out", TORCH_FN(replication_pad2d_out));
  m.impl("replication_pad2d", TORCH_FN(python::replication_pad2d));
  RACCEL_IMPL_BACKWARD(replication_pad2d)
  m.impl("convolution_overrideable", TORCH_FN(convolution_overrideable));
  m.impl("convolution_backward_overrideable", TORCH_FN(convolution_backward_overrideable));
  m.impl("max_pool2d_with_indices", TORCH_FN(max_pool2d_with_indices));
  m.impl("upsample_nearest2d.out", TORCH_FN(upsample_nearest2d_out));
  m.impl("upsample_nearest2d_backward.grad_input", TORCH_FN(upsample_nearest2d_backward_out));
  m.impl("upsample_bilinear2d.out", TORCH_FN(upsample_bilinear2d_out));
  m.impl("upsample_bilinear2d_backward.grad_input", TORCH_FN(upsample_bilinear2d_backward_out));
  m.impl("max_pool2d_with_indices_backward", TORCH_FN(max_pool2d_with_indices_backward));
  m.impl("avg_pool2d", TORCH_FN(python::avg_pool2d));
  m.impl("avg_pool2d_backward", TORCH_FN(avg_pool2d_backward));
  m.impl("_adaptive_avg_pool2d", TORCH_FN(_adaptive_avg_pool2d));
  m.impl("_adaptive_avg_pool2d_backward", TORCH_FN(_adaptive_avg_pool2d_backward));
}
#undef RACCEL_IMPL_OUT_NEW_INPLACE
#undef RACCEL_IMPL_BACKWARD

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  registerTensors(m);
  registerArithmetic(m);
  registerMatmuls(m);
  registerActivations(m);
  registerNormsAndLosses(m);
  registerReductions(m);
  registerComparisons(m);
  registerIndexingAndRandom(m);
  registerConvolutionsAndPooling(m);
}

void printFallbacks() {
  std::lock_guard lock(state().countsMu);
  std::fprintf(stderr, "raccel.torch: %zu op%s fell back to the CPU%s\n", state().fallbacks.size(),
               state().fallbacks.size() == 1 ? "" : "s", state().fallbacks.empty() ? "" : " (op: calls)");
  for (auto& [op, n] : state().fallbacks) std::fprintf(stderr, "  %s: %llu\n", op.c_str(), static_cast<unsigned long long>(n));
}

}  // namespace
}  // namespace raccel::python

PYBIND11_MODULE(_torch, m) {
  using namespace raccel::python;
  m.doc() = "PyTorch's privateuseone device over a raccel session (use raccel.torch)";
  m.def("attach", [](py::capsule capsule) {
    auto* shared = static_cast<std::shared_ptr<SharedSession>*>(PyCapsule_GetPointer(capsule.ptr(), kSessionCapsule));
    if (!shared) throw py::error_already_set();
    auto previous = state().shared;
    if (previous && previous != *shared) throw std::runtime_error("raccel.torch is already attached to another session");
    state().shared = *shared;
  }, "Makes the device's tensors live in this session (a raccel.Session's _capsule())");
  m.def("attached", [] { return state().shared != nullptr; });
  m.def("read_storage", &readStorage, "A device storage's bytes (its data_ptr() and nbytes())");
  m.def("fallbacks", [] {
    std::lock_guard lock(state().countsMu);
    return state().fallbacks;
  }, "The ops that ran on the CPU instead, with how often");
  m.def("reset_fallbacks", [] {
    std::lock_guard lock(state().countsMu);
    state().fallbacks.clear();
  });
  m.def("print_fallbacks", &printFallbacks);
  m.def("index_reads", [] { return state().indexReads.load(); },
        "How many index checks have read an index's bounds from the card (each one wait)");
}
