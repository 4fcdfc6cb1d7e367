#include "bench/report.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "tests/cluster.h"

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

double processCpuMs(pid_t pid) {
  const std::string stat = testing::readFile("/proc/" + std::to_string(pid) + "/stat");
  const auto paren = stat.rfind(')');
  if (paren == std::string::npos || paren + 2 > stat.size()) return 0;
  std::istringstream in(stat.substr(paren + 2));
  std::string field;
  double ticks = 0;
  for (int i = 3; i <= 15 && in >> field; ++i)  // fields 14 and 15: utime, stime
    if (i >= 14) ticks += std::strtod(field.c_str(), nullptr);
  return ticks * 1000.0 / static_cast<double>(sysconf(_SC_CLK_TCK));
}

}  // namespace raccel::bench
