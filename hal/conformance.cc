#include "hal/conformance.h"

namespace raccel::hal {

std::vector<Backend> discoveredBackends(const std::string& backend, const DeviceOverrides& overrides,
                                        std::optional<SampleProgram> sample) {
  std::vector<Backend> out;
  for (auto& d : discover(backend).devices) {
    unsigned index = d.index;
    out.push_back({backend + std::to_string(index), [=] { return openDevice(backend, index, overrides); }, sample});
  }
  return out;
}

SampleProgram openclSample() {
  return {ProgramKind::openclC,
          "__kernel void scale(float s, __global float* x, uint n) {\n"
          "  uint i = get_global_id(0);\n"
          "  if (i < n) x[i] *= s;\n"
          "}\n",
          "__kernel void scale(float s, __global float* x, uint n) {\n"
          "  x[get_global_id(0)] = undeclared_thing * s\n"
          "}\n"};
}

SampleProgram cudaSample() {
  return {ProgramKind::cudaC,
          "extern \"C\" __global__ void scale(float s, float* x, unsigned n) {\n"
          "  unsigned i = blockIdx.x * blockDim.x + threadIdx.x;\n"
          "  if (i < n) x[i] *= s;\n"
          "}\n",
          "extern \"C\" __global__ void scale(float s, float* x, unsigned n) {\n"
          "  x[threadIdx.x] = undeclared_thing * s\n"
          "}\n"};
}

}  // namespace raccel::hal
