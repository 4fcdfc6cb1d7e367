// The pool shared through etcd (scheduler/etcd/shared_pool.h) against a real 3-member
// etcd cluster on loopback: one numbering and one view for every scheduler, no block
// ever held twice under racing schedulers (audited from etcd's own history), holdings
// that die with their scheduler's lease, values that break the format, and etcd's
// members failing.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <fstream>
#include <map>
#include <set>
#include <thread>

#include <nlohmann/json.hpp>

#include "scheduler/etcd/shared_pool.h"
#include "tests/etcd_cluster.h"

namespace raccel {
namespace {

using scheduler::BlockRange;
using scheduler::CardSpec;
using scheduler::Pool;
using scheduler::SharedPool;
using scheduler::SharedPoolOptions;
using testing::EtcdCluster;
using testing::waitFor;

std::vector<CardSpec> cpuCards(std::vector<uint32_t> blocks) {
  std::vector<CardSpec> cards;
  for (size_t i = 0; i < blocks.size(); ++i) {
    CardSpec c;
    c.index = static_cast<uint32_t>(i);
    c.kind = CardKind::cpu;
    c.tflops = blocks[i];
    c.programKinds = {ProgramKind::builtin};
    cards.push_back(c);
  }
  return cards;
}

Pool::Request blocks(uint32_t n) {
  Pool::Request r;
  r.blocks = n;
  return r;
}

// Replays every change to the holdings under `prefix` since etcd's first revision and
// counts the moments a block was held by two holdings at once.
struct Audit {
  size_t events = 0, doubleHeld = 0, heldAtEnd = 0;
};
Audit audit(etcd::Client& client, const std::string& prefix) {
  auto now = client.range(prefix);
  EXPECT_TRUE(now) << now.error().message;
  int64_t until = now ? now->header().revision() : 0;
  std::mutex mutex;
  std::vector<mvccpb::Event> history;
  int64_t reached = 0;
  {
    etcd::Watcher watcher(
        client, prefix, 1, false,
        [&](std::vector<mvccpb::Event> events, int64_t revision) {
          std::lock_guard lock(mutex);
          for (auto& e : events) reached = std::max(reached, e.kv().mod_revision());
          if (events.empty()) reached = std::max(reached, revision);
          history.insert(history.end(), events.begin(), events.end());
        },
        [](Error e) { ADD_FAILURE() << "the audit's watch broke: " << e.message; });
    EXPECT_TRUE(waitFor(
        [&] {
          std::lock_guard lock(mutex);
          return reached >= until;
        },
        30000))
        << "the history up to revision " << until << " did not arrive";
  }
  Audit a;
  std::map<uint32_t, std::string> owner;
  std::map<std::string, std::vector<uint32_t>> held;
  for (auto& e : history) {
    if (e.kv().mod_revision() > until) break;
    const std::string& key = e.kv().key();
    if (!key.starts_with(prefix + "holds/")) continue;
    ++a.events;
    if (e.type() == mvccpb::Event::DELETE) {
      for (uint32_t b : held[key]) owner.erase(b);
      held.erase(key);
      continue;
    }
    auto h = SharedPool::parseHolding(key, e.kv().value(), prefix);
    EXPECT_TRUE(h) << key << ": " << h.error().message;
    if (!h) continue;
    for (auto& r : h->ranges)
      for (uint32_t b = r.first; b < r.end(); ++b) {
        if (owner.count(b) && owner[b] != key) ++a.doubleHeld;
        owner[b] = key;
        held[key].push_back(b);
      }
  }
  a.heldAtEnd = owner.size();
  return a;
}

class SharedPoolTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (auto why = testing::etcdUnavailable(); !why.empty()) GTEST_SKIP() << why;
    etcd_ = std::make_unique<EtcdCluster>(3);
    auto started = etcd_->start();
    ASSERT_TRUE(started) << started.error().message;
    auto client = etcd::Client::open({etcd_->endpointList()});
    ASSERT_TRUE(client) << client.error().message;
    client_ = std::move(*client);
  }

  std::unique_ptr<SharedPool> join(const std::string& name, int64_t ttl = 5) {
    SharedPoolOptions options;
    options.scheduler = name;
    options.leaseTtlSeconds = ttl;
    auto pool = SharedPool::open(*client_, options);
    EXPECT_TRUE(pool) << pool.error().message;
    return pool ? std::move(*pool) : nullptr;
  }

  std::unique_ptr<EtcdCluster> etcd_;
  std::unique_ptr<etcd::Client> client_;
};

TEST(EtcdEndpoints, AreCheckedWhereTheyEnter) {
  auto ok = etcd::parseEndpoints("127.0.0.1:2379,http://127.0.0.1:22379");
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->size(), 2u);
  for (const char* bad : {"", ",", "127.0.0.1", "127.0.0.1:", ":2379", "host:port", "http://x:12a"}) {
    auto r = etcd::parseEndpoints(bad);
    ASSERT_FALSE(r) << bad;
    EXPECT_NE(r.error().message.find("--etcd"), std::string::npos) << r.error().message;
  }
  EXPECT_EQ(etcd::prefixEnd("/raccel/"), "/raccel0");
  EXPECT_EQ(etcd::prefixEnd(std::string("a\xff", 2)), "b");
}

