// OpenCL C compilation units as they cross to a card (ProgramKind::openclUnits): each
// unit's source, its compile options and the headers it includes by name. The card
// compiles every unit and, unless only compiling, links them (OpenCL's
// clCompileProgram and clLinkProgram, done by the card's own driver). The byte form is
// the guest's: decode() checks every length against what is left and bounds the counts.
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "common/error.h"

namespace raccel {

struct ProgramUnit {
  std::string source;
  std::string options;  // clCompileProgram's
  std::vector<std::pair<std::string, std::string>> headers;  // include name, its source
};

struct ProgramUnits {
  bool compileOnly = false;  // compile each unit, link nothing (a compiled object)
  std::vector<ProgramUnit> units;
};

inline constexpr size_t kMaxProgramUnits = 64;
inline constexpr size_t kMaxUnitHeaders = 64;

std::vector<std::byte> encodeUnits(const ProgramUnits& units);
Result<ProgramUnits> decodeUnits(std::span<const std::byte> bytes);

}  // namespace raccel
