// The block pool: every card of every registered node cut into numbered compute blocks
// (docs/ARCHITECTURE.md, "The pool"). Pure logic: no I/O, no clock. Owned by the scheduler's
// loop thread (and by the trace simulator); not thread-safe.
//
// Numbering: nodes get consecutive ranges in registration order, starting at block 1.
// Inside a node, blocks are grouped by card kind in the order GPU, NPU, FPGA, CPU,
// cards of one kind in the order given. A card of X TFLOPS holds floor(X / blockTflops)
// blocks. A node that leaves keeps its range (offline) and gets it back when it
// re-registers with the same layout.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "common/error.h"
#include "common/images.h"
#include "common/kinds.h"
#include "common/limits.h"

namespace raccel::scheduler {

using VaccelId = uint64_t;
constexpr VaccelId kNoOwner = 0;

struct BlockRange {
  uint32_t first = 0;  // 1-based block number
  uint32_t count = 0;
  uint32_t end() const { return first + count; }  // one past the last
  bool operator==(const BlockRange&) const = default;
};

// Bit set of accepted card kinds (bit i = CardKind i).
using KindMask = uint8_t;
constexpr KindMask kAllKinds = 0x0f;
constexpr KindMask maskOf(CardKind kind) { return static_cast<KindMask>(1u << static_cast<unsigned>(kind)); }

struct CardSpec {
  uint32_t index = 0;  // the netaccel's own card index
  CardKind kind = CardKind::cpu;
  std::string model;
  std::string backend;
  double tflops = 0;
  uint64_t memoryBytes = 0;
  std::vector<ProgramKind> programKinds;  // what the card can load (builtin = runs the built-in ops)
  // As its netaccel reports them (0 = not known), for the guest's APIs (OpenCL's
  // device limits): compute units, largest work-group, local memory per work-group.
  uint32_t computeUnits = 0;
  uint32_t maxWorkGroupSize = 0;
  uint64_t localMemBytes = 0;
  std::string openclExtensions;  // OpenCL's extension list; checked by Pool::checkNode
  uint64_t doubleFpConfig = 0;
  ImageLimits images;  // checked by Pool::checkNode
  bool runs(ProgramKind kind) const;
};

struct Card {
  size_t node = 0;  // index into nodes()
  CardSpec spec;
  BlockRange blocks;
};

// What a node's host offers beside its cards, and what work needs of it there (the
// dimensions FGD's placement counts): thousandths of a CPU core and MiB of memory. In a
// node's capacity, 0 in a dimension means "not counted" (no limit).
struct HostVector {
  uint64_t cpuMilli = 0;
  uint64_t memoryMib = 0;
  bool empty() const { return cpuMilli == 0 && memoryMib == 0; }
  bool operator==(const HostVector&) const = default;
  // Whether this need fits in `capacity` with `used` of it taken (or none).
  bool fitsIn(const HostVector& capacity, const HostVector& used) const {
    return (capacity.cpuMilli == 0 || used.cpuMilli + cpuMilli <= capacity.cpuMilli) &&
           (capacity.memoryMib == 0 || used.memoryMib + memoryMib <= capacity.memoryMib);
  }
  bool fitsIn(const HostVector& capacity) const { return fitsIn(capacity, HostVector()); }
  // Within common/limits.h's bounds (what a peer or a file may claim), so no sum wraps.
  bool inBounds() const { return cpuMilli <= limits::kMaxHostCpuMilli && memoryMib <= limits::kMaxHostMemoryMib; }
};

struct Node {
  std::string name;
  BlockRange blocks;
  bool online = false;
  bool draining = false;  // online, but nothing new is placed here (raccelctl drain)
  bool forgotten = false; // offline for good: its name is free, its numbers stay unused
  std::vector<size_t> cards;  // indices into cards(), in block order
  HostVector host;      // capacity (a 0 dimension is not counted)
  HostVector hostUsed;  // held by placed work
  bool placeable() const { return online && !draining; }
  // What every view of the node prints: online | draining | offline.
  const char* stateName() const { return !online ? "offline" : draining ? "draining" : "online"; }
  // Whether `need` fits in what the host has left.
  bool hostFits(const HostVector& need) const { return need.fitsIn(host, hostUsed); }
};

// Blocks of one card held by a vaccel.
struct CardShare {
  size_t card = 0;  // index into cards()
  uint32_t blocks = 0;
};

class Pool {
 public:
  explicit Pool(double blockTflops = 1.0) : blockTflops_(blockTflops) {}

