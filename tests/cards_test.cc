// Real cards end to end: OpenCL C through the scheduler onto PoCL, program routing by
// kind across a vaccel's cards, and built-in ops split over three cards on two
// netaccels (PoCL, a cpu card and a simulated gpu). Real processes throughout.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <thread>

#include "hal/backends.h"
#include "tests/cluster.h"
#include "vmfrontend/raccel.h"

namespace raccel::testing {
namespace {

using client::Arg;
using client::Session;

const char* kScale =
    "__kernel void scale(float s, __global float* x, uint n) {\n"
    "  uint i = get_global_id(0);\n"
    "  if (i < n) x[i] = x[i] * s + (float)i;\n"
    "}\n";

std::unique_ptr<Session> open(Cluster& c, double tflops, const std::string& name) {
  client::Options o;
  o.socket = c.vmSocket();
  o.tflops = tflops;
  o.program = name;
  o.timeoutMs = 60000;
  auto s = Session::open(o);
  EXPECT_TRUE(s) << s.error().message << "\n" << c.logs();
  return s ? std::move(*s) : nullptr;
}

bool haveOpencl() { return !hal::discover("opencl").devices.empty(); }

// node0: a simulated gpu (3 blocks) and the OpenCL device declared an npu (2 blocks); node1: a cpu card
// (2 blocks). A 7-TFLOPS vaccel spans all three, its primary the simulated gpu.
class Cards : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!haveOpencl()) GTEST_SKIP() << "no OpenCL device: " << hal::discover("opencl").note;
    // Split every op, however small, so small inputs exercise the splitting.
    cluster = std::make_unique<Cluster>(std::vector<VmSpec>{VmSpec{}}, "", std::vector<std::string>{"--split-min-mflop", "0"});
    cluster->addNetaccel("node0", {"kind=gpu,tflops=3,memory=256MiB,threads=1", "backend=opencl,kind=npu,tflops=2,memory=256MiB"}, 5);
    cluster->addNetaccel("node1", {"kind=cpu,tflops=2,memory=256MiB,threads=1"}, 2);
  }
  std::unique_ptr<Cluster> cluster;
};

// Runs the `scale` kernel on a vaccel and checks it; returns the buffer.
client::Handle runScale(Session& s, Cluster& cluster, uint32_t n) {
  std::vector<float> x(n);
  for (uint32_t i = 0; i < n; ++i) x[i] = 0.5f * i;
  auto hx = s.alloc(n * 4);
  s.writeFloats(hx, x);
  auto program = s.loadProgram(ProgramKind::openclC, "scale", std::as_bytes(std::span(kScale, std::strlen(kScale))));
  s.launch(program, "scale", {(n + 127) / 128, 1, 1}, {128, 1, 1}, {Arg::f32(2.0f), Arg::buffer(hx), Arg::u32(n)});
  auto got = s.readFloats(hx, n);
  EXPECT_TRUE(got) << got.error().message << "\n" << cluster.logs();
  if (got)
    for (uint32_t i = 0; i < n; ++i)
      if ((*got)[i] != x[i] * 2.0f + float(i)) {
        ADD_FAILURE() << "element " << i << ": " << (*got)[i] << ", want " << x[i] * 2.0f + float(i);
        break;
      }
  return hx;
}

// A kernel with a syntax error: invalidArgument carrying the build log; the launch
// that uses it fails as a dependency and the session carries on.
void expectBuildErrorWithLog(Session& s, client::Handle hx) {
  auto h = s.alloc(64);
  std::string broken = "__kernel void scale(__global float* x) { x[0] = undeclared_thing; }";
  auto bad = s.loadProgram(ProgramKind::openclC, "broken", std::as_bytes(std::span(broken)));
  s.launch(bad, "scale", {1, 1, 1}, {1, 1, 1}, {Arg::buffer(h)});
  auto status = s.fence();
  ASSERT_FALSE(status);
  EXPECT_EQ(status.error().code, Code::invalidArgument) << status.error().message;
  EXPECT_NE(status.error().message.find("Build log"), std::string::npos) << status.error().message;
  EXPECT_NE(status.error().message.find("undeclared_thing"), std::string::npos) << status.error().message;
  auto launched = s.fence();  // the launch's own error, if not already folded into the first
  if (!launched) {
    EXPECT_NE(launched.error().message.find("dependency failed"), std::string::npos) << launched.error().message;
  }
  auto again = s.readFloats(hx, 2);
  ASSERT_TRUE(again) << again.error().message;
  EXPECT_EQ((*again)[1], 0.5f * 2.0f + 1.0f);
}

