// The fair-share measurement shared by policy_test (checked loosely) and raccel-bench
// (fair_share_error, fair_share_error_async): two tenants hold 3 and 1 blocks of one 4-block card and both
// keep it busy with identical gemms; the kernel time each got in the window is the
// card's own account (netaccel heartbeats, raccelctl vaccels kernelMs). Real scheduler
// and netaccel processes; real computation on the card.
#pragma once

#include <cstdint>
#include <string>

namespace raccel::testing {

struct FairShare {
  double big = 0, small = 0;    // kernel milliseconds in the window (3 blocks, 1 block)
  uint64_t bigGemms = 0, smallGemms = 0;  // completed over the whole run, for the record
  double ratio = 0;             // big / small; the target is 3
  double error = 0;             // |ratio / 3 - 1|
  std::string problem;          // set when the measurement itself failed
  std::string detail;           // the console's vaccels at both ends
};

// `card`: the shared card's --card spec. The default is synchronous (its worker's wall
// time is the kernel's); kAsyncFairCard queues kernels on the card's own thread, timed
// there, as a GPU stream does (raccel-bench fair_share_error_async).
inline constexpr const char* kSyncFairCard = "kind=gpu,tflops=4,memory=512MiB,threads=1";
inline constexpr const char* kAsyncFairCard = "kind=gpu,tflops=4,memory=512MiB,threads=1,async=true";
// `n`: each gemm is n x n x n; `batch`: gemms between fences (enough for ~0.3 s of card).
inline constexpr const char* kCudaFairCard = "backend=cuda,device=0,kind=gpu,tflops=4,memory=8GiB";
FairShare measureFairShare(double seconds, const std::string& card = kSyncFairCard, uint32_t n = 160, int batch = 96);

}  // namespace raccel::testing