TEST(SharedHolding, AValueThatBreaksTheFormatIsRefused) {
  const std::string key = "/raccel/holds/s1/7";
  auto good = SharedPool::parseHolding(key, R"({"vm":"vm1","priority":3,"ranges":[[4,2]],"cardMilli":0})", "/raccel/");
  ASSERT_TRUE(good) << good.error().message;
  EXPECT_EQ(good->scheduler, "s1");
  EXPECT_EQ(good->vaccel, 7u);
  EXPECT_EQ(good->ranges, (std::vector<BlockRange>{{4, 2}}));
  std::string roundTrip = SharedPool::holdingValue(*good);
  EXPECT_TRUE(SharedPool::parseHolding(key, roundTrip, "/raccel/"));
  // A guest's program name is any bytes: written without throwing, read back.
  good->program = std::string("train \xff\xfe.py\0x", 13);
  auto named = SharedPool::parseHolding(key, SharedPool::holdingValue(*good), "/raccel/");
  ASSERT_TRUE(named) << named.error().message;
  EXPECT_FALSE(named->program.empty());
  for (auto [k, v] : std::vector<std::pair<std::string, std::string>>{
           {key, "not json"},
           {key, "[]"},
           {key, R"({"vm":"vm1","priority":3,"ranges":[]})"},
           {key, R"({"vm":"vm1","priority":3,"ranges":[[0,2]]})"},
           {key, R"({"vm":"vm1","priority":3,"ranges":[[16777216,2]]})"},
           {key, R"({"vm":"vm1","priority":3,"ranges":[[4,-1]]})"},
           {key, R"({"vm":"vm1","priority":3,"ranges":[[4,2,9]]})"},
           {key, R"({"vm":"vm1","priority":1e9,"ranges":[[4,2]]})"},
           {key, R"({"vm":"vm1","priority":3003,"ranges":[[4,2]]})"},
           {key, R"({"vm":"vm1","priority":-3001,"ranges":[[4,2]]})"},
           {key, R"({"vm":"vm 1","priority":3,"ranges":[[4,2]]})"},
           {key, R"({"vm":"vm1","priority":3,"ranges":[[4,2]],"cardMilli":1001})"},
           {key, R"({"vm":"vm1","priority":3,"ranges":[[4,2]],"program":7})"},
           {key, R"({"vm":"vm1","priority":3,"ranges":[[4,2]],"program":")" + std::string(300, 'p') + R"("})"},
           {key, R"({"vm":"vm1","priority":3,"ranges":[[4,2]],"host":{"cpuMilli":-1,"memoryMib":0}})"},
           {"/raccel/holds/s1/0", R"({"vm":"vm1","priority":3,"ranges":[[4,2]]})"},
           {"/raccel/holds/s1/99999999999999999999", R"({"vm":"vm1","priority":3,"ranges":[[4,2]]})"},
           {"/raccel/holds/s1", R"({"vm":"vm1","priority":3,"ranges":[[4,2]]})"},
           {"/raccel/other/s1/7", R"({"vm":"vm1","priority":3,"ranges":[[4,2]]})"},
       })
    EXPECT_FALSE(SharedPool::parseHolding(k, v, "/raccel/")) << k << " " << v;
}

TEST(SharedPreemption, AKeyOrValueThatBreaksTheFormatIsRefused) {
  const std::string key = "/raccel/preempt/host-b/7/host-a/3";
  auto good = SharedPool::parsePreemption(key, R"({"vm":"vm-a","priority":12})", "/raccel/");
  ASSERT_TRUE(good) << good.error().message;
  EXPECT_EQ(good->victimScheduler, "host-b");
  EXPECT_EQ(good->victim, 7u);
  EXPECT_EQ(good->by, "host-a");
  EXPECT_EQ(good->forVaccel, 3u);
  EXPECT_EQ(good->priority, 12);
  EXPECT_EQ(good->vm, "vm-a");
  EXPECT_EQ("/raccel/" + SharedPool::preemptionKey(*good), key);
  for (auto [k, v] : std::vector<std::pair<std::string, std::string>>{
           {key, "not json"},
           {key, R"({"vm":"vm-a"})"},
           {key, R"({"vm":"vm-a","priority":3003})"},
           {key, R"({"vm":"vm-a","priority":1.5})"},
           {key, R"({"vm":"vm a","priority":1})"},
           {key, R"({"priority":1})"},
           {"/raccel/preempt/host-b/7/host-a", R"({"vm":"vm-a","priority":1})"},
           {"/raccel/preempt/host-b/7/host-a/3/9", R"({"vm":"vm-a","priority":1})"},
           {"/raccel/preempt/host-b/0/host-a/3", R"({"vm":"vm-a","priority":1})"},
           {"/raccel/preempt/host-b/7/host-a/4611686018427387904", R"({"vm":"vm-a","priority":1})"},
           {"/raccel/preempt/host-b/07/host-a/3", R"({"vm":"vm-a","priority":1})"},
           {"/raccel/preempt/host-b/7/host-b/3", R"({"vm":"vm-a","priority":1})"},
           {"/raccel/preempt//7/host-a/3", R"({"vm":"vm-a","priority":1})"},
           {"/raccel/preempt/host-b/7/a b/3", R"({"vm":"vm-a","priority":1})"},
           {"/raccel/holds/host-b/7/host-a/3", R"({"vm":"vm-a","priority":1})"},
       })
    EXPECT_FALSE(SharedPool::parsePreemption(k, v, "/raccel/")) << k << " " << v;
}

