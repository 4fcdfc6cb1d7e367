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

TEST(SchedulerConfig, VmHostNeedsAreCoresAndBytesRoundedUpAndBounded) {
  auto none = parseVmSpec("name=a,socket=/a.sock");
  ASSERT_TRUE(none);
  EXPECT_EQ(none->hostCpuMilli, 0u);
  EXPECT_EQ(none->hostMemoryMib, 0u);
  auto some = parseVmSpec("name=a,socket=/a.sock,host_cpu=1.5,host_memory=1500000");
  ASSERT_TRUE(some) << some.error().message;
  EXPECT_EQ(some->hostCpuMilli, 1500u);
  EXPECT_EQ(some->hostMemoryMib, 2u);  // 1.43 MiB, rounded up
  for (auto [spec, words] : {std::pair{"host_cpu=-1", "host_cpu"}, std::pair{"host_cpu=1e300", "host_cpu"},
                             std::pair{"host_cpu=nan", "host_cpu"}, std::pair{"host_cpu=many", "host_cpu"},
                             std::pair{"host_memory=-1", "host_memory"}, std::pair{"host_memory=16EiB", "host_memory"},
                             std::pair{"host_memory=18446744073709551615", "host_memory"}}) {
    auto bad = parseVmSpec(std::string("name=a,socket=/a.sock,") + spec);
    ASSERT_FALSE(bad) << spec;
    EXPECT_NE(bad.error().message.find(words), std::string::npos) << spec << ": " << bad.error().message;
  }
  // raccelctl set-policy speaks the same keys, and the policy round-trips through them.
  auto changed = withSettings(*some, {{"host_cpu", "0.25"}});
  ASSERT_TRUE(changed) << changed.error().message;
  EXPECT_EQ(changed->hostCpuMilli, 250u);
  EXPECT_EQ(changed->hostMemoryMib, 2u);
  auto refused = withSettings(*some, {{"host_gpu", "1"}});
  ASSERT_FALSE(refused);
  EXPECT_NE(refused.error().message.find("host_cpu, host_memory"), std::string::npos) << refused.error().message;
}

TEST(SchedulerConfig, ASharedPoolNeedsEtcdAndANameThatIsAName) {
  auto file = Config::parse("etcd = 127.0.0.1:2379\nname = host-a\netcd_lease_ttl = 3\nnode_advertise = 10.0.0.5:7700\n",
                            "s.conf");
  ASSERT_TRUE(file);
  auto c = parseConfig(*file);
  ASSERT_TRUE(c) << c.error().message;
  EXPECT_EQ(c->nodeAdvertise, "10.0.0.5:7700");
  EXPECT_TRUE(c->etcd.enabled());
  EXPECT_EQ(c->name, "host-a");
  EXPECT_EQ(c->etcd.leaseTtlSeconds, 3);
  auto alone = parseConfig(*Config::parse("", "empty.conf"));
  ASSERT_TRUE(alone);
  EXPECT_FALSE(alone->etcd.enabled());  // the embedded default: this host's pool alone
  EXPECT_FALSE(alone->name.empty());    // the host name
  for (auto [text, words] : {std::pair{"name = a/b\n", "name"}, std::pair{"etcd_lease_ttl = 0\n", "etcd_lease_ttl"},
                             std::pair{"etcd_prefix = raccel\n", "etcd_prefix"}, std::pair{"etcd_endpoint = x\n", "etcd_endpoint"},
                             std::pair{"node_advertise = somewhere\n", "node_advertise"},
                             std::pair{"node_advertise = unix:/run/x.sock\n", "node_advertise"}}) {
    auto r = parseConfig(*Config::parse(text, "bad.conf"));
    ASSERT_FALSE(r) << text;
    EXPECT_NE(r.error().message.find(words), std::string::npos) << text << ": " << r.error().message;
  }
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