  double blockTflops() const { return blockTflops_; }
  // At least 1; above any pool (kMaxPoolBlocks + 1) for sizes no pool can hold.
  uint32_t blocksFor(double tflops) const;
  // Why a node of these cards cannot join (a name, a count or a size out of
  // common/limits.h's bounds, or a pool that would grow past them), or ok.
  Status checkNode(const std::string& name, const std::vector<CardSpec>& specs) const;

  // Registers a node's cards and host resources, or brings a known node (same name and
  // card layout) back online (with the host it reports now). Returns the node's index.
  Result<size_t> addNode(const std::string& name, const std::vector<CardSpec>& cards, HostVector host = {});
  // Takes a node offline: its free blocks leave the pool; blocks held by vaccels stay
  // assigned to them until released. Returns the vaccels holding blocks there.
  std::vector<VaccelId> removeNode(size_t node);
  // An offline node no one holds blocks of is forgotten: it leaves the listings and its
  // name is free (a node of that name joins anew, with new numbers). The last node in
  // the numbering is removed, its numbers reused; node and card indices above it become
  // invalid (there are none). False if not offline or still held.
  bool forgetNode(size_t node);
  // Draining: the node stays online and its holders keep their blocks, but its free
  // blocks leave the pool (nothing new is placed there, released blocks stay out)
  // until draining ends. Totals count placeable (online, not draining) blocks only.
  void setDraining(size_t node, bool draining);
  // Changes a holder's priority (raccelctl set-policy lowers a VM's cap).
  void setPriority(VaccelId owner, int priority);

  // A request's shape. `spread`: `blocks` anywhere (a raccel vaccel, which may span
  // cards, kinds and nodes). The shaped ones keep a device plugin's constraints (the
  // trace simulator's pods): `oneCard`: `cardMilli` thousandths of one card; `wholeCards`:
  // that many whole cards of one node.
  //
  // Shares of a card (oneCard) are accounted exactly, in thousandths: a card takes shares
  // while their sum stays within the thousandths its blocks not held otherwise are worth,
  // so it hosts as many as a device plugin counting fractions would. The blocks handed
  // to a share keep the card's shares holding ceil(sum x card blocks / 1000) blocks
  // between them (the last may get one block less than its own fraction rounded up;
  // every share gets at least one block).
  //
  // `host`: what the work needs of its node's host. A request with host needs is placed
  // on one node whose host has that much left (a spread request then spans no other
  // node), and holds it until released.
  enum class Shape : uint8_t { spread, oneCard, wholeCards };
  struct Request {
    uint32_t blocks = 0;  // spread
    KindMask kinds = kAllKinds;
    int priority = 0;  // recorded with the allocation; preemption takes only from lower ones
    Shape shape = Shape::spread;
    uint32_t cardMilli = 0;   // oneCard
    uint32_t wholeCards = 0;  // wholeCards
    // spread: refuse (resourceExhausted) rather than span more nodes than this (0 = any):
    // the caller waits for a placement that does not pay for crossing many nodes.
    uint32_t maxNodes = 0;
    // Shaped requests: the cards it may use (a model list, the node's other resources);
    // null accepts every card of an accepted kind.
    std::function<bool(const Card&)> accepts;
    HostVector host;
  };
  // Places a request (docs/ARCHITECTURE.md, "The pool"): one contiguous free range if any
  // (fewest nodes, fewest cards, best fit), else the fewest pieces. Shaped requests are
  // placed by the pool's Fit. Refuses with resourceExhausted, naming both numbers, when
  // the pool can never or cannot now hold it.
  Result<std::vector<BlockRange>> allocate(VaccelId owner, const Request& request);

