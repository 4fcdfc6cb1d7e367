// End to end on loopback with real processes: raccel-scheduler, raccel-netaccel(s) and
// raccel-guestd as children; guest programs through libraccel (in test threads) and as
// raccel-run processes. Every result is checked against a reference computed here.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <sstream>
#include <fstream>
#include <cmath>
#include <cstring>
#include <random>
#include <regex>
#include <thread>

#include <nlohmann/json.hpp>

#include "schema/guest.capnp.h"
#include "tests/cluster.h"
#include "tests/raw_http.h"
#include "transport/blocking_link.h"
#include "transport/wire_types.h"
#include "vmfrontend/raccel.h"
#include "vmfrontend/raccel_c.h"

namespace raccel::testing {
namespace {

using client::Session;

std::unique_ptr<Session> open(const std::string& socket, double tflops = 1, std::vector<CardKind> kinds = {},
                              const std::string& name = "test") {
  client::Options o;
  o.socket = socket;
  o.tflops = tflops;
  o.kinds = std::move(kinds);
  o.program = name;
  o.timeoutMs = 30000;
  auto s = Session::open(o);
  EXPECT_TRUE(s) << s.error().message;
  return s ? std::move(*s) : nullptr;
}


// Builds a raw frame: header + body bytes.
std::vector<std::byte> rawFrame(uint32_t channel, uint64_t seq, capnp::MessageBuilder& m) {
  std::vector<std::byte> out;
  transport::appendFrame(out, channel, seq, m);
  return out;
}

class Integration : public ::testing::Test {
 protected:
  void SetUp() override {
    VmSpec vm;
    vm.memoryQuota = "256MiB";
    vm.tflops = 16;
    // What a lost netaccel does without failover (with it: AFrozenNetaccel… below and
    // tests/failover_test.cc).
    vm.more = "failover=off";
    cluster = std::make_unique<Cluster>(std::vector<VmSpec>{vm});
    node0 = cluster->addNetaccel("node0", {"kind=gpu,tflops=6,memory=512MiB,threads=1"}, 6).pid();
    cluster->addNetaccel("node1", {"kind=cpu,tflops=6,memory=512MiB,threads=1"}, 6);
  }
  void TearDown() override {
    if (HasFailure()) std::cerr << cluster->logs();
  }
  std::unique_ptr<Cluster> cluster;
  pid_t node0 = -1;
};

// raccel-run asks for the card kinds it is given (hello's kinds), and refuses a kind it
// does not know, naming the flag.
TEST_F(Integration, RaccelRunAsksForTheKindsItIsGiven) {
  int status = -1;
  const std::string run = sh(binary("raccel-run")) + " --socket " + sh(cluster->vmSocket()) + " --size 64 --iterations 1";
  std::string out = runCommand(run + " --kinds cpu 2>&1", &status);
  EXPECT_EQ(status, 0) << out;
  EXPECT_NE(out.find("node1/0(cpu"), std::string::npos) << out;
  EXPECT_EQ(out.find("(gpu"), std::string::npos) << out;
  out = runCommand(run + " --kinds gpu,tpu 2>&1", &status);
  EXPECT_EQ(status, 2) << out;
  EXPECT_NE(out.find("raccel-run: --kinds gpu,tpu: unknown card kind 'tpu'"), std::string::npos) << out;
}

TEST_F(Integration, ConcurrentProgramsThroughGuestdGetCorrectResults) {
  std::string guestd = cluster->startGuestd();
  std::atomic<int> good{0};
  std::vector<std::string> failures(4);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      client::Options o;
      o.socket = guestd;
      o.tflops = 1 + t % 2;
      o.program = "thread" + std::to_string(t);
      auto s = Session::open(o);
      if (!s) {
        failures[t] = s.error().toString();
        return;
      }
      for (int round = 0; round < 3; ++round) {
        double err = checkedGemm(**s, 48 + t, 40, 33 + round, 100 * t + round, &failures[t]);
        if (err < 0 || err > 1e-3) {
          if (failures[t].empty()) failures[t] = "error " + std::to_string(err);
          return;
        }
      }
      ++good;
    });
  }
  // Two more programs as separate processes.
  std::vector<Process> runs;
  for (int p = 0; p < 2; ++p)
    runs.emplace_back("raccel-run",
                      std::vector<std::string>{"--socket", guestd, "--size", "96", "--ops", "--seed", std::to_string(p + 7),
                                               "--name", "run" + std::to_string(p)},
                      cluster->dir() + "/run" + std::to_string(p) + ".log");
  for (auto& t : threads) t.join();
  for (int t = 0; t < 4; ++t) EXPECT_EQ(failures[t], "") << "thread " << t;
  EXPECT_EQ(good, 4);
  for (auto& r : runs) EXPECT_EQ(r.wait(60000), 0) << "raccel-run failed; see " << r.log();
  // Every program has left: all blocks are free again.
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_NE(cluster->console("pool").find("\"free\":12"), std::string::npos) << cluster->console("pool");
}

// A program's waits for replies (transport/spin_wait.h): sleeping at once (0) or polling
// first (the most allowed) give the same answers to reads and fences; a spin setting out
// of range, given in the options or in RACCEL_SPIN_US, is refused naming it, before
// anything is sent.
TEST_F(Integration, WaitsThatSpinOrSleepGetTheSameAnswersAndABadSpinIsRefusedByName) {
  std::string guestd = cluster->startGuestd();
  for (int spin : {0, 1000}) {
    client::Options o;
    o.socket = guestd;
    o.program = "spin" + std::to_string(spin);
    o.spinMicros = spin;
    auto s = Session::open(o);
    ASSERT_TRUE(s) << s.error().message;
    std::string why;
    double err = checkedGemm(**s, 40, 24, 17, unsigned(spin) + 3, &why);
    EXPECT_TRUE(err >= 0 && err <= 1e-3) << "spin " << spin << ": " << why << " error " << err;
    for (int i = 0; i < 50; ++i) ASSERT_TRUE((*s)->fence()) << "spin " << spin;
  }
  client::Options o;
  o.socket = guestd;
  o.spinMicros = 1001;
  auto over = Session::open(o);
  ASSERT_FALSE(over);
  EXPECT_EQ(over.error().code, Code::invalidArgument);
  EXPECT_NE(over.error().message.find("spinMicros 1001"), std::string::npos) << over.error().message;
  o.spinMicros = -1;  // from the environment
  ::setenv("RACCEL_SPIN_US", "lots", 1);
  auto bad = Session::open(o);
  ::unsetenv("RACCEL_SPIN_US");
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error().code, Code::invalidArgument);
  EXPECT_NE(bad.error().message.find("RACCEL_SPIN_US = 'lots'"), std::string::npos) << bad.error().message;
  EXPECT_TRUE(open(guestd)) << "the setting's refusal left guestd serving";
}