TEST_F(Cards, OpenclSourceRunsOnPoclAndBuildErrorsComeBackWithTheLog) {
  // A vaccel on the OpenCL device alone (it is the only npu): the primary runs it.
  client::Options o;
  o.socket = cluster->vmSocket();
  o.tflops = 2;
  o.kinds = {CardKind::npu};
  o.program = "opencl";
  auto direct = Session::open(o);
  ASSERT_TRUE(direct) << direct.error().message;
  ASSERT_EQ((*direct)->vaccel().cards.size(), 1u);
  EXPECT_EQ((*direct)->vaccel().cards[0].kind, CardKind::npu);
  auto hx = runScale(**direct, *cluster, 5000);
  expectBuildErrorWithLog(**direct, hx);
  direct->reset();

  // A vaccel over the simulated gpu (primary, runs no OpenCL) and the OpenCL card: the
  // program is routed to the OpenCL card, its buffer copied there and back.
  auto all = open(*cluster, 5, "all");
  ASSERT_TRUE(all);
  ASSERT_EQ(all->vaccel().cards.size(), 2u) << all->vaccel().describe();
  hx = runScale(*all, *cluster, 5000);
  EXPECT_NE(cluster->console("vaccels").find("\"bytesMoved\":40000"), std::string::npos) << cluster->console("vaccels");
  expectBuildErrorWithLog(*all, hx);
}

TEST_F(Cards, AProgramKindNoCardRunsIsRefusedNamingTheKindsThereAre) {
  auto s = open(*cluster, 3, "gpu-only");  // the simulated gpu: builtin only
  ASSERT_TRUE(s);
  std::string ptx = ".version 8.0\n.target sm_80\n";
  auto p = s->loadProgram(ProgramKind::ptx, "k", std::as_bytes(std::span(ptx)));
  auto h = s->alloc(16);
  s->launch(p, "k", {1, 1, 1}, {1, 1, 1}, {Arg::buffer(h)});
  auto status = s->fence();
  ASSERT_FALSE(status);
  EXPECT_EQ(status.error().code, Code::unimplemented);
  EXPECT_NE(status.error().message.find("ptx"), std::string::npos) << status.error().message;
  EXPECT_NE(status.error().message.find("gpu (cpu, 3 blocks)"), std::string::npos) << status.error().message;
  auto ok = s->readFloats(h, 4);  // still usable
  EXPECT_TRUE(ok);
}

// Reference for c = alpha * a b + beta * c.
std::vector<float> gemmRef(uint32_t m, uint32_t n, uint32_t k, float alpha, const std::vector<float>& a,
                           const std::vector<float>& b, float beta, const std::vector<float>& c) {
  std::vector<float> out(size_t{m} * n);
  for (uint32_t i = 0; i < m; ++i)
    for (uint32_t j = 0; j < n; ++j) {
      double acc = 0;
      for (uint32_t p = 0; p < k; ++p) acc += double(a[size_t{i} * k + p]) * b[size_t{p} * n + j];
      out[size_t{i} * n + j] = float(alpha * acc + beta * c[size_t{i} * n + j]);
    }
  return out;
}

void expectNear(const std::vector<float>& got, const std::vector<float>& want, double tolerance, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], tolerance) << what << " at " << i;
}

uint64_t bytesMoved(Cluster& c) {
  auto json = c.console("vaccels");
  auto at = json.find("\"bytesMoved\":");
  return at == std::string::npos ? 0 : std::stoull(json.substr(at + 13));
}

