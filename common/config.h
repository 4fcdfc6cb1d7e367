// INI-style configuration files shared by every daemon:
//
//   # comment
//   key = value            (top-level section, name "")
//   [card]                 (a section; the same name may repeat: one per card, per VM)
//   kind = gpu
//
// Parsing is pure; errors name the file's line. Not thread-safe; build once at start-up.
#pragma once

#include <cfloat>
#include <climits>
#include <map>
#include <string>
#include <vector>

#include "common/error.h"

namespace raccel {

class ConfigSection {
 public:
  ConfigSection(std::string name, int line) : name_(std::move(name)), line_(line) {}
  // A section from a one-line flag value: "key=value,key=value". Its errors name just the
  // key (the caller names the flag: "--vm SPEC: 'tflops': ...").
  static Result<ConfigSection> fromSpec(const std::string& name, const std::string& spec);
  // How errors name a key, in the form the user wrote it: "'key' in [section] at line N"
  // (a file), just "'key'" (a flag's or raccelctl's key=value), or "<key>" (XML elements).
  enum class KeyForm { inSection, bare, element };
  void nameKeysAs(KeyForm form) { keyForm_ = form; }

  const std::string& name() const { return name_; }
  int line() const { return line_; }
  bool has(const std::string& key) const { return values_.count(key) != 0; }
  void set(const std::string& key, std::string value) { values_[key] = std::move(value); }
  const std::map<std::string, std::string>& values() const { return values_; }

  Result<std::string> getString(const std::string& key) const;
  std::string getString(const std::string& key, const std::string& fallback) const;
  // Numbers: an error names the key, its section and line, and the limits [lo, hi].
  // Doubles are always finite (nan and inf are refused).
  Result<long long> getInt(const std::string& key, long long fallback, long long lo = LLONG_MIN,
                           long long hi = LLONG_MAX) const;
  Result<double> getDouble(const std::string& key, double fallback, double lo = -DBL_MAX, double hi = DBL_MAX) const;
  Result<bool> getBool(const std::string& key, bool fallback) const;  // true/false, yes/no, on/off, 1/0
  Result<unsigned long long> getBytes(const std::string& key, unsigned long long fallback) const;
  // Comma-separated list; empty when absent.
  std::vector<std::string> getList(const std::string& key) const;
  // Keys not in `known`: callers refuse them, so a typo never passes silently.
  std::vector<std::string> unknownKeys(const std::vector<std::string>& known) const;

 private:
  std::string where(const std::string& key) const;
  std::string name_;
  int line_;
  KeyForm keyForm_ = KeyForm::inSection;
  std::map<std::string, std::string> values_;
};

class Config {
 public:
  static Result<Config> parse(const std::string& text, const std::string& origin);
  static Result<Config> load(const std::string& path);

  ConfigSection& top() { return sections_.front(); }
  const ConfigSection& top() const { return sections_.front(); }
  std::vector<const ConfigSection*> sections(const std::string& name) const;
  ConfigSection& addSection(const std::string& name) { return sections_.emplace_back(name, 0); }
  const std::string& origin() const { return origin_; }

 private:
  std::string origin_;
  std::vector<ConfigSection> sections_;
};

}  // namespace raccel
