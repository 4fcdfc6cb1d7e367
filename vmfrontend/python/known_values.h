// What the torch device knows of the i64 values in its memory, so that an op that picks
// by an index checks the index where PyTorch's CPU does (an index outside its dimension
// raises) without reading it back before every op: the bounds a copy from the host
// counted as it passed, or a check on the card read, kept per span of a buffer until
// something writes there (torch_device.h, "Index checks").
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <span>

namespace raccel::python {

// The values of a span: every one in [lo, hi], and the largest negative one (none when
// none is negative), which tells whether the negatives are all a loss's ignored target.
struct ValueBounds {
  int64_t lo = 0, hi = 0;
  std::optional<int64_t> negativeHi;

  // Whether every value lies in [first, last] or equals `ignored`. Only true is sure to
  // mean yes; false may be the bounds being too loose to tell (an ignored value inside
  // the range, or above it).
  bool allWithin(int64_t first, int64_t last, std::optional<int64_t> ignored = std::nullopt) const {
    if (hi > last) return false;
    if (lo >= first) return true;
    // Below `first`: only the ignored value, when it is the one negative value and the
    // range starts at 0 (so every negative value is below it).
    return ignored && first == 0 && lo == *ignored && negativeHi == ignored;
  }
  // A value outside [first, last], when these exact bounds show one: the smallest, else
  // the largest.
  std::optional<int64_t> outside(int64_t first, int64_t last) const {
    if (lo < first) return lo;
    if (hi > last) return hi;
    return std::nullopt;
  }
};

// The bounds of a non-empty run of values.
inline ValueBounds boundsOf(std::span<const int64_t> values) {
  ValueBounds b{values[0], values[0], std::nullopt};
  for (int64_t v : values) {
    if (v < b.lo) b.lo = v;
    if (v > b.hi) b.hi = v;
    if (v < 0 && (!b.negativeHi || v > *b.negativeHi)) b.negativeHi = v;
  }
  return b;
}

// Bounds per span [begin, end) of bytes of a buffer: the newest kMax, each forgotten
// when a write touches its span.
class KnownValues {
 public:
  static constexpr size_t kMax = 64;

  void note(uint64_t buffer, uint64_t begin, uint64_t end, ValueBounds bounds) {
    forget(buffer, begin, end);
    if (kept_.size() >= kMax) kept_.pop_front();
    kept_.push_back({buffer, begin, end, bounds});
  }
  // Something wrote bytes [begin, end) of `buffer`.
  void forget(uint64_t buffer, uint64_t begin, uint64_t end) {
    for (auto it = kept_.begin(); it != kept_.end();)
      it = it->buffer == buffer && it->begin < end && begin < it->end ? kept_.erase(it) : it + 1;
  }
  // Bounds that hold for every value in [begin, end): those of a span holding it.
  std::optional<ValueBounds> find(uint64_t buffer, uint64_t begin, uint64_t end) const {
    for (auto it = kept_.rbegin(); it != kept_.rend(); ++it)
      if (it->buffer == buffer && it->begin <= begin && end <= it->end) return it->bounds;
    return std::nullopt;
  }
  bool empty() const { return kept_.empty(); }

 private:
  struct Known {
    uint64_t buffer, begin, end;
    ValueBounds bounds;
  };
  std::deque<Known> kept_;  // the newest last
};

}  // namespace raccel::python
