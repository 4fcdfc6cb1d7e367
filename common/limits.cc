#include "common/limits.h"

#include <sstream>

namespace raccel::limits {

std::string clip(const std::string& text, size_t max) {
  if (text.size() <= max) return text;
  size_t cut = max;
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;  // not inside a character
  return text.substr(0, cut) + "...[" + std::to_string(text.size() - cut) + " more bytes]";
}

namespace {
template <class T>
std::string show(T v) {
  std::ostringstream out;
  out << v;
  return out.str();
}
}  // namespace

Status checkRange(const std::string& field, double value, double lo, double hi) {
  if (std::isfinite(value) && value >= lo && value <= hi) return {};
  return fail(Code::invalidArgument, field + " must be a finite number from " + show(lo) + " to " + show(hi) + " (got " +
                                         show(value) + ")");
}

Status checkRange(const std::string& field, long long value, long long lo, long long hi) {
  if (value >= lo && value <= hi) return {};
  return fail(Code::invalidArgument,
              field + " must be from " + show(lo) + " to " + show(hi) + " (got " + show(value) + ")");
}

Status checkName(const std::string& field, const std::string& name, size_t max) {
  if (name.empty()) return fail(Code::invalidArgument, field + " must not be empty");
  if (name.size() > max)
    return fail(Code::invalidArgument, field + " is " + std::to_string(name.size()) + " bytes; at most " +
                                           std::to_string(max));
  for (unsigned char c : name)
    if (c <= ' ' || c >= 0x7f)
      return fail(Code::invalidArgument, field + " '" + clip(name, 64) + "' has a space or a non-printable byte");
  return {};
}

Status checkKeyName(const std::string& field, const std::string& name) {
  if (auto ok = checkName(field, name); !ok) return ok;
  if (name.find('/') != std::string::npos)
    return fail(Code::invalidArgument, field + " '" + clip(name, 64) + "' must not contain '/' (it names keys in the shared pool)");
  return {};
}

}  // namespace raccel::limits
