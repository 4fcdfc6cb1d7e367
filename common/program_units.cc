#include "common/program_units.h"

#include <cstdint>
#include <cstring>

namespace raccel {
namespace {

constexpr char kMagic[8] = {'r', 'a', 'c', 'c', 'U', 'N', 'T', '1'};

void putU32(std::vector<std::byte>& out, uint32_t v) {
  auto* p = reinterpret_cast<const std::byte*>(&v);
  out.insert(out.end(), p, p + 4);
}
void putText(std::vector<std::byte>& out, const std::string& s) {
  putU32(out, static_cast<uint32_t>(s.size()));
  auto* p = reinterpret_cast<const std::byte*>(s.data());
  out.insert(out.end(), p, p + s.size());
}

// Reads the byte form from the front; every read is checked against what is left.
struct Reader {
  std::span<const std::byte> in;
  bool u32(uint32_t& v) {
    if (in.size() < 4) return false;
    std::memcpy(&v, in.data(), 4);
    in = in.subspan(4);
    return true;
  }
  bool text(std::string& s) {
    uint32_t n = 0;
    if (!u32(n) || n > in.size()) return false;
    s.assign(reinterpret_cast<const char*>(in.data()), n);
    in = in.subspan(n);
    return true;
  }
};

}  // namespace

std::vector<std::byte> encodeUnits(const ProgramUnits& units) {
  std::vector<std::byte> out;
  auto* m = reinterpret_cast<const std::byte*>(kMagic);
  out.insert(out.end(), m, m + sizeof kMagic);
  putU32(out, units.compileOnly ? 1 : 0);
  putU32(out, static_cast<uint32_t>(units.units.size()));
  for (auto& u : units.units) {
    putText(out, u.source);
    putText(out, u.options);
    putU32(out, static_cast<uint32_t>(u.headers.size()));
    for (auto& [name, source] : u.headers) {
      putText(out, name);
      putText(out, source);
    }
  }
  return out;
}

Result<ProgramUnits> decodeUnits(std::span<const std::byte> bytes) {
  auto bad = [](const std::string& why) { return fail(Code::invalidArgument, "OpenCL compilation units: " + why); };
  if (bytes.size() < sizeof kMagic || std::memcmp(bytes.data(), kMagic, sizeof kMagic) != 0)
    return bad("not in raccel's form (no magic)");
  Reader r{bytes.subspan(sizeof kMagic)};
  ProgramUnits out;
  uint32_t flags = 0, count = 0;
  if (!r.u32(flags) || !r.u32(count)) return bad("truncated");
  if (flags > 1) return bad("unknown flags " + std::to_string(flags));
  if (count == 0 || count > kMaxProgramUnits)
    return bad(std::to_string(count) + " units (1 to " + std::to_string(kMaxProgramUnits) + ")");
  out.compileOnly = flags & 1;
  for (uint32_t i = 0; i < count; ++i) {
    ProgramUnit u;
    uint32_t headers = 0;
    if (!r.text(u.source) || !r.text(u.options) || !r.u32(headers)) return bad("unit " + std::to_string(i) + " is truncated");
    if (headers > kMaxUnitHeaders)
      return bad("unit " + std::to_string(i) + " has " + std::to_string(headers) + " headers (at most " +
                 std::to_string(kMaxUnitHeaders) + ")");
    for (uint32_t h = 0; h < headers; ++h) {
      std::string name, source;
      if (!r.text(name) || !r.text(source)) return bad("a header of unit " + std::to_string(i) + " is truncated");
      if (name.empty() || name.find('\0') != std::string::npos) return bad("a header has an empty or NUL name");
      u.headers.emplace_back(std::move(name), std::move(source));
    }
    out.units.push_back(std::move(u));
  }
  if (!r.in.empty()) return bad(std::to_string(r.in.size()) + " bytes after the last unit");
  return out;
}

}  // namespace raccel