TEST_F(Cards, GemmSplitOverThreeCardsOnTwoNetaccelsMatchesOneCard) {
  auto wide = open(*cluster, 7, "wide");
  ASSERT_TRUE(wide);
  ASSERT_EQ(wide->vaccel().cards.size(), 3u) << wide->vaccel().describe();
  const uint32_t m = 101, n = 67, k = 129;
  auto a = randomFloats(size_t{m} * k, 1), b = randomFloats(size_t{k} * n, 2), c0 = randomFloats(size_t{m} * n, 3);
  auto ha = wide->alloc(a.size() * 4), hb = wide->alloc(b.size() * 4), hc = wide->alloc(c0.size() * 4);
  wide->writeFloats(ha, a);
  wide->writeFloats(hb, b);
  wide->writeFloats(hc, c0);
  wide->gemm(m, n, k, 1.5f, ha, hb, 0.5f, hc);  // beta != 0: each card needs its rows of c
  auto split = wide->readFloats(hc, c0.size());
  ASSERT_TRUE(split) << split.error().message << "\n" << cluster->logs();
  auto want = gemmRef(m, n, k, 1.5f, a, b, 0.5f, c0);
  expectNear(*split, want, 1e-3, "split gemm");
  // It was split: the two other cards got their rows of a and c, all of b, and sent
  // their rows of c back.
  uint64_t moved = bytesMoved(*cluster);
  EXPECT_GT(moved, 2ull * k * n * 4) << cluster->console("vaccels");

  // The same on one card.
  wide.reset();
  auto narrow = open(*cluster, 2, "narrow");
  ASSERT_TRUE(narrow);
  ASSERT_EQ(narrow->vaccel().cards.size(), 1u);
  auto na = narrow->alloc(a.size() * 4), nb = narrow->alloc(b.size() * 4), nc = narrow->alloc(c0.size() * 4);
  narrow->writeFloats(na, a);
  narrow->writeFloats(nb, b);
  narrow->writeFloats(nc, c0);
  narrow->gemm(m, n, k, 1.5f, na, nb, 0.5f, nc);
  auto single = narrow->readFloats(nc, c0.size());
  ASSERT_TRUE(single) << single.error().message;
  expectNear(*split, *single, 1e-3, "split vs one card");
}

// A kernel's time by the card's clock reaches the program even when a fence of the
// scheduler's own collected it: here the fence that ends a gemm split over the OpenCL
// card (the primary) and the cpu card, sent after the kernel and before the program's.
TEST_F(Cards, AKernelsCardTimeReachesTheProgramWhenTheSchedulersFenceCollectsIt) {
  client::Options o;
  o.socket = cluster->vmSocket();
  o.tflops = 4;
  o.kinds = {CardKind::npu, CardKind::cpu};
  o.program = "times";
  auto opened = Session::open(o);
  ASSERT_TRUE(opened) << opened.error().message;
  Session& s = **opened;
  ASSERT_EQ(s.vaccel().cards.size(), 2u) << s.vaccel().describe();
  ASSERT_EQ(s.vaccel().cards[0].kind, CardKind::npu);
  const uint32_t n = 1 << 16;
  auto hx = s.alloc(n * 4);
  auto program = s.loadProgram(ProgramKind::openclC, "scale", std::as_bytes(std::span(kScale, std::strlen(kScale))));
  s.launch(program, "scale", {n / 128, 1, 1}, {128, 1, 1}, {Arg::f32(2.0f), Arg::buffer(hx), Arg::u32(n)});
  const uint64_t launched = s.lastSequence();
  auto a = s.alloc(64 * 64 * 4), c = s.alloc(64 * 64 * 4);
  s.gemm(64, 64, 64, 1.0f, a, a, 0.0f, c);  // split over both cards (--split-min-mflop 0)
  ASSERT_TRUE(s.fence()) << cluster->logs();
  EXPECT_GT(bytesMoved(*cluster), 0u) << "the gemm was not split: " << cluster->console("vaccels");
  auto ns = s.takeKernelNs(launched);
  ASSERT_TRUE(ns) << "no card time for the kernel";
  EXPECT_GT(*ns, 0u);
}

