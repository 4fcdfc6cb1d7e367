// Card kinds and program kinds: the vocabulary shared by hal, the pool and the wire
// conversions (transport/wire_types.h). Plain values; any thread.
#pragma once

#include <string>

#include "common/error.h"

namespace raccel {

// Order matters: blocks of a node are numbered in this order (docs/ARCHITECTURE.md).
enum class CardKind { gpu, npu, fpga, cpu };
// openclUnits: OpenCL C compilation units with their headers (common/program_units.h),
// compiled and linked on the card.
enum class ProgramKind { builtin, ptx, cubin, xclbin, openclC, spirv, cudaC, openclUnits };

const char* kindName(CardKind kind);
Result<CardKind> parseKind(const std::string& text);
const char* programKindName(ProgramKind kind);

}  // namespace raccel