  // How a shaped request chooses among the cards (oneCard) or nodes (wholeCards) where
  // it fits. `raccel`: the least growth of its node's fragmentation, measured in cards
  // against the demand the pool has seen (shapes and host needs of the requests so far,
  // by count): FGD's measure (USENIX ATC '23: free capacity a typical request could not
  // use, all of a node's for work its host cannot take, all of a card's for work that
  // does not take its kind and model), plus the free capacity the
  // node's host cannot feed at the host needs the demand brings per card (see
  // shaped.cc); ties go to the tightest card, then the fullest node, then the lowest
  // number. The baselines: `firstFit` (lowest block number: how a device plugin fills a
  // cluster), `bestFit` (least free blocks left on the node, then on the card),
  // `random` (any place that fits, seeded).
  enum class Fit : uint8_t { raccel, firstFit, bestFit, random };
  void setFit(Fit fit, uint64_t seed = 1);
  Fit fit() const { return fit_; }
  // Blocks a oneCard request of `cardMilli` is worth on a card of `cardBlocks`, rounded up.
  static uint32_t blocksOfCard(uint32_t cardMilli, uint32_t cardBlocks);
  // Free blocks of one card (of a placeable node).
  uint32_t cardFree(size_t card) const { return cardFree_[card]; }
  // The thousandths of one card a oneCard request may still take there (0 when none).
  uint32_t cardFreeMilli(size_t card) const;
  // Blocks a oneCard request of `cardMilli` would get on `card` now, or 0 when it does
  // not fit there.
  uint32_t shareBlocksOn(size_t card, uint32_t cardMilli) const;

  // Work that holds no blocks but host resources (the trace simulator's CPU-only pods):
  // placed on a placeable node by the fit (raccel: where it grows fragmentation least),
  // charged there until returnHost. resourceExhausted when no node has room.
  Result<size_t> placeHost(const HostVector& need);

  void returnHost(size_t node, const HostVector& need);
  // Whether some node of the pool (online or not) has a host that could ever hold `need`.
  bool hostCouldHold(const HostVector& need) const;
  // "N milli-CPU and M MiB", for messages.
  static std::string describeHost(const HostVector& host);
  // The lowest `blocks` free blocks of one card, as ranges (fewer when it has fewer).
  std::vector<BlockRange> lowestFree(size_t card, uint32_t blocks) const;
  // Returns all blocks held by `owner` to the pool.
  void release(VaccelId owner);
  // Gives `owner` exactly `ranges` (the scheduler restoring its allocations after a
  // restart; blocks of offline nodes may be among them). Refuses, changing nothing, a
  // block that is not a block or that someone holds, or an owner that holds some.
  // `host` is charged to the node of the first block; `cardMilli` (a share of one
  // card, all ranges on it) is counted against the card's thousandths.
  Status assign(VaccelId owner, const std::vector<BlockRange>& ranges, int priority, HostVector host = {},
                uint32_t cardMilli = 0);

  // Preemption (docs/ARCHITECTURE.md, "The pool"): the holders to suspend so that `request`
  // fits, taken from strictly lower priorities, the lowest first and among equals the
  // most recently admitted first. Empty when it fits in free blocks already.
  // resourceExhausted, with the numbers, when even all of them would not be enough (or,
  // with maxNodes, when the request would still find no placement within its nodes).
  // With a node limit or host needs, victims spread over the pool may not make room on
  // few enough nodes: plans that take from a few nodes only are tried next, and victims
  // whose blocks the trial placement does not use are spared.
  Result<std::vector<VaccelId>> planPreemption(const Request& request) const;

  // Compaction (docs/ARCHITECTURE.md, "The pool"): moves that slide every
  // holder down inside its node's region of one card kind, in block order, so that
  // each holder's blocks are one range and the region's free blocks one range at its
  // end. A holder spanning regions or nodes stays where it is (the others flow around
  // it). `maxMoves` and `maxBlocksPerMove` limit the plan (0 = no limit).
  struct Move {
    VaccelId owner = kNoOwner;
    std::vector<BlockRange> from;
    BlockRange to;
  };
  std::vector<Move> planCompaction(size_t maxMoves = 0, uint32_t maxBlocksPerMove = 0) const;
  // Reassigns a planned move's blocks (the caller has moved the holder's data).
  // Refuses a move that no longer matches the pool.
  Status applyMove(const Move& move);

