#include "tests/fairness.h"

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "tests/cluster.h"
#include "vmfrontend/raccel.h"

namespace raccel::testing {
namespace {

using Clock = std::chrono::steady_clock;

// When both tenants start, when the measured window opens (both queues full, a heartbeat
// since: the cluster's netaccels send the cards' kernel time per context every 400 ms),
// and when it closes.
struct Window {
  Clock::time_point start, from, until;
  explicit Window(double seconds)
      : start(Clock::now() + std::chrono::milliseconds(100)),
        from(start + std::chrono::milliseconds(900)),
        until(from + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds))) {}
};

std::unique_ptr<client::Session> openTenant(Cluster& cluster, const std::string& vm, double tflops, std::string& problem) {
  client::Options o;
  o.socket = cluster.vmSocket(vm);
  o.program = vm;
  o.tflops = tflops;
  auto s = client::Session::open(o);
  if (!s) {
    problem = vm + ": " + s.error().toString();
    return nullptr;
  }
  return std::move(*s);
}

// One tenant's load: batches of n x n x n gemms, each batch fenced, from the window's
// start to its end; `counted`: the gemms whose batch completed inside it. Batches are
// long enough (about 0.3 s of card time) that the moment between a batch's fence and the
// next batch, when only the other tenant has work, hardly counts. Returns why it failed,
// or "".
std::string gemmsUntil(client::Session& s, uint32_t n, int batch, const Window& w, uint64_t& counted) {
  std::vector<float> a(n * n, 0.5f), b(n * n, 2.0f);
  auto ha = s.alloc(a.size() * 4), hb = s.alloc(b.size() * 4), hc = s.alloc(a.size() * 4);
  s.writeFloats(ha, a);
  s.writeFloats(hb, b);
  if (auto f = s.fence(); !f) return f.error().toString();
  std::this_thread::sleep_until(w.start);
  while (Clock::now() < w.until) {
    for (int i = 0; i < batch; ++i) s.gemm(n, n, n, 1.0f, ha, hb, 0.0f, hc);
    if (auto f = s.fence(); !f) return f.error().toString();
    if (Clock::now() <= w.until) counted += batch;
  }
  auto c = s.readFloats(hc, 1);
  return !c || (*c)[0] != 1.0f * n ? "wrong gemm result" : "";
}

// A program's kernel time in the console's `vaccels` JSON (the card's own account), or -1.
double kernelMsOf(const std::string& json, const std::string& program) {
  auto at = json.find("\"program\":\"" + program + "\"");
  auto k = json.find("\"kernelMs\":", at);
  return at == std::string::npos || k == std::string::npos ? -1.0 : std::atof(json.c_str() + k + 11);
}

}  // namespace

FairShare measureFairShare(double seconds, const std::string& card, uint32_t n, int batch) {
  FairShare out;
  Cluster cluster({VmSpec{"big", 16, 0}, VmSpec{"small", 16, 0}});
  cluster.addNetaccel("shared", {card}, 4);
  auto big = openTenant(cluster, "big", 3, out.problem), small = openTenant(cluster, "small", 1, out.problem);
  if (!big || !small) return out;
  const Window w(seconds);
  std::string whyBig, whySmall;
  uint64_t bigGemms = 0, smallGemms = 0;
  std::thread tb([&] { whyBig = gemmsUntil(*big, n, batch, w, bigGemms); });
  std::thread ts([&] { whySmall = gemmsUntil(*small, n, batch, w, smallGemms); });
  std::this_thread::sleep_until(w.from);
  std::string first = cluster.console("vaccels");
  std::this_thread::sleep_until(w.until - std::chrono::milliseconds(500));  // a heartbeat before the end
  std::string last = cluster.console("vaccels");
  tb.join();
  ts.join();
  out.bigGemms = bigGemms;
  out.smallGemms = smallGemms;
  out.big = kernelMsOf(last, "big") - kernelMsOf(first, "big");
  out.small = kernelMsOf(last, "small") - kernelMsOf(first, "small");
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