TEST_F(Integration, CApiRunsOpsAndReportsErrors) {
  raccel_session* s = nullptr;
  char why[256] = "";
  ASSERT_EQ(raccel_open(cluster->vmSocket().c_str(), "c-program", 1, &s, why, sizeof why), RACCEL_OK) << why;
  float a[4] = {1, 2, 3, 4}, b[4] = {10, 20, 30, 40}, out[4] = {};
  raccel_handle ha = raccel_alloc(s, 16), hb = raccel_alloc(s, 16), ho = raccel_alloc(s, 16), hs = raccel_alloc(s, 4);
  raccel_write(s, ha, 0, a, 16);
  raccel_write(s, hb, 0, b, 16);
  raccel_vadd(s, 4, ha, hb, ho);
  raccel_reduce_sum(s, 4, ho, hs);
  ASSERT_EQ(raccel_read(s, ho, 0, out, 16), RACCEL_OK) << raccel_last_error(s);
  EXPECT_EQ(out[3], 44.0f);
  float sum = 0;
  ASSERT_EQ(raccel_read(s, hs, 0, &sum, 4), RACCEL_OK);
  EXPECT_EQ(sum, 110.0f);
  EXPECT_EQ(raccel_read(s, ha, 8, out, 16), RACCEL_E_INVALID_ARGUMENT);
  EXPECT_NE(std::string(raccel_last_error(s)).find("past the end"), std::string::npos);
  EXPECT_EQ(raccel_fence(s), RACCEL_OK);
  raccel_close(s);
  raccel_session* none = nullptr;
  EXPECT_EQ(raccel_open(cluster->vmSocket().c_str(), "greedy", 500, &none, why, sizeof why), RACCEL_E_RESOURCE_EXHAUSTED);
  EXPECT_NE(std::string(why).find("500"), std::string::npos) << why;
  EXPECT_NE(std::string(why).find("12"), std::string::npos) << why;
  EXPECT_EQ(none, nullptr);
}

TEST_F(Integration, ProgramCannotTouchAnotherProgramsBuffersByGuessingHandles) {
  auto owner = open(cluster->vmSocket(), 1, {}, "owner");
  auto thief = open(cluster->vmSocket(), 1, {}, "thief");
  ASSERT_TRUE(owner && thief);
  std::vector<float> secret = {3.25f, 1.5f, 2.75f, 9.0f};
  std::vector<client::Handle> handles;
  for (int i = 0; i < 4; ++i) {
    handles.push_back(owner->alloc(16));
    owner->writeFloats(handles.back(), secret);
  }
  ASSERT_TRUE(owner->fence());
  for (client::Handle h : handles) {
    std::vector<std::byte> out(16);
    auto r = thief->read(h, 0, out);
    ASSERT_FALSE(r) << "read of handle " << h << " succeeded";
    EXPECT_EQ(r.error().code, Code::notFound) << r.error().message;
    thief->forceNextHandle(0);
    thief->writeFloats(h, {0, 0, 0, 0});
    auto w = thief->fence();
    ASSERT_FALSE(w);
    EXPECT_EQ(w.error().code, Code::notFound);
    thief->free(h);
    auto f = thief->fence();
    ASSERT_FALSE(f);
    EXPECT_EQ(f.error().code, Code::notFound);
  }
  // The thief's own handle with the same number is its own buffer, not the owner's.
  thief->forceNextHandle(handles[0]);
  auto mine = thief->alloc(16);
  EXPECT_EQ(mine, handles[0]);
  auto zeros = thief->readFloats(mine, 4);
  ASSERT_TRUE(zeros);
  EXPECT_NE(*zeros, secret);
  for (client::Handle h : handles) {
    auto v = owner->readFloats(h, 4);
    ASSERT_TRUE(v) << v.error().message;
    EXPECT_EQ(*v, secret);
  }
}

TEST_F(Integration, BadInstructionsGetClearErrorsAndTheSessionCarriesOn) {
  auto s = open(cluster->vmSocket(), 1);
  auto bystander = open(cluster->vmSocket(), 1, {}, "bystander");
  ASSERT_TRUE(s && bystander);
  auto keep = bystander->alloc(64);
  bystander->fill(keep, 0, 64, 0x5a);

  // Zero-size alloc, then a write that depends on it.
  auto zero = s->alloc(0);
  s->writeFloats(zero, {1});
  auto e = s->fence();
  ASSERT_FALSE(e);
  EXPECT_EQ(e.error().code, Code::invalidArgument);
  EXPECT_NE(e.error().message.find("zero-size"), std::string::npos) << e.error().message;
  // The dependent write's failure names the alloc it depended on.
  std::vector<std::byte> out(4);
  auto dep = s->read(zero, 0, out);
  ASSERT_FALSE(dep);
  EXPECT_NE(dep.error().message.find("dependency failed"), std::string::npos) << dep.error().message;

  // Over the VM's quota (256 MiB), refused by the scheduler; dependents fail the same way.
  auto big = s->alloc(300ull << 20);
  s->fill(big, 0, 16, 1);
  auto q = s->fence();
  ASSERT_FALSE(q);
  EXPECT_EQ(q.error().code, Code::resourceExhausted);
  EXPECT_NE(q.error().message.find("quota"), std::string::npos) << q.error().message;
  auto qdep = s->read(big, 0, out);
  ASSERT_FALSE(qdep);
  EXPECT_NE(qdep.error().message.find("dependency failed"), std::string::npos) << qdep.error().message;

  // Read past a buffer's end.
  auto small = s->alloc(8);
  std::vector<std::byte> tooMuch(16);
  auto past = s->read(small, 0, tooMuch);
  ASSERT_FALSE(past);
  EXPECT_EQ(past.error().code, Code::invalidArgument);
  EXPECT_NE(past.error().message.find("past the end"), std::string::npos);

  // Launch of an unknown kernel.
  auto lib = s->loadProgram(ProgramKind::builtin, "raccel.builtins");
  s->launch(lib, "no_such_kernel", {1}, {1}, {client::Arg::buffer(small)});
  auto k = s->fence();
  ASSERT_FALSE(k);
  EXPECT_EQ(k.error().code, Code::notFound);
  EXPECT_NE(k.error().message.find("no_such_kernel"), std::string::npos);

  // A kind no card of the vaccel accepts.
  s->loadProgram(ProgramKind::ptx, "k", std::as_bytes(std::span("// ptx", 6)));
  auto ptx = s->fence();
  ASSERT_FALSE(ptx);
  EXPECT_EQ(ptx.error().code, Code::unimplemented);

  // The session still works, and so does everyone else.
  std::string why;
  EXPECT_GE(checkedGemm(*s, 8, 8, 8, 5, &why), 0) << why;
  auto v = bystander->read(keep, 0, out);
  ASSERT_TRUE(v);
  EXPECT_EQ(out[0], std::byte{0x5a});
}

// One buffer of a session holding vectors of n floats one after another (the fusion
// tests' setting): views of its parts, and elementwise ops over n of them.
struct Vectors {
  client::Handle h;
  uint64_t n;
  client::TensorOperand at(uint64_t part, uint64_t stride = 1) const { return client::TensorOperand{h, part * n, {stride}}; }
  client::TensorOp op(client::TensorFn fn, std::vector<client::TensorOperand> operands, float alpha = 1,
                      float beta = 0) const {
    return vectorOp(fn, n, std::move(operands), alpha, beta);
  }
};
Vectors vectors(client::Session& s, uint64_t n, const std::vector<float>& all) {
  auto h = s.alloc(all.size() * 4);
  s.writeFloats(h, all);
  return Vectors{h, n};
}

