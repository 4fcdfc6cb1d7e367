#include "bench/report.h"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <thread>
#include <vector>

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

namespace {
// The fields of /proc/PID/stat after the process's name (which may hold spaces and
// parentheses: it ends at the last ')'), from field 3, the state; none when unreadable.
std::vector<std::string> statFields(const std::string& pid) {
  const std::string stat = testing::readFile("/proc/" + pid + "/stat");
  const auto paren = stat.rfind(')');
  std::vector<std::string> fields;
  if (paren == std::string::npos) return fields;
  std::istringstream in(stat.substr(paren + 1));
  for (std::string field; in >> field;) fields.push_back(field);
  return fields;
}

// Fields 14 and 15: user and system time, in clock ticks.
double cpuMsOf(const std::vector<std::string>& fields) {
  if (fields.size() < 13) return 0;
  const double ticks = std::strtod(fields[11].c_str(), nullptr) + std::strtod(fields[12].c_str(), nullptr);
  return ticks * 1000.0 / static_cast<double>(sysconf(_SC_CLK_TCK));
}

double cpuMsOfChildren(pid_t parent) {
  double ms = 0;
  std::error_code ec;
  for (auto it = std::filesystem::directory_iterator("/proc", ec); !ec && it != std::filesystem::directory_iterator();
       it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    const auto fields = statFields(name);  // field 4: the parent's pid
    if (fields.size() > 1 && std::strtol(fields[1].c_str(), nullptr, 10) == parent) ms += cpuMsOf(fields);
  }
  return ms;
}
}  // namespace

double processCpuMs(pid_t pid) { return cpuMsOf(statFields(std::to_string(pid))); }

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
