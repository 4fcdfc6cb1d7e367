#include "hal/device.h"

#include <algorithm>

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
                                                     std::span<const std::byte> code) {
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
  return doLoadProgram(kind, name, code);
}

Result<std::unique_ptr<Program>> Device::doLoadProgram(ProgramKind kind, const std::string&, std::span<const std::byte>) {
  return fail(Code::unimplemented, std::string(programKindName(kind)) + " programs are not supported by " + caps_.backend);
}

Status Device::launch(Program& program, const std::string& kernel, const LaunchDims& dims,
                      std::span<const KernelArg> args) {
  for (auto& arg : args)
    if (arg.type == KernelArg::Type::buffer && arg.buffer == nullptr)
      return fail(Code::invalidArgument, "kernel argument is a null buffer");
  if (program.kind() == ProgramKind::builtin) return launchBuiltin(kernel, args);
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

}  // namespace raccel::hal