TEST_F(Cards, SplitOpsStayRightAsTheirInputsChange) {
  auto s = open(*cluster, 7, "ops");
  ASSERT_TRUE(s);
  ASSERT_EQ(s->vaccel().cards.size(), 3u);
  const uint32_t m = 64, n = 48, k = 40;
  auto a = randomFloats(size_t{m} * k, 4), b = randomFloats(size_t{k} * n, 5);
  auto ha = s->alloc(a.size() * 4), hb = s->alloc(b.size() * 4), hc = s->alloc(size_t{m} * n * 4);
  s->writeFloats(ha, a);
  s->writeFloats(hb, b);
  std::vector<float> zero(size_t{m} * n, 0.0f);
  // Three rounds; between them the guest changes a (write) and b (a kernel-free copy),
  // so cached copies on the other cards must not be used stale.
  for (int round = 0; round < 3; ++round) {
    s->gemm(m, n, k, 1.0f, ha, hb, 0.0f, hc);
    auto got = s->readFloats(hc, size_t{m} * n);
    ASSERT_TRUE(got) << got.error().message << "\n" << cluster->logs();
    expectNear(*got, gemmRef(m, n, k, 1.0f, a, b, 0.0f, zero), 1e-3, "gemm round");
    a = randomFloats(a.size(), 10 + round);
    s->writeFloats(ha, a);
    auto hb2 = s->alloc(b.size() * 4);
    b = randomFloats(b.size(), 20 + round);
    s->writeFloats(hb2, b);
    s->copy(hb, 0, hb2, 0, b.size() * 4);
    s->free(hb2);
  }

  const uint64_t len = 100003;
  auto x = randomFloats(len, 6), y = randomFloats(len, 7);
  auto hx = s->alloc(len * 4), hy = s->alloc(len * 4), hout = s->alloc(len * 4), hsum = s->alloc(4);
  s->writeFloats(hx, x);
  s->writeFloats(hy, y);
  s->vadd(len, hx, hy, hout);    // out = x + y
  s->axpy(len, 3.0f, hx, hy);     // y = 3x + y
  s->vadd(len, hy, hx, hy);       // y = y + x (output aliases an input)
  s->reduceSum(len, hx, hsum);
  auto out = s->readFloats(hout, len);
  auto yy = s->readFloats(hy, len);
  auto sum = s->readFloats(hsum, 1);
  ASSERT_TRUE(out && yy && sum) << cluster->logs();
  double ref = 0;
  for (uint64_t i = 0; i < len; ++i) {
    ASSERT_EQ((*out)[i], x[i] + y[i]) << i;
    ASSERT_NEAR((*yy)[i], (3.0f * x[i] + y[i]) + x[i], 1e-5) << i;  // a card may fuse the multiply-add
    ref += x[i];
  }
  EXPECT_NEAR((*sum)[0], ref, 1e-2);
  // Everything the vaccel did was fine: no error pending.
  EXPECT_TRUE(s->fence());
}

// A tensor op writes more than its output: layerNorm writes each row's mean and rstd.
// The other cards' copies of a buffer it writes that way are stale after it, so the next
// split gemm must not read them.
TEST_F(Cards, ATensorOpsOtherOutputsAreNotReadStaleOnOtherCards) {
  auto s = open(*cluster, 7, "stats");
  ASSERT_TRUE(s);
  ASSERT_EQ(s->vaccel().cards.size(), 3u);
  const uint32_t m = 64, n = 48, k = 40;
  auto a = randomFloats(size_t{m} * k, 8), b = randomFloats(size_t{k} * n, 9);
  auto ha = s->alloc(a.size() * 4), hb = s->alloc(b.size() * 4), hc = s->alloc(size_t{m} * n * 4);
  s->writeFloats(ha, a);
  s->writeFloats(hb, b);
  std::vector<float> zero(size_t{m} * n, 0.0f);
  s->gemm(m, n, k, 1.0f, ha, hb, 0.0f, hc);  // the other cards now hold copies of b
  auto first = s->readFloats(hc, zero.size());
  ASSERT_TRUE(first) << first.error().message;
  expectNear(*first, gemmRef(m, n, k, 1.0f, a, b, 0.0f, zero), 1e-3, "first gemm");
  // layerNorm over rows of one element: each row's mean is the element itself, written
  // into b (operand 2); out and rstd go elsewhere.
  auto fresh = randomFloats(b.size(), 10);
  auto hx = s->alloc(b.size() * 4), hout = s->alloc(b.size() * 4), hrstd = s->alloc(b.size() * 4);
  s->writeFloats(hx, fresh);
  client::TensorOp ln;
  ln.fn = client::TensorFn::layerNorm;
  ln.shape = {b.size(), 1};
  ln.operands = {{hout, 0, {1, 1}}, {hx, 0, {1, 1}}, {hb, 0, {1, 0}}, {hrstd, 0, {1, 0}}};
  ln.alpha = 1e-5f;
  s->tensor(ln);
  s->gemm(m, n, k, 1.0f, ha, hb, 0.0f, hc);
  auto second = s->readFloats(hc, zero.size());
  ASSERT_TRUE(second) << second.error().message << "\n" << cluster->logs();
  expectNear(*second, gemmRef(m, n, k, 1.0f, a, fresh, 0.0f, zero), 1e-3, "gemm after layerNorm wrote b");
}

