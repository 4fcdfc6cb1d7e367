#include "common/error.h"

#include <cmath>
#include <cstdlib>

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
  char* end = nullptr;
  double value = std::strtod(text.c_str(), &end);
  if (end == text.c_str() || value < 0 || !std::isfinite(value))
    return fail(Code::invalidArgument, "'" + text + "' is not a size (examples: 4096, 64KiB, 4MiB, 2GiB)");
  std::string unit(end);
  double scale = 1;
  if (unit.empty() || unit == "B") scale = 1;
  else if (unit == "KiB" || unit == "K" || unit == "k") scale = 1024.0;
  else if (unit == "MiB" || unit == "M") scale = 1024.0 * 1024;
  else if (unit == "GiB" || unit == "G") scale = 1024.0 * 1024 * 1024;
  else if (unit == "TiB" || unit == "T") scale = 1024.0 * 1024 * 1024 * 1024;
  else return fail(Code::invalidArgument, "'" + text + "': unknown size unit '" + unit + "' (use B, KiB, MiB, GiB, TiB)");
  return static_cast<unsigned long long>(value * scale);
}

}  // namespace raccel