TEST(SharedUsage, AKeyOrValueThatBreaksTheFormatIsRefused) {
  const std::string key = "/raccel/usage/host-b/vm-a";
  auto good = SharedPool::parseUsage(key, R"({"used":3600.5,"at":1790000000.25,"blocks":4})", "/raccel/");
  ASSERT_TRUE(good) << good.error().message;
  EXPECT_EQ(good->scheduler, "host-b");
  EXPECT_EQ(good->vm, "vm-a");
  EXPECT_DOUBLE_EQ(good->used, 3600.5);
  EXPECT_DOUBLE_EQ(good->at, 1790000000.25);
  EXPECT_EQ(good->blocks, 4u);
  for (auto [k, v] : std::vector<std::pair<std::string, std::string>>{
           {key, "not json"},
           {key, R"({"at":1,"blocks":0})"},
           {key, R"({"used":-1,"at":1,"blocks":0})"},
           {key, R"({"used":1e300,"at":1,"blocks":0})"},
           {key, R"({"used":1,"at":1e300,"blocks":0})"},
           {key, R"({"used":"1","at":1,"blocks":0})"},
           {key, R"({"used":1,"at":1,"blocks":-2})"},
           {key, R"({"used":1,"at":1,"blocks":16777217})"},
           {key, R"({"used":1,"at":1})"},
           {"/raccel/usage/host-b", R"({"used":1,"at":1,"blocks":0})"},
           {"/raccel/usage/host-b/vm-a/x", R"({"used":1,"at":1,"blocks":0})"},
           {"/raccel/usage/host-b/vm a", R"({"used":1,"at":1,"blocks":0})"},
           {"/raccel/usage//vm-a", R"({"used":1,"at":1,"blocks":0})"},
       })
    EXPECT_FALSE(SharedPool::parseUsage(k, v, "/raccel/")) << k << " " << v;
}

// A preemption request stands while its scheduler lives: taken back, or ended with the
// requester's lease, it is gone from every view; one written by a stranger (no live
// scheduler of that name) or broken never stands. Usage records alike.
TEST_F(SharedPoolTest, APreemptionRequestStandsOnlyWhileItsSchedulerLives) {
  auto a = join("host-a");
  auto b = join("host-b");
  ASSERT_TRUE(a && b);
  ASSERT_TRUE(a->registerNode("n1", cpuCards({8}), {}, a->lease()));
  ASSERT_TRUE(waitFor([&] { return b->view().free == 8; }, 10000));  // B's view has the node
  auto held = b->allocate(5, "vm-b", blocks(6));
  ASSERT_TRUE(held) << held.error().message;
  scheduler::SharedPreemption p{"host-b", 5, "host-a", 2, 40, "vm-a"};
  scheduler::SharedPreemption forged{"host-b", 5, "stranger", 1, 40, "vm-x"};
  EXPECT_FALSE(b->requestPreemption(p));  // only a request's own scheduler makes it
  ASSERT_TRUE(client_->put("/raccel/" + SharedPool::preemptionKey(forged), R"({"vm":"vm-x","priority":40})"));
  ASSERT_TRUE(client_->put("/raccel/preempt/host-b/5/host-a/not-a-number", R"({"vm":"vm-x","priority":40})"));
  auto refusedBefore = b->stats().refusedValues;
  ASSERT_TRUE(a->requestPreemption(p));
  auto standing = [&](SharedPool& s) { return s.poolCopy().preemptions; };
  ASSERT_TRUE(waitFor([&] { return standing(*b).size() == 1; }, 10000)) << standing(*b).size();
  auto seen = standing(*b)[0];
  EXPECT_EQ(SharedPool::preemptionKey(seen), SharedPool::preemptionKey(p));
  EXPECT_EQ(seen.priority, 40);
  EXPECT_EQ(seen.vm, "vm-a");
  EXPECT_GE(b->stats().refusedValues, refusedBefore + 2);
  // Usage records alike: a live scheduler's stands, a stranger's does not.
  ASSERT_TRUE(client_->put("/raccel/usage/stranger/vm-a", R"({"used":1,"at":1,"blocks":0})"));
  EXPECT_FALSE(a->publishUsage({"host-b", "vm-a", 5, 1, 0}));  // only its own
  ASSERT_TRUE(a->publishUsage({"host-a", "vm-a", 7200, 100, 2}));
  ASSERT_TRUE(waitFor([&] { return b->poolCopy().usage.size() == 1; }, 10000)) << b->poolCopy().usage.size();
  auto usage = b->poolCopy().usage[0];
  EXPECT_EQ(usage.scheduler, "host-a");
  EXPECT_DOUBLE_EQ(usage.used, 7200);
  EXPECT_EQ(usage.blocks, 2u);
  // Taken back: gone.
  ASSERT_TRUE(a->withdrawPreemption(p));
  EXPECT_TRUE(waitFor([&] { return standing(*b).empty(); }, 10000));
  // Made again, then the requester leaves (its lease ends): gone with it.
  ASSERT_TRUE(a->requestPreemption(p));
  ASSERT_TRUE(waitFor([&] { return standing(*b).size() == 1; }, 10000));
  ASSERT_TRUE(a->leave());
  EXPECT_TRUE(waitFor([&] { return standing(*b).empty() && b->poolCopy().usage.empty(); }, 10000));
  auto left = client_->range("/raccel/" + SharedPool::preemptionKey(p));
  ASSERT_TRUE(left);
  EXPECT_EQ(left->kvs_size(), 0);
}

