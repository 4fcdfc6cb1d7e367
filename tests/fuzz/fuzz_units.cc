// libFuzzer target: the byte form of OpenCL compilation units (common/program_units.h),
// as a guest may send it in a loadProgram of kind openclUnits. Whatever decodes must
// encode to the same bytes and decode to the same units again.
#include <cstdint>
#include <cstdlib>
#include <span>

#include "common/program_units.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto bytes = std::as_bytes(std::span(data, size));
  auto units = raccel::decodeUnits(bytes);
  if (!units) return 0;
  auto again = raccel::encodeUnits(*units);
  if (again.size() != bytes.size() || !std::equal(again.begin(), again.end(), bytes.begin())) std::abort();
  return 0;
}