// Adam's step as raccel.torch sends it, nine elementwise ops over tensors that share one
// buffer: three fuse into the op before them (exp_avg.mul_(b1).add_(g), exp_avg_sq's
// mul_ and addcmul_, the denominator's / c then + eps), and the weight decay's
// param.mul_ waits past the other tensors' ops for param.addcdiv_ to fuse into it; every
// result is the step's.
// An op that reads the held affine's output other than as its first input alone (as its
// second, or as both) is not fused into it, and sees its result.
TEST_F(Integration, ElementwiseStepsFuseIntoOneOpWithTheSameResults) {
  auto s = open(cluster->vmSocket(), 1);
  ASSERT_TRUE(s);
  const uint64_t n = 1000;
  auto random = [](unsigned seed, float lo) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> d(lo, 1);
    std::vector<float> v(n);
    for (auto& x : v) x = d(rng);
    return v;
  };
  std::vector<float> p = random(1, -1), m = random(2, -1), v = random(3, 0), g = random(4, -1), all;
  for (auto* part : {&p, &m, &v, &g}) all.insert(all.end(), part->begin(), part->end());
  all.resize(6 * n);  // d and d2 after them
  const Vectors x = vectors(*s, n, all);
  const client::Handle h = x.h;
  const float lr = 1e-2f, wd = 1e-2f, b1 = 0.9f, b2 = 0.999f, c = 0.3f, eps = 1e-8f, step = 0.05f;
  using F = client::TensorFn;
  const uint64_t before = s->fusedTensorOps();
  s->tensor(x.op(F::affine, {x.at(0), x.at(0)}, 1 - lr * wd));
  s->tensor(x.op(F::affine, {x.at(1), x.at(1)}, b1));
  s->tensor(x.op(F::add, {x.at(1), x.at(1), x.at(3)}, 1 - b1));
  s->tensor(x.op(F::affine, {x.at(2), x.at(2)}, b2));
  s->tensor(x.op(F::addcmul, {x.at(2), x.at(2), x.at(3), x.at(3)}, 1 - b2));
  s->tensor(x.op(F::sqrt, {x.at(4), x.at(2)}));
  s->tensor(x.op(F::affine, {x.at(5), x.at(4)}, 1 / c));
  s->tensor(x.op(F::affine, {x.at(5), x.at(5)}, 1, eps));
  s->tensor(x.op(F::addcdiv, {x.at(0), x.at(0), x.at(1), x.at(5)}, -step));
  EXPECT_EQ(s->fusedTensorOps() - before, 4u);
  auto got = s->readFloats(h, 6 * n);
  ASSERT_TRUE(got) << got.error().message;
  for (uint64_t i = 0; i < n; ++i) {
    float wp = p[i] * (1 - lr * wd), wm = m[i] * b1 + (1 - b1) * g[i], wv = v[i] * b2 + (1 - b2) * g[i] * g[i];
    float d = std::sqrt(wv), d2 = d * (1 / c) + eps;
    wp = wp + -step * wm / d2;
    ASSERT_NEAR((*got)[i], wp, 1e-6f * std::max(1.0f, std::fabs(wp))) << i;  // (the card's division may differ by an ulp)
    ASSERT_NEAR((*got)[n + i], wm, 1e-6f) << i;
    ASSERT_NEAR((*got)[2 * n + i], wv, 1e-6f) << i;
    ASSERT_EQ((*got)[4 * n + i], d) << i;  // the sqrt's own output is still written
  }
  const uint64_t fusedBefore = s->fusedTensorOps();
  s->tensor(x.op(F::affine, {x.at(1), x.at(1)}, 2));
  s->tensor(x.op(F::add, {x.at(1), x.at(3), x.at(1)}));  // m = g + 2m: not fused
  s->tensor(x.op(F::affine, {x.at(1), x.at(1)}, 0.5f));  // an in-place scale of the add's result: fused
  s->tensor(x.op(F::affine, {x.at(1), x.at(1)}, 3));  // a second is not (0.5 * 3 would round otherwise)
  ASSERT_TRUE(s->flush());  // sends the held op
  s->tensor(x.op(F::affine, {x.at(1), x.at(1)}, 1.0f / 3));  // held: an affine
  s->tensor(x.op(F::add, {x.at(1), x.at(1), x.at(1)}));  // m = m + m: not fused into it
  auto after = s->readFloats(h, 2 * n);
  ASSERT_TRUE(after) << after.error().message;
  EXPECT_EQ(s->fusedTensorOps() - fusedBefore, 1u);
  for (uint64_t i = 0; i < n; ++i) {
    float want = (g[i] + (*got)[n + i] * 2) * 0.5f * 3 * (1.0f / 3);
    ASSERT_EQ((*after)[n + i], want + want) << i;  // exactly: each step's own rounding
  }
}

// Held elementwise ops keep the order the program gave wherever memory is shared: an op
// that reads what a held op writes, or writes what it reads, runs after it (and after
// the held ops that one must follow); one fused into an earlier held op stays behind the
// held ops whose results it reads; and ops on other memory pass a held one that waits
// for its fusion.
TEST_F(Integration, HeldStepsRunBeforeAnyOpThatTouchesTheirMemory) {
  auto s = open(cluster->vmSocket(), 1);
  ASSERT_TRUE(s);
  const uint64_t n = 100;
  std::vector<float> all(5 * n);
  for (uint64_t i = 0; i < all.size(); ++i) all[i] = float(i % 17) - 8.0f;
  const Vectors x = vectors(*s, n, all);
  const client::Handle h = x.h;
  using F = client::TensorFn;
  const uint64_t before = s->fusedTensorOps();
  s->tensor(x.op(F::affine, {x.at(1), x.at(1)}, 3));   // x1 = 3 x1: held
  s->tensor(x.op(F::affine, {x.at(0), x.at(0)}, 2));   // x0 = 2 x0: held beside it
  s->tensor(x.op(F::add, {x.at(1), x.at(1), x.at(0)}));  // x1 = x1 + x0: fuses into x1's, which waits past x0's
  auto sum = x.op(F::sum, {x.at(3, 0), x.at(1)});      // x3[0] = sum of x1: not a map, sent at once, after
  sum.reduceMask = 1;                            // x1's fused add and the x0 scale that add reads
  s->tensor(sum);
  s->tensor(x.op(F::affine, {x.at(2), x.at(2)}, 3));     // x2 = 3 x2: held
  s->tensor(x.op(F::affine, {x.at(0), x.at(0)}, 5));     // x0 = 5 x0: held beside it
  s->tensor(x.op(F::add, {x.at(2), x.at(2), x.at(0)}));    // x2 = x2 + x0: fuses into x2's, after x0's
  s->tensor(x.op(F::affine, {x.at(0), x.at(0)}, 7));     // x0 = 7 x0: x0's may not wait past that add: not fused
  s->tensor(x.op(F::affine, {x.at(4), x.at(2)}, 0.5f));  // x4 = x2 / 2: held, reads x2
  s->tensor(x.op(F::fill, {x.at(2)}, 9));              // x2 = 9: not a map, after x4's read
  auto got = s->readFloats(h, 5 * n);
  ASSERT_TRUE(got) << got.error().message;
  EXPECT_EQ(s->fusedTensorOps() - before, 2u);
  float total = 0;
  for (uint64_t i = 0; i < n; ++i) {
    const float x0 = all[i] * 2, x1 = all[n + i] * 3 + x0;
    total += x1;  // whole numbers: exact in any order
    ASSERT_EQ((*got)[i], x0 * 5 * 7) << i;
    ASSERT_EQ((*got)[n + i], x1) << i;
    ASSERT_EQ((*got)[2 * n + i], 9.0f) << i;
    if (i) {
      ASSERT_EQ((*got)[3 * n + i], all[3 * n + i]) << i;
    }
    ASSERT_EQ((*got)[4 * n + i], (all[2 * n + i] * 3 + x0 * 5) * 0.5f) << i;
  }
  EXPECT_EQ((*got)[3 * n], total);
}

