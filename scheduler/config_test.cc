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

TEST(SchedulerConfig, VmsSayHowTheyAttachAndWhereTheirPolicyCameFrom) {
  auto file = Config::parse("libvirt = test:///default\n[vm]\nname = a\nsocket = /a.sock\n"
                            "[vm]\nname = b\nsocket = /b.sock\nattach = connect\nkinds = gpu,cpu\n",
                            "s.conf");
  ASSERT_TRUE(file);
  auto c = parseConfig(*file);
  ASSERT_TRUE(c) << c.error().message;
  EXPECT_EQ(c->libvirtUri, "test:///default");
  ASSERT_EQ(c->vms.size(), 2u);
  EXPECT_EQ(c->vms[0].attach, VmPolicy::Attach::listen);
  EXPECT_EQ(c->vms[0].source, "s.conf:2");
  EXPECT_EQ(c->vms[1].attach, VmPolicy::Attach::connect);
  EXPECT_EQ(c->vms[1].kinds, maskOf(CardKind::gpu) | maskOf(CardKind::cpu));

  auto spec = parseVmSpec("name=c,socket=/c.sock,attach=connect,kinds=npu|fpga");
  ASSERT_TRUE(spec) << spec.error().message;
  EXPECT_EQ(spec->attach, VmPolicy::Attach::connect);
  EXPECT_EQ(spec->source, "--vm");
  EXPECT_EQ(spec->kinds, maskOf(CardKind::npu) | maskOf(CardKind::fpga));

  auto bad = parseVmSpec("name=d,socket=/d.sock,attach=dial");
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message.find("attach must be listen or connect, not 'dial'"), std::string::npos)
      << bad.error().message;
}

}  // namespace
}  // namespace raccel::scheduler

namespace raccel::scheduler {
TEST(SchedulerConfig, SpanSlackDefaultsToAnyAndRefusesBadValues) {
  EXPECT_EQ(parseConfig(*Config::parse("", "e.conf"))->spanSlackNodes, -1);
  EXPECT_EQ(parseConfig(*Config::parse("span_slack_nodes = 1\n", "s.conf"))->spanSlackNodes, 1);
  EXPECT_FALSE(parseConfig(*Config::parse("span_slack_nodes = -2\n", "s.conf")));
  EXPECT_FALSE(parseConfig(*Config::parse("span_slack_nodes = x\n", "s.conf")));
}
}  // namespace raccel::scheduler
