#include "hal/xrt/xrt_device.h"

#include <experimental/xrt_system.h>
#include <experimental/xrt_xclbin.h>
#include <xrt/xrt_bo.h>
#include <xrt/xrt_device.h>
#include <xrt/xrt_kernel.h>

#include <algorithm>
#include <cstdlib>
#include <map>

namespace raccel::hal {
namespace {

constexpr uint64_t kDefaultMemory = 4ull << 30;

class XrtBuffer final : public Buffer {
 public:
  XrtBuffer(uint64_t size, xrt::bo bo) : Buffer(size), bo(std::move(bo)) {}
  xrt::bo bo;
};
xrt::bo& boOf(Buffer& b) { return static_cast<XrtBuffer&>(b).bo; }
const xrt::bo& boOf(const Buffer& b) { return static_cast<const XrtBuffer&>(b).bo; }

class XrtProgram final : public Program {
 public:
  XrtProgram(std::string name, xrt::uuid uuid, std::vector<std::string> names)
      : Program(std::move(name), ProgramKind::xclbin), uuid(uuid), names(std::move(names)) {}
  std::vector<std::string> kernels() const override { return names; }
  xrt::uuid uuid;
  std::vector<std::string> names;
  std::map<std::string, xrt::kernel> cache;
};

// Every XRT call may throw; a backend answers with Status instead.
template <class F>
Status guarded(const char* what, F&& f) {
  try {
    return f();
  } catch (const std::exception& e) {
    return fail(Code::internal, std::string(what) + ": " + e.what());
  }
}

class XrtDevice final : public Device {
 public:
  XrtDevice(Capabilities caps, xrt::device device) : Device(std::move(caps)), device_(std::move(device)) {}

  Status finish() override { return {}; }  // every operation below completes before it returns

 protected:
  Result<std::unique_ptr<Buffer>> doAllocate(uint64_t bytes) override {
    std::unique_ptr<Buffer> out;
    auto s = guarded("allocating a buffer object", [&]() -> Status {
      xrt::bo bo(device_, bytes, xrt::bo::flags::normal, group_);
      std::fill_n(bo.map<char*>(), bytes, 0);
      bo.sync(XCL_BO_SYNC_BO_TO_DEVICE);
      out = std::make_unique<XrtBuffer>(bytes, std::move(bo));
      return {};
    });
    if (!s) return fail(Code::resourceExhausted, s.error().message);
    return out;
  }
  Status doWrite(Buffer& b, uint64_t offset, std::span<const std::byte> data) override {
    return guarded("write", [&]() -> Status {
      boOf(b).write(data.data(), data.size(), offset);
      boOf(b).sync(XCL_BO_SYNC_BO_TO_DEVICE, data.size(), offset);
      return {};
    });
  }
  Status doRead(const Buffer& b, uint64_t offset, std::span<std::byte> out) override {
    return guarded("read", [&]() -> Status {
      auto bo = boOf(b);
      bo.sync(XCL_BO_SYNC_BO_FROM_DEVICE, out.size(), offset);
      bo.read(out.data(), out.size(), offset);
      return {};
    });
  }
  Status doCopy(Buffer& dst, uint64_t dstOffset, const Buffer& src, uint64_t srcOffset, uint64_t length) override {
    if (length == 0) return {};
    return guarded("copy", [&]() -> Status {
      boOf(dst).copy(boOf(src), length, srcOffset, dstOffset);
      return {};
    });
  }
  Status doFill(Buffer& b, uint64_t offset, uint64_t length, uint8_t value) override {
    if (length == 0) return {};
    return guarded("fill", [&]() -> Status {
      std::fill_n(boOf(b).map<uint8_t*>() + offset, length, value);
      boOf(b).sync(XCL_BO_SYNC_BO_TO_DEVICE, length, offset);
      return {};
    });
  }
  Result<std::unique_ptr<Program>> doLoadProgram(ProgramKind kind, const std::string& name,
                                                 std::span<const std::byte> code, const std::string&) override {
    std::unique_ptr<Program> out;
    auto s = guarded("loading the xclbin", [&]() -> Status {
      std::vector<char> image(reinterpret_cast<const char*>(code.data()), reinterpret_cast<const char*>(code.data()) + code.size());
      xrt::xclbin xclbin(image);
      auto uuid = device_.load_xclbin(xclbin);
      std::vector<std::string> names;
      for (auto& k : xclbin.get_kernels()) names.push_back(k.get_name());
      out = std::make_unique<XrtProgram>(name, uuid, names);
      return {};
    });
    if (!s) return fail(Code::invalidArgument, "program '" + name + "': " + s.error().message);
    return out;
  }
  Status doLaunch(Program& program, const std::string& kernel, const LaunchDims&, std::span<const KernelArg> args) override {
    auto& p = static_cast<XrtProgram&>(program);
    if (std::find(p.names.begin(), p.names.end(), kernel) == p.names.end()) {
      std::string have;
      for (auto& n : p.names) have += (have.empty() ? "" : ", ") + n;
      return fail(Code::notFound, "no kernel '" + kernel + "' in xclbin '" + p.name() + "' (it has: " + have + ")");
    }
    return guarded("running the kernel", [&]() -> Status {
      auto it = p.cache.find(kernel);
      if (it == p.cache.end()) it = p.cache.emplace(kernel, xrt::kernel(device_, p.uuid, kernel)).first;
      xrt::run run(it->second);
      for (size_t i = 0; i < args.size(); ++i) {
        const KernelArg& a = args[i];
        int index = static_cast<int>(i);
        switch (a.type) {
          case KernelArg::Type::buffer:
            if (a.offset == 0) run.set_arg(index, boOf(*a.buffer));
            else run.set_arg(index, xrt::bo(boOf(*a.buffer), a.buffer->size() - a.offset, a.offset));
            break;
          case KernelArg::Type::bytes: run.set_arg(index, static_cast<const void*>(a.bytes.data()), a.bytes.size()); break;
          case KernelArg::Type::local:
            return fail(Code::invalidArgument, "kernel " + kernel + " argument " + std::to_string(i) +
                                                   ": FPGA kernels take no local-array arguments");
          case KernelArg::Type::image: case KernelArg::Type::sampler:
            return fail(Code::unimplemented, "kernel " + kernel + " argument " + std::to_string(i) +
                                                 ": FPGA kernels take no images or samplers");
          case KernelArg::Type::u32: run.set_arg(index, a.scalar.u32); break;
          case KernelArg::Type::i32: run.set_arg(index, a.scalar.i32); break;
          case KernelArg::Type::f32: run.set_arg(index, a.scalar.f32); break;
          case KernelArg::Type::u64: run.set_arg(index, a.scalar.u64); break;
          case KernelArg::Type::i64: run.set_arg(index, a.scalar.i64); break;
          case KernelArg::Type::f64: run.set_arg(index, a.scalar.f64); break;
        }
      }
      run.start();
      run.wait();
      return {};
    });
  }
  Status doGemm(const GemmArgs&) override { return noBuiltins(); }
  Status doAxpy(uint64_t, float, const Buffer&, Buffer&) override { return noBuiltins(); }
  Status doVadd(uint64_t, const Buffer&, const Buffer&, Buffer&) override { return noBuiltins(); }
  Status doReduceSum(uint64_t, const Buffer&, Buffer&) override { return noBuiltins(); }