TEST(SharedMove, AKeyOrValueThatBreaksTheFormatIsRefused) {
  const std::string key = "/raccel/moves/host-b/7";
  auto good = SharedPool::parseMove(key, R"({"by":"host-a","from":[[3,1],[9,2]],"to":[[1,3]]})", "/raccel/");
  ASSERT_TRUE(good) << good.error().message;
  EXPECT_EQ(good->scheduler, "host-b");
  EXPECT_EQ(good->vaccel, 7u);
  EXPECT_EQ(good->by, "host-a");
  EXPECT_EQ(good->from, (std::vector<BlockRange>{{3, 1}, {9, 2}}));
  EXPECT_EQ(good->to, (BlockRange{1, 3}));
  for (auto [k, v] : std::vector<std::pair<std::string, std::string>>{
           {key, "not json"},
           {key, R"({"from":[[3,1]],"to":[[1,1]]})"},
           {key, R"({"by":"a b","from":[[3,1]],"to":[[1,1]]})"},
           {key, R"({"by":"host-a","to":[[1,1]]})"},
           {key, R"({"by":"host-a","from":[[3,1]]})"},
           {key, R"({"by":"host-a","from":[[3,1]],"to":[[1,1],[5,1]]})"},
           {key, R"({"by":"host-a","from":[[3,1]],"to":[[0,1]]})"},
           {key, R"({"by":"host-a","from":[[3,1]],"to":[[16777216,2]]})"},
           {key, R"({"by":"host-a","from":[],"to":[[1,1]]})"},
           {"/raccel/moves/host-b", R"({"by":"host-a","from":[[3,1]],"to":[[1,1]]})"},
           {"/raccel/moves/host-b/0", R"({"by":"host-a","from":[[3,1]],"to":[[1,1]]})"},
           {"/raccel/moves/host-b/7/8", R"({"by":"host-a","from":[[3,1]],"to":[[1,1]]})"},
       })
    EXPECT_FALSE(SharedPool::parseMove(k, v, "/raccel/")) << k << " " << v;
}

TEST(SharedAction, AKeyOrValueThatBreaksTheFormatIsRefused) {
  auto good = SharedPool::parseAction("/raccel/actions/host-b/7", R"({"action":"resume","by":"host-a"})", "/raccel/");
  ASSERT_TRUE(good) << good.error().message;
  EXPECT_EQ(good->scheduler, "host-b");
  EXPECT_EQ(good->vaccel, 7u);
  EXPECT_EQ(good->by, "host-a");
  EXPECT_FALSE(good->preempt);
  for (auto [k, v] : std::vector<std::pair<std::string, std::string>>{
           {"/raccel/actions/host-b/7", "not json"},
           {"/raccel/actions/host-b/7", R"({"action":"delete","by":"host-a"})"},
           {"/raccel/actions/host-b/7", R"({"action":"preempt"})"},
           {"/raccel/actions/host-b/7", R"({"action":"preempt","by":"a b"})"},
           {"/raccel/actions/host-b/0", R"({"action":"preempt","by":"host-a"})"},
           {"/raccel/actions/host-b", R"({"action":"preempt","by":"host-a"})"},
           {"/raccel/actions/host-b/7/1", R"({"action":"preempt","by":"host-a"})"},
       })
    EXPECT_FALSE(SharedPool::parseAction(k, v, "/raccel/")) << k << " " << v;
}

