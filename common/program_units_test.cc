#include "common/program_units.h"

#include <gtest/gtest.h>

namespace raccel {
namespace {

TEST(ProgramUnits, RoundTripKeepsEveryUnitHeaderAndOption) {
  ProgramUnits in{.compileOnly = true,
                  .units = {{"int f(void);", "-DX=1", {{"a.h", "#define A 1"}, {"dir/b.h", ""}}}, {"kernel void k() {}", "", {}}}};
  auto bytes = encodeUnits(in);
  auto out = decodeUnits(bytes);
  ASSERT_TRUE(out) << out.error().message;
  EXPECT_TRUE(out->compileOnly);
  ASSERT_EQ(out->units.size(), 2u);
  EXPECT_EQ(out->units[0].source, "int f(void);");
  EXPECT_EQ(out->units[0].options, "-DX=1");
  ASSERT_EQ(out->units[0].headers.size(), 2u);
  EXPECT_EQ(out->units[0].headers[1].first, "dir/b.h");
  EXPECT_EQ(out->units[1].source, "kernel void k() {}");
}

// What a guest may send instead: every cut of a valid form, lengths past the end, counts
// over the bounds, trailing bytes, no magic. Each is refused with why, never read past.
TEST(ProgramUnits, EveryMalformedFormIsRefusedWithoutReadingPastTheEnd) {
  ProgramUnits in{.compileOnly = false, .units = {{"src", "opt", {{"h", "text"}}}}};
  auto bytes = encodeUnits(in);
  for (size_t cut = 0; cut < bytes.size(); ++cut) {
    auto out = decodeUnits(std::span(bytes).first(cut));
    EXPECT_FALSE(out) << "a form cut at " << cut << " bytes was accepted";
  }
  auto trailing = bytes;
  trailing.push_back(std::byte{0});
  EXPECT_NE(decodeUnits(trailing).error().message.find("1 bytes after the last unit"), std::string::npos);
  auto huge = bytes;
  huge[12] = std::byte{0xff};  // the unit count's low byte
  EXPECT_NE(decodeUnits(huge).error().message.find("units (1 to 64)"), std::string::npos);
  auto longText = bytes;
  longText[16] = std::byte{0xff};  // the first source's length
  longText[19] = std::byte{0x7f};
  EXPECT_NE(decodeUnits(longText).error().message.find("truncated"), std::string::npos);
  ProgramUnits many;
  many.units.resize(1, ProgramUnit{"s", "", std::vector<std::pair<std::string, std::string>>(65, {"h", "x"})});
  EXPECT_NE(decodeUnits(encodeUnits(many)).error().message.find("65 headers (at most 64)"), std::string::npos);
  ProgramUnits none;
  EXPECT_FALSE(decodeUnits(encodeUnits(none)));
}

}  // namespace
}  // namespace raccel
