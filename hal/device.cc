#include "hal/device.h"

#include "common/limits.h"

#include <algorithm>
#include <cstring>

namespace raccel::hal {
namespace {
constexpr uint64_t kF32 = sizeof(float);
}  // namespace

Status checkBytes(const Buffer& buffer, uint64_t offset, uint64_t length, const char* what) {
  if (offset > buffer.size() || length > buffer.size() - offset)
    return fail(Code::invalidArgument, std::string(what) + " of " + std::to_string(length) + " bytes at offset " +
                                           std::to_string(offset) + " is past the end of a " +
                                           std::to_string(buffer.size()) + "-byte buffer");
  return {};
}

Status checkFloats(const Buffer& buffer, uint64_t n, const char* op, const char* arg) {
  if (n > buffer.size() / kF32)
    return fail(Code::invalidArgument, std::string(op) + ": " + arg + " holds " + std::to_string(buffer.size() / kF32) +
                                           " floats, " + std::to_string(n) + " needed");
  return {};
}

Status checkGemm(const GemmArgs& g) {
  if (!g.a || !g.b || !g.c) return fail(Code::invalidArgument, "gemm: a, b and c must be buffers");
  if (g.m == 0 || g.n == 0 || g.k == 0) return fail(Code::invalidArgument, "gemm: m, n and k must be nonzero");
  if (auto s = checkFloats(*g.a, uint64_t{g.m} * g.k, "gemm", "a"); !s) return s;
  if (auto s = checkFloats(*g.b, uint64_t{g.k} * g.n, "gemm", "b"); !s) return s;
  if (auto s = checkFloats(*g.c, uint64_t{g.m} * g.n, "gemm", "c"); !s) return s;
  if (g.c == g.a || g.c == g.b) return fail(Code::invalidArgument, "gemm: c must not alias a or b");
  return {};
}

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
  if (auto s = checkBytes(buffer, offset, data.size(), "write"); !s) return s;
  return doWrite(buffer, offset, data);
}

Status Device::read(const Buffer& buffer, uint64_t offset, std::span<std::byte> out) {
  if (auto s = checkBytes(buffer, offset, out.size(), "read"); !s) return s;
  return doRead(buffer, offset, out);
}

Status Device::copy(Buffer& dst, uint64_t dstOffset, const Buffer& src, uint64_t srcOffset, uint64_t length) {
  if (auto s = checkBytes(src, srcOffset, length, "copy source"); !s) return s;
  if (auto s = checkBytes(dst, dstOffset, length, "copy destination"); !s) return s;
  return doCopy(dst, dstOffset, src, srcOffset, length);
}

