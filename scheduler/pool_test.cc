#include "scheduler/pool.h"
#include "scheduler/admission.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "common/limits.h"

namespace raccel::scheduler {
namespace {

CardSpec card(CardKind kind, double tflops, uint32_t index) { return CardSpec{index, kind, "m", "cpu", tflops, 1 << 30, {ProgramKind::builtin}}; }

// Shaped requests: `milli` thousandths of one card; `cards` whole cards of one node.
Pool::Request shareOf(uint32_t milli, HostVector host = {}) {
  Pool::Request r;
  r.shape = Pool::Shape::oneCard;
  r.cardMilli = milli;
  r.host = host;
  return r;
}
Pool::Request wholeOf(uint32_t cards, HostVector host = {}) {
  Pool::Request r;
  r.shape = Pool::Shape::wholeCards;
  r.wholeCards = cards;
  r.host = host;
  return r;
}

// docs/ARCHITECTURE.md's reference pool: 4 nodes, 200 T. Cards are listed out of kind order
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

TEST(Pool, DrainingNodeGetsNothingNewAndKeepsItsHolders) {
  Pool pool(1.0);
  ASSERT_TRUE(pool.addNode("a", {card(CardKind::cpu, 4, 0)}));
  ASSERT_TRUE(pool.addNode("b", {card(CardKind::cpu, 4, 0)}));
  auto held = pool.allocate(1, {2});
  ASSERT_TRUE(held);
  EXPECT_EQ((*held)[0].first, 1u);  // node a
  pool.setDraining(0, true);
  EXPECT_EQ(pool.total(), 4u);
  EXPECT_EQ(pool.freeBlocks(), 4u);
  EXPECT_EQ(pool.held(1), *held);  // its holder keeps its blocks until moved
  auto moved = pool.allocate(2, {3});
  ASSERT_TRUE(moved);
  EXPECT_EQ(nodeOf(pool, (*moved)[0].first), 1u);
  pool.release(1);
  EXPECT_EQ(pool.freeBlocks(), 1u) << "released blocks of a draining node stay out of the pool";
  EXPECT_FALSE(pool.allocate(3, {2}));
  pool.setDraining(0, false);
  EXPECT_EQ(pool.freeBlocks(), 5u);
  EXPECT_EQ(pool.total(), 8u);
  EXPECT_TRUE(pool.allocate(3, {4}));
}

// What a request that does not fit is told: never (past every known node), or not now,
// expecting back only offline nodes (a draining one is not coming back by itself).
TEST(Pool, ShortfallCountsOfflineNodesAsExpectedBackAndDrainingOnesNot) {
  Pool pool(1.0);
  ASSERT_TRUE(pool.addNode("a", {card(CardKind::cpu, 4, 0)}));
  ASSERT_TRUE(pool.addNode("b", {card(CardKind::cpu, 4, 0)}));
  EXPECT_FALSE(pool.shortfall(8, kAllKinds));
  pool.removeNode(1);
  auto away = pool.shortfall(6, kAllKinds);
  ASSERT_TRUE(away);
  EXPECT_FALSE(away->never);
  EXPECT_TRUE(away->expectedBack);
  EXPECT_EQ(away->why, "not now: 6 blocks requested, 4 of the accepted kinds take work now and 4 more are on "
                       "netaccels that take none (b offline)");
  EXPECT_TRUE(pool.shortfall(9, kAllKinds)->never);
  pool.setDraining(0, true);
  away = pool.shortfall(6, kAllKinds);
  ASSERT_TRUE(away);
  EXPECT_FALSE(away->expectedBack) << "a: draining, b: offline; b alone holds 4";
  EXPECT_FALSE(away->never);
  EXPECT_TRUE(pool.shortfall(4, kAllKinds)->expectedBack);
}

TEST(Pool, SetPriorityChangesWhoIsPreempted) {
  Pool pool(1.0);
  ASSERT_TRUE(pool.addNode("a", {card(CardKind::cpu, 4, 0)}));
  ASSERT_TRUE(pool.allocate(1, {2, kAllKinds, 3}));
  ASSERT_TRUE(pool.allocate(2, {2, kAllKinds, 1}));
  auto plan = pool.planPreemption({2, kAllKinds, 5});
  ASSERT_TRUE(plan);
  EXPECT_EQ(*plan, std::vector<VaccelId>{2});
  pool.setPriority(1, 0);
  plan = pool.planPreemption({2, kAllKinds, 5});
  ASSERT_TRUE(plan);
  EXPECT_EQ(*plan, std::vector<VaccelId>{1});
  EXPECT_EQ(pool.priorityOf(1), 0);
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
    if (step % 7 == 0) {
      // Compaction never overlaps holders, never loses a block, and leaves each moved
      // holder on one range.
      for (auto& move : pool.planCompaction(static_cast<size_t>(rng() % 4))) {
        ASSERT_TRUE(pool.applyMove(move)) << "step " << step;
        ASSERT_EQ(pool.held(move.owner).size(), 1u);
      }
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

// docs/ARCHITECTURE.md's migration fixture: a 10-block pool; app1 holds 1-3, app2 4-6, app3
// 7-8, 9-10 free; app1 exits; app4 asks for 4. After migration app2 holds 1-3, app3 4-5,
// app4 6-9, and block 10 is free.
TEST(Pool, MigrationFixtureTenBlocks) {
  Pool pool(1.0);
  ASSERT_TRUE(pool.addNode("node0", {card(CardKind::gpu, 10, 0)}));
  const VaccelId app1 = 1, app2 = 2, app3 = 3, app4 = 4;
  ASSERT_EQ(*pool.allocate(app1, {3}), (std::vector<BlockRange>{{1, 3}}));
  ASSERT_EQ(*pool.allocate(app2, {3}), (std::vector<BlockRange>{{4, 3}}));
  ASSERT_EQ(*pool.allocate(app3, {2}), (std::vector<BlockRange>{{7, 2}}));
  pool.release(app1);
  EXPECT_EQ(pool.freeRuns(), (std::map<uint32_t, uint32_t>{{1, 3}, {9, 2}}));

  auto moves = pool.planCompaction();
  ASSERT_EQ(moves.size(), 2u);
  EXPECT_EQ(moves[0].owner, app2);
  EXPECT_EQ(moves[0].to, (BlockRange{1, 3}));
  EXPECT_EQ(moves[1].owner, app3);
  EXPECT_EQ(moves[1].to, (BlockRange{4, 2}));
  for (auto& m : moves) ASSERT_TRUE(pool.applyMove(m));
  auto app4Blocks = pool.allocate(app4, {4});
  ASSERT_TRUE(app4Blocks);
  EXPECT_EQ(pool.held(app2), (std::vector<BlockRange>{{1, 3}}));
  EXPECT_EQ(pool.held(app3), (std::vector<BlockRange>{{4, 2}}));
  EXPECT_EQ(*app4Blocks, (std::vector<BlockRange>{{6, 4}}));
  EXPECT_EQ(pool.freeRuns(), (std::map<uint32_t, uint32_t>{{10, 1}}));
  EXPECT_TRUE(pool.planCompaction().empty()) << "a compact pool plans no moves";
}

TEST(Pool, CompactionRespectsItsLimitsAndStaleMovesAreRefused) {
  Pool pool(1.0);
  ASSERT_TRUE(pool.addNode("node0", {card(CardKind::gpu, 10, 0)}));
  ASSERT_TRUE(pool.allocate(1, {3}));
  ASSERT_TRUE(pool.allocate(2, {3}));
  ASSERT_TRUE(pool.allocate(3, {2}));
  pool.release(1);
  auto one = pool.planCompaction(1);
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0].owner, 2u);
  // Holders larger than the per-move limit stay; the others flow after them.
  auto small = pool.planCompaction(0, 2);
  ASSERT_EQ(small.size(), 0u) << "app3 cannot pass app2, which may not move";
  ASSERT_TRUE(pool.applyMove(one[0]));
  EXPECT_FALSE(pool.applyMove(one[0])) << "a move planned before another applied is stale";
}

TEST(Pool, CompactionStaysInsideANodesRegionOfOneKind) {
  Pool pool(1.0);
  ASSERT_TRUE(pool.addNode("node0", {card(CardKind::gpu, 4, 0), card(CardKind::npu, 4, 1)}));
  ASSERT_TRUE(pool.allocate(1, {2, maskOf(CardKind::gpu)}));  // 1-2
  ASSERT_TRUE(pool.allocate(2, {2, maskOf(CardKind::gpu)}));  // 3-4
  ASSERT_TRUE(pool.allocate(3, {2, maskOf(CardKind::npu)}));  // 5-6
  pool.release(1);
  auto moves = pool.planCompaction();
  ASSERT_EQ(moves.size(), 1u);
  EXPECT_EQ(moves[0].owner, 2u);
  EXPECT_EQ(moves[0].to, (BlockRange{1, 2}));  // not into the npu region
}

// CI's sanitizer build caught it on the Philly slice: a holder that stays with a far
// range moves the cursor near the region's end, and a later holder's target ran past it,
// into the next node's blocks (and past the pool's last block).
TEST(Pool, CompactionNeverPlansAMovePastItsRegionsEnd) {
  Pool pool(1.0);
  ASSERT_TRUE(pool.addNode("node0", {card(CardKind::gpu, 8, 0)}));  // blocks 1-8
  ASSERT_TRUE(pool.addNode("node1", {card(CardKind::gpu, 8, 0)}));  // blocks 9-16, free
  ASSERT_TRUE(pool.assign(1, {{1, 1}, {7, 2}}, 0));  // 1 and 7-8: stays (2 is in the way)
  ASSERT_TRUE(pool.assign(2, {{3, 2}}, 0));          // 3-4: room only at 9, on node1
  for (auto& move : pool.planCompaction()) {
    EXPECT_LE(move.to.end(), 9u) << "vaccel " << move.owner << " planned onto node1's blocks from " << move.to.first;
    ASSERT_TRUE(pool.applyMove(move));
  }
  // On the last node, the same shape would have read past the pool's last block.
  Pool last(1.0);
  ASSERT_TRUE(last.addNode("node0", {card(CardKind::gpu, 8, 0)}));
  ASSERT_TRUE(last.assign(1, {{1, 1}, {7, 2}}, 0));
  ASSERT_TRUE(last.assign(2, {{3, 2}}, 0));
  EXPECT_TRUE(last.planCompaction().empty());
}

TEST(Pool, PreemptionTakesLowestPriorityThenMostRecent) {
  Pool pool(1.0);
  ASSERT_TRUE(pool.addNode("node0", {card(CardKind::gpu, 10, 0)}));
  ASSERT_TRUE(pool.allocate(1, {3, kAllKinds, 1}));  // priority 1, first
  ASSERT_TRUE(pool.allocate(2, {3, kAllKinds, 0}));  // priority 0, second
  ASSERT_TRUE(pool.allocate(3, {3, kAllKinds, 0}));  // priority 0, third (most recent)
  ASSERT_TRUE(pool.allocate(4, {1, kAllKinds, 5}));  // priority 5
  EXPECT_EQ(pool.freeBlocks(), 0u);

  auto fits = pool.planPreemption({0, kAllKinds, 9});
  ASSERT_TRUE(fits);
  EXPECT_TRUE(fits->empty());
  auto a = pool.planPreemption({3, kAllKinds, 2});
  ASSERT_TRUE(a);
  EXPECT_EQ(*a, (std::vector<VaccelId>{3}));
  auto b = pool.planPreemption({5, kAllKinds, 2});
  ASSERT_TRUE(b);
  EXPECT_EQ(*b, (std::vector<VaccelId>{3, 2}));
  auto c = pool.planPreemption({9, kAllKinds, 2});
  ASSERT_TRUE(c);
  EXPECT_EQ(*c, (std::vector<VaccelId>{3, 2, 1}));
  // Equal priority is never preempted; the refusal gives the numbers.
  auto d = pool.planPreemption({10, kAllKinds, 2});
  ASSERT_FALSE(d);
  EXPECT_NE(d.error().message.find("10 blocks requested, 9 free or held by work it outranks"), std::string::npos)
      << d.error().message;
  auto e = pool.planPreemption({1, kAllKinds, 0});
  ASSERT_FALSE(e);
  auto never = pool.planPreemption({11, kAllKinds, 9});
  ASSERT_FALSE(never);
  EXPECT_NE(never.error().message.find("can never run here"), std::string::npos);
}

TEST(Pool, PreemptionUnderANodeLimitTakesItsVictimsFromFewNodes) {
  // a: [1: 2 blocks, admitted first | 2 free]; b: [2 | 3, the most recent].
  Pool pool(1.0);
  ASSERT_TRUE(pool.addNode("a", {card(CardKind::gpu, 4, 0)}));
  ASSERT_TRUE(pool.addNode("b", {card(CardKind::gpu, 4, 0)}));
  ASSERT_TRUE(pool.assign(1, {{1, 2}}, 0));
  ASSERT_TRUE(pool.assign(2, {{5, 2}}, 0));
  ASSERT_TRUE(pool.assign(3, {{7, 2}}, 0));
  Pool::Request oneNode{4, kAllKinds, 1};
  oneNode.maxNodes = 1;
  // Pool-wide, suspending 3 frees enough blocks, but on no single node: the plan takes
  // from one node instead, the one where the least is suspended.
  auto plan = pool.planPreemption(oneNode);
  ASSERT_TRUE(plan) << plan.error().message;
  EXPECT_EQ(*plan, (std::vector<VaccelId>{1}));
  pool.release(1);
  auto placed = pool.allocate(4, oneNode);
  ASSERT_TRUE(placed) << placed.error().message;
  EXPECT_EQ(*placed, (std::vector<BlockRange>{{1, 4}}));
}

TEST(Pool, PreemptionUnderANodeLimitSeesFreeBlocksSplitAcrossNodes) {
  // 6 blocks free in all, 3 on each node: a 4-block request for one node still needs a
  // victim (the old plan said "it fits" and it then waited for ever).
  Pool pool(1.0);
  ASSERT_TRUE(pool.addNode("a", {card(CardKind::gpu, 4, 0)}));
  ASSERT_TRUE(pool.addNode("b", {card(CardKind::gpu, 4, 0)}));
  ASSERT_TRUE(pool.assign(1, {{1, 1}}, 0));
  ASSERT_TRUE(pool.assign(2, {{5, 1}}, 0));
  Pool::Request oneNode{4, kAllKinds, 1};
  oneNode.maxNodes = 1;
  auto plan = pool.planPreemption(oneNode);
  ASSERT_TRUE(plan) << plan.error().message;
  EXPECT_EQ(*plan, (std::vector<VaccelId>{2})) << "the most recently admitted of two equal plans";
  // Without the limit it fits in free blocks already.
  auto anywhere = pool.planPreemption({4, kAllKinds, 1});
  ASSERT_TRUE(anywhere);
  EXPECT_TRUE(anywhere->empty());
}

TEST(Pool, PreemptionSparesVictimsThePlacementDoesNotUse) {
  // a: [1: 4 blocks]; b: [2: 2 blocks | 2 free]; c: [3: 3 blocks, priority 1 | 4: 1 block,
  // the most recent]. Pool-wide, 4 then 2 are taken; the request then lands on b, so 4
  // is spared.
  Pool pool(1.0);
  for (const char* name : {"a", "b", "c"}) ASSERT_TRUE(pool.addNode(name, {card(CardKind::gpu, 4, 0)}));
  ASSERT_TRUE(pool.assign(1, {{1, 4}}, 0));
  ASSERT_TRUE(pool.assign(2, {{5, 2}}, 0));
  ASSERT_TRUE(pool.assign(3, {{9, 3}}, 1));
  ASSERT_TRUE(pool.assign(4, {{12, 1}}, 0));
  Pool::Request oneNode{4, kAllKinds, 1};
  oneNode.maxNodes = 1;
  auto plan = pool.planPreemption(oneNode);
  ASSERT_TRUE(plan) << plan.error().message;
  EXPECT_EQ(*plan, (std::vector<VaccelId>{2}));
  // With no victim on one node able to make room, it is refused with the reason.
  Pool::Request tooHigh{4, kAllKinds, 0};
  tooHigh.maxNodes = 1;
  auto none = pool.planPreemption(tooHigh);
  ASSERT_FALSE(none);
}

TEST(Pool, PreemptionCountsOnlyAcceptedKinds) {
  Pool pool(1.0);
  ASSERT_TRUE(pool.addNode("node0", {card(CardKind::gpu, 4, 0), card(CardKind::npu, 4, 1)}));
  ASSERT_TRUE(pool.allocate(1, {4, maskOf(CardKind::npu), 0}));  // the npu card, admitted first
  ASSERT_TRUE(pool.allocate(2, {4, maskOf(CardKind::gpu), 0}));  // the gpu card, most recent
  auto gpu = pool.planPreemption({2, maskOf(CardKind::npu), 1});
  ASSERT_TRUE(gpu);
  EXPECT_EQ(*gpu, (std::vector<VaccelId>{1})) << "the gpu holder frees nothing an npu request can use";
}

}  // namespace
TEST(Pool, OneCardRequestTakesItsShareOfOneCardRoundedUpToBlocks) {
  Pool pool(1.0);
  ASSERT_TRUE(pool.addNode("a", {card(CardKind::gpu, 8, 0), card(CardKind::gpu, 15, 1)}));
  Pool::Request r = shareOf(460);  // 0.46 of an 8-block card: 4 blocks; of a 15-block card: 7
  auto got = pool.allocate(1, r);
  ASSERT_TRUE(got) << got.error().message;
  auto cards = pool.cardsOf(*got);
  ASSERT_EQ(cards.size(), 1u);
  EXPECT_EQ(cards[0].blocks, Pool::blocksOfCard(460, pool.cards()[cards[0].card].blocks.count));
  EXPECT_EQ(Pool::blocksOfCard(460, 8), 4u);
  EXPECT_EQ(Pool::blocksOfCard(460, 15), 7u);
  EXPECT_EQ(Pool::blocksOfCard(1000, 15), 15u);
  r.cardMilli = 0;
  EXPECT_EQ(pool.allocate(2, r).error().code, Code::invalidArgument);
  r.cardMilli = 1001;
  EXPECT_EQ(pool.allocate(2, r).error().code, Code::invalidArgument);
}

TEST(Pool, WholeCardsComeFromOneNodeAndTheFilterIsObeyed) {
  Pool pool(1.0);
  ASSERT_TRUE(pool.addNode("a", {card(CardKind::gpu, 10, 0), card(CardKind::gpu, 10, 1)}));
  ASSERT_TRUE(pool.addNode("b", {card(CardKind::gpu, 10, 0), card(CardKind::gpu, 10, 1), card(CardKind::gpu, 10, 2)}));
  Pool::Request r = wholeOf(3);
  auto got = pool.allocate(1, r);
  ASSERT_TRUE(got) << got.error().message;
  EXPECT_EQ(*got, (std::vector<BlockRange>{{21, 30}}));  // all of node b
  r.wholeCards = 3;
  auto never = pool.allocate(2, r);  // node a has only 2 cards and b is full
  ASSERT_FALSE(never);
  EXPECT_EQ(never.error().code, Code::resourceExhausted);
  r.wholeCards = 1;
  r.accepts = [](const Card& c) { return c.spec.index == 1; };
  got = pool.allocate(3, r);
  ASSERT_TRUE(got);
  EXPECT_EQ(*got, (std::vector<BlockRange>{{11, 10}}));  // node a's card 1, not card 0
  r.accepts = [](const Card&) { return false; };
  auto refused = pool.allocate(4, r);
  ASSERT_FALSE(refused);
  EXPECT_NE(refused.error().message.find("can never run here"), std::string::npos) << refused.error().message;
}

TEST(Pool, RaccelFitKeepsWholeCardsFreeForWholeCardDemand) {
  // Demand seen: whole cards. A share then goes to the card already in use, not to a
  // whole free one; first-fit takes the lowest card.
  for (auto fit : {Pool::Fit::raccel, Pool::Fit::firstFit}) {
    Pool pool(1.0);
    pool.setFit(fit);
    ASSERT_TRUE(pool.addNode("a", {card(CardKind::gpu, 10, 0), card(CardKind::gpu, 10, 1)}));
    Pool::Request whole = wholeOf(1);
    for (VaccelId v = 100; v < 120; ++v) (void)pool.allocate(v, whole);  // refused (still learned as demand) after two
    pool.release(100);
    pool.release(101);
    Pool::Request share = shareOf(300);
    share.accepts = [](const Card& c) { return c.spec.index == 1; };
    ASSERT_TRUE(pool.allocate(1, share));  // 3 blocks of card 1
    share.accepts = nullptr;
    share.cardMilli = 500;
    auto second = pool.allocate(2, share);
    ASSERT_TRUE(second);
    bool sameCard = pool.cardOf(second->front().first) == pool.cardOf(pool.held(1).front().first);
    if (fit == Pool::Fit::raccel) EXPECT_TRUE(sameCard) << "raccel keeps the other card whole";
    else EXPECT_FALSE(sameCard) << "first fit takes the lowest card, breaking the whole one";
  }
}

TEST(Pool, RaccelFitKeepsTheCardsThatPinnedDemandNeedsForIt) {
  // Demand seen: shares that only a V100 takes (a model pinned, as openb's gpu_spec
  // pods), and whole cards of any model. A share of any model then goes to the T4 and
  // leaves the V100 for the pinned demand; first-fit takes the lowest card, the V100.
  auto model = [](const char* name) {
    CardSpec c = card(CardKind::gpu, 10, 0);
    c.model = name;
    return c;
  };
  for (auto fit : {Pool::Fit::raccel, Pool::Fit::firstFit}) {
    Pool pool(1.0);
    pool.setFit(fit);
    ASSERT_TRUE(pool.addNode("a", {model("V100")}));
    ASSERT_TRUE(pool.addNode("b", {model("T4")}));
    Pool::Request pinned = shareOf(400);
    pinned.accepts = [](const Card& c) { return c.spec.model == "V100"; };
    for (VaccelId v = 100; v < 120; ++v) (void)pool.allocate(v, pinned);  // two fit; all are learned as demand
    for (VaccelId v = 100; v < 120; ++v) pool.release(v);
    ASSERT_EQ(pool.freeBlocks(), 20u);
    auto any = pool.allocate(1, shareOf(400));
    ASSERT_TRUE(any) << any.error().message;
    const std::string took = pool.cards()[pool.cardOf(any->front().first)].spec.model;
    if (fit == Pool::Fit::raccel) EXPECT_EQ(took, "T4") << "raccel keeps the V100 for the demand only it can serve";
    else EXPECT_EQ(took, "V100") << "first fit takes the lowest card";
    // And whole-card demand of any model does not count the model against a card.
    auto whole = pool.allocate(2, wholeOf(1));
    ASSERT_TRUE(whole) << whole.error().message;
  }
}

TEST(Pool, RaccelFitLeavesAScarceModelToTheDemandPinnedToIt) {
  // Demand seen: half-card shares pinned to the one T4, and 0.6-card shares of any
  // model, in a pool of one T4 and four G2s. The T4 has 0.6 free. FGD's measure alone
  // fills it with the next 0.6 share of any model (nothing is left there to fragment),
  // and the next pinned share then has nowhere to go. raccel counts the pinned demand's
  // claim on the scarce model and takes a G2, so both are placed.
  auto model = [](const char* name, uint32_t index) {
    CardSpec c = card(CardKind::gpu, 10, index);
    c.model = name;
    return c;
  };
  Pool pool(1.0);
  pool.setFit(Pool::Fit::raccel);
  ASSERT_TRUE(pool.addNode("a", {model("T4", 0)}));
  ASSERT_TRUE(pool.addNode("b", {model("G2", 0), model("G2", 1), model("G2", 2), model("G2", 3)}));
  auto pinnedOf = [](uint32_t milli) {
    Pool::Request r = shareOf(milli);
    r.accepts = [](const Card& c) { return c.spec.model == "T4"; };
    return r;
  };
  for (VaccelId v = 100; v < 106; ++v) (void)pool.allocate(v, pinnedOf(500));
  for (VaccelId v = 106; v < 126; ++v) (void)pool.allocate(v, shareOf(600));
  for (VaccelId v = 100; v < 126; ++v) pool.release(v);
  ASSERT_EQ(pool.freeBlocks(), 50u);
  auto model_of = [&](const std::vector<BlockRange>& r) { return pool.cards()[pool.cardOf(r.front().first)].spec.model; };
  auto first = pool.allocate(1, pinnedOf(400));
  ASSERT_TRUE(first) << first.error().message;
  ASSERT_EQ(model_of(*first), "T4");
  auto any = pool.allocate(2, shareOf(600));
  ASSERT_TRUE(any) << any.error().message;
  EXPECT_EQ(model_of(*any), "G2") << "the T4's free 0.6 is the pinned demand's";
  auto pinned = pool.allocate(3, pinnedOf(500));
  ASSERT_TRUE(pinned) << "a pinned share still finds its model: " << pinned.error().message;
  EXPECT_EQ(model_of(*pinned), "T4");
  // The claim orders places; it never refuses one. With the G2s full, work of any model
  // takes what is left of the T4.
  pool.release(3);
  for (VaccelId v = 4; v < 7; ++v) ASSERT_TRUE(pool.allocate(v, shareOf(1000)));
  auto last = pool.allocate(7, shareOf(400));
  ASSERT_TRUE(last) << last.error().message;
  EXPECT_EQ(model_of(*last), "G2") << "the G2 with 0.4 free";
  auto onT4 = pool.allocate(8, shareOf(600));
  ASSERT_TRUE(onT4) << onT4.error().message;
  EXPECT_EQ(model_of(*onT4), "T4");
}

TEST(Pool, MaxNodesRefusesAPlacementThatWouldSpanMoreNodes) {
  Pool pool(1.0);
  for (const char* name : {"a", "b", "c"}) ASSERT_TRUE(pool.addNode(name, {card(CardKind::gpu, 10, 0)}));
  EXPECT_EQ(pool.fewestNodesFor(10), 1u);
  EXPECT_EQ(pool.fewestNodesFor(11), 2u);
  EXPECT_EQ(pool.fewestNodesFor(31), 0u);
  ASSERT_TRUE(pool.allocate(1, {6, kAllKinds}));   // a: 1-6
  ASSERT_TRUE(pool.allocate(2, {10, kAllKinds}));  // all of c (one node beats straddling a and b)
  ASSERT_TRUE(pool.allocate(3, {6, kAllKinds}));   // b: 15-20
  Pool::Request spread{8, kAllKinds};               // free: 4 on a, 4 on b: two nodes
  spread.maxNodes = 1;
  auto refused = pool.allocate(4, spread);
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code, Code::resourceExhausted);
  EXPECT_NE(refused.error().message.find("span 2"), std::string::npos) << refused.error().message;
  EXPECT_EQ(pool.freeBlocks(), 8u) << "a refusal takes nothing";
  spread.maxNodes = 2;
  auto placed = pool.allocate(4, spread);
  ASSERT_TRUE(placed) << placed.error().message;
  EXPECT_EQ(pool.cardsOf(*placed).size(), 2u);
}

