// Conversions between the wire enums (schema/*.capnp) and raccel's own values
// (common/). The one place these mappings live; any thread.
#pragma once

#include <optional>

#include "common/error.h"
#include "common/images.h"
#include "common/kinds.h"
#include "common/tensor_fns.h"
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

static_assert(uint16_t(wire::TensorType::F32) == uint16_t(TensorType::f32) &&
              uint16_t(wire::TensorType::I64) == uint16_t(TensorType::i64) &&
              uint16_t(wire::TensorType::BOOL) == uint16_t(TensorType::boolean) &&
              uint16_t(wire::TensorType::I32) == uint16_t(TensorType::i32) &&
              uint16_t(wire::TensorType::F64) == uint16_t(TensorType::f64) &&
              uint16_t(wire::TensorType::F16) == uint16_t(TensorType::f16) &&
              uint16_t(wire::TensorType::BF16) == uint16_t(TensorType::bf16) && kTensorTypes == 7);
inline wire::TensorType toWire(TensorType t) { return static_cast<wire::TensorType>(static_cast<uint16_t>(t)); }
// An unknown type keeps its number (truncated past 255 to one no type has), for the HAL to refuse.
inline TensorType fromWire(wire::TensorType t) {
  const auto v = static_cast<uint16_t>(t);
  return static_cast<TensorType>(v < kTensorTypes ? v : 0xff);
}

inline void setError(wire::Error::Builder out, const Error& e) {
  out.setCode(toWire(e.code));
  out.setMessage(e.message);
  out.setOpenclError(validOpenclError(e.openclError));
}
inline Error errorFrom(wire::Error::Reader in) {
  return Error{fromWire(in.getCode()), in.getMessage(), validOpenclError(in.getOpenclError())};
}

// Image limits and descriptors as they cross. Reading takes the numbers as they are (a
// list of formats only up to one past the most allowed, so checkLimits refuses it);
// checkLimits and checkImage judge them where they enter.
inline void setImageLimits(wire::ImageLimits::Builder out, const ImageLimits& l) {
  out.setMax2dWidth(l.max2dWidth);
  out.setMax2dHeight(l.max2dHeight);
  out.setMax3dWidth(l.max3dWidth);
  out.setMax3dHeight(l.max3dHeight);
  out.setMax3dDepth(l.max3dDepth);
  out.setMaxArraySize(l.maxArraySize);
  out.setMaxBufferPixels(l.maxBufferPixels);
  out.setMaxReadArgs(l.maxReadArgs);
  out.setMaxWriteArgs(l.maxWriteArgs);
  out.setMaxSamplers(l.maxSamplers);
  auto formats = out.initFormats(static_cast<unsigned>(l.formats.size()));
  for (unsigned i = 0; i < l.formats.size(); ++i) formats.set(i, l.formats[i]);
}
inline ImageLimits imageLimitsFrom(wire::ImageLimits::Reader in) {
  ImageLimits l{in.getMax2dWidth(), in.getMax2dHeight(), in.getMax3dWidth(), in.getMax3dHeight(), in.getMax3dDepth(),
                in.getMaxArraySize(), in.getMaxBufferPixels(), in.getMaxReadArgs(), in.getMaxWriteArgs(),
                in.getMaxSamplers(), {}};
  for (auto key : in.getFormats()) {
    if (l.formats.size() > image::kMaxFormats) break;
    l.formats.push_back(key);
  }
  return l;
}
inline void setImageArg(wire::ImageArg::Builder out, uint64_t buffer, uint64_t offset, const ImageDesc& d) {
  out.setBuffer(buffer);
  out.setOffset(offset);
  out.setType(d.type);
  out.setChannelOrder(d.channelOrder);
  out.setChannelType(d.channelType);
  out.setWidth(d.width);
  out.setHeight(d.height);
  out.setDepth(d.depth);
  out.setArraySize(d.arraySize);
}
inline ImageDesc imageDescFrom(wire::ImageArg::Reader in) {
  return ImageDesc{in.getType(), in.getChannelOrder(), in.getChannelType(), 0,
                   in.getWidth(), in.getHeight(), in.getDepth(), in.getArraySize()};
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
