#include "sim/packing.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <optional>
#include <random>
#include <tuple>

#include "sim/audit.h"
#include "sim/fgd.h"
#include "sim/csv.h"

namespace raccel::sim {

using scheduler::Card;
using scheduler::Pool;
using scheduler::VaccelId;

Result<std::vector<Pod>> loadOpenbPods(const std::string& path) {
  auto rows = RowReader::open(path, "the pod list", ',');
  if (!rows) return fail(rows.error());
  std::vector<std::string> header, f;
  rows->next(header);
  std::map<std::string, size_t> column;
  for (size_t i = 0; i < header.size(); ++i) column[header[i]] = i;
  // Required columns; memory_mib and gpu_spec are optional (some public lists carry
  // only name,cpu_milli,memory_mib,num_gpu,gpu_milli), and the rest (qos, phases,
  // times) is not used: absent or unknown values are fine.
  for (const char* need : {"cpu_milli", "num_gpu", "gpu_milli"})
    if (!column.count(need)) return fail(Code::invalidArgument, path + ": not an openb pod list (no column '" + std::string(need) + "')");
  auto columnOf = [&](const char* name) { return column.count(name) ? static_cast<long>(column[name]) : -1L; };
  const long nameAt = columnOf("name"), memAt = columnOf("memory_mib"), specAt = columnOf("gpu_spec");
  long last = 0;
  for (long c : {nameAt, memAt, specAt, columnOf("cpu_milli"), columnOf("num_gpu"), columnOf("gpu_milli")}) last = std::max(last, c);
  std::vector<Pod> pods;
  while (rows->next(f)) {
    std::string where = rows->where();
    if (static_cast<long>(f.size()) <= last) return fail(Code::invalidArgument, where + ": expected " + std::to_string(last + 1) + " fields");
    Pod pod;
    pod.name = nameAt >= 0 ? f[nameAt] : "pod-" + std::to_string(pods.size());
    auto cpu = parseCount(f[column["cpu_milli"]], where + " cpu_milli");
    auto mem = memAt >= 0 && !f[memAt].empty() ? parseCount(f[memAt], where + " memory_mib") : Result<uint64_t>(uint64_t{0});
    auto num = parseCount(f[column["num_gpu"]], where + " num_gpu");
    auto milli = parseCount(f[column["gpu_milli"]], where + " gpu_milli");
    for (auto* r : {&cpu, &mem, &num, &milli})
      if (!*r) return fail(r->error());
    // Bounds, so that no later sum wraps: a node of the trace has at most a few hundred
    // cores and TiB of memory, and 8 GPUs.
    if (*cpu > 10'000'000 || *mem > 100'000'000 || *num > 1024)
      return fail(Code::invalidArgument, where + ": cpu_milli <= 10000000, memory_mib <= 100000000, num_gpu <= 1024");
    pod.cpuMilli = *cpu;
    pod.memoryMib = *mem;
    pod.numGpu = static_cast<uint32_t>(*num);
    pod.gpuMilli = static_cast<uint32_t>(std::min<uint64_t>(*milli, 1001));
    if (pod.numGpu > 0 && (pod.gpuMilli == 0 || pod.gpuMilli > 1000))
      return fail(Code::invalidArgument, where + ": gpu_milli must be 1..1000 for a GPU pod");
    if (pod.numGpu > 1 && pod.gpuMilli != 1000)
      return fail(Code::invalidArgument, where + ": a pod of several GPUs must take whole GPUs (gpu_milli 1000)");
    if (pod.numGpu == 0) pod.gpuMilli = 0;
    if (specAt >= 0)
      for (auto& m : splitFields(f[specAt], '|'))
        if (!m.empty()) pod.models.push_back(m);
    pods.push_back(std::move(pod));
  }
  if (pods.empty()) return fail(Code::invalidArgument, path + ": no pods");
  return pods;
}

namespace {

bool modelAccepted(const Pod& pod, const Card& card) {
  return pod.models.empty() || std::find(pod.models.begin(), pod.models.end(), card.spec.model) != pod.models.end();
}

scheduler::HostVector hostOf(const Pod& pod) { return {pod.cpuMilli, pod.memoryMib}; }

}  // namespace

Pool::Request requestFor(const Pod& pod, Policy policy) {
  Pool::Request request;
  bool share = pod.gpuMilli < 1000;
  if (share && policy != Policy::wholeCardFirstFit) {
    request.shape = Pool::Shape::oneCard;
    request.cardMilli = pod.gpuMilli;
  } else {
    request.shape = Pool::Shape::wholeCards;
    request.wholeCards = pod.numGpu;
  }
  request.kinds = scheduler::maskOf(CardKind::gpu);
  request.host = hostOf(pod);
  request.accepts = [&pod](const Card& card) { return modelAccepted(pod, card); };
  return request;
}

namespace {

// FGD's fragmentation measure, in blocks, against the pod list's specs by count.
class FragMeter {
 public:
  explicit FragMeter(const std::vector<Pod>& pods) {
    std::map<std::tuple<uint64_t, uint64_t, uint32_t, uint32_t, std::vector<std::string>>, double> count;
    for (auto& p : pods) count[{p.cpuMilli, p.memoryMib, p.numGpu, p.gpuMilli, p.models}] += 1;
    for (auto& [key, n] : count) {
      Pod p;
      std::tie(p.cpuMilli, p.memoryMib, p.numGpu, p.gpuMilli, p.models) = key;
      specs_.push_back({std::move(p), n / pods.size()});
    }
  }

