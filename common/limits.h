// The bounds raccel puts on what crosses a trust boundary (a guest, a netaccel, a
// console client, a file), and the arithmetic that keeps numbers from wrapping on the
// way in. Pure functions and constants; usable from any thread.
//
// Every number a peer sends is checked where it enters against one of these, and the
// error names the field and its limits (checkRange). Sizes computed from peer numbers
// use saturating arithmetic, so an absurd size compares as "too big", never wraps small.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "common/error.h"

namespace raccel::limits {

// The pool (scheduler/pool.h): block counts stay far below 2^32 in 64-bit arithmetic.
constexpr uint64_t kMaxBlocksPerCard = 1u << 16;  // 65 PFLOPS at 1 TFLOPS a block
constexpr uint64_t kMaxCardsPerNode = 1024;
constexpr uint64_t kMaxBlocksPerNode = 1u << 20;
constexpr uint64_t kMaxPoolBlocks = 1u << 24;  // 16.7 EFLOPS; the owner table is then 128 MiB
constexpr uint64_t kMaxCardMemoryBytes = 1ull << 50;  // 1 PiB
// A node's host resources (CPU in thousandths of a core, memory in MiB), as a netaccel
// reports them or a VM's vaccels need them: sums of them stay far below 2^64.
constexpr uint64_t kMaxHostCpuMilli = 1'000'000'000;  // a million cores
constexpr uint64_t kMaxHostMemoryMib = 1ull << 30;    // 1 EiB
// A netaccel's registration: contexts it kept over a scheduler restart, buffers in each.
constexpr uint64_t kMaxKeptContexts = 1u << 16;
constexpr uint64_t kMaxKeptBuffers = 1u << 16;
// Priorities (hello, VM policy): admission orders by them, so they stay small.
constexpr long long kMinPriority = -1000;
constexpr long long kMaxPriority = 1000;
// Names and free text from peers.
constexpr size_t kMaxNameBytes = 128;      // node, VM, program names
constexpr size_t kMaxTextBytes = 256;      // card models, backends
constexpr size_t kMaxExtensionBytes = 4096;  // a card's OpenCL extension list
constexpr size_t kMaxLoggedBytes = 512;    // any peer text in a log line or an event

inline uint64_t satMul(uint64_t a, uint64_t b) {
  uint64_t out;
  return __builtin_mul_overflow(a, b, &out) ? std::numeric_limits<uint64_t>::max() : out;
}
inline uint64_t satMul(uint64_t a, uint64_t b, uint64_t c) { return satMul(satMul(a, b), c); }
inline uint64_t satAdd(uint64_t a, uint64_t b) {
  uint64_t out;
  return __builtin_add_overflow(a, b, &out) ? std::numeric_limits<uint64_t>::max() : out;
}

// `v` as a signed 64-bit number, or -1 when it does not fit (callers refuse negatives).
inline int64_t toSigned(uint64_t v) { return v > uint64_t(std::numeric_limits<int64_t>::max()) ? -1 : int64_t(v); }

// `text` cut to `max` bytes (at a UTF-8 character boundary), with a marker saying how
// much was left out. Peer strings go through this before a log line or an event.
std::string clip(const std::string& text, size_t max = kMaxLoggedBytes);

// A finite number in [lo, hi], or an error naming `field` and the limits.
Status checkRange(const std::string& field, double value, double lo, double hi);
Status checkRange(const std::string& field, long long value, long long lo, long long hi);
// A name from a peer: 1..kMaxNameBytes printable ASCII bytes without spaces.
Status checkName(const std::string& field, const std::string& name, size_t max = kMaxNameBytes);
// A name that is one part of a key in the shared pool (a scheduler's, a node's): a
// name as above, without '/'.
Status checkKeyName(const std::string& field, const std::string& name);

}  // namespace raccel::limits
