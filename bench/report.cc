#include "bench/report.h"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <thread>

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

namespace {
// The parent's pid in /proc/PID/stat (the field after the state, after the name's ')').
pid_t parentOf(const std::string& statPath) {
  const std::string stat = testing::readFile(statPath);
  const auto paren = stat.rfind(')');
  if (paren == std::string::npos) return -1;
  std::istringstream in(stat.substr(paren + 1));
  std::string state;
  long ppid = -1;
  in >> state >> ppid;
  return static_cast<pid_t>(ppid);
}

double cpuMsOfChildren(pid_t parent) {
  double ms = 0;
  std::error_code ec;
  for (auto it = std::filesystem::directory_iterator("/proc", ec); !ec && it != std::filesystem::directory_iterator();
       it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    if (parentOf(it->path().string() + "/stat") == parent) ms += processCpuMs(static_cast<pid_t>(std::stol(name)));
  }
  return ms;
}
}  // namespace

double awaitIdleChildren(pid_t parent, double maxMs) {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  auto waited = [&] { return std::chrono::duration<double, std::milli>(Clock::now() - start).count(); };
  double before = cpuMsOfChildren(parent);
  for (int quiet = 0; quiet < 2 && waited() < maxMs;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    const double now = cpuMsOfChildren(parent);
    quiet = now - before < 2 ? quiet + 1 : 0;
    before = now;
  }
  return waited();
}

}  // namespace raccel::bench