// A fill (zero_grad's) is held until an op touches its memory: an add onto it in place
// goes as one affine of the addend with the same bits (a -0 addend onto a 0 fill still
// gives +0); an op that reads it (a map, held too, or a sum, sent at once), or an add
// that reads it twice, gets the fill first; a fill nothing touched is done before a read.
TEST_F(Integration, AHeldFillGoesBeforeWhatTouchesItAndAnAddOntoItIsOneAffine) {
  auto s = open(cluster->vmSocket(), 1);
  ASSERT_TRUE(s);
  const uint64_t n = 64;
  std::vector<float> all(7 * n);
  for (uint64_t i = 0; i < all.size(); ++i) all[i] = float(i % 13) - 6.0f;
  for (uint64_t i = 0; i < n; i += 8) all[3 * n + i] = -0.0f;
  const Vectors x = vectors(*s, n, all);
  const client::Handle h = x.h;
  using F = client::TensorFn;
  const uint64_t before = s->fusedTensorOps();
  s->tensor(x.op(F::fill, {x.at(0)}, 0));                 // x0 = 0: held
  s->tensor(x.op(F::fill, {x.at(1)}, 2));                 // x1 = 2: held
  s->tensor(x.op(F::fill, {x.at(2)}, 1));                 // x2 = 1: held
  s->tensor(x.op(F::fill, {x.at(5)}, 7));                 // x5 = 7: held, touched by nothing
  s->tensor(x.op(F::add, {x.at(0), x.at(0), x.at(3)}, 3));    // x0 = x0 + 3 x3: one affine, 3 x3 + 0
  s->tensor(x.op(F::copy, {x.at(4), x.at(1)}));             // x4 = x1: after x1's fill
  auto sum = x.op(F::sum, {x.at(6, 0), x.at(1)});           // x6[0] = sum of x1: after x1's fill
  sum.reduceMask = 1;
  s->tensor(sum);
  s->tensor(x.op(F::add, {x.at(2), x.at(2), x.at(2)}));       // x2 = x2 + x2: after x2's fill
  auto got = s->readFloats(h, 7 * n);
  ASSERT_TRUE(got) << got.error().message;
  EXPECT_EQ(s->fusedTensorOps() - before, 1u);
  for (uint64_t i = 0; i < n; ++i) {
    const float x0 = 0.0f + 3 * all[3 * n + i];
    ASSERT_EQ((*got)[i], x0) << i;
    ASSERT_EQ(std::signbit((*got)[i]), std::signbit(x0)) << i;
    ASSERT_EQ((*got)[n + i], 2.0f) << i;
    ASSERT_EQ((*got)[2 * n + i], 2.0f) << i;
    ASSERT_EQ((*got)[4 * n + i], 2.0f) << i;
    ASSERT_EQ((*got)[5 * n + i], 7.0f) << i;
  }
  EXPECT_EQ((*got)[6 * n], 2.0f * n);
  // An add of two operands (one short) onto a held fill is not fused: the card refuses
  // it, the fill still lands, and the session carries on.
  s->tensor(x.op(F::fill, {x.at(0)}, 4));
  s->tensor(x.op(F::add, {x.at(0), x.at(0)}));
  EXPECT_FALSE(s->fence());
  auto after = s->readFloats(h, n);
  ASSERT_TRUE(after) << after.error().message;
  EXPECT_EQ((*after)[0], 4.0f);
}

// A write goes after the held ops that touch its bytes and leaves the others held: a
// fill held past a write elsewhere in its buffer (a scalar operand, written each step)
// still takes the add onto it as one affine; a write over a held fill lands after it;
// freeing a buffer sends the held ops on it first.
TEST_F(Integration, AWriteSendsOnlyTheHeldOpsThatTouchItsBytes) {
  auto s = open(cluster->vmSocket(), 1);
  ASSERT_TRUE(s);
  const uint64_t n = 32;
  std::vector<float> all(4 * n);
  for (uint64_t i = 0; i < all.size(); ++i) all[i] = float(i % 7) - 3.0f;
  const Vectors x = vectors(*s, n, all);
  using F = client::TensorFn;
  const uint64_t before = s->fusedTensorOps();
  s->tensor(x.op(F::fill, {x.at(0)}, 0));                  // x0 = 0: held
  s->tensor(x.op(F::fill, {x.at(1)}, 5));                  // x1 = 5: held
  const std::vector<float> twos(n, 2.0f), nines(n, 9.0f);
  s->write(x.h, 3 * n * 4, std::as_bytes(std::span(twos)));   // x3 = 2: touches neither fill
  s->write(x.h, 1 * n * 4, std::as_bytes(std::span(nines)));  // x1 = 9: over x1's fill, after it
  s->tensor(x.op(F::add, {x.at(0), x.at(0), x.at(3)}, 3));  // x0 = 0 + 3 x3: one affine
  EXPECT_EQ(s->fusedTensorOps() - before, 1u);
  auto got = s->readFloats(x.h, 4 * n);
  ASSERT_TRUE(got) << got.error().message;
  for (uint64_t i = 0; i < n; ++i) {
    ASSERT_EQ((*got)[i], 6.0f) << i;
    ASSERT_EQ((*got)[n + i], 9.0f) << i;
    ASSERT_EQ((*got)[3 * n + i], 2.0f) << i;
  }
  // A held map on a second buffer, then that buffer freed: the map runs first (its
  // result copied out before the free), and the session carries on.
  const Vectors y = vectors(*s, n, all);
  s->tensor(y.op(F::affine, {y.at(0), y.at(0)}, 2));  // held
  s->tensor(x.op(F::copy, {x.at(2), client::TensorOperand{y.h, 0, {1}}}));  // reads it: not a fill's neighbour, sent
  s->free(y.h);
  auto copied = s->readFloats(x.h, 4 * n);
  ASSERT_TRUE(copied) << copied.error().message;
  for (uint64_t i = 0; i < n; ++i) ASSERT_EQ((*copied)[2 * n + i], all[i] * 2) << i;
  EXPECT_TRUE(s->fence());
}