TEST(SplitOps, SmallOpsRunWholeOnThePrimaryByDefault) {
  Cluster cluster;  // default --split-min-mflop 8
  cluster.addNetaccel("node0", {"kind=gpu,tflops=3,memory=64MiB,threads=1"}, 3);
  cluster.addNetaccel("node1", {"kind=cpu,tflops=2,memory=64MiB,threads=1"}, 2);
  auto s = open(cluster, 5, "small");
  ASSERT_TRUE(s);
  ASSERT_EQ(s->vaccel().cards.size(), 2u);
  auto a = randomFloats(64 * 64, 1);
  auto ha = s->alloc(a.size() * 4), hc = s->alloc(a.size() * 4);
  s->writeFloats(ha, a);
  s->gemm(64, 64, 64, 1.0f, ha, ha, 0.0f, hc);  // 0.5 MFLOP
  auto small = s->readFloats(hc, 1);
  ASSERT_TRUE(small) << small.error().message;
  EXPECT_EQ(bytesMoved(cluster), 0u) << cluster.console("vaccels");
  auto b = randomFloats(256 * 256, 2);
  auto hb = s->alloc(b.size() * 4), hd = s->alloc(b.size() * 4);
  s->writeFloats(hb, b);
  s->gemm(256, 256, 256, 1.0f, hb, hb, 0.0f, hd);  // 33.6 MFLOP: split
  auto big = s->readFloats(hd, 1);
  ASSERT_TRUE(big) << big.error().message;
  EXPECT_GT(bytesMoved(cluster), 0u) << cluster.console("vaccels");
}

TEST_F(Cards, ASplitOpOnABadBufferFailsLikeOnOneCard) {
  auto s = open(*cluster, 7, "bad");
  ASSERT_TRUE(s);
  auto small = s->alloc(16), big = s->alloc(4096);
  s->vadd(1000, small, big, big);  // small holds 4 floats: the primary says so
  auto status = s->fence();
  ASSERT_FALSE(status);
  EXPECT_EQ(status.error().code, Code::invalidArgument) << status.error().message;
  EXPECT_TRUE(s->fence());
}

