#include "hal/device.h"

#include <algorithm>
#include <cstring>

namespace raccel::hal {
namespace {
constexpr uint64_t kF32 = sizeof(float);

Status checkRange(const Buffer& buffer, uint64_t offset, uint64_t length, const char* what) {
  if (offset > buffer.size() || length > buffer.size() - offset)
    return fail(Code::invalidArgument, std::string(what) + " of " + std::to_string(length) + " bytes at offset " +
                                           std::to_string(offset) + " is past the end of a " +
                                           std::to_string(buffer.size()) + "-byte buffer");
  return {};
}

Status checkElements(const Buffer& buffer, uint64_t n, const char* op, const char* arg) {
  if (n > buffer.size() / kF32)
    return fail(Code::invalidArgument, std::string(op) + ": " + arg + " holds " + std::to_string(buffer.size() / kF32) +
                                           " floats, " + std::to_string(n) + " needed");
  return {};
}
}  // namespace

Result<std::unique_ptr<Buffer>> Device::allocate(uint64_t bytes) {
  if (bytes == 0) return fail(Code::invalidArgument, "cannot allocate a zero-size buffer");
  const uint64_t limit = memoryCap_ ? std::min(memoryCap_, caps_.memoryBytes) : caps_.memoryBytes;
  if (bytes > limit - std::min(memoryUsed_, limit))
    return fail(Code::resourceExhausted, std::string(limit < caps_.memoryBytes ? "this tenant's share of the card's memory"
                                                                               : "card memory") +
                                             " exhausted: " + std::to_string(bytes) + " bytes asked, " +
                                             std::to_string(limit - std::min(memoryUsed_, limit)) + " of " +
                                             std::to_string(limit) + " free");
  auto buffer = doAllocate(bytes);
  if (buffer) memoryUsed_ += bytes;
  return buffer;
}

void Device::release(std::unique_ptr<Buffer> buffer) {
  if (!buffer) return;
  doRelease(*buffer);
  memoryUsed_ -= std::min(memoryUsed_, buffer->size());
}

Status Device::write(Buffer& buffer, uint64_t offset, std::span<const std::byte> data) {
  if (auto s = checkRange(buffer, offset, data.size(), "write"); !s) return s;
  return doWrite(buffer, offset, data);
}

Status Device::read(const Buffer& buffer, uint64_t offset, std::span<std::byte> out) {
  if (auto s = checkRange(buffer, offset, out.size(), "read"); !s) return s;
  return doRead(buffer, offset, out);
}

Status Device::copy(Buffer& dst, uint64_t dstOffset, const Buffer& src, uint64_t srcOffset, uint64_t length) {
  if (auto s = checkRange(src, srcOffset, length, "copy source"); !s) return s;
  if (auto s = checkRange(dst, dstOffset, length, "copy destination"); !s) return s;
  return doCopy(dst, dstOffset, src, srcOffset, length);
}

Status Device::fill(Buffer& buffer, uint64_t offset, uint64_t length, uint8_t value) {
  if (auto s = checkRange(buffer, offset, length, "fill"); !s) return s;
  return doFill(buffer, offset, length, value);
}

Result<std::unique_ptr<Program>> Device::loadProgram(ProgramKind kind, const std::string& name,
                                                     std::span<const std::byte> code, const std::string& options) {
  if (options.size() > kMaxBuildOptions)
    return fail(Code::invalidArgument, "build options of " + std::to_string(options.size()) + " bytes (at most " +
                                           std::to_string(kMaxBuildOptions) + ")");
  if (std::find(caps_.programKinds.begin(), caps_.programKinds.end(), kind) == caps_.programKinds.end()) {
    std::string have;
    for (auto k : caps_.programKinds) have += std::string(have.empty() ? "" : ", ") + programKindName(k);
    return fail(Code::unimplemented, std::string("this ") + kindName(caps_.kind) + " card (" + caps_.backend +
                                         ") cannot run " + programKindName(kind) + " programs; it accepts: " + have);
  }
  if (kind == ProgramKind::builtin) {
    if (name != kBuiltinLibrary)
      return fail(Code::notFound, "no built-in library named '" + name + "' (there is: " + kBuiltinLibrary + ")");
    return std::unique_ptr<Program>(new BuiltinProgram());
  }
  return doLoadProgram(kind, name, code, options);
}

Result<std::unique_ptr<Program>> Device::doLoadProgram(ProgramKind kind, const std::string&, std::span<const std::byte>,
                                                       const std::string&) {
  return fail(Code::unimplemented, std::string(programKindName(kind)) + " programs are not supported by " + caps_.backend);
}

Status Device::launch(Program& program, const std::string& kernel, const LaunchDims& dims,
                      std::span<const KernelArg> args) {
  for (size_t i = 0; i < args.size(); ++i) {
    const KernelArg& arg = args[i];
    if (arg.type == KernelArg::Type::buffer && arg.buffer == nullptr)
      return fail(Code::invalidArgument, "kernel argument " + std::to_string(i) + " is a null buffer");
    if (arg.type == KernelArg::Type::buffer && arg.offset > arg.buffer->size())
      return fail(Code::invalidArgument, "kernel argument " + std::to_string(i) + ": offset " + std::to_string(arg.offset) +
                                             " is past the end of a " + std::to_string(arg.buffer->size()) + "-byte buffer");
    if (arg.type == KernelArg::Type::bytes && (arg.bytes.empty() || arg.bytes.size() > kMaxArgBytes))
      return fail(Code::invalidArgument, "kernel argument " + std::to_string(i) + ": " + std::to_string(arg.bytes.size()) +
                                             " bytes by value (1 to " + std::to_string(kMaxArgBytes) + ")");
    if (arg.type == KernelArg::Type::local && arg.scalar.u32 == 0)
      return fail(Code::invalidArgument, "kernel argument " + std::to_string(i) + ": a local array of 0 bytes");
  }
  for (int d = 0; d < 3; ++d)
    if (dims.offset[d] > UINT64_MAX - uint64_t{dims.grid[d]} * dims.block[d])
      return fail(Code::invalidArgument, "launch of " + kernel + ": offset plus size overflows");
  if (program.kind() == ProgramKind::builtin) {
    for (auto& arg : args)
      if (arg.type == KernelArg::Type::local || arg.type == KernelArg::Type::bytes ||
          (arg.type == KernelArg::Type::buffer && arg.offset != 0))
        return fail(Code::invalidArgument, "built-in kernel " + kernel + " takes whole buffers and scalars only");
    return launchBuiltin(kernel, args);
  }
  return doLaunch(program, kernel, dims, args);
}

Status Device::doLaunch(Program& program, const std::string&, const LaunchDims&, std::span<const KernelArg>) {
  return fail(Code::unimplemented, std::string("launching ") + programKindName(program.kind()) +
                                       " kernels is not supported by " + caps_.backend);
}

// Built-in kernels by name, with their arguments in the order of the op's fields.
Status Device::launchBuiltin(const std::string& kernel, std::span<const KernelArg> args) {
  using T = KernelArg::Type;
  auto expect = [&](std::initializer_list<T> types, const char* signature) -> Status {
    bool ok = args.size() == types.size();
    size_t i = 0;
    for (auto t : types) {
      if (!ok) break;
      ok = args[i++].type == t;
    }
    if (!ok) return fail(Code::invalidArgument, "kernel " + kernel + " takes (" + signature + ")");
    return {};
  };
  if (kernel == "gemm") {
    if (auto s = expect({T::u32, T::u32, T::u32, T::f32, T::f32, T::buffer, T::buffer, T::buffer},
                        "u32 m, u32 n, u32 k, f32 alpha, f32 beta, buffer a, buffer b, buffer c");
        !s)
      return s;
    return gemm(GemmArgs{args[0].scalar.u32, args[1].scalar.u32, args[2].scalar.u32, args[3].scalar.f32,
                         args[4].scalar.f32, args[5].buffer, args[6].buffer, args[7].buffer});
  }
  if (kernel == "axpy") {
    if (auto s = expect({T::u64, T::f32, T::buffer, T::buffer}, "u64 n, f32 alpha, buffer x, buffer y"); !s) return s;
    return axpy(args[0].scalar.u64, args[1].scalar.f32, *args[2].buffer, *args[3].buffer);
  }
  if (kernel == "vadd") {
    if (auto s = expect({T::u64, T::buffer, T::buffer, T::buffer}, "u64 n, buffer a, buffer b, buffer out"); !s) return s;
    return vadd(args[0].scalar.u64, *args[1].buffer, *args[2].buffer, *args[3].buffer);
  }
  if (kernel == "reduceSum") {
    if (auto s = expect({T::u64, T::buffer, T::buffer}, "u64 n, buffer input, buffer out"); !s) return s;
    return reduceSum(args[0].scalar.u64, *args[1].buffer, *args[2].buffer);
  }
  return fail(Code::notFound, "no kernel '" + kernel + "' in " + kBuiltinLibrary + " (it has gemm, axpy, vadd, reduceSum)");
}

Status Device::gemm(const GemmArgs& g) {
  if (!g.a || !g.b || !g.c) return fail(Code::invalidArgument, "gemm: a, b and c must be buffers");
  if (g.m == 0 || g.n == 0 || g.k == 0) return fail(Code::invalidArgument, "gemm: m, n and k must be nonzero");
  if (auto s = checkElements(*g.a, uint64_t{g.m} * g.k, "gemm", "a"); !s) return s;
  if (auto s = checkElements(*g.b, uint64_t{g.k} * g.n, "gemm", "b"); !s) return s;
  if (auto s = checkElements(*g.c, uint64_t{g.m} * g.n, "gemm", "c"); !s) return s;
  if (g.c == g.a || g.c == g.b) return fail(Code::invalidArgument, "gemm: c must not alias a or b");
  return doGemm(g);
}

Status Device::axpy(uint64_t n, float alpha, const Buffer& x, Buffer& y) {
  if (auto s = checkElements(x, n, "axpy", "x"); !s) return s;
  if (auto s = checkElements(y, n, "axpy", "y"); !s) return s;
  return doAxpy(n, alpha, x, y);
}

Status Device::vadd(uint64_t n, const Buffer& a, const Buffer& b, Buffer& out) {
  if (auto s = checkElements(a, n, "vadd", "a"); !s) return s;
  if (auto s = checkElements(b, n, "vadd", "b"); !s) return s;
  if (auto s = checkElements(out, n, "vadd", "out"); !s) return s;
  return doVadd(n, a, b, out);
}

Status Device::reduceSum(uint64_t n, const Buffer& input, Buffer& out) {
  if (auto s = checkElements(input, n, "reduceSum", "input"); !s) return s;
  if (auto s = checkElements(out, 1, "reduceSum", "out"); !s) return s;
  return doReduceSum(n, input, out);
}

Status Device::tensor(const TensorOp& op) {
  auto lowered = lowerTensorOp(op);
  if (!lowered) return std::unexpected(lowered.error());
  if (lowered->empty) return {};
  return doTensor(*lowered);
}

Status Device::doTensor(const LoweredTensorOp&) {
  return fail(Code::unimplemented, "tensor ops are not supported by the " + caps_.backend + " backend");
}

ProgramDescription Program::describe() const {
  ProgramDescription d;
  for (auto& k : kernels()) d.kernels.push_back(KernelDescription{.name = k});
  return d;
}

// The encoding: little-endian u32 counts and lengths, u64 numbers, strings as
// (u32 length, bytes). Kernel: name, attributes, 7 u64 numbers, u32 arg count; argument:
// name, type name, u8 space, u8 access, u32 qualifiers, u32 size.
namespace {
class Writer {
 public:
  void u8(uint8_t v) { out.push_back(static_cast<char>(v)); }
  void u32(uint32_t v) { out.append(reinterpret_cast<const char*>(&v), 4); }
  void u64(uint64_t v) { out.append(reinterpret_cast<const char*>(&v), 8); }
  void str(std::string_view s) {
    u32(static_cast<uint32_t>(s.size()));
    out.append(s);
  }
  std::string out;
};
class Reader {
 public:
  explicit Reader(std::string_view in) : in_(in) {}
  bool ok = true;
  template <class T>
  T num() {
    T v{};
    if (in_.size() - at_ < sizeof v) {
      ok = false;
      return v;
    }
    std::memcpy(&v, in_.data() + at_, sizeof v);
    at_ += sizeof v;
    return v;
  }
  std::string str(size_t max) {
    uint32_t n = num<uint32_t>();
    if (!ok || n > in_.size() - at_) {
      ok = false;
      return {};
    }
    std::string s(in_.substr(at_, std::min<size_t>(n, max)));
    at_ += n;
    return s;
  }

