// Many VM hosts, one pool: raccel-scheduler with --etcd on a real 3-member etcd cluster.
// Three hosts (each a scheduler with its own VM), two netaccels registered in etcd and
// linked to every scheduler, real programs through raccel-guestd. Covers: each host's
// program runs on blocks of both netaccels; each host sees the other's holdings; the
// two racing for the last blocks: one wins, the other is refused; a scheduler killed with -9 gives its blocks back
// within its lease while the other host's program goes on; a higher-priority program
// preempting another host's vaccel (answered by that host, or by its lease when it is
// dead); with every etcd member down,
// a running program goes on and a new one is refused naming etcd, and admissions resume
// when etcd returns.
#include <gtest/gtest.h>
#include <signal.h>

#include <nlohmann/json.hpp>
#include <algorithm>
#include <fstream>
#include <map>
#include <atomic>
#include <set>
#include <tuple>
#include <sstream>
#include <thread>

#include "scheduler/etcd/etcd_client.h"
#include "scheduler/etcd/shared_pool.h"
#include "tests/cluster.h"
#include "tests/etcd_cluster.h"
#include "tests/raw_http.h"
#include "vmfrontend/raccel.h"

namespace raccel::testing {
namespace {

using client::Session;
using scheduler::BlockRange;
using scheduler::SharedHolding;
using scheduler::SharedPool;
using nlohmann::json;

Result<std::unique_ptr<Session>> openOn(const std::string& guestd, const std::string& program, double tflops = 2) {
  return openSession(guestd, tflops, program);
}

// A program of priority `priority` (the VM's policy caps it) that waits up to a minute
// for its blocks.
Result<std::unique_ptr<Session>> openWaiting(const std::string& guestd, double tflops, const std::string& program, int priority) {
  client::Options o;
  o.socket = guestd;
  o.tflops = tflops;
  o.program = program;
  o.timeoutMs = 30000;
  o.admitWaitMs = 60000;
  o.priority = priority;
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
    a_ = host("host-a", vmsA_);
    b_ = host("host-b", {vmB_});
    c_ = host("host-c", {"vm-c"});
    // Each netaccel registers itself in etcd and links to both hosts' schedulers.
    std::string all;
    for (auto* h : {a_.get(), b_.get(), c_.get()}) all += (all.empty() ? "" : ",") + ("127.0.0.1:" + std::to_string(h->nodePort()));
    // Their context grace is the default minute: a vanished scheduler's contexts go
    // when its lease does.
    for (auto [host, name] : {std::pair{a_.get(), "na"}, std::pair{b_.get(), "nb"}})
      host->addNetaccel(name, {"kind=cpu,tflops=4"}, 4, {"--etcd", etcd_->endpoints(), "--scheduler", all});
    ASSERT_TRUE(waitFor([&] { return a_->poolTotal() == 8 && b_->poolTotal() == 8 && c_->poolTotal() == 8; }, 15000))
        << logs();
    guestdA_ = a_->startGuestd("vm-a");
    guestdB_ = b_->startGuestd(vmB_);
    guestdC_ = c_->startGuestd("vm-c");
  }

  std::unique_ptr<Cluster> host(const std::string& name, const std::vector<std::string>& vms) {
    std::vector<VmSpec> specs;
    for (auto& vm : vms) specs.push_back(VmSpec{.name = vm});
    return std::make_unique<Cluster>(specs, "",
                                     std::vector<std::string>{"--insecure", "--etcd", etcd_->endpoints(), "--name", name,
                                                              "--set", "etcd_lease_ttl=" + std::to_string(leaseTtl_)});
  }

  // A sample of both netaccels' /metrics, summed (-1 when one cannot be read).
  double netaccelSum(const std::string& family) const {
    double sum = 0;
    for (auto [host, name] : {std::pair{a_.get(), "na"}, std::pair{b_.get(), "nb"}}) {
      std::string page = rawhttp::roundTrip(host->netaccelHttpPort(name), "GET /metrics HTTP/1.0\r\n\r\n");
      std::istringstream in(page);
      std::string line;
      bool found = false;
      while (std::getline(in, line))
        if (line.starts_with(family + "{") && line.find("node=\"" + std::string(name) + "\"") != std::string::npos) {
          sum += std::stod(line.substr(line.rfind(' ') + 1));
          found = true;
        }
      if (!found) return -1;
    }
    return sum;
  }

  std::string logs() const {
    std::string out;
    for (auto* h : {a_.get(), b_.get(), c_.get()})
      if (h) out += h->logs();
    return out;
  }

  // The vaccel of `host`'s program `program`, from its console (an empty object when
  // it is not listed).
  static json vaccelOf(const Cluster& host, const std::string& program) {
    auto v = json::parse(host.console("vaccels"), nullptr, false);
    if (v.is_discarded() || !v.contains("vaccels")) return json::object();
    for (auto& e : v["vaccels"])
      if (e.value("program", "") == program && e.value("host", "").empty()) return e;
    return json::object();
  }

