// Coverage for libFuzzer from GCC-built code. The project builds with GCC (Debian's
// clang cannot compile Cap'n Proto 0.9's headers as C++23), whose
// -fsanitize-coverage=trace-pc calls __sanitizer_cov_trace_pc at every basic block.
// libFuzzer 14 no longer takes those calls itself (its own symbol is renamed away when
// the fuzz targets link it, see CMakeLists.txt), so they land here: each call site's
// return address picks one of kCounters 8-bit counters, registered with libFuzzer as
// an inline-counter module before main(). Collisions merge a few edges; no more.
// trace-cmp's float and double comparisons, which libFuzzer does not take, are dropped.
#include <cstddef>
#include <cstdint>

namespace {
constexpr size_t kCounters = 1 << 18;
alignas(64) uint8_t counters[kCounters];
uintptr_t pcTable[2 * kCounters];  // (pc, flags) pairs: the counter index stands for its pc
}  // namespace

extern "C" {
void __sanitizer_cov_8bit_counters_init(uint8_t* start, uint8_t* stop);
void __sanitizer_cov_pcs_init(const uintptr_t* start, const uintptr_t* stop);

__attribute__((constructor, no_sanitize_coverage)) static void registerCounters() {
  for (size_t i = 0; i < kCounters; ++i) pcTable[2 * i] = i + 1;
  __sanitizer_cov_8bit_counters_init(counters, counters + kCounters);
  __sanitizer_cov_pcs_init(pcTable, pcTable + 2 * kCounters);
}

__attribute__((no_sanitize_address, no_sanitize_undefined, no_sanitize_coverage)) void __sanitizer_cov_trace_pc() {
  uintptr_t pc = reinterpret_cast<uintptr_t>(__builtin_return_address(0));
  uint8_t& c = counters[(pc ^ (pc >> 18)) & (kCounters - 1)];
  c = static_cast<uint8_t>(c + 1) ? static_cast<uint8_t>(c + 1) : c;  // saturates, never wraps to 0
}

void __sanitizer_cov_trace_cmpf(float, float) {}
void __sanitizer_cov_trace_cmpd(double, double) {}
}
