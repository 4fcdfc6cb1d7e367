#include "common/flags.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <sstream>
#include <type_traits>

#include "common/limits.h"
#include "common/log.h"

namespace raccel {

void Flags::value(const std::string& name, const std::string& metavar, const std::string& help, bool repeatable) {
  order_.push_back(name);
  specs_[name] = Spec{metavar, help, true, repeatable};
}

void Flags::boolean(const std::string& name, const std::string& help) {
  order_.push_back(name);
  specs_[name] = Spec{"", help, false, false};
}

Status Flags::parse(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      help_ = true;
      continue;
    }
    if (arg.rfind("--", 0) != 0 || arg == "--") {
      positionals_.push_back(arg);
      continue;
    }
    std::string name = arg.substr(2), value;
    bool inlineValue = false;
    if (size_t eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      inlineValue = true;
    }
    auto spec = specs_.find(name);
    if (spec == specs_.end()) return fail(Code::invalidArgument, "unknown flag --" + name + " (see --help)");
    if (spec->second.takesValue) {
      if (!inlineValue) {
        if (i + 1 >= argc) return fail(Code::invalidArgument, "flag --" + name + " needs a value");
        value = argv[++i];
      }
      if (!spec->second.repeatable && values_.count(name))
        return fail(Code::invalidArgument, "flag --" + name + " given twice");
    } else if (inlineValue) {
      return fail(Code::invalidArgument, "flag --" + name + " takes no value");
    } else {
      value = "true";
    }
    values_[name].push_back(value);
  }
  return {};
}

std::string Flags::helpText() const {
  std::ostringstream out;
  out << "usage: " << program_ << " [flags]" << (positionalUsage_.empty() ? "" : " " + positionalUsage_) << "\n\n"
      << summary_ << "\n\nflags:\n";
  for (auto& name : order_) {
    auto& spec = specs_.at(name);
    std::string left = "  --" + name + (spec.takesValue ? " " + spec.metavar : "");
    out << left;
    if (left.size() < 30) out << std::string(30 - left.size(), ' ');
    else out << "\n" << std::string(30, ' ');
    out << spec.help << (spec.repeatable ? " (repeatable)" : "") << "\n";
  }
  out << "  --help                      show this help\n";
  if (!epilog_.empty()) out << "\n" << epilog_ << "\n";
  return out.str();
}

namespace {
// A flag's number: all of its text, finite, within [lo, hi]; else the error names the flag.
template <class T>
Result<T> flagNumber(const std::string& name, const std::string& text, T lo, T hi) {
  T v{};
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  bool ok = !text.empty() && ec == std::errc() && end == text.data() + text.size() && v >= lo && v <= hi;
  if constexpr (std::is_floating_point_v<T>) ok = ok && std::isfinite(v);
  if (ok) return v;
  std::ostringstream range;
  range << lo << " to " << hi;
  return fail(Code::invalidArgument, "--" + name + ": '" + limits::clip(text, 64) + "' is not a " +
                                         (std::is_integral_v<T> ? "whole number" : "number") + " from " + range.str());
}
}  // namespace

Result<unsigned long long> Flags::getUnsigned(const std::string& name, unsigned long long fallback,
                                              unsigned long long max) const {
  return has(name) ? flagNumber<unsigned long long>(name, get(name), 0, max) : fallback;
}

Result<long long> Flags::getInt(const std::string& name, long long fallback, long long lo, long long hi) const {
  return has(name) ? flagNumber(name, get(name), lo, hi) : fallback;
}

Result<double> Flags::getDouble(const std::string& name, double fallback, double lo, double hi) const {
  return has(name) ? flagNumber(name, get(name), lo, hi) : fallback;
}

std::string Flags::get(const std::string& name, const std::string& fallback) const {
  auto it = values_.find(name);
  return it == values_.end() ? fallback : it->second.back();
}

std::vector<std::string> Flags::getAll(const std::string& name) const {
  auto it = values_.find(name);
  return it == values_.end() ? std::vector<std::string>{} : it->second;
}

bool parseFlagsOrExit(Flags& flags, int argc, char** argv, int* exitCode) {
  auto status = flags.parse(argc, argv);
  if (!status) {
    std::fprintf(stderr, "%s: %s\n", argv[0], status.error().message.c_str());
    *exitCode = 2;
    return false;
  }
  if (flags.helpRequested()) {
    std::fputs(flags.helpText().c_str(), stdout);
    *exitCode = 0;
    return false;
  }
  if (flags.has("log-level")) {
    log::Level level;
    if (!log::parseLevel(flags.get("log-level"), &level)) {
      std::fprintf(stderr, "%s: bad --log-level '%s' (use debug, info, warn or error)\n", argv[0], flags.get("log-level").c_str());
      *exitCode = 2;
      return false;
    }
    log::setLevel(level);
  }
  return true;
}

}  // namespace raccel