// The operators' drains and VM policies, and the VMs and unplaced vaccels each host
// publishes: a key or value of the wrong shape is refused where it is read.
TEST(SharedRecords, AKeyOrValueThatBreaksTheFormatIsRefused) {
  auto drain = SharedPool::parseDrain("/raccel/drains/na", R"({"by":"host-a"})", "/raccel/");
  ASSERT_TRUE(drain) << drain.error().message;
  EXPECT_EQ(drain->node, "na");
  EXPECT_EQ(drain->by, "host-a");
  auto policy = SharedPool::parsePolicy("/raccel/policies/vm-b", R"({"by":"host-a","settings":{"priority":"5"}})", "/raccel/");
  ASSERT_TRUE(policy) << policy.error().message;
  EXPECT_EQ(policy->settings, (std::map<std::string, std::string>{{"priority", "5"}}));
  auto vm = SharedPool::parseVm("/raccel/vms/host-b/vm-b", R"({"settings":{"tflops":"4","kinds":"gpu,cpu"}})", "/raccel/");
  ASSERT_TRUE(vm) << vm.error().message;
  EXPECT_EQ(vm->scheduler, "host-b");
  EXPECT_EQ(vm->settings.at("kinds"), "gpu,cpu");
  auto unplaced = SharedPool::parseUnplaced("/raccel/unplaced/host-b/7",
                                            R"({"vm":"vm-b","priority":-3,"program":"p","state":"suspended","why":"w","blocks":2})",
                                            "/raccel/");
  ASSERT_TRUE(unplaced) << unplaced.error().message;
  EXPECT_EQ(unplaced->vaccel, 7u);
  EXPECT_EQ(unplaced->priority, -3);
  EXPECT_EQ(unplaced->state, "suspended");
  const std::string longText(65, 'x');
  std::string manySettings = "{";
  for (int i = 0; i < 17; ++i) manySettings += std::string(i ? "," : "") + "\"k" + std::string(1, char('a' + i)) + "\":\"1\"";
  manySettings += "}";
  for (auto [k, v] : std::vector<std::pair<std::string, std::string>>{
           {"/raccel/drains/na", "not json"},
           {"/raccel/drains/na", R"({})"},
           {"/raccel/drains/na", R"({"by":"a b"})"},
           {"/raccel/drains/na/x", R"({"by":"host-a"})"},
           {"/raccel/drains/", R"({"by":"host-a"})"},
           {"/raccel/policies/vm-b", R"({"by":"host-a"})"},
           {"/raccel/policies/vm-b", R"({"by":"host-a","settings":{"priority":5}})"},
           {"/raccel/policies/vm-b", R"({"by":"host-a","settings":{"Priority":"5"}})"},
           {"/raccel/policies/vm-b", R"({"by":"host-a","settings":{"priority":""}})"},
           {"/raccel/policies/vm-b", R"({"by":"host-a","settings":{"priority":"5\n"}})"},
           {"/raccel/policies/vm-b", R"({"by":"host-a","settings":{"priority":")" + longText + R"("}})"},
           {"/raccel/policies/vm-b", R"({"by":"host-a","settings":)" + manySettings + "}"},
           {"/raccel/policies/vm-b/c", R"({"by":"host-a","settings":{}})"},
           {"/raccel/vms/host-b", R"({"settings":{}})"},
           {"/raccel/vms/host-b/vm-b", R"({"settings":[]})"},
           {"/raccel/unplaced/host-b/0", R"({"vm":"v","priority":0,"state":"waiting","blocks":1})"},
           {"/raccel/unplaced/host-b/7", R"({"vm":"v","priority":0,"state":"running","blocks":1})"},
           {"/raccel/unplaced/host-b/7", R"({"vm":"v","priority":1001,"state":"waiting","blocks":1})"},
           {"/raccel/unplaced/host-b/7", R"({"vm":"v","priority":0,"state":"waiting","blocks":-1})"},
           {"/raccel/unplaced/host-b/7", R"({"vm":"v","priority":0,"state":"waiting"})"},
           {"/raccel/unplaced/host-b/7", R"({"priority":0,"state":"waiting","blocks":1})"},
           {"/raccel/unplaced/host-b/7", R"({"vm":"v","priority":0,"state":"waiting","blocks":1,"why":)" +
                                             nlohmann::json(std::string(513, 'w')).dump() + "}"},
       }) {
    bool refused = true;
    if (k.find("/drains/") != std::string::npos) refused = !SharedPool::parseDrain(k, v, "/raccel/");
    else if (k.find("/policies/") != std::string::npos) refused = !SharedPool::parsePolicy(k, v, "/raccel/");
    else if (k.find("/vms/") != std::string::npos) refused = !SharedPool::parseVm(k, v, "/raccel/");
    else refused = !SharedPool::parseUnplaced(k, v, "/raccel/");
    EXPECT_TRUE(refused) << k << " " << v;
  }
}

// One scheduler leads (plans the moves) at a time: the first to seek it; when it leaves,
// its key ends with its lease and another takes over. A leader key that names no live
// scheduler (written by hand, without a lease) or does not parse is taken over.
TEST_F(SharedPoolTest, OneSchedulerLeadsAndAnotherTakesOverWhenItLeaves) {
  auto a = join("host-a");
  auto b = join("host-b");
  ASSERT_TRUE(a && b);
  auto led = a->campaign();
  ASSERT_TRUE(led) << led.error().message;
  EXPECT_TRUE(*led);
  ASSERT_TRUE(waitFor([&] { return b->leader() == "host-a"; }, 10000)) << b->leader();
  led = b->campaign();
  ASSERT_TRUE(led) << led.error().message;
  EXPECT_FALSE(*led);
  EXPECT_TRUE(a->leads());
  EXPECT_FALSE(b->leads());
  ASSERT_TRUE(a->leave());
  ASSERT_TRUE(waitFor([&] { return b->leader().empty(); }, 10000)) << b->leader();
  led = b->campaign();
  ASSERT_TRUE(led) << led.error().message;
  EXPECT_TRUE(*led);
  EXPECT_TRUE(b->leads());
  for (const char* stale : {R"({"scheduler":"gone"})", "not json", R"({"scheduler":"a/b"})"}) {
    ASSERT_TRUE(client_->put("/raccel/leader", stale));
    ASSERT_TRUE(waitFor([&] { return b->leader().empty(); }, 10000)) << stale;
    EXPECT_FALSE(b->leads());
    led = b->campaign();
    ASSERT_TRUE(led) << led.error().message;
    EXPECT_TRUE(*led) << stale;
    EXPECT_EQ(b->leader(), "host-b");
  }
}

