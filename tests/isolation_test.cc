// One tenant cannot hurt another on a shared card: real processes, a real OpenCL card
// (PoCL) or CUDA GPU (where there is one) whose tenants each run in a sandbox process of
// their own (netaccel/sandbox.h).
// A victim program keeps computing while another VM's kernel writes far out of bounds,
// or while another VM's sandbox is killed with SIGKILL; the attacker gets an error that
// names the fault, the victim's results stay exact, a third program runs on the card
// afterwards, and `raccelctl events` reports the fault.
#include <gtest/gtest.h>
#include <signal.h>

#include <atomic>
#include <cstring>
#include <regex>
#include <thread>

#include "hal/backends.h"
#include "tests/cluster.h"
#include "tests/kernels.h"
#include "vmfrontend/raccel.h"

namespace raccel::testing {
namespace {

using client::Arg;
using client::Session;

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// The card under test and its programs: `scale` (x = x * s + i for i < n) and `stomp`,
// which writes 2^40 floats and more past its buffer's start, far outside anything mapped.
struct CardUnderTest {
  std::string backend;
  std::string card;  // the --card spec
  ProgramKind kind;
  std::string scale, stomp;
  std::string faultSays;  // what the attacker's error names
};
void PrintTo(const CardUnderTest& c, std::ostream* os) { *os << c.backend; }

const CardUnderTest kOpencl{
    "opencl", "backend=opencl,kind=gpu,tflops=8,memory=512MiB", ProgramKind::openclC, kScaleOpenclC.source,
    "__kernel void stomp(__global float* x) {\n"
    "  x[(ulong)get_global_id(0) * 268435456UL + 1099511627776UL] = 42.0f;\n"
    "}\n",
    "killed by signal"};  // PoCL runs kernels on the sandbox's own threads: it dies

const CardUnderTest kCuda{
    "cuda", "backend=cuda,device=0,kind=gpu,tflops=8,memory=2GiB", ProgramKind::cudaC, kScaleCudaC.source,
    "extern \"C\" __global__ void stomp(float* x) {\n"
    "  x[(unsigned long long)(blockIdx.x * blockDim.x + threadIdx.x) * 268435456ull + 1099511627776ull] = 42.0f;\n"
    "}\n",
    "the kernel faulted"};  // an illegal address: the sandbox's CUDA context is lost

std::unique_ptr<Session> open(Cluster& c, const std::string& vm, const std::string& name) {
  client::Options o;
  o.socket = c.vmSocket(vm);
  o.tflops = 2;
  o.program = name;
  o.timeoutMs = 60000;
  auto s = Session::open(o);
  EXPECT_TRUE(s) << s.error().message << "\n" << c.logs();
  return s ? std::move(*s) : nullptr;
}

client::Handle loadScale(Session& s, const CardUnderTest& card) {
  return s.loadProgram(card.kind, "scale", std::as_bytes(std::span(card.scale)));
}

// A program that keeps its data on the card and checks every round of work on it exactly:
// each scale() is x = x * factor + i on the card, and the same here.
struct Victim {
  std::unique_ptr<Session> session;
  client::Handle buffer = 0, program = 0;
  std::vector<float> expected;
  float factor = 0.5f;

