#include "common/log.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <unistd.h>

namespace raccel::log {
namespace {
std::atomic<int> gLevel{static_cast<int>(Level::info)};
const char* name(Level level) {
  switch (level) {
    case Level::debug: return "DEBUG";
    case Level::info: return "INFO";
    case Level::warn: return "WARN";
    case Level::error: return "ERROR";
  }
  return "?";
}
}  // namespace

void setLevel(Level level) { gLevel = static_cast<int>(level); }
Level level() { return static_cast<Level>(gLevel.load()); }

bool parseLevel(const std::string& text, Level* out) {
  if (text == "debug") *out = Level::debug;
  else if (text == "info") *out = Level::info;
  else if (text == "warn") *out = Level::warn;
  else if (text == "error") *out = Level::error;
  else return false;
  return true;
}

Line::Line(Level level, const char* component) : enabled_(static_cast<int>(level) >= gLevel.load()) {
  if (!enabled_) return;
  auto now = std::chrono::system_clock::now();
  std::time_t t = std::chrono::system_clock::to_time_t(now);
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
  std::tm tm;
  gmtime_r(&t, &tm);
  char stamp[32];
  std::snprintf(stamp, sizeof stamp, "%02d:%02d:%02d.%03d", tm.tm_hour, tm.tm_min, tm.tm_sec, static_cast<int>(ms));
  stream_ << stamp << ' ' << name(level) << ' ' << component << "[" << getpid() << "]: ";
}

Line::~Line() {
  if (!enabled_) return;
  stream_ << '\n';
  std::string text = stream_.str();
  (void)!::write(2, text.data(), text.size());
}

}  // namespace raccel::log
