#include "sim/csv.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>

namespace raccel::sim {

std::vector<std::string> splitFields(const std::string& line, char separator) {
  std::vector<std::string> out(1);
  for (char ch : line) {
    if (ch == separator) out.emplace_back();
    else if (ch != '\r') out.back() += ch;
  }
  return out;
}

Result<RowReader> RowReader::open(const std::string& path, const std::string& what, char separator) {
  std::ifstream in(path);
  if (!in) return fail(Code::notFound, "cannot read " + what + " " + path);
  return RowReader(std::move(in), path, separator);
}

bool RowReader::next(std::vector<std::string>& fields) {
  std::string text;
  while (std::getline(in_, text)) {
    ++line_;
    if (text.empty()) continue;
    fields = splitFields(text, separator_);
    return true;
  }
  return false;
}

Result<uint64_t> parseCount(const std::string& text, const std::string& where) {
  if (text.empty() || text.find_first_not_of("0123456789") != std::string::npos)
    return fail(Code::invalidArgument, where + ": '" + text + "' is not a whole number");
  errno = 0;
  unsigned long long v = std::strtoull(text.c_str(), nullptr, 10);
  if (errno) return fail(Code::invalidArgument, where + ": '" + text + "' is out of range");
  return static_cast<uint64_t>(v);
}

Result<double> parseReal(const std::string& text, const std::string& where) {
  char* end = nullptr;
  double v = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0' || !std::isfinite(v))
    return fail(Code::invalidArgument, where + ": '" + text + "' is not a number");
  return v;
}

}  // namespace raccel::sim
