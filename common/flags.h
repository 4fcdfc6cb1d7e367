// Command-line flags for every raccel program: `--name=value`, `--name value`, boolean
// `--name`, repeatable flags, positional arguments, and a generated `--help`.
// Built once in main(); not thread-safe.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "common/error.h"

namespace raccel {

class Flags {
 public:
  Flags(std::string program, std::string summary) : program_(std::move(program)), summary_(std::move(summary)) {}

  // Declares a flag taking a value (repeatable when `repeatable`).
  void value(const std::string& name, const std::string& metavar, const std::string& help, bool repeatable = false);
  // Declares a boolean flag.
  void boolean(const std::string& name, const std::string& help);
  void positional(const std::string& usage) { positionalUsage_ = usage; }
  void epilog(const std::string& text) { epilog_ = text; }

  // Parses argv. On --help, returns ok with helpRequested() true.
  Status parse(int argc, char** argv);

  bool helpRequested() const { return help_; }
  std::string helpText() const;
  bool has(const std::string& name) const { return values_.count(name) != 0; }
  std::string get(const std::string& name, const std::string& fallback = "") const;
  std::vector<std::string> getAll(const std::string& name) const;
  // Numbers (`fallback` when not given), within [lo, hi]; the error names the flag as the
  // user wrote it ("--count: 'x' is not a whole number from 0 to 100").
  Result<unsigned long long> getUnsigned(const std::string& name, unsigned long long fallback,
                                         unsigned long long max) const;
  Result<long long> getInt(const std::string& name, long long fallback, long long lo, long long hi) const;
  Result<double> getDouble(const std::string& name, double fallback, double lo, double hi) const;  // finite
  const std::vector<std::string>& positionals() const { return positionals_; }

 private:
  struct Spec {
    std::string metavar, help;
    bool takesValue, repeatable;
  };
  std::string program_, summary_, positionalUsage_, epilog_;
  std::vector<std::string> order_;
  std::map<std::string, Spec> specs_;
  std::map<std::string, std::vector<std::string>> values_;
  std::vector<std::string> positionals_;
  bool help_ = false;
};

// Standard handling at the top of main(): prints help (exit 0) or a one-line error
// (exit 2), and applies --log-level when the program declared it. Returns true when
// main should continue.
bool parseFlagsOrExit(Flags& flags, int argc, char** argv, int* exitCode);

}  // namespace raccel
