#include "sim/fgd.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <random>
#include <tuple>

#include "sim/csv.h"

namespace raccel::sim {

namespace {

constexpr uint32_t kMilli = 1000;
// BestFit's normalization: 128 cores and 8 GPUs, half the weight each.
constexpr double kMaxSpecCpu = 128000, kMaxSpecGpu = 8000;

bool accepts(const std::vector<std::string>& models, const std::string& model) {
  return models.empty() || std::find(models.begin(), models.end(), model) != models.end();
}

bool isShare(const Pod& pod) { return pod.numGpu == 1 && pod.gpuMilli < kMilli; }

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

}  // namespace

const char* fgdRuleName(FgdRule rule) { return rule == FgdRule::fgd ? "fgd" : "fgd-bestfit"; }

std::optional<FgdRule> parseFgdRule(const std::string& name) {
  for (FgdRule rule : {FgdRule::fgd, FgdRule::bestFit})
    if (name == fgdRuleName(rule)) return rule;
  return std::nullopt;
}

std::vector<TypicalPod> typicalPods(const std::vector<Pod>& pods, double percent) {
  // A spec is what FGD's PodResource keeps: CPU, thousandths per GPU, GPUs, accepted models.
  using Key = std::tuple<uint64_t, uint32_t, uint32_t, std::vector<std::string>>;
  std::map<Key, double> count;
  for (auto& p : pods) count[{p.cpuMilli, p.gpuMilli, p.numGpu, p.models}] += 1;
  std::vector<std::pair<Key, double>> specs(count.begin(), count.end());
  // Decreasing count; equal counts in decreasing spec order (FGD sorts its list reversed).
  std::sort(specs.begin(), specs.end(), [](auto& a, auto& b) { return a.second != b.second ? a.second > b.second : a.first > b.first; });
  const double total = static_cast<double>(pods.size()), wanted = percent * total / 100;
  std::vector<TypicalPod> out;
  double taken = 0;
  for (auto& [key, n] : specs) {
    if (taken >= wanted) break;
    TypicalPod t;
    std::tie(t.cpuMilli, t.gpuMilli, t.numGpu, t.models) = key;
    t.weight = n;
    taken += n;
    out.push_back(std::move(t));
  }
  for (auto& t : out) t.weight /= taken;
  return out;
}

FgdCluster::FgdCluster(const Cluster& cluster, std::vector<TypicalPod> typical) : typical_(std::move(typical)) {
  const uint64_t unlimited = std::numeric_limits<uint64_t>::max() / 4;
  for (auto& n : cluster.pool.nodes()) {
    Node node;
    node.cpuLeft = n.host.cpuMilli ? n.host.cpuMilli : unlimited;
    node.memLeft = n.host.memoryMib ? n.host.memoryMib : unlimited;
    for (size_t card : n.cards) {
      node.model = cluster.pool.cards()[card].spec.model;
      node.gpuLeft.push_back(kMilli);
      total_ += kMilli;
    }
    nodes_.push_back(std::move(node));
  }
}

bool FgdCluster::fits(const Node& node, const Pod& pod) const {
  if (node.cpuLeft < pod.cpuMilli || node.memLeft < pod.memoryMib) return false;
  if (pod.numGpu == 0) return true;
  if (node.gpuLeft.empty() || !accepts(pod.models, node.model)) return false;
  uint32_t usable = 0;
  for (uint32_t left : node.gpuLeft) usable += left >= pod.gpuMilli;
  return usable >= pod.numGpu;
}

double FgdCluster::frag(const Node& node) const {
  const double left = std::accumulate(node.gpuLeft.begin(), node.gpuLeft.end(), 0.0);
  if (left == 0) return 0;
  double frag = 0;
  for (auto& t : typical_) {
    // A CPU-only pod, a pod of other models, or one that cannot fit leaves all of it;
    // one that fits leaves the GPUs with fewer thousandths than it takes.
    double unusable = left;
    if (t.gpuMilli > 0 && accepts(t.models, node.model) && node.cpuLeft >= t.cpuMilli) {
      uint32_t usable = 0;
      double small = 0;
      for (uint32_t g : node.gpuLeft)
        if (g >= t.gpuMilli) ++usable;
        else small += g;
      if (usable >= t.numGpu) unusable = small;
    }
    frag += t.weight * unusable;
  }
  return frag;
}

double FgdCluster::fragCached(const Node& node) {
  std::vector<uint32_t> sorted = node.gpuLeft;
  std::sort(sorted.begin(), sorted.end());
  std::string key = node.model + ':' + std::to_string(node.cpuLeft);
  for (uint32_t g : sorted) key += ',' + std::to_string(g);
  if (auto it = memo_.find(key); it != memo_.end()) return it->second;
  if (memo_.size() > 4'000'000) memo_.clear();
  return memo_[key] = frag(node);
}

int64_t FgdCluster::fgdScore(const Node& node, const Pod& pod, std::vector<size_t>& gpus) {
  const double before = fragCached(node);
  auto scoreOf = [&](const Node& after) { return static_cast<int64_t>(sigmoid((before - fragCached(after)) / 1000) * 100); };
  gpus.clear();
  Node after = node;
  after.cpuLeft -= pod.cpuMilli;
  if (isShare(pod)) {
    int64_t best = -1;
    for (size_t i = 0; i < node.gpuLeft.size(); ++i) {
      if (node.gpuLeft[i] < pod.gpuMilli) continue;
      after.gpuLeft[i] -= pod.gpuMilli;
      int64_t s = scoreOf(after);
      after.gpuLeft[i] += pod.gpuMilli;
      if (best < 0 || s > best) best = s, gpus = {i};
    }
    return best;
  }
  gpus = bestFitGpus(node, pod);
  for (size_t i : gpus) after.gpuLeft[i] -= pod.gpuMilli;
  return scoreOf(after);
}

std::vector<size_t> FgdCluster::bestFitGpus(const Node& node, const Pod& pod) const {
  std::vector<size_t> gpus;
  if (isShare(pod)) {
    long best = -1;
    for (size_t i = 0; i < node.gpuLeft.size(); ++i)
      if (node.gpuLeft[i] >= pod.gpuMilli && (best < 0 || node.gpuLeft[i] < node.gpuLeft[static_cast<size_t>(best)])) best = static_cast<long>(i);
    if (best >= 0) gpus.push_back(static_cast<size_t>(best));
    return gpus;
  }
  // Whole GPUs: the lowest-numbered untouched ones.
  for (size_t i = 0; i < node.gpuLeft.size() && gpus.size() < pod.numGpu; ++i)
    if (node.gpuLeft[i] == kMilli) gpus.push_back(i);
  return gpus;
}

bool FgdCluster::place(const Pod& pod, FgdRule rule) {
  std::vector<size_t> feasible;
  for (size_t n = 0; n < nodes_.size(); ++n)
    if (fits(nodes_[n], pod)) feasible.push_back(n);
  if (feasible.empty()) return false;
  std::vector<int64_t> scores(feasible.size());
  std::vector<std::vector<size_t>> gpus(feasible.size());
  for (size_t k = 0; k < feasible.size(); ++k) {
    const Node& node = nodes_[feasible[k]];
    if (rule == FgdRule::fgd) {
      scores[k] = fgdScore(node, pod, gpus[k]);
      continue;
    }
    double gpuLeft = std::accumulate(node.gpuLeft.begin(), node.gpuLeft.end(), 0.0);
    double left = 0.5 * (static_cast<double>(node.cpuLeft) - pod.cpuMilli) / kMaxSpecCpu +
                  0.5 * (gpuLeft - static_cast<double>(pod.numGpu) * pod.gpuMilli) / kMaxSpecGpu;
    scores[k] = static_cast<int64_t>((1.0 - left) * 100);
    gpus[k] = bestFitGpus(node, pod);
  }
  if (rule == FgdRule::bestFit) {  // normalized to 0..100 in whole numbers, as the scheduler framework does
    auto [lo, hi] = std::minmax_element(scores.begin(), scores.end());
    const int64_t low = *lo, range = *hi - *lo;
    for (auto& s : scores) s = range == 0 ? 0 : (s - low) * 100 / range;
  }
  size_t best = 0;  // the highest score; a tie goes to the lowest node name
  for (size_t k = 1; k < feasible.size(); ++k)
    if (scores[k] > scores[best]) best = k;
  Node& node = nodes_[feasible[best]];
  node.cpuLeft -= pod.cpuMilli;
  node.memLeft -= pod.memoryMib;
  for (size_t i : gpus[best]) node.gpuLeft[i] -= pod.gpuMilli, used_ += pod.gpuMilli;
  return true;
}

std::vector<const Pod*> fgdArrivals(const std::vector<Pod>& pods, uint64_t seed, double ratio, uint32_t gpus) {
  std::vector<const Pod*> order;
  for (auto& p : pods) order.push_back(&p);
  std::stable_sort(order.begin(), order.end(), [](const Pod* a, const Pod* b) { return a->name < b->name; });
  std::mt19937_64 rng(seed);
  std::shuffle(order.begin(), order.end(), rng);
  const double target = ratio * gpus * kMilli;
  double total = 0;
  for (const Pod* p : order) total += static_cast<double>(p->numGpu) * p->gpuMilli;
  while (total > target && !order.empty()) {  // fewer pods than the list: drop some at random
    size_t i = std::uniform_int_distribution<size_t>(0, order.size() - 1)(rng);
    total -= static_cast<double>(order[i]->numGpu) * order[i]->gpuMilli;
    order.erase(order.begin() + static_cast<long>(i));
  }
  std::uniform_int_distribution<size_t> pick(0, pods.size() - 1);
  for (;;) {  // more: copies drawn at random until the next would pass the target (FGD's test)
    const Pod* p = &pods[pick(rng)];
    if (total + p->gpuMilli > target) break;
    total += static_cast<double>(p->numGpu) * p->gpuMilli;
    order.push_back(p);
  }
  return order;
}

std::vector<double> fgdDiscreteCurve(const std::vector<std::pair<uint64_t, uint64_t>>& samples, uint32_t gpus, uint32_t maxPercent) {
  // Python's round(): halves to even, as nearbyint does in the default rounding mode.
  auto round2 = [](double x) { return std::nearbyint(x * 100) / 100; };
  std::vector<std::pair<double, double>> points;  // (arrived %, rounded to whole; placed %, to hundredths)
  for (auto& [arrived, placed] : samples)
    points.push_back({std::nearbyint(arrived / (gpus * 10.0)), round2(placed / (gpus * 10.0))});
  std::vector<double> curve(maxPercent + 1, std::nan(""));
  for (uint32_t p = 0; p <= maxPercent; ++p) {
    for (double width : {0.0, 1.0}) {
      double sum = 0, n = 0;
      for (auto& [a, v] : points)
        if (a >= p - width && a <= p + width) sum += v, ++n;
      if (n > 0) {
        curve[p] = round2(sum / n);
        break;
      }
    }
  }
  return curve;
}

FgdRun runFgd(const Cluster& cluster, const std::vector<Pod>& pods, FgdRule rule, uint64_t seed, double ratio) {
  FgdCluster state(cluster, typicalPods(pods));
  FgdRun run;
  std::vector<std::pair<uint64_t, uint64_t>> samples;
  uint64_t arrived = 0;
  for (const Pod* pod : fgdArrivals(pods, seed, ratio, cluster.cards)) {
    ++run.arrived;
    arrived += static_cast<uint64_t>(pod->numGpu) * pod->gpuMilli;
    if (state.place(*pod, rule)) ++run.placedPods;
    else ++run.failedPods;
    samples.push_back({arrived, state.gpuMilliUsed()});
  }
  run.placed = fgdDiscreteCurve(samples, cluster.cards);
  return run;
}

FgdMeans fgdMeans(const Cluster& cluster, const std::vector<Pod>& pods, FgdRule rule, const std::vector<uint64_t>& seeds,
                  const std::function<void(uint64_t seed, const FgdRun&)>& each) {
  FgdMeans means;
  for (uint64_t seed : seeds) {
    FgdRun run = runFgd(cluster, pods, rule, seed);
    means.placed100 += run.placed[100], means.placed130 += run.placed[130];
    if (each) each(seed, run);
  }
  if (!seeds.empty()) means.placed100 /= seeds.size(), means.placed130 /= seeds.size();
  return means;
}

std::map<std::string, std::vector<double>> publishedCurves(const std::string& path, const std::string& workload) {
  std::map<std::string, std::vector<double>> sum;
  std::map<std::string, int> count;
  auto rows = RowReader::open(path, "the published curves", ',');
  std::vector<std::string> header, f;
  if (!rows || !rows->next(header)) return {};  // no published figures to show
  size_t zero = 0;
  while (zero < header.size() && header[zero] != "0") ++zero;
  while (rows->next(f)) {
    if (f.size() < zero + 131 || f[0] != workload) continue;
    auto& s = sum[f[1]];
    s.resize(131, 0);
    for (size_t p = 0; p <= 130; ++p) s[p] += std::strtod(f[zero + p].c_str(), nullptr);
    ++count[f[1]];
  }
  for (auto& [policy, s] : sum)
    for (double& v : s) v /= count[policy];
  return sum;
}

}  // namespace raccel::sim
