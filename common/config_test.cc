#include "common/config.h"

#include <gtest/gtest.h>

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
  EXPECT_EQ(*parseBytes("1.5GiB"), 3ull << 29);
  EXPECT_FALSE(parseBytes("12 parsecs"));
  EXPECT_FALSE(parseBytes("-1"));
}

}  // namespace raccel
