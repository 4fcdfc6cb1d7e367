// The scheduler's own settings (VM specs are covered end to end in tests/).
#include "scheduler/config.h"

#include <gtest/gtest.h>

namespace raccel::scheduler {
namespace {

TEST(SchedulerConfig, SplitThresholdDefaultsAndRefusesNegatives) {
  auto file = Config::parse("block_tflops = 0.5\nsplit_min_mflop = 0\n", "s.conf");
  ASSERT_TRUE(file);
  auto c = parseConfig(*file);
  ASSERT_TRUE(c) << c.error().message;
  EXPECT_EQ(c->blockTflops, 0.5);
  EXPECT_EQ(c->splitMinMflop, 0);
  auto defaults = parseConfig(*Config::parse("", "empty.conf"));
  ASSERT_TRUE(defaults);
  EXPECT_EQ(defaults->splitMinMflop, 8);
  auto negative = parseConfig(*Config::parse("split_min_mflop = -1\n", "n.conf"));
  ASSERT_FALSE(negative);
  EXPECT_NE(negative.error().message.find("split_min_mflop"), std::string::npos) << negative.error().message;
  auto unknown = parseConfig(*Config::parse("split_min = 3\n", "u.conf"));
  ASSERT_FALSE(unknown);
  EXPECT_NE(unknown.error().message.find("split_min"), std::string::npos);
}

}  // namespace
}  // namespace raccel::scheduler