  void start(Cluster& c, const CardUnderTest& card, const std::string& vm, uint32_t n, unsigned seed,
             const std::string& name = "victim") {
    session = open(c, vm, name);
    ASSERT_TRUE(session);
    expected = randomFloats(n, seed);
    buffer = session->alloc(n * 4);
    session->writeFloats(buffer, expected);
    program = loadScale(*session, card);
    ASSERT_TRUE(session->fence());
  }
  void scale() {
    uint32_t n = static_cast<uint32_t>(expected.size());
    session->launch(program, "scale", {(n + 63) / 64, 1, 1}, {64, 1, 1}, {Arg::f32(factor), Arg::buffer(buffer), Arg::u32(n)});
    for (uint32_t i = 0; i < n; ++i) expected[i] = expected[i] * factor + float(i);
  }
  // The whole buffer back: empty when it is what the card should hold, else what is not.
  std::string mismatch() {
    auto got = session->readFloats(buffer, expected.size());
    if (!got) return got.error().message;
    for (size_t i = 0; i < expected.size(); ++i)
      if ((*got)[i] != expected[i])
        return "element " + std::to_string(i) + " is " + std::to_string((*got)[i]) + ", want " + std::to_string(expected[i]);
    return {};
  }
  // One round: a scale, then the buffer checked.
  bool round(std::string* why) {
    scale();
    *why = mismatch();
    return why->empty();
  }
};

// A buffer of 256 floats of `value` on the card, fenced: what a tenant had before its sandbox went.
client::Handle keep(Session& s, float value) {
  auto h = s.alloc(1024);
  s.writeFloats(h, std::vector<float>(256, value));
  EXPECT_TRUE(s.fence());
  return h;
}

// The victim's rounds on a thread of its own while `attack` runs, then a few more.
void victimSurvives(Victim& v, const std::function<void()>& attack, Cluster& c) {
  std::atomic<bool> attacking{true};
  std::atomic<int> rounds{0};
  std::string why;
  bool ok = true;
  std::thread t([&] {
    while (ok && (attacking || rounds < 3)) {
      ok = v.round(&why);
      ++rounds;
    }
  });
  attack();
  int before = rounds;
  attacking = false;
  t.join();
  EXPECT_TRUE(ok) << "round " << rounds << ": " << why << "\n" << c.logs();
  EXPECT_GE(rounds, before + 1);
}

void thirdProgramRuns(Cluster& c, const CardUnderTest& card) {
  auto s = open(c, "vm3", "third");
  ASSERT_TRUE(s);
  const uint32_t n = 4096;
  auto x = randomFloats(n, 33);
  auto h = s->alloc(n * 4);
  s->writeFloats(h, x);
  auto p = loadScale(*s, card);
  s->launch(p, "scale", {n / 64, 1, 1}, {64, 1, 1}, {Arg::f32(2.0f), Arg::buffer(h), Arg::u32(n)});  // exact: no rounding for a fused multiply-add to change
  auto got = s->readFloats(h, n);
  ASSERT_TRUE(got) << got.error().message << "\n" << c.logs();
  for (uint32_t i = 0; i < n; ++i) ASSERT_EQ((*got)[i], x[i] * 2.0f + float(i)) << "element " << i;
}

class Isolation : public ::testing::TestWithParam<CardUnderTest> {
 protected:
  void SetUp() override {
    auto report = hal::discover(GetParam().backend);
    if (report.devices.empty()) GTEST_SKIP() << "no " << GetParam().backend << " device: " << report.note;
    VmSpec noFailover{"vm4", 4};
    noFailover.more = "failover=off";
    std::vector<VmSpec> vms = {VmSpec{"vm1", 4}, VmSpec{"vm2", 4}, VmSpec{"vm3", 4}, noFailover};
    cluster = std::make_unique<Cluster>(vms);
    // One card of 8 blocks: the three VMs' programs share it.
    netaccel = &cluster->addNetaccel("node0", {GetParam().card}, 8);
  }
  const CardUnderTest& card() const { return GetParam(); }
  // The pid of the sandbox serving `vm` on card 0, from the netaccel's log.
  pid_t sandboxOf(const std::string& vm) {
    std::regex line("card 0: tenant '" + vm + "' is served by sandbox process ([0-9]+)");
    std::smatch m;
    std::string log = readFile(netaccel->log());
    pid_t pid = 0;
    for (auto it = std::sregex_iterator(log.begin(), log.end(), line); it != std::sregex_iterator(); ++it)
      pid = static_cast<pid_t>(std::stol((*it)[1].str()));
    return pid;
  }
  std::string events() { return cluster->ctl({"events", "--recent", "--json"}); }

