#include "scheduler/pool.h"

#include <gtest/gtest.h>

#include <random>

namespace raccel::scheduler {
namespace {

CardSpec card(CardKind kind, double tflops, uint32_t index) { return CardSpec{index, kind, "m", "cpu", tflops, 1 << 30, {ProgramKind::builtin}}; }

// ARCHITECTURE.md's reference pool: 4 nodes, 200 T. Cards are listed out of kind order
// on purpose: numbering must group them GPU, NPU, FPGA, CPU.
Pool referencePool() {
  Pool pool(1.0);
  EXPECT_TRUE(pool.addNode("node0", {card(CardKind::fpga, 25, 3), card(CardKind::gpu, 9, 0), card(CardKind::npu, 20, 2),
                                     card(CardKind::gpu, 9, 1)}));
  EXPECT_TRUE(pool.addNode("node1", {card(CardKind::gpu, 10, 0), card(CardKind::gpu, 10, 1), card(CardKind::npu, 18, 2),
                                     card(CardKind::npu, 18, 3)}));
  EXPECT_TRUE(pool.addNode("node2", {card(CardKind::fpga, 8, 0), card(CardKind::fpga, 8, 1), card(CardKind::fpga, 7, 2),
                                     card(CardKind::npu, 3, 3)}));
  EXPECT_TRUE(pool.addNode("node3", {card(CardKind::gpu, 14, 0), card(CardKind::gpu, 14, 1), card(CardKind::npu, 15, 2),
                                     card(CardKind::fpga, 12, 3)}));
  return pool;
}

CardKind kindOf(const Pool& pool, uint32_t block) { return pool.cards()[pool.cardOf(block)].spec.kind; }
size_t nodeOf(const Pool& pool, uint32_t block) { return pool.cards()[pool.cardOf(block)].node; }

TEST(Pool, ReferenceFixtureNumbersFourNodesAs200Blocks) {
  Pool pool = referencePool();
  EXPECT_EQ(pool.total(), 200u);
  EXPECT_EQ(pool.nodes()[0].blocks, (BlockRange{1, 63}));
  EXPECT_EQ(pool.nodes()[1].blocks, (BlockRange{64, 56}));
  EXPECT_EQ(pool.nodes()[2].blocks, (BlockRange{120, 26}));
  EXPECT_EQ(pool.nodes()[3].blocks, (BlockRange{146, 55}));
  // node 2 was registered FPGA first; its NPU region still comes first.
  EXPECT_EQ(kindOf(pool, 120), CardKind::npu);
  EXPECT_EQ(kindOf(pool, 123), CardKind::fpga);
}

TEST(Pool, ReferenceFixture50TCardIsGpu1To18Npu19To38Fpga39To50) {
  Pool pool = referencePool();
  auto ranges = pool.allocate(1, {50, kAllKinds});
  ASSERT_TRUE(ranges) << ranges.error().message;
  ASSERT_EQ(ranges->size(), 1u);
  EXPECT_EQ((*ranges)[0], (BlockRange{1, 50}));
  for (uint32_t b = 1; b <= 50; ++b) {
    CardKind expected = b <= 18 ? CardKind::gpu : b <= 38 ? CardKind::npu : CardKind::fpga;
    EXPECT_EQ(kindOf(pool, b), expected) << "block " << b;
    EXPECT_EQ(nodeOf(pool, b), 0u) << "block " << b;
  }
  auto shares = pool.cardsOf(*ranges);
  ASSERT_EQ(shares.size(), 4u);  // GPU 9 + GPU 9 + NPU 20 + FPGA 12
  EXPECT_EQ(shares[0].blocks, 9u);
  EXPECT_EQ(shares[1].blocks, 9u);
  EXPECT_EQ(shares[2].blocks, 20u);
  EXPECT_EQ(shares[3].blocks, 12u);
  EXPECT_EQ(pool.freeBlocks(), 150u);
}

TEST(Pool, RefusesRequestLargerThanPoolWithBothNumbers) {
  Pool pool = referencePool();
  auto r = pool.allocate(1, {201, kAllKinds});
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Code::resourceExhausted);
  EXPECT_NE(r.error().message.find("can never run here"), std::string::npos);
  EXPECT_NE(r.error().message.find("201"), std::string::npos);
  EXPECT_NE(r.error().message.find("200"), std::string::npos);
}

TEST(Pool, RefusesWhenNotEnoughIsFreeAndSucceedsAfterRelease) {
  Pool pool = referencePool();
  ASSERT_TRUE(pool.allocate(1, {150, kAllKinds}));
  auto r = pool.allocate(2, {60, kAllKinds});
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message.find("50 free"), std::string::npos) << r.error().message;
  pool.release(1);
  EXPECT_EQ(pool.freeBlocks(), 200u);
  EXPECT_EQ(pool.freeRuns().size(), 1u);  // coalesced back into one range
  EXPECT_TRUE(pool.allocate(2, {60, kAllKinds}));
}