  const std::vector<BlockRange>& held(VaccelId owner) const;
  int priorityOf(VaccelId owner) const;
  std::vector<CardShare> cardsOf(const std::vector<BlockRange>& ranges) const;

  // The fewest placeable nodes whose blocks (of accepted kinds) could hold `blocks`,
  // free or not (0 when all of them together could not): the base of Request::maxNodes.
  uint32_t fewestNodesFor(uint32_t blocks, KindMask kinds = kAllKinds) const;

  // Blocks of placeable nodes (online, not draining; with accepted kinds).
  uint32_t total(KindMask kinds = kAllKinds) const;
  // Blocks of known nodes that take no work now: draining, or offline and not forgotten.
  uint32_t heldBack(KindMask kinds = kAllKinds) const;
  // Why `want` blocks of `kinds` could not be placed even if every holder left, or
  // nullopt when the placeable blocks could hold them. `never`: not even with every
  // draining and offline node back ("can never run here"); else "not now", naming them.
  // `expectedBack`: not now, but the offline nodes (not draining) with the placeable ones
  // would hold it: the request waits for them rather than being refused.
  struct Shortfall {
    bool never = false;
    bool expectedBack = false;
    std::string why;
  };
  std::optional<Shortfall> shortfall(uint32_t want, KindMask kinds) const;
  uint32_t freeBlocks(KindMask kinds = kAllKinds) const;
  // Index of the card holding `block`, or -1 when the number is not a block.
  long cardOf(uint32_t block) const;
  VaccelId ownerOf(uint32_t block) const { return block < owner_.size() ? owner_[block] : kNoOwner; }
  bool isFree(uint32_t block) const;
  // What a block is now, for every view of the pool: held by a vaccel, or unheld on a node
  // that takes work (free), drains, or is offline.
  enum class BlockState { free, used, draining, offline };
  BlockState blockState(uint32_t block) const;
  static const char* blockStateName(BlockState state);
  uint32_t highestBlock() const { return next_ - 1; }

  const std::vector<Node>& nodes() const { return nodes_; }
  // The index of the node named `name` in nodes(); SIZE_MAX when there is none.
  size_t nodeIndex(const std::string& name) const {
    for (size_t i = 0; i < nodes_.size(); ++i)
      if (nodes_[i].name == name) return i;
    return SIZE_MAX;
  }
  const std::vector<Card>& cards() const { return cards_; }
  // Free runs as (first, count), coalesced, in block order.
  const std::map<uint32_t, uint32_t>& freeRuns() const { return free_; }