  int leaseTtl_ = 2;  // seconds: each scheduler's etcd lease
  std::vector<std::string> vmsA_{"vm-a"};  // host A's VMs (guestdA_ serves the first)
  std::string vmB_ = "vm-b";                // host B's VM
  std::unique_ptr<EtcdCluster> etcd_;
  std::unique_ptr<Cluster> a_, b_, c_;
  std::string guestdA_, guestdB_, guestdC_;
};

// The pool as a host's console shows it: each range's blocks, state and node.
std::vector<std::tuple<int, int, std::string, std::string>> poolShape(const Cluster& host) {
  std::vector<std::tuple<int, int, std::string, std::string>> out;
  auto pool = json::parse(host.console("pool"), nullptr, false);
  if (pool.is_discarded() || !pool.contains("ranges")) return out;
  for (auto& r : pool["ranges"]) out.emplace_back(r.value("first", 0), r.value("count", 0), r.value("state", ""), r.value("node", ""));
  return out;
}

TEST_F(MultiHost, EachHostRunsItsProgramAndSeesTheOthersHoldings) {
  auto onA = openOn(guestdA_, "prog-a");
  ASSERT_TRUE(onA) << onA.error().message << logs();
  auto onB = openOn(guestdB_, "prog-b");
  ASSERT_TRUE(onB) << onB.error().message << logs();
  auto onC = openOn(guestdC_, "prog-c");
  ASSERT_TRUE(onC) << onC.error().message << logs();
  std::string why;
  EXPECT_TRUE(gemmWorks(**onA, 1, &why)) << why;
  EXPECT_TRUE(gemmWorks(**onB, 2, &why)) << why;
  EXPECT_TRUE(gemmWorks(**onC, 9, &why)) << why;
  // The console of every host shows the same pool: 6 of 8 blocks used, the same ranges.
  EXPECT_TRUE(waitFor(
      [&] {
        auto shape = poolShape(*a_);
        return shape == poolShape(*b_) && shape == poolShape(*c_) &&
               std::count_if(shape.begin(), shape.end(), [](auto& r) { return std::get<2>(r) == "used"; }) >= 2;
      },
      10000))
      << a_->console("pool") << "\n" << b_->console("pool") << "\n" << c_->console("pool");
  // Each host's pool shows the other host's vaccel, by its scheduler and VM.
  auto heldElsewhere = [](const std::vector<std::string>& owners, const std::string& prefix) {
    return std::any_of(owners.begin(), owners.end(), [&](const std::string& o) { return o.starts_with(prefix); });
  };
  EXPECT_TRUE(waitFor([&] { return heldElsewhere(usedBy(*a_), "host-b/vm-b#"); }, 10000)) << a_->console("pool");
  EXPECT_TRUE(waitFor([&] { return heldElsewhere(usedBy(*b_), "host-a/vm-a#"); }, 10000)) << b_->console("pool");
  // Every host's vaccels list shows the others' too, by host, id and blocks, and the
  // raccelctl table names their hosts.
  const uint64_t idOnA = (*onA)->vaccel().id;
  auto listedOnB = [&] {
    auto v = json::parse(b_->console("vaccels"), nullptr, false);
    if (v.is_discarded() || !v.contains("vaccels")) return json();
    for (auto& e : v["vaccels"])
      if (e.value("host", "") == "host-a" && e.value("id", uint64_t{0}) == idOnA) return e;
    return json();
  };
  EXPECT_TRUE(waitFor([&] { return !listedOnB().is_null(); }, 10000)) << b_->console("vaccels");
  json fromA = listedOnB();
  if (!fromA.is_null()) {
    EXPECT_EQ(fromA["state"], "elsewhere");
    EXPECT_EQ(fromA["vm"], "vm-a");
    EXPECT_EQ(fromA["program"], "prog-a");
    ASSERT_EQ(fromA["blocks"].size(), (*onA)->vaccel().blocks.size());
    EXPECT_EQ(fromA["blocks"][0]["first"], (*onA)->vaccel().blocks[0].first);
  }
  auto own = json::parse(b_->console("vaccels"), nullptr, false);
  ASSERT_FALSE(own.is_discarded());
  EXPECT_TRUE(std::any_of(own["vaccels"].begin(), own["vaccels"].end(),
                          [](const json& e) { return e.value("host", "x").empty() && e.value("vm", "") == "vm-b"; }))
      << own.dump();
  std::string table = b_->ctl({"vaccels"});
  EXPECT_NE(table.find("HOST"), std::string::npos) << table;
  EXPECT_NE(table.find("host-a"), std::string::npos) << table;
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

// Each host's program spans both netaccels (5 of their 8 blocks, then 3), and the
// last blocks go to one host only.
TEST_F(MultiHost, ProgramsOfBothHostsRunOnBothNetaccelsAndTheLastBlocksGoToOne) {
  auto onA = openOn(guestdA_, "wide-a", 5);
  ASSERT_TRUE(onA) << onA.error().message << logs();
  auto onB = openOn(guestdB_, "rest-b", 3);
  ASSERT_TRUE(onB) << onB.error().message << logs();
  std::set<std::string> nodesA;
  for (auto& c : (*onA)->vaccel().cards) nodesA.insert(c.node);
  EXPECT_EQ(nodesA, (std::set<std::string>{"na", "nb"})) << (*onA)->vaccel().describe();
  std::string why;
  EXPECT_TRUE(gemmWorks(**onA, 7, &why)) << why;
  EXPECT_TRUE(gemmWorks(**onB, 8, &why)) << why;
  // The pool is full: both hosts ask for a block at once; neither may get it.
  std::vector<Result<std::unique_ptr<Session>>> late;
  std::thread other([&] { late.push_back(openOn(guestdB_, "late-b", 1)); });
  auto lateA = openOn(guestdA_, "late-a", 1);
  other.join();
  EXPECT_FALSE(lateA);
  ASSERT_EQ(late.size(), 1u);
  EXPECT_FALSE(late[0]);
  // One block freed on host B: exactly one of two racing hosts gets it.
  (*onB).reset();
  auto freeOn = [](const Cluster& host) {
    auto pool = json::parse(host.console("pool"), nullptr, false);
    return pool.is_discarded() ? -1 : pool.value("free", -1);
  };
  ASSERT_TRUE(waitFor([&] { return freeOn(*a_) == 3 && freeOn(*b_) == 3; }, 10000)) << a_->console("pool");
  auto three = openOn(guestdB_, "two-b", 2);
  ASSERT_TRUE(three) << three.error().message;
  ASSERT_TRUE(waitFor([&] { return freeOn(*a_) == 1 && freeOn(*b_) == 1; }, 10000)) << a_->console("pool");
  late.clear();
  std::thread racer([&] { late.push_back(openOn(guestdB_, "race-b", 1)); });
  auto raceA = openOn(guestdA_, "race-a", 1);
  racer.join();
  EXPECT_EQ(int(bool(raceA)) + int(bool(late[0])), 1) << (raceA ? "" : raceA.error().message) << " / "
                                                      << (late[0] ? "" : late[0].error().message);
  // The loser is refused (it asked not to wait): no room now, or the pool kept changing.
  for (auto* r : {&raceA, &late[0]}) {
    if (*r) continue;
    EXPECT_TRUE(r->error().code == Code::resourceExhausted || r->error().code == Code::unavailable) << r->error().message;
  }
}

TEST_F(MultiHost, AKilledSchedulersBlocksReturnWithinItsLeaseAndTheOtherHostGoesOn) {
  auto onA = openOn(guestdA_, "prog-a");
  ASSERT_TRUE(onA) << onA.error().message << logs();
  auto onB = openOn(guestdB_, "prog-b");
  ASSERT_TRUE(onB) << onB.error().message << logs();
  ASSERT_TRUE(waitFor([&] { return !usedBy(*b_).empty() && usedBy(*b_).size() >= 2; }, 10000)) << b_->console("pool");
  EXPECT_EQ(netaccelSum("raccel_netaccel_connected"), 6);  // each netaccel with all three schedulers
  double contexts = 0;
  ASSERT_TRUE(waitFor([&] { return (contexts = netaccelSum("raccel_card_contexts")) >= 2; }, 10000)) << contexts;
  const double ofA = static_cast<double>((*onA)->vaccel().cards.size());
  a_->scheduler().kill(SIGKILL);
  // Host A's holding ends with its lease (2 s; etcd checks leases every 500 ms).
  EXPECT_TRUE(waitFor(
      [&] {
        auto owners = usedBy(*b_);
        return std::none_of(owners.begin(), owners.end(), [](const std::string& o) { return o.starts_with("host-a/"); });
      },
      15000))
      << b_->console("pool");
  // The netaccels drop the dead scheduler's contexts with its lease, long before their
  // minute of grace; B's stay.
  EXPECT_TRUE(waitFor([&] { return netaccelSum("raccel_card_contexts") == contexts - ofA; }, 15000))
      << netaccelSum("raccel_card_contexts") << " contexts, " << contexts << " before" << logs();
  EXPECT_NE(logs().find("('host-a'): its etcd lease ended"), std::string::npos) << logs();
  EXPECT_EQ(netaccelSum("raccel_netaccel_connected"), 4);  // A is gone
  std::string why;
  EXPECT_TRUE(gemmWorks(**onB, 3, &why)) << why;
}

// A scheduler cut off from etcd for longer than its lease (here: stopped, its lease
// revoked) loses its holdings. Back, it joins again and claims its vaccel's blocks; when
// another host took them meanwhile, its vaccel is suspended with its data kept, and it
// resumes (same results) when that host lets go.
TEST_F(MultiHost, ASchedulerWhoseLeaseLapsedClaimsItsBlocksBackOrSuspendsItsVaccel) {
  auto client = etcd::Client::open({etcd_->endpointList()});
  ASSERT_TRUE(client) << client.error().message;
  auto leaseOf = [&](const std::string& scheduler) -> int64_t {
    auto r = (*client)->range("/raccel/schedulers/" + scheduler);
    if (!r || r->kvs_size() != 1) return 0;
    auto j = json::parse(r->kvs(0).value(), nullptr, false);
    return j.is_discarded() ? 0 : j.value("lease", int64_t{0});
  };
  auto holdsOf = [&](const std::string& scheduler) {
    auto r = (*client)->range("/raccel/holds/" + scheduler + "/");
    return r ? r->kvs_size() : -1;
  };
  auto onA = openOn(guestdA_, "keep-a");
  ASSERT_TRUE(onA) << onA.error().message << logs();
  auto a = randomFloats(1024, 11);
  uint64_t buffer = (*onA)->alloc(a.size() * 4);
  (*onA)->writeFloats(buffer, a);
  ASSERT_TRUE((*onA)->fence());
  // 1. The lease revoked while A runs: A joins again and claims its blocks back.
  int64_t first = leaseOf("host-a");
  ASSERT_NE(first, 0);
  ASSERT_TRUE((*client)->revokeLease(first));
  EXPECT_TRUE(waitFor([&] { return leaseOf("host-a") != 0 && leaseOf("host-a") != first && holdsOf("host-a") == 1; }, 15000))
      << logs();
  auto back = (*onA)->readFloats(buffer, a.size());
  ASSERT_TRUE(back) << back.error().message;
  EXPECT_EQ(*back, a);
  // 2. A stopped, its lease revoked, and B takes every block meanwhile.
  int64_t second = leaseOf("host-a");
  a_->scheduler().kill(SIGSTOP);
  ASSERT_TRUE((*client)->revokeLease(second));
  std::unique_ptr<Session> all;
  EXPECT_TRUE(waitFor(
      [&] {
        auto s = openOn(guestdB_, "all-b", 8);
        if (s) all = std::move(*s);
        return all != nullptr;
      },
      15000))
      << logs();
  a_->scheduler().kill(SIGCONT);
  auto phaseOnA = [&] {
    auto v = json::parse(a_->console("vaccels"), nullptr, false);
    if (v.is_discarded() || !v.contains("vaccels") || v["vaccels"].empty()) return std::string();
    return v["vaccels"][0].value("state", std::string());
  };
  EXPECT_TRUE(waitFor([&] { return phaseOnA() == "suspended"; }, 15000)) << a_->console("vaccels") << logs();
  // B lets go: A's vaccel resumes with its buffer.
  all.reset();
  EXPECT_TRUE(waitFor([&] { return phaseOnA() == "running"; }, 15000)) << a_->console("vaccels") << logs();
  back = (*onA)->readFloats(buffer, a.size());
  ASSERT_TRUE(back) << back.error().message;
  EXPECT_EQ(*back, a);
}

// Preemption across hosts. Host A's program of a higher priority needs blocks that host
// B's program holds: A records the request in etcd, B suspends its vaccel (its buffer
// saved) and A's admission completes. Requests B must not answer (a stranger's, one of
// a priority not above its vaccel's) leave it running. When A's program ends, B's
// resumes with its data.
TEST_F(MultiHost, AHigherPriorityProgramPreemptsAnotherHostsVaccel) {
  int status = 0;
  std::string out = a_->ctl({"set-policy", "vm-a", "priority=3"}, &status);
  ASSERT_EQ(status, 0) << out;
  auto onB = openOn(guestdB_, "low-b", 6);
  ASSERT_TRUE(onB) << onB.error().message << logs();
  auto data = randomFloats(2048, 21);
  uint64_t buffer = (*onB)->alloc(data.size() * 4);
  (*onB)->writeFloats(buffer, data);
  ASSERT_TRUE((*onB)->fence());
  const uint64_t idB = (*onB)->vaccel().id;
  // Requests B must refuse: a scheduler that is not in the pool, and a live one whose
  // priority is not above the vaccel's (host-c's name, written by hand).
  auto client = etcd::Client::open({etcd_->endpointList()});
  ASSERT_TRUE(client) << client.error().message;
  const std::string victim = "/raccel/preempt/host-b/" + std::to_string(idB) + "/";
  ASSERT_TRUE((*client)->put(victim + "stranger/1", R"({"vm":"vm-x","priority":3000})"));
  ASSERT_TRUE((*client)->put(victim + "host-c/1", R"({"vm":"vm-c","priority":0})"));
  EXPECT_TRUE(waitFor([&] { return b_->logs().find("scheduler 'stranger' is not in the pool") != std::string::npos; }, 10000))
      << b_->logs();
  EXPECT_TRUE(waitFor([&] { return b_->logs().find("its priority 0 is not above vaccel " + std::to_string(idB)) != std::string::npos; },
                      10000))
      << b_->logs();
  EXPECT_EQ(vaccelOf(*b_, "low-b").value("state", ""), "running") << b_->console("vaccels");
  ASSERT_TRUE((*client)->removePrefix(victim));
  // A's program needs 4 of the 8 blocks; 2 are free.
  auto onA = openWaiting(guestdA_, 4, "high-a", 3);
  ASSERT_TRUE(onA) << onA.error().message << logs();
  std::string why;
  EXPECT_TRUE(gemmWorks(**onA, 4, &why)) << why;
  json suspended = vaccelOf(*b_, "low-b");
  EXPECT_EQ(suspended.value("state", ""), "suspended") << b_->console("vaccels");
  EXPECT_NE(suspended.value("why", "").find("preempted by scheduler host-a"), std::string::npos) << suspended.dump();
  EXPECT_NE(a_->logs().find("asking scheduler host-b to suspend its vaccel " + std::to_string(idB)), std::string::npos)
      << a_->logs();
  // A placed: its request is taken back.
  EXPECT_TRUE(waitFor(
      [&] {
        auto r = (*client)->range("/raccel/preempt/");
        return r && r->kvs_size() == 0;
      },
      10000));
  // A's program ends: B's resumes, its buffer intact.
  (*onA).reset();
  EXPECT_TRUE(waitFor([&] { return vaccelOf(*b_, "low-b").value("state", "") == "running"; }, 20000))
      << b_->console("vaccels") << logs();
  auto back = (*onB)->readFloats(buffer, data.size());
  ASSERT_TRUE(back) << back.error().message;
  EXPECT_EQ(*back, data);
}

// Compaction in a shared pool is planned by the elected leader. A hole opens before
// another host's vaccel on a node: the leader asks that host's scheduler, which moves
// its vaccel (its data with it), and the node is packed again.
TEST_F(MultiHost, TheLeaderPlansCompactionAndAnotherHostMovesItsOwnVaccel) {
  auto client = etcd::Client::open({etcd_->endpointList()});
  ASSERT_TRUE(client) << client.error().message;
  std::string leader;
  ASSERT_TRUE(waitFor(
      [&] {
        auto r = (*client)->range("/raccel/leader");
        if (!r || r->kvs_size() != 1) return false;
        leader = json::parse(r->kvs(0).value(), nullptr, false).value("scheduler", "");
        return !leader.empty();
      },
      10000))
      << logs();
  std::map<std::string, std::pair<Cluster*, std::string>> hosts{
      {"host-a", {a_.get(), guestdA_}}, {"host-b", {b_.get(), guestdB_}}, {"host-c", {c_.get(), guestdC_}}};
  ASSERT_TRUE(hosts.count(leader)) << leader;
  auto [lead, leadGuestd] = hosts[leader];
  auto [other, otherGuestd] = hosts[leader == "host-a" ? "host-b" : "host-a"];
  auto hole = openOn(leadGuestd, "hole", 1);
  ASSERT_TRUE(hole) << hole.error().message << logs();
  auto kept = openOn(otherGuestd, "kept", 1);
  ASSERT_TRUE(kept) << kept.error().message << logs();
  const uint32_t holeAt = (*hole)->vaccel().blocks.at(0).first, keptAt = (*kept)->vaccel().blocks.at(0).first;
  ASSERT_EQ(keptAt, holeAt + 1) << "the two placed side by side: " << (*hole)->vaccel().describe() << " / "
                                << (*kept)->vaccel().describe();
  auto data = randomFloats(4096, 31);
  uint64_t buffer = (*kept)->alloc(data.size() * 4);
  (*kept)->writeFloats(buffer, data);
  ASSERT_TRUE((*kept)->fence());
  // The leader plans on its view of the pool, fed by etcd's watch: it holds the other
  // host's vaccel before the release (on a busy machine it could still be on its way,
  // and then there was nothing to move; a fresh-clone CI failed so).
  ASSERT_TRUE(waitFor([&] { return usedBy(*lead).size() >= 2; }, 20000)) << lead->console("pool");
  // The leader's vaccel ends: the leader compacts after the release (defrag_on_release)
  // and asks the other host to move its vaccel into the hole.
  (*hole).reset();
  auto keptFirst = [&] {
    json v = vaccelOf(*other, "kept");
    return v.contains("blocks") && v["blocks"].size() == 1 ? v["blocks"][0].value("first", 0u) : 0u;
  };
  EXPECT_TRUE(waitFor([&] { return keptFirst() == holeAt; }, 20000)) << other->console("vaccels") << logs();
  EXPECT_NE(lead->logs().find("asking scheduler " + std::string(other == a_.get() ? "host-a" : "host-b") + " to move its vaccel"),
            std::string::npos)
      << lead->logs();
  EXPECT_TRUE(waitFor([&] { return vaccelOf(*other, "kept").value("state", "") == "running"; }, 20000)) << other->console("vaccels");
  auto back = (*kept)->readFloats(buffer, data.size());
  ASSERT_TRUE(back) << back.error().message;
  EXPECT_EQ(*back, data);
  std::string why;
  EXPECT_TRUE(gemmWorks(**kept, 6, &why)) << why;
  // Its request is ended.
  EXPECT_TRUE(waitFor(
      [&] {
        auto r = (*client)->range("/raccel/moves/");
        return r && r->kvs_size() == 0;
      },
      10000));
}

// An operator on one host preempts and resumes another host's vaccel (HOST/ID), asked
// of the scheduler that serves it; references that name no such vaccel are refused
// where they enter.
TEST_F(MultiHost, AnOperatorPreemptsAndResumesAnotherHostsVaccel) {
  auto onB = openOn(guestdB_, "ops-b", 2);
  ASSERT_TRUE(onB) << onB.error().message << logs();
  auto data = randomFloats(1024, 41);
  uint64_t buffer = (*onB)->alloc(data.size() * 4);
  (*onB)->writeFloats(buffer, data);
  ASSERT_TRUE((*onB)->fence());
  const std::string ref = "host-b/" + std::to_string((*onB)->vaccel().id);
  int status = -1;
  std::string out = a_->ctl({"preempt", ref}, &status);
  EXPECT_EQ(status, 0) << out;
  EXPECT_NE(out.find("asked scheduler host-b to preempt"), std::string::npos) << out;
  EXPECT_TRUE(waitFor([&] { return vaccelOf(*b_, "ops-b").value("state", "") == "suspended"; }, 20000)) << b_->console("vaccels");
  EXPECT_NE(vaccelOf(*b_, "ops-b").value("why", "").find("(asked on host host-a)"), std::string::npos) << b_->console("vaccels");
  out = a_->ctl({"resume", ref}, &status);
  EXPECT_EQ(status, 0) << out;
  EXPECT_TRUE(waitFor([&] { return vaccelOf(*b_, "ops-b").value("state", "") == "running"; }, 20000)) << b_->console("vaccels");
  auto back = (*onB)->readFloats(buffer, data.size());
  ASSERT_TRUE(back) << back.error().message;
  EXPECT_EQ(*back, data);
  for (auto [word, expected] : std::vector<std::pair<std::string, std::string>>{
           {"nohost/1", "no live scheduler 'nohost'"},
           {"host-a/1", "this host's own"},
           {"host-b/0", "is not a vaccel id"},
           {"/3", "names no host"},
           {"host-b/4611686018427387904", "vaccel ids are 1 to 2^62 - 1"},
       }) {
    out = a_->ctl({"preempt", word}, &status);
    EXPECT_NE(status, 0) << word << ": " << out;
    EXPECT_NE(out.find(expected), std::string::npos) << word << ": " << out;
  }
  // Each request is ended once answered.
  auto client = etcd::Client::open({etcd_->endpointList()});
  ASSERT_TRUE(client) << client.error().message;
  EXPECT_TRUE(waitFor(
      [&] {
        auto r = (*client)->range("/raccel/actions/");
        return r && r->kvs_size() == 0;
      },
      10000));
}

// An operator's drain and set-policy, given on any host, reach every host of the pool:
// A drains the node B's program runs on, and B moves it off with its data; C places
// nothing there until C undoes it. A sets vm-b's policy, which only B serves: B applies
// it, and every host's console shows vm-b with it. A vaccel of B that holds no blocks
// (suspended by an operator) is listed on A and C with its state and why.
TEST_F(MultiHost, DrainAndSetPolicyGivenOnAnyHostReachEveryHost) {
  auto onB = openOn(guestdB_, "drained-b", 2);
  ASSERT_TRUE(onB) << onB.error().message << logs();
  auto data = randomFloats(4096, 43);
  uint64_t buffer = (*onB)->alloc(data.size() * 4);
  (*onB)->writeFloats(buffer, data);
  ASSERT_TRUE((*onB)->fence());
  auto nodeOf = [&](const Cluster& host) {
    json v = vaccelOf(host, "drained-b");
    return v.contains("cards") && v["cards"].size() == 1 ? v["cards"][0].value("node", "") : std::string();
  };
  const std::string home = nodeOf(*b_);
  ASSERT_FALSE(home.empty()) << b_->console("vaccels");
  const std::string other = home == "na" ? "nb" : "na";
  int status = -1;
  std::string out = a_->ctl({"drain", home}, &status);
  ASSERT_EQ(status, 0) << out;
  EXPECT_NE(out.find("on every host of the shared pool"), std::string::npos) << out;
  EXPECT_TRUE(waitFor([&] { return nodeOf(*b_) == other && vaccelOf(*b_, "drained-b").value("state", "") == "running"; }, 30000))
      << b_->console("vaccels") << logs();
  auto back = (*onB)->readFloats(buffer, data.size());
  ASSERT_TRUE(back) << back.error().message;
  EXPECT_EQ(*back, data);
  // Every host sees the node's blocks draining, and places nothing new there.
  auto drainingOn = [&](const Cluster& host) {
    for (auto [first, count, state, node] : poolShape(host))
      if (node == home && state != "draining") return false;
    return true;
  };
  for (auto* h : {a_.get(), b_.get(), c_.get()}) EXPECT_TRUE(waitFor([&] { return drainingOn(*h); }, 10000)) << h->console("pool");
  auto onC = openOn(guestdC_, "placed-c", 2);
  ASSERT_TRUE(onC) << onC.error().message << logs();
  for (auto& card : (*onC)->vaccel().cards) EXPECT_EQ(card.node, other) << "placed on the drained node";
  out = c_->ctl({"drain", home, "--undo"}, &status);
  ASSERT_EQ(status, 0) << out;
  for (auto* h : {a_.get(), b_.get()})
    EXPECT_TRUE(waitFor([&] {
      for (auto [first, count, state, node] : poolShape(*h))
        if (node == home && state == "draining") return false;
      return true;
    }, 10000)) << h->console("pool");

  // vm-b is served by B alone: a policy set on A reaches it there.
  out = a_->ctl({"set-policy", "vm-b", "priority=5", "memory_quota=3GiB"}, &status);
  ASSERT_EQ(status, 0) << out;
  EXPECT_NE(out.find("served by host(s) host-b"), std::string::npos) << out;
  auto vmOn = [](const Cluster& host, const std::string& name) {
    auto v = json::parse(host.console("vms"), nullptr, false);
    if (!v.is_discarded() && v.contains("vms"))
      for (auto& e : v["vms"])
        if (e.value("name", "") == name) return e;
    return json::object();
  };
  EXPECT_TRUE(waitFor([&] { return vmOn(*b_, "vm-b").value("priority", 0) == 5; }, 10000)) << b_->console("vms") << logs();
  EXPECT_EQ(vmOn(*b_, "vm-b").value("memoryQuota", 0ull), 3ull << 30);
  for (auto* h : {a_.get(), c_.get()})
    EXPECT_TRUE(waitFor([&] {
      json e = vmOn(*h, "vm-b");
      return e.value("host", "") == "host-b" && e.value("priority", 0) == 5;
    }, 10000)) << h->console("vms");
  for (auto [args, expected] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"set-policy", "vm-nowhere", "priority=1"}, "no vm named 'vm-nowhere' here or on any host of the shared pool"},
           {{"set-policy", "vm-b", "colour=red"}, "not a policy setting"},
           {{"set-policy", "vm-b", "priority=100000"}, "priority"},
       }) {
    out = a_->ctl(args, &status);
    EXPECT_NE(status, 0) << out;
    EXPECT_NE(out.find(expected), std::string::npos) << out;
  }
  EXPECT_EQ(vmOn(*b_, "vm-b").value("priority", 0), 5) << "a refused setting changed the policy";

  // A vaccel of B that holds no blocks is listed on the other hosts.
  const std::string ref = "host-b/" + std::to_string((*onB)->vaccel().id);
  out = a_->ctl({"preempt", ref}, &status);
  ASSERT_EQ(status, 0) << out;
  auto listedOn = [&](const Cluster& host) {
    auto v = json::parse(host.console("vaccels"), nullptr, false);
    if (!v.is_discarded() && v.contains("vaccels"))
      for (auto& e : v["vaccels"])
        if (e.value("host", "") == "host-b" && e.value("program", "") == "drained-b") return e;
    return json::object();
  };
  for (auto* h : {a_.get(), c_.get()})
    EXPECT_TRUE(waitFor([&] {
      json e = listedOn(*h);
      return e.value("state", "") == "suspended" && e.value("why", "").find("suspended by the operator") != std::string::npos;
    }, 15000)) << h->console("vaccels");
  // /metrics of any host counts it too.
  auto metrics = [&](const Cluster& host) { return rawhttp::roundTrip(host.httpPort(), "GET /metrics HTTP/1.0\r\n\r\n"); };
  EXPECT_TRUE(waitFor([&] {
    return metrics(*c_).find("raccel_vaccels_elsewhere{host=\"host-b\",state=\"suspended\"} 1") != std::string::npos;
  }, 10000)) << metrics(*c_);
  out = c_->ctl({"resume", ref}, &status);
  ASSERT_EQ(status, 0) << out;
  EXPECT_TRUE(waitFor([&] { return listedOn(*a_).value("state", "") == "elsewhere"; }, 15000)) << a_->console("vaccels");
  const std::string series = "raccel_vaccel_elsewhere_blocks{host=\"host-b\",vm=\"vm-b\",vaccel=\"" +
                             std::to_string((*onB)->vaccel().id) + "\"} 2";
  EXPECT_TRUE(waitFor([&] { return metrics(*a_).find(series) != std::string::npos; }, 10000)) << metrics(*a_);
  back = (*onB)->readFloats(buffer, data.size());
  ASSERT_TRUE(back) << back.error().message;
  EXPECT_EQ(*back, data);
}