TEST(Pool, PrefersOneNodeAndOneCardWhenARangeFits) {
  Pool pool = referencePool();
  // 20 blocks: node 0's NPU card (19-38) is one card; 1-20 would span three.
  ASSERT_TRUE(pool.allocate(1, {18, kAllKinds}));  // takes node 0's GPUs 1-18
  auto r = pool.allocate(2, {20, kAllKinds});
  ASSERT_TRUE(r);
  EXPECT_EQ((*r)[0], (BlockRange{19, 20}));
  EXPECT_EQ(pool.cardsOf(*r).size(), 1u);
}

TEST(Pool, HonoursAcceptedKinds) {
  Pool pool = referencePool();
  auto r = pool.allocate(1, {30, maskOf(CardKind::fpga)});
  ASSERT_TRUE(r) << r.error().message;
  uint32_t n = 0;
  for (auto& range : *r)
    for (uint32_t b = range.first; b < range.end(); ++b, ++n) EXPECT_EQ(kindOf(pool, b), CardKind::fpga);
  EXPECT_EQ(n, 30u);
  EXPECT_EQ(pool.total(maskOf(CardKind::fpga)), 60u);
  auto tooMany = pool.allocate(2, {31, maskOf(CardKind::fpga)});
  ASSERT_FALSE(tooMany);
  EXPECT_NE(tooMany.error().message.find("30 free"), std::string::npos) << tooMany.error().message;
}

TEST(Pool, FragmentedRequestUsesFewestPieces) {
  Pool pool(1.0);
  ASSERT_TRUE(pool.addNode("n", {card(CardKind::gpu, 10, 0)}));
  ASSERT_TRUE(pool.allocate(1, {2, kAllKinds}));  // 1-2
  ASSERT_TRUE(pool.allocate(2, {2, kAllKinds}));  // 3-4
  ASSERT_TRUE(pool.allocate(3, {2, kAllKinds}));  // 5-6
  pool.release(1);
  pool.release(3);  // free: 1-2, 5-10
  auto r = pool.allocate(4, {7, kAllKinds});
  ASSERT_TRUE(r);
  ASSERT_EQ(r->size(), 2u);
  uint32_t n = 0;
  for (auto& p : *r) n += p.count;
  EXPECT_EQ(n, 7u);
}

TEST(Pool, NodeLossTakesItsBlocksOutAndRejoinBringsThemBack) {
  Pool pool = referencePool();
  ASSERT_TRUE(pool.allocate(7, {9, kAllKinds}));  // node 0 GPU card 1-9 (one card, lowest first)
  ASSERT_EQ(pool.held(7)[0], (BlockRange{1, 9}));
  auto affected = pool.removeNode(0);
  EXPECT_EQ(affected, std::vector<VaccelId>{7});
  EXPECT_EQ(pool.total(), 137u);
  EXPECT_EQ(pool.freeBlocks(), 137u);
  pool.release(7);
  EXPECT_EQ(pool.freeBlocks(), 137u);  // offline blocks do not come back as free
  ASSERT_TRUE(pool.addNode("node0", {card(CardKind::fpga, 25, 3), card(CardKind::gpu, 9, 0), card(CardKind::npu, 20, 2),
                                     card(CardKind::gpu, 9, 1)}));
  EXPECT_EQ(pool.total(), 200u);
  EXPECT_EQ(pool.freeBlocks(), 200u);
  EXPECT_EQ(pool.nodes().size(), 4u);
  EXPECT_FALSE(pool.addNode("node0", {}));  // already online
}

TEST(Pool, RandomAllocateReleaseNeverDoubleAllocates) {
  Pool pool = referencePool();
  std::mt19937 rng(42);
  std::vector<VaccelId> live;
  VaccelId next = 1;
  for (int step = 0; step < 3000; ++step) {
    if (!live.empty() && (rng() % 2 == 0)) {
      size_t i = rng() % live.size();
      pool.release(live[i]);
      live.erase(live.begin() + i);
    } else {
      KindMask kinds = rng() % 3 == 0 ? maskOf(static_cast<CardKind>(rng() % 3)) : kAllKinds;
      auto r = pool.allocate(next, {1 + static_cast<uint32_t>(rng() % 40), kinds});
      if (r) live.push_back(next);
      ++next;
    }
    uint32_t owned = 0;
    for (uint32_t b = 1; b <= pool.highestBlock(); ++b) {
      bool free = pool.isFree(b);
      ASSERT_NE(free, pool.ownerOf(b) != kNoOwner) << "block " << b << " step " << step;
      owned += !free;
    }
    ASSERT_EQ(owned + pool.freeBlocks(), 200u);
  }
}

}  // namespace
}  // namespace raccel::scheduler
