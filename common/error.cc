#include "common/error.h"

#include <cerrno>
#include <limits>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iterator>

namespace raccel {

const char* codeName(Code code) {
  switch (code) {
    case Code::ok: return "ok";
    case Code::invalidArgument: return "invalidArgument";
    case Code::notFound: return "notFound";
    case Code::resourceExhausted: return "resourceExhausted";
    case Code::unavailable: return "unavailable";
    case Code::unimplemented: return "unimplemented";
    case Code::permissionDenied: return "permissionDenied";
    case Code::internal: return "internal";
  }
  return "unknown";
}

Result<unsigned long long> parseBytes(const std::string& text) {
  auto bad = [&] { return fail(Code::invalidArgument, "'" + text + "' is not a size (examples: 4096, 64KiB, 4MiB, 2GiB)"); };
  size_t digits = 0;
  while (digits < text.size() && text[digits] >= '0' && text[digits] <= '9') ++digits;
  size_t numberEnd = digits;
  if (numberEnd < text.size() && text[numberEnd] == '.') {
    ++numberEnd;
    while (numberEnd < text.size() && text[numberEnd] >= '0' && text[numberEnd] <= '9') ++numberEnd;
  }
  if (digits == 0) return bad();
  std::string unit = text.substr(numberEnd);
  if (unit.size() > 1 && unit[0] == ' ') unit.erase(0, 1);
  unsigned long long scale = 1;
  if (unit.empty() || unit == "B") scale = 1;
  else if (unit == "KiB" || unit == "K" || unit == "k") scale = 1ull << 10;
  else if (unit == "MiB" || unit == "M") scale = 1ull << 20;
  else if (unit == "GiB" || unit == "G") scale = 1ull << 30;
  else if (unit == "TiB" || unit == "T") scale = 1ull << 40;
  else return fail(Code::invalidArgument, "'" + text + "': unknown size unit '" + unit + "' (use B, KiB, MiB, GiB, TiB)");
  auto tooBig = [&] {
    return fail(Code::invalidArgument, "'" + text + "' is larger than the largest size (" +
                                           std::to_string(std::numeric_limits<unsigned long long>::max()) + " bytes)");
  };
  if (numberEnd == digits) {  // an integer: exact, every 64-bit size included
    errno = 0;
    unsigned long long whole = std::strtoull(text.substr(0, digits).c_str(), nullptr, 10);
    unsigned long long out;
    if (errno == ERANGE || __builtin_mul_overflow(whole, scale, &out)) return tooBig();
    return out;
  }
  double value = std::strtod(text.substr(0, numberEnd).c_str(), nullptr) * double(scale);
  if (!std::isfinite(value)) return bad();
  if (value >= 18446744073709551616.0) return tooBig();
  return static_cast<unsigned long long>(value);
}

std::string formatBytes(unsigned long long bytes) {
  static const char* const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  unsigned unit = 0;
  while (unit + 1 < std::size(kUnits) && bytes >> (10 * (unit + 1)) != 0) ++unit;
  const unsigned long long scale = 1ull << (10 * unit);
  char text[48];
  if (bytes % scale == 0) std::snprintf(text, sizeof text, "%llu %s", bytes / scale, kUnits[unit]);
  else std::snprintf(text, sizeof text, "%.1f %s", static_cast<double>(bytes) / static_cast<double>(scale), kUnits[unit]);
  return text;
}

}  // namespace raccel