TEST_F(SharedPoolTest, SchedulersShareOneNumberingAndSeeEachOthersHoldings) {
  auto a = join("host-a");
  auto b = join("host-b");
  ASSERT_TRUE(a && b);
  auto n1 = a->registerNode("n1", cpuCards({8}), {}, a->lease());
  ASSERT_TRUE(n1) << n1.error().message;
  auto n2 = b->registerNode("n2", cpuCards({4, 2}), {}, b->lease());
  ASSERT_TRUE(n2) << n2.error().message;
  EXPECT_EQ(*n1, (BlockRange{1, 8}));
  EXPECT_EQ(*n2, (BlockRange{9, 6}));
  // A node that comes back keeps its numbers; with other cards it is refused.
  auto again = b->registerNode("n1", cpuCards({8}), {}, b->lease());
  ASSERT_TRUE(again) << again.error().message;
  EXPECT_EQ(*again, (BlockRange{1, 8}));
  auto changed = b->registerNode("n1", cpuCards({6}), {}, b->lease());
  ASSERT_FALSE(changed);
  EXPECT_NE(changed.error().message.find("other cards"), std::string::npos) << changed.error().message;

  auto held = a->allocate(1, "vm-a", blocks(10));
  ASSERT_TRUE(held) << held.error().message;
  auto other = b->allocate(1, "vm-b", blocks(4));  // the same vaccel number on another host
  ASSERT_TRUE(other) << other.error().message;
  ASSERT_TRUE(a->waitForRevision(b->view().revision, 10000));
  for (auto* s : {a.get(), b.get()}) {
    auto v = s->view();
    EXPECT_EQ(v.total, 14u);
    EXPECT_EQ(v.free, 0u);
    ASSERT_EQ(v.nodes.size(), 2u);
    EXPECT_EQ(v.nodes[1].name, "n2");
    ASSERT_EQ(v.holdings.size(), 2u);
    EXPECT_EQ(v.holdings[0].scheduler, "host-a");
    EXPECT_EQ(v.holdings[0].vm, "vm-a");
    EXPECT_EQ(v.holdings[1].scheduler, "host-b");
  }
  auto none = b->allocate(2, "vm-b", blocks(1));
  ASSERT_FALSE(none);
  EXPECT_EQ(none.error().code, Code::resourceExhausted) << none.error().message;
  auto never = b->allocate(3, "vm-b", blocks(15));
  ASSERT_FALSE(never);
  EXPECT_NE(never.error().message.find("can never"), std::string::npos) << never.error().message;

  ASSERT_TRUE(a->release(1));
  ASSERT_TRUE(b->waitForRevision(a->view().revision, 10000));
  auto now = b->allocate(2, "vm-b", blocks(10));
  ASSERT_TRUE(now) << now.error().message;
  // A second scheduler under a name that is alive is refused.
  SharedPoolOptions twin;
  twin.scheduler = "host-a";
  auto refused = SharedPool::open(*client_, twin);
  ASSERT_FALSE(refused);
  EXPECT_NE(refused.error().message.find("already in the pool"), std::string::npos) << refused.error().message;
}

TEST_F(SharedPoolTest, ExactlyOneOfTwoSchedulersWinsTheLastFreeBlocks) {
  auto a = join("host-a");
  auto b = join("host-b");
  ASSERT_TRUE(a && b);
  ASSERT_TRUE(a->registerNode("n1", cpuCards({8}), {}, a->lease()));
  for (uint64_t round = 1; round <= 20; ++round) {
    ASSERT_TRUE(b->waitForRevision(a->view().revision, 10000));
    std::atomic<int> go{0};
    Result<std::vector<BlockRange>> ra = fail(Code::internal, "not run"), rb = fail(Code::internal, "not run");
    std::thread ta([&] {
      go.fetch_add(1);
      while (go.load() < 2) {}
      ra = a->allocate(round, "vm-a", blocks(6));
    });
    std::thread tb([&] {
      go.fetch_add(1);
      while (go.load() < 2) {}
      rb = b->allocate(round, "vm-b", blocks(6));
    });
    ta.join();
    tb.join();
    ASSERT_NE(ra.has_value(), rb.has_value()) << "round " << round << ": " << (ra ? "both won" : ra.error().message);
    auto& loser = ra ? rb : ra;
    EXPECT_EQ(loser.error().code, Code::resourceExhausted) << loser.error().message;
    ASSERT_TRUE(ra ? a->release(round) : b->release(round));
  }
  Audit report = audit(*client_, "/raccel/");
  EXPECT_EQ(report.doubleHeld, 0u);
  EXPECT_EQ(report.heldAtEnd, 0u);
  EXPECT_EQ(report.events, 40u);
}

TEST_F(SharedPoolTest, RacingSchedulersNeverHoldABlockTwice) {
  // Three schedulers, each its own process, 200 admissions and releases each, on a pool
  // of 14 blocks that cannot hold what they ask for at once.
  std::string dir = etcd_->dir();
  testing::Process host("raccel-pool-race", {"--etcd", etcd_->endpoints(), "--name", "nodes", "--node", "n1:8",
                                             "--node", "n2:6", "--admissions", "0", "--hold", "--lease-ttl", "60"},
                        dir + "/nodes.log");
  ASSERT_TRUE(waitFor([&] { return testing::readFile(dir + "/nodes.log").find("admitted") != std::string::npos; }, 30000))
      << testing::readFile(dir + "/nodes.log");
  std::vector<std::unique_ptr<testing::Process>> racers;
  for (int i = 0; i < 3; ++i)
    racers.push_back(std::make_unique<testing::Process>(
        "raccel-pool-race",
        std::vector<std::string>{"--etcd", etcd_->endpoints(), "--name", "host-" + std::to_string(i), "--admissions",
                                 "200", "--window", "2", "--max-blocks", "4", "--seed", std::to_string(i + 1)},
        dir + "/racer" + std::to_string(i) + ".log"));
  uint64_t admitted = 0, refused = 0;
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(racers[static_cast<size_t>(i)]->wait(240000), 0);
    std::string out = testing::readFile(dir + "/racer" + std::to_string(i) + ".log");
    auto line = out.substr(out.find('{'));
    auto j = nlohmann::json::parse(line.substr(0, line.find('\n')), nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << out;
    EXPECT_EQ(j["errors"], 0) << out;
    admitted += j["admitted"].get<uint64_t>();
    refused += j["refused"].get<uint64_t>();
  }
  EXPECT_EQ(admitted + refused, 600u);
  EXPECT_GT(admitted, 0u);
  EXPECT_GT(refused, 0u) << "the pool was meant to be too small for all of them";
  Audit report = audit(*client_, "/raccel/");
  EXPECT_EQ(report.doubleHeld, 0u) << "a block was held by two vaccels at once";
  EXPECT_EQ(report.events, 2 * admitted) << "each admission is one holding put and one delete";
  EXPECT_EQ(report.heldAtEnd, 0u);
  auto observer = join("observer");
  ASSERT_TRUE(observer);
  auto v = observer->view();
  EXPECT_EQ(v.total, 14u);
  EXPECT_EQ(v.free, 14u);
  EXPECT_TRUE(v.holdings.empty());
}

