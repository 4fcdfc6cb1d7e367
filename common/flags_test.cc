#include "common/flags.h"

#include <gtest/gtest.h>

namespace raccel {

TEST(Flags, ParsesValuesBooleansAndRepeats) {
  Flags flags("prog", "does things");
  flags.value("config", "FILE", "config file");
  flags.value("vm", "SPEC", "a VM", true);
  flags.boolean("json", "emit JSON");
  const char* argv[] = {"prog", "--config=a.conf", "--vm", "x", "--vm=y", "--json", "pos"};
  ASSERT_TRUE(flags.parse(7, const_cast<char**>(argv)));
  EXPECT_EQ(flags.get("config"), "a.conf");
  EXPECT_EQ(flags.getAll("vm"), (std::vector<std::string>{"x", "y"}));
  EXPECT_TRUE(flags.has("json"));
  EXPECT_EQ(flags.positionals(), std::vector<std::string>{"pos"});
}

TEST(Flags, NumbersAreCheckedAndTheErrorNamesTheFlag) {
  Flags flags("prog", "s");
  for (const char* name : {"count", "seed", "tflops", "priority", "absent"}) flags.value(name, "N", "a number");
  const char* argv[] = {"prog", "--count=12x", "--seed", "18446744073709551616", "--tflops=inf", "--priority=-3"};
  ASSERT_TRUE(flags.parse(6, const_cast<char**>(argv)));
  auto count = flags.getUnsigned("count", 0, 100);
  ASSERT_FALSE(count);
  EXPECT_EQ(count.error().message, "--count: '12x' is not a whole number from 0 to 100");
  EXPECT_FALSE(flags.getUnsigned("seed", 0, ~0ull));  // past 64 bits: refused, never wrapped
  EXPECT_FALSE(flags.getDouble("tflops", 1, 0, 1e9));
  EXPECT_EQ(*flags.getInt("priority", 0, -10, 10), -3);
  EXPECT_FALSE(flags.getInt("priority", 0, 0, 10));
  EXPECT_EQ(*flags.getUnsigned("absent", 7, 10), 7u);
  EXPECT_EQ(*flags.getDouble("absent", 0.5, 0, 1), 0.5);
}

TEST(Flags, RefusesUnknownAndMissingValues) {
  Flags flags("prog", "s");
  flags.value("config", "FILE", "config file");
  const char* a[] = {"prog", "--nope"};
  EXPECT_FALSE(flags.parse(2, const_cast<char**>(a)));
  Flags flags2("prog", "s");
  flags2.value("config", "FILE", "config file");
  const char* b[] = {"prog", "--config"};
  EXPECT_FALSE(flags2.parse(2, const_cast<char**>(b)));
}

TEST(Flags, HelpListsEveryFlag) {
  Flags flags("prog", "summary line");
  flags.value("listen", "ADDR", "where to listen");
  const char* a[] = {"prog", "--help"};
  ASSERT_TRUE(flags.parse(2, const_cast<char**>(a)));
  EXPECT_TRUE(flags.helpRequested());
  EXPECT_NE(flags.helpText().find("--listen ADDR"), std::string::npos);
  EXPECT_NE(flags.helpText().find("summary line"), std::string::npos);
}

}  // namespace raccel
