// FGD's own packing rules, as its paper (Weng et al., "Beware of Fragmentation: Scheduling
// GPU-Sharing Workloads with Fragmentation Gradient Descent", USENIX ATC '23) and its public
// simulator define them, so that the harness can check itself against FGD's published
// figures before it compares raccel with them:
//  - a node is its CPU and memory left and each GPU's thousandths left (no blocks);
//  - a pod fits a node when its CPU, memory, GPU model and GPUs fit (a share: one GPU with
//    enough thousandths left; whole GPUs: that many untouched GPUs);
//  - FGD scores a node by how little the placement grows the node's expected fragmentation
//    against the typical pods (the most common specs making up 95% of the pod list), and
//    picks the GPU that grows it least; BestFit scores by the CPU and GPU left after it
//    (half each, over 128 cores and 8 GPUs), normalized to 0..100, and picks the fullest GPU
//    that fits; scores are whole numbers, and a tie goes to the lowest node name.
// Pure; one FgdCluster is one run's state.
#pragma once

#include <cstdint>
#include <optional>
#include <functional>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "sim/cluster.h"
#include "sim/packing.h"

namespace raccel::sim {

enum class FgdRule { fgd, bestFit };
// "fgd", "fgd-bestfit": the names raccel-sim's --policy takes.
const char* fgdRuleName(FgdRule rule);
// The rule `name` names, or none.
std::optional<FgdRule> parseFgdRule(const std::string& name);

// A spec of the pod list with its share of the pods (FGD's "typical pods").
struct TypicalPod {
  uint64_t cpuMilli = 0;
  uint32_t gpuMilli = 0, numGpu = 0;  // thousandths per GPU (0: CPU only)
  std::vector<std::string> models;
  double weight = 0;
};

// The most common specs, in decreasing count, until they make up `percent` of the pods;
// weights renormalized to sum to 1.
std::vector<TypicalPod> typicalPods(const std::vector<Pod>& pods, double percent = 95);

class FgdCluster {
 public:
  struct Node {
    uint64_t cpuLeft = 0, memLeft = 0;
    std::string model;
    std::vector<uint32_t> gpuLeft;  // thousandths left per GPU
  };

  // The nodes of `cluster` (their host capacity and GPU cards), in index order, which is
  // the order of their names in the openb list.
  FgdCluster(const Cluster& cluster, std::vector<TypicalPod> typical);

  // Places `pod` by `rule`; false when no node fits it.
  bool place(const Pod& pod, FgdRule rule);

  uint64_t gpuMilliUsed() const { return used_; }
  uint64_t gpuMilliTotal() const { return total_; }
  const std::vector<Node>& nodes() const { return nodes_; }

 private:
  bool fits(const Node& node, const Pod& pod) const;
  // The expected thousandths left unusable on `node` by the next typical pod.
  double frag(const Node& node) const;
  double fragCached(const Node& node);
  // The node's score for `pod` and the GPUs it would take (empty for a CPU-only pod).
  int64_t fgdScore(const Node& node, const Pod& pod, std::vector<size_t>& gpus);
  std::vector<size_t> bestFitGpus(const Node& node, const Pod& pod) const;

  std::vector<Node> nodes_;
  std::vector<TypicalPod> typical_;
  std::unordered_map<std::string, double> memo_;
  uint64_t used_ = 0, total_ = 0;
};

// FGD's arrivals: every pod of the list once, shuffled by `seed`, then copies of pods drawn
// at random while the GPU requests stay within `ratio` of the cluster's GPUs (its
// "workload tuning"; the published runs use 1.3 and seeds 42-51).
std::vector<const Pod*> fgdArrivals(const std::vector<Pod>& pods, uint64_t seed, double ratio, uint32_t gpus);

// FGD's published curve from one run's samples (after each arrival: GPU thousandths
// arrived and placed): at each whole percent p of the GPUs arrived, the mean placed share
// over the samples whose arrived share rounds to p (within 1 when none does), as its
// analysis scripts compute it. NaN where no sample is near.
std::vector<double> fgdDiscreteCurve(const std::vector<std::pair<uint64_t, uint64_t>>& samples, uint32_t gpus,
                                     uint32_t maxPercent = 130);

// One run of FGD's own rules on FGD's arrivals: the discrete curve of placed GPU share.
struct FgdRun {
  std::vector<double> placed;  // index p: % of GPU thousandths held once p% arrived
  uint64_t arrived = 0, placedPods = 0, failedPods = 0;
};
FgdRun runFgd(const Cluster& cluster, const std::vector<Pod>& pods, FgdRule rule, uint64_t seed, double ratio = 1.3);

// runFgd over `seeds`: the means of its measure at 100% and 130%; `each` sees every run.
struct FgdMeans {
  double placed100 = 0, placed130 = 0;
};
FgdMeans fgdMeans(const Cluster& cluster, const std::vector<Pod>& pods, FgdRule rule, const std::vector<uint64_t>& seeds,
                  const std::function<void(uint64_t seed, const FgdRun&)>& each = {});

// FGD's published per-seed curves (fgd-expected/analysis_*_discrete.csv) of one pod list
// (`workload`, e.g. "openb_pod_list_default"): the mean over seeds per policy ("06-FGD",
// "05-BestFit", ...), by load %. Empty when the file is not there.
std::map<std::string, std::vector<double>> publishedCurves(const std::string& path, const std::string& workload);

}  // namespace raccel::sim
