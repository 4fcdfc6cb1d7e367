// The netaccel's card and discovery settings: what is accepted, and what is refused
// with a message that names the setting.
#include "netaccel/config.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include "hal/backends.h"

namespace raccel::netaccel {
namespace {

TEST(CardSpec, CpuAndSimulatedCards) {
  auto c = parseCardSpec("kind=gpu,tflops=8,memory=1GiB,threads=2,paced=true");
  ASSERT_TRUE(c) << c.error().message;
  EXPECT_EQ(c->backend, "cpu");
  EXPECT_EQ(c->kind, CardKind::gpu);
  EXPECT_EQ(c->tflops, 8);
  EXPECT_EQ(c->memoryBytes, 1ull << 30);
  EXPECT_EQ(c->threads, 2u);
  EXPECT_TRUE(c->paced);
  EXPECT_FALSE(c->device);
}

TEST(CardSpec, RefusalsNameTheProblem) {
  auto expectRefused = [](const std::string& spec, const std::string& words) {
    auto c = parseCardSpec(spec);
    ASSERT_FALSE(c) << spec;
    EXPECT_NE(c.error().message.find(words), std::string::npos) << spec << ": " << c.error().message;
  };
  expectRefused("backend=tpu", "not built into this netaccel");
  expectRefused("kind=gpu,colour=red", "colour");
  expectRefused("tflops=-1", "must be a finite number from 0 to 65536");
  expectRefused("tflops=nan", "must be a finite number");
  expectRefused("device=0", "cpu cards are declared");
  expectRefused("paced=maybe", "true or false");
  expectRefused("kind=quantum", "quantum");
  for (auto& b : hal::builtBackends()) {
    if (b == "cpu") continue;
    expectRefused("backend=" + b + ",threads=2", "cpu cards only");
    expectRefused("backend=" + b + ",paced=true", "simulated");
  }
}

TEST(CardSpec, RealBackendsNameADeviceAndOverrideIt) {
  for (auto& b : hal::builtBackends()) {
    if (b == "cpu") continue;
    auto c = parseCardSpec("backend=" + b + ",device=2,kind=fpga,tflops=12,memory=2GiB");
    ASSERT_TRUE(c) << c.error().message;
    EXPECT_EQ(c->device, 2u);
    EXPECT_EQ(c->kind, CardKind::fpga);
    EXPECT_EQ(c->tflops, 12);
    auto plain = parseCardSpec("backend=" + b);
    ASSERT_TRUE(plain);
    EXPECT_EQ(plain->device, 0u);     // the first device
    EXPECT_FALSE(plain->tflops);      // from the device or calibration
    EXPECT_FALSE(plain->kind);
  }
}

TEST(Discover, AllNoneAndLists) {
  auto all = parseDiscover("all");
  ASSERT_TRUE(all);
  EXPECT_EQ(all->size(), hal::builtBackends().size() - 1);  // every backend but cpu
  EXPECT_TRUE(parseDiscover("none")->empty());
  EXPECT_FALSE(parseDiscover("cpu"));
  EXPECT_FALSE(parseDiscover("opencl,tpu"));
  EXPECT_FALSE(parseDiscover(""));
  if (all->size() >= 2) {
    auto two = parseDiscover((*all)[0] + "," + (*all)[1]);
    ASSERT_TRUE(two);
    EXPECT_EQ(two->size(), 2u);
  }
}

TEST(NetaccelConfig, FileWithDiscoveryAndCards) {
  auto file = Config::parse("name = n3\ndiscover = none\n[card]\nkind = npu\ntflops = 3\n", "test.conf");
  ASSERT_TRUE(file);
  auto c = parseConfig(*file);
  ASSERT_TRUE(c) << c.error().message;
  EXPECT_EQ(c->name, "n3");
  EXPECT_TRUE(c->discover.empty());
  ASSERT_EQ(c->cards.size(), 1u);
  EXPECT_EQ(c->cards[0].kind, CardKind::npu);
  auto bad = Config::parse("discover = tpu\n", "bad.conf");
  ASSERT_TRUE(bad);
  auto refused = parseConfig(*bad);
  ASSERT_FALSE(refused);
  EXPECT_NE(refused.error().message.find("bad.conf"), std::string::npos) << refused.error().message;
}

TEST(NetaccelConfig, SandboxSettingsAreCheckedWhereTheyEnter) {
  auto file = Config::parse("insecure = true\nsandbox_warm = 3\nsandbox_read = /srv/a,/srv/b\ndevice_queue_depth = 4\n"
                            "sandbox_call_timeout_ms = 500\n[card]\nkind = gpu\nasync = true\n",
                            "test.conf");
  ASSERT_TRUE(file);
  auto c = parseConfig(*file);
  ASSERT_TRUE(c) << c.error().message;
  EXPECT_TRUE(c->sandbox.enabled);
  EXPECT_EQ(c->sandbox.warm, 3u);
  EXPECT_EQ(c->sandbox.readable, (std::vector<std::string>{"/srv/a", "/srv/b"}));
  EXPECT_EQ(c->sandbox.callTimeoutMs, 500u);
  EXPECT_EQ(c->queueDepth, 4u);
  EXPECT_EQ(c->aloneQueueDepth, 64u);  // the default
  EXPECT_TRUE(c->cards.at(0).async);
  for (auto [text, words] : {std::pair{"sandbox_read = relative/path\n", "not an absolute path"},
                             std::pair{"sandbox_hide = /srv\n", "sandbox_hide is gone"},
                             std::pair{"max_op_seconds = 0\n", "max_op_seconds"},
                             std::pair{"slice_ms = -1\n", "slice_ms"},
                             std::pair{"device_queue_depth = 0\n", "device_queue_depth"},
                             std::pair{"device_queue_depth = 8\ndevice_queue_depth_alone = 4\n", "device_queue_depth_alone"},
                             std::pair{"sandbox_warm = 1000\n", "sandbox_warm"},
                             std::pair{"sandbox_host_memory = 1MiB\n", "at least 64MiB"},
                             std::pair{"sandbox = perhaps\n", "sandbox"},
                             std::pair{"[card]\nbackend = opencl\nasync = true\n", "simulated"}}) {
    auto f = Config::parse(std::string("insecure = true\n") + text, "bad.conf");
    ASSERT_TRUE(f) << text;
    auto r = parseConfig(*f);
    ASSERT_FALSE(r) << text;
    EXPECT_NE(r.error().message.find(words), std::string::npos) << text << ": " << r.error().message;
  }
}

TEST(NetaccelConfig, HostResourcesAreTheMachinesOrSetAndChecked) {
  auto file = Config::parse("insecure = true\n", "test.conf");
  ASSERT_TRUE(file);
  auto c = parseConfig(*file);
  ASSERT_TRUE(c) << c.error().message;
  EXPECT_EQ(c->hostCpuMilli, static_cast<uint64_t>(sysconf(_SC_NPROCESSORS_ONLN)) * 1000);
  EXPECT_EQ(c->hostMemoryMib, static_cast<uint64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGESIZE) >> 20);
  file = Config::parse("insecure = true\nhost_cpu = 2.5\nhost_memory = 0\n", "test.conf");
  c = parseConfig(*file);
  ASSERT_TRUE(c) << c.error().message;
  EXPECT_EQ(c->hostCpuMilli, 2500u);
  EXPECT_EQ(c->hostMemoryMib, 0u);  // not counted
  for (auto text : {"host_cpu = -2\n", "host_cpu = 1e18\n", "host_cpu = lots\n", "host_memory = -1\n", "host_memory = 3 bananas\n",
                    "host_memory = 2EiB\n"}) {
    auto f = Config::parse(std::string("insecure = true\n") + text, "bad.conf");
    ASSERT_TRUE(f) << text;
    auto r = parseConfig(*f);
    ASSERT_FALSE(r) << text;
    EXPECT_NE(r.error().message.find("host_"), std::string::npos) << text << ": " << r.error().message;
  }
}

TEST(NetaccelConfig, PoclDeviceIsBasicOnSmallHostsUnlessTheOperatorChose) {
  auto file = Config::parse("insecure = true\n", "test.conf");
  ASSERT_TRUE(file);
  auto c = parseConfig(*file);
  ASSERT_TRUE(c) << c.error().message;
  EXPECT_EQ(c->poclDevice, "auto");
  EXPECT_EQ(poclDevicesFor("auto", nullptr, 2), "basic");
  EXPECT_EQ(poclDevicesFor("auto", nullptr, 1), "basic");
  EXPECT_EQ(poclDevicesFor("auto", "", 2), "basic");          // set but empty: not a choice
  EXPECT_EQ(poclDevicesFor("auto", nullptr, 3), "");          // PoCL's own default (pthread)
  EXPECT_EQ(poclDevicesFor("auto", nullptr, 0), "");          // cores unknown
  EXPECT_EQ(poclDevicesFor("auto", "pthread", 2), "");        // the environment's stays
  EXPECT_EQ(poclDevicesFor("pthread", nullptr, 2), "pthread");
  EXPECT_EQ(poclDevicesFor("basic", "pthread", 16), "basic");  // the setting over the environment
  for (auto value : {"basic", "pthread"}) {
    auto f = Config::parse(std::string("insecure = true\npocl_device = ") + value + "\n", "test.conf");
    ASSERT_TRUE(f);
    auto r = parseConfig(*f);
    ASSERT_TRUE(r) << r.error().message;
    EXPECT_EQ(r->poclDevice, value);
  }
  for (auto value : {"cuda", "", "BASIC", "basic pthread"}) {
    auto f = Config::parse(std::string("insecure = true\npocl_device = ") + value + "\n", "bad.conf");
    ASSERT_TRUE(f) << value;
    auto r = parseConfig(*f);
    ASSERT_FALSE(r) << value;
    EXPECT_NE(r.error().message.find("pocl_device must be auto, basic or pthread"), std::string::npos) << r.error().message;
  }
}

TEST(NetaccelConfig, EtcdSettingsAreCheckedWhereTheyEnter) {
  auto file = Config::parse("insecure = true\netcd = 127.0.0.1:2379,127.0.0.1:2479\netcd_prefix = /pool-a/\n"
                            "etcd_lease_ttl = 7\netcd_ca = /etc/etcd/ca.pem\n",
                            "test.conf");
  ASSERT_TRUE(file);
  auto c = parseConfig(*file);
  ASSERT_TRUE(c) << c.error().message;
  EXPECT_EQ(c->etcd.endpoints, "127.0.0.1:2379,127.0.0.1:2479");
  EXPECT_EQ(c->etcd.prefix, "/pool-a/");
  EXPECT_EQ(c->etcd.leaseTtlSeconds, 7);
  EXPECT_EQ(c->etcd.ca, "/etc/etcd/ca.pem");
  // scheduler = etcd: no addresses of its own; they are found in the pool.
  auto found = Config::parse("insecure = true\netcd = 127.0.0.1:2379\nscheduler = etcd\n", "test.conf");
  ASSERT_TRUE(found);
  auto f = parseConfig(*found);
  ASSERT_TRUE(f) << f.error().message;
  EXPECT_EQ(f->scheduler, kSchedulersFromEtcd);
  EXPECT_TRUE(schedulerAddresses(f->scheduler)->empty());
  auto plain = Config::parse("insecure = true\n", "test.conf");
  ASSERT_TRUE(plain);
  EXPECT_TRUE(parseConfig(*plain)->etcd.endpoints.empty());  // no etcd: the one-host pool
  for (auto [text, words] : {std::pair{"etcd_prefix = /no-slash\n", "etcd_prefix"},
                             std::pair{"etcd_prefix = \n", "etcd_prefix"},
                             std::pair{"etcd_lease_ttl = 0\n", "etcd_lease_ttl"},
                             std::pair{"etcd_lease_ttl = 99999\n", "etcd_lease_ttl"},
                             std::pair{"etcd_lease_ttl = soon\n", "etcd_lease_ttl"},
                             std::pair{"etcd_endpoints = x\n", "etcd_endpoints"},
                             std::pair{"scheduler = etcd\n", "scheduler = etcd finds the schedulers in the shared pool"}}) {
    auto f = Config::parse(std::string("insecure = true\n") + text, "bad.conf");
    ASSERT_TRUE(f) << text;
    auto r = parseConfig(*f);
    ASSERT_FALSE(r) << text;
    EXPECT_NE(r.error().message.find(words), std::string::npos) << text << ": " << r.error().message;
  }
}

}  // namespace
}  // namespace raccel::netaccel
