// Scheduler policy end to end, with real raccel-scheduler, raccel-netaccel and raccelctl
// processes and guest programs through libraccel: preemption with suspend/resume,
// waiting admission, the operator's preempt/resume, live migration off a draining
// netaccel, and compaction (docs/ARCHITECTURE.md's 10-block fixture, live). Every result is
// checked against data kept here.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <future>
#include <map>
#include <regex>
#include <thread>

#include "sim/cluster.h"
#include "sim/dynamic.h"
#include "tests/cluster.h"
#include "tests/fairness.h"
#include "tests/raw_http.h"
#include "vmfrontend/raccel.h"

namespace raccel::testing {
namespace {

using client::Session;

std::unique_ptr<Session> open(const std::string& socket, double tflops, const std::string& name, int priority = 0,
                              unsigned waitMs = 0, bool noWait = false, std::string* why = nullptr) {
  client::Options o;
  o.socket = socket;
  o.tflops = tflops;
  o.program = name;
  o.priority = priority;
  o.admitWaitMs = waitMs;
  o.noWait = noWait;
  o.timeoutMs = 60000;
  auto s = Session::open(o);
  if (!s) {
    if (why) *why = s.error().toString();
    return nullptr;
  }
  return std::move(*s);
}

// The console's JSON object for the vaccel of program `name` ("" when absent).
std::string vaccelOf(const std::string& json, const std::string& name) {
  auto at = json.find("\"program\":\"" + name + "\"");
  if (at == std::string::npos) return "";
  auto begin = json.rfind("{\"id\"", at);
  auto end = json.find("\"state\"", at);
  end = json.find('}', end);
  return json.substr(begin, end - begin + 1);
}
std::string stateOf(const std::string& json, const std::string& name) {
  std::smatch m;
  std::string v = vaccelOf(json, name);
  static const std::regex state("\"state\":\"([a-z]+)\"");
  return std::regex_search(v, m, state) ? m[1].str() : "";
}
std::string blocksOf(const std::string& json, const std::string& name) {
  std::string v = vaccelOf(json, name);
  auto b = v.find("\"blocks\":[");
  return b == std::string::npos ? "" : v.substr(b + 10, v.find(']', b) - b - 10);
}
bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// node0 and node1, one 4-block cpu card each.
void addTwoNetaccels(Cluster& cluster) {
  for (const char* name : {"node0", "node1"}) cluster.addNetaccel(name, {"kind=cpu,tflops=4,memory=512MiB,threads=1"}, 4);
}

// A buffer of `n` floats written with known values; check() reads it back.
struct Kept {
  client::Handle handle = 0;
  std::vector<float> values;
  Kept(Session& s, size_t n, unsigned seed) : values(randomFloats(n, seed)) {
    handle = s.alloc(n * 4);
    s.writeFloats(handle, values);
  }
  std::string check(Session& s) const {
    auto got = s.readFloats(handle, values.size());
    if (!got) return got.error().toString();
    for (size_t i = 0; i < values.size(); ++i)
      if ((*got)[i] != values[i]) return "element " + std::to_string(i) + " changed";
    return "";
  }
};

// y = alpha * x + y on the card, and the same here.
std::string axpyChecked(Session& s, Kept& x, Kept& y, float alpha) {
  s.axpy(x.values.size(), alpha, x.handle, y.handle);
  for (size_t i = 0; i < y.values.size(); ++i) y.values[i] = alpha * x.values[i] + y.values[i];
  return y.check(s);
}

TEST(Preemption, ALowPriorityProgramIsSuspendedForAHighOneAndResumesWithItsBuffersIntact) {
  Cluster cluster({VmSpec{"low", 16, 0}, VmSpec{"high", 16, 5}});
  cluster.addNetaccel("node0", {"kind=cpu,tflops=6,memory=512MiB,threads=1"}, 6);
  auto low = open(cluster.vmSocket("low"), 5, "low");
  ASSERT_TRUE(low);
  // 1.5 MB: more than one chunk each way when saved and restored.
  Kept x(*low, 400000, 1), y(*low, 400000, 2);
  ASSERT_TRUE(low->fence());

  std::promise<void> placed, go;
  std::string highWhy;
  std::thread high([&] {
    auto h = open(cluster.vmSocket("high"), 4, "high", 5, 0, false, &highWhy);
    placed.set_value();
    if (!h) return;
    go.get_future().wait();
    Kept a(*h, 1000, 7), b(*h, 1000, 8);
    highWhy = axpyChecked(*h, a, b, 3.0f);
  });
  placed.get_future().wait();
  ASSERT_EQ(highWhy, "");
  std::string vaccels = cluster.console("vaccels");
  EXPECT_EQ(stateOf(vaccels, "low"), "suspended") << vaccels;
  EXPECT_EQ(stateOf(vaccels, "high"), "running") << vaccels;

  // The suspended program keeps going: its instructions wait at the scheduler.
  auto lowWork = std::async(std::launch::async, [&] { return axpyChecked(*low, x, y, 2.0f); });
  EXPECT_EQ(lowWork.wait_for(std::chrono::milliseconds(300)), std::future_status::timeout)
      << "a suspended vaccel ran an instruction";
  go.set_value();
  high.join();
  EXPECT_EQ(highWhy, "");
  EXPECT_EQ(lowWork.get(), "") << "the low program's buffers did not survive suspension";
  EXPECT_EQ(x.check(*low), "");
  vaccels = cluster.console("vaccels");
  EXPECT_EQ(stateOf(vaccels, "low"), "running") << vaccels;
  int status = 0;
  std::string events = cluster.ctl({"events", "--recent"}, &status);
  EXPECT_TRUE(has(events, "preempted") && has(events, "preempted by high/high")) << events;
  EXPECT_TRUE(has(events, "resumed") && has(events, "bytes of buffers restored")) << events;
}

TEST(Preemption, WithoutLowerPrioritiesARequestIsRefusedOrWaitsWhenItAsks) {
  Cluster cluster({VmSpec{"a", 16, 2}, VmSpec{"b", 16, 2}});
  cluster.addNetaccel("node0", {"kind=cpu,tflops=6,memory=512MiB,threads=1"}, 6);
  auto first = open(cluster.vmSocket("a"), 5, "first", 2);
  ASSERT_TRUE(first);
  Kept k(*first, 1000, 3);
  std::string why;
  auto refused = open(cluster.vmSocket("b"), 4, "refused", 2, 0, false, &why);
  EXPECT_FALSE(refused);
  EXPECT_TRUE(has(why, "not enough compute even by preemption: 4 blocks requested, 1 free or held by work it outranks"))
      << why;
  auto waiter = std::async(std::launch::async, [&] {
    std::string w;
    auto s = open(cluster.vmSocket("b"), 4, "waiter", 2, 30000, false, &w);
    if (!s) return w;
    Kept a(*s, 1000, 4), b(*s, 1000, 5);
    return axpyChecked(*s, a, b, 1.5f);
  });
  std::string vaccels = cluster.waitConsole("vaccels", [](auto& j) { return stateOf(j, "waiter") == "waiting"; });
  EXPECT_EQ(stateOf(vaccels, "waiter"), "waiting") << vaccels;
  EXPECT_EQ(k.check(*first), "");
  first.reset();  // its blocks free: the waiter is placed
  EXPECT_EQ(waiter.get(), "");
  // A deadline that passes is a refusal naming the wait.
  auto holder = open(cluster.vmSocket("a"), 5, "holder", 2);
  auto late = open(cluster.vmSocket("b"), 4, "late", 2, 300, false, &why);
  EXPECT_FALSE(late);
  EXPECT_TRUE(has(why, "waited for blocks until its deadline")) << why;
}

TEST(Placement, ANodesHostCpuAndMemoryDecideWhereAVaccelGoes) {
  // Two nodes with the same card (blocks 1-4 and 5-8); node0's host has 1 core, node1's 4. VM "hungry" needs
  // 1.5 cores and 1 GiB of a node's host per vaccel, "plain" none, "huge" more than any.
  VmSpec plain{"plain"}, hungry{"hungry"}, huge{"huge"};
  hungry.more = "host_cpu=1.5,host_memory=1GiB";
  huge.more = "host_cpu=64";
  Cluster cluster({plain, hungry, huge});
  cluster.addNetaccel("node0", {"kind=cpu,tflops=4,memory=512MiB,threads=1"}, 4, {"--host-cpu", "1", "--host-memory", "8GiB"});
  cluster.addNetaccel("node1", {"kind=cpu,tflops=4,memory=512MiB,threads=1"}, 4, {"--host-cpu", "4", "--host-memory", "8GiB"});
  auto p = open(cluster.vmSocket("plain"), 2, "p");
  ASSERT_TRUE(p);
  // By blocks alone node0's other 2 blocks fit best (that is where a plain program goes);
  // its host cannot feed a hungry one.
  auto probe = open(cluster.vmSocket("plain"), 2, "probe");
  ASSERT_TRUE(probe);
  EXPECT_EQ(blocksOf(cluster.console("vaccels"), "probe"), "{\"first\":3,\"count\":2}") << cluster.console("vaccels");
  probe.reset();
  cluster.waitConsole("vaccels", [](auto& j) { return vaccelOf(j, "probe").empty(); });
  auto a = open(cluster.vmSocket("hungry"), 2, "a");
  ASSERT_TRUE(a);
  auto b = open(cluster.vmSocket("hungry"), 2, "b");
  ASSERT_TRUE(b);
  std::string vaccels = cluster.console("vaccels");
  EXPECT_EQ(blocksOf(vaccels, "a"), "{\"first\":5,\"count\":2}") << vaccels;
  EXPECT_EQ(blocksOf(vaccels, "b"), "{\"first\":7,\"count\":2}") << vaccels;
  Kept x(*a, 4096, 1), y(*a, 4096, 2);
  EXPECT_EQ(axpyChecked(*a, x, y, 0.5f), "");
  std::string nodes = cluster.console("nodes");
  EXPECT_TRUE(has(nodes, "\"hostCpuMilli\":4000,\"hostMemoryMib\":8192,\"hostCpuMilliUsed\":3000,\"hostMemoryMibUsed\":2048"))
      << nodes;
  EXPECT_TRUE(has(cluster.ctl({"nodes"}), "3.0/4.0")) << cluster.ctl({"nodes"});
  // node0 has 2 free blocks but no host room: a third hungry program is not placed there.
  p.reset();
  std::string why;
  auto c = open(cluster.vmSocket("hungry"), 2, "c", 0, 0, false, &why);
  EXPECT_FALSE(c);
  EXPECT_TRUE(has(why, "host has 1500 milli-CPU and 1024 MiB left")) << why;
  // It waits, and goes to node1 when a ends there (b may slide down into a's blocks).
  auto waiter = std::async(std::launch::async, [&] {
    std::string w;
    auto s = open(cluster.vmSocket("hungry"), 2, "waiter", 0, 30000, false, &w);
    if (!s) return w;
    Kept u(*s, 1000, 4), v(*s, 1000, 5);
    std::string checked = axpyChecked(*s, u, v, 1.5f);
    if (!checked.empty()) return checked;
    return vaccelOf(cluster.console("vaccels"), "waiter");
  });
  vaccels = cluster.waitConsole("vaccels", [](auto& j) { return stateOf(j, "waiter") == "waiting"; });
  EXPECT_EQ(stateOf(vaccels, "waiter"), "waiting") << vaccels;
  a.reset();
  std::string placed = waiter.get();
  EXPECT_TRUE(has(placed, "\"cards\":[{\"node\":\"node1\"")) << placed;
  // What vaccels hold of a host survives a scheduler restart (b's 1.5 cores and 1 GiB;
  // b itself waits there for its guest to re-attach, which a direct link does not).
  cluster.waitConsole("vaccels", [](auto& j) { return vaccelOf(j, "waiter").empty(); });
  cluster.restartScheduler();
  nodes = cluster.waitConsole("nodes", [](auto& j) { return has(j, "\"hostCpuMilliUsed\":1500,\"hostMemoryMibUsed\":1024"); });
  EXPECT_TRUE(has(nodes, "\"hostCpuMilliUsed\":1500,\"hostMemoryMibUsed\":1024")) << nodes;
  // More than any node's host has: refused at once, saying so.
  auto never = open(cluster.vmSocket("huge"), 1, "never", 0, 30000, false, &why);
  EXPECT_FALSE(never);
  EXPECT_TRUE(has(why, "can never run here: vm 'huge' needs 64000 milli-CPU and 0 MiB of a node's host")) << why;
  EXPECT_TRUE(cluster.scheduler().running());
}

TEST(Preemption, TheOperatorSuspendsAndResumesAndANoWaitProgramIsToldWhy) {
  Cluster cluster({VmSpec{"vm1", 16, 0}});
  cluster.addNetaccel("node0", {"kind=cpu,tflops=4,memory=512MiB,threads=1"}, 4);
  auto s = open(cluster.vmSocket("vm1"), 2, "patient", 0, 0, true);
  ASSERT_TRUE(s);
  Kept x(*s, 300000, 11), y(*s, 300000, 12);
  ASSERT_TRUE(s->fence());
  int status = -1;
  std::string out = cluster.ctl({"preempt", std::to_string(s->vaccel().id)}, &status);
  EXPECT_EQ(status, 0) << out;
  EXPECT_TRUE(has(out, "is being suspended")) << out;
  cluster.waitConsole("vaccels", [](auto& j) { return stateOf(j, "patient") == "suspended"; });
  s->fill(x.handle, 0, 4, 0);
  auto refused = s->fence();
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code, Code::unavailable);
  EXPECT_TRUE(has(refused.error().message, "suspended by the operator")) << refused.error().message;
  EXPECT_EQ(cluster.console("pool").find("\"free\":4") != std::string::npos, true) << cluster.console("pool");