  double nodeFrag(const Cluster& c, size_t n) const {
    const auto& node = c.pool.nodes()[n];
    // A card's free capacity in blocks: the thousandths a share may still take there,
    // at most its free blocks (shares rounded up hold a little more than their thousandths).
    auto freeOf = [&](size_t card) {
      return std::min<double>(c.pool.cardFree(card), c.pool.cardFreeMilli(card) * c.pool.cards()[card].blocks.count / 1000.0);
    };
    double freeAll = 0;
    for (size_t card : node.cards) freeAll += freeOf(card);
    if (freeAll == 0) return 0;
    double frag = 0;
    for (auto& [pod, weight] : specs_) {
      double f = freeAll;
      bool resources = node.hostFits(hostOf(pod));
      if (resources && pod.numGpu == 1 && pod.gpuMilli < 1000) {
        f = 0;
        for (size_t card : node.cards)
          if (!modelAccepted(pod, c.pool.cards()[card]) || c.pool.cardFreeMilli(card) < pod.gpuMilli) f += freeOf(card);
      } else if (resources && pod.numGpu > 0) {
        uint32_t whole = 0;
        double unusable = 0;
        for (size_t card : node.cards) {
          const Card& k = c.pool.cards()[card];
          if (modelAccepted(pod, k) && c.pool.cardFree(card) == k.blocks.count) ++whole;
          else unusable += freeOf(card);
        }
        if (whole >= pod.numGpu) f = unusable;
      }
      frag += weight * f;
    }
    return frag;
  }

