// CardWorker on a real cpu device: how it shares the card between contexts.
#include "netaccel/card_worker.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <chrono>
#include <map>
#include <thread>

#include "hal/cpu/cpu_device.h"
#include "netaccel/sandbox.h"
#include "schema/guest.capnp.h"
#include "transport/wire_types.h"

namespace raccel::netaccel {
namespace {

transport::Body instruction(const std::function<void(wire::Instruction::Builder)>& fill) {
  capnp::MallocMessageBuilder m;
  fill(m.initRoot<wire::Instruction>());
  return transport::encodeBody(m);
}

struct Harness {
  explicit Harness(const hal::CpuDeviceOptions& card = {CardKind::gpu, "sim", 4, 1ull << 30, 1, false})
      : worker(hal::makeCpuDevice(card), [this] { ++notified; }, 2000) {}
  std::atomic<int> notified{0};
  CardWorker worker;
  std::vector<CardWorker::Output> outputs;
  // Waits until `count` outputs have come (a minute at most).
  void collect(size_t count) {
    for (int i = 0; i < 30000 && outputs.size() < count; ++i) {
      worker.drain(outputs);
      if (outputs.size() < count) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }
};

// Each context: three buffers of n x n, then `rounds` of (gemm, fence). The order of the
// fences' replies is the order the card served them.
void queueSizedGemms(CardWorker& w, uint32_t context, uint32_t n, int rounds, uint64_t* seq) {
  for (uint64_t h = 1; h <= 3; ++h)
    w.enqueue(context, (*seq)++, instruction([&](auto in) {
      auto a = in.initAlloc();
      a.setHandle(h);
      a.setSize(n * n * 4);
    }));
  for (int i = 0; i < rounds; ++i) {
    w.enqueue(context, (*seq)++, instruction([&](auto in) {
      auto g = in.initOp().initGemm();
      g.setM(n), g.setN(n), g.setK(n), g.setAlpha(1), g.setA(1), g.setB(2), g.setC(3);
    }));
    w.enqueue(context, (*seq)++, instruction([](auto in) { in.setFence(); }));
  }
}
void queueGemms(CardWorker& w, uint32_t context, int rounds, uint64_t* seq) { queueSizedGemms(w, context, 128, rounds, seq); }

TEST(CardWorker, ContextsShareTheCardInProportionToTheirBlocks) {
  // Paced at 0.5 GFLOPS, each 128^3 gemm takes 8 ms on the card however busy this
  // machine is (its arithmetic takes a fraction of that), so the shares measured are
  // the worker's, not the machine's.
  Harness h({CardKind::gpu, "paced", 0.0005, 1ull << 30, 1, true});
  h.worker.openContext(1, 0, "big", 3, "big");
  h.worker.openContext(2, 0, "small", 1, "small");
  uint64_t seq = 1;
  queueGemms(h.worker, 1, 60, &seq);
  queueGemms(h.worker, 2, 60, &seq);
  h.worker.submit();  // all at once: both contexts are backlogged from the start
  h.collect(120);
  ASSERT_EQ(h.outputs.size(), 120u);
  std::map<uint32_t, int> firstSixty;
  for (size_t i = 0; i < 60; ++i) ++firstSixty[h.outputs[i].context];
  EXPECT_NEAR(firstSixty[1], 45, 5) << "big " << firstSixty[1] << " small " << firstSixty[2];
  EXPECT_EQ(h.worker.kernelTimes().size(), 2u);
}

TEST(CardWorker, OnAnAsynchronousCardTenantsShareDeviceTimeNotInstructions) {
  // The card queues kernels and returns at once (so a call's wall time says nothing);
  // the small tenant's gemms take 8 times the big one's. Shares are of device time: the
  // big tenant (3 blocks) gets 3 times the small one's, however many kernels that is.
  // Paced at 0.5 GFLOPS: a 64^3 gemm takes 1 ms on the card, a 128^3 one 8 ms.
  std::atomic<int> notified{0};
  CardWorker::Options options;
  options.queueDepth = 2;
  CardWorker worker(hal::makeCpuDevice({CardKind::gpu, "async", 0.0005, 1ull << 30, 1, false, true}), [&] { ++notified; },
                    options);
  worker.openContext(1, 0, "big", 3, "big");
  worker.openContext(2, 0, "small", 1, "small");
  uint64_t seq = 1;
  queueSizedGemms(worker, 1, 64, 1200, &seq);
  queueSizedGemms(worker, 2, 128, 200, &seq);
  worker.submit();
  // Waits for 900 ms of device time in all, however slow this machine is: both tenants
  // are still backlogged then (the big one has 1200 ms of kernels, the small one 1600).
  // Counting the enqueue instead, 1400 calls would never add up to it. A kernel is charged
  // when it completes, so the tenant whose kernels are in flight looks behind by up to a
  // kernel or two while the worker is slow to see them end (a loaded machine, ASAN): over
  // 300 ms that was 16 ms more for the small tenant (ratio 2.46), over 900 ms it is a
  // third of that share of its time.
  std::map<uint32_t, double> ms;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  do {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    ms.clear();
    for (auto& [context, ns] : worker.kernelTimes()) ms[context] = ns / 1e6;
  } while (ms[1] + ms[2] < 900 && std::chrono::steady_clock::now() < deadline);
  ASSERT_GE(ms[1] + ms[2], 900) << "device time, not the enqueue: big " << ms[1] << " small " << ms[2];
  ASSERT_GT(ms[2], 0);
  double ratio = ms[1] / ms[2];
  EXPECT_NEAR(ratio, 3.0, 0.45) << "big " << ms[1] << " ms, small " << ms[2] << " ms of device time";
}

// Two tenants on a card whose sandboxes are hostile-sandbox: the first one started
// misbehaves as `mode` says, the other is an asynchronous device that completes at once.
struct HostileCard {
  explicit HostileCard(const std::string& mode, unsigned callTimeoutMs = 1000, double maxOpSeconds = 120) {
    dir = ::testing::TempDir() + "raccel-card-worker-test-" + std::to_string(::getpid());
    std::filesystem::create_directories(dir);
    ::setenv("RACCEL_HOSTILE", mode.c_str(), 1);
    ::setenv("RACCEL_HOSTILE_MARK", (dir + "/first").c_str(), 1);
    CardWorker::Options options;
    options.label = "card 0";
    netaccel::SandboxSettings s;
    s.executable = std::string(RACCEL_BIN_DIR) + "/hostile-sandbox";
    s.dir = dir + "/sandboxes";
    s.warm = 0;
    s.callTimeoutMs = callTimeoutMs;
    options.sandbox = s;
    options.maxOpSeconds = maxOpSeconds;
    worker = std::make_unique<CardWorker>(hal::makeCpuDevice({CardKind::gpu, "sim", 4, 1ull << 30, 1, false}), [] {},
                                          options);
    worker->openContext(1, 0, "evil", 1, "evil");
    uint64_t seq = 1;
    queueSizedGemms(*worker, 1, 8, 20, &seq);
    worker->submit();
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the evil one's sandbox first
    worker->openContext(2, 0, "good", 1, "good");
    queueSizedGemms(*worker, 2, 8, 20, &seq);
    worker->submit();
  }
  ~HostileCard() {
    worker.reset();
    ::unsetenv("RACCEL_HOSTILE");
    ::unsetenv("RACCEL_HOSTILE_MARK");
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
  // The faults the worker reports, waiting up to 5 s for the first.
  std::vector<CardWorker::Fault> faults() {
    std::vector<CardWorker::Fault> out;
    for (int i = 0; i < 500 && out.empty(); ++i) {
      worker->drainFaults(out);
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return out;
  }
  // The good tenant's 20 fences, each a reply, within `ms`.
  bool goodFinishes(int ms) {
    for (int i = 0; i < ms / 10; ++i) {
      worker->drain(outputs);
      if (std::count_if(outputs.begin(), outputs.end(), [](auto& o) { return o.context == 2; }) >= 20) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  }
  std::string dir;
  std::unique_ptr<CardWorker> worker;
  std::vector<CardWorker::Output> outputs;
};

TEST(CardWorker, ASandboxReportingMadeUpKernelsHoldsNoQueueSlotAndChargesNoOtherTenant) {
  // It claims a billion kernels in flight and reports completions with absurd times for
  // every context id there is: it is credited no more in flight than it was given, and
  // only its own tenant's contexts are charged.
  HostileCard card("flood");
  EXPECT_TRUE(card.goodFinishes(10000)) << "the other tenant was starved";
  for (auto& [context, ns] : card.worker->kernelTimes())
    EXPECT_NE(context, 2u) << "another tenant was charged " << ns << " ns by the sandbox's report";
}

// On a card that times its kernels the sandbox's ops are posted: one that fails there is
// answered as its own instruction's error, before the fence that follows it, and the
// tenant's work carries on.
TEST(CardWorker, APostedOpThatFailsInItsSandboxIsAnsweredAsItsInstructionsError) {
  HostileCard card("failop");  // its gemms fail after they were taken
  EXPECT_TRUE(card.goodFinishes(10000)) << "the other tenant was starved";
  for (int i = 0; i < 1000 && std::count_if(card.outputs.begin(), card.outputs.end(), [](auto& o) { return o.context == 1; }) < 40; ++i) {
    card.worker->drain(card.outputs);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  std::vector<std::pair<uint64_t, wire::Reply::Which>> seen;
  for (auto& o : card.outputs) {
    if (o.context != 1) continue;
    transport::MessageIn in(std::move(o.body));
    seen.emplace_back(o.sequence, in.root<wire::Reply>().which());
  }
  std::vector<std::pair<uint64_t, wire::Reply::Which>> want;
  for (uint64_t gemm = 4; gemm < 4 + 40; gemm += 2) {  // after three allocs: (gemm, fence) x 20
    want.emplace_back(gemm, wire::Reply::ERROR);
    want.emplace_back(gemm + 1, wire::Reply::FENCED);
  }
  EXPECT_EQ(seen, want);
  EXPECT_TRUE(card.faults().empty()) << "the sandbox was lost for an op's failure";
}

TEST(CardWorker, ASandboxWhoseKernelsNeverCompleteIsStoppedAtTheCallTimeout) {
  HostileCard card("stuck");
  EXPECT_TRUE(card.goodFinishes(10000)) << "the other tenant was starved";
  auto faults = card.faults();
  ASSERT_GE(faults.size(), 1u);
  EXPECT_NE(faults[0].message.find("made no progress for 1000 ms"), std::string::npos) << faults[0].message;
  EXPECT_EQ(faults[0].contexts, std::vector<uint32_t>{1});
}

// A tenant's limit on one op bounds its kernels too: past max_op_seconds without a
// completion its sandbox is stopped, however long the call timeout is.
TEST(CardWorker, AKernelRunningPastMaxOpSecondsHasItsSandboxStopped) {
  HostileCard card("stuck", 60000, 0.5);
  EXPECT_TRUE(card.goodFinishes(20000)) << "the other tenant was starved";
  auto faults = card.faults();
  ASSERT_GE(faults.size(), 1u);
  EXPECT_NE(faults[0].message.find("made no progress for 500 ms (a kernel running past max_op_seconds"), std::string::npos)
      << faults[0].message;
  EXPECT_EQ(faults[0].contexts, std::vector<uint32_t>{1});
}

// A card that runs faster than it registers (an operator's tflops below the device's own
// speed) is timed at its own: a 1000^3 gemm (2 GFLOP) is 2 ms at the 1 TFLOPS registered
// but 0.5 ms at its own 4, so a 1 ms max_op_seconds refuses it only where its own speed
// is not known. The same speed sizes its slices.
TEST(CardWorker, ACardFasterThanItRegistersIsTimedAtItsOwnSpeed) {
  for (double own : {0.0, 4.0}) {
    auto device = hal::makeCpuDevice({CardKind::gpu, "sim", 1, 1ull << 30, 1, false});
    device->setOwnTflops(own);
    CardWorker::Options options;
    options.maxOpSeconds = 0.001;
    CardWorker worker(std::move(device), [] {}, options);
    worker.openContext(1, 0, "t", 1, "t");
    uint64_t seq = 1;
    queueSizedGemms(worker, 1, 1000, 1, &seq);
    worker.submit();
    std::vector<CardWorker::Output> outputs;
    std::string refused;
    bool fenced = false;
    for (int i = 0; i < 30000 && !fenced; ++i) {
      worker.drain(outputs);
      for (auto& o : outputs) {
        transport::MessageIn in(std::move(o.body));
        auto reply = in.root<wire::Reply>();
        if (reply.which() == wire::Reply::FENCED) fenced = true;
        if (reply.which() == wire::Reply::ERROR) refused = reply.getError().getError().getMessage().cStr();
      }
      outputs.clear();
      if (!fenced) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    ASSERT_TRUE(fenced) << "own " << own;
    if (own == 0) EXPECT_NE(refused.find("about 0.002 s of this card (1 TFLOPS)"), std::string::npos) << refused;
    else EXPECT_EQ(refused, "") << "own " << own;
  }
}

TEST(CardWorker, InsideATenantTheHigherPriorityContextGoesFirst) {
  Harness h;
  h.worker.openContext(1, 0, "low", 1, "vm", 0);
  h.worker.openContext(2, 0, "high", 1, "vm", 5);
  uint64_t seq = 1;
  queueGemms(h.worker, 1, 20, &seq);
  queueGemms(h.worker, 2, 20, &seq);
  h.worker.submit();
  h.collect(40);
  ASSERT_EQ(h.outputs.size(), 40u);
  for (size_t i = 0; i < 20; ++i) EXPECT_EQ(h.outputs[i].context, 2u) << "reply " << i;
}


// A read's replies are built where they will be sent from: the link's same-host lane,
// once the context has one (opened with it, or told later), and bodies of their own
// before, or while the lane is full. The bytes are the buffer's either way.
TEST(CardWorker, ReadRepliesAreBuiltInTheContextsReplyLane) {
  Harness h;
  auto fd = transport::makeLaneMemfd(8 << 20);
  ASSERT_TRUE(fd);
  auto mapping = transport::LaneMapping::map(*fd);
  ASSERT_TRUE(mapping);
  auto lane = std::make_shared<transport::LaneOut>(*mapping);
  auto inLane = [&](const transport::Body& b) {
    return b.data() >= (*mapping)->data() && b.data() < (*mapping)->data() + (*mapping)->size();
  };
  h.worker.openContext(1, 0, "t");
  uint64_t seq = 1;
  const uint64_t bytes = 3 << 20;  // three 1 MiB replies
  h.worker.enqueue(1, seq++, instruction([&](auto in) {
    auto a = in.initAlloc();
    a.setHandle(1);
    a.setSize(bytes);
  }));
  h.worker.enqueue(1, seq++, instruction([&](auto in) {
    auto f = in.initFill();
    f.setBuffer(1), f.setOffset(0), f.setLength(bytes), f.setValue(0x5a);
  }));
  auto read = [&] {
    h.worker.enqueue(1, seq++, instruction([&](auto in) {
      auto r = in.initRead();
      r.setBuffer(1), r.setOffset(0), r.setLength(bytes);
    }));
    h.worker.submit();
    h.outputs.clear();
    h.collect(3);
    EXPECT_EQ(h.outputs.size(), 3u);
    for (auto& o : h.outputs) {
      transport::MessageView view(o.body);
      auto data = view.root<wire::Reply>().getData().getData();
      EXPECT_EQ(data.size(), 1u << 20);
      EXPECT_TRUE(std::all_of(data.begin(), data.end(), [](auto b) { return b == 0x5a; }));
    }
  };
  read();
  for (auto& o : h.outputs) EXPECT_FALSE(inLane(o.body)) << "no lane yet";
  h.worker.setReplyLane(1, lane);
  read();
  for (auto& o : h.outputs) EXPECT_TRUE(inLane(o.body));
  EXPECT_GT(lane->outstandingBytes(), 3u << 20) << "held while unsent";
  // Held replies fill the 8 MiB lane: the next ones get bodies of their own.
  std::vector<CardWorker::Output> held = std::move(h.outputs);
  read();
  read();
  size_t outside = 0;
  for (auto& o : h.outputs) outside += !inLane(o.body);
  EXPECT_GE(outside, 1u);
  held.clear();
  h.outputs.clear();
  EXPECT_EQ(lane->outstandingBytes(), 0u) << "dropped unsent: the space is free again";
  h.worker.setReplyLane(1, nullptr);
  read();
  for (auto& o : h.outputs) EXPECT_FALSE(inLane(o.body));
}

}  // namespace
}  // namespace raccel::netaccel