 private:
  void addFree(BlockRange range);
  void takeFree(BlockRange range);
  // Sub-ranges of `run` whose cards have an accepted kind.
  void clip(BlockRange run, KindMask kinds, std::vector<BlockRange>& out) const;
  // How many nodes and cards a range reaches (its ends' cards found once for both).
  struct Spanned {
    uint32_t nodes, cards;
  };
  Spanned spanned(BlockRange range) const;
  void recountTotals();
  void adjustCardFree(BlockRange range, bool freed);
  Result<std::vector<BlockRange>> allocateShaped(VaccelId owner, const Request& request);
  // allocate's two ways for a spread request: the best one contiguous range (`runs` gets
  // the free runs it looked at, clipped to the request's kinds and host), else pieces.
  std::optional<BlockRange> contiguousPlace(const Request& request, std::vector<BlockRange>& runs) const;
  std::vector<BlockRange> fragmentedPlace(uint32_t want, const std::vector<BlockRange>& runs) const;
  void record(VaccelId owner, std::vector<BlockRange> pieces, int priority, HostVector host = {}, size_t shareCard = SIZE_MAX,
              uint32_t shareMilli = 0);
  void chargeHost(size_t node, const HostVector& need, bool take);
  uint32_t nodeFree(const Node& node) const;  // its cards' free blocks
  // Calls fn(node index, piece) for the pieces of `range` cut at node boundaries.
  template <typename Fn>
  void forEachNodePiece(BlockRange range, Fn&& fn) const {
    for (uint32_t b = range.first; b < range.end();) {
      size_t node = cards_[static_cast<size_t>(cardOf(b))].node;
      uint32_t e = std::min(range.end(), nodes_[node].blocks.end());
      fn(node, BlockRange{b, e - b});
      b = e;
    }
  }
  // Counts one request of this shape (oneCard thousandths, wholeCards cards, or host-only
  // work with `spread`) in the demand the raccel fit measures fragmentation against.
  void learnDemand(Shape shape, uint32_t amount, const HostVector& host, size_t accepts = 0);
  struct Holding;
  // planPreemption's helpers: `victims` tried on a copy (the victims the placement
  // needs, or nullopt and `why`); plans on at most maxNodes nodes (one with host needs),
  // one per anchor node, the cheapest kLocalPlansTried.
  static constexpr size_t kLocalPlansTried = 3;
  // What suspending `owner` would free for a request of `kinds`, per node: blocks of
  // accepted kinds on placeable nodes (blocks on offline nodes do not come back).
  std::map<size_t, uint32_t> reclaimableFrom(VaccelId owner, KindMask kinds) const;
  std::optional<std::vector<VaccelId>> tryPlan(const Request& request, const std::vector<VaccelId>& victims,
                                               std::string& why) const;
  std::vector<std::vector<VaccelId>> localPlans(const Request& request) const;
  void holdExtras(Holding& h, HostVector host, size_t shareCard, uint32_t shareMilli);
  // The fragmentation model of Fit::raccel (shaped.cc).
  // The growth of node's expected fragmentation (in blocks) when `take` (card, blocks,
  // thousandths) is placed there and the host gives `host`.
  struct Take {
    size_t card;
    uint32_t blocks;
    uint32_t milli;  // of a share; 0 for whole cards
  };
  double fragDelta(size_t node, const std::vector<Take>& take, const HostVector& host);
  // allocateShaped's parts (shaped.cc): the places on a node, their score, the best so
  // far, and the blocks of the chosen one.
  using ShapedScore = std::tuple<double, double, uint32_t, uint32_t, uint32_t>;
  struct ShapedChoice {
    std::vector<Take> best;
    ShapedScore score{};
    uint64_t seen = 0;  // places looked at
  };
  void shapedTakesOn(const Node& node, const Request& request, bool hostFits, bool& anyAccepted,
                     const std::function<void(const std::vector<Take>&)>& place);
  ShapedScore shapedScore(size_t node, uint32_t nodeFree, const std::vector<Take>& take, bool oneCard,
                          const std::vector<double>& unreserved, const HostVector& host);
  void choose(ShapedChoice& choice, const std::vector<Take>& take, const ShapedScore& score);
  std::vector<BlockRange> piecesOf(const std::vector<Take>& takes) const;
  double nodeFrag(size_t node, const std::vector<Take>& take, const HostVector& host);
  void rebuildFragTables();
  // Per card group, the free cards (in cards) that demand other than `accepts` does not
  // expect to need (see shaped.cc, "reserved"); a take beyond it is scored first.
  std::vector<double> unreservedFree(size_t accepts) const;
  double reservedTaken(const std::vector<double>& unreserved, const std::vector<Take>& take) const;
  size_t fitSetOf(const Node& node, const HostVector& used);
  void freeUnowned(size_t node);   // the node's blocks nobody holds become free
  void takeNodeFree(size_t node);  // the node's free blocks leave the free index

  struct Holding {
    std::vector<BlockRange> ranges;
    int priority = 0;
    uint64_t admitted = 0;  // admission order
    uint32_t blocks = 0;
    HostVector host;  // charged to hostNode
    size_t hostNode = SIZE_MAX;
    size_t shareCard = SIZE_MAX;  // a oneCard share: its card and thousandths
    uint32_t shareMilli = 0;
  };
  // Preemption order: lowest priority first, then the most recently admitted.
  using VictimKey = std::tuple<int, uint64_t, VaccelId>;  // (priority, ~admitted, owner)
  static VictimKey victimKey(VaccelId owner, const Holding& h) { return {h.priority, ~h.admitted, owner}; }