// A netaccel holding one of a vaccel's cards dies while a split op runs there: with
// failover off, the guest hears `unavailable` naming it (no hang), and the scheduler
// serves others. (With failover on it would be rebuilt: tests/failover_test.cc.)
TEST(SplitOps, ACardLostMidOpFailsTheSessionNotTheScheduler) {
  VmSpec vm;
  vm.more = "failover=off";
  Cluster cluster({vm}, "", {"--block-tflops", "0.001"});
  cluster.addNetaccel("node0", {"kind=gpu,tflops=0.003,memory=256MiB,threads=1,paced=true"}, 3);
  auto& doomed = cluster.addNetaccel("node1", {"kind=cpu,tflops=0.002,memory=256MiB,threads=1,paced=true"}, 2);
  auto s = open(cluster, 0.005, "doomed");
  ASSERT_TRUE(s);
  ASSERT_EQ(s->vaccel().cards.size(), 2u);
  const uint32_t n = 1024;  // node1's 40% of the rows takes about 0.4 s at its pace
  std::vector<float> ones(size_t{n} * n, 1.0f);
  auto ha = s->alloc(ones.size() * 4), hb = s->alloc(ones.size() * 4), hc = s->alloc(ones.size() * 4);
  s->writeFloats(ha, ones);
  s->writeFloats(hb, ones);
  ASSERT_TRUE(s->fence());
  s->gemm(n, n, n, 1.0f, ha, hb, 0.0f, hc);
  ASSERT_TRUE(s->flush());
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  doomed.kill(SIGKILL);
  auto c = s->readFloats(hc, 4);
  ASSERT_FALSE(c);
  EXPECT_EQ(c.error().code, Code::unavailable) << c.error().message;
  EXPECT_NE(c.error().message.find("node1"), std::string::npos) << c.error().message;

  s.reset();  // an unavailable session keeps its blocks until its program lets go
  auto other = open(cluster, 0.003, "survivor");
  ASSERT_TRUE(other);
  auto h = other->alloc(16);
  other->writeFloats(h, {1, 2, 3, 4});
  auto back = other->readFloats(h, 4);
  ASSERT_TRUE(back) << back.error().message;
  EXPECT_EQ((*back)[3], 4.0f);
}

// Every built backend is listed, and one with no device says why instead of failing.
TEST(ListDevices, ReportsEachBackendAndWhyItHasNoDevices) {
  int status = -1;
  std::string out = runCommand(sh(binary("raccel-netaccel")) + " --list-devices --card kind=fpga,tflops=2", &status);
  ASSERT_EQ(status, 0) << out;
  EXPECT_NE(out.find("cpu      fpga"), std::string::npos) << out;  // the declared simulated card
  for (auto& backend : hal::builtBackends()) {
    EXPECT_NE(out.find(backend), std::string::npos) << out;
    if (backend == "cpu") continue;
    auto report = hal::discover(backend);
    EXPECT_NE(out.find("discovery: " + backend + ": " + report.note), std::string::npos) << out;
    if (report.devices.empty()) {
      EXPECT_EQ(out.find("\n0     " + backend), std::string::npos) << out;  // no card of it listed
    } else {
      EXPECT_NE(out.find(backend + "   "), std::string::npos) << out;
    }
  }
}

// PoCL's device is the netaccel's choice, made before it opens OpenCL (its sandboxes
// inherit it): each setting opens that device, and auto keeps what the environment says.
TEST(ListDevices, OpensThePoclDeviceItIsToldTo) {
  auto opencl = hal::discover("opencl");
  if (opencl.devices.empty()) GTEST_SKIP() << "no OpenCL device: " << opencl.note;
  const std::string model = opencl.devices[0].model;
  if (model.rfind("pthread-", 0) != 0 && model.rfind("basic-", 0) != 0 && model.rfind("cpu-", 0) != 0)
    GTEST_SKIP() << "not PoCL's CPU device: " << model;
  const std::string list = sh(binary("raccel-netaccel")) + " --list-devices --discover opencl";
  for (std::string device : {"basic", "pthread"}) {
    int status = -1;
    std::string out = runCommand("env -u POCL_DEVICES " + list + " --pocl-device " + device, &status);
    ASSERT_EQ(status, 0) << out;
    EXPECT_NE(out.find("opencl   cpu   " + device + "-"), std::string::npos) << out;
    EXPECT_NE(out.find("discovery: PoCL device: " + device), std::string::npos) << out;
  }
  int status = -1;
  std::string out = runCommand("env POCL_DEVICES=pthread " + list + " --pocl-device auto", &status);
  ASSERT_EQ(status, 0) << out;
  EXPECT_NE(out.find("opencl   cpu   pthread-"), std::string::npos) << out;
  EXPECT_EQ(out.find("discovery: PoCL device:"), std::string::npos) << out;  // the environment's, left as it is
  out = runCommand(list + " --pocl-device cuda", &status);
  EXPECT_NE(status, 0) << out;
  EXPECT_NE(out.find("pocl_device must be auto, basic or pthread, not 'cuda'"), std::string::npos) << out;
}

}  // namespace
}  // namespace raccel::testing