  out = cluster.ctl({"resume", "42"}, &status);
  EXPECT_EQ(status, 1);
  EXPECT_TRUE(has(out, "no vaccel #42")) << out;
  out = cluster.ctl({"resume", std::to_string(s->vaccel().id)}, &status);
  EXPECT_EQ(status, 0) << out;
  cluster.waitConsole("vaccels", [](auto& j) { return stateOf(j, "patient") == "running"; });
  EXPECT_EQ(x.check(*s), "");
  EXPECT_EQ(axpyChecked(*s, x, y, -0.5f), "");
}

// The daemon orders its queue with raccel-sim's policy (scheduler/admission.h): a VM
// over its fair share waits behind one within it, even where usage alone would put it
// first. vb ran the whole pool for 5 s before (5 block-seconds per TFLOPS of its cap);
// va then holds all 4 blocks on an 8 TFLOPS cap (half a block-second per TFLOPS each
// second). When one block frees, va holds 3 while both ask for 4 of the 4: its fair
// share is 2, so vb's one-block program goes first although va's arrived before it.
TEST(Admission, AVmOverItsFairShareWaitsBehindOneWithinIt) {
  Cluster cluster({VmSpec{"va", 8, 0}, VmSpec{"vb", 4, 0}});
  cluster.addNetaccel("node0", {"kind=cpu,tflops=4,memory=512MiB,threads=1"}, 4);
  const std::string guestA = cluster.startGuestd("va"), guestB = cluster.startGuestd("vb");
  {
    auto past = open(guestB, 4, "past");
    ASSERT_TRUE(past) << cluster.logs();
    std::this_thread::sleep_for(std::chrono::seconds(5));
  }
  cluster.waitConsole("vaccels", [](auto& j) { return stateOf(j, "past").empty(); });
  auto keep = open(guestA, 3, "keep");
  auto leaving = open(guestA, 1, "leaving");
  ASSERT_TRUE(keep && leaving) << cluster.logs();
  std::unique_ptr<Session> a1, wide, b1;
  std::thread first([&] { a1 = open(guestA, 1, "a1", 0, 60000); });
  cluster.waitConsole("vaccels", [](auto& j) { return stateOf(j, "a1") == "waiting"; });
  std::thread second([&] { wide = open(guestB, 3, "wide", 0, 60000); });
  std::thread third([&] { b1 = open(guestB, 1, "b1", 0, 60000); });
  std::string queued = cluster.waitConsole(
      "vaccels", [](auto& j) { return stateOf(j, "wide") == "waiting" && stateOf(j, "b1") == "waiting"; });
  ASSERT_EQ(stateOf(queued, "b1"), "waiting") << queued;
  leaving.reset();
  third.join();
  ASSERT_TRUE(b1) << cluster.logs();
  std::string after = cluster.console("vaccels");
  EXPECT_EQ(stateOf(after, "a1"), "waiting") << after;
  EXPECT_EQ(stateOf(after, "wide"), "waiting") << after;
  // Then everyone is placed as blocks free.
  keep.reset();
  b1.reset();
  first.join();
  second.join();
  EXPECT_TRUE(a1 && wide) << cluster.logs();
}

// Fresh work preempts work of its own priority that has had far more service (the
// attained-service classes, as raccel-sim runs them), with the policy's clock sped up
// 20,000 times: 4 blocks for 0.7 s are 15 block-hours, class 1. The long one resumes
// with its buffers once the fresh one is done.
TEST(Admission, FreshWorkPreemptsLongServedWorkOfItsPriority) {
  Cluster cluster({VmSpec{"vm1", 8, 0}}, "", {"--set", "policy_clock_scale=20000"});
  cluster.addNetaccel("node0", {"kind=cpu,tflops=4,memory=512MiB,threads=1"}, 4);
  const std::string guestd = cluster.startGuestd("vm1");
  auto served = open(guestd, 4, "served");
  ASSERT_TRUE(served) << cluster.logs();
  Kept x(*served, 100000, 5);
  ASSERT_TRUE(served->fence());
  ASSERT_TRUE(waitFor([&] { return has(cluster.ctl({"events", "--recent"}), "demoted"); }, 60000)) << cluster.logs();
  std::string why;
  auto fresh = open(guestd, 2, "fresh", 0, 30000, false, &why);
  ASSERT_TRUE(fresh) << why << cluster.logs();
  std::string vaccels = cluster.waitConsole("vaccels", [](auto& j) { return stateOf(j, "served") == "suspended"; });
  EXPECT_EQ(stateOf(vaccels, "served"), "suspended") << vaccels;
  EXPECT_EQ(stateOf(vaccels, "fresh"), "running") << vaccels;
  fresh.reset();
  EXPECT_EQ(x.check(*served), "") << cluster.logs();
  EXPECT_TRUE(has(cluster.ctl({"events", "--recent"}), "service class 1 after 1")) << cluster.logs();  // 15 or more
}

// The daemon's decisions as raccel-sim logs them (DynamicRun::decisions): admitted,
// resumed, preempted, demoted and released events of programs named jN, in order.
std::vector<std::string> decisionsOf(const std::string& eventsJson) {
  static const std::regex event("\"kind\":\"([a-z-]+)\",\"subject\":\"[^/\"]*/(j[0-9]+)#");
  static const std::map<std::string, std::string> verbs{
      {"admitted", "start"}, {"resumed", "resume"}, {"preempted", "preempt"}, {"demoted", "demote"}, {"released", "finish"}};
  std::vector<std::string> out;
  for (std::sregex_iterator it(eventsJson.begin(), eventsJson.end(), event), end; it != end; ++it)
    if (auto verb = verbs.find((*it)[1].str()); verb != verbs.end()) out.push_back(verb->second + " " + (*it)[2].str());
  return out;
}

// One admission scenario through both drivers of scheduler/admission.h: raccel-sim's, on
// its virtual clock, and raccel-scheduler's, real processes on a policy clock 10,000
// times the wall clock. Four 1-block cards; j0 (vmA, 4 blocks) runs until demoted; j1
// (vmB, 2 blocks, fresh) preempts it; j2 (vmC, 2 blocks, a lower priority) takes the
// rest; j1 ends, so j0, suspended, could only preempt j2, which it may not until it has
// starved: a day of waiting (the guard; nothing else happens then), then it takes j2's
// blocks; when j0 ends j2 resumes. Then fair share: j3 (vmA, 3 blocks, priority 1, so
// that nothing preempts it once it is demoted) and j4 (vmC, 1) fill the pool; j5 (vmA),
// j6 (vmE), j7 (vmD) wait for 1 block each, in that order; when j4 ends, vmA is over its
// max-min share (3 held, 2 fair) and j5 goes last, j6 before j7 by arrival (neither VM
// has used anything); when j3 ends, j7 goes before j5 (vmA's usage). The programs here
// end when the simulator's jobs do, each after the decision before it.
TEST(Admission, TheDaemonAndTheSimulatorMakeTheSameDecisions) {
  const double scale = 10000;
  sim::Cluster simCluster = *sim::parseClusterConfig("[node]\nname = n0\ncards = gpu:X:1x4\n", "scenario");
  // {index, tenant, model, arrival, seconds, blocks, priority}
  sim::Workload workload{{"vmA", "vmB", "vmC", "vmD", "vmE"},
                         {{0, 0, "", 0, 40000, 4, 1},
                          {1, 1, "", 20000, 10000, 2, 1},
                          {2, 2, "", 25000, 101400, 2, 0},
                          {3, 0, "", 150000, 20000, 3, 1},
                          {4, 2, "", 151000, 18000, 1, 0},
                          {5, 0, "", 168500, 30000, 1, 0},
                          {6, 4, "", 168600, 10000, 1, 0},
                          {7, 3, "", 168700, 20000, 1, 0}}};
  sim::DynamicOptions options;
  options.suspendSeconds = options.moveSeconds = options.spanPenalty = 0;
  options.logDecisions = true;
  auto simulated = sim::runDynamic(simCluster, workload, options);
  ASSERT_TRUE(simulated) << simulated.error().message;
  const std::vector<std::string> expected{
      "start j0",  "demote j0", "preempt j0", "start j1",  "start j2",  "finish j1", "demote j2", "preempt j2",
      "resume j0", "finish j0", "resume j2",  "finish j2", "start j3",  "start j4",  "demote j3", "finish j4",
      "start j6",  "finish j3", "start j7",   "start j5",  "finish j6", "finish j7", "finish j5"};
  ASSERT_EQ(simulated->decisions, expected) << "the scenario as written for the daemon below";

  Cluster cluster({VmSpec{"vmA", 8, 1}, VmSpec{"vmB", 8, 1}, VmSpec{"vmC", 8, 1}, VmSpec{"vmD", 8, 1}, VmSpec{"vmE", 8, 1}},
                  "",
                  {"--set", "policy_clock_scale=" + std::to_string(static_cast<int>(scale))});
  const std::string card = "kind=cpu,tflops=1,memory=128MiB,threads=1";
  cluster.addNetaccel("node0", {card, card, card, card}, 4);
  auto events = [&] { return decisionsOf(cluster.ctl({"events", "--recent", "--json"})); };
  auto saw = [&](const std::string& decision) {
    auto got = events();
    return std::find(got.begin(), got.end(), decision) != got.end();
  };
  auto j0 = open(cluster.vmSocket("vmA"), 4, "j0", 1);
  ASSERT_TRUE(j0) << cluster.logs();
  ASSERT_TRUE(waitFor([&] { return saw("demote j0"); }, 60000)) << cluster.logs();
  std::string why;
  auto j1 = open(cluster.vmSocket("vmB"), 2, "j1", 1, 60000, false, &why);
  ASSERT_TRUE(j1) << why << cluster.logs();
  auto j2 = open(cluster.vmSocket("vmC"), 2, "j2", 0, 60000, false, &why);
  ASSERT_TRUE(j2) << why << cluster.logs();
  j1.reset();
  ASSERT_TRUE(waitFor([&] { return saw("resume j0"); }, 60000)) << "j0 never passed the starvation guard" << cluster.logs();
  j0.reset();
  ASSERT_TRUE(waitFor([&] { return saw("resume j2"); }, 60000)) << cluster.logs();
  j2.reset();
  ASSERT_TRUE(waitFor([&] { return saw("finish j2"); }, 60000)) << cluster.logs();

  auto j3 = open(cluster.vmSocket("vmA"), 3, "j3", 1);
  auto j4 = open(cluster.vmSocket("vmC"), 1, "j4");
  ASSERT_TRUE(j3 && j4) << cluster.logs();
  ASSERT_TRUE(waitFor([&] { return saw("demote j3"); }, 60000)) << cluster.logs();
  // j5, j6, j7 wait for blocks (their opens return once placed), arriving in that order.
  std::map<std::string, std::future<std::unique_ptr<Session>>> waiting;
  for (auto [name, vm] : {std::pair{"j5", "vmA"}, std::pair{"j6", "vmE"}, std::pair{"j7", "vmD"}}) {
    const std::string socket = cluster.vmSocket(vm), program = name;
    waiting[name] = std::async(std::launch::async, [socket, program] { return open(socket, 1, program, 0, 60000); });
    std::string vaccels = cluster.waitConsole("vaccels", [&](auto& j) { return stateOf(j, program) == "waiting"; });
    ASSERT_EQ(stateOf(vaccels, program), "waiting") << vaccels;
  }
  j4.reset();
  ASSERT_TRUE(waitFor([&] { return saw("start j6"); }, 60000)) << cluster.logs();
  j3.reset();
  ASSERT_TRUE(waitFor([&] { return saw("start j5") && saw("start j7"); }, 60000)) << cluster.logs();
  for (const char* name : {"j6", "j7", "j5"}) {
    auto session = waiting[name].get();
    ASSERT_TRUE(session) << name << cluster.logs();
    session.reset();
    ASSERT_TRUE(waitFor([&] { return saw(std::string("finish ") + name); }, 60000)) << cluster.logs();
  }
  EXPECT_EQ(events(), expected) << cluster.ctl({"events", "--recent"});
}

TEST(Policy, SetPolicyChangesAVmsCapsForItsNextPrograms) {
  Cluster cluster({VmSpec{"vm1", 16, 0}});
  cluster.addNetaccel("node0", {"kind=cpu,tflops=4,memory=512MiB,threads=1"}, 4);
  int status = -1;
  std::string out = cluster.ctl({"set-policy", "vm1", "tflops=2", "priority=3", "kinds=cpu,gpu"}, &status);
  EXPECT_EQ(status, 0) << out;
  EXPECT_TRUE(has(out, "vm 'vm1': tflops 2")) << out;
  std::string vms = cluster.console("vms");
  EXPECT_TRUE(has(vms, "\"tflops\":2,") && has(vms, "\"priority\":3,") && has(vms, "\"kinds\":\"gpu,cpu\"")) << vms;
  std::string why;
  EXPECT_FALSE(open(cluster.vmSocket("vm1"), 3, "toobig", 0, 0, false, &why));
  EXPECT_TRUE(has(why, "vm 'vm1' may hold 2 blocks")) << why;
  auto fits = open(cluster.vmSocket("vm1"), 2, "fits", 9);
  ASSERT_TRUE(fits);
  EXPECT_TRUE(has(vaccelOf(cluster.console("vaccels"), "fits"), "\"priority\":3,")) << "not capped by the new policy";
  out = cluster.ctl({"set-policy", "vm1", "socket=/elsewhere"}, &status);
  EXPECT_EQ(status, 1);
  EXPECT_TRUE(has(out, "'socket' is not a policy setting")) << out;
  out = cluster.ctl({"set-policy", "vm1", "tflops=-1"}, &status);
  EXPECT_EQ(status, 1);
  EXPECT_TRUE(has(out, "tflops") && has(out, "must be a finite number from 0 to")) << out;
  EXPECT_TRUE(has(cluster.ctl({"events", "--recent"}), "policy")) << "no policy event";
}

TEST(Migration, AProgramsBuffersMoveToAnotherNetaccelMidStreamWithEveryResultCorrect) {
  Cluster cluster({VmSpec{"vm1", 16, 0}});
  addTwoNetaccels(cluster);
  auto s = open(cluster.vmSocket("vm1"), 3, "mover");
  ASSERT_TRUE(s);
  std::string home = s->vaccel().cards.at(0).node, away = home == "node0" ? "node1" : "node0";
  Kept keep(*s, 300000, 21), x(*s, 50000, 22), y(*s, 50000, 23);
  std::atomic<int> rounds{0};
  std::atomic<bool> stop{false};
  std::string why;
  std::thread stream([&] {
    while (!stop && why.empty()) {
      why = axpyChecked(*s, x, y, 0.25f);
      ++rounds;
    }
  });
  while (rounds < 5 && why.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  int status = -1;
  std::string out = cluster.ctl({"drain", home}, &status);
  EXPECT_EQ(status, 0) << out;
  EXPECT_TRUE(has(out, "1 vaccel(s) moving elsewhere")) << out;
  std::string vaccels = cluster.waitConsole("vaccels", [&](auto& j) {
    return stateOf(j, "mover") == "running" && has(vaccelOf(j, "mover"), "\"node\":\"" + away + "\"");
  });
  EXPECT_TRUE(has(vaccelOf(vaccels, "mover"), "\"node\":\"" + away + "\"")) << vaccels;
  int after = rounds;
  while (rounds < after + 5 && why.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  stop = true;
  stream.join();
  EXPECT_EQ(why, "");
  EXPECT_EQ(keep.check(*s), "");
  std::string events = cluster.ctl({"events", "--recent"});
  EXPECT_TRUE(has(events, "migrated") && has(events, "node-drained")) << events;
  // Nothing new lands on the draining node until it is undone.
  auto other = open(cluster.vmSocket("vm1"), 1, "other");
  ASSERT_TRUE(other);
  EXPECT_EQ(other->vaccel().cards.at(0).node, away);
  out = cluster.ctl({"drain", home, "--undo"}, &status);
  EXPECT_EQ(status, 0) << out;
  auto third = open(cluster.vmSocket("vm1"), 4, "third");
  ASSERT_TRUE(third);
  EXPECT_EQ(third->vaccel().cards.at(0).node, home);
  out = cluster.ctl({"drain", "nowhere"}, &status);
  EXPECT_EQ(status, 1);
  EXPECT_TRUE(has(out, "no netaccel named 'nowhere'")) << out;
}

// docs/ARCHITECTURE.md: a 10-block pool; app1 holds 1-3, app2 4-6, app3 7-8; app1 exits;
// app4 asks for 4 -> app2 1-3, app3 4-5, app4 6-9, block 10 free.
void tenBlockFixture(Cluster& cluster, bool byHand) {
  auto app1 = open(cluster.vmSocket("vm1"), 3, "app1");
  auto app2 = open(cluster.vmSocket("vm1"), 3, "app2");
  auto app3 = open(cluster.vmSocket("vm1"), 2, "app3");
  ASSERT_TRUE(app1 && app2 && app3);
  std::string v = cluster.console("vaccels");
  ASSERT_EQ(blocksOf(v, "app1"), "{\"first\":1,\"count\":3}") << v;
  ASSERT_EQ(blocksOf(v, "app2"), "{\"first\":4,\"count\":3}") << v;
  ASSERT_EQ(blocksOf(v, "app3"), "{\"first\":7,\"count\":2}") << v;
  Kept k2(*app2, 100000, 31), k3(*app3, 100000, 32);
  ASSERT_TRUE(app2->fence() && app3->fence());
  app1.reset();
  v = cluster.waitConsole("vaccels", [](auto& j) { return vaccelOf(j, "app1").empty(); });
  if (byHand) {
    EXPECT_EQ(blocksOf(v, "app2"), "{\"first\":4,\"count\":3}") << "moved without being asked: " << v;
    int status = -1;
    std::string out = cluster.ctl({"defrag", "--max-moves", "1"}, &status);
    EXPECT_EQ(status, 0) << out;
    EXPECT_TRUE(has(out, "1 move(s) started of 2 planned")) << out;
    v = cluster.console("vaccels");
    EXPECT_EQ(blocksOf(v, "app2"), "{\"first\":1,\"count\":3}") << v;
    EXPECT_EQ(blocksOf(v, "app3"), "{\"first\":7,\"count\":2}") << v;
    out = cluster.ctl({"defrag"}, &status);
    EXPECT_TRUE(has(out, "1 move(s) started of 1 planned")) << out;
  }
  auto app4 = open(cluster.vmSocket("vm1"), 4, "app4");
  ASSERT_TRUE(app4);
  v = cluster.console("vaccels");
  EXPECT_EQ(blocksOf(v, "app2"), "{\"first\":1,\"count\":3}") << v;
  EXPECT_EQ(blocksOf(v, "app3"), "{\"first\":4,\"count\":2}") << v;
  EXPECT_EQ(blocksOf(v, "app4"), "{\"first\":6,\"count\":4}") << v;
  EXPECT_EQ(k2.check(*app2), "");
  EXPECT_EQ(k3.check(*app3), "");
}

TEST(Compaction, TheTenBlockFixtureHoldsLiveAfterARelease) {
  Cluster cluster({VmSpec{"vm1", 16, 0}});
  cluster.addNetaccel("node0", {"kind=cpu,tflops=10,memory=512MiB,threads=1"}, 10);
  tenBlockFixture(cluster, false);
}

TEST(Compaction, RaccelctlDefragHonoursItsMoveLimit) {
  Cluster cluster({VmSpec{"vm1", 16, 0}}, "", {"--set", "defrag_on_release=false", "--set", "defrag_on_demand=false"});
  cluster.addNetaccel("node0", {"kind=cpu,tflops=10,memory=512MiB,threads=1"}, 10);
  tenBlockFixture(cluster, true);
}

uint64_t bytesMovedOf(const std::string& json, const std::string& name) {
  std::string v = vaccelOf(json, name);
  auto at = v.find("\"bytesMoved\":");
  return at == std::string::npos ? 0 : std::stoull(v.substr(at + 13));
}

// A vaccel of 8 blocks over both cards of addTwoNetaccels (null, failing, otherwise).
std::unique_ptr<Session> openOverTwoCards(Cluster& cluster, const std::string& program) {
  addTwoNetaccels(cluster);
  auto s = open(cluster.vmSocket("vm1"), 8, program);
  if (s && s->vaccel().cards.size() != 2u) {
    ADD_FAILURE() << s->vaccel().describe();
    return nullptr;
  }
  return s;
}

TEST(Graph, ADiamondMovesFewerBytesThanRoundRobinAndBothAreRight) {
  Cluster cluster({VmSpec{"vm1", 16, 0}});
  auto s = openOverTwoCards(cluster, "diamond");
  ASSERT_TRUE(s);
  const size_t n = 200000;
  auto x = randomFloats(n, 41), y = randomFloats(n, 42), b0 = randomFloats(n, 43);
  auto hx = s->alloc(n * 4), hy = s->alloc(n * 4), ha = s->alloc(n * 4), hb = s->alloc(n * 4), hc = s->alloc(n * 4),
       hd = s->alloc(n * 4);
  s->writeFloats(hx, x);
  s->writeFloats(hy, y);
  // a = x + y; b = 2a + b; c = a + x; d = b + c: b and c are independent branches.
  client::Graph g;
  uint32_t top = g.vadd(n, hx, hy, ha);
  uint32_t left = g.axpy(n, 2.0f, ha, hb, {top});
  uint32_t right = g.vadd(n, ha, hx, hc);
  g.vadd(n, hb, hc, hd, {left, right});
  auto runAndCheck = [&](client::Graph::Placement placement, uint64_t* moved) {
    s->writeFloats(hb, b0);
    ASSERT_TRUE(s->fence());
    uint64_t before = bytesMovedOf(cluster.console("vaccels"), "diamond");
    s->submitGraph(g, placement);
    auto d = s->readFloats(hd, n), b = s->readFloats(hb, n), c = s->readFloats(hc, n);
    ASSERT_TRUE(d && b && c) << (d ? "" : d.error().message);
    for (size_t i = 0; i < n; ++i) {
      float a = x[i] + y[i], bb = 2.0f * a + b0[i], cc = a + x[i];
      ASSERT_EQ((*b)[i], bb) << i;
      ASSERT_EQ((*c)[i], cc) << i;
      ASSERT_EQ((*d)[i], bb + cc) << i;
    }
    *moved = bytesMovedOf(cluster.console("vaccels"), "diamond") - before;
  };
  uint64_t fewest = 0, roundRobin = 0;
  runAndCheck(client::Graph::Placement::fewestBytes, &fewest);
  runAndCheck(client::Graph::Placement::roundRobin, &roundRobin);
  EXPECT_LT(fewest, roundRobin);
  EXPECT_GT(roundRobin, 0u);
  std::cout << "diamond graph: " << fewest << " bytes moved placed by raccel, " << roundRobin << " round robin\n";
  // A graph naming a buffer it does not have is refused whole, naming the node.
  client::Graph bad;
  bad.vadd(n, hx, hy, ha);
  bad.vadd(n, hx, 999, ha);
  s->submitGraph(bad);
  auto refused = s->fence();
  ASSERT_FALSE(refused);
  EXPECT_TRUE(has(refused.error().message, "graph: node 1: b is buffer 999, which does not exist")) << refused.error().message;
}

// Tensor ops in a graph, beside a built-in op, spread over the vaccel's two cards: the
// results are exact; ops that write more than their output, or views past their
// buffer, refuse the graph naming the node.
TEST(Graph, TensorOpsRunInAGraphAcrossTheCardsExactly) {
  Cluster cluster({VmSpec{"vm1", 16, 0}});
  auto s = openOverTwoCards(cluster, "tensor-graph");
  ASSERT_TRUE(s);
  const uint64_t n = 1 << 16;
  auto x = randomFloats(n, 51), y = randomFloats(n, 52);
  auto hx = s->alloc(n * 4), hy = s->alloc(n * 4), ha = s->alloc(n * 4), hb = s->alloc(n * 4), hc = s->alloc(n * 4),
       hd = s->alloc(n * 4), hs = s->alloc(4);
  s->writeFloats(hx, x);
  s->writeFloats(hy, y);
  auto view = [&](client::Handle h) { return client::TensorOperand{h, 0, {1}}; };
  auto op = [&](client::TensorFn fn, std::vector<client::TensorOperand> operands, float alpha = 1, float beta = 0) {
    return vectorOp(fn, n, std::move(operands), alpha, beta);
  };
  for (auto placement : {client::Graph::Placement::roundRobin, client::Graph::Placement::fewestBytes}) {
    // a = x * y and b = x + 2y, independent; c = a + b; d = c + x (built-in); s = sum of d.
    client::Graph g;
    g.tensor(op(client::TensorFn::mul, {view(ha), view(hx), view(hy)}));
    g.tensor(op(client::TensorFn::add, {view(hb), view(hx), view(hy)}, 2));
    g.tensor(op(client::TensorFn::add, {view(hc), view(ha), view(hb)}));
    g.vadd(n, hc, hx, hd);
    auto sum = op(client::TensorFn::sum, {client::TensorOperand{hs, 0, {0}}, view(hd)});
    sum.reduceMask = 1;
    g.tensor(sum);
    s->submitGraph(g, placement);
    auto d = s->readFloats(hd, n), total = s->readFloats(hs, 1);
    ASSERT_TRUE(d && total) << (d ? total.error().message : d.error().message);
    double want = 0;
    for (uint64_t i = 0; i < n; ++i) {
      float a = x[i] * y[i], b = x[i] + 2 * y[i], c = a + b;
      ASSERT_EQ((*d)[i], c + x[i]) << i;
      want += (*d)[i];
    }
    EXPECT_NEAR((*total)[0], want, 1e-3 * std::max(1.0, std::abs(want)));
  }
  client::Graph wide;
  wide.vadd(n, hx, hy, ha);
  wide.tensor(op(client::TensorFn::copy, {view(hs), view(hx)}));  // hs holds one float
  s->submitGraph(wide);
  auto refused = s->fence();
  ASSERT_FALSE(refused);
  EXPECT_TRUE(has(refused.error().message, "graph: node 1: tensor operand 0 (buffer " + std::to_string(hs) + ") holds 4 bytes"))
      << refused.error().message;
  client::Graph norm;
  auto layer = op(client::TensorFn::layerNorm, {view(ha), view(hx), view(hb), view(hc)});
  norm.tensor(layer);
  s->submitGraph(norm);
  refused = s->fence();
  ASSERT_FALSE(refused);
  EXPECT_TRUE(has(refused.error().message, "writes more than its output")) << refused.error().message;
  s->writeFloats(ha, y);  // the session carries on
  auto back = s->readFloats(ha, n);
  ASSERT_TRUE(back) << back.error().message;
  EXPECT_EQ(*back, y);
}

// A tensor matmul on a vaccel over two cards is split by rows, as gemm is: exact to the
// reference whether its output is a view with gaps between rows (accumulated, beta 1),
// a is read transposed, or all three share one buffer (as raccel.torch's tensors do).
TEST(Split, ATensorMatmulIsSplitByRowsAcrossTheCards) {
  Cluster cluster({VmSpec{"vm1", 16, 0}});
  auto s = openOverTwoCards(cluster, "tensor-split");
  ASSERT_TRUE(s);
  const uint64_t m = 96, n = 80, k = 640, wide = n + 16;  // 9.8 MFLOP: over split_min_mflop
  auto a = randomFloats(m * k, 61), b = randomFloats(k * n, 62), c = randomFloats(m * wide, 63);
  // One buffer: a (m x k, row-major), b (k x n), then the output region (m rows of `wide`).
  const uint64_t aAt = 0, bAt = m * k, outAt = m * k + k * n;
  auto h = s->alloc((outAt + m * wide) * 4);
  std::vector<float> all(a);
  all.insert(all.end(), b.begin(), b.end());
  all.insert(all.end(), c.begin(), c.end());
  auto run = [&](bool transposedA, float beta) -> std::vector<float> {
    s->writeFloats(h, all);
    std::vector<float> at(a);  // a as stored: transposed, it is k x m
    if (transposedA)
      for (uint64_t i = 0; i < m; ++i)
        for (uint64_t q = 0; q < k; ++q) at[q * m + i] = a[i * k + q];
    s->write(h, aAt * 4, std::as_bytes(std::span(at)));
    client::TensorOp op;
    op.fn = client::TensorFn::matmul;
    op.shape = {m, n, k};
    op.operands = {client::TensorOperand{h, outAt + 8, {wide, 1, 0}},  // columns 8..8+n of the wide rows
                   client::TensorOperand{h, aAt, transposedA ? std::vector<uint64_t>{1, 0, m} : std::vector<uint64_t>{k, 0, 1}},
                   client::TensorOperand{h, bAt, {0, 1, n}}};
    op.beta = beta;
    uint64_t before = bytesMovedOf(cluster.console("vaccels"), "tensor-split");
    s->tensor(op);
    auto got = s->readFloats(h, outAt + m * wide);
    EXPECT_TRUE(got) << got.error().message;
    EXPECT_GT(bytesMovedOf(cluster.console("vaccels"), "tensor-split"), before) << "not split: nothing was copied to the other card";
    return got ? std::vector<float>(got->begin() + outAt, got->end()) : std::vector<float>{};
  };
  for (bool transposedA : {false, true})
    for (float beta : {0.0f, 1.0f}) {
      auto out = run(transposedA, beta);
      ASSERT_EQ(out.size(), m * wide);
      for (uint64_t i = 0; i < m; ++i)
        for (uint64_t j = 0; j < wide; ++j) {
          float want = c[i * wide + j];  // the gaps stay as they were
          if (j >= 8 && j < 8 + n) {
            double sum = 0;
            for (uint64_t q = 0; q < k; ++q) sum += double(a[i * k + q]) * b[q * n + (j - 8)];
            want = static_cast<float>(sum + beta * c[i * wide + j]);
          }
          ASSERT_NEAR(out[i * wide + j], want, 2e-3) << "row " << i << " column " << j << (transposedA ? " (a transposed)" : "")
                                                     << " beta " << beta;
        }
    }
}

TEST(Fairness, TwoTenantsWithThreeToOneBlocksOfACardGetKernelTimeRoughlyThreeToOne) {
  // Loosely: the benchmark (raccel-bench fair_share_error) holds it to 5% over a longer run.
  FairShare f = measureFairShare(1.5);
  ASSERT_EQ(f.problem, "");
  EXPECT_GT(f.ratio, 2.4) << f.big << " vs " << f.small << "\n" << f.detail;
  EXPECT_LT(f.ratio, 3.6) << f.big << " vs " << f.small;
}

TEST(Fairness, OnAnAsynchronousCardTheDeviceTimeIsSharedThreeToOne) {
  // Kernels queue on the card's own thread and are timed there; the netaccel keeps at
  // most device_queue_depth in flight and charges each tenant its kernels' device time.
  FairShare f = measureFairShare(1.5, kAsyncFairCard);
  ASSERT_EQ(f.problem, "");
  EXPECT_GT(f.ratio, 2.4) << f.big << " vs " << f.small << "\n" << f.detail;
  EXPECT_LT(f.ratio, 3.6) << f.big << " vs " << f.small;
}


// Durable state: kill -9 the scheduler in the middle of a program's stream of
// instructions and start it again. The netaccel keeps the contexts, the scheduler finds
// its allocations and policies in its state database, raccel-guestd re-attaches the
// programs and resends what the vaccel had not taken. Every axpy below adds 1 to each
// element exactly once: a lost or repeated instruction shows in the result.
TEST(Restart, KillNineMidWorkloadLosesNoAllocationAndProgramsFinishExactly) {
  Cluster cluster({VmSpec{"vm1", 8, 5}});
  cluster.addNetaccel("node0", {"kind=gpu,tflops=8,memory=512MiB,threads=1"}, 8);
  int status = 0;
  std::string out = cluster.ctl({"set-policy", "vm1", "priority=3", "tflops=7"}, &status);
  ASSERT_EQ(status, 0) << out;
  std::string guestd = cluster.startGuestd("vm1");

  // A program that waits: its buffer must be there after the restart.
  auto idle = open(guestd, 2, "idle", 9);
  ASSERT_TRUE(idle) << cluster.logs();
  Kept kept(*idle, 300000, 7);
  ASSERT_TRUE(idle->fence());

  // A program streaming axpys back to back, checking y every 50.
  constexpr int kIterations = 4000;
  constexpr size_t kN = 100000;
  std::atomic<int> done{0};
  std::promise<std::string> result;
  std::thread streamer([&] {
    auto s = open(guestd, 4, "stream", 9);
    if (!s) return result.set_value("no session");
    auto x = s->alloc(kN * 4), y = s->alloc(kN * 4);
    s->writeFloats(x, std::vector<float>(kN, 1.0f));
    s->fill(y, 0, kN * 4, 0);
    for (int i = 1; i <= kIterations; ++i) {
      s->axpy(kN, 1.0f, x, y);
      if (i % 50 == 0 || i == kIterations) {
        auto got = s->readFloats(y, kN);
        if (!got) return result.set_value("iteration " + std::to_string(i) + ": " + got.error().toString());
        for (size_t e = 0; e < kN; ++e)
          if ((*got)[e] != static_cast<float>(i))
            return result.set_value("iteration " + std::to_string(i) + ": y[" + std::to_string(e) + "] = " +
                                    std::to_string((*got)[e]));
      }
      done = i;
    }
    result.set_value("");
  });
  auto finished = result.get_future();
  for (int i = 0; i < 2000 && done < 300; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::string before = cluster.console("vaccels");
  ASSERT_GE(done.load(), 300) << cluster.logs();
  ASSERT_LT(done.load(), kIterations) << "the stream ended before the restart";

  cluster.restartScheduler();
  // Allocations are back, on the same blocks, and the policy set by raccelctl with them.
  std::string after = cluster.waitConsole("vaccels", [](auto& j) { return stateOf(j, "idle") == "running"; });
  EXPECT_EQ(blocksOf(after, "idle"), blocksOf(before, "idle")) << before << after;
  EXPECT_FALSE(blocksOf(before, "stream").empty()) << before;
  std::string vms = cluster.console("vms");
  EXPECT_TRUE(has(vms, "\"priority\":3") && has(vms, "\"tflops\":7")) << vms;
  EXPECT_TRUE(has(after, "\"program\":\"idle\",\"priority\":3")) << after;

  ASSERT_EQ(finished.wait_for(std::chrono::seconds(90)), std::future_status::ready) << cluster.logs();
  streamer.join();
  EXPECT_EQ(finished.get(), "") << cluster.logs();
  EXPECT_EQ(kept.check(*idle), "") << cluster.logs();
  std::string events = cluster.ctl({"events", "--recent"});
  EXPECT_TRUE(has(events, "restored") && has(events, "reattached")) << events;
}

TEST(Restart, ASuspendedVaccelKeepsItsBuffersAcrossARestart) {
  Cluster cluster({VmSpec{"vm1", 8, 0}});
  cluster.addNetaccel("node0", {"kind=cpu,tflops=4,memory=512MiB,threads=1"}, 4);
  std::string guestd = cluster.startGuestd("vm1");
  auto s = open(guestd, 2, "patient");
  ASSERT_TRUE(s) << cluster.logs();
  Kept x(*s, 300000, 3), y(*s, 300000, 4);
  ASSERT_TRUE(s->fence());
  int status = 0;
  std::string out = cluster.ctl({"preempt", std::to_string(s->vaccel().id)}, &status);
  ASSERT_EQ(status, 0) << out;
  cluster.waitConsole("vaccels", [](auto& j) { return stateOf(j, "patient") == "suspended"; });

  cluster.restartScheduler();
  std::string after = cluster.waitConsole("vaccels", [](auto& j) { return stateOf(j, "patient") == "suspended"; });
  EXPECT_EQ(stateOf(after, "patient"), "suspended") << after << cluster.logs();
  // Its instruction waits for the operator's resume, then runs on the restored buffers.
  auto pending = std::async(std::launch::async, [&] { return axpyChecked(*s, x, y, 2.0f); });
  EXPECT_EQ(pending.wait_for(std::chrono::milliseconds(500)), std::future_status::timeout);
  out = cluster.ctl({"resume", std::to_string(s->vaccel().id)}, &status);
  ASSERT_EQ(status, 0) << out;
  EXPECT_EQ(pending.get(), "") << cluster.logs();
  EXPECT_EQ(x.check(*s), "");
  // Resumed after the restart, it is protected again: its lineage starts with a
  // checkpoint of every buffer (x and y, 1.2 MB), read back from its new card.
  const std::regex read("raccel_vaccel_checkpoint_read_bytes_total\\{[^}]*vaccel=\"" + std::to_string(s->vaccel().id) +
                        "\"[^}]*\\} ([0-9.e+]+)");
  std::smatch m;
  std::string page;
  EXPECT_TRUE(waitFor([&] {
    page = rawhttp::roundTrip(cluster.httpPort(), "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    return std::regex_search(page, m, read) && std::stod(m[1].str()) >= 2 * 300000 * 4;
  }, 30000)) << page;
}

}  // namespace
}  // namespace raccel::testing
