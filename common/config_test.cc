#include "common/config.h"

#include <gtest/gtest.h>

#include "common/limits.h"

namespace raccel {

TEST(Config, ParsesRepeatedSectionsAndTypedValues) {
  auto config = Config::parse(
      "name = node0\n# comment\n[card]\nkind = gpu\ntflops = 18.5\nmemory = 2GiB\n[card]\nkind = cpu\n", "t");
  ASSERT_TRUE(config) << config.error().message;
  EXPECT_EQ(config->top().getString("name", ""), "node0");
  auto cards = config->sections("card");
  ASSERT_EQ(cards.size(), 2u);
  EXPECT_DOUBLE_EQ(*cards[0]->getDouble("tflops", 0), 18.5);
  EXPECT_EQ(*cards[0]->getBytes("memory", 0), 2ull << 30);
  EXPECT_EQ(cards[1]->getString("kind", ""), "cpu");
}

TEST(Config, ErrorsNameTheLine) {
  auto config = Config::parse("a = 1\nnot a pair\n", "f.conf");
  ASSERT_FALSE(config);
  EXPECT_NE(config.error().message.find("f.conf:2"), std::string::npos) << config.error().message;
}

TEST(Config, RefusesDuplicateKeyAndBadNumbers) {
  EXPECT_FALSE(Config::parse("a = 1\na = 2\n", "t"));
  auto config = Config::parse("[card]\ntflops = lots\n", "t");
  ASSERT_TRUE(config);
  auto v = config->sections("card")[0]->getDouble("tflops", 0);
  ASSERT_FALSE(v);
  EXPECT_NE(v.error().message.find("tflops"), std::string::npos);
}

TEST(Config, ParsesByteSizes) {
  EXPECT_EQ(*parseBytes("4096"), 4096u);
  EXPECT_EQ(*parseBytes("64KiB"), 65536u);
  EXPECT_EQ(*parseBytes("1.5 GiB"), 3ull << 29);
  EXPECT_EQ(*parseBytes("1.5GiB"), 3ull << 29);
  EXPECT_FALSE(parseBytes("12 parsecs"));
  EXPECT_FALSE(parseBytes("-1"));
}

}  // namespace raccel

namespace raccel {
namespace {

TEST(Limits, NumbersAreFiniteAndInRangeAndSizesAreExact) {
  auto c = Config::parse("a = nan\nb = inf\nc = 1e308\nd = 99999999999999999999\ne = 18446744073709551615\nf = 18446744073709551616\n", "t");
  ASSERT_TRUE(c);
  auto& top = c->top();
  EXPECT_FALSE(top.getDouble("a", 0));
  EXPECT_FALSE(top.getDouble("b", 0));
  EXPECT_FALSE(top.getDouble("c", 0, 0, 1e9));
  EXPECT_FALSE(top.getInt("d", 0));  // out of 64 bits: refused, not clamped
  auto e = top.getBytes("e", 0);
  ASSERT_TRUE(e) << e.error().message;
  EXPECT_EQ(*e, 18446744073709551615ull);
  auto f = top.getBytes("f", 0);
  ASSERT_FALSE(f);
  EXPECT_NE(f.error().message.find("larger than the largest size"), std::string::npos) << f.error().message;
  EXPECT_EQ(*parseBytes("1.5GiB"), 1610612736ull);
  EXPECT_FALSE(parseBytes("16EiB"));
  EXPECT_FALSE(parseBytes("20000000000TiB"));
  auto bad = limits::checkRange("hello tflops", 1e30, 0.0, 100.0);
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error().message, "hello tflops must be a finite number from 0 to 100 (got 1e+30)");
}

TEST(Limits, ClipKeepsPeerTextShortAndSaysSo) {
  std::string huge(3 << 20, 'x');
  std::string clipped = limits::clip(huge, 16);
  EXPECT_EQ(clipped, "xxxxxxxxxxxxxxxx...[3145712 more bytes]");
  EXPECT_EQ(limits::clip("short", 16), "short");
  std::string utf8 = "ab\xc3\xa9\xc3\xa9";  // never cut inside a character
  EXPECT_EQ(limits::clip(utf8, 3), "ab...[4 more bytes]");
  EXPECT_TRUE(limits::checkName("node name", "node-0.rack_1"));
  EXPECT_FALSE(limits::checkName("node name", "a b"));
  EXPECT_FALSE(limits::checkName("node name", std::string(200, 'n')));
}

TEST(Sizes, PrintInTheLargestUnitAndReadBack) {
  EXPECT_EQ(formatBytes(0), "0 B");
  EXPECT_EQ(formatBytes(512), "512 B");
  EXPECT_EQ(formatBytes(786432), "768 KiB");
  EXPECT_EQ(formatBytes(1ull << 30), "1 GiB");
  EXPECT_EQ(formatBytes(3ull << 29), "1.5 GiB");
  EXPECT_EQ(formatBytes(1023ull << 20), "1023 MiB");
  EXPECT_EQ(formatBytes(~0ull), "16.0 EiB");
  for (unsigned long long v : {0ull, 1ull, 1024ull, 786432ull, 1ull << 40, 5ull << 40, 1536ull})
    EXPECT_EQ(*parseBytes(formatBytes(v)), v) << formatBytes(v);
}

}  // namespace
}  // namespace raccel