 private:
  std::vector<std::pair<Pod, double>> specs_;
};

// One node's repack for migrateFor, in thousandths of a card: the one-card holders that
// may move (items, from the card they are on), each card's room once they are lifted,
// how many movable blocks it holds, and whether a holder that cannot move pins it.
struct Repack {
  struct Item {
    VaccelId owner;
    const Pod* pod;
    long from;  // -1: the arriving pod
  };
  std::vector<Item> items;
  std::vector<uint32_t> room, movable;
  std::vector<bool> pinned, reserved;
};

Repack liftHolders(const Pool& pool, const scheduler::Node& node, const std::map<VaccelId, Pod>& oneCardHolders) {
  const size_t cards = node.cards.size();
  Repack r{{}, std::vector<uint32_t>(cards, 1000), std::vector<uint32_t>(cards, 0), std::vector<bool>(cards, false),
           std::vector<bool>(cards, false)};
  for (size_t i = 0; i < cards; ++i) {
    const Card& card = pool.cards()[node.cards[i]];
    std::vector<VaccelId> here;
    for (uint32_t b = card.blocks.first; b < card.blocks.end(); ++b) {
      VaccelId o = pool.ownerOf(b);
      if (o == scheduler::kNoOwner) continue;
      auto it = oneCardHolders.find(o);
      if (it == oneCardHolders.end()) r.pinned[i] = true, r.room[i] = 0;
      else ++r.movable[i];
      if (it == oneCardHolders.end() || std::find(here.begin(), here.end(), o) != here.end()) continue;
      here.push_back(o);
      r.items.push_back({o, &it->second, static_cast<long>(i)});
    }
  }
  return r;
}

// Each item, largest first, onto the card it leaves least free on (its own card on ties):
// the card of each item in r.items' new order, or nothing when one fits nowhere.
std::optional<std::vector<long>> bestFit(Repack& r, const Pool& pool, const scheduler::Node& node) {
  std::sort(r.items.begin(), r.items.end(), [&](auto& a, auto& b) { return a.pod->gpuMilli > b.pod->gpuMilli; });
  std::vector<long> to(r.items.size(), -1);
  for (size_t k = 0; k < r.items.size(); ++k) {
    const uint32_t need = r.items[k].pod->gpuMilli;
    long best = -1;
    for (size_t i = 0; i < r.room.size(); ++i) {
      if (r.reserved[i] || !modelAccepted(*r.items[k].pod, pool.cards()[node.cards[i]]) || r.room[i] < need) continue;
      const uint32_t left = r.room[i] - need;
      if (best < 0 || left < r.room[best] - need || (left == r.room[best] - need && static_cast<long>(i) == r.items[k].from))
        best = static_cast<long>(i);
    }
    if (best < 0) return std::nullopt;
    r.room[best] -= need, to[k] = best;
  }
  return to;
}

// Migration for a GPU pod that fits nowhere: on a node whose CPU/memory fit and whose
// accepted cards have enough free blocks in all, repack the node's one-card holders
// (largest first, each onto the card it leaves least free on) around the new pod: a
// one-card pod joins the repack; a whole-card pod keeps the accepted cards with the
// fewest movable blocks (and no whole-card holder) empty for itself. When that fits,
// the holders move (Pool::release, then Pool::assign of their new blocks).
bool migrateFor(Cluster& c, VaccelId owner, const Pod& pod, const std::map<VaccelId, Pod>& oneCardHolders,
                uint64_t& migrations) {
  const Pool& pool = c.pool;
  const bool share = pod.gpuMilli < 1000;
  for (size_t n = 0; n < pool.nodes().size(); ++n) {
    const auto& node = pool.nodes()[n];
    if (!node.hostFits(hostOf(pod))) continue;
    const size_t cards = node.cards.size();
    auto cardAt = [&](size_t i) -> const Card& { return pool.cards()[node.cards[i]]; };
    // Thousandths of accepted cards free in all: a share needs its own, whole cards 1000 each.
    uint32_t free = 0;
    bool anyCard = false;
    for (size_t i = 0; i < cards; ++i)
      if (modelAccepted(pod, cardAt(i))) anyCard = true, free += pool.cardFreeMilli(node.cards[i]);
    if (!anyCard || free < (share ? pod.gpuMilli : 1000 * pod.numGpu)) continue;
    Repack r = liftHolders(pool, node, oneCardHolders);
    if (share) {
      r.items.push_back({owner, &pod, -1});
    } else {
      std::vector<size_t> order;
      for (size_t i = 0; i < cards; ++i)
        if (modelAccepted(pod, cardAt(i)) && !r.pinned[i]) order.push_back(i);
      if (order.size() < pod.numGpu) continue;
      std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return r.movable[a] < r.movable[b]; });
      for (uint32_t k = 0; k < pod.numGpu; ++k) r.reserved[order[k]] = true, r.room[order[k]] = 0;
    }
    auto to = bestFit(r, pool, node);
    if (!to) continue;
    for (auto& it : r.items)
      if (it.owner != owner) c.pool.release(it.owner);
    for (size_t k = 0; k < r.items.size(); ++k) {
      const Repack::Item& it = r.items[k];
      size_t card = node.cards[static_cast<size_t>((*to)[k])];
      uint32_t blocks = pool.shareBlocksOn(card, it.pod->gpuMilli);
      if (blocks == 0) return false;  // the repack fit in thousandths, so it fits in blocks
      if (auto st = c.pool.assign(it.owner, pool.lowestFree(card, blocks), 0, hostOf(*it.pod), it.pod->gpuMilli); !st)
        return false;
      if (it.owner != owner && it.from != (*to)[k]) ++migrations;
    }
    if (!share) {
      std::vector<scheduler::BlockRange> ranges;
      for (size_t i = 0; i < cards; ++i)
        if (r.reserved[i]) ranges.push_back(cardAt(i).blocks);
      if (auto st = c.pool.assign(owner, ranges, 0, hostOf(pod)); !st) return false;
    }
    return true;
  }
  return false;
}

