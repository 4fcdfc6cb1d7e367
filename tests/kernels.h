// Kernels the card tests run in each card's own language, one source of truth for
// them: `scale` computes x = x * s + i for i < n. It reads and writes the same buffer,
// so running it twice from the state after it would be wrong (what failover must avoid).
#pragma once

#include "common/kinds.h"

namespace raccel::testing {

struct ScaleKernel {
  ProgramKind kind;
  const char* source;
};

inline constexpr ScaleKernel kScaleOpenclC{ProgramKind::openclC,
                                           "__kernel void scale(float s, __global float* x, uint n) {\n"
                                           "  uint i = get_global_id(0);\n"
                                           "  if (i < n) x[i] = x[i] * s + (float)i;\n"
                                           "}\n"};

inline constexpr ScaleKernel kScaleCudaC{ProgramKind::cudaC,
                                         "extern \"C\" __global__ void scale(float s, float* x, unsigned n) {\n"
                                         "  unsigned i = blockIdx.x * blockDim.x + threadIdx.x;\n"
                                         "  if (i < n) x[i] = x[i] * s + (float)i;\n"
                                         "}\n"};

}  // namespace raccel::testing