 private:
  std::string_view in_;
  size_t at_ = 0;
};
}  // namespace

std::string encodeDescription(const ProgramDescription& d) {
  Writer w;
  w.str(d.buildLog);
  w.u32(static_cast<uint32_t>(d.kernels.size()));
  for (auto& k : d.kernels) {
    w.str(k.name);
    w.str(k.attributes);
    w.u64(k.workGroupSize);
    for (auto v : k.compileWorkGroupSize) w.u64(v);
    w.u64(k.localMemBytes);
    w.u64(k.privateMemBytes);
    w.u64(k.preferredMultiple);
    w.u32(static_cast<uint32_t>(k.args.size()));
    for (auto& a : k.args) {
      w.str(a.name);
      w.str(a.typeName);
      w.u8(static_cast<uint8_t>(a.space));
      w.u8(static_cast<uint8_t>(a.access));
      w.u32(a.typeQualifiers);
      w.u32(a.size);
    }
  }
  return std::move(w.out);
}

Result<ProgramDescription> decodeDescription(std::string_view bytes) {
  Reader r(bytes);
  ProgramDescription d;
  d.buildLog = r.str(kMaxBuildLog);
  uint32_t kernels = r.num<uint32_t>();
  for (uint32_t i = 0; r.ok && i < kernels && i < kMaxKernels; ++i) {
    KernelDescription k;
    k.name = r.str(kMaxNameBytes);
    k.attributes = r.str(kMaxNameBytes);
    k.workGroupSize = r.num<uint64_t>();
    for (auto& v : k.compileWorkGroupSize) v = r.num<uint64_t>();
    k.localMemBytes = r.num<uint64_t>();
    k.privateMemBytes = r.num<uint64_t>();
    k.preferredMultiple = r.num<uint64_t>();
    uint32_t args = r.num<uint32_t>();
    for (uint32_t j = 0; r.ok && j < args && j < kMaxKernelArgs; ++j) {
      KernelArgDescription a;
      a.name = r.str(kMaxNameBytes);
      a.typeName = r.str(kMaxNameBytes);
      uint8_t space = r.num<uint8_t>(), access = r.num<uint8_t>();
      a.typeQualifiers = r.num<uint32_t>();
      a.size = r.num<uint32_t>();
      if (space > 3 || access > 3) r.ok = false;
      a.space = static_cast<KernelArgDescription::Space>(space);
      a.access = static_cast<KernelArgDescription::Access>(access);
      k.args.push_back(std::move(a));
    }
    if (args > kMaxKernelArgs) r.ok = false;
    d.kernels.push_back(std::move(k));
  }
  if (kernels > kMaxKernels) r.ok = false;
  if (!r.ok) return fail(Code::internal, "a malformed program description");
  return d;
}

}  // namespace raccel::hal
