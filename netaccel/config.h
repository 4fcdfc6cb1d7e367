// raccel-netaccel's configuration: which scheduler to join and which cards to serve.
// Parsed once in main(); plain values afterwards.
//
//   name = node0                 # unique in the pool
//   scheduler = 127.0.0.1:7700
//   [card]
//   backend = cpu                # cpu today; opencl, cuda, xrt come with their backends
//   kind = gpu                   # declared kind: a simulated card of a kind this host lacks
//   model = sim-gpu
//   tflops = 18
//   memory = 4GiB
//   threads = 2
#pragma once

#include <string>
#include <vector>

#include "common/config.h"
#include "common/kinds.h"

namespace raccel::netaccel {

struct CardConfig {
  std::string backend = "cpu";
  CardKind kind = CardKind::cpu;
  std::string model = "host-cpu";
  double tflops = 1;
  unsigned long long memoryBytes = 1ull << 30;
  unsigned threads = 0;
};

struct NetaccelConfig {
  std::string name;
  std::string scheduler = "127.0.0.1:7700";
  unsigned heartbeatMs = 1000;
  std::vector<CardConfig> cards;
};

Result<NetaccelConfig> parseConfig(const Config& config);
// A card from a one-line spec "backend=cpu,kind=gpu,tflops=8,memory=1GiB,model=x,threads=1".
Result<CardConfig> parseCardSpec(const std::string& spec);

}  // namespace raccel::netaccel
