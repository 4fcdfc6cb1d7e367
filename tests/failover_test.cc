// Failover (scheduler/lineage.h), with real processes: a netaccel holding a vaccel's
// card is killed (or frozen past its heartbeat) while its program streams instructions;
// the vaccel is rebuilt on the other netaccel from its checkpoint and log, and the
// program's results are exactly those of a run without the loss. And the honest limits:
// no card left, failover off, a second loss during recovery.
#include <gtest/gtest.h>

#include <signal.h>

#include <cstring>
#include <map>
#include <regex>

#include "hal/backends.h"
#include "tests/cluster.h"
#include "tests/kernels.h"
#include "tests/raw_http.h"
#include "vmfrontend/raccel.h"

namespace raccel::testing {
namespace {

using client::Arg;
using client::Handle;
using client::Session;

// The cards the fixture's vaccels run on: PoCL here, the GPU where there is one.
struct FailoverCard {
  std::string backend;
  std::string spec;  // each netaccel's --card
  ScaleKernel scale;
};
void PrintTo(const FailoverCard& c, std::ostream* os) { *os << c.backend; }
const FailoverCard kOpenclCard{"opencl", "backend=opencl,kind=gpu,tflops=2,memory=256MiB", kScaleOpenclC};
const FailoverCard kCudaCard{"cuda", "backend=cuda,device=0,kind=gpu,tflops=2,memory=512MiB", kScaleCudaC};

std::unique_ptr<Session> open(Cluster& c, const std::string& vm, double tflops, const std::string& name) {
  client::Options o;
  o.socket = c.vmSocket(vm);
  o.tflops = tflops;
  o.program = name;
  o.timeoutMs = 120000;  // a recovery is a delay, not an error
  auto s = Session::open(o);
  EXPECT_TRUE(s) << s.error().message << "\n" << c.logs();
  return s ? std::move(*s) : nullptr;
}

constexpr uint32_t kDim = 32, kN = kDim * kDim;

client::TensorOp unary(client::TensorFn fn, Handle out, Handle in) {
  client::TensorOp op;
  op.fn = fn;
  op.shape = {kN};
  op.operands = {{out, 0, {1}}, {in, 0, {1}}};
  return op;
}

// `steps` mixed instructions, the same every run: writes, gemms accumulating into C,
// tensor ops, OpenCL C launches and a tensor add that read and write X, with a read of
// D every 100. `before(i)` runs before step i. Returns what was read: the periodic
// reads, then every buffer at the end ("" in *why when all went well).
std::vector<std::vector<float>> runMixed(Session& s, const ScaleKernel& scale, int steps, const std::function<void(int)>& before,
                                         std::string* why) {
  std::vector<std::vector<float>> out;
  const Handle a = s.alloc(kN * 4), b = s.alloc(kN * 4), c = s.alloc(kN * 4), d = s.alloc(kN * 4), x = s.alloc(kN * 4);
  s.writeFloats(a, randomFloats(kN, 1));
  s.writeFloats(b, randomFloats(kN, 2));
  s.fill(c, 0, kN * 4, 0);
  s.writeFloats(x, randomFloats(kN, 3));
  const Handle program = s.loadProgram(scale.kind, "scale", std::as_bytes(std::span(scale.source, std::strlen(scale.source))));
  auto read = [&](Handle h) {
    auto got = s.readFloats(h, kN);
    if (!got) {
      if (why->empty()) *why = got.error().toString();
      out.emplace_back();
    } else {
      out.push_back(std::move(*got));
    }
  };
  for (int i = 0; i < steps; ++i) {
    if (before) before(i);
    switch (i % 5) {
      case 0: {
        auto chunk = randomFloats(256, 100 + i);
        s.write(a, (i * 64 % 768) * 4u, std::as_bytes(std::span(chunk)));
        break;
      }
      case 1: s.gemm(kDim, kDim, kDim, 1.0f, a, b, 0.5f, c); break;
      case 2: s.tensor(unary(client::TensorFn::tanh, d, c)); break;
      case 3: s.launch(program, "scale", {kN / 128, 1, 1}, {128, 1, 1}, {Arg::f32(0.5f), Arg::buffer(x), Arg::u32(kN)}); break;
      case 4: {
        client::TensorOp add;
        add.fn = client::TensorFn::add;
        add.shape = {kN};
        add.operands = {{x, 0, {1}}, {x, 0, {1}}, {d, 0, {1}}};
        add.alpha = 0.25f;
        s.tensor(add);
        break;
      }
    }
    if (i % 100 == 99) read(d);
  }
  for (Handle h : {a, c, d, x}) read(h);
  return out;
}

std::string firstDifference(const std::vector<std::vector<float>>& got, const std::vector<std::vector<float>>& want) {
  if (got.size() != want.size()) return std::to_string(got.size()) + " reads, want " + std::to_string(want.size());
  for (size_t r = 0; r < got.size(); ++r) {
    if (got[r].size() != want[r].size()) return "read " + std::to_string(r) + " has " + std::to_string(got[r].size()) + " values";
    for (size_t i = 0; i < got[r].size(); ++i)
      if (std::memcmp(&got[r][i], &want[r][i], 4) != 0)
        return "read " + std::to_string(r) + " element " + std::to_string(i) + ": " + std::to_string(got[r][i]) + ", want " +
               std::to_string(want[r][i]);
  }
  return "";
}

bool hasEvent(Cluster& c, const std::string& text) { return c.ctl({"events", "--recent"}).find(text) != std::string::npos; }

// kill -9, and wait until the scheduler has noticed.
void killNetaccel(Cluster& c, Process& p, const std::string& name) {
  p.kill(SIGKILL);
  p.wait(10000);
  const std::regex lost("node-lost +" + name + " ");
  EXPECT_TRUE(waitFor([&] { return std::regex_search(c.ctl({"events", "--recent"}), lost); }, 20000))
      << c.ctl({"events", "--recent"});
}

// A metric of the scheduler's /metrics for one vaccel (-1 when absent).
double vaccelMetric(Cluster& c, const std::string& name, const std::string& program) {
  std::string page = rawhttp::roundTrip(c.httpPort(), "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  std::string vaccels = c.console("vaccels");
  std::smatch m;
  if (!std::regex_search(vaccels, m, std::regex("\"id\":([0-9]+),[^}]*\"program\":\"" + program + "\""))) return -1;
  std::regex line(name + "\\{[^}]*vaccel=\"" + m[1].str() + "\"[^}]*\\} ([0-9.e+]+)");
  if (!std::regex_search(page, m, line)) return -1;
  return std::stod(m[1].str());
}

// Two netaccels with one card each (2 blocks); the vaccel takes one whole card.
class Failover : public ::testing::TestWithParam<FailoverCard> {
 protected:
  void SetUp() override {
    auto found = hal::discover(GetParam().backend);
    if (found.devices.empty()) GTEST_SKIP() << "no " << GetParam().backend << " device: " << found.note;
  }
  void start(std::vector<VmSpec> vms = {VmSpec{"vm1", 2}}, std::vector<std::string> args = {}, int nodes = 2) {
    cluster = std::make_unique<Cluster>(std::move(vms), "", std::move(args));
    for (int i = 0; i < nodes; ++i) {
      const std::string name = "node" + std::to_string(i);
      netaccels[name] = &cluster->addNetaccel(name, {GetParam().spec}, 2);
    }
  }
  // The netaccel of the vaccel's primary card now, as the program hears it (a move since
  // the welcome, by compaction on a busy machine, changes it).
  Process& holder(Session& s) {
    (void)s.describeVaccel();  // refreshes s.vaccel(); on failure the last one stands
    return *netaccels.at(s.vaccel().cards.at(0).node);
  }
  // A cluster whose VM keeps at most 1 MiB of lineage log (so checkpoints come often),
  // and a session of that VM's named `name`.
  std::unique_ptr<Session> startCapped(const std::string& name) {
    VmSpec vm{"vm1", 2};
    vm.more = "lineage_bytes=1MiB";
    start({vm});
    return open(*cluster, "vm1", 2, name);
  }
  // The reads of `steps` mixed instructions by a program that loses nothing.
  std::vector<std::vector<float>> baseline(int steps, double tflops = 2) {
    auto b = open(*cluster, "vm1", tflops, "baseline");
    if (!b) return {};
    std::string why;
    auto want = runMixed(*b, GetParam().scale, steps, {}, &why);
    EXPECT_EQ(why, "") << cluster->logs();
    return want;
  }
  std::unique_ptr<Cluster> cluster;
  std::map<std::string, Process*> netaccels;
};

// 1,000 instructions with the vaccel's netaccel killed (kill -9) before step k, five
// different ks: every read, during and after, is bit for bit the run without a kill.
TEST_P(Failover, AKilledNetaccelsVaccelFinishesExactlyAsWithoutTheKill) {
  for (int k : {40, 260, 517, 733, 968}) {
    SCOPED_TRACE("killed before step " + std::to_string(k));
    start();
    std::string why;
    const auto want = baseline(1000);
    ASSERT_FALSE(want.empty());
    auto s = open(*cluster, "vm1", 2, "survivor");
    ASSERT_TRUE(s);
    const std::string home = s->vaccel().cards.at(0).node;
    auto got = runMixed(*s, GetParam().scale, 1000, [&](int i) { if (i == k) holder(*s).kill(SIGKILL); }, &why);
    ASSERT_EQ(why, "") << cluster->logs();
    EXPECT_EQ(firstDifference(got, want), "");
    EXPECT_TRUE(hasEvent(*cluster, "recovered")) << cluster->ctl({"events", "--recent"});
    EXPECT_NE(cluster->console("vaccels").find("\"running\""), std::string::npos);
    std::string vaccels = cluster->console("vaccels");
    EXPECT_EQ(vaccels.find("\"node\":\"" + home + "\""), std::string::npos) << "still on the killed netaccel: " << vaccels;
    s.reset();
    cluster.reset();
  }
}

// Frozen (SIGSTOP) past the heartbeat timeout, the netaccel is declared lost and the
// vaccel rebuilt elsewhere; woken, its late replies find no context and are dropped,
// and it rejoins the pool.
TEST_P(Failover, AFrozenNetaccelsVaccelMovesOnAndItsLateRepliesAreIgnored) {
  start();  // (the cluster's heartbeat timeout: 2 s)
  std::string why;
  const auto want = baseline(300);
  ASSERT_FALSE(want.empty());
  auto s = open(*cluster, "vm1", 2, "survivor");
  ASSERT_TRUE(s);
  Process* frozen = nullptr;
  auto got = runMixed(*s, GetParam().scale, 300, [&](int i) {
    if (i == 150) (frozen = &holder(*s))->kill(SIGSTOP);
    if (i == 200) {
      EXPECT_TRUE(waitFor([&] { return hasEvent(*cluster, "no heartbeat"); }, 30000)) << cluster->logs();
      frozen->kill(SIGCONT);
    }
  }, &why);
  ASSERT_EQ(why, "") << cluster->logs();
  EXPECT_EQ(firstDifference(got, want), "");
  EXPECT_TRUE(waitFor([&] { return cluster->poolTotal() == 4; }, 30000)) << cluster->console("nodes");
  EXPECT_TRUE(cluster->scheduler().running());
}

// A lineage cap of 1 MiB with 12 MiB written: checkpoints happen and the log starts
// again; a kill after them recovers from the last checkpoint, exactly.
TEST_P(Failover, TheLogAtItsCapIsCheckpointedAndRecoveryAfterItIsExact) {
  auto s = startCapped("capped");
  ASSERT_TRUE(s);
  const size_t n = 1 << 18;  // 1 MiB of floats
  auto big = s->alloc(n * 4);
  std::vector<float> last;
  for (unsigned round = 0; round < 12; ++round) {
    last = randomFloats(n, 40 + round);
    s->writeFloats(big, last);
    s->axpy(n, 0.0f, big, big);  // y = 0 * x + y: an op between the writes
  }
  auto fenced = s->fence();
  ASSERT_TRUE(fenced) << fenced.error().message << cluster->logs();
  EXPECT_TRUE(waitFor([&] { return vaccelMetric(*cluster, "raccel_vaccel_checkpoints_total", "capped") >= 3; }, 30000))
      << vaccelMetric(*cluster, "raccel_vaccel_checkpoints_total", "capped");
  const double logFrames = vaccelMetric(*cluster, "raccel_vaccel_lineage_log_frames", "capped");
  EXPECT_GE(logFrames, 0);
  EXPECT_LT(logFrames, 24) << "the log was not truncated";
  // The op between the writes changed the buffer, so checkpoints read it back, in the
  // background: the writes that followed went on meanwhile.
  EXPECT_GT(vaccelMetric(*cluster, "raccel_vaccel_checkpoint_read_bytes_total", "capped"), 0);
  EXPECT_GT(vaccelMetric(*cluster, "raccel_vaccel_checkpoint_overlapped_frames_total", "capped"), 0);
  const double held = vaccelMetric(*cluster, "raccel_vaccel_lineage_bytes", "capped");
  EXPECT_LE(held, 3.0 * (4 << 20)) << "checkpoint (1 MiB) and at most a cap's log (plus a frame)";
  // More work after the checkpoint, then the loss.
  auto extra = randomFloats(n, 99);
  s->writeFloats(big, extra);
  s->axpy(n, 2.0f, big, big);  // big = 3 * extra
  holder(*s).kill(SIGKILL);
  auto back = s->readFloats(big, n);
  ASSERT_TRUE(back) << back.error().message << cluster->logs();
  for (size_t i = 0; i < n; ++i)
    if ((*back)[i] != extra[i] + 2.0f * extra[i]) {
      ADD_FAILURE() << "element " << i << ": " << (*back)[i] << ", want " << extra[i] * 3.0f;
      break;
    }
  EXPECT_EQ(vaccelMetric(*cluster, "raccel_vaccel_recoveries_total", "capped"), 1);
}

// A loss while a checkpoint is under way: its netaccel frozen, the checkpoint's reads
// cannot come back, yet the guest's frames go on beside it; killed then, the vaccel is
// rebuilt from the last finished checkpoint and the whole log, exactly.
TEST_P(Failover, ALossWhileACheckpointIsUnderWayRecoversFromTheLastFinishedOneExactly) {
  auto s = startCapped("midway");
  ASSERT_TRUE(s);
  const size_t n = 1 << 18;  // 1 MiB of floats: the cap
  auto big = s->alloc(n * 4);
  s->writeFloats(big, randomFloats(n, 60));
  s->axpy(n, 0.0f, big, big);  // the card's now: checkpoints read it back
  ASSERT_TRUE(s->fence());
  s->axpy(n, 1.0f, big, big);  // a frame past the cap: a checkpoint, taken while the card answers
  ASSERT_TRUE(s->fence());
  ASSERT_TRUE(waitFor([&] { return vaccelMetric(*cluster, "raccel_vaccel_checkpoints_total", "midway") >= 1; }, 30000));
  const double before = vaccelMetric(*cluster, "raccel_vaccel_checkpoint_overlapped_frames_total", "midway");
  Process& frozen = holder(*s);
  frozen.kill(SIGSTOP);
  std::vector<float> last;
  for (unsigned round = 0; round < 2; ++round) {
    last = randomFloats(n, 61 + round);
    s->writeFloats(big, last);
    s->axpy(n, 1.0f, big, big);  // big = 2 * last
  }
  // The checkpoint started past the cap waits on the frozen card; frames went on meanwhile.
  EXPECT_TRUE(waitFor([&] {
    return vaccelMetric(*cluster, "raccel_vaccel_checkpoint_overlapped_frames_total", "midway") > before;
  }, 30000)) << cluster->logs();
  frozen.kill(SIGKILL);
  auto back = s->readFloats(big, n);
  ASSERT_TRUE(back) << back.error().message << cluster->logs();
  for (size_t i = 0; i < n; ++i)
    if ((*back)[i] != 2.0f * last[i]) {
      ADD_FAILURE() << "element " << i << ": " << (*back)[i] << ", want " << 2.0f * last[i];
      break;
    }
  EXPECT_EQ(vaccelMetric(*cluster, "raccel_vaccel_recoveries_total", "midway"), 1);
}

// What the guest wrote itself (writes at offsets, a fill, a buffer freed and its handle
// allocated again) is folded from the log into the checkpoint: checkpoints read nothing
// back from the card, yet a kill after them recovers every byte.
TEST_P(Failover, WhatTheGuestWroteIsFoldedFromTheLogNotReadBackAndRecoveredExactly) {
  auto s = startCapped("folded");
  ASSERT_TRUE(s);
  const size_t n = 2 << 20;  // 8 MiB of floats
  auto big = s->alloc(n * 4), reused = s->alloc(4096);
  std::vector<float> want(n, 0.0f);
  for (unsigned part = 0; part < 6; ++part) {  // six overlapping writes of 1.5 MiB
    auto chunk = randomFloats(3 << 17, 70 + part);
    const size_t at = part * (n / 8);
    s->write(big, at * 4, std::as_bytes(std::span(chunk)));
    std::copy(chunk.begin(), chunk.end(), want.begin() + at);
  }
  s->fill(big, 4 * 1000, 4 * 24, 0);
  std::fill(want.begin() + 1000, want.begin() + 1024, 0.0f);
  s->free(reused);
  s->fill(reused = s->alloc(8192), 0, 8192, 0);  // (a handle of its own: the client numbers them)
  auto tail = randomFloats(1024, 77);
  s->writeFloats(reused, tail);
  auto fenced = s->fence();
  ASSERT_TRUE(fenced) << fenced.error().message << cluster->logs();
  EXPECT_TRUE(waitFor([&] { return vaccelMetric(*cluster, "raccel_vaccel_checkpoints_total", "folded") >= 3; }, 30000))
      << vaccelMetric(*cluster, "raccel_vaccel_checkpoints_total", "folded");
  EXPECT_EQ(vaccelMetric(*cluster, "raccel_vaccel_checkpoint_read_bytes_total", "folded"), 0);
  holder(*s).kill(SIGKILL);
  auto back = s->readFloats(big, n);
  ASSERT_TRUE(back) << back.error().message << cluster->logs();
  EXPECT_EQ(firstDifference({*back}, {want}), "");
  auto backTail = s->readFloats(reused, 2048);
  ASSERT_TRUE(backTail) << backTail.error().message;
  tail.resize(2048, 0.0f);
  EXPECT_EQ(firstDifference({*backTail}, {tail}), "");
  EXPECT_EQ(vaccelMetric(*cluster, "raccel_vaccel_recoveries_total", "folded"), 1);
  // An op makes its output the card's: the next checkpoint reads that buffer back.
  s->axpy(2048, 1.0f, reused, reused);
  for (unsigned round = 0; round < 3; ++round) s->writeFloats(big, randomFloats(n / 8, 90 + round));
  ASSERT_TRUE(s->fence());
  EXPECT_TRUE(waitFor([&] { return vaccelMetric(*cluster, "raccel_vaccel_checkpoint_read_bytes_total", "folded") >= 8192; }, 30000))
      << vaccelMetric(*cluster, "raccel_vaccel_checkpoint_read_bytes_total", "folded");
}

// Failover off for vm1: its program hears that its buffers are gone, and why; vm2's
// program, on the other netaccel, is untouched.
TEST_P(Failover, WithFailoverOffTheProgramHearsWhyAndOthersAreUntouched) {
  VmSpec off{"vm1", 2};
  off.more = "failover=off";
  start({off, VmSpec{"vm2", 2}});
  auto s = open(*cluster, "vm1", 2, "unprotected");
  auto other = open(*cluster, "vm2", 2, "bystander");
  ASSERT_TRUE(s && other);
  auto keep = other->alloc(kN * 4);
  auto values = randomFloats(kN, 5);
  other->writeFloats(keep, values);
  auto h = s->alloc(64);
  ASSERT_TRUE(s->fence());
  Process& node = holder(*s);  // first: it refreshes s->vaccel()
  killNetaccel(*cluster, node, s->vaccel().cards.at(0).node);
  std::vector<std::byte> out(64);
  auto r = s->read(h, 0, out);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Code::unavailable) << r.error().message;
  EXPECT_NE(r.error().message.find("failover is off for vm 'vm1'"), std::string::npos) << r.error().message;
  auto kept = other->readFloats(keep, kN);
  ASSERT_TRUE(kept) << kept.error().message;
  EXPECT_EQ(*kept, values);
}

// No card of its kind left: the vaccel waits while its netaccel may come back
// (forget_offline_ms), then its program hears that it cannot be recovered and why.
// A cpu tenant on the other netaccel is untouched.
TEST(FailoverLimits, NoCardOfItsKindLeftEndsItSayingSo) {
  Cluster cluster({VmSpec{"vm1", 2, 0, "gpu"}, VmSpec{"vm2", 2, 0, "cpu"}}, "", {"--set", "forget_offline_ms=1500"});
  Process& gpu = cluster.addNetaccel("node0", {"kind=gpu,tflops=2,memory=256MiB,threads=1"}, 2);
  cluster.addNetaccel("node1", {"kind=cpu,tflops=2,memory=256MiB,threads=1"}, 2);
  auto s = open(cluster, "vm1", 2, "gpuonly");
  auto other = open(cluster, "vm2", 2, "cpuuser");
  ASSERT_TRUE(s && other);
  auto h = s->alloc(64);
  auto keep = other->alloc(kN * 4);
  auto values = randomFloats(kN, 6);
  other->writeFloats(keep, values);
  ASSERT_TRUE(s->fence());
  killNetaccel(cluster, gpu, "node0");
  std::vector<std::byte> out(64);
  auto r = s->read(h, 0, out);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Code::unavailable) << r.error().message;
  EXPECT_NE(r.error().message.find("could not be recovered after netaccel 'node0' was lost"), std::string::npos)
      << r.error().message;
  EXPECT_NE(r.error().message.find("gpu"), std::string::npos) << r.error().message;
  EXPECT_TRUE(hasEvent(cluster, "recovery-failed"));
  auto kept = other->readFloats(keep, kN);
  ASSERT_TRUE(kept) << kept.error().message;
  EXPECT_EQ(*kept, values);
}

// A stream of tiny instructions faster than its checkpoints fold (a log of 16,384 frames
// at most starts one) waits for them in the scheduler, and what waited goes on to the
// netaccel in a few writes, as a read's frames do: not a write each (what made the lineage
// cost 87% of the stream's rate). The fills all arrive: the buffer reads back as filled.
TEST(FailoverLimits, FramesHeldForACheckpointGoOnInFewWritesAndAllArrive) {
  VmSpec vm{"vm1", 2};
  vm.more = "lineage_bytes=1MiB";
  Cluster cluster({vm}, "", {});
  cluster.addNetaccel("node0", {"kind=cpu,tflops=2,memory=256MiB"}, 2);
  auto s = open(cluster, "vm1", 2, "streamer");
  ASSERT_TRUE(s);
  constexpr uint64_t kFills = 200000, kSlots = 1024;
  auto h = s->alloc(kSlots * 4);
  for (uint64_t i = 0; i < kFills; ++i) s->fill(h, (i % kSlots) * 4, 4, static_cast<uint8_t>(i / kSlots));
  ASSERT_TRUE(s->fence());
  std::vector<std::byte> back(kSlots * 4);
  ASSERT_TRUE(s->read(h, 0, back));
  for (uint64_t slot = 0; slot < kSlots; ++slot) {  // the last fill of each slot
    const uint64_t last = (kFills - 1 - slot) / kSlots * kSlots + slot;
    ASSERT_EQ(std::to_integer<uint8_t>(back[slot * 4]), static_cast<uint8_t>(last / kSlots)) << "slot " << slot;
  }
  const std::string metrics = rawhttp::roundTrip(cluster.httpPort(), "GET /metrics HTTP/1.0\r\n\r\n");
  std::smatch checkpoints, writes;
  ASSERT_TRUE(std::regex_search(metrics, writes, std::regex(R"(raccel_node_link_writes_total\{node="node0"\} (\d+))")))
      << metrics;
  ASSERT_TRUE(std::regex_search(metrics, checkpoints, std::regex(R"(raccel_vaccel_checkpoints_total\{[^}]*\} (\d+))")))
      << metrics;
  // (16,384 frames start one; a slow fold lets the log reach twice that: 6 or more)
  EXPECT_GE(std::stoul(checkpoints[1]), 6u) << "the log's cap did not bring checkpoints";
  EXPECT_LT(std::stoul(writes[1]), kFills / 20) << "a write a frame on the node link";
}

// Three netaccels: the vaccel's is killed, and the one it is being rebuilt on is killed
// in the middle of that: it is rebuilt again on the third, exactly.
TEST_P(Failover, ASecondLossDuringRecoveryRecoversAgain) {
  start({VmSpec{"vm1", 2}}, {}, 3);
  std::string why;
  const auto want = baseline(400);
  ASSERT_FALSE(want.empty());
  auto s = open(*cluster, "vm1", 2, "twice");
  ASSERT_TRUE(s);
  const std::string first = s->vaccel().cards.at(0).node;
  auto got = runMixed(*s, GetParam().scale, 400, [&](int i) {
    if (i != 300) return;
    netaccels.at(first)->kill(SIGKILL);
    // The next one to hold it: as soon as the scheduler has placed it again.
    std::string second;
    ASSERT_TRUE(waitFor([&] {
      std::smatch m;
      std::string v = cluster->console("vaccels");
      if (!std::regex_search(v, m, std::regex("\"node\":\"(node[0-9])\""))) return false;
      second = m[1].str();
      return second != first;
    }, 30000)) << cluster->console("vaccels");
    netaccels.at(second)->kill(SIGKILL);
  }, &why);
  ASSERT_EQ(why, "") << cluster->logs();
  EXPECT_EQ(firstDifference(got, want), "");
  EXPECT_EQ(vaccelMetric(*cluster, "raccel_vaccel_recoveries_total", "twice"), 2);
}

// A vaccel over two cards on two netaccels (its gemms split across them), its log
// capped at 1 MiB so that checkpoints read back from the primary: losing the primary's
// netaccel, or the other card's, rebuilds it on two cards again from the checkpoint and
// the log, and every read is the run without a loss, bit for bit.
TEST_P(Failover, AVaccelOverTwoCardsRecoversExactlyWhicheverCardIsLost) {
  for (size_t lost : {0u, 1u}) {
    SCOPED_TRACE(lost == 0 ? "the primary's netaccel lost" : "the second card's netaccel lost");
    VmSpec vm{"vm1", 4};
    vm.more = "lineage_bytes=1MiB";
    start({vm}, {}, 3);
    std::string why;
    const auto want = baseline(500, 4);
    ASSERT_FALSE(want.empty());
    auto s = open(*cluster, "vm1", 4, "spanning");
    ASSERT_TRUE(s);
    ASSERT_EQ(s->vaccel().cards.size(), 2u);
    ASSERT_NE(s->vaccel().cards[0].node, s->vaccel().cards[1].node);
    const size_t n = 1 << 18;  // 1 MiB of floats: past the cap, so a checkpoint reads it back
    auto big = s->alloc(n * 4);
    const auto values = randomFloats(n, 70);
    s->writeFloats(big, values);
    s->axpy(n, 1.0f, big, big);  // big = 2 * values, made on the card
    s->writeFloats(s->alloc(n * 4), values);  // the cap again: this checkpoint reads big back
    ASSERT_TRUE(s->fence());
    ASSERT_TRUE(waitFor([&] {
      return vaccelMetric(*cluster, "raccel_vaccel_checkpoint_read_bytes_total", "spanning") >= n * 4;
    }, 30000)) << cluster->logs();
    // Where the card is when it is lost (the placement may have changed since the welcome:
    // a busy machine lets the scheduler's moves run first), as the program hears it.
    std::string lostNode = s->vaccel().cards.at(lost).node;
    auto got = runMixed(*s, GetParam().scale, 500, [&](int i) {
      if (i != 250) return;
      if (auto now = s->describeVaccel(); now && now->cards.size() > lost) lostNode = now->cards[lost].node;
      netaccels.at(lostNode)->kill(SIGKILL);
    }, &why);
    ASSERT_EQ(why, "") << cluster->logs();
    EXPECT_EQ(firstDifference(got, want), "");
    auto back = s->readFloats(big, n);
    ASSERT_TRUE(back) << back.error().message;
    for (size_t i = 0; i < n; ++i)
      if ((*back)[i] != 2.0f * values[i]) {
        ADD_FAILURE() << "element " << i << ": " << (*back)[i] << ", want " << 2.0f * values[i];
        break;
      }
    // The loss of the second card's netaccel may reach the scheduler only after the
    // program's last instruction (nothing after the kill needed that card): waited for.
    EXPECT_TRUE(waitFor([&] { return vaccelMetric(*cluster, "raccel_vaccel_recoveries_total", "spanning") == 1; }, 30000))
        << cluster->console("vaccels");
    EXPECT_TRUE(waitFor([&] {
      const std::string v = cluster->console("vaccels");
      return v.find("\"node\":\"" + lostNode + "\"") == std::string::npos && v.find("\"state\":\"running\"") != std::string::npos;
    }, 30000)) << cluster->console("vaccels");
    EXPECT_EQ(vaccelMetric(*cluster, "raccel_vaccel_recoveries_total", "spanning"), 1);
    // On two cards again, neither on the lost netaccel.
    const std::string vaccels = cluster->console("vaccels");
    EXPECT_EQ(vaccels.find("\"node\":\"" + lostNode + "\""), std::string::npos) << vaccels;
    size_t cards = 0;
    for (size_t at = vaccels.find("\"node\":\""); at != std::string::npos; at = vaccels.find("\"node\":\"", at + 1)) ++cards;
    EXPECT_EQ(cards, 2u) << vaccels;
    // And the program, asking, hears where it is now.
    auto now = s->describeVaccel();
    ASSERT_TRUE(now) << now.error().message;
    ASSERT_EQ(now->cards.size(), 2u);
    for (auto& card : now->cards) EXPECT_NE(card.node, lostNode) << now->describe();
    EXPECT_EQ(s->vaccel().describe(), now->describe());
    s.reset();
    cluster.reset();
  }
}

// The scheduler restarted (kill -9) under a running vaccel: its log died with it, so
// the vaccel's lineage starts again with a checkpoint of every buffer, read back in the
// background; a netaccel lost after that rebuilds it exactly, as before the restart.
TEST_P(Failover, AfterASchedulerRestartTheVaccelIsProtectedAgainAndRecoversExactly) {
  start();
  const std::string guestd = cluster->startGuestd("vm1");
  client::Options o;
  o.socket = guestd;
  o.tflops = 2;
  o.program = "restarted";
  o.timeoutMs = 120000;
  auto opened = Session::open(o);
  ASSERT_TRUE(opened) << opened.error().message << cluster->logs();
  auto& s = *opened;
  const size_t n = 1 << 16;
  auto kept = s->alloc(n * 4);
  // Values whose sums below are exact, so the card's rounding (an FMA or not) is the host's.
  std::vector<float> values(n), more(n);
  for (size_t i = 0; i < n; ++i) values[i] = float(i % 1000) / 8, more[i] = float(i % 31);
  s->writeFloats(kept, values);
  s->axpy(n, 1.0f, kept, kept);  // kept = 2 * values, made on the card before the restart
  ASSERT_TRUE(s->fence());
  cluster->restartScheduler();
  ASSERT_TRUE(waitFor([&] { return vaccelMetric(*cluster, "raccel_vaccel_checkpoints_total", "restarted") >= 1; }, 30000))
      << cluster->logs();
  EXPECT_GE(vaccelMetric(*cluster, "raccel_vaccel_checkpoint_read_bytes_total", "restarted"), double(n * 4));
  // Work after the restart, then the loss.
  auto later = s->alloc(n * 4);
  s->writeFloats(later, more);
  s->axpy(n, 3.0f, kept, later);  // later = more + 6 * values
  Process& node = holder(*s);  // first: it refreshes s->vaccel()
  killNetaccel(*cluster, node, s->vaccel().cards.at(0).node);
  auto a = s->readFloats(kept, n);
  auto b = s->readFloats(later, n);
  ASSERT_TRUE(a && b) << (a ? b.error().message : a.error().message) << cluster->logs();
  for (size_t i = 0; i < n; ++i)
    if ((*a)[i] != 2.0f * values[i] || (*b)[i] != more[i] + 3.0f * (2.0f * values[i])) {
      ADD_FAILURE() << "element " << i << ": " << (*a)[i] << ", " << (*b)[i] << "; want " << 2.0f * values[i] << ", "
                    << more[i] + 3.0f * (2.0f * values[i]);
      break;
    }
  EXPECT_EQ(vaccelMetric(*cluster, "raccel_vaccel_recoveries_total", "restarted"), 1);
}

INSTANTIATE_TEST_SUITE_P(Cards, Failover, ::testing::Values(kOpenclCard, kCudaCard),
                         [](const auto& info) { return info.param.backend; });

}  // namespace
}  // namespace raccel::testing