// With a lease long enough to see the request stand before it ends.
class MultiHostLongLease : public MultiHost {
 protected:
  MultiHostLongLease() { leaseTtl_ = 6; }
};

// The victim's host is dead (stopped: it answers nothing, its lease is not kept alive).
// A's request stands in etcd until B's lease expires and its holdings with it; then A's
// admission completes.
TEST_F(MultiHostLongLease, WhenTheVictimsHostIsDeadItsLeaseExpiryTakesItsPlace) {
  int status = 0;
  std::string out = a_->ctl({"set-policy", "vm-a", "priority=3"}, &status);
  ASSERT_EQ(status, 0) << out;
  auto onB = openOn(guestdB_, "low-b", 6);
  ASSERT_TRUE(onB) << onB.error().message << logs();
  const uint64_t idB = (*onB)->vaccel().id;
  auto client = etcd::Client::open({etcd_->endpointList()});
  ASSERT_TRUE(client) << client.error().message;
  b_->scheduler().kill(SIGSTOP);
  Result<std::unique_ptr<Session>> onA = fail(Code::internal, "not opened");
  std::atomic<bool> done{false};
  std::thread opener([&] {
    onA = openWaiting(guestdA_, 4, "high-a", 3);
    done = true;
  });
  const std::string request = "/raccel/preempt/host-b/" + std::to_string(idB) + "/host-a/";
  bool stood = waitFor(
      [&] {
        auto r = (*client)->range(request);
        return done || (r && r->kvs_size() == 1);
      },
      20000);
  EXPECT_TRUE(stood && !done) << "A was admitted before its request stood: " << logs();
  opener.join();
  ASSERT_TRUE(onA) << onA.error().message << logs();
  std::string why;
  EXPECT_TRUE(gemmWorks(**onA, 5, &why)) << why;
  b_->scheduler().kill(SIGKILL);
}

