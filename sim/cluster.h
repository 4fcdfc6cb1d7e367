// The simulated cluster: a real scheduler::Pool (docs/ARCHITECTURE.md block rules), whose
// nodes carry the host CPU and memory the published packing evaluation also counts. Built from
// the openb node CSV, the 4-node reference fixture, or a cluster config file. Pure data;
// one simulation run owns one copy (copies are independent).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "common/error.h"
#include "scheduler/pool.h"

namespace raccel::sim {

using scheduler::Pool;

struct Cluster {
  Pool pool;
  uint32_t cards = 0;                // accelerator cards (GPUs) in the cluster
  uint32_t blocks = 0;               // their blocks
};

// FP32 TFLOPS per GPU model, the openb trace's models included. G2 and G3 are not
// disclosed: the defaults assume a V100-class G2 (15.7) and an A100-class G3 (19.5).
std::map<std::string, double> defaultModelTflops();
// "G2=14,G3=19.5" over the defaults.
Status overrideModelTflops(std::map<std::string, double>& models, const std::string& spec);

// openb_node_list_gpu_node.csv: sn,cpu_milli,memory_mib,gpu,model.
Result<Cluster> loadOpenbNodes(const std::string& path, const std::map<std::string, double>& modelTflops,
                               double blockTflops = 1.0);
// docs/ARCHITECTURE.md's 4-node, 200-block reference pool (no CPU/memory limits).
Cluster fixtureCluster();
// A cluster config: top-level `block_tflops`; one [node] section per node with `name`,
// optional `cpu_milli`, `memory_mib`, `count` (that many identical nodes, names
// suffixed -0, -1, ...) and `cards = KIND:MODEL:TFLOPS[xN], ...`.
Result<Cluster> loadClusterConfig(const std::string& path);
Result<Cluster> parseClusterConfig(const std::string& text, const std::string& origin);

}  // namespace raccel::sim