  double blockTflops_;
  uint32_t next_ = 1;
  std::vector<Node> nodes_;
  std::vector<Card> cards_;          // in block order
  std::vector<uint32_t> cardFirst_;  // cards_[i].blocks.first, for binary search
  std::vector<VaccelId> owner_;      // by block number
  std::map<uint32_t, uint32_t> free_;
  std::set<std::pair<uint32_t, uint32_t>> freeBySize_;  // (count, first)
  std::unordered_map<VaccelId, Holding> held_;
  std::set<VictimKey> victims_;
  uint64_t admissions_ = 0;
  uint32_t freeCount_ = 0;
  uint32_t totalByKind_[4] = {};     // placeable blocks per card kind
  uint32_t heldBackByKind_[4] = {};  // draining or offline (not forgotten) blocks per kind
  uint32_t awayByKind_[4] = {};      // of those, offline and not draining: expected back
  std::vector<uint32_t> cardFree_;  // free (placeable) blocks per card
  std::vector<uint32_t> shareMilli_, shareBlocks_;  // per card: thousandths and blocks held by oneCard shares

  Fit fit_ = Fit::raccel;
  std::mt19937_64 rng_{1};
  // Card groups: cards of one kind and model are alike to the demand (a request takes
  // them all or none of them). Per card, its group.
  std::vector<size_t> cardGroup_;
  std::map<std::pair<CardKind, std::string>, size_t> groupIndex_;
  size_t groupOf(const CardSpec& spec) { return groupIndex_.try_emplace({spec.kind, spec.model}, groupIndex_.size()).first->second; }
  // Which groups a class of demand takes: by group as it judged the groups known when it
  // came (`byGroup`), by its kinds for groups that came later.
  struct Accepts {
    KindMask kinds = 0;
    std::vector<bool> byGroup;
    auto operator<=>(const Accepts&) const = default;
  };
  std::vector<Accepts> acceptSets_;
  std::map<Accepts, size_t> acceptIndex_;
  size_t acceptsOf(const Request& request);
  bool takes(size_t accepts, size_t group) const;
  // Demand seen by shaped requests and host-only work, by count, per class (the host
  // needs and the card groups it takes): its oneCard thousandths, its wholeCards
  // counts, its host-only work.
  struct HostClass {
    HostVector need;
    size_t accepts = 0;
    std::map<uint32_t, uint64_t> milli, whole;
    uint64_t hostOnly = 0;
  };
  std::vector<HostClass> classes_;
  std::vector<double> demandByAccepts_;  // cards' worth of shaped demand seen, per accept set
  std::map<std::tuple<uint64_t, uint64_t, size_t>, size_t> classIndex_;
  size_t groupsAtBuild_ = 0;
  uint64_t seenCount_ = 0, seenAtBuild_ = 0;
  struct HostPerCard {
    double cpuMilli = 0, memoryMib = 0;
  } hostPerCard_;  // host needs the card demand brings per card
  // FGD counts all of a node's free compute as fragmented for work its host cannot take
  // (and for host-only work). A fit set is the demand whose host needs fit one state of
  // a node's host: `allFree`, the share of demand for which every free block counts;
  // `cardFrag[t]`, the expected fragmented fraction of a card with t thousandths free
  // for its oneCard demand; `whole`, its wholeCards demand as (n cards, share).
  // Per card group: `cardAll[g]`, the share of oneCard demand that does not take the
  // group (all of such a card's free capacity is fragmented for it), and `cardFrag[g]`.
  struct WholeDemand {
    uint32_t cards;
    double share;
    size_t accepts;
  };
  struct FitSet {
    double allFree = 0;
    std::vector<double> cardAll;
    std::vector<std::vector<double>> cardFrag;
    std::vector<WholeDemand> whole;
  };
  std::vector<FitSet> fitSets_;
  std::map<std::vector<bool>, size_t> fitSetIndex_;
  std::map<std::pair<uint64_t, uint64_t>, size_t> fitSetOfHost_;  // (CPU left, memory left) -> fit set
};

}  // namespace raccel::scheduler