// Tenant vm-a runs on two hosts: on B, and on A beside tenant vm-x.
class MultiHostOneTenantOnTwoHosts : public MultiHost {
 protected:
  MultiHostOneTenantOnTwoHosts() {
    vmsA_ = {"vm-a", "vm-x"};
    vmB_ = "vm-a";
  }
};

// Tenant usage is global. Tenant vm-a holds the whole pool on host B. On host A, a
// program of vm-a and then one of vm-x wait for the same blocks, at equal priorities.
// When B's program ends, vm-x's goes first: vm-a has had more, counted on every host.
TEST_F(MultiHostOneTenantOnTwoHosts, TheFairShareOrderCountsATenantsUsageOnEveryHost) {
  auto onB = openOn(guestdB_, "heavy-b", 8);
  ASSERT_TRUE(onB) << onB.error().message << logs();
  auto client = etcd::Client::open({etcd_->endpointList()});
  ASSERT_TRUE(client) << client.error().message;
  ASSERT_TRUE(waitFor(
      [&] {
        auto r = (*client)->range("/raccel/usage/host-b/vm-a");
        return r && r->kvs_size() == 1;
      },
      10000))
      << logs();
  const std::string guestdX = a_->startGuestd("vm-x");
  std::atomic<int> admitted{0};
  int firstAt = 0, secondAt = 0;
  Result<std::unique_ptr<Session>> first = fail(Code::internal, "not opened"), second = fail(Code::internal, "not opened");
  std::thread t1([&] {
    first = openWaiting(guestdA_, 8, "light-a", 0);
    firstAt = ++admitted;
  });
  EXPECT_TRUE(waitFor([&] { return vaccelOf(*a_, "light-a").value("state", "") == "waiting"; }, 20000)) << a_->console("vaccels");
  std::thread t2([&] {
    second = openWaiting(guestdX, 8, "fresh-x", 0);
    secondAt = ++admitted;
  });
  EXPECT_TRUE(waitFor([&] { return vaccelOf(*a_, "fresh-x").value("state", "") == "waiting"; }, 20000)) << a_->console("vaccels");
  (*onB).reset();
  t2.join();
  EXPECT_TRUE(second) << second.error().message << logs();
  EXPECT_EQ(vaccelOf(*a_, "light-a").value("state", ""), "waiting") << a_->console("vaccels");
  if (second) (*second).reset();
  t1.join();
  ASSERT_TRUE(first) << first.error().message << logs();
  EXPECT_EQ(secondAt, 1);
  EXPECT_EQ(firstAt, 2);
}

