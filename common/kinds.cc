#include "common/kinds.h"

namespace raccel {

const char* kindName(CardKind kind) {
  switch (kind) {
    case CardKind::gpu: return "gpu";
    case CardKind::npu: return "npu";
    case CardKind::fpga: return "fpga";
    case CardKind::cpu: return "cpu";
  }
  return "?";
}

Result<CardKind> parseKind(const std::string& text) {
  if (text == "gpu") return CardKind::gpu;
  if (text == "npu") return CardKind::npu;
  if (text == "fpga") return CardKind::fpga;
  if (text == "cpu") return CardKind::cpu;
  return fail(Code::invalidArgument, "unknown card kind '" + text + "' (use gpu, npu, fpga or cpu)");
}

const char* programKindName(ProgramKind kind) {
  switch (kind) {
    case ProgramKind::builtin: return "builtin";
    case ProgramKind::ptx: return "ptx";
    case ProgramKind::cubin: return "cubin";
    case ProgramKind::xclbin: return "xclbin";
    case ProgramKind::openclC: return "openclC";
    case ProgramKind::spirv: return "spirv";
    case ProgramKind::cudaC: return "cudaC";
    case ProgramKind::openclUnits: return "openclUnits";
  }
  return "?";
}

}  // namespace raccel