 private:
  Status noBuiltins() const {
    return fail(Code::unimplemented, "the built-in ops need a bitstream; this FPGA card (xrt) runs xclbin programs only");
  }
  xrt::device device_;
  xrt::memory_group group_ = 0;
};

}  // namespace

std::vector<DeviceInfo> enumerateXrtDevices(std::string* note) {
  std::vector<DeviceInfo> out;
  unsigned count = 0;
#ifdef RACCEL_XRT_HOME
  setenv("XILINX_XRT", RACCEL_XRT_HOME, 0);  // an operator's own setting wins
#endif
  try {
    count = xrt::system::enumerate_devices();
  } catch (const std::exception& e) {
    if (note) *note = std::string("XRT could not enumerate devices: ") + e.what();
    return out;
  }
  if (count == 0 && note) *note = "XRT sees no FPGA card";
  for (unsigned i = 0; i < count; ++i) {
    DeviceInfo info;
    info.backend = "xrt";
    info.index = i;
    info.kind = CardKind::fpga;
    info.memoryBytes = kDefaultMemory;
    try {
      info.model = xrt::device(i).get_info<xrt::info::device::name>();
    } catch (const std::exception& e) {
      info.model = "xilinx (unreadable: " + std::string(e.what()) + ")";
    }
    out.push_back(info);
  }
  return out;
}

Result<std::unique_ptr<Device>> openXrtDevice(unsigned index, const DeviceOverrides& overrides) {
  std::string note;
  auto devices = enumerateXrtDevices(&note);
  if (index >= devices.size()) return fail(noSuchDevice("XRT", index, devices.size(), note));
  Capabilities caps;
  caps.kind = CardKind::fpga;
  caps.model = devices[index].model;
  caps.backend = "xrt";
  caps.tflops = 1;
  caps.memoryBytes = kDefaultMemory;
  caps.programKinds = {ProgramKind::xclbin};
  applyOverrides(caps, overrides);
  // XRT 2.13 does not report the card's memory, so the config's figure replaces the
  // default rather than only shrinking it.
  if (overrides.memoryBytes) caps.memoryBytes = *overrides.memoryBytes;
  try {
    return std::unique_ptr<Device>(new XrtDevice(caps, xrt::device(index)));
  } catch (const std::exception& e) {
    return fail(Code::unavailable, "opening XRT device " + std::to_string(index) + ": " + e.what());
  }
}

}  // namespace raccel::hal