// A scheduler started before its etcd (a host booting, etcd starting beside it) waits
// for it, saying so, and joins the pool once etcd answers; one stopped while it waits
// ends cleanly, and so does one stopped just after it joined.
TEST(SchedulerBeforeEtcd, WaitsForItSayingSoThenJoins) {
  if (auto why = etcdUnavailable(); !why.empty()) GTEST_SKIP() << why;
  EtcdCluster etcd(1);
  const std::string dir = makeTempDir();
  Process scheduler("raccel-scheduler",
                    {"--insecure", "--etcd", etcd.endpoints(), "--name", "early", "--node-listen",
                     "127.0.0.1:" + std::to_string(freePort()), "--console", dir + "/console.sock", "--http-listen", "off",
                     "--vm", "name=vm-e,socket=" + dir + "/vm-e.sock"},
                    dir + "/scheduler.log");
  auto log = [&] { return readFile(dir + "/scheduler.log"); };
  EXPECT_TRUE(waitFor([&] { return log().find("waiting for etcd") != std::string::npos; }, 20000)) << log();
  EXPECT_TRUE(scheduler.running()) << log();
  // One stopped while it waits ends cleanly.
  Process quitter("raccel-scheduler",
                  {"--insecure", "--etcd", etcd.endpoints(), "--name", "quitter", "--node-listen",
                   "127.0.0.1:" + std::to_string(freePort()), "--console", dir + "/quitter.sock", "--http-listen", "off",
                   "--vm", "name=vm-q,socket=" + dir + "/vm-q.sock"},
                  dir + "/quitter.log");
  EXPECT_TRUE(waitFor([&] { return readFile(dir + "/quitter.log").find("waiting for etcd") != std::string::npos; }, 20000));
  quitter.kill(SIGTERM);
  EXPECT_EQ(quitter.wait(10000), 0) << readFile(dir + "/quitter.log");
  EXPECT_NE(readFile(dir + "/quitter.log").find("stopped while waiting for etcd"), std::string::npos);
  auto started = etcd.start();
  ASSERT_TRUE(started) << started.error().message;
  EXPECT_TRUE(waitFor([&] { return acceptsConnections(dir + "/console.sock"); }, 30000)) << log();
  EXPECT_NE(log().find("joined the shared pool"), std::string::npos) << log();
  scheduler.kill(SIGTERM);
  EXPECT_EQ(scheduler.wait(10000), 0) << log();
}

