#include "scheduler/pool.h"

#include "common/limits.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <tuple>

namespace raccel::scheduler {

bool CardSpec::runs(ProgramKind kind) const {
  return std::find(programKinds.begin(), programKinds.end(), kind) != programKinds.end();
}

uint32_t Pool::blocksFor(double tflops) const {
  if (!(tflops > 0)) return 1;  // 0 (and anything not above it) means one block
  double blocks = std::ceil(tflops / blockTflops_ - 1e-9);
  // Saturates above any pool, so callers refuse it ("can never run here"), never wrap.
  if (!(blocks < double(limits::kMaxPoolBlocks))) return static_cast<uint32_t>(limits::kMaxPoolBlocks + 1);
  return std::max<uint32_t>(1, static_cast<uint32_t>(blocks));
}

Status Pool::checkNode(const std::string& name, const std::vector<CardSpec>& specs) const {
  using namespace limits;
  if (auto ok = checkName("node name", name); !ok) return ok;
  if (specs.size() > kMaxCardsPerNode)
    return fail(Code::invalidArgument, "a node may have at most " + std::to_string(kMaxCardsPerNode) + " cards (got " +
                                           std::to_string(specs.size()) + ")");
  uint64_t nodeBlocks = 0;
  for (auto& c : specs) {
    std::string card = "card " + std::to_string(c.index);
    if (auto ok = checkRange(card + " tflops", c.tflops, 0.0, double(kMaxBlocksPerCard) * blockTflops_); !ok) return ok;
    if (c.memoryBytes > kMaxCardMemoryBytes)
      return fail(Code::invalidArgument, card + " memory must be at most " + std::to_string(kMaxCardMemoryBytes) +
                                             " bytes (got " + std::to_string(c.memoryBytes) + ")");
    if (c.model.size() > kMaxTextBytes || c.backend.size() > kMaxTextBytes)
      return fail(Code::invalidArgument, card + ": model and backend names are at most " + std::to_string(kMaxTextBytes) + " bytes");
    if (c.openclExtensions.size() > kMaxExtensionBytes ||
        c.openclExtensions.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_ ") != std::string::npos)
      return fail(Code::invalidArgument, card + ": OpenCL extensions are names of letters, digits and '_' separated by "
                                                "spaces, at most " + std::to_string(kMaxExtensionBytes) + " bytes");
    if (auto ok = checkLimits(c.images); !ok) return fail(Code::invalidArgument, card + ": " + ok.error().message);
    for (auto& other : specs)
      if (&other != &c && other.index == c.index)
        return fail(Code::invalidArgument, "two cards have index " + std::to_string(c.index));
    nodeBlocks += static_cast<uint64_t>(std::floor(c.tflops / blockTflops_ + 1e-9));
  }
  if (nodeBlocks > kMaxBlocksPerNode)
    return fail(Code::invalidArgument, "node '" + name + "' would have " + std::to_string(nodeBlocks) + " blocks; at most " +
                                           std::to_string(kMaxBlocksPerNode) + " per node");
  if (uint64_t(next_) + nodeBlocks > kMaxPoolBlocks)
    return fail(Code::resourceExhausted, "the pool would exceed " + std::to_string(kMaxPoolBlocks) + " blocks with node '" +
                                             name + "' (" + std::to_string(nodeBlocks) + " blocks)");
  return {};
}

Result<size_t> Pool::addNode(const std::string& name, const std::vector<CardSpec>& specs, HostVector host) {
  if (auto ok = checkNode(name, specs); !ok) return fail(ok.error());
  std::vector<CardSpec> ordered(specs);
  std::stable_sort(ordered.begin(), ordered.end(),
                   [](const CardSpec& a, const CardSpec& b) { return a.kind < b.kind; });  // GPU, NPU, FPGA, CPU
  std::vector<uint32_t> counts;
  uint32_t nodeBlocks = 0;  // checked above: within kMaxBlocksPerNode
  for (auto& c : ordered) {
    counts.push_back(static_cast<uint32_t>(std::floor(c.tflops / blockTflops_ + 1e-9)));
    nodeBlocks += counts.back();
  }
  for (size_t n = 0; n < nodes_.size(); ++n) {
    if (nodes_[n].name != name) continue;
    if (nodes_[n].online) return fail(Code::permissionDenied, "node '" + name + "' is already registered");
    bool same = nodes_[n].cards.size() == ordered.size();
    for (size_t i = 0; same && i < ordered.size(); ++i) {
      const Card& c = cards_[nodes_[n].cards[i]];
      same = c.spec.kind == ordered[i].kind && c.blocks.count == counts[i] && c.spec.index == ordered[i].index;
    }
    if (!same) {
      nodes_[n].name += "~retired";  // its old numbers stay unused; the new layout gets new ones
      break;
    }
    nodes_[n].online = true;
    nodes_[n].host = host;  // what it reports now; what its holders still hold stays charged
    for (size_t i = 0; i < ordered.size(); ++i) {
      cards_[nodes_[n].cards[i]].spec = ordered[i];
      cardGroup_[nodes_[n].cards[i]] = groupOf(ordered[i]);
    }
    recountTotals();
    if (nodes_[n].placeable()) freeUnowned(n);
    return n;
  }
  Node node;
  node.name = name;
  node.online = true;
  node.blocks = {next_, nodeBlocks};
  node.host = host;
  owner_.resize(next_ + nodeBlocks, kNoOwner);
  for (size_t i = 0; i < ordered.size(); ++i) {
    node.cards.push_back(cards_.size());
    cardFirst_.push_back(next_);
    cardFree_.push_back(0);
    shareMilli_.push_back(0);
    shareBlocks_.push_back(0);
    cards_.push_back(Card{nodes_.size(), ordered[i], {next_, counts[i]}});
    cardGroup_.push_back(groupOf(ordered[i]));
    next_ += counts[i];
  }
  if (nodeBlocks) addFree(node.blocks);
  nodes_.push_back(std::move(node));
  recountTotals();
  return nodes_.size() - 1;
}

bool Pool::forgetNode(size_t n) {
  if (n >= nodes_.size() || nodes_[n].online || nodes_[n].forgotten) return false;
  for (uint32_t b = nodes_[n].blocks.first; b < nodes_[n].blocks.end(); ++b)
    if (owner_[b] != kNoOwner) return false;
  nodes_[n].forgotten = true;
  nodes_[n].name += "~forgotten";
  // The last node in the numbering gives its numbers back (a node that comes and goes
  // with new layouts cannot grow the numbering without bound); others keep theirs unused.
  if (n + 1 == nodes_.size() && nodes_[n].blocks.end() == next_) {
    for (size_t c = nodes_[n].cards.size(); c > 0; --c) {
      cards_.pop_back();
      cardGroup_.pop_back();
      cardFirst_.pop_back();
      cardFree_.pop_back();
      shareMilli_.pop_back();
      shareBlocks_.pop_back();
    }
    next_ = nodes_[n].blocks.first;
    owner_.resize(next_);
    nodes_.pop_back();
  }
  recountTotals();
  return true;
}

std::vector<VaccelId> Pool::removeNode(size_t n) {
  std::vector<VaccelId> affected;
  if (n >= nodes_.size() || !nodes_[n].online) return affected;
  bool wasPlaceable = nodes_[n].placeable();
  nodes_[n].online = false;
  recountTotals();
  BlockRange r = nodes_[n].blocks;
  for (uint32_t b = r.first; b < r.end(); ++b) {
    if (owner_[b] != kNoOwner) {
      if (std::find(affected.begin(), affected.end(), owner_[b]) == affected.end()) affected.push_back(owner_[b]);
    }
  }
  if (wasPlaceable) takeNodeFree(n);
  return affected;
}

void Pool::setDraining(size_t n, bool draining) {
  if (n >= nodes_.size() || nodes_[n].draining == draining) return;
  bool wasPlaceable = nodes_[n].placeable();
  nodes_[n].draining = draining;
  recountTotals();
  if (wasPlaceable && !nodes_[n].placeable()) takeNodeFree(n);
  if (!wasPlaceable && nodes_[n].placeable()) freeUnowned(n);
}

void Pool::freeUnowned(size_t n) {
  BlockRange r = nodes_[n].blocks;
  for (uint32_t b = r.first; b < r.end();) {
    uint32_t e = b;
    while (e < r.end() && owner_[e] == kNoOwner) ++e;
    if (e > b) addFree({b, e - b});
    b = e + 1;
  }
}

void Pool::takeNodeFree(size_t n) {
  BlockRange r = nodes_[n].blocks;
  auto it = free_.lower_bound(r.first);
  if (it != free_.begin()) {
    auto prev = std::prev(it);
    if (prev->first + prev->second > r.first) it = prev;
  }
  std::vector<BlockRange> toTake;
  for (; it != free_.end() && it->first < r.end(); ++it) {
    uint32_t s = std::max(it->first, r.first), e = std::min(it->first + it->second, r.end());
    if (e > s) toTake.push_back({s, e - s});
  }
  for (auto& t : toTake) takeFree(t);
}

void Pool::addFree(BlockRange range) {
  if (range.count == 0) return;
  uint32_t first = range.first, end = range.end();
  auto next = free_.lower_bound(first);
  if (next != free_.end() && next->first == end) {
    end += next->second;
    freeBySize_.erase({next->second, next->first});
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == first) {
      first = prev->first;
      freeBySize_.erase({prev->second, prev->first});
      free_.erase(prev);
    }
  }
  free_[first] = end - first;
  freeBySize_.insert({end - first, first});
  freeCount_ += range.count;
  adjustCardFree(range, true);
}

void Pool::adjustCardFree(BlockRange range, bool freed) {
  for (uint32_t b = range.first; b < range.end();) {
    long c = cardOf(b);
    if (c < 0) return;
    uint32_t e = std::min(range.end(), cards_[c].blocks.end());
    if (freed) cardFree_[c] += e - b;
    else cardFree_[c] -= e - b;
    b = e;
  }
}

void Pool::takeFree(BlockRange range) {
  auto it = std::prev(free_.upper_bound(range.first));
  uint32_t runFirst = it->first, runEnd = it->first + it->second;
  freeBySize_.erase({it->second, it->first});
  free_.erase(it);
  if (range.first > runFirst) {
    free_[runFirst] = range.first - runFirst;
    freeBySize_.insert({range.first - runFirst, runFirst});
  }
  if (runEnd > range.end()) {
    free_[range.end()] = runEnd - range.end();
    freeBySize_.insert({runEnd - range.end(), range.end()});
  }
  freeCount_ -= range.count;
  adjustCardFree(range, false);
}

long Pool::cardOf(uint32_t block) const {
  auto it = std::upper_bound(cardFirst_.begin(), cardFirst_.end(), block);
  if (it == cardFirst_.begin()) return -1;
  size_t i = static_cast<size_t>(it - cardFirst_.begin()) - 1;
  // Skip zero-block cards that share a first number with the next card.
  while (i > 0 && cards_[i].blocks.count == 0) --i;
  if (block >= cards_[i].blocks.end()) return -1;
  return static_cast<long>(i);
}

bool Pool::isFree(uint32_t block) const {
  auto it = free_.upper_bound(block);
  if (it == free_.begin()) return false;
  --it;
  return block < it->first + it->second;
}

void Pool::clip(BlockRange run, KindMask kinds, std::vector<BlockRange>& out) const {
  if (kinds == kAllKinds) {
    out.push_back(run);
    return;
  }
  long c = cardOf(run.first);
  uint32_t openFirst = 0;
  bool open = false;
  for (size_t i = static_cast<size_t>(std::max(c, 0L)); i < cards_.size() && cards_[i].blocks.first < run.end(); ++i) {
    const Card& card = cards_[i];
    if (card.blocks.count == 0) continue;
    uint32_t s = std::max(card.blocks.first, run.first), e = std::min(card.blocks.end(), run.end());
    if (e <= s) continue;
    if (kinds & maskOf(card.spec.kind)) {
      if (!open) {
        open = true;
        openFirst = s;
      }
    } else if (open) {
      out.push_back({openFirst, s - openFirst});
      open = false;
    }
  }
  if (open) out.push_back({openFirst, run.end() - openFirst});
}

Pool::Spanned Pool::spanned(BlockRange r) const {
  long first = cardOf(r.first), last = cardOf(r.end() - 1);
  if (first < 0 || last < 0) return {0, 0};
  return {static_cast<uint32_t>(cards_[last].node - cards_[first].node + 1), static_cast<uint32_t>(last - first + 1)};
}

Result<std::vector<BlockRange>> Pool::allocate(VaccelId owner, const Request& request) {
  const uint32_t want = request.blocks;
  if (owner == kNoOwner) return fail(Code::internal, "allocate: owner id 0 is reserved");
  if (held_.count(owner)) return fail(Code::internal, "allocate: vaccel " + std::to_string(owner) + " already holds blocks");
  if (request.shape != Shape::spread) return allocateShaped(owner, request);
  if (want == 0) return fail(Code::invalidArgument, "a virtual accelerator needs at least one block");
  if (auto s = shortfall(want, request.kinds)) return fail(Code::resourceExhausted, s->why);
  uint32_t total = this->total(request.kinds);
  uint32_t free = freeBlocks(request.kinds);
  if (want > free)
    return fail(Code::resourceExhausted, "not enough free compute: " + std::to_string(want) + " blocks requested, " +
                                             std::to_string(free) + " free of " + std::to_string(total));
  // Host needs bind the request to one node whose host has room: only its runs count.
  const bool hostBound = !request.host.empty();
  if (hostBound) {
    bool any = false;
    for (const Node& node : nodes_) any = any || (node.placeable() && node.hostFits(request.host));
    if (!any)
      return fail(Code::resourceExhausted, "not enough host resources: no online node's host has " + describeHost(request.host) + " left");
  }
  std::vector<BlockRange> runs;
  std::vector<BlockRange> pieces;
  if (auto one = contiguousPlace(request, runs)) {
    pieces.push_back(*one);
  } else {
    if (request.kinds == kAllKinds && !hostBound) {
      runs.clear();
      for (auto& [first, count] : free_) runs.push_back({first, count});
    }
    pieces = fragmentedPlace(want, runs);
  }
  uint32_t got = 0;
  for (auto& p : pieces) got += p.count;
  if (got < want)
    return fail(Code::resourceExhausted, "not enough free compute on one node whose host has " + describeHost(request.host) +
                                             " left: " + std::to_string(want) + " blocks requested");
  if (const uint32_t maxNodes = hostBound ? 1 : request.maxNodes) {
    std::set<size_t> nodes;
    for (auto& share : cardsOf(pieces)) nodes.insert(cards_[share.card].node);
    if (nodes.size() > maxNodes)
      return fail(Code::resourceExhausted, "no placement on " + std::to_string(maxNodes) + " node(s) now: " + std::to_string(want) +
                                               " blocks would span " + std::to_string(nodes.size()));
  }
  record(owner, pieces, request.priority, request.host);
  return pieces;
}

std::optional<BlockRange> Pool::contiguousPlace(const Request& request, std::vector<BlockRange>& runs) const {
  // One contiguous range: at either end of a run, so free space is never cut in two.
  const uint32_t want = request.blocks;
  using Score = std::tuple<uint32_t, uint32_t, uint32_t, uint32_t>;  // nodes, cards, leftover, first
  std::optional<BlockRange> chosen;
  Score best{};
  // Returns true when no later run can do better.
  auto consider = [&](BlockRange run) {
    if (run.count < want) return false;
    for (BlockRange place : {BlockRange{run.first, want}, BlockRange{run.end() - want, want}}) {
      const Spanned span = spanned(place);
      Score s{span.nodes, span.cards, run.count - want, place.first};
      if (!chosen || s < best) {
        best = s;
        chosen = place;
      }
    }
    return std::get<0>(best) == 1 && std::get<1>(best) == 1;
  };
  // Candidates: all kinds from the size index, smallest fitting first (once a place on
  // one node and one card is found, a later run can only leave more over), at most 64;
  // with kinds, every free run clipped to them; with host needs, only the pieces of
  // nodes whose host has room. `runs` keeps the clipped runs for a fragmented placement.
  if (!request.host.empty()) {
    std::vector<BlockRange> clipped;
    for (auto& [first, count] : free_) clip({first, count}, request.kinds, clipped);
    for (BlockRange run : clipped)
      forEachNodePiece(run, [&](size_t node, BlockRange piece) {
        if (nodes_[node].hostFits(request.host)) runs.push_back(piece);
      });
    for (auto& run : runs) consider(run);
  } else if (request.kinds == kAllKinds) {
    int seen = 0;
    for (auto it = freeBySize_.lower_bound({want, 0}); it != freeBySize_.end() && seen < 64; ++it, ++seen)
      if (consider({it->second, it->first})) break;
  } else {
    for (auto& [first, count] : free_) clip({first, count}, request.kinds, runs);
    for (auto& run : runs)
      consider(run);  // clipped runs come in block order, not size order: see them all
  }
  return chosen;
}

namespace {
// `want` blocks from `from`: the largest runs first, the last piece from the run that
// best fits what is left.
std::vector<BlockRange> takeLargest(std::vector<BlockRange> from, uint32_t want) {
  std::sort(from.begin(), from.end(), [](auto& a, auto& b) { return a.count != b.count ? a.count > b.count : a.first < b.first; });
  std::vector<BlockRange> out;
  uint32_t left = want;
  for (size_t i = 0; i < from.size() && left > 0; ++i) {
    if (from[i].count >= left) {
      size_t bestFit = i;
      for (size_t j = i; j < from.size() && from[j].count >= left; ++j) bestFit = j;
      out.push_back({from[bestFit].first, left});
      left = 0;
    } else {
      out.push_back(from[i]);
      left -= from[i].count;
    }
  }
  return out;
}
}  // namespace

std::vector<BlockRange> Pool::fragmentedPlace(uint32_t want, const std::vector<BlockRange>& runs) const {
  // On one node when one has enough (the node needing the fewest pieces, then the one
  // left fullest), else across the fewest nodes (the freest first). Free runs are cut at
  // node boundaries (a run may cross from one node into the next).
  std::map<size_t, std::vector<BlockRange>> byNode;
  std::map<size_t, uint32_t> nodeFree;
  for (BlockRange run : runs)
    forEachNodePiece(run, [&](size_t node, BlockRange piece) {
      byNode[node].push_back(piece);
      nodeFree[node] += piece.count;
    });
  std::vector<BlockRange> pieces;
  std::tuple<size_t, uint32_t> bestNode{SIZE_MAX, 0};
  for (auto& [node, nodeRuns] : byNode) {
    uint32_t have = nodeFree[node];
    if (have < want) continue;
    auto candidate = takeLargest(nodeRuns, want);
    std::tuple<size_t, uint32_t> score{candidate.size(), have - want};
    if (score < bestNode) bestNode = score, pieces = std::move(candidate);
  }
  if (pieces.empty()) {
    // Across nodes: the fewest nodes, so the nodes with the most free blocks first.
    std::vector<std::pair<uint32_t, size_t>> nodesByFree;
    for (auto& [node, have] : nodeFree) nodesByFree.push_back({have, node});
    std::stable_sort(nodesByFree.begin(), nodesByFree.end(), [](auto& a, auto& b) { return a.first > b.first; });
    uint32_t left = want;
    for (auto& [have, node] : nodesByFree) {
      auto& nodeRuns = byNode[node];
      std::sort(nodeRuns.begin(), nodeRuns.end(), [](auto& a, auto& b) { return a.count > b.count; });
      for (auto& r : nodeRuns) {
        if (left == 0) break;
        uint32_t n = std::min(left, r.count);
        pieces.push_back({r.first, n});
        left -= n;
      }
      if (left == 0) break;
    }
  }
  std::sort(pieces.begin(), pieces.end(), [](auto& a, auto& b) { return a.first < b.first; });
  return pieces;
}

void Pool::record(VaccelId owner, std::vector<BlockRange> pieces, int priority, HostVector host, size_t shareCard,
                  uint32_t shareMilli) {
  Holding& h = held_[owner];
  h.blocks = 0;
  for (auto& p : pieces) {
    takeFree(p);
    std::fill(owner_.begin() + p.first, owner_.begin() + p.end(), owner);
    h.blocks += p.count;
  }
  h.ranges = std::move(pieces);
  h.priority = priority;
  h.admitted = ++admissions_;
  victims_.insert(victimKey(owner, h));
  holdExtras(h, host, shareCard, shareMilli);
}

void Pool::holdExtras(Holding& h, HostVector host, size_t shareCard, uint32_t shareMilli) {
  if (!host.empty() && !h.ranges.empty()) {
    h.host = host;
    h.hostNode = cards_[static_cast<size_t>(cardOf(h.ranges.front().first))].node;
    chargeHost(h.hostNode, host, true);
  }
  if (shareMilli && shareCard < cards_.size()) {
    h.shareCard = shareCard;
    h.shareMilli = shareMilli;
    shareMilli_[shareCard] += shareMilli;
    shareBlocks_[shareCard] += h.blocks;
  }
}

Status Pool::assign(VaccelId owner, const std::vector<BlockRange>& ranges, int priority, HostVector host, uint32_t cardMilli) {
  if (owner == kNoOwner) return fail(Code::internal, "assign: owner id 0 is reserved");
  if (held_.count(owner)) return fail(Code::internal, "assign: vaccel " + std::to_string(owner) + " already holds blocks");
  uint32_t blocks = 0;
  for (auto& r : ranges) {
    if (r.count == 0 || r.first == 0 || r.end() - 1 > highestBlock())
      return fail(Code::invalidArgument, "blocks " + std::to_string(r.first) + "+" + std::to_string(r.count) +
                                             " are not in the pool (it has blocks 1-" + std::to_string(highestBlock()) + ")");
    for (uint32_t b = r.first; b < r.end(); ++b)
      if (owner_[b] != kNoOwner)
        return fail(Code::invalidArgument, "block " + std::to_string(b) + " is held by vaccel " + std::to_string(owner_[b]));
    blocks += r.count;
  }
  if (blocks == 0) return fail(Code::invalidArgument, "assign: no blocks");
  long shareCard = cardMilli ? cardOf(ranges.front().first) : -1;
  if (cardMilli) {
    for (auto& r : ranges)
      if (cardOf(r.first) != shareCard || cardOf(r.end() - 1) != shareCard)
        return fail(Code::invalidArgument, "assign: a share of one card must hold blocks of one card");
    if (cardMilli > 1000 || shareMilli_[shareCard] + cardMilli > 1000)
      return fail(Code::invalidArgument, "assign: the card's shares would exceed the whole card");
  }
  for (auto& r : ranges) {
    for (uint32_t b = r.first; b < r.end(); ++b) {
      if (isFree(b)) takeFree({b, 1});
      owner_[b] = owner;
    }
  }
  Holding& h = held_[owner];
  h.ranges = ranges;
  std::sort(h.ranges.begin(), h.ranges.end(), [](auto& a, auto& b) { return a.first < b.first; });
  h.priority = priority;
  h.admitted = ++admissions_;
  h.blocks = blocks;
  victims_.insert(victimKey(owner, h));
  holdExtras(h, host, cardMilli ? static_cast<size_t>(shareCard) : SIZE_MAX, cardMilli);
  return {};
}

void Pool::setPriority(VaccelId owner, int priority) {
  auto it = held_.find(owner);
  if (it == held_.end() || it->second.priority == priority) return;
  victims_.erase(victimKey(owner, it->second));
  it->second.priority = priority;
  victims_.insert(victimKey(owner, it->second));
}

void Pool::release(VaccelId owner) {
  auto it = held_.find(owner);
  if (it == held_.end()) return;
  victims_.erase(victimKey(owner, it->second));
  const Holding& h = it->second;
  if (h.hostNode < nodes_.size()) chargeHost(h.hostNode, h.host, false);
  if (h.shareCard < cards_.size()) {
    shareMilli_[h.shareCard] -= std::min(shareMilli_[h.shareCard], h.shareMilli);
    shareBlocks_[h.shareCard] -= std::min(shareBlocks_[h.shareCard], h.blocks);
  }
  for (auto& p : it->second.ranges) {
    std::fill(owner_.begin() + p.first, owner_.begin() + p.end(), kNoOwner);
    // Blocks of offline nodes are not returned to the free pool.
    forEachNodePiece(p, [&](size_t node, BlockRange piece) {
      if (nodes_[node].placeable()) addFree(piece);
    });
  }
  held_.erase(it);
}

const std::vector<BlockRange>& Pool::held(VaccelId owner) const {
  static const std::vector<BlockRange> kNone;
  auto it = held_.find(owner);
  return it == held_.end() ? kNone : it->second.ranges;
}

int Pool::priorityOf(VaccelId owner) const {
  auto it = held_.find(owner);
  return it == held_.end() ? 0 : it->second.priority;
}

Result<std::vector<VaccelId>> Pool::planPreemption(const Request& request) const {
  if (auto s = shortfall(request.blocks, request.kinds)) return fail(Code::resourceExhausted, s->why);
  uint32_t have = freeBlocks(request.kinds);
  std::vector<VaccelId> chosen;
  for (auto it = victims_.begin(); it != victims_.end() && have < request.blocks; ++it) {
    auto [priority, notAdmitted, owner] = *it;
    if (priority >= request.priority) break;
    uint32_t gain = 0;
    for (auto& [node, blocks] : reclaimableFrom(owner, request.kinds)) gain += blocks;
    if (gain == 0) continue;
    chosen.push_back(owner);
    have += gain;
  }
  if (have < request.blocks)
    return fail(Code::resourceExhausted, "not enough compute even by preemption: " + std::to_string(request.blocks) +
                                             " blocks requested, " + std::to_string(have) +
                                             " free or held by work it outranks");
  if (!request.maxNodes && request.host.empty()) return chosen;
  // Enough blocks is not enough when the request limits its nodes or needs room on a
  // node's host (even free blocks enough in all may not be where it can go): the plan is
  // tried on a copy, so nobody is suspended for a request that would still wait. The
  // pool-wide plan (the lowest priorities wherever they are) is tried first; when it
  // does not place the request, plans that take victims from a few nodes only, the
  // cheapest first.
  std::string why;
  if (auto plan = tryPlan(request, chosen, why)) return std::move(*plan);
  for (auto& local : localPlans(request)) {
    if (auto plan = tryPlan(request, local, why)) return std::move(*plan);
  }
  return fail(Code::resourceExhausted, "not even by preemption: " + why);
}

std::map<size_t, uint32_t> Pool::reclaimableFrom(VaccelId owner, KindMask kinds) const {
  std::map<size_t, uint32_t> gain;
  for (auto& share : cardsOf(held_.at(owner).ranges)) {
    const Card& c = cards_[share.card];
    if ((kinds & maskOf(c.spec.kind)) && nodes_[c.node].placeable()) gain[c.node] += share.blocks;
  }
  return gain;
}

std::optional<std::vector<VaccelId>> Pool::tryPlan(const Request& request, const std::vector<VaccelId>& victims,
                                                   std::string& why) const {
  Pool trial = *this;
  for (VaccelId v : victims) trial.release(v);
  auto placed = trial.allocate(~VaccelId{0}, request);
  if (!placed) {
    why = placed.error().message;
    return std::nullopt;
  }
  // Victims whose blocks the placement does not use, and whose host room it does not
  // need, are spared (tried again without them, so the fit's choice still holds).
  std::set<size_t> usedNodes;
  for (auto& share : cardsOf(*placed)) usedNodes.insert(cards_[share.card].node);
  std::vector<VaccelId> needed;
  for (VaccelId v : victims) {
    bool used = false;
    for (auto& share : cardsOf(held_.at(v).ranges)) used |= usedNodes.count(cards_[share.card].node) > 0;
    if (used) needed.push_back(v);
  }
  if (needed.size() < victims.size()) {
    Pool spare = *this;
    for (VaccelId v : needed) spare.release(v);
    if (spare.allocate(~VaccelId{0}, request)) return needed;
  }
  return victims;
}

std::vector<std::vector<VaccelId>> Pool::localPlans(const Request& request) const {
  // At most this many nodes: the request's limit, or one when it needs a host's room.
  size_t span = request.host.empty() ? request.maxNodes : 1;
  if (span == 0) return {};
  // Free blocks per node, and what each victim (lower priority than the request, in
  // preemption order) would free on each node.
  std::vector<uint32_t> freeOn(nodes_.size(), 0), reclaim(nodes_.size(), 0);
  for (size_t c = 0; c < cards_.size(); ++c)
    if (request.kinds & maskOf(cards_[c].spec.kind)) freeOn[cards_[c].node] += cardFree_[c];
  struct Victim {
    VaccelId owner;
    int priority;
    uint32_t blocks;
    std::map<size_t, uint32_t> gain;  // node -> blocks of accepted kinds
  };
  std::vector<Victim> victims;
  for (auto& [priority, notAdmitted, owner] : victims_) {
    if (priority >= request.priority) break;
    Victim v{owner, priority, held_.at(owner).blocks, reclaimableFrom(owner, request.kinds)};
    for (auto& [node, blocks] : v.gain) reclaim[node] += blocks;
    if (!v.gain.empty()) victims.push_back(std::move(v));
  }
  std::vector<size_t> byReclaim;
  for (size_t n = 0; n < nodes_.size(); ++n)
    if (nodes_[n].placeable() && freeOn[n] + reclaim[n] > 0) byReclaim.push_back(n);
  std::stable_sort(byReclaim.begin(), byReclaim.end(),
                   [&](size_t a, size_t b) { return freeOn[a] + reclaim[a] > freeOn[b] + reclaim[b]; });
  // One plan per anchor node: it and the span - 1 other nodes with the most to give;
  // victims there in preemption order until the free blocks suffice. Cheapest first:
  // the lowest highest priority taken, then the fewest blocks suspended, then the plan
  // that goes least far down the preemption order.
  using Cost = std::tuple<int, uint64_t, size_t>;
  std::vector<std::pair<Cost, std::vector<VaccelId>>> plans;
  for (size_t anchor : byReclaim) {
    std::set<size_t> nodes{anchor};
    for (size_t n : byReclaim)
      if (nodes.size() < span) nodes.insert(n);
    uint64_t have = 0;
    for (size_t n : nodes) have += freeOn[n];
    std::vector<VaccelId> taken;
    int worst = INT_MIN;
    uint64_t suspended = 0;
    size_t last = 0;
    for (size_t k = 0; k < victims.size(); ++k) {
      const Victim& v = victims[k];
      if (have >= request.blocks) break;
      uint32_t gain = 0;
      for (auto& [node, blocks] : v.gain)
        if (nodes.count(node)) gain += blocks;
      if (gain == 0) continue;
      taken.push_back(v.owner);
      have += gain;
      worst = std::max(worst, v.priority);
      suspended += v.blocks;
      last = k;
    }
    if (have < request.blocks || taken.empty()) continue;
    plans.push_back({Cost{worst, suspended, last}, std::move(taken)});
  }
  std::sort(plans.begin(), plans.end());
  std::vector<std::vector<VaccelId>> out;
  for (auto& plan : plans) {
    if (std::find(out.begin(), out.end(), plan.second) != out.end()) continue;
    out.push_back(std::move(plan.second));
    if (out.size() == kLocalPlansTried) break;
  }
  return out;
}

std::vector<Pool::Move> Pool::planCompaction(size_t maxMoves, uint32_t maxBlocksPerMove) const {
  std::vector<Move> moves;
  // Regions: maximal runs of cards of one kind inside one online node.
  for (const Node& node : nodes_) {
    if (!node.placeable()) continue;
    for (size_t i = 0; i < node.cards.size();) {
      CardKind kind = cards_[node.cards[i]].spec.kind;
      size_t j = i;
      while (j < node.cards.size() && cards_[node.cards[j]].spec.kind == kind) ++j;
      BlockRange region{cards_[node.cards[i]].blocks.first, 0};
      region.count = cards_[node.cards[j - 1]].blocks.end() - region.first;
      i = j;
      // Walk the region in block order: whole holders slide down to the cursor; a
      // holder with blocks outside the region is a wall the cursor jumps over.
      uint32_t cursor = region.first;
      std::set<VaccelId> seen;
      for (uint32_t b = region.first; b < region.end(); ++b) {
        VaccelId owner = owner_[b];
        if (owner == kNoOwner || seen.count(owner)) continue;
        seen.insert(owner);
        const Holding& h = held_.at(owner);
        // A share of one card stays on its card: it is a wall too.
        bool inside = h.shareCard == SIZE_MAX;
        for (auto& r : h.ranges) inside = inside && r.first >= region.first && r.end() <= region.end();
        if (!inside) {
          uint32_t wallEnd = b;
          while (wallEnd < region.end() && owner_[wallEnd] == owner) ++wallEnd;
          cursor = std::max(cursor, wallEnd);
          continue;
        }
        // The target must not run into a wall (a holder that is not moving).
        // ... nor out of the region: a cursor past a staying holder's far range may leave
        // too little room before the region's end.
        BlockRange to{cursor, h.blocks};
        bool clear = to.end() <= region.end();
        for (uint32_t t = to.first; t < to.end() && clear; ++t) {
          VaccelId o = owner_[t];
          if (o == kNoOwner || o == owner || seen.count(o)) continue;  // free, itself, or already moved on
          clear = false;
        }
        bool alreadyThere = h.ranges.size() == 1 && h.ranges[0].first == cursor;
        if (clear && !alreadyThere && (maxBlocksPerMove == 0 || h.blocks <= maxBlocksPerMove)) {
          moves.push_back(Move{owner, h.ranges, to});
          if (maxMoves && moves.size() >= maxMoves) return moves;
          cursor = to.end();
        } else {
          // Stays: the cursor continues after its last block.
          for (auto& r : h.ranges) cursor = std::max(cursor, r.end());
        }
      }
    }
  }
  return moves;
}

Status Pool::applyMove(const Move& move) {
  auto it = held_.find(move.owner);
  if (it == held_.end() || it->second.ranges != move.from || move.to.count != it->second.blocks)
    return fail(Code::internal, "move of vaccel " + std::to_string(move.owner) + " no longer matches the pool");
  for (uint32_t b = move.to.first; b < move.to.end(); ++b)
    if (owner_[b] != kNoOwner && owner_[b] != move.owner)
      return fail(Code::internal, "move of vaccel " + std::to_string(move.owner) + " onto block " + std::to_string(b) +
                                      " held by vaccel " + std::to_string(owner_[b]));
  for (auto& r : move.from) {
    std::fill(owner_.begin() + r.first, owner_.begin() + r.end(), kNoOwner);
    addFree(r);
  }
  takeFree(move.to);
  std::fill(owner_.begin() + move.to.first, owner_.begin() + move.to.end(), move.owner);
  it->second.ranges = {move.to};
  return {};
}

std::vector<CardShare> Pool::cardsOf(const std::vector<BlockRange>& ranges) const {
  std::vector<CardShare> out;
  for (auto& r : ranges) {
    for (uint32_t b = r.first; b < r.end();) {
      long c = cardOf(b);
      if (c < 0) break;
      uint32_t e = std::min(r.end(), cards_[c].blocks.end());
      if (!out.empty() && out.back().card == static_cast<size_t>(c)) out.back().blocks += e - b;
      else out.push_back({static_cast<size_t>(c), e - b});
      b = e;
    }
  }
  return out;
}

uint32_t Pool::fewestNodesFor(uint32_t blocks, KindMask kinds) const {
  std::vector<uint32_t> sizes;
  for (const Node& node : nodes_) {
    if (!node.placeable()) continue;
    uint32_t n = 0;
    for (size_t c : node.cards)
      if (kinds & maskOf(cards_[c].spec.kind)) n += cards_[c].blocks.count;
    sizes.push_back(n);
  }
  std::sort(sizes.begin(), sizes.end(), std::greater<>());
  uint64_t sum = 0;
  for (size_t i = 0; i < sizes.size(); ++i)
    if ((sum += sizes[i]) >= blocks) return static_cast<uint32_t>(i + 1);
  return 0;
}

void Pool::recountTotals() {
  std::fill(std::begin(totalByKind_), std::end(totalByKind_), 0);
  std::fill(std::begin(heldBackByKind_), std::end(heldBackByKind_), 0);
  std::fill(std::begin(awayByKind_), std::end(awayByKind_), 0);
  for (auto& card : cards_) {
    const Node& node = nodes_[card.node];
    if (node.forgotten) continue;
    const auto kind = static_cast<unsigned>(card.spec.kind);
    (node.placeable() ? totalByKind_ : heldBackByKind_)[kind] += card.blocks.count;
    if (!node.online && !node.draining) awayByKind_[kind] += card.blocks.count;
  }
}

namespace {
uint32_t sumKinds(const uint32_t (&byKind)[4], KindMask kinds) {
  uint32_t n = 0;
  for (unsigned k = 0; k < 4; ++k)
    if (kinds & (1u << k)) n += byKind[k];
  return n;
}
}  // namespace

Pool::BlockState Pool::blockState(uint32_t block) const {
  if (ownerOf(block) != kNoOwner) return BlockState::used;
  long card = cardOf(block);
  if (card < 0) return BlockState::offline;
  const Node& node = nodes_[cards_[static_cast<size_t>(card)].node];
  return !node.online ? BlockState::offline : node.draining ? BlockState::draining : BlockState::free;
}

const char* Pool::blockStateName(BlockState state) {
  switch (state) {
    case BlockState::free: return "free";
    case BlockState::used: return "used";
    case BlockState::draining: return "draining";
    case BlockState::offline: return "offline";
  }
  return "offline";
}

uint32_t Pool::total(KindMask kinds) const { return sumKinds(totalByKind_, kinds); }
uint32_t Pool::heldBack(KindMask kinds) const { return sumKinds(heldBackByKind_, kinds); }

std::optional<Pool::Shortfall> Pool::shortfall(uint32_t want, KindMask kinds) const {
  const uint32_t now = total(kinds), back = heldBack(kinds), away = sumKinds(awayByKind_, kinds);
  if (want <= now) return std::nullopt;
  const std::string asked = std::to_string(want) + " blocks requested, ";
  if (want > now + back)  // both within kMaxPoolBlocks: no wrap
    return Shortfall{true, false, "can never run here: " + asked + "the pool has " + std::to_string(now + back) +
                               " of the accepted kinds in total"};
  std::string names;
  size_t named = 0;
  for (auto& n : nodes_) {
    if (n.forgotten || n.placeable()) continue;
    if (named++ < 4) names += (names.empty() ? "" : ", ") + n.name + (n.online ? " draining" : " offline");
  }
  if (named > 4) names += ", ...";
  return Shortfall{false, want <= now + away, "not now: " + asked + std::to_string(now) + " of the accepted kinds take work now and " +
                              std::to_string(back) + " more are on netaccels that take none (" + names + ")"};
}

uint32_t Pool::freeBlocks(KindMask kinds) const {
  if (kinds == kAllKinds) return freeCount_;
  std::vector<BlockRange> runs;
  for (auto& [first, count] : free_) clip({first, count}, kinds, runs);
  uint32_t n = 0;
  for (auto& r : runs) n += r.count;
  return n;
}

}  // namespace raccel::scheduler
