// Many VM hosts, one pool: raccel-scheduler with --etcd on a real 3-member etcd cluster.
// Two hosts (each a scheduler with its own VM and its own netaccel, registered in etcd),
// real programs through raccel-guestd. Covers: each host's program runs; each host sees
// the other's holdings in its pool; a scheduler killed with -9 gives its blocks back
// within its lease while the other host's program goes on; with every etcd member down,
// a running program goes on and a new one is refused naming etcd, and admissions resume
// when etcd returns.
#include <gtest/gtest.h>
#include <signal.h>

#include <nlohmann/json.hpp>

#include "scheduler/etcd/etcd_client.h"
#include "tests/cluster.h"
#include "tests/etcd_cluster.h"
#include "vmfrontend/raccel.h"

namespace raccel::testing {
namespace {

using client::Session;
using nlohmann::json;

Result<std::unique_ptr<Session>> openOn(const std::string& guestd, const std::string& program, unsigned admitWaitMs = 0) {
  client::Options o;
  o.socket = guestd;
  o.tflops = 2;
  o.program = program;
  o.timeoutMs = 30000;
  o.admitWaitMs = admitWaitMs;
  return Session::open(o);
}

bool gemmWorks(Session& s, unsigned seed, std::string* why) {
  double err = checkedGemm(s, 24, 20, 16, seed, why);
  return err >= 0 && err < 1e-3;
}

// The owners of used ranges in a host's `raccelctl pool`.
std::vector<std::string> usedBy(const Cluster& host) {
  std::vector<std::string> out;
  auto pool = json::parse(host.console("pool"), nullptr, false);
  if (pool.is_discarded() || !pool.contains("ranges")) return out;
  for (auto& r : pool["ranges"])
    if (r.value("state", "") == "used") out.push_back(r.value("owner", ""));
  return out;
}

class MultiHost : public ::testing::Test {
 protected:
  void SetUp() override {
    if (auto why = etcdUnavailable(); !why.empty()) GTEST_SKIP() << why;
    etcd_ = std::make_unique<EtcdCluster>(3);
    auto started = etcd_->start();
    ASSERT_TRUE(started) << started.error().message;
    a_ = host("host-a", "vm-a");
    b_ = host("host-b", "vm-b");
    // Each netaccel registers itself in etcd and links to its host's scheduler.
    a_->addNetaccel("na", {"kind=cpu,tflops=4"}, 4, {"--etcd", etcd_->endpoints()});
    b_->addNetaccel("nb", {"kind=cpu,tflops=4"}, 4, {"--etcd", etcd_->endpoints()});
    guestdA_ = a_->startGuestd("vm-a");
    guestdB_ = b_->startGuestd("vm-b");
  }

  std::unique_ptr<Cluster> host(const std::string& name, const std::string& vm) {
    VmSpec spec;
    spec.name = vm;
    return std::make_unique<Cluster>(std::vector<VmSpec>{spec}, "",
                                     std::vector<std::string>{"--insecure", "--etcd", etcd_->endpoints(), "--name", name,
                                                              "--set", "etcd_lease_ttl=2"});
  }

  std::string logs() const { return (a_ ? a_->logs() : "") + (b_ ? b_->logs() : ""); }

  std::unique_ptr<EtcdCluster> etcd_;
  std::unique_ptr<Cluster> a_, b_;
  std::string guestdA_, guestdB_;
};

TEST_F(MultiHost, EachHostRunsItsProgramAndSeesTheOthersHoldings) {
  auto onA = openOn(guestdA_, "prog-a");
  ASSERT_TRUE(onA) << onA.error().message << logs();
  auto onB = openOn(guestdB_, "prog-b");
  ASSERT_TRUE(onB) << onB.error().message << logs();
  std::string why;
  EXPECT_TRUE(gemmWorks(**onA, 1, &why)) << why;
  EXPECT_TRUE(gemmWorks(**onB, 2, &why)) << why;
  // Each host's pool shows the other host's vaccel, by its scheduler and VM.
  auto heldElsewhere = [](const std::vector<std::string>& owners, const std::string& prefix) {
    return std::any_of(owners.begin(), owners.end(), [&](const std::string& o) { return o.starts_with(prefix); });
  };
  EXPECT_TRUE(waitFor([&] { return heldElsewhere(usedBy(*a_), "host-b/vm-b#"); }, 10000)) << a_->console("pool");
  EXPECT_TRUE(waitFor([&] { return heldElsewhere(usedBy(*b_), "host-a/vm-a#"); }, 10000)) << b_->console("pool");
  // Both nodes are in both pools, at the same numbers.
  auto nodesA = json::parse(a_->console("nodes"), nullptr, false), nodesB = json::parse(b_->console("nodes"), nullptr, false);
  ASSERT_FALSE(nodesA.is_discarded() || nodesB.is_discarded());
  ASSERT_EQ(nodesA["nodes"].size(), 2u) << nodesA.dump();
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(nodesA["nodes"][i]["name"], nodesB["nodes"][i]["name"]);
    EXPECT_EQ(nodesA["nodes"][i]["firstBlock"], nodesB["nodes"][i]["firstBlock"]);
  }
  // Released on one host: gone from the other's pool.
  (*onB).reset();
  EXPECT_TRUE(waitFor([&] { return !heldElsewhere(usedBy(*a_), "host-b/"); }, 10000)) << a_->console("pool");
}

TEST_F(MultiHost, AKilledSchedulersBlocksReturnWithinItsLeaseAndTheOtherHostGoesOn) {
  auto onA = openOn(guestdA_, "prog-a");
  ASSERT_TRUE(onA) << onA.error().message << logs();
  auto onB = openOn(guestdB_, "prog-b");
  ASSERT_TRUE(onB) << onB.error().message << logs();
  ASSERT_TRUE(waitFor([&] { return !usedBy(*b_).empty() && usedBy(*b_).size() >= 2; }, 10000)) << b_->console("pool");
  a_->scheduler().kill(SIGKILL);
  // Host A's holding ends with its lease (2 s; etcd checks leases every 500 ms).
  EXPECT_TRUE(waitFor(
      [&] {
        auto owners = usedBy(*b_);
        return std::none_of(owners.begin(), owners.end(), [](const std::string& o) { return o.starts_with("host-a/"); });
      },
      15000))
      << b_->console("pool");
  std::string why;
  EXPECT_TRUE(gemmWorks(**onB, 3, &why)) << why;
}

TEST_F(MultiHost, WithEtcdDownRunningProgramsGoOnAndNewOnesAreRefusedNamingEtcd) {
  auto onA = openOn(guestdA_, "prog-a");
  ASSERT_TRUE(onA) << onA.error().message << logs();
  for (int m = 0; m < etcd_->members(); ++m) etcd_->kill(m);
  std::string why;
  EXPECT_TRUE(gemmWorks(**onA, 4, &why)) << why;
  auto refused = openOn(guestdA_, "late");
  ASSERT_FALSE(refused) << "admitted with etcd down";
  EXPECT_NE(refused.error().message.find("etcd"), std::string::npos) << refused.error().message;
  EXPECT_TRUE(gemmWorks(**onA, 5, &why)) << why;
  ASSERT_TRUE(etcd_->restartAll());
  // Admissions resume once the scheduler has read the pool again.
  std::unique_ptr<Session> after;
  EXPECT_TRUE(waitFor(
      [&] {
        auto s = openOn(guestdA_, "after");
        if (s) after = std::move(*s);
        return after != nullptr;
      },
      30000))
      << logs();
  if (after) EXPECT_TRUE(gemmWorks(*after, 6, &why)) << why;
}

}  // namespace
}  // namespace raccel::testing