// One etcd member killed: admissions go on. Values a stranger with access to etcd wrote
// (garbage, a holding over another's blocks, a node whose numbers do not line up) are
// refused and logged; every scheduler goes on, and no block is held twice.
TEST_F(MultiHost, AMemberDownOrBadValuesInEtcdStopNoOne) {
  etcd_->kill(0);
  auto onA = openOn(guestdA_, "one-down");
  ASSERT_TRUE(onA) << onA.error().message << logs();
  std::string why;
  EXPECT_TRUE(gemmWorks(**onA, 12, &why)) << why;
  std::vector<std::string> live = etcd_->endpointList();
  live.erase(live.begin());  // member 0 is down
  auto client = etcd::Client::open({live});
  ASSERT_TRUE(client) << client.error().message;
  // A well-formed holding over A's blocks: it came second, so it is the one refused.
  SharedHolding forged{"stranger", 2, "x", 0, {}, {}, 0, 0};
  for (auto [first, count] : (*onA)->vaccel().blocks) forged.ranges.push_back({first, count});
  const std::string overA = SharedPool::holdingValue(forged);
  for (auto [key, value] : {std::pair{"/raccel/holds/stranger/1", "{not json"},
                            std::pair{"/raccel/holds/stranger/2", overA.c_str()},
                            std::pair{"/raccel/holds/stranger/3", R"({"vm":"x","priority":0,"ranges":[{"first":4000000000,"count":9}]})"},
                            std::pair{"/raccel/nodes/zz", R"({"first":77,"blocks":3,"cards":[]})"},
                            std::pair{"/raccel/config", R"({"blockTflops":"lots"})"},
                            std::pair{"/raccel/drains/na", R"({"by":"not a name"})"},
                            std::pair{"/raccel/policies/vm-b", R"({"by":"stranger","settings":{"priority":"lots"}})"},
                            std::pair{"/raccel/policies/vm-c", R"({"by":"stranger","settings":{"priority":["x"]}})"},
                            std::pair{"/raccel/unplaced/host-b/9", R"({"vm":"x","priority":0,"state":"gone","blocks":1})"},
                            std::pair{"/raccel/vms/host-b/vm-x", R"({"settings":"all"})"}})
    ASSERT_TRUE((*client)->put(key, value)) << key;
  // Every host still admits, places only on free blocks, and answers its console.
  auto onB = openOn(guestdB_, "after-bad");
  ASSERT_TRUE(onB) << onB.error().message << logs();
  EXPECT_TRUE(gemmWorks(**onB, 13, &why)) << why;
  auto onC = openOn(guestdC_, "after-bad");
  ASSERT_TRUE(onC) << onC.error().message << logs();
  std::set<uint32_t> seen;
  for (auto* s : {onA->get(), onB->get(), onC->get()})
    for (auto [first, count] : s->vaccel().blocks)
      for (uint32_t b = first; b < first + count; ++b) EXPECT_TRUE(seen.insert(b).second) << "block " << b << " held twice";
  for (auto* h : {a_.get(), b_.get(), c_.get()}) {
    EXPECT_TRUE(h->scheduler().running());
    EXPECT_FALSE(poolShape(*h).empty());
  }
  for (auto key : {"holds/stranger/1", "holds/stranger/2", "holds/stranger/3", "nodes/zz", "drains/na", "policies/vm-c",
                   "unplaced/host-b/9", "vms/host-b/vm-x"})
    EXPECT_NE(a_->logs().find(std::string("refused /raccel/") + key), std::string::npos) << key << "\n" << a_->logs();
  // A policy of the right shape that does not parse: the VM's host keeps its policy.
  EXPECT_TRUE(waitFor([&] { return b_->logs().find("the policy set on host stranger does not apply here") != std::string::npos; }, 10000))
      << b_->logs();
  EXPECT_NE(b_->console("vms").find("\"priority\":0"), std::string::npos) << b_->console("vms");
  // Nothing drained na: B and C still place there.
  for (auto [first, count, state, node] : poolShape(*c_)) EXPECT_NE(state, "draining") << node;
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
  if (after) {
    EXPECT_TRUE(gemmWorks(*after, 6, &why)) << why;
  }
}