TEST(Pool, PreemptionPlanRespectsTheRequestsNodeLimit) {
  Pool pool(1.0);
  for (const char* name : {"a", "b"}) ASSERT_TRUE(pool.addNode(name, {card(CardKind::gpu, 10, 0)}));
  ASSERT_TRUE(pool.allocate(1, {5, kAllKinds, 0}));  // low priority: a 1-5
  ASSERT_TRUE(pool.assign(2, {{16, 5}}, 5));         // high priority: b 16-20
  Pool::Request big{15, kAllKinds, 3};
  auto plan = pool.planPreemption(big);  // suspending 1 frees 10 + 5 = 15 over two nodes
  ASSERT_TRUE(plan) << plan.error().message;
  EXPECT_EQ(*plan, std::vector<VaccelId>{1});
  big.maxNodes = 1;  // but not on one node: nobody is suspended for nothing
  auto limited = pool.planPreemption(big);
  ASSERT_FALSE(limited);
  EXPECT_EQ(limited.error().code, Code::resourceExhausted);
  EXPECT_EQ(pool.held(1).size(), 1u) << "planning changes nothing";
}

}  // namespace raccel::scheduler

namespace raccel::scheduler {
namespace {

TEST(PoolLimits, AbsurdCardsAreRefusedNamingTheFieldAndBlockCountsNeverWrap) {
  Pool pool;
  for (double tflops : {1e30, std::nan(""), -1.0, 65537.0, 4294967296.0 + 16}) {
    auto added = pool.addNode("n", {card(CardKind::gpu, tflops, 0)});
    ASSERT_FALSE(added) << tflops;
    EXPECT_NE(added.error().message.find("card 0 tflops must be a finite number from 0 to 65536"), std::string::npos)
        << added.error().message;
  }
  EXPECT_FALSE(pool.addNode("bad name", {card(CardKind::gpu, 4, 0)}));
  EXPECT_FALSE(pool.addNode("twins", {card(CardKind::gpu, 4, 0), card(CardKind::gpu, 4, 0)}));
  std::vector<CardSpec> many(17, card(CardKind::gpu, 65536, 0));
  for (uint32_t i = 0; i < many.size(); ++i) many[i].index = i;
  auto tooBig = pool.addNode("big", many);  // 17 * 2^16 blocks > 2^20 per node
  ASSERT_FALSE(tooBig);
  EXPECT_NE(tooBig.error().message.find("at most 1048576 per node"), std::string::npos) << tooBig.error().message;
  EXPECT_EQ(pool.total(), 0u);
  // Requests: never 0 blocks, never wrapped; above any pool for sizes no pool holds.
  EXPECT_EQ(pool.blocksFor(1e-300), 1u);
  EXPECT_EQ(pool.blocksFor(std::nan("")), 1u);
  EXPECT_GT(pool.blocksFor(4294967296.0 + 16), limits::kMaxPoolBlocks);
  EXPECT_GT(pool.blocksFor(1e308), limits::kMaxPoolBlocks);
}

TEST(PoolLimits, ForgettingTheLastOfflineNodeGivesItsNumbersBack) {
  Pool pool;
  ASSERT_TRUE(pool.addNode("a", {card(CardKind::gpu, 4, 0)}));
  ASSERT_TRUE(pool.addNode("b", {card(CardKind::gpu, 8, 0)}));
  EXPECT_FALSE(pool.forgetNode(1));  // online
  pool.removeNode(1);
  EXPECT_TRUE(pool.forgetNode(1));
  EXPECT_EQ(pool.nodes().size(), 1u);
  EXPECT_EQ(pool.cards().size(), 1u);
  // The next node takes the numbers b had; a node in the middle keeps its own unused.
  auto c = pool.addNode("c", {card(CardKind::gpu, 2, 0)});
  ASSERT_TRUE(c);
  EXPECT_EQ(pool.nodes()[*c].blocks.first, 5u);
  ASSERT_TRUE(pool.addNode("d", {card(CardKind::gpu, 2, 0)}));
  pool.removeNode(0);
  EXPECT_TRUE(pool.forgetNode(0));
  EXPECT_TRUE(pool.nodes()[0].forgotten);
  EXPECT_EQ(pool.nodes().size(), 3u);
  EXPECT_EQ(pool.total(), 4u);
  auto a = pool.addNode("a", {card(CardKind::gpu, 4, 0)});  // the name is free again: new numbers
  ASSERT_TRUE(a);
  EXPECT_EQ(pool.nodes()[*a].blocks.first, 9u);
}

}  // namespace
namespace {

TEST(Pool, SharesOfACardAreCountedInThousandthsNotRoundedBlocks) {
  // Two halves of a 15-block card: rounded up to blocks each would need 8 (16 > 15);
  // counted in thousandths they fit, the second taking the remaining 7.
  Pool pool(1.0);
  ASSERT_TRUE(pool.addNode("a", {card(CardKind::gpu, 15.7, 0)}));
  Pool::Request half = shareOf(500);
  auto first = pool.allocate(1, half);
  auto second = pool.allocate(2, half);
  ASSERT_TRUE(first && second) << (first ? second.error().message : first.error().message);
  EXPECT_EQ(pool.cardsOf(*first)[0].blocks, 8u);
  EXPECT_EQ(pool.cardsOf(*second)[0].blocks, 7u);
  EXPECT_EQ(pool.cardFreeMilli(0), 0u);
  half.cardMilli = 1;
  EXPECT_EQ(pool.allocate(3, half).error().code, Code::resourceExhausted) << "the card's thousandths are all taken";
  // Ten tenths less a bit: blocks alternate so that the ten hold 15 between them.
  pool.release(1);
  pool.release(2);
  EXPECT_EQ(pool.cardFreeMilli(0), 1000u);
  half.cardMilli = 99;
  uint32_t blocks = 0;
  for (VaccelId v = 10; v < 20; ++v) {
    auto got = pool.allocate(v, half);
    ASSERT_TRUE(got) << "share " << v - 10 << ": " << got.error().message;
    blocks += pool.cardsOf(*got)[0].blocks;
  }
  EXPECT_EQ(blocks, 15u);  // ceil(990 x 15 / 1000)
  EXPECT_EQ(pool.cardFreeMilli(0), 0u) << "no block is left, so no share fits";
  // A whole-card request needs the card free of shares.
  Pool::Request whole = wholeOf(1);
  EXPECT_FALSE(pool.allocate(30, whole));
  for (VaccelId v = 10; v < 20; ++v) pool.release(v);
  EXPECT_TRUE(pool.allocate(30, whole));
}

TEST(Pool, SharesCountOnlyTheBlocksOthersLeave) {
  // A spread holder takes 10 of 15 blocks: the card's shares may have 5 blocks' worth.
  Pool pool(1.0);
  ASSERT_TRUE(pool.addNode("a", {card(CardKind::gpu, 15, 0)}));
  ASSERT_TRUE(pool.allocate(1, {10, kAllKinds}));
  EXPECT_EQ(pool.cardFreeMilli(0), 333u);
  Pool::Request share = shareOf(334);
  EXPECT_FALSE(pool.allocate(2, share));
  share.cardMilli = 300;
  auto got = pool.allocate(2, share);
  ASSERT_TRUE(got);
  EXPECT_EQ(pool.cardsOf(*got)[0].blocks, 5u);  // ceil(4.5)
}

TEST(Pool, HostNeedsBindARequestToANodeWithRoomAndAreReturnedOnRelease) {
  Pool pool(1.0);
  ASSERT_TRUE(pool.addNode("small", {card(CardKind::gpu, 10, 0)}, HostVector{4000, 8192}));
  ASSERT_TRUE(pool.addNode("big", {card(CardKind::gpu, 10, 0)}, HostVector{16000, 65536}));
  Pool::Request r{4, kAllKinds, 0};
  r.host = {6000, 1024};  // more CPU than "small" has
  auto got = pool.allocate(1, r);
  ASSERT_TRUE(got) << got.error().message;
  EXPECT_EQ(pool.cardsOf(*got)[0].card, 1u) << "placed on the node whose host has room";
  EXPECT_EQ(pool.nodes()[1].hostUsed, (HostVector{6000, 1024}));
  // 10 blocks would fit across the two nodes, but host needs keep it on one: "big" has 6.
  r.blocks = 10;
  r.host = {1000, 1024};
  auto split = pool.allocate(2, r);
  ASSERT_TRUE(split) << split.error().message;
  EXPECT_EQ(pool.cardsOf(*split).size(), 1u);
  EXPECT_EQ(pool.cardsOf(*split)[0].card, 0u) << "all of small's card, not spread over both";
  // Nothing has the host left: refused with the numbers.
  r.blocks = 1;
  r.host = {20000, 0};
  auto refused = pool.allocate(3, r);
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code, Code::resourceExhausted);
  EXPECT_NE(refused.error().message.find("20000 milli-CPU"), std::string::npos) << refused.error().message;
  pool.release(1);
  EXPECT_EQ(pool.nodes()[1].hostUsed, (HostVector{0, 0}));
  // Shaped requests too: a share that needs more memory than "small" has goes to "big".
  pool.release(2);
  Pool::Request share = shareOf(200, {1000, 16384});
  auto placed = pool.allocate(4, share);
  ASSERT_TRUE(placed);
  EXPECT_EQ(pool.cardsOf(*placed)[0].card, 1u);
  // Host-only work is placed by the fit and returned.
  auto node = pool.placeHost({3000, 4096});
  ASSERT_TRUE(node);
  EXPECT_EQ(pool.nodes()[*node].hostUsed.cpuMilli, *node == 1 ? 4000u : 3000u);
  pool.returnHost(*node, {3000, 4096});
  EXPECT_FALSE(pool.placeHost({17000, 0}));
}

TEST(Pool, RaccelFitKeepsHostForTheCardsItFeeds) {
  // Two equal nodes; CPU-heavy whole-card demand seen. A CPU-hungry share goes where it
  // leaves the host able to feed the remaining cards: the node with more CPU left.
  Pool pool(1.0);
  ASSERT_TRUE(pool.addNode("a", {card(CardKind::gpu, 10, 0), card(CardKind::gpu, 10, 1)}, HostVector{16000, 0}));
  ASSERT_TRUE(pool.addNode("b", {card(CardKind::gpu, 10, 0), card(CardKind::gpu, 10, 1)}, HostVector{16000, 0}));
  Pool::Request whole = wholeOf(1, {8000, 0});
  ASSERT_TRUE(pool.allocate(1, whole));  // one card and half the CPU of a node
  size_t used = pool.cardsOf(pool.held(1))[0].card < 2 ? 0 : 1;
  Pool::Request share = shareOf(500, {6000, 0});
  auto got = pool.allocate(2, share);
  ASSERT_TRUE(got);
  size_t node = pool.cards()[pool.cardsOf(*got)[0].card].node;
  EXPECT_NE(node, used) << "on the busy node it would leave 2000 milli-CPU for a free card that needs 8000";
}

// A request's service, as both drivers count it: demoted as block-seconds cross the
// thresholds, promoted once it has waited eight times its last run; its pool priority
// carries its priority, which every view reads back.
TEST(Admission, ServiceIsDemotedByAttainedServiceAndPromotedWhenStarved) {
  Service s;
  s.waitingSince = 100;
  EXPECT_DOUBLE_EQ(s.secondsToNextClass(4), kServiceThresholds[0] / 4);
  s.ran(kServiceThresholds[0] / 4 - 1e-4, 4);  // due now, to rounding
  EXPECT_TRUE(s.reclassify());
  EXPECT_EQ(s.serviceClass, 1);
  EXPECT_FALSE(s.reclassify());
  s.stopped(1000, 400);
  EXPECT_DOUBLE_EQ(s.lastRun, 600);
  EXPECT_DOUBLE_EQ(s.waited(1500), 500);
  EXPECT_FALSE(s.promote(1000 + 8 * 600));
  EXPECT_TRUE(s.promote(1000 + 8 * 600 + 1));
  EXPECT_EQ(s.serviceClass, 0);
  EXPECT_EQ(s.attained, 0);
  s.serviceClass = kServiceClasses - 1;
  EXPECT_TRUE(std::isinf(s.secondsToNextClass(4)));
  for (int p : {-1000, -1, 0, 7, 1000})
    for (int c = 0; c < kServiceClasses; ++c) {
      EXPECT_EQ(priorityOfPoolPriority(poolPriority(p, c)), p) << p << " class " << c;
      EXPECT_LT(poolPriority(p, c), poolPriority(p + 1, kServiceClasses - 1));
    }
}

TEST(Admission, OverFairShareIsAgainstMaxMinSharesOfTheDemand) {
  // 4 blocks; A holds 3 and wants 1 more, B wants 4: 2 each, A over.
  auto over = overFairShare({4, 4}, {3, 0}, 4);
  EXPECT_EQ(over, (std::vector<bool>{true, false}));
  // B wants only 1: A's share is 3, which it holds.
  EXPECT_EQ(overFairShare({4, 1}, {3, 0}, 4), (std::vector<bool>{false, false}));
  EXPECT_EQ(waterFill({1, 10, 10}, 9), (std::vector<double>{1, 4, 4}));
}

}  // namespace
}  // namespace raccel::scheduler