// A GPU pod: its policy's request, else (raccel, with migration) room made by moving
// one-card holders; the node it went to. A one-card holder is noted as one that may move.
std::optional<size_t> placeGpuPod(Cluster& c, VaccelId owner, const Pod& pod, const PackingOptions& options,
                                  std::map<VaccelId, Pod>& oneCardHolders, uint64_t& migrations) {
  Pool::Request request = requestFor(pod, options.policy);
  auto nodeOf = [&](uint32_t block) { return c.pool.cards()[static_cast<size_t>(c.pool.cardOf(block))].node; };
  std::optional<size_t> node;
  if (auto got = c.pool.allocate(owner, request)) node = nodeOf(got->front().first);
  else if (options.migrate && options.policy == Policy::raccel && migrateFor(c, owner, pod, oneCardHolders, migrations))
    node = nodeOf(c.pool.held(owner).front().first);
  if (node && request.shape == Pool::Shape::oneCard) oneCardHolders[owner] = pod;
  return node;
}

}  // namespace

Result<PackingRun> runPacking(const Cluster& base, const std::vector<Pod>& pods, const PackingOptions& options) {
  if (pods.empty()) return fail(Code::invalidArgument, "no pods to sample");
  Cluster c = base;
  c.pool.setFit(fitOf(options.policy), options.seed);
  std::mt19937_64 rng(options.seed);
  std::uniform_int_distribution<size_t> pick(0, pods.size() - 1);
  FragMeter meter(pods);
  std::vector<double> nodeFrag(c.pool.nodes().size());
  double fragTotal = 0;
  for (size_t n = 0; n < nodeFrag.size(); ++n) fragTotal += nodeFrag[n] = meter.nodeFrag(c, n);
  auto refresh = [&](size_t n) {
    double f = meter.nodeFrag(c, n);
    fragTotal += f - nodeFrag[n];
    nodeFrag[n] = f;
  };

  PackingRun run;
  const double capacity = c.cards, blocks = c.pool.total();
  double arrived = 0, placedGpus = 0;
  // The arrivals: drawn from the list until maxLoadPercent has arrived, or FGD's (sim/fgd.h).
  std::vector<const Pod*> fixed;
  if (options.fgdArrivals) fixed = fgdArrivals(pods, options.seed, options.maxLoadPercent / 100.0, c.cards);
  size_t nextFixed = 0;
  auto nextPod = [&]() -> const Pod* {
    if (!options.fgdArrivals) return run.alloc.size() <= options.maxLoadPercent ? &pods[pick(rng)] : nullptr;
    return nextFixed < fixed.size() ? fixed[nextFixed++] : nullptr;
  };
  std::vector<std::pair<uint64_t, uint64_t>> samples;  // GPU thousandths arrived, placed
  std::vector<VaccelId> holders;
  std::map<VaccelId, Pod> oneCardHolders;
  VaccelId next = 1;
  auto sample = [&] {
    run.alloc.push_back(100.0 * (blocks - c.pool.freeBlocks()) / blocks);
    run.frag.push_back(100.0 * fragTotal / blocks);
    run.placed.push_back(100.0 * placedGpus / capacity);
  };
  sample();  // 0%
  while (const Pod* arriving = nextPod()) {
    const Pod& pod = *arriving;
    ++run.arrived;
    arrived += pod.gpus();
    // CPU-only pods hold no blocks: the pool places their host needs by its fit.
    const VaccelId owner = pod.numGpu == 0 ? scheduler::kNoOwner : next++;
    std::optional<size_t> node;
    if (pod.numGpu > 0) node = placeGpuPod(c, owner, pod, options, oneCardHolders, run.migrations);
    else if (auto n = c.pool.placeHost(hostOf(pod))) node = *n;
    const bool placed = node.has_value();
    if (placed) refresh(*node);
    if (placed && owner != scheduler::kNoOwner) holders.push_back(owner);
    if (placed) ++run.placedPods, placedGpus += pod.gpus();
    else ++run.failedPods;
    if (options.audit)
      if (auto st = auditPool(c.pool, holders); !st) return fail(Code::internal, "after pod " + std::to_string(run.arrived) + ": " + st.error().message);
    while (run.alloc.size() <= options.maxLoadPercent && 100.0 * arrived / capacity >= run.alloc.size()) sample();
    samples.push_back({static_cast<uint64_t>(std::llround(arrived * 1000)), static_cast<uint64_t>(std::llround(placedGpus * 1000))});
  }
  while (run.alloc.size() <= options.maxLoadPercent) sample();  // FGD's arrivals stop just short of it
  run.placedDiscrete = fgdDiscreteCurve(samples, c.cards, options.maxLoadPercent);
  return run;
}

}  // namespace raccel::sim