// A netaccel with `scheduler = etcd` links to every scheduler of the shared pool as each
// advertises itself there: to host A's at start, to host B's when B joins later, and
// programs of both run on its card. When B leaves the pool, it is not reconnected to; a
// bad advertised address is ignored. Such a netaccel without etcd is refused at start.
TEST(SchedulersFoundInEtcd, ANetaccelJoinsEachSchedulerAsItComesAndLeavesThoseThatGo) {
  if (auto why = etcdUnavailable(); !why.empty()) GTEST_SKIP() << why;
  EtcdCluster etcd(1);
  auto started = etcd.start();
  ASSERT_TRUE(started) << started.error().message;
  auto host = [&](const std::string& name, const std::string& vm) {
    return std::make_unique<Cluster>(std::vector<VmSpec>{VmSpec{.name = vm}}, "",
                                     std::vector<std::string>{"--insecure", "--etcd", etcd.endpoints(), "--name", name,
                                                              "--set", "etcd_lease_ttl=2"});
  };
  auto a = host("host-a", "vm-a");
  a->addNetaccel("nx", {"kind=cpu,tflops=4"}, 4, {"--etcd", etcd.endpoints(), "--scheduler", "etcd"});
  auto b = host("host-b", "vm-b");
  EXPECT_TRUE(waitFor([&] { return b->poolTotal() == 4; }, 20000)) << b->logs();
  std::string why;
  for (auto* h : {a.get(), b.get()}) {
    auto s = openSession(h->startGuestd(h == a.get() ? "vm-a" : "vm-b"), 2, "found");
    ASSERT_TRUE(s) << s.error().message << h->logs();
    double err = checkedGemm(**s, 24, 20, 16, 3, &why);
    EXPECT_TRUE(err >= 0 && err < 1e-3) << why;
  }
  // A stranger's advertised address that does not parse is not linked to.
  auto client = etcd::Client::open({etcd.endpointList()});
  ASSERT_TRUE(client) << client.error().message;
  ASSERT_TRUE((*client)->put("/raccel/schedulers/stranger", R"({"address":"unix:/tmp/x"})"));
  // B leaves: its lease is revoked as it stops, and nx does not reconnect to it.
  b.reset();
  const std::string nxLog = a->dir() + "/netaccel-nx.log";
  EXPECT_TRUE(waitFor([&] { return readFile(nxLog).find("'host-b'") != std::string::npos &&
                                   readFile(nxLog).find("left the pool; not reconnecting") != std::string::npos; }, 20000))
      << readFile(nxLog);
  EXPECT_EQ(readFile(nxLog).find("stranger"), std::string::npos) << readFile(nxLog);
  const size_t before = readFile(nxLog).size();
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // several of its old backoffs
  EXPECT_EQ(readFile(nxLog).substr(before).find("cannot connect"), std::string::npos) << readFile(nxLog).substr(before);
  EXPECT_EQ(a->poolTotal(), 4u);
  // Without etcd, `scheduler = etcd` has nowhere to look.
  Process lost("raccel-netaccel", {"--insecure", "--name", "nz", "--scheduler", "etcd", "--http-listen", "off"},
               a->dir() + "/nz.log");
  EXPECT_EQ(lost.wait(10000), 2);
  EXPECT_NE(readFile(a->dir() + "/nz.log").find("scheduler = etcd finds the schedulers in the shared pool"), std::string::npos)
      << readFile(a->dir() + "/nz.log");
}