namespace raccel::scheduler {
namespace {

TEST(Admission, OrderIsPriorityShareClassUsageArrivalAndTheStarvedCountAsFresh) {
  std::vector<Waiting> queue = {
      {1, 0, 0.5, 1, 2, false, 0},                           // most served, within share
      {2, 0, 0.1, 2, 0, true, 0},                            // fresh, its tenant over share
      {3, 0, 0.9, 3, 0, false, 0},                           // fresh, within share, heavier tenant
      {4, 0, 0.2, 4, 0, false, 0},                           // fresh, within share, lighter tenant
      {5, 1, 9.0, 5, 2, true, 0},                            // higher priority: first whatever else
      {6, 0, 0.8, 6, 2, true, kStarvedAfterSeconds + 1},     // over share, served, but starved
  };
  orderForAdmission(queue);
  std::vector<VaccelId> ids;
  for (auto& w : queue) ids.push_back(w.id);
  EXPECT_EQ(ids, (std::vector<VaccelId>{5, 4, 6, 3, 1, 2}));
  // The starved one is now ordered (and may preempt) as fresh work within its share.
  EXPECT_EQ(queue[2].serviceClass, 0);
  EXPECT_FALSE(queue[2].overShare);
}

TEST(Admission, NewWorkMayPreemptSuspendedWorkOnlyOnceStarved) {
  EXPECT_TRUE(mayPreempt(false, 0));
  EXPECT_FALSE(mayPreempt(true, 0));
  EXPECT_FALSE(mayPreempt(true, kStarvedAfterSeconds));
  EXPECT_TRUE(mayPreempt(true, kStarvedAfterSeconds + 1));
}

}  // namespace
}  // namespace raccel::scheduler
