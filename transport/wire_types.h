// Conversions between the wire enums (schema/*.capnp) and raccel's own values
// (common/). The one place these mappings live; any thread.
#pragma once

#include <optional>

#include "common/error.h"
#include "common/kinds.h"
#include "schema/frame.capnp.h"
#include "schema/guest.capnp.h"

namespace raccel::transport {

inline wire::CardKind toWire(CardKind k) { return static_cast<wire::CardKind>(static_cast<uint16_t>(k)); }
inline CardKind fromWire(wire::CardKind k) { return static_cast<CardKind>(static_cast<uint16_t>(k)); }
inline wire::ProgramKind toWire(ProgramKind k) { return static_cast<wire::ProgramKind>(static_cast<uint16_t>(k)); }
inline ProgramKind fromWire(wire::ProgramKind k) { return static_cast<ProgramKind>(static_cast<uint16_t>(k)); }
inline wire::ErrorCode toWire(Code c) { return static_cast<wire::ErrorCode>(static_cast<uint16_t>(c)); }
inline Code fromWire(wire::ErrorCode c) {
  auto v = static_cast<uint16_t>(c);
  return v <= static_cast<uint16_t>(Code::internal) ? static_cast<Code>(v) : Code::internal;
}
inline bool validKind(wire::CardKind k) { return static_cast<uint16_t>(k) <= static_cast<uint16_t>(wire::CardKind::CPU); }
inline bool validProgramKind(wire::ProgramKind k) {
  return static_cast<uint16_t>(k) <= static_cast<uint16_t>(wire::ProgramKind::OPENCL_UNITS);
}

inline void setError(wire::Error::Builder out, const Error& e) {
  out.setCode(toWire(e.code));
  out.setMessage(e.message);
  out.setOpenclError(validOpenclError(e.openclError));
}
inline Error errorFrom(wire::Error::Reader in) {
  return Error{fromWire(in.getCode()), in.getMessage(), validOpenclError(in.getOpenclError())};
}

// The handle an instruction creates (alloc, loadProgram), if any: the one poisoned when
// the instruction fails.
inline std::optional<uint64_t> handleCreatedBy(wire::Instruction::Reader in) {
  switch (in.which()) {
    case wire::Instruction::ALLOC: return in.getAlloc().getHandle();
    case wire::Instruction::LOAD_PROGRAM: return in.getLoadProgram().getHandle();
    default: return std::nullopt;
  }
}

}  // namespace raccel::transport
