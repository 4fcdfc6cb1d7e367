// Shaped requests (Pool::Shape), host resources, and the fits that choose a place
// (Pool::Fit).
//
// The fragmentation model of Fit::raccel is FGD's (USENIX ATC '23) against the demand
// seen so far (shapes and host needs, by count). For one kind of work a node's free
// compute is fragmented: all of it when the node's host cannot take the work's host
// needs, or the work needs no card; for a oneCard share, the free part of each card
// that has fewer thousandths free than the share; for wholeCards, the free part of its
// partly used cards (all of it when it lacks enough whole free cards). A place is scored
// by how much it grows the expected fragmentation of its node. Demand is grouped by
// host class; for each set of classes a host state fits, the oneCard demand is
// tabulated by a card's free thousandths, so scoring a card is a table lookup. Before
// fragmentation, a place is scored by how much it takes of what demand pinned to fewer
// card groups (a GPU model) has claimed (`unreservedFree`).
#include <algorithm>
#include <numeric>
#include <tuple>

#include "scheduler/pool.h"

namespace raccel::scheduler {

namespace {

// Thousandths of a card of `size` blocks that shares may still take, given its free
// blocks and the blocks and thousandths its shares hold.
uint32_t freeMilliOf(uint32_t size, uint32_t free, uint32_t shareBlocks, uint32_t shareMilli) {
  if (size == 0 || free == 0 || free + shareBlocks > size) return 0;
  uint32_t other = size - free - shareBlocks;  // held by whole-card or spread holders
  uint64_t cap = uint64_t(size - other) * 1000 / size;
  return cap > shareMilli ? static_cast<uint32_t>(cap - shareMilli) : 0;
}

uint64_t left(uint64_t capacity, uint64_t used) { return capacity == 0 ? UINT64_MAX : capacity > used ? capacity - used : 0; }

}  // namespace

uint32_t Pool::blocksOfCard(uint32_t cardMilli, uint32_t cardBlocks) {
  return static_cast<uint32_t>((static_cast<uint64_t>(cardMilli) * cardBlocks + 999) / 1000);
}

uint32_t Pool::cardFreeMilli(size_t c) const {
  return freeMilliOf(cards_[c].blocks.count, cardFree_[c], shareBlocks_[c], shareMilli_[c]);
}

uint32_t Pool::shareBlocksOn(size_t c, uint32_t milli) const {
  if (milli == 0 || milli > cardFreeMilli(c)) return 0;
  uint32_t target = blocksOfCard(shareMilli_[c] + milli, cards_[c].blocks.count);
  uint32_t need = target > shareBlocks_[c] ? target - shareBlocks_[c] : 1;
  return need <= cardFree_[c] ? need : 0;
}

void Pool::setFit(Fit fit, uint64_t seed) {
  fit_ = fit;
  rng_.seed(seed);
}

std::string Pool::describeHost(const HostVector& host) {
  return std::to_string(host.cpuMilli) + " milli-CPU and " + std::to_string(host.memoryMib) + " MiB";
}

bool Pool::hostCouldHold(const HostVector& need) const {
  for (const Node& n : nodes_)
    if (!n.forgotten && need.fitsIn(n.host)) return true;
  return false;
}

uint32_t Pool::nodeFree(const Node& node) const {
  uint32_t free = 0;
  for (size_t c : node.cards) free += cardFree_[c];
  return free;
}

void Pool::chargeHost(size_t node, const HostVector& need, bool take) {
  HostVector& used = nodes_[node].hostUsed;
  if (take) {
    used.cpuMilli += need.cpuMilli;
    used.memoryMib += need.memoryMib;
  } else {
    used.cpuMilli -= std::min(used.cpuMilli, need.cpuMilli);
    used.memoryMib -= std::min(used.memoryMib, need.memoryMib);
  }
}

size_t Pool::acceptsOf(const Request& request) {
  // One card of each group judges the group (a request's predicate sees a card's spec).
  Accepts a{request.kinds, std::vector<bool>(groupIndex_.size())};
  std::vector<bool> judged(groupIndex_.size());
  for (size_t c = 0; c < cards_.size(); ++c) {
    const size_t g = cardGroup_[c];
    if (judged[g]) continue;
    judged[g] = true;
    a.byGroup[g] = (request.kinds & maskOf(cards_[c].spec.kind)) && (!request.accepts || request.accepts(cards_[c]));
  }
  auto [it, added] = acceptIndex_.try_emplace(a, acceptSets_.size());
  if (added) acceptSets_.push_back(std::move(a));
  return it->second;
}

bool Pool::takes(size_t accepts, size_t group) const {
  const Accepts& a = acceptSets_[accepts];
  if (group < a.byGroup.size()) return a.byGroup[group];
  for (auto& [key, g] : groupIndex_)
    if (g == group) return a.kinds & maskOf(key.first);
  return false;
}

void Pool::learnDemand(Shape shape, uint32_t amount, const HostVector& host, size_t accepts) {
  auto [it, added] = classIndex_.try_emplace({host.cpuMilli, host.memoryMib, accepts}, classes_.size());
  if (added) classes_.push_back(HostClass{host, accepts, {}, {}, 0});
  HostClass& k = classes_[it->second];
  if (shape == Shape::oneCard) ++k.milli[amount];
  else if (shape == Shape::wholeCards) ++k.whole[amount];
  else ++k.hostOnly;
  ++seenCount_;
  const double cards = shape == Shape::oneCard ? amount / 1000.0 : shape == Shape::wholeCards ? double(amount) : 0.0;
  if (demandByAccepts_.size() <= accepts) demandByAccepts_.resize(accepts + 1);
  demandByAccepts_[accepts] += cards;
}

// Demand that takes only some card groups (a GPU model, say) will need those groups'
// free cards, however the rest of the demand is placed. Assuming arrivals go on in the
// mix seen so far until the pool is full, an accept set with share s of the card demand
// reserves s of the pool's free cards, spread over its groups by their free cards. Work
// that could go elsewhere is kept off what others reserved (FGD's fragmentation counts
// another model's card as fragmented for pinned work, but not how scarce it is).
std::vector<double> Pool::unreservedFree(size_t accepts) const {
  const size_t groups = groupIndex_.size();
  std::vector<double> free(groups, 0.0);
  for (size_t c = 0; c < cards_.size(); ++c)
    if (cards_[c].blocks.count && nodes_[cards_[c].node].placeable()) free[cardGroup_[c]] += cardFreeMilli(c) / 1000.0;
  std::vector<double> unreserved = free;
  const double all = std::accumulate(free.begin(), free.end(), 0.0);
  const double demand = std::accumulate(demandByAccepts_.begin(), demandByAccepts_.end(), 0.0);
  if (demand <= 0 || all <= 0) return unreserved;
  for (size_t a = 0; a < demandByAccepts_.size(); ++a) {
    if (a == accepts || demandByAccepts_[a] <= 0) continue;
    double reach = 0;
    bool everywhere = true;
    for (size_t g = 0; g < groups; ++g) {
      if (free[g] <= 0) continue;
      if (takes(a, g)) reach += free[g];
      else everywhere = false;
    }
    if (everywhere || reach <= 0) continue;  // takes whatever is free: reserves nothing
    const double reserve = std::min(reach, demandByAccepts_[a] / demand * all);
    for (size_t g = 0; g < groups; ++g)
      if (free[g] > 0 && takes(a, g)) unreserved[g] -= reserve * free[g] / reach;
  }
  return unreserved;
}

double Pool::reservedTaken(const std::vector<double>& unreserved, const std::vector<Take>& take) const {
  double taken = 0;
  for (const Take& t : take) {
    const double cards = t.milli ? t.milli / 1000.0 : 1.0;
    taken += std::max(0.0, cards - std::max(0.0, unreserved[cardGroup_[t.card]]));
  }
  return taken;
}

void Pool::rebuildFragTables() {
  seenAtBuild_ = seenCount_;
  groupsAtBuild_ = groupIndex_.size();
  double cpu = 0, memory = 0, cards = 0;
  for (const HostClass& k : classes_) {
    auto add = [&](double count, double perRequest) {
      cpu += count * k.need.cpuMilli, memory += count * k.need.memoryMib, cards += count * perRequest;
    };
    for (auto& [m, count] : k.milli) add(double(count), m / 1000.0);
    for (auto& [w, count] : k.whole) add(double(count), w);
  }
  hostPerCard_ = cards > 0 ? HostPerCard{cpu / cards, memory / cards} : HostPerCard{};
  fitSets_.clear();
  fitSetIndex_.clear();
  fitSetOfHost_.clear();
}

size_t Pool::fitSetOf(const Node& node, const HostVector& used) {
  const uint64_t cpu = left(node.host.cpuMilli, used.cpuMilli), mem = left(node.host.memoryMib, used.memoryMib);
  if (auto it = fitSetOfHost_.find({cpu, mem}); it != fitSetOfHost_.end()) return it->second;
  std::vector<bool> fits(classes_.size());
  for (size_t i = 0; i < classes_.size(); ++i) fits[i] = classes_[i].need.cpuMilli <= cpu && classes_[i].need.memoryMib <= mem;
  auto [it, added] = fitSetIndex_.try_emplace(fits, fitSets_.size());
  if (added) {
    const double total = static_cast<double>(std::max<uint64_t>(seenCount_, 1));
    const size_t groups = groupIndex_.size();
    FitSet set;
    set.cardAll.assign(groups, 0.0);
    set.cardFrag.assign(groups, std::vector<double>(1001, 0.0));
    std::map<std::pair<uint32_t, size_t>, double> whole;
    for (size_t i = 0; i < classes_.size(); ++i) {
      const HostClass& k = classes_[i];
      if (!fits[i]) {
        uint64_t n = k.hostOnly;
        for (auto& [m, count] : k.milli) n += count;
        for (auto& [w, count] : k.whole) n += count;
        set.allFree += n / total;
        continue;
      }
      set.allFree += k.hostOnly / total;
      for (size_t g = 0; g < groups; ++g) {
        if (!takes(k.accepts, g)) {  // a card it never takes: all of its free capacity
          for (auto& [m, count] : k.milli) set.cardAll[g] += count / total;
          continue;
        }
        for (auto& [m, count] : k.milli)
          for (uint32_t t = 0; t < m && t <= 1000; ++t) set.cardFrag[g][t] += count / total * t / 1000.0;
      }
      for (auto& [w, count] : k.whole) whole[{w, k.accepts}] += count / total;
    }
    for (auto& [key, share] : whole) set.whole.push_back({key.first, share, key.second});
    fitSets_.push_back(std::move(set));
  }
  fitSetOfHost_[{cpu, mem}] = it->second;
  return it->second;
}

double Pool::nodeFrag(size_t n, const std::vector<Take>& take, const HostVector& host) {
  const Node& node = nodes_[n];
  HostVector used = node.hostUsed;
  used.cpuMilli += host.cpuMilli;
  used.memoryMib += host.memoryMib;
  const FitSet& set = fitSets_[fitSetOf(node, used)];
  // Each card's free capacity (in cards, by thousandths) and whether it is whole, after
  // `take`; the oneCard fragmentation.
  struct Free {
    size_t group;
    double capacity;
    bool whole;
  };
  thread_local std::vector<Free> cards;  // (this runs for every place a request is tried)
  cards.resize(node.cards.size());
  size_t count = 0;
  double freeAll = 0, frag = 0;
  for (size_t c : node.cards) {
    uint32_t size = cards_[c].blocks.count;
    if (size == 0) continue;
    uint32_t free = cardFree_[c], shareBlocks = shareBlocks_[c], shareMilli = shareMilli_[c];
    for (const Take& t : take)
      if (t.card == c) {
        free -= t.blocks;
        if (t.milli) shareBlocks += t.blocks, shareMilli += t.milli;
      }
    uint32_t milli = freeMilliOf(size, free, shareBlocks, shareMilli);
    const size_t g = cardGroup_[c];
    cards[count++] = {g, milli / 1000.0, free == size};
    freeAll += milli / 1000.0;
    frag += set.cardAll[g] * milli / 1000.0 + set.cardFrag[g][milli];
  }
  frag += set.allFree * freeAll;
  // raccel's addition to FGD's measure: the free compute the host cannot feed. Card
  // demand brings host needs in proportion (hostPerCard_); a node whose host has less
  // left than its free cards would draw will strand the difference, even before any one
  // typical request stops fitting (FGD counts it only then).
  double starved = 0;
  if (node.host.cpuMilli && hostPerCard_.cpuMilli > 0)
    starved = std::max(starved, freeAll - double(left(node.host.cpuMilli, used.cpuMilli)) / hostPerCard_.cpuMilli);
  if (node.host.memoryMib && hostPerCard_.memoryMib > 0)
    starved = std::max(starved, freeAll - double(left(node.host.memoryMib, used.memoryMib)) / hostPerCard_.memoryMib);
  frag += starved;
  // wholeCards demand: with enough whole cards it takes, the partial ones it takes are
  // fragmented for it; without, every card it takes; cards it never takes always.
  for (const WholeDemand& d : set.whole) {
    uint32_t whole = 0;
    double partial = 0, taken = 0;
    for (size_t i = 0; i < count; ++i) {
      if (!takes(d.accepts, cards[i].group)) continue;
      taken += cards[i].capacity;
      if (cards[i].whole) ++whole;
      else partial += cards[i].capacity;
    }
    frag += d.share * ((whole >= d.cards ? partial : taken) + (freeAll - taken));
  }
  return frag;
}

double Pool::fragDelta(size_t node, const std::vector<Take>& take, const HostVector& host) {
  // Tables follow the demand: rebuilt when it has grown by an eighth (at least 16
  // requests), and when cards of a new group joined.
  if (seenCount_ >= seenAtBuild_ + std::max<uint64_t>(16, seenAtBuild_ / 8) || groupsAtBuild_ != groupIndex_.size())
    rebuildFragTables();
  return nodeFrag(node, take, host) - nodeFrag(node, {}, {});
}

Result<size_t> Pool::placeHost(const HostVector& need) {
  learnDemand(Shape::spread, 0, need, acceptsOf(Request{}));
  long chosen = -1;
  std::tuple<double, uint64_t, uint64_t, uint64_t> best{};
  uint64_t seenPlaces = 0;
  for (size_t n = 0; n < nodes_.size(); ++n) {
    const Node& node = nodes_[n];
    if (!node.placeable() || !node.hostFits(need)) continue;
    uint64_t cpuLeft = left(node.host.cpuMilli, node.hostUsed.cpuMilli + need.cpuMilli);
    std::tuple<double, uint64_t, uint64_t, uint64_t> score{0, 0, 0, n};
    switch (fit_) {
      case Fit::firstFit: break;
      case Fit::bestFit: score = {0, 0, cpuLeft, n}; break;
      case Fit::random: break;
      case Fit::raccel: score = {fragDelta(n, {}, need), nodeFree(node), cpuLeft, n}; break;
    }
    ++seenPlaces;
    bool better = chosen < 0 || score < best;
    if (fit_ == Fit::random) better = std::uniform_int_distribution<uint64_t>(1, seenPlaces)(rng_) == 1;
    if (better) chosen = static_cast<long>(n), best = score;
  }
  if (chosen < 0)
    return fail(Code::resourceExhausted, "no online node's host has " + describeHost(need) + " left");
  chargeHost(static_cast<size_t>(chosen), need, true);
  return static_cast<size_t>(chosen);
}

void Pool::returnHost(size_t node, const HostVector& need) {
  if (node < nodes_.size()) chargeHost(node, need, false);
}

std::vector<BlockRange> Pool::lowestFree(size_t card, uint32_t blocks) const {
  const BlockRange range = cards_[card].blocks;
  std::vector<BlockRange> out;
  auto it = free_.upper_bound(range.first);
  if (it != free_.begin()) --it;
  for (; it != free_.end() && it->first < range.end() && blocks > 0; ++it) {
    uint32_t s = std::max(it->first, range.first), e = std::min(it->first + it->second, range.end());
    if (e <= s) continue;
    uint32_t n = std::min(blocks, e - s);
    out.push_back({s, n});
    blocks -= n;
  }
  return out;
}

Result<std::vector<BlockRange>> Pool::allocateShaped(VaccelId owner, const Request& request) {
  const bool oneCard = request.shape == Shape::oneCard;
  if (oneCard && (request.cardMilli == 0 || request.cardMilli > 1000))
    return fail(Code::invalidArgument, "a one-card request needs 1 to 1000 thousandths of a card, not " +
                                           std::to_string(request.cardMilli));
  if (!oneCard && request.wholeCards == 0) return fail(Code::invalidArgument, "a whole-card request needs at least one card");
  const size_t accepts = acceptsOf(request);
  learnDemand(request.shape, oneCard ? request.cardMilli : request.wholeCards, request.host, accepts);
  const std::vector<double> unreserved = fit_ == Fit::raccel ? unreservedFree(accepts) : std::vector<double>{};
  ShapedChoice choice;
  bool anyAccepted = false, anyHost = false;
  for (size_t n = 0; n < nodes_.size(); ++n) {
    const Node& node = nodes_[n];
    if (!node.placeable()) continue;
    const bool hostFits = node.hostFits(request.host);
    anyHost = anyHost || hostFits;
    const uint32_t free = nodeFree(node);
    shapedTakesOn(node, request, hostFits, anyAccepted, [&](const std::vector<Take>& take) {
      choose(choice, take, shapedScore(n, free, take, oneCard, unreserved, request.host));
    });
  }
  if (choice.best.empty()) {
    std::string what = oneCard ? std::to_string(request.cardMilli) + "/1000 of one card"
                               : std::to_string(request.wholeCards) + " whole card(s) of one node";
    if (!request.host.empty()) what += " with " + describeHost(request.host) + " of its host";
    return fail(Code::resourceExhausted, anyAccepted && anyHost ? "not enough free compute: no place has " + what + " free"
                                                                : "can never run here now: no online card or node it accepts offers " + what);
  }
  std::vector<BlockRange> pieces = piecesOf(choice.best);
  record(owner, pieces, request.priority, request.host, oneCard ? choice.best.front().card : SIZE_MAX,
         oneCard ? request.cardMilli : 0);
  return pieces;
}

// The places a shaped request may take on `node`, each given to `place`: a share of each
// accepted card with room for it (one card), or the node's first whole free accepted
// cards (whole cards). `anyAccepted`: some node has cards of the request's kinds (enough
// of them, for whole cards), free or not.
void Pool::shapedTakesOn(const Node& node, const Request& request, bool hostFits, bool& anyAccepted,
                         const std::function<void(const std::vector<Take>&)>& place) {
  auto accepted = [&](const Card& c) {
    return c.blocks.count > 0 && (request.kinds & maskOf(c.spec.kind)) && (!request.accepts || request.accepts(c));
  };
  std::vector<Take> take;
  if (request.shape == Shape::oneCard) {
    for (size_t c : node.cards) {
      if (!accepted(cards_[c])) continue;
      anyAccepted = true;
      uint32_t blocks = hostFits ? shareBlocksOn(c, request.cardMilli) : 0;
      if (blocks == 0) continue;
      take = {{c, blocks, request.cardMilli}};
      place(take);
    }
    return;
  }
  uint32_t acceptedCards = 0;
  for (size_t c : node.cards) {
    if (!accepted(cards_[c])) continue;
    ++acceptedCards;
    if (cardFree_[c] == cards_[c].blocks.count && take.size() < request.wholeCards) take.push_back({c, cardFree_[c], 0});
  }
  anyAccepted = anyAccepted || acceptedCards >= request.wholeCards;
  if (hostFits && take.size() == request.wholeCards) place(take);
}

// How a place on node `n` (of `nodeFree` free blocks) scores under the pool's fit: its
// fit's figures, then the blocks left on the card (a share) and the node, then the lowest
// block first.
Pool::ShapedScore Pool::shapedScore(size_t n, uint32_t nodeFree, const std::vector<Take>& take, bool oneCard,
                                    const std::vector<double>& unreserved, const HostVector& host) {
  uint32_t taken = 0;
  for (auto& t : take) taken += t.blocks;
  const Card& first = cards_[take.front().card];
  const uint32_t cardLeft = oneCard ? cardFree_[take.front().card] - taken : 0;
  switch (fit_) {
    case Fit::firstFit: return {0, 0, 0, 0, first.blocks.first};
    case Fit::bestFit: return {0, nodeFree - taken, cardLeft, 0, first.blocks.first};
    case Fit::random: return {0, 0, 0, 0, 0};
    case Fit::raccel: break;
  }
  return {reservedTaken(unreserved, take), fragDelta(n, take, host), cardLeft, nodeFree - taken, first.blocks.first};
}

// Keeps `take` if it scores lower than the best so far (the random fit: one of all the
// places, each as likely, by reservoir sampling).
void Pool::choose(ShapedChoice& choice, const std::vector<Take>& take, const ShapedScore& score) {
  ++choice.seen;
  bool better = choice.best.empty() || score < choice.score;
  if (fit_ == Fit::random) better = std::uniform_int_distribution<uint64_t>(1, choice.seen)(rng_) == 1;
  if (better) {
    choice.best = take;
    choice.score = score;
  }
}

// The blocks of the chosen takes: each card's lowest free blocks, adjacent pieces joined,
// in block order.
std::vector<BlockRange> Pool::piecesOf(const std::vector<Take>& takes) const {
  std::vector<BlockRange> pieces;
  for (const Take& t : takes)
    for (BlockRange r : lowestFree(t.card, t.blocks)) {
      if (!pieces.empty() && pieces.back().end() == r.first) pieces.back().count += r.count;
      else pieces.push_back(r);
    }
  std::sort(pieces.begin(), pieces.end(), [](auto& a, auto& b) { return a.first < b.first; });
  return pieces;
}

}  // namespace raccel::scheduler