TEST_F(Integration, MalformedFramesCloseOnlyTheirChannel) {
  auto bystander = open(cluster->vmSocket(), 1, {}, "bystander");
  ASSERT_TRUE(bystander);
  transport::BlockingLink raw;
  ASSERT_TRUE(raw.connectUnix(cluster->vmSocket()));

  // A hello on channel 5, then an unknown instruction (union tag 99) on it.
  capnp::MallocMessageBuilder hello;
  auto h = hello.initRoot<wire::Instruction>().initHello();
  h.setVersionMajor(wire::PROTOCOL_MAJOR);
  h.setProgram("raw");
  ASSERT_TRUE(raw.sendNow(5, 1, hello));
  auto welcome = raw.receive(10000);
  ASSERT_TRUE(welcome);
  capnp::MallocMessageBuilder fence;
  fence.initRoot<wire::Instruction>().setFence();
  auto bytes = rawFrame(5, 2, fence);
  bytes[transport::kHeaderBytes + 16] = std::byte{99};  // the union discriminant
  ASSERT_TRUE(raw.sendRaw(bytes.data(), bytes.size()));
  Error unknown = expectErrorReply(raw, 2);
  EXPECT_EQ(unknown.code, Code::invalidArgument) << unknown.message;
  EXPECT_NE(unknown.message.find("unknown instruction"), std::string::npos) << unknown.message;

  // Garbage where a message should be: error, then the channel is closed.
  std::vector<std::byte> garbage(transport::kHeaderBytes + 64, std::byte{0xff});
  transport::encodeHeader({5, 64, 3}, garbage.data());
  ASSERT_TRUE(raw.sendRaw(garbage.data(), garbage.size()));
  Error malformed = expectErrorReply(raw, 3);
  EXPECT_EQ(malformed.code, Code::invalidArgument) << malformed.message;
  EXPECT_NE(malformed.message.find("malformed"), std::string::npos) << malformed.message;

  // A frame over the limit on channel 6: error naming both sizes; its bytes are skipped
  // and the link goes on: a hello on channel 7 right behind it is welcomed.
  std::vector<std::byte> header(transport::kHeaderBytes);
  uint32_t huge = 5u << 20;
  transport::encodeHeader({6, huge, 9}, header.data());
  ASSERT_TRUE(raw.sendRaw(header.data(), header.size()));
  Error over = expectErrorReply(raw, 9);
  EXPECT_EQ(over.code, Code::invalidArgument);
  EXPECT_NE(over.message.find(std::to_string(huge)), std::string::npos) << over.message;
  EXPECT_NE(over.message.find("4194304"), std::string::npos) << over.message;
  std::vector<std::byte> junk(huge, std::byte{0});
  ASSERT_TRUE(raw.sendRaw(junk.data(), junk.size()));
  ASSERT_TRUE(raw.sendNow(7, 1, hello));
  bool welcomed = false;
  for (int i = 0; i < 10 && !welcomed; ++i) {
    auto f = raw.receive(10000);
    ASSERT_TRUE(f) << f.error().message;
    if (f->header.channel != 7) continue;
    transport::MessageIn in(std::move(f->body));
    welcomed = in.root<wire::Reply>().which() == wire::Reply::WELCOME;
  }
  EXPECT_TRUE(welcomed);

  // An unknown major protocol version is refused with both versions named.
  capnp::MallocMessageBuilder future;
  auto fh = future.initRoot<wire::Instruction>().initHello();
  fh.setVersionMajor(9);
  fh.setVersionMinor(4);
  ASSERT_TRUE(raw.sendNow(8, 1, future));
  Error version = expectErrorReply(raw, 1);
  EXPECT_EQ(version.code, Code::invalidArgument) << version.message;
  EXPECT_NE(version.message.find("9.4 is not supported"), std::string::npos) << version.message;
  EXPECT_NE(version.message.find("speaks 1.0"), std::string::npos) << version.message;

  // A truncated frame and a vanished peer: the scheduler keeps serving.
  {
    transport::BlockingLink cut;
    ASSERT_TRUE(cut.connectUnix(cluster->vmSocket()));
    auto frame = rawFrame(1, 1, hello);
    ASSERT_TRUE(cut.sendRaw(frame.data(), frame.size() / 2));
  }
  std::string why;
  EXPECT_GE(checkedGemm(*bystander, 16, 16, 16, 3, &why), 0) << why;
  EXPECT_TRUE(cluster->scheduler().running());
}

