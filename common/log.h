// Structured one-line logs on stderr: `time level component: message key=value ...`.
// Thread-safe (each line is written with one call). The level is process-wide.
#pragma once

#include <sstream>
#include <string>

namespace raccel::log {

enum class Level { debug = 0, info, warn, error };

void setLevel(Level level);
Level level();
// Parses "debug|info|warn|error"; returns false on anything else.
bool parseLevel(const std::string& text, Level* out);

class Line {
 public:
  Line(Level level, const char* component);
  ~Line();
  template <class T>
  Line& operator<<(const T& value) {
    if (enabled_) stream_ << value;
    return *this;
  }

 private:
  bool enabled_;
  std::ostringstream stream_;
};

}  // namespace raccel::log

#define RLOG_DEBUG(component) ::raccel::log::Line(::raccel::log::Level::debug, component)
#define RLOG_INFO(component) ::raccel::log::Line(::raccel::log::Level::info, component)
#define RLOG_WARN(component) ::raccel::log::Line(::raccel::log::Level::warn, component)
#define RLOG_ERROR(component) ::raccel::log::Line(::raccel::log::Level::error, component)
