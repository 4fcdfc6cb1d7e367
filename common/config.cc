#include "common/config.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>

namespace raccel {
namespace {
std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\r");
  if (b == std::string::npos) return "";
  size_t e = s.find_last_not_of(" \t\r");
  return s.substr(b, e - b + 1);
}
}  // namespace

Result<ConfigSection> ConfigSection::fromSpec(const std::string& name, const std::string& spec) {
  ConfigSection s(name, 0);
  s.nameKeysAs(KeyForm::bare);
  std::stringstream in(spec);
  std::string item;
  while (std::getline(in, item, ',')) {
    auto eq = item.find('=');
    if (eq == std::string::npos || eq == 0) return fail(Code::invalidArgument, "'" + item + "' is not key=value");
    if (s.has(item.substr(0, eq))) return fail(Code::invalidArgument, "'" + item.substr(0, eq) + "' given twice");
    s.set(item.substr(0, eq), item.substr(eq + 1));
  }
  return s;
}

std::string ConfigSection::where(const std::string& key) const {
  if (keyForm_ == KeyForm::bare) return "'" + key + "'";
  if (keyForm_ == KeyForm::element) return "<" + key + ">";
  std::string section = name_.empty() ? "top level" : "[" + name_ + "]";
  return "'" + key + "' in " + section + (line_ ? " at line " + std::to_string(line_) : "");
}

Result<std::string> ConfigSection::getString(const std::string& key) const {
  auto it = values_.find(key);
  if (it == values_.end()) return fail(Code::invalidArgument, "missing " + where(key));
  return it->second;
}

std::string ConfigSection::getString(const std::string& key, const std::string& fallback) const {
  auto it = values_.find(key);
  return it == values_.end() ? fallback : it->second;
}

Result<long long> ConfigSection::getInt(const std::string& key, long long fallback, long long lo, long long hi) const {
  auto it = values_.find(key);
  if (it == values_.end()) return fallback;
  char* end = nullptr;
  errno = 0;
  long long v = std::strtoll(it->second.c_str(), &end, 10);
  if (it->second.empty() || *end != '\0')
    return fail(Code::invalidArgument, where(key) + ": '" + it->second + "' is not an integer");
  if (errno == ERANGE || v < lo || v > hi)
    return fail(Code::invalidArgument, where(key) + ": " + it->second + " is out of range (" + std::to_string(lo) + " to " +
                                           std::to_string(hi) + ")");
  return v;
}

Result<double> ConfigSection::getDouble(const std::string& key, double fallback, double lo, double hi) const {
  auto it = values_.find(key);
  if (it == values_.end()) return fallback;
  char* end = nullptr;
  double v = std::strtod(it->second.c_str(), &end);
  if (it->second.empty() || *end != '\0')
    return fail(Code::invalidArgument, where(key) + ": '" + it->second + "' is not a number");
  if (!std::isfinite(v) || v < lo || v > hi) {
    std::ostringstream range;
    range << lo << " to " << hi;
    return fail(Code::invalidArgument, where(key) + ": " + it->second + " must be a finite number from " + range.str());
  }
  return v;
}

Result<bool> ConfigSection::getBool(const std::string& key, bool fallback) const {
  auto it = values_.find(key);
  if (it == values_.end()) return fallback;
  const std::string& v = it->second;
  if (v == "true" || v == "yes" || v == "on" || v == "1") return true;
  if (v == "false" || v == "no" || v == "off" || v == "0") return false;
  return fail(Code::invalidArgument, where(key) + ": '" + v + "' is not true or false");
}

Result<unsigned long long> ConfigSection::getBytes(const std::string& key, unsigned long long fallback) const {
  auto it = values_.find(key);
  if (it == values_.end()) return fallback;
  auto v = parseBytes(it->second);
  if (!v) return fail(Code::invalidArgument, where(key) + ": " + v.error().message);
  return *v;
}

std::vector<std::string> ConfigSection::getList(const std::string& key) const {
  std::vector<std::string> out;
  auto it = values_.find(key);
  if (it == values_.end()) return out;
  std::stringstream in(it->second);
  std::string item;
  while (std::getline(in, item, ',')) {
    item = trim(item);
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

std::vector<std::string> ConfigSection::unknownKeys(const std::vector<std::string>& known) const {
  std::vector<std::string> out;
  for (auto& [k, v] : values_)
    if (std::find(known.begin(), known.end(), k) == known.end()) out.push_back(k);
  return out;
}

Result<Config> Config::parse(const std::string& text, const std::string& origin) {
  Config config;
  config.origin_ = origin;
  config.sections_.emplace_back("", 0);
  std::stringstream in(text);
  std::string raw;
  int lineNo = 0;
  while (std::getline(in, raw)) {
    ++lineNo;
    std::string line = trim(raw);
    if (line.empty() || line[0] == '#' || line[0] == ';') continue;
    if (line[0] == '[') {
      if (line.back() != ']' || line.size() < 3)
        return fail(Code::invalidArgument, origin + ":" + std::to_string(lineNo) + ": bad section header '" + line + "'");
      config.sections_.emplace_back(trim(line.substr(1, line.size() - 2)), lineNo);
      continue;
    }
    size_t eq = line.find('=');
    if (eq == std::string::npos || trim(line.substr(0, eq)).empty())
      return fail(Code::invalidArgument, origin + ":" + std::to_string(lineNo) + ": expected 'key = value', got '" + line + "'");
    std::string key = trim(line.substr(0, eq));
    if (config.sections_.back().has(key))
      return fail(Code::invalidArgument, origin + ":" + std::to_string(lineNo) + ": '" + key + "' given twice in one section");
    config.sections_.back().set(key, trim(line.substr(eq + 1)));
  }
  return config;
}

Result<Config> Config::load(const std::string& path) {
  std::ifstream in(path);
  if (!in) return fail(Code::notFound, "cannot read config file " + path);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return parse(buffer.str(), path);
}

std::vector<const ConfigSection*> Config::sections(const std::string& name) const {
  std::vector<const ConfigSection*> out;
  for (size_t i = 1; i < sections_.size(); ++i)
    if (sections_[i].name() == name) out.push_back(&sections_[i]);
  return out;
}

}  // namespace raccel