TEST_F(SharedPoolTest, AKilledSchedulersBlocksReturnWhenItsLeaseExpires) {
  auto b = join("host-b");
  ASSERT_TRUE(b);
  ASSERT_TRUE(b->registerNode("n1", cpuCards({8}), {}, b->lease()));
  std::string log = etcd_->dir() + "/victim.log";
  testing::Process victim("raccel-pool-race", {"--etcd", etcd_->endpoints(), "--name", "host-a", "--admissions", "2",
                                               "--window", "2", "--max-blocks", "3", "--hold", "--lease-ttl", "2"},
                          log);
  ASSERT_TRUE(waitFor([&] { return b->view().free < 8; }, 30000)) << testing::readFile(log);
  uint32_t freeWhileAlive = b->view().free;
  auto mine = b->allocate(1, "vm-b", blocks(1));
  ASSERT_TRUE(mine) << mine.error().message;
  victim.kill(SIGKILL);
  victim.wait(10000);
  // Its lease (2 s) ends; etcd deletes what it held; every view sees the blocks free.
  ASSERT_TRUE(waitFor([&] { return b->view().free == 7; }, 30000)) << "free: " << b->view().free;
  EXPECT_LT(freeWhileAlive, 8u);
  auto v = b->view();
  ASSERT_EQ(v.holdings.size(), 1u);
  EXPECT_EQ(v.holdings[0].scheduler, "host-b");  // another host's tenant kept its blocks
}

TEST_F(SharedPoolTest, ANetaccelIsOnlineUnderItsOwnLeaseAndKeepsItsNumbers) {
  auto a = join("host-a");  // sets the pool's block size
  ASSERT_TRUE(a);
  std::string dir = etcd_->dir();
  {
    std::ofstream config(dir + "/netaccel.conf");
    config << "etcd_lease_ttl = 2\n";
  }
  // No scheduler listens at its address: the netaccel keeps trying that link, and is in
  // the shared pool all the same.
  std::vector<std::string> args{"--config", dir + "/netaccel.conf", "--name", "na1", "--insecure", "--scheduler",
                                "127.0.0.1:" + std::to_string(testing::freePort()), "--discover", "none",
                                "--card", "kind=cpu,tflops=4,memory=1GiB", "--card", "kind=gpu,tflops=6,memory=1GiB",
                                "--http-listen", "off", "--etcd", etcd_->endpoints()};
  auto online = [&] {
    auto v = a->view();
    return v.nodes.size() == 1 && v.nodes[0].online ? v.nodes[0].blocks : BlockRange{};
  };
  {
    testing::Process netaccel("raccel-netaccel", args, dir + "/na1.log");
    ASSERT_TRUE(waitFor([&] { return online().count == 10; }, 60000)) << testing::readFile(dir + "/na1.log");
    EXPECT_EQ(online(), (BlockRange{1, 10}));
    EXPECT_EQ(a->view().total, 10u);
    auto got = a->allocate(1, "vm-a", blocks(10));
    ASSERT_TRUE(got) << got.error().message;
    ASSERT_TRUE(a->release(1));
    // Killed: its lease (2 s) ends and it goes offline for every scheduler.
    netaccel.kill(SIGKILL);
    netaccel.wait(10000);
    ASSERT_TRUE(waitFor([&] { return online().count == 0; }, 30000));
    EXPECT_EQ(a->view().total, 0u);
    EXPECT_FALSE(a->allocate(2, "vm-a", blocks(1)));
  }
  {
    // Back with the same cards: the same numbers. With a lease of 10 minutes, going
    // offline soon after a clean stop shows the lease was revoked, not left to end.
    std::ofstream(dir + "/netaccel.conf") << "etcd_lease_ttl = 600\n";
    testing::Process netaccel("raccel-netaccel", args, dir + "/na1-again.log");
    ASSERT_TRUE(waitFor([&] { return online().count == 10; }, 60000)) << testing::readFile(dir + "/na1-again.log");
    EXPECT_EQ(online(), (BlockRange{1, 10}));
    netaccel.kill(SIGTERM);
    EXPECT_EQ(netaccel.wait(30000), 0);
    EXPECT_TRUE(waitFor([&] { return online().count == 0; }, 60000)) << "a clean stop revokes the lease";
  }
}

