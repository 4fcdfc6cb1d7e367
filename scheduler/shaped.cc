// Shaped requests (Pool::Shape) and the fits that choose their place (Pool::Fit).
//
// The fragmentation model of Fit::raccel: for the demand seen so far (shapes by
// count), a card's free blocks are fragmented for a oneCard shape when that shape needs
// more than the card has free, and a node's partly used cards are fragmented for a
// wholeCards shape (all its free blocks when it lacks enough whole cards). A place is
// scored by how much it grows the expected fragmentation of its node. oneCard demand is
// separable per card, so it is tabulated per card size and free count; wholeCards
// demand needs only the node's count of whole free cards and its free sums.
#include <algorithm>
#include <tuple>

#include "scheduler/pool.h"

namespace raccel::scheduler {

uint32_t Pool::blocksOfCard(uint32_t cardMilli, uint32_t cardBlocks) {
  return static_cast<uint32_t>((static_cast<uint64_t>(cardMilli) * cardBlocks + 999) / 1000);
}

void Pool::setFit(Fit fit, uint64_t seed) {
  fit_ = fit;
  rng_.seed(seed);
}

void Pool::learnDemand(const Request& request) {
  if (request.shape == Shape::oneCard) ++seenMilli_[request.cardMilli];
  else ++seenWhole_[request.wholeCards];
  ++seen_;
}

void Pool::rebuildFragTables() {
  seenAtBuild_ = seen_;
  fragOfCard_.clear();
  wholeShare_.clear();
  if (seen_ == 0) return;
  const double total = static_cast<double>(seen_);
  for (const Card& card : cards_) {
    uint32_t size = card.blocks.count;
    if (size == 0 || fragOfCard_.count(size)) continue;
    std::vector<double> table(size + 1, 0.0);
    for (auto& [milli, count] : seenMilli_) {
      uint32_t need = blocksOfCard(milli, size);
      for (uint32_t f = 0; f <= size && f < need; ++f) table[f] += count / total * f;
    }
    fragOfCard_[size] = std::move(table);
  }
  for (auto& [n, count] : seenWhole_) wholeShare_.push_back({n, count / total});
}

double Pool::fragDelta(const Node& node, const std::vector<std::pair<size_t, uint32_t>>& take) {
  // Tables follow the demand: rebuilt when it has grown by an eighth (at least 16 requests).
  if (fragOfCard_.empty() || seen_ >= seenAtBuild_ + std::max<uint64_t>(16, seenAtBuild_ / 8)) rebuildFragTables();
  double delta = 0;
  for (auto& [c, blocks] : take) {
    const auto& table = fragOfCard_[cards_[c].blocks.count];
    if (table.empty()) continue;
    delta += table[cardFree_[c] - blocks] - table[cardFree_[c]];
  }
  if (wholeShare_.empty()) return delta;
  // Whole free cards, blocks free on partly used cards, blocks free: before and after.
  uint32_t whole[2] = {}, partial[2] = {}, free[2] = {};
  for (size_t c : node.cards) {
    uint32_t size = cards_[c].blocks.count;
    if (size == 0) continue;
    uint32_t before = cardFree_[c], after = before;
    for (auto& [t, blocks] : take)
      if (t == c) after -= blocks;
    uint32_t state[2] = {before, after};
    for (int i = 0; i < 2; ++i) {
      free[i] += state[i];
      if (state[i] == size) ++whole[i];
      else partial[i] += state[i];
    }
  }
  for (auto& [n, share] : wholeShare_) {
    double before = whole[0] >= n ? partial[0] : free[0];
    double after = whole[1] >= n ? partial[1] : free[1];
    delta += share * (after - before);
  }
  return delta;
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
  learnDemand(request);
  auto accepted = [&](const Card& c) {
    return c.blocks.count > 0 && (request.kinds & maskOf(c.spec.kind)) && (!request.accepts || request.accepts(c));
  };

  // The chosen place: its cards and the blocks taken from each.
  using Score = std::tuple<double, uint32_t, uint32_t, uint32_t>;  // fit's figure, then tie-breaks
  std::vector<std::pair<size_t, uint32_t>> best, take;
  Score bestScore{};
  uint64_t seenPlaces = 0;
  bool anyAccepted = false;
  auto consider = [&](const Node& node, uint32_t nodeFree) {
    uint32_t taken = 0;
    for (auto& [c, blocks] : take) taken += blocks;
    const Card& first = cards_[take.front().first];
    uint32_t cardLeft = oneCard ? cardFree_[take.front().first] - taken : 0;
    Score score;
    switch (fit_) {
      case Fit::firstFit: score = {0, 0, 0, first.blocks.first}; break;
      case Fit::bestFit: score = {nodeFree - taken, cardLeft, 0, first.blocks.first}; break;
      case Fit::random: score = {0, 0, 0, 0}; break;
      case Fit::raccel: score = {fragDelta(node, take), cardLeft, nodeFree - taken, first.blocks.first}; break;
    }
    ++seenPlaces;
    bool better = best.empty() || score < bestScore;
    if (fit_ == Fit::random) better = std::uniform_int_distribution<uint64_t>(1, seenPlaces)(rng_) == 1;  // reservoir
    if (better) {
      best = take;
      bestScore = score;
    }
  };
  for (const Node& node : nodes_) {
    if (!node.placeable()) continue;
    uint32_t nodeFree = 0;
    for (size_t c : node.cards) nodeFree += cardFree_[c];
    if (oneCard) {
      for (size_t c : node.cards) {
        if (!accepted(cards_[c])) continue;
        anyAccepted = true;
        uint32_t need = blocksOfCard(request.cardMilli, cards_[c].blocks.count);
        if (cardFree_[c] < need) continue;
        take = {{c, need}};
        consider(node, nodeFree);
      }
    } else {
      take.clear();
      uint32_t acceptedCards = 0;
      for (size_t c : node.cards) {
        if (!accepted(cards_[c])) continue;
        ++acceptedCards;
        if (cardFree_[c] == cards_[c].blocks.count && take.size() < request.wholeCards) take.push_back({c, cardFree_[c]});
      }
      anyAccepted = anyAccepted || acceptedCards >= request.wholeCards;
      if (take.size() == request.wholeCards) consider(node, nodeFree);
    }
  }
  std::string what = oneCard ? std::to_string(request.cardMilli) + "/1000 of one card"
                             : std::to_string(request.wholeCards) + " whole card(s) of one node";
  if (best.empty())
    return fail(Code::resourceExhausted, anyAccepted ? "not enough free compute: no place has " + what + " free"
                                                     : "can never run here: no online card or node it accepts offers " + what);

  // The blocks: each card's lowest free blocks; adjacent pieces joined.
  std::vector<BlockRange> pieces;
  for (auto& [c, blocks] : best)
    for (BlockRange r : lowestFree(c, blocks)) {
      if (!pieces.empty() && pieces.back().end() == r.first) pieces.back().count += r.count;
      else pieces.push_back(r);
    }
  std::sort(pieces.begin(), pieces.end(), [](auto& a, auto& b) { return a.first < b.first; });
  record(owner, pieces, request.priority);
  return pieces;
}

}  // namespace raccel::scheduler
