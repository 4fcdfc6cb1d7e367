// The torch device's memory: the session's state, storages as ranges of larger raccel
// buffers (torch_device.cc), the allocator and device guard PyTorch asks for, and the
// copies between the host and the device.
#include <ATen/EmptyTensor.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/unfold_native.h>
#include <ATen/ops/view_native.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include "vmfrontend/python/torch_device.h"

namespace raccel::python {

// ---- The session ----------------------------------------------------------------------

State& state() {
  static auto* s = new State;
  return *s;
}


namespace py = pybind11;

#if RACCEL_TORCH_AT_LEAST(2, 3)
#define RACCEL_ALLOCATE_CONST
#else
#define RACCEL_ALLOCATE_CONST const
#endif

namespace {

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

}  // namespace

std::pair<Handle, uint64_t> locate(const void* p) { return arena().locate(p); }

KnownValues& knownValues() {
  static auto* k = new KnownValues;  // never destroyed, like the session's State
  return *k;
}

at::Tensor emptyOn(c10::IntArrayRef sizes, at::ScalarType dtype) {
  return at::detail::empty_generic(sizes, &g_allocator, c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), dtype,
                                   c10::nullopt);
}

namespace {


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


// Host -> device: dense as dst is, or through a staging copy on the card.
void copyToDevice(const at::Tensor& self, const at::Tensor& dst) {
  auto src = self.to(dst.scalar_type()).expand(dst.sizes()).contiguous();
  if (dst.is_contiguous()) {
    writeFrom(src, dst);
  } else if (dst.is_non_overlapping_and_dense()) {  // a dense block in another order (a transpose): laid out as it is
    auto laid = at::empty_strided(dst.sizes(), dst.strides(), src.options());
    laid.copy_(src);
    writeFrom(laid, dst);
  } else {
    TORCH_CHECK(storageTypeOf(dst.scalar_type()), "raccel: copying into a non-contiguous ", dst.scalar_type(),
                " tensor is not supported");
    auto staged = emptyOn(dst.sizes(), dst.scalar_type());
    writeFrom(src, staged);
    elementwise(TensorFn::copy, dst, &staged, nullptr);
  }
}
// Device -> host: read as laid out where dense, else through a dense copy on the card.
void copyToHost(const at::Tensor& self, const at::Tensor& dst) {
  auto src = self.expand(dst.sizes());
  if (!src.is_contiguous() && src.is_non_overlapping_and_dense()) {  // read as laid out
    auto laid = at::empty_strided(src.sizes(), src.strides(), src.options().device(at::kCPU));
    readInto(src, laid);
    dst.copy_(laid);
    return;
  }
  if (!src.is_contiguous()) {
    TORCH_CHECK(storageTypeOf(src.scalar_type()), "raccel: reading a non-contiguous ", src.scalar_type(),
                " tensor is not supported");
    auto staged = emptyOn(src.sizes(), src.scalar_type());
    elementwise(TensorFn::copy, staged, &src, nullptr);
    src = staged;
  }
  auto hostCopy = at::empty(src.sizes(), src.options().device(at::kCPU));
  readInto(src, hostCopy);
  dst.copy_(hostCopy);
}
at::Tensor _copy_from(const at::Tensor& self, const at::Tensor& dst, bool /*non_blocking*/) {
  TORCH_CHECK(self.sizes() == dst.sizes() || at::is_expandable_to(self.sizes(), dst.sizes()),
              "raccel: copy from ", self.sizes(), " to ", dst.sizes());
  if (dst.numel() == 0) return dst;
  if (!onDevice(self)) {
    copyToDevice(self, dst);
  } else if (!onDevice(dst)) {
    copyToHost(self, dst);
  } else if (storageTypeOf(self.scalar_type()) && storageTypeOf(dst.scalar_type())) {
    // device -> device, of any rank (elementwise() merges or splits the dimensions): a
    // conversion where the dtypes differ (exact between integers)
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


namespace {
// Whether the card's fill (of an f32 value) into a tensor of one of its types makes what
// PyTorch's does: into f32, f16 and bf16 a value in the type's range, an infinity or a NaN
// (c10 rounds it to f32, then to the type, and refuses a finite value past the type's
// largest); into the other types, a value an f32 holds exactly (i64 past 2^24 is not;
// int32 within its range).
bool fillsExactly(const at::Tensor& self, const at::Scalar& value) {
  const auto t = self.scalar_type();
  const double v = value.toDouble();
  const auto within = [&](double largest) { return !std::isfinite(v) || std::fabs(v) <= largest; };
  if (t == at::kFloat) return within(std::numeric_limits<float>::max());
  if (t == at::kHalf) return within(65504.0);
  if (t == at::kBFloat16) return within(3.3895313892515355e38);
  if (t == at::kInt && !(v >= -2147483648.0 && v <= 2147483647.0)) return false;
  return v == double(value.toFloat());
}
}  // namespace

at::Tensor& fill_(at::Tensor& self, const at::Scalar& value) {
  if (self.numel() == 0) return self;
  const bool onCard = onDevice(self) && storageTypeOf(self.scalar_type()) && !value.isComplex();
  if (onCard && fillsExactly(self, value)) {
    elementwise(TensorFn::fill, self, nullptr, nullptr, value.toFloat());
  } else if (onCard) {
    // PyTorch's own conversion of the value (with its range checks), written once and
    // spread on the card: an f64 of 0.1, an i64 past 2^24
    auto one = emptyOn({}, self.scalar_type());
    writeFrom(at::full({}, value, self.options().device(at::kCPU)), one);
    elementwise(TensorFn::copy, self, &one, nullptr);
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


}  // namespace

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
}

}  // namespace raccel::python
