#include "bench/report.h"

#include <cmath>
#include <cstdio>

namespace raccel::bench {

std::string jsonSafe(std::string text) {
  for (char& c : text)
    if (c == '"' || c == '\\' || static_cast<unsigned char>(c) < 0x20) c = ' ';
  return text;
}

std::string jsonNumber(double v, const char* fmt, bool signedOk) {
  if (std::isnan(v) || (v < 0 && !signedOk)) return "null";
  char b[32];
  std::snprintf(b, sizeof b, fmt, v);
  return b;
}

}  // namespace raccel::bench
