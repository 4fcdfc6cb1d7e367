#include "tests/fairness.h"

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <thread>

#include "tests/cluster.h"
#include "vmfrontend/raccel.h"

namespace raccel::testing {

FairShare measureFairShare(double seconds, const std::string& card, uint32_t n, int batch) {
  FairShare out;
  // The cluster's netaccels send heartbeats (which carry the cards' kernel time per
  // context) every 400 ms.
  Cluster cluster({VmSpec{"big", 16, 0}, VmSpec{"small", 16, 0}});
  cluster.addNetaccel("shared", {card}, 4);
  auto open = [&](const std::string& vm, double tflops) -> std::unique_ptr<client::Session> {
    client::Options o;
    o.socket = cluster.vmSocket(vm);
    o.program = vm;
    o.tflops = tflops;
    auto s = client::Session::open(o);
    if (!s) {
      out.problem = vm + ": " + s.error().toString();
      return nullptr;
    }
    return std::move(*s);
  };
  auto big = open("big", 3), small = open("small", 1);
  if (!big || !small) return out;
  // Batches long enough (about 0.3 s of card time) that the moment between a batch's
  // fence and the next batch, when only the other tenant has work, hardly counts.
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now() + std::chrono::milliseconds(100);
  const auto from = start + std::chrono::milliseconds(900);  // both queues full, a heartbeat since
  const auto until = from + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  auto run = [&](client::Session& s, uint64_t* counted, std::string* why) {
    std::vector<float> a(n * n, 0.5f), b(n * n, 2.0f);
    auto ha = s.alloc(a.size() * 4), hb = s.alloc(b.size() * 4), hc = s.alloc(a.size() * 4);
    s.writeFloats(ha, a);
    s.writeFloats(hb, b);
    if (auto f = s.fence(); !f) {
      *why = f.error().toString();
      return;
    }
    std::this_thread::sleep_until(start);
    while (Clock::now() < until) {
      for (int i = 0; i < batch; ++i) s.gemm(n, n, n, 1.0f, ha, hb, 0.0f, hc);
      auto f = s.fence();
      if (!f) {
        *why = f.error().toString();
        return;
      }
      auto done = Clock::now();
      if (done <= until) *counted += batch;
    }
    auto c = s.readFloats(hc, 1);
    if (!c || (*c)[0] != 1.0f * n) *why = "wrong gemm result";
  };
  // The cards' own account of kernel time, read through the console at both ends.
  auto kernelMs = [&](const std::string& json, const std::string& program) {
    auto at = json.find("\"program\":\"" + program + "\"");
    auto k = json.find("\"kernelMs\":", at);
    return at == std::string::npos || k == std::string::npos ? -1.0 : std::atof(json.c_str() + k + 11);
  };
  std::string whyBig, whySmall;
  uint64_t bigGemms = 0, smallGemms = 0;
  std::thread tb([&] { run(*big, &bigGemms, &whyBig); });
  std::thread ts([&] { run(*small, &smallGemms, &whySmall); });
  std::this_thread::sleep_until(from);
  std::string first = cluster.console("vaccels");
  std::this_thread::sleep_until(until - std::chrono::milliseconds(500));  // a heartbeat before the end
  std::string last = cluster.console("vaccels");
  tb.join();
  ts.join();
  out.bigGemms = bigGemms;
  out.smallGemms = smallGemms;
  out.big = kernelMs(last, "big") - kernelMs(first, "big");
  out.small = kernelMs(last, "small") - kernelMs(first, "small");
  if (!whyBig.empty() || !whySmall.empty()) {
    out.problem = whyBig + " " + whySmall;
    return out;
  }
  if (!(out.small > 0) || !(out.big > 0)) {
    out.problem = "no kernel time measured in the window: " + first + " / " + last;
    return out;
  }
  out.ratio = double(out.big) / double(out.small);
  out.detail = first + last;
  out.error = std::abs(out.ratio / 3.0 - 1.0);
  return out;
}

}  // namespace raccel::testing