TEST_F(Integration, ProgramsOfALostNetaccelGetUnavailableOthersFinish) {
  // node0 has the only gpu card, node1 the only cpu card.
  auto doomed = open(cluster->vmSocket(), 2, {CardKind::gpu}, "doomed");
  auto survivor = open(cluster->vmSocket(), 2, {CardKind::cpu}, "survivor");
  ASSERT_TRUE(doomed && survivor);
  ASSERT_EQ(doomed->vaccel().cards.at(0).node, "node0");
  ASSERT_EQ(survivor->vaccel().cards.at(0).node, "node1");
  std::atomic<bool> stop{false};
  std::string survivorWhy;
  std::atomic<int> survivorRounds{0};
  std::thread other([&] {
    while (!stop && survivorRounds < 1000) {
      double err = checkedGemm(*survivor, 32, 32, 32, survivorRounds, &survivorWhy);
      if (err < 0 || err > 1e-3) return;
      ++survivorRounds;
    }
  });
  // The survivor is under way before anything happens to node0.
  for (int i = 0; i < 1000 && survivorRounds == 0 && survivorWhy.empty(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  // The doomed program streams work; the netaccel under it is killed mid-stream.
  auto x = doomed->alloc(1 << 20);
  doomed->fill(x, 0, 1 << 20, 1);
  ASSERT_TRUE(doomed->fence());
  Status last;
  bool killed = false;
  for (int i = 0; i < 2000 && last; ++i) {
    doomed->axpy(1 << 18, 1.0f, x, x);
    if (i == 20) {
      // kill -9: the process vanishes mid-work.
      killed = true;
      ::kill(node0, SIGKILL);
    }
    if (i % 10 == 9) last = doomed->fence();
  }
  ASSERT_TRUE(killed);
  ASSERT_FALSE(last) << "the doomed program never saw its card go";
  EXPECT_EQ(last.error().code, Code::unavailable) << last.error().message;
  EXPECT_NE(last.error().message.find("node0"), std::string::npos) << last.error().message;
  stop = true;
  other.join();
  EXPECT_EQ(survivorWhy, "");
  EXPECT_GT(survivorRounds, 0);
  std::string why;
  EXPECT_GE(checkedGemm(*survivor, 24, 24, 24, 77, &why), 0) << why;
  EXPECT_NE(cluster->console("nodes").find("\"online\":false"), std::string::npos);
  EXPECT_TRUE(cluster->scheduler().running());
}

TEST_F(Integration, AStrangerOnTheNodePortCannotAnswerForASession) {
  auto s = open(cluster->vmSocket(), 1, {}, "victim");
  ASSERT_TRUE(s);
  auto b = s->alloc(16);
  s->writeFloats(b, {1, 2, 3, 4});
  ASSERT_TRUE(s->fence());
  // An unregistered peer sends forged replies for every plausible context and sequence.
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(cluster->nodePort()));
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  std::vector<std::byte> forged;
  for (uint32_t ctx = 1; ctx <= 4; ++ctx)
    for (uint64_t seq = s->lastSequence() + 1; seq <= s->lastSequence() + 4; ++seq) {
      capnp::MallocMessageBuilder m;
      auto chunk = m.initRoot<wire::Reply>().initData();
      chunk.setLast(true);
      auto data = chunk.initData(16);
      std::memset(data.begin(), 0x66, 16);
      transport::appendFrame(forged, ctx, seq, m);
    }
  ASSERT_EQ(::write(fd, forged.data(), forged.size()), static_cast<ssize_t>(forged.size()));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  auto v = s->readFloats(b, 4);
  ::close(fd);
  ASSERT_TRUE(v) << v.error().message;
  EXPECT_EQ(*v, (std::vector<float>{1, 2, 3, 4}));
  EXPECT_TRUE(cluster->scheduler().running());
}

// Frozen (SIGSTOP), the netaccel holding the only gpu card is declared lost for want of
// heartbeats; its vaccel, which only that card could hold, waits for it (a delay, not an
// error). Woken, it finds its link closed, reconnects and rejoins; the vaccel is rebuilt
// there from its lineage and its program reads what it wrote.
TEST(Heartbeats, AFrozenNetaccelIsDeclaredLostAndItsVaccelWaitsForItToRejoin) {
  auto cluster = std::make_unique<Cluster>(std::vector<VmSpec>{VmSpec{"vm1", 16}});
  pid_t node0 = cluster->addNetaccel("node0", {"kind=gpu,tflops=6,memory=512MiB,threads=1"}, 6).pid();
  cluster->addNetaccel("node1", {"kind=cpu,tflops=6,memory=512MiB,threads=1"}, 6);
  auto s = open(cluster->vmSocket(), 2, {CardKind::gpu}, "frozen");
  ASSERT_TRUE(s);
  auto b = s->alloc(16);
  s->writeFloats(b, {1, 2, 3, 4});
  ASSERT_TRUE(s->fence());
  // Stopped, not dead: its TCP connection stays open, only the heartbeats stop.
  ::kill(node0, SIGSTOP);
  bool lost = waitFor([&] { return cluster->ctl({"events", "--recent"}).find("no heartbeat") != std::string::npos; }, 30000);
  std::string vaccels = cluster->console("vaccels");
  ::kill(node0, SIGCONT);
  ASSERT_TRUE(lost) << cluster->ctl({"events", "--recent"});
  EXPECT_NE(vaccels.find("recovering: netaccel 'node0' was lost (no heartbeat"), std::string::npos) << vaccels;
  auto r = s->readFloats(b, 4);
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(*r, (std::vector<float>{1, 2, 3, 4}));
  EXPECT_TRUE(waitFor([&] { return cluster->poolTotal() == 12; }, 10000)) << cluster->console("nodes");
  auto again = open(cluster->vmSocket(), 2, {CardKind::gpu}, "after");
  ASSERT_TRUE(again);
  std::string why;
  EXPECT_GE(checkedGemm(*again, 16, 16, 16, 9, &why), 0) << why;
}

TEST(ConsoleEvents, AdmissionsRefusalsReleasesAndNodesStreamInOrderAndLateSubscribersGetTheRecentOnes) {
  VmSpec vm;
  vm.tflops = 4;
  Cluster cluster({vm});
  std::string live = cluster.dir() + "/events-live.log";
  Process follower("raccelctl", {"--socket", cluster.consoleSocket(), "events", "--json", "--count", "5"}, live);
  // Programs go through raccel-guestd, so the VM is one link, as a real VM's port is.
  std::string guestd = cluster.startGuestd();
  cluster.addNetaccel("n1", {"kind=gpu,tflops=8,memory=1GiB"}, 8);
  {
    auto s = open(guestd, 2, {}, "evented");
    ASSERT_TRUE(s);
    ASSERT_TRUE(s->fence());
  }
  client::Options o;
  o.socket = guestd;
  o.tflops = 6;
  o.program = "greedy";
  EXPECT_FALSE(Session::open(o));
  EXPECT_EQ(follower.wait(15000), 0) << readFile(live) << cluster.logs();
  std::string events = readFile(live);
  size_t attached = events.find("\"kind\":\"vm-attached\",\"subject\":\"vm1\"");
  size_t joined = events.find("\"kind\":\"node-joined\",\"subject\":\"n1\"");
  size_t admitted = events.find("\"kind\":\"admitted\",\"subject\":\"vm1/evented#");
  size_t released = events.find("\"kind\":\"released\",\"subject\":\"vm1/evented#");
  size_t refused = events.find("\"kind\":\"refused\",\"subject\":\"vm1/greedy\"");
  ASSERT_NE(attached, std::string::npos) << events;
  ASSERT_NE(joined, std::string::npos) << events;
  ASSERT_NE(admitted, std::string::npos) << events;
  ASSERT_NE(released, std::string::npos) << events;
  ASSERT_NE(refused, std::string::npos) << events;
  EXPECT_LT(joined, admitted);
  EXPECT_LT(admitted, released);
  EXPECT_LT(released, refused);
  EXPECT_NE(events.find("vm 'vm1' may hold 4 blocks"), std::string::npos) << events;
  // A subscriber arriving now first gets what already happened.
  std::string late = cluster.dir() + "/events-late.log";
  Process latecomer("raccelctl", {"--socket", cluster.consoleSocket(), "events", "--count", "3"}, late);
  EXPECT_EQ(latecomer.wait(15000), 0) << readFile(late);
  EXPECT_NE(readFile(late).find("node-joined"), std::string::npos) << readFile(late);
}

// A program "early" of `tflops` on `socket` that checks one gemm: "" when exact, else why not.
std::string earlyProgram(const std::string& socket, double tflops) {
  client::Options o;
  o.socket = socket;
  o.program = "early";
  o.tflops = tflops;
  o.timeoutMs = 30000;
  auto s = Session::open(o);
  if (!s) return s.error().toString();
  std::string why = "did not finish";
  double err = checkedGemm(**s, 20, 20, 20, 4, &why);
  return err >= 0 && err < 1e-3 ? "" : why;
}

// Two programs of one VM through one raccel-guestd: a fence one issues while the other's
// 1 GiB write is on its way (past the first chunks) answers before that write does. The
// bulk bytes go in bounded chunks each hop passes on in turn, so a big transfer never
// holds back another program's small instruction.
TEST(Lanes, AFenceBehindAnotherProgramsGibibyteWriteOfTheSameVmAnswersFirst) {
  VmSpec vm;
  vm.memoryQuota = "2GiB";
  vm.tflops = 4;
  Cluster cluster({vm});
  cluster.addNetaccel("node0", {"kind=cpu,tflops=4,memory=2GiB,threads=1"}, 4);
  const std::string guestd = cluster.startGuestd();
  auto writer = open(guestd, 2, {}, "writer");
  auto fencer = open(guestd, 2, {}, "fencer");
  ASSERT_TRUE(writer && fencer);
  constexpr size_t kBytes = size_t{1} << 30;
  const client::Handle big = writer->alloc(kBytes);
  ASSERT_TRUE(writer->fence());
  std::vector<std::byte> data(kBytes);
  for (size_t i = 0; i < kBytes; i += 4096) data[i] = std::byte(i >> 12);
  data[kBytes - 1] = std::byte{0x5a};
  std::atomic<bool> written{false};
  std::string writeError;
  std::thread bulk([&] {
    writer->write(big, 0, data);
    auto done = writer->fence();
    if (!done) writeError = done.error().toString();
    written = true;
  });
  // The write is on its way once the scheduler has taken some of its chunks.
  auto instructions = [&](const std::string& program) {
    auto v = nlohmann::json::parse(cluster.console("vaccels"), nullptr, false);
    if (v.is_discarded() || !v.contains("vaccels")) return uint64_t{0};
    for (auto& e : v["vaccels"])
      if (e.value("program", "") == program) return e.value("instructions", uint64_t{0});
    return uint64_t{0};
  };
  ASSERT_TRUE(waitFor([&] { return instructions("writer") >= 8 || written; }, 60000)) << cluster.logs();
  const bool midway = !written;
  auto fenced = fencer->fence();
  const bool fenceFirst = !written;
  bulk.join();
  ASSERT_TRUE(fenced) << fenced.error().message;
  ASSERT_EQ(writeError, "");
  ASSERT_TRUE(midway) << "the write ended before the fence could be issued behind it";
  EXPECT_TRUE(fenceFirst) << "the fence waited for the other program's whole write";
  std::vector<std::byte> tail(1);
  ASSERT_TRUE(writer->read(big, kBytes - 1, tail));
  EXPECT_EQ(tail[0], std::byte{0x5a});
}

// After a burst through the node link, the first quiet period gives the free heap back
// in both daemons: the call sites of FreeMemoryAfterBursts (whose rules common_test
// checks), the scheduler's at its links' trim and the netaccel's at its first link's
// heartbeat, each logging it at debug level. No same-host lane: the bytes cross the link.
TEST(FreeMemory, BothDaemonsGiveTheirHeapBackOnceTheLinksGoQuietAfterABurst) {
  Cluster cluster({VmSpec{}}, "", {"--log-level", "debug"});
  auto& node = cluster.addNetaccel("node0", {"kind=cpu,tflops=4,memory=256MiB,threads=1"}, 4,
                                   {"--log-level", "debug", "--no-same-host-lane"});
  auto s = open(cluster.startGuestd(), 2, {}, "burst");
  ASSERT_TRUE(s);
  constexpr size_t kBytes = size_t{16} << 20;  // 16 times FreeMemoryAfterBursts::kBusyBytes
  const client::Handle h = s->alloc(kBytes);
  std::vector<std::byte> data(kBytes, std::byte{0x5a}), back(kBytes);
  s->write(h, 0, data);
  ASSERT_TRUE(s->read(h, 0, back));
  ASSERT_EQ(back, data);
  auto logged = [](const Process& p, const std::string& what) {
    std::ifstream in(p.log());
    std::stringstream all;
    all << in.rdbuf();
    return all.str().find(what) != std::string::npos;
  };
  EXPECT_TRUE(waitFor([&] { return logged(cluster.scheduler(), "the node links went quiet: free memory given back"); }, 30000))
      << cluster.logs();
  EXPECT_TRUE(waitFor([&] { return logged(node, "the links went quiet: free memory given back"); }, 30000)) << cluster.logs();
}

// A netaccel on the scheduler's host takes the same-host lane by default; one started
// with --no-same-host-lane keeps to its link, and so does every netaccel of a scheduler
// with --lane-socket off. Big writes and reads come back exact either way.
TEST(SameHostLanes, OfferedByDefaultAndEitherSideCanDecline) {
  auto roundTrip = [](Session& s, unsigned seed) {
    auto values = randomFloats(2 << 20, seed);  // 8 MiB: eight 1 MiB frames each way
    auto h = s.alloc(values.size() * 4);
    s.writeFloats(h, values);
    auto back = s.readFloats(h, values.size());
    return back && *back == values;
  };
  {
    Cluster cluster({VmSpec{"vm1", 8}});
    cluster.addNetaccel("laned", {"kind=gpu,model=sim,tflops=4,memory=256MiB"}, 4);
    cluster.addNetaccel("declines", {"kind=npu,model=sim,tflops=4,memory=256MiB"}, 4, {"--no-same-host-lane"});
    auto a = open(cluster.vmSocket(), 4, {CardKind::gpu}, "a");
    auto b = open(cluster.vmSocket(), 4, {CardKind::npu}, "b");
    ASSERT_TRUE(a && b);
    EXPECT_TRUE(roundTrip(*a, 1));
    EXPECT_TRUE(roundTrip(*b, 2));
    const std::string log = readFile(cluster.dir() + "/scheduler.log");
    EXPECT_NE(log.find("'laned' shares a same-host lane"), std::string::npos) << log;
    EXPECT_EQ(log.find("'declines' shares"), std::string::npos) << log;
  }
  {
    Cluster cluster({VmSpec{"vm1", 8}}, "", {"--lane-socket", "off"});
    cluster.addNetaccel("node0", {"kind=gpu,model=sim,tflops=4,memory=256MiB"}, 4);
    auto a = open(cluster.vmSocket(), 4, {}, "a");
    ASSERT_TRUE(a);
    EXPECT_TRUE(roundTrip(*a, 3));
    EXPECT_FALSE(std::filesystem::exists(cluster.dir() + "/lanes.sock"));
    EXPECT_EQ(readFile(cluster.dir() + "/scheduler.log").find("same-host lane"), std::string::npos);
  }
}

// Node links whose cipher work runs on a thread of each link's own (tls_crypto_thread =
// on; auto chooses it with 4 cores or more): the scheduler with it, one netaccel with it
// and one without (each side's choice is its own). Big writes and reads and a run of
// small ops cross both links exact; the netaccel that asked for the thread runs one more.
TEST(TlsCryptoThreads, NodeLinksWithThemCarryBigAndSmallFramesExactly) {
  Cluster cluster({VmSpec{"vm1", 8}}, "", {"--lane-socket", "off", "--tls-crypto-thread", "on"});
  const pid_t threaded = cluster.addNetaccel("threaded", {"kind=gpu,model=sim,tflops=4,memory=256MiB"}, 4,
                                             {"--tls-crypto-thread", "on"}).pid();
  const pid_t plain = cluster.addNetaccel("inline", {"kind=npu,model=sim,tflops=4,memory=256MiB"}, 4,
                                          {"--tls-crypto-thread", "off"}).pid();
  auto a = open(cluster.vmSocket(), 4, {CardKind::gpu}, "a");
  auto b = open(cluster.vmSocket(), 4, {CardKind::npu}, "b");
  ASSERT_TRUE(a && b);
  unsigned seed = 1;
  for (Session* s : {&*a, &*b}) {
    auto values = randomFloats(4 << 20, seed++);  // 16 MiB each way
    auto h = s->alloc(values.size() * 4);
    s->writeFloats(h, values);
    auto back = s->readFloats(h, values.size());
    ASSERT_TRUE(back);
    EXPECT_TRUE(*back == values);
    auto small = s->alloc(4096);
    for (int i = 0; i < 200; ++i) s->fill(small, 0, 4096, static_cast<uint8_t>(i));
    std::vector<std::byte> last(4096);
    ASSERT_TRUE(s->read(small, 0, last));
    EXPECT_EQ(last[4095], std::byte{199});
  }
  auto threads = [](pid_t pid) {
    size_t n = 0;
    for ([[maybe_unused]] auto& e : std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/task")) ++n;
    return n;
  };
  EXPECT_GT(threads(threaded), threads(plain)) << cluster.logs();
  // Each daemon says so once when it starts, the one without it nothing.
  const std::string said = "cipher work on a thread of its own";
  EXPECT_NE(readFile(cluster.dir() + "/scheduler.log").find(said), std::string::npos) << cluster.logs();
  EXPECT_NE(readFile(cluster.dir() + "/netaccel-threaded.log").find(said), std::string::npos) << cluster.logs();
  EXPECT_EQ(readFile(cluster.dir() + "/netaccel-inline.log").find(said), std::string::npos) << cluster.logs();
  // Idle now, each link gives back the buffers its 16 MiB bursts left it (the scheduler
  // trims its node links every second), the threaded link's spares and the other's
  // ciphertext buffers alike.
  std::string metrics;
  auto retained = [&](const char* node) {
    std::smatch m;
    const std::regex sample(std::string(R"(raccel_node_link_retained_bytes\{node=")") + node + R"("\} (\d+))");
    return std::regex_search(metrics, m, sample) ? std::stoull(m[1]) : ~0ull;
  };
  EXPECT_TRUE(waitFor([&] {
    metrics = rawhttp::roundTrip(cluster.httpPort(), "GET /metrics HTTP/1.0\r\n\r\n");
    return retained("threaded") == 0 && retained("inline") == 0;
  }, 20000)) << metrics;
}

// A scheduler that has just started has not heard from its netaccels yet: a program
// that arrives first waits for them (startup_grace_ms), it is not told "never". One that
// the settled pool still cannot hold is refused then, naming both numbers.
TEST(Admission, AProgramArrivingBeforeAnyNetaccelWaitsForThePoolToSettle) {
  // The grace ends when the netaccel joins; its ceiling is set past anything this test
  // waits for, so that a busy machine's slow start cannot end it first.
  Cluster cluster({VmSpec{}}, "", {"--set", "startup_grace_ms=600000"});
  for (int i = 0; i < 500 && !std::filesystem::exists(cluster.vmSocket()); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  std::string why;
  std::thread program([&] { why = earlyProgram(cluster.vmSocket(), 2); });
  cluster.waitConsole("vaccels", [](auto& j) { return j.find("\"program\":\"early\"") != std::string::npos; });
  cluster.addNetaccel("late", {"kind=cpu,tflops=2,threads=1"}, 2);
  program.join();
  EXPECT_EQ(why, "") << cluster.logs();
  client::Options o;
  o.socket = cluster.vmSocket();
  o.program = "huge";
  o.tflops = 3;
  auto refused = Session::open(o);
  ASSERT_FALSE(refused);
  EXPECT_NE(refused.error().message.find("can never run here: 3 blocks requested, the pool has 2"), std::string::npos)
      << refused.error().message;
}

// A restarted scheduler knows its netaccels from its state database before they call
// back, so with no startup grace at all a program that comes first is told "not now" and
// waits; it runs once its netaccel rejoins. "Never" is kept for what even the known pool
// could not hold.
TEST(Admission, AfterARestartAProgramBeforeItsNetaccelWaitsThenRuns) {
  Cluster cluster({VmSpec{"vm1", 8, 0}}, "", {"--set", "startup_grace_ms=0"});
  const pid_t node = cluster.addNetaccel("node0", {"kind=cpu,tflops=4,memory=512MiB,threads=1"}, 4).pid();
  ::kill(node, SIGKILL);
  cluster.waitConsole("nodes", [](auto& j) { return j.find("\"state\":\"offline\"") != std::string::npos; });
  cluster.restartScheduler(false);
  std::string nodes = cluster.waitConsole("nodes", [](auto& j) { return j.find("node0") != std::string::npos; });
  ASSERT_NE(nodes.find("\"state\":\"offline\""), std::string::npos) << nodes << cluster.logs();

  client::Options o;
  o.socket = cluster.vmSocket();
  o.program = "huge";
  o.tflops = 5;
  auto refused = Session::open(o);
  ASSERT_FALSE(refused);
  EXPECT_NE(refused.error().message.find("can never run here: 5 blocks requested, the pool has 4"), std::string::npos)
      << refused.error().message;

  std::string why = "did not run";
  std::thread program([&] { why = earlyProgram(cluster.vmSocket(), 2); });
  std::string waiting = cluster.waitConsole("vaccels", [](auto& j) { return j.find("\"program\":\"early\"") != std::string::npos; });
  EXPECT_NE(waiting.find("\"state\":\"waiting\""), std::string::npos) << waiting;
  cluster.addNetaccel("node0", {"kind=cpu,tflops=4,memory=512MiB,threads=1"}, 0);
  program.join();
  EXPECT_EQ(why, "") << cluster.logs();
  std::string events = cluster.ctl({"events", "--recent"});
  EXPECT_EQ(events.find("early refused"), std::string::npos) << events;
}

// A program that waits for a netaccel expected back is refused, saying so, once that
// netaccel is forgotten (forget_offline_ms): the wait is bounded by what the pool counts.
TEST(Admission, AWaitForAnOfflineNetaccelEndsWhenItIsForgotten) {
  Cluster cluster({VmSpec{"vm1", 8, 0}}, "", {"--set", "startup_grace_ms=0", "--set", "forget_offline_ms=3000"});
  const pid_t node = cluster.addNetaccel("node0", {"kind=cpu,tflops=4,memory=512MiB,threads=1"}, 4).pid();
  ::kill(node, SIGKILL);
  cluster.waitConsole("nodes", [](auto& j) { return j.find("\"state\":\"offline\"") != std::string::npos; });
  std::string why = "did not run";
  std::thread program([&] { why = earlyProgram(cluster.vmSocket(), 2); });
  std::string waiting = cluster.waitConsole("vaccels", [](auto& j) { return j.find("\"program\":\"early\"") != std::string::npos; });
  EXPECT_NE(waiting.find("\"state\":\"waiting\""), std::string::npos) << waiting;
  program.join();
  EXPECT_NE(why.find("can never run here: 2 blocks requested, the pool has 0"), std::string::npos) << why;
  std::string events = cluster.ctl({"events", "--recent"});
  const size_t forgotten = events.find("node-forgotten");
  ASSERT_NE(forgotten, std::string::npos) << events;
  EXPECT_NE(events.find("vm1/early", forgotten), std::string::npos) << "refused after the netaccel was forgotten: " << events;
}

TEST(GuestdWithoutHost, ProgramStartedBeforeTheSchedulerWaitsThenSucceeds) {
  std::string dir = makeTempDir();
  std::string guestdSocket = dir + "/guestd.sock";
  Process guestd("raccel-guestd", {"--port", dir + "/vm1.sock", "--listen", guestdSocket}, dir + "/guestd.log");
  ASSERT_TRUE(waitFor([&] { return acceptsConnections(guestdSocket); }, 20000)) << readFile(dir + "/guestd.log");
  std::string why;
  std::thread program([&] { why = earlyProgram(guestdSocket, 1); });
  // The host side appears a second later.
  std::this_thread::sleep_for(std::chrono::milliseconds(1000));
  Cluster cluster({VmSpec{}}, dir);
  cluster.addNetaccel("late", {"kind=cpu,tflops=2,threads=1"}, 2);
  program.join();
  EXPECT_EQ(why, "") << cluster.logs();
}

// raccel-guestd stops reading a program that has sent four times --replay-bytes its
// vaccel has not acknowledged (here its netaccel is stopped, so nothing is). A program
// that hangs up then sends nothing guestd could read an end of stream from; guestd still
// notices (its reaper, every second) and ends the session: the vaccel and its blocks are
// released while the netaccel is still stopped.
TEST(GuestdReaper, AProgramThatHangsUpWhileItsReadingWaitsIsReaped) {
  Cluster cluster;
  const pid_t node = cluster.addNetaccel("node0", {"kind=cpu,tflops=2,memory=512MiB,threads=1"}, 2).pid();
  std::string guestd = cluster.startGuestd("vm1", {"--replay-bytes", "256KiB", "--log-level", "debug"});
  ::kill(node, SIGSTOP);
  Process program("raccel-run", {"--socket", guestd, "--size", "1024", "--iterations", "1", "--name", "paused"},
                  cluster.dir() + "/paused.log");
  const std::string guestdLog = cluster.dir() + "/guestd-vm1.log";
  auto waitUntil = [](const std::function<bool()>& ready, int ms) {
    for (int i = 0; i < ms / 20 && !ready(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    return ready();
  };
  bool paused = waitUntil([&] { return readFile(guestdLog).find("its program's reading waits") != std::string::npos; }, 60000);
  ASSERT_TRUE(paused) << cluster.logs();
  cluster.waitConsole("vaccels", [](auto& j) { return j.find("\"program\":\"paused\"") != std::string::npos; });
  program.kill(SIGKILL);
  program.wait(10000);
  std::string after = cluster.waitConsole("vaccels", [](auto& j) { return j.find("\"program\":\"paused\"") == std::string::npos; });
  EXPECT_EQ(after.find("\"program\":\"paused\""), std::string::npos) << after << cluster.logs();
  EXPECT_NE(readFile(guestdLog).find("a program hung up while it waited"), std::string::npos) << cluster.logs();
  ::kill(node, SIGCONT);
}

}  // namespace
}  // namespace raccel::testing