TEST_F(SharedPoolTest, ValuesThatBreakTheFormatAreRefusedAndNeverLeadToADoubleHold) {
  auto a = join("host-a");
  ASSERT_TRUE(a);
  ASSERT_TRUE(a->registerNode("n1", cpuCards({8}), {}, a->lease()));
  // Written by hand, or by a stranger with access to etcd.
  ASSERT_TRUE(client_->put("/raccel/holds/stranger/1", "{not json"));
  ASSERT_TRUE(client_->put("/raccel/holds/stranger/2", R"({"vm":"x","priority":0,"ranges":[[100,5]]})"));
  ASSERT_TRUE(client_->put("/raccel/holds/stranger/3", R"({"vm":"x","priority":0,"ranges":[[7,2]]})"));
  ASSERT_TRUE(client_->put("/raccel/holds/stranger/4", R"({"vm":"x","priority":0,"ranges":[[8,1],[1,1]]})"));
  ASSERT_TRUE(client_->put("/raccel/nodes/bogus", R"({"first":1,"blocks":999,"cards":"many"})"));
  ASSERT_TRUE(client_->put("/raccel/nodes/bad name", "{}"));
  auto b = join("host-b");
  ASSERT_TRUE(b);
  auto v = b->view();
  EXPECT_EQ(v.total, 8u);
  // stranger/3 holds 7-8 (valid); stranger/4 overlaps it on 8, so it is refused, and its
  // other block (1) is kept from placement all the same.
  EXPECT_EQ(v.free, 5u);
  EXPECT_GE(b->stats().refusedValues, 4u);
  auto got = b->allocate(1, "vm-b", blocks(5));
  ASSERT_TRUE(got) << got.error().message;
  for (auto& r : *got)
    for (uint32_t blk = r.first; blk < r.end(); ++blk) EXPECT_TRUE(blk >= 2 && blk <= 6) << blk;
  EXPECT_FALSE(b->allocate(2, "vm-b", blocks(1)));
  // The bad values go; the view follows.
  ASSERT_TRUE(client_->removePrefix("/raccel/holds/stranger/"));
  ASSERT_TRUE(waitFor([&] { return b->view().free == 3; }, 10000)) << b->view().free;
}

// A node record that breaks the format leaves a gap in the numbering: it is held by an
// offline placeholder, so the nodes numbered after it keep theirs and stay usable.
TEST_F(SharedPoolTest, ARefusedNodeRecordHidesNoOtherNode) {
  auto a = join("host-a");
  ASSERT_TRUE(a);
  ASSERT_TRUE(a->registerNode("n1", cpuCards({4}), {}, a->lease()));
  ASSERT_TRUE(a->registerNode("n2", cpuCards({2}), {}, a->lease()));
  auto n3 = a->registerNode("n3", cpuCards({4}), {}, a->lease());
  ASSERT_TRUE(n3) << n3.error().message;
  EXPECT_EQ(*n3, (BlockRange{7, 4}));
  ASSERT_TRUE(client_->put("/raccel/nodes/n2", "{broken"));
  auto b = join("host-b");
  ASSERT_TRUE(b);
  auto v = b->view();
  EXPECT_EQ(v.total, 8u);
  EXPECT_EQ(v.free, 8u);
  EXPECT_GE(b->stats().refusedValues, 1u);
  bool sawN3 = false;
  for (auto& n : v.nodes)
    if (n.name == "n3") {
      sawN3 = true;
      EXPECT_EQ(n.blocks, (BlockRange{7, 4}));
    }
  EXPECT_TRUE(sawN3) << "n3 is hidden";
  // All 8 blocks go, none of them n2's old numbers; its online key brings no gap online.
  ASSERT_TRUE(client_->put("/raccel/online/~gap@5", "{}"));
  auto got = b->allocate(1, "vm-b", blocks(8));
  ASSERT_TRUE(got) << got.error().message;
  for (auto& r : *got)
    for (uint32_t blk = r.first; blk < r.end(); ++blk) EXPECT_TRUE(blk <= 4 || blk >= 7) << blk;
  EXPECT_FALSE(b->allocate(2, "vm-b", blocks(1)));
}

TEST_F(SharedPoolTest, AdmissionsGoOnWithOneEtcdMemberDown) {
  auto a = join("host-a");
  ASSERT_TRUE(a);
  ASSERT_TRUE(a->registerNode("n1", cpuCards({8}), {}, a->lease()));
  for (int member = 0; member < 3; ++member) {
    etcd_->kill(member);
    for (uint64_t i = 1; i <= 10; ++i) {
      uint64_t id = static_cast<uint64_t>(member) * 100 + i;
      auto got = a->allocate(id, "vm-a", blocks(3));
      ASSERT_TRUE(got) << "member m" << member << " down: " << got.error().message;
      ASSERT_TRUE(a->release(id));
    }
    auto back = etcd_->restart(member);
    ASSERT_TRUE(back) << back.error().message;
  }
}

TEST_F(SharedPoolTest, WithEtcdGoneAdmissionsAreRefusedNamingItAndResumeWhenItReturns) {
  auto a = join("host-a", 10);
  ASSERT_TRUE(a);
  ASSERT_TRUE(a->registerNode("n1", cpuCards({8}), {}, a->lease()));
  auto running = a->allocate(1, "vm-a", blocks(3));
  ASSERT_TRUE(running) << running.error().message;
  for (int m = 0; m < 3; ++m) etcd_->kill(m);
  auto refused = a->allocate(2, "vm-a", blocks(1));
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code, Code::unavailable) << refused.error().message;
  EXPECT_NE(refused.error().message.find("etcd"), std::string::npos) << refused.error().message;
  auto back = etcd_->restartAll();
  ASSERT_TRUE(back) << back.error().message;
  // etcd keeps leases across its own outage: the running vaccel still holds its blocks.
  Result<std::vector<BlockRange>> later = fail(Code::internal, "not tried");
  ASSERT_TRUE(waitFor([&] { return (later = a->allocate(2, "vm-a", blocks(5))).has_value(); }, 30000))
      << later.error().message;
  auto v = a->view();
  EXPECT_EQ(v.free, 0u);
  EXPECT_EQ(v.holdings.size(), 2u);
}

}  // namespace
}  // namespace raccel