Status Device::fill(Buffer& buffer, uint64_t offset, uint64_t length, uint8_t value) {
  if (auto s = checkBytes(buffer, offset, length, "fill"); !s) return s;
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

namespace {

// One argument of a launch: why it is refused, said after "argument i" (" is a null
// buffer", ": offset ..."), or what it adds to the launch's local and by-value bytes.
Status checkArg(const Capabilities& caps, const KernelArg& arg, uint64_t& localBytes, uint64_t& valueBytes) {
  auto bad = [](const std::string& why) { return fail(Code::invalidArgument, why); };
  switch (arg.type) {
    case KernelArg::Type::buffer:
      if (arg.buffer == nullptr) return bad(" is a null buffer");
      if (arg.offset >= arg.buffer->size())
        return bad(": offset " + std::to_string(arg.offset) + " is past the end of a " + std::to_string(arg.buffer->size()) +
                   "-byte buffer");
      return {};
    case KernelArg::Type::bytes:
      if (arg.bytes.empty() || arg.bytes.size() > kMaxArgBytes)
        return bad(": " + std::to_string(arg.bytes.size()) + " bytes by value (1 to " + std::to_string(kMaxArgBytes) + ")");
      valueBytes = limits::satAdd(valueBytes, arg.bytes.size());
      return {};
    case KernelArg::Type::local:
      if (arg.scalar.u32 == 0) return bad(": a local array of 0 bytes");
      localBytes = limits::satAdd(localBytes, arg.scalar.u32);
      return {};
    case KernelArg::Type::image: {
      if (arg.buffer == nullptr) return bad(" is an image of a null buffer");
      if (auto s = checkImage(arg.image, caps.images); !s) return fail(s.error().code, ": " + s.error().message);
      const uint64_t bytes = imageBytes(arg.image);
      if (arg.offset > arg.buffer->size() || bytes > arg.buffer->size() - arg.offset)
        return bad(": an image of " + std::to_string(bytes) + " bytes from offset " + std::to_string(arg.offset) +
                   " does not fit its " + std::to_string(arg.buffer->size()) + "-byte buffer");
      return {};
    }
    case KernelArg::Type::sampler:
      if (!caps.images.supported()) return fail(Code::unimplemented, " is a sampler, and this card has no image support");
      if (auto s = decodeSampler(arg.scalar.u32); !s) return bad(": " + s.error().message);
      valueBytes = limits::satAdd(valueBytes, 8);
      return {};
    default:
      valueBytes = limits::satAdd(valueBytes, 8);
      return {};
  }
}

// The launch's grid: why it is refused (past its work dimensions, empty or too large
// work-groups, an offset that overflows).
Status checkDims(const Capabilities& caps, const LaunchDims& dims) {
  auto bad = [](const std::string& why) { return fail(Code::invalidArgument, why); };
  if (dims.workDim > 3) return bad("work dimensions of " + std::to_string(dims.workDim) + " (1 to 3)");
  for (int d = dims.workDim ? dims.workDim : 3; d < 3; ++d)
    if (dims.grid[d] != 1 || (!dims.autoBlock && dims.block[d] != 1) || dims.offset[d] != 0)
      return bad("dimension " + std::to_string(d) + " is past the launch's " + std::to_string(dims.workDim) +
                 " work dimension(s) and must be 1 wide at offset 0");
  uint64_t groupSize = 1;
  for (int d = 0; d < 3; ++d) {
    if (!dims.autoBlock && dims.block[d] == 0) return bad("a work-group (block) size of 0 in dimension " + std::to_string(d));
    groupSize = limits::satMul(groupSize, dims.autoBlock ? 1 : dims.block[d]);
    const uint64_t items = limits::satMul(dims.grid[d], dims.autoBlock ? 1 : dims.block[d]);
    if (dims.offset[d] > UINT64_MAX - items) return bad("offset plus size overflows in dimension " + std::to_string(d));
  }
  if (caps.maxWorkGroupSize && groupSize > caps.maxWorkGroupSize)
    return bad("work-groups (blocks) of " + std::to_string(groupSize) + " items; this card runs at most " +
               std::to_string(caps.maxWorkGroupSize));
  return {};
}

}  // namespace

Status checkLaunch(const Capabilities& caps, const std::string& kernel, const LaunchDims& dims,
                   std::span<const KernelArg> args) {
  auto bad = [&](Code code, const std::string& why) { return fail(code, "launch of " + limits::clip(kernel, 64) + ": " + why); };
  if (args.size() > kMaxKernelArgs)
    return bad(Code::invalidArgument, std::to_string(args.size()) + " arguments (at most " + std::to_string(kMaxKernelArgs) + ")");
  uint64_t localBytes = dims.sharedBytes, valueBytes = 0;
  for (size_t i = 0; i < args.size(); ++i)
    if (auto s = checkArg(caps, args[i], localBytes, valueBytes); !s)
      return bad(s.error().code, "argument " + std::to_string(i) + s.error().message);
  if (valueBytes > kMaxArgBytes)
    return bad(Code::invalidArgument,
               std::to_string(valueBytes) + " bytes of arguments by value (at most " + std::to_string(kMaxArgBytes) + ")");
  if (caps.localMemBytes && localBytes > caps.localMemBytes)
    return bad(Code::invalidArgument, std::to_string(localBytes) + " bytes of local (shared) memory asked; this card has " +
                                          std::to_string(caps.localMemBytes) + " per work-group");
  if (auto s = checkDims(caps, dims); !s) return bad(s.error().code, s.error().message);
  return {};
}

Status Device::launch(Program& program, const std::string& kernel, const LaunchDims& dims,
                      std::span<const KernelArg> args) {
  if (auto s = checkLaunch(caps_, kernel, dims, args); !s) return s;
  if (program.kind() == ProgramKind::builtin) {
    for (auto& arg : args)
      if (arg.type == KernelArg::Type::local || arg.type == KernelArg::Type::bytes || arg.type == KernelArg::Type::image ||
          arg.type == KernelArg::Type::sampler || (arg.type == KernelArg::Type::buffer && arg.offset != 0))
        return fail(Code::invalidArgument, "built-in kernel " + kernel + " takes whole buffers and scalars only");
    return launchBuiltin(kernel, args);
  }
  return doLaunch(program, kernel, dims, args);
}

Status Device::doLaunch(Program& program, const std::string&, const LaunchDims&, std::span<const KernelArg>) {
  return fail(Code::unimplemented, std::string("launching ") + programKindName(program.kind()) +
                                       " kernels is not supported by " + caps_.backend);
}

const char* builtinName(BuiltinOp::Fn fn) {
  switch (fn) {
    case BuiltinOp::Fn::gemm: return "gemm";
    case BuiltinOp::Fn::axpy: return "axpy";
    case BuiltinOp::Fn::vadd: return "vadd";
    case BuiltinOp::Fn::reduceSum: return "reduceSum";
  }
  return "unknown";
}

// Built-in kernels by name, with their arguments in the order of the op's fields.
Result<BuiltinOp> parseBuiltin(const std::string& kernel, std::span<const KernelArg> args) {
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
  BuiltinOp op;
  if (kernel == "gemm") {
    if (auto s = expect({T::u32, T::u32, T::u32, T::f32, T::f32, T::buffer, T::buffer, T::buffer},
                        "u32 m, u32 n, u32 k, f32 alpha, f32 beta, buffer a, buffer b, buffer c");
        !s)
      return std::unexpected(s.error());
    op.fn = BuiltinOp::Fn::gemm;
    op.gemm = GemmArgs{args[0].scalar.u32, args[1].scalar.u32, args[2].scalar.u32, args[3].scalar.f32,
                       args[4].scalar.f32, args[5].buffer, args[6].buffer, args[7].buffer};
    return op;
  }
  if (kernel == "axpy") {
    if (auto s = expect({T::u64, T::f32, T::buffer, T::buffer}, "u64 n, f32 alpha, buffer x, buffer y"); !s)
      return std::unexpected(s.error());
    op.fn = BuiltinOp::Fn::axpy;
    op.n = args[0].scalar.u64, op.alpha = args[1].scalar.f32, op.x = args[2].buffer, op.y = args[3].buffer;
    return op;
  }
  if (kernel == "vadd") {
    if (auto s = expect({T::u64, T::buffer, T::buffer, T::buffer}, "u64 n, buffer a, buffer b, buffer out"); !s)
      return std::unexpected(s.error());
    op.fn = BuiltinOp::Fn::vadd;
    op.n = args[0].scalar.u64, op.x = args[1].buffer, op.y = args[2].buffer, op.out = args[3].buffer;
    return op;
  }
  if (kernel == "reduceSum") {
    if (auto s = expect({T::u64, T::buffer, T::buffer}, "u64 n, buffer input, buffer out"); !s)
      return std::unexpected(s.error());
    op.fn = BuiltinOp::Fn::reduceSum;
    op.n = args[0].scalar.u64, op.x = args[1].buffer, op.out = args[2].buffer;
    return op;
  }
  return fail(Code::notFound, "no kernel '" + kernel + "' in " + kBuiltinLibrary + " (it has gemm, axpy, vadd, reduceSum)");
}

Status checkBuiltin(const BuiltinOp& op) {
  const char* name = builtinName(op.fn);
  switch (op.fn) {
    case BuiltinOp::Fn::gemm: return checkGemm(op.gemm);
    case BuiltinOp::Fn::axpy:
      if (!op.x || !op.y) return fail(Code::invalidArgument, "axpy: x and y must be buffers");
      if (auto s = checkFloats(*op.x, op.n, name, "x"); !s) return s;
      return checkFloats(*op.y, op.n, name, "y");
    case BuiltinOp::Fn::vadd:
      if (!op.x || !op.y || !op.out) return fail(Code::invalidArgument, "vadd: a, b and out must be buffers");
      if (auto s = checkFloats(*op.x, op.n, name, "a"); !s) return s;
      if (auto s = checkFloats(*op.y, op.n, name, "b"); !s) return s;
      return checkFloats(*op.out, op.n, name, "out");
    case BuiltinOp::Fn::reduceSum:
      if (!op.x || !op.out) return fail(Code::invalidArgument, "reduceSum: input and out must be buffers");
      if (auto s = checkFloats(*op.x, op.n, name, "input"); !s) return s;
      return checkFloats(*op.out, 1, name, "out");
  }
  return fail(Code::invalidArgument, "unknown built-in op");
}

Status Device::launchBuiltin(const std::string& kernel, std::span<const KernelArg> args) {
  auto op = parseBuiltin(kernel, args);
  if (!op) return std::unexpected(op.error());
  return run(*op);
}

Status Device::run(const BuiltinOp& op) {
  if (auto s = checkBuiltin(op); !s) return s;
  switch (op.fn) {
    case BuiltinOp::Fn::gemm: return doGemm(op.gemm);
    case BuiltinOp::Fn::axpy: return doAxpy(op.n, op.alpha, *op.x, *op.y);
    case BuiltinOp::Fn::vadd: return doVadd(op.n, *op.x, *op.y, *op.out);
    case BuiltinOp::Fn::reduceSum: return doReduceSum(op.n, *op.x, *op.out);
  }
  return fail(Code::invalidArgument, "unknown built-in op");
}

Status Device::gemm(const GemmArgs& g) {
  BuiltinOp op;
  op.fn = BuiltinOp::Fn::gemm, op.gemm = g;
  return run(op);
}

Status Device::axpy(uint64_t n, float alpha, const Buffer& x, Buffer& y) {
  BuiltinOp op;
  op.fn = BuiltinOp::Fn::axpy, op.n = n, op.alpha = alpha, op.x = const_cast<Buffer*>(&x), op.y = &y;
  return run(op);
}

Status Device::vadd(uint64_t n, const Buffer& a, const Buffer& b, Buffer& out) {
  BuiltinOp op;
  op.fn = BuiltinOp::Fn::vadd, op.n = n, op.x = const_cast<Buffer*>(&a), op.y = const_cast<Buffer*>(&b), op.out = &out;
  return run(op);
}

Status Device::reduceSum(uint64_t n, const Buffer& input, Buffer& out) {
  BuiltinOp op;
  op.fn = BuiltinOp::Fn::reduceSum, op.n = n, op.x = const_cast<Buffer*>(&input), op.out = &out;
  return run(op);
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
  w.u8(d.argumentsKnown ? 1 : 0);
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
  uint8_t argumentsKnown = r.num<uint8_t>();
  if (argumentsKnown > 1) r.ok = false;
  d.argumentsKnown = argumentsKnown == 1;
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
