// Experiment A, packing (the FGD evaluation, USENIX ATC '23, on the openb trace): pods
// sampled from a pod list until their GPU requests reach 130% of the cluster's GPUs, no
// departures; after each pod, the share of blocks allocated and the fragmented share.
// Every placement is the real Pool's (sim/cluster.h); this file only keeps the node
// CPU/memory the trace also counts and measures. Pure; one call is one run.
#pragma once

#include <string>
#include <vector>

#include "sim/cluster.h"
#include "sim/policy.h"

namespace raccel::sim {

struct Pod {
  std::string name;
  uint64_t cpuMilli = 0, memoryMib = 0;
  uint32_t numGpu = 0, gpuMilli = 0;  // gpuMilli < 1000: a share of one GPU
  std::vector<std::string> models;    // gpu_spec: accepted GPU models (empty: any)
  double gpus() const { return numGpu * gpuMilli / 1000.0; }
};

// openb_pod_list_*.csv (name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,...).
Result<std::vector<Pod>> loadOpenbPods(const std::string& path);

// What a GPU pod asks of the pool under `policy` (a share of one card, or whole cards of
// one node, with its host needs and accepted models). `pod` must outlive the request.
Pool::Request requestFor(const Pod& pod, Policy policy);

struct PackingOptions {
  Policy policy = Policy::raccel;
  uint64_t seed = 42;
  uint32_t maxLoadPercent = 130;
  // Labelled separately: when a one-card pod fits nowhere, move one-card pods between
  // the cards of a node (Pool::release + Pool::assign) to make room.
  bool migrate = false;
  // Checks the pool against the simulator's own records after every pod (tests).
  bool audit = false;
  // FGD's arrivals (sim/fgd.h: every pod once, shuffled, then copies up to
  // maxLoadPercent) instead of pods drawn from the list.
  bool fgdArrivals = false;
};

struct PackingRun {
  // Index p = 0..maxLoadPercent: the figure once p% of the GPU capacity has arrived.
  std::vector<double> alloc;   // % of blocks held
  std::vector<double> frag;    // % of blocks free but fragmented (FGD's measure)
  std::vector<double> placed;  // % of GPU capacity requested by placed pods
  // FGD's published measure (sim/fgd.h fgdDiscreteCurve): placed, averaged over the pods
  // whose arrival rounds to each percent.
  std::vector<double> placedDiscrete;
  uint64_t arrived = 0, placedPods = 0, failedPods = 0, migrations = 0;
};

Result<PackingRun> runPacking(const Cluster& cluster, const std::vector<Pod>& pods, const PackingOptions& options);

}  // namespace raccel::sim