  std::unique_ptr<Cluster> cluster;
  Process* netaccel = nullptr;
};

TEST_P(Isolation, AKernelWritingFarOutOfBoundsFailsItsOwnTenantOnly) {
  Victim v;
  v.start(*cluster, card(), "vm1", 1 << 16, 1);
  auto attacker = open(*cluster, "vm2", "attacker");
  ASSERT_TRUE(attacker);
  auto kept = keep(*attacker, 1.0f);

  victimSurvives(v, [&] {
    auto target = attacker->alloc(4096);
    auto evil = attacker->loadProgram(card().kind, "stomp", std::as_bytes(std::span(card().stomp)));
    attacker->launch(evil, "stomp", {64, 1, 1}, {64, 1, 1}, {Arg::buffer(target)});
    auto fault = attacker->fence();
    ASSERT_FALSE(fault) << "the out-of-bounds kernel was not reported";
    EXPECT_EQ(fault.error().code, Code::internal) << fault.error().message;
    EXPECT_TRUE(contains(fault.error().message, card().faultSays)) << fault.error().message;
    EXPECT_TRUE(contains(fault.error().message, "buffers and programs on card 0 are lost")) << fault.error().message;
  }, *cluster);

  // The attacker's earlier buffer is gone, saying why; new work runs on a fresh sandbox.
  auto lost = attacker->readFloats(kept, 4);
  ASSERT_FALSE(lost);
  EXPECT_TRUE(contains(lost.error().message, "was lost")) << lost.error().message;
  auto fresh = attacker->alloc(64);
  attacker->writeFloats(fresh, {1, 2, 3, 4});
  auto back = attacker->readFloats(fresh, 4);
  ASSERT_TRUE(back) << back.error().message;
  EXPECT_EQ(*back, (std::vector<float>{1, 2, 3, 4}));

  // The lost buffers are no longer the VM's memory: only the fresh one counts.
  std::string vms = cluster->console("vms");
  auto at = vms.find("\"name\":\"vm2\"");
  ASSERT_NE(at, std::string::npos) << vms;
  auto used = vms.find("\"memoryUsed\":", at);
  ASSERT_NE(used, std::string::npos) << vms;
  EXPECT_EQ(std::atoll(vms.c_str() + used + 13), 64) << vms;  // the fresh buffer alone

  thirdProgramRuns(*cluster, card());
  EXPECT_TRUE(netaccel->running()) << cluster->logs();
  std::string e = events();
  EXPECT_TRUE(contains(e, "\"kind\":\"card-fault\",\"subject\":\"node0 card 0\"")) << e;
  EXPECT_TRUE(contains(e, "vm2/attacker")) << e;
  EXPECT_FALSE(contains(e, "recovering")) << "a fault of its own kernel is not rebuilt: " << e;
}

// The other tenant of the kill and reset tests: 4096 floats, doubled (and i added) once
// before the loss.
void startOther(Victim& other, Cluster& c, const CardUnderTest& card, const std::string& name, unsigned seed) {
  other.factor = 2.0f;
  other.start(c, card, "vm2", 4096, seed, name);
  other.scale();
  ASSERT_TRUE(other.session->fence());
}

// Its sandbox killed from outside (kill -9, as an operator or the OOM killer would): not
// its tenant's doing, so with failover (the default) the vaccel is rebuilt from its
// lineage on a fresh sandbox, and its program sees every byte it had, with no error.
TEST_P(Isolation, ASandboxKilledFromOutsideIsRebuiltFromItsLineageWithNoErrorToItsTenant) {
  Victim v;
  v.start(*cluster, card(), "vm1", 1 << 16, 3);
  Victim other;
  startOther(other, *cluster, card(), "rebuilt", 44);
  pid_t otherSandbox = sandboxOf("vm2");
  ASSERT_GT(otherSandbox, 0) << cluster->logs();

  victimSurvives(v, [&] {
    ASSERT_EQ(::kill(otherSandbox, SIGKILL), 0);
    ASSERT_EQ(other.mismatch(), "") << "after the kill (its buffer, as it was)" << cluster->logs();
  }, *cluster);
  other.scale();  // its program still runs where it was rebuilt
  ASSERT_EQ(other.mismatch(), "") << "run again";
  EXPECT_NE(sandboxOf("vm2"), otherSandbox);
  std::string e = events();
  EXPECT_TRUE(contains(e, "not by its own work")) << e;
  EXPECT_TRUE(contains(e, "\"kind\":\"recovered\"")) << e;
}

// Its card gone under its sandbox (as after a driver reset; SIGPWR tells the sandbox so,
// and its next reply says the card went away): not its tenant's doing, so the vaccel is
// rebuilt from its lineage, as after a kill from outside. A sandbox can claim that falsely
// (a hostile one can say anything), so a vaccel is rebuilt so at most three times in ten
// minutes; the fourth loss fails it, saying why, and the victim on the card runs on.
TEST_P(Isolation, ASandboxWhoseCardWentAwayIsRebuiltFromItsLineageAtMostThreeTimes) {
  Victim v;
  v.start(*cluster, card(), "vm1", 1 << 16, 5);
  Victim other;
  startOther(other, *cluster, card(), "reset", 45);

  victimSurvives(v, [&] {
    for (int reset = 1; reset <= 3; ++reset) {
      pid_t sandbox = sandboxOf("vm2");
      ASSERT_GT(sandbox, 0) << cluster->logs();
      ASSERT_EQ(::kill(sandbox, SIGPWR), 0);
      other.scale();  // the instruction that finds the card gone runs again where it is rebuilt
      ASSERT_EQ(other.mismatch(), "") << "reset " << reset << cluster->logs();
      ASSERT_NE(sandboxOf("vm2"), sandbox) << "reset " << reset << ": a fresh sandbox serves it";
    }
    ASSERT_EQ(::kill(sandboxOf("vm2"), SIGPWR), 0);
    auto fourth = other.session->readFloats(other.buffer, other.expected.size());
    ASSERT_FALSE(fourth) << "a fourth loss in ten minutes was rebuilt too";
    EXPECT_TRUE(contains(fourth.error().message, "went away under it")) << fourth.error().message;
    auto lost = other.session->readFloats(other.buffer, other.expected.size());
    ASSERT_FALSE(lost);
    EXPECT_TRUE(contains(lost.error().message, "was lost: its card went away under it")) << lost.error().message;
  }, *cluster);
  std::string e = events();
  EXPECT_TRUE(contains(e, "its card went away under it")) << e;
  EXPECT_TRUE(contains(e, " (not rebuilt: its sandboxes ended 4 times in 10 minutes")) << e;
  EXPECT_TRUE(contains(e, "\"kind\":\"recovered\"")) << e;
}

// With failover off (vm4), a sandbox killed from outside fails its own tenant, saying why.
TEST_P(Isolation, WithFailoverOffASandboxKilledWithSigkillFailsItsOwnTenantOnly) {
  Victim v;
  v.start(*cluster, card(), "vm1", 1 << 16, 2);
  auto other = open(*cluster, "vm4", "other");
  ASSERT_TRUE(other);
  auto kept = keep(*other, 2.0f);
  pid_t victimSandbox = sandboxOf("vm1"), otherSandbox = sandboxOf("vm4");
  ASSERT_GT(otherSandbox, 0) << cluster->logs();
  ASSERT_NE(victimSandbox, otherSandbox);

  victimSurvives(v, [&] {
    ASSERT_EQ(::kill(otherSandbox, SIGKILL), 0);
    auto r = other->readFloats(kept, 4);
    ASSERT_FALSE(r) << "a read from a killed sandbox succeeded";
    EXPECT_TRUE(contains(r.error().message, "killed by signal 9")) << r.error().message;
    EXPECT_TRUE(contains(r.error().message, "are lost")) << r.error().message;
  }, *cluster);

  // A fresh sandbox serves the same tenant from now on.
  auto fresh = other->alloc(64);
  other->writeFloats(fresh, {5, 6});
  auto back = other->readFloats(fresh, 2);
  ASSERT_TRUE(back) << back.error().message;
  EXPECT_EQ(*back, (std::vector<float>{5, 6}));
  EXPECT_NE(sandboxOf("vm4"), otherSandbox);
  EXPECT_EQ(sandboxOf("vm1"), victimSandbox);

  // Suspended and resumed (saved to the scheduler, restored in a new context): the fresh
  // buffer comes back intact, the lost one still says it was lost.
  int status = -1;
  std::string out = cluster->ctl({"preempt", std::to_string(other->vaccel().id)}, &status);
  ASSERT_EQ(status, 0) << out;
  cluster->waitConsole("vaccels", [](auto& j) { return contains(j, "\"state\":\"suspended\""); });
  out = cluster->ctl({"resume", std::to_string(other->vaccel().id)}, &status);
  ASSERT_EQ(status, 0) << out;
  cluster->waitConsole("vaccels", [](auto& j) {
    return !contains(j, "\"state\":\"suspended\"") && !contains(j, "\"state\":\"resuming\"");
  });
  back = other->readFloats(fresh, 2);
  ASSERT_TRUE(back) << back.error().message;
  EXPECT_EQ(*back, (std::vector<float>{5, 6}));
  auto still = other->readFloats(kept, 2);
  ASSERT_FALSE(still);
  EXPECT_TRUE(contains(still.error().message, "was lost")) << still.error().message;

  thirdProgramRuns(*cluster, card());
  std::string e = events();
  EXPECT_TRUE(contains(e, "card-fault")) << e;
}

TEST_P(Isolation, ATenantsSandboxIsConfinedAndEndsWithItsLastProgram) {
  auto s = open(*cluster, "vm1", "first");
  ASSERT_TRUE(s);
  auto h = s->alloc(64);
  s->writeFloats(h, {1});
  ASSERT_TRUE(s->fence());
  pid_t pid = sandboxOf("vm1");
  ASSERT_GT(pid, 0);
  // Its working folder is its own (0700) and the process may not gain privileges.
  std::string status = readFile("/proc/" + std::to_string(pid) + "/status");
  EXPECT_TRUE(contains(status, "NoNewPrivs:\t1")) << status;
  EXPECT_TRUE(contains(status, "Seccomp:\t2")) << status;  // its filter: no signals but to itself, no network
  std::string limits = readFile("/proc/" + std::to_string(pid) + "/limits");
#ifndef __SANITIZE_ADDRESS__  // (the sanitizer build sets no data limit: its shadow memory grows as it goes)
  EXPECT_TRUE(std::regex_search(limits, std::regex("Max data size +[0-9]+ +[0-9]+ +bytes"))) << limits;
#endif
  s.reset();  // the session ends: its context closes, and with it the tenant's sandbox
  bool gone = false;
  for (int i = 0; i < 200 && !gone; ++i) {
    gone = ::kill(pid, 0) != 0;
    if (!gone) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_TRUE(gone) << "sandbox " << pid << " outlived its tenant's last program";
}

INSTANTIATE_TEST_SUITE_P(Cards, Isolation, ::testing::Values(kOpencl, kCuda),
                         [](const auto& info) { return info.param.backend; });

}  // namespace
}  // namespace raccel::testing
