// Splitting a data-parallel op across the cards of a virtual accelerator in proportion
// to the blocks it holds on each (docs/ARCHITECTURE.md, compute aggregation). Pure logic.
#pragma once

#include <cstdint>
#include <vector>

namespace raccel::scheduler {

struct Slice {
  uint64_t begin = 0, end = 0;  // [begin, end) of the op's rows or elements
  uint64_t size() const { return end - begin; }
};

// One card's part of a split op: the byte ranges of the guest's buffers it needs
// (cached on that card, or not), and the output range that comes back from it.
struct SplitPart {
  struct Input {
    uint64_t handle, offset, length;
    bool cache;
  };
  std::vector<Input> inputs;
  uint64_t outHandle = 0, outOffset = 0, outLength = 0;  // gathered back to the primary
  bool fresh = false;                                    // the output's scratch starts empty
};
// Cuts [0, units) into consecutive slices, slice i proportional to weights[i]; the
// slices cover every unit exactly once (some may be empty when units are few).
inline std::vector<Slice> splitByWeight(uint64_t units, const std::vector<uint32_t>& weights) {
  uint64_t total = 0;
  for (auto w : weights) total += w;
  std::vector<Slice> out(weights.size());
  uint64_t cumulative = 0, at = 0;
  for (size_t i = 0; i < weights.size(); ++i) {
    cumulative += weights[i];
    uint64_t end = total ? static_cast<uint64_t>((static_cast<unsigned __int128>(units) * cumulative) / total) : units;
    if (i + 1 == weights.size()) end = units;
    out[i] = {at, end};
    at = end;
  }
  return out;
}

}  // namespace raccel::scheduler