// etcd over mutual TLS (its client URLs https, client certificates required; the
// certificates from scripts/raccel-certs.sh etcd): a scheduler and a netaccel given the
// CA and a client certificate join the shared pool and a program runs; its holding is in
// etcd. A client without a certificate gets nothing from etcd, and a scheduler given
// https endpoints without a CA is refused at start, naming what it lacks.
TEST(EtcdTls, DaemonsWithClientCertificatesShareThePoolAndOthersAreRefused) {
  if (auto why = etcdUnavailable(); !why.empty()) GTEST_SKIP() << why;
  const std::string certs = makeTempDir();
  int status = 0;
  std::string made = runCommand("bash " + sourcePath("scripts/raccel-certs.sh") + " etcd " + sh(certs) + " 2>&1", &status);
  ASSERT_EQ(status, 0) << made;
  EtcdCluster etcd(1, certs);
  auto started = etcd.start();
  ASSERT_TRUE(started) << started.error().message;
  const std::string ca = certs + "/ca.pem", cert = certs + "/etcd-client.pem", key = certs + "/etcd-client.key";
  Cluster host({VmSpec{.name = "vm-a"}}, "",
               {"--insecure", "--etcd", etcd.endpoints(), "--name", "host-a", "--set", "etcd_ca=" + ca, "--set",
                "etcd_cert=" + cert, "--set", "etcd_key=" + key});
  const std::string config = certs + "/netaccel.conf";
  {
    std::ofstream out(config);
    out << "etcd_ca = " << ca << "\netcd_cert = " << cert << "\netcd_key = " << key << "\n";
  }
  host.addNetaccel("na", {"kind=cpu,tflops=4"}, 4, {"--etcd", etcd.endpoints(), "--config", config});
  auto s = openOn(host.startGuestd("vm-a"), "over-tls");
  ASSERT_TRUE(s) << s.error().message << host.logs();
  std::string why;
  EXPECT_TRUE(gemmWorks(**s, 3, &why)) << why;

  auto client = etcd::Client::open(etcd.clientOptions());
  ASSERT_TRUE(client) << client.error().message;
  auto all = (*client)->range("/raccel/");
  ASSERT_TRUE(all) << all.error().message;
  bool held = false, node = false;
  for (auto& kv : all->kvs()) {
    held |= kv.key().find("host-a") != std::string::npos && kv.value().find("vm-a") != std::string::npos;
    node |= kv.key().find("/na") != std::string::npos;
  }
  EXPECT_TRUE(held && node) << "no holding of host-a or node na in etcd";

  // Without a client certificate: the handshake is refused, nothing is read.
  etcd::Options stranger = etcd.clientOptions(2000);
  stranger.certFile.clear();
  stranger.keyFile.clear();
  auto noCert = etcd::Client::open(stranger);
  ASSERT_TRUE(noCert) << noCert.error().message;
  auto refused = (*noCert)->range("/raccel/");
  EXPECT_FALSE(refused) << "etcd answered a client without a certificate";

  // https endpoints without the CA: the scheduler stops at once and says why.
  Process lacking("raccel-scheduler",
                  {"--insecure", "--etcd", etcd.endpoints(), "--name", "host-b", "--vm", "name=vm-b,socket=" + certs + "/vm-b.sock",
                   "--node-listen", "127.0.0.1:0", "--http-listen", "off", "--console", certs + "/console.sock"},
                  certs + "/lacking.log");
  EXPECT_NE(lacking.wait(30000), 0) << readFile(certs + "/lacking.log");
  EXPECT_NE(readFile(certs + "/lacking.log").find("https endpoints need the CA (the etcd_ca setting)"), std::string::npos) << readFile(certs + "/lacking.log");
}

}  // namespace
}  // namespace raccel::testing
