// raccel-run: the sample guest program. Asks for a virtual accelerator, runs a gemm
// (with --ops the other built-ins, with --opencl an OpenCL C kernel it sends as source)
// on it, checks every result against a reference computed here, and prints one
// verdict line. With --rtt N it instead times N synchronous tiny round trips (a 4-byte
// fill and a fence, as raccel-bench's sync_rtt) and prints their percentiles.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <thread>
#include <cstdio>
#include <cstring>
#include <optional>
#include <random>

#include "common/flags.h"
#include "common/limits.h"
#include "vmfrontend/raccel.h"

using namespace raccel;

namespace {
// y[i] = a * x[i] + y[i] * y[i], a kernel no built-in does.
const char* kOpenclKernel =
    "__kernel void saxpy_sq(float a, __global const float* x, __global float* y, uint n) {\n"
    "  uint i = get_global_id(0);\n"
    "  if (i < n) y[i] = a * x[i] + y[i] * y[i];\n"
    "}\n";

// Runs kOpenclKernel and checks it; returns "" or what went wrong.
std::string runOpencl(client::Session& s) {
  const uint32_t n = 10000;
  std::vector<float> x(n), y(n);
  for (uint32_t i = 0; i < n; ++i) {
    x[i] = float(i % 13);
    y[i] = float(i % 7) * 0.5f;
  }
  auto hx = s.alloc(n * 4), hy = s.alloc(n * 4);
  s.writeFloats(hx, x);
  s.writeFloats(hy, y);
  auto program = s.loadProgram(ProgramKind::openclC, "saxpy_sq", std::as_bytes(std::span(kOpenclKernel, std::strlen(kOpenclKernel))));
  s.launch(program, "saxpy_sq", {(n + 63) / 64, 1, 1}, {64, 1, 1},
           {client::Arg::f32(2.0f), client::Arg::buffer(hx), client::Arg::buffer(hy), client::Arg::u32(n)});
  auto got = s.readFloats(hy, n);
  if (!got) return std::string(codeName(got.error().code)) + ": " + got.error().message;
  for (uint32_t i = 0; i < n; ++i)
    if ((*got)[i] != 2.0f * x[i] + y[i] * y[i])
      return "element " + std::to_string(i) + " is " + std::to_string((*got)[i]) + ", want " +
             std::to_string(2.0f * x[i] + y[i] * y[i]);
  return "";
}

// --rtt: the synchronous round trip of one tiny instruction, as seen by this program.
int runRtt(client::Session& s, int count) {
  auto tiny = s.alloc(4096);
  if (auto r = s.fence(); !r) {
    std::printf("raccel-run: FAIL %s: %s\n", codeName(r.error().code), r.error().message.c_str());
    return 1;
  }
  const int warmup = std::min(100, count / 10);
  std::vector<double> us;
  for (int i = 0; i < count + warmup; ++i) {
    auto t = std::chrono::steady_clock::now();
    s.fill(tiny, 0, 4, static_cast<uint8_t>(i));
    if (auto r = s.fence(); !r) {
      std::printf("raccel-run: FAIL round trip %d: %s: %s\n", i, codeName(r.error().code), r.error().message.c_str());
      return 1;
    }
    if (i >= warmup) us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t).count());
  }
  std::sort(us.begin(), us.end());
  auto at = [&](double p) { return us[std::min(us.size() - 1, static_cast<size_t>(p * us.size()))]; };
  std::printf("raccel-run: OK rtt_us p50 %.1f p99 %.1f over %d round trips\n", at(0.5), at(0.99), count);
  return 0;
}
void declareFlags(Flags& flags) {
  flags.value("socket", "PATH", "raccel-guestd's socket, or a VM socket on the host (default /run/raccel/guestd.sock)");
  flags.value("size", "N", "gemm of N x N x N (default 256)");
  flags.value("tflops", "T", "virtual accelerator size to ask for (default 1)");
  flags.value("iterations", "K", "gemms to run and check (default 3)");
  flags.value("seed", "S", "random seed for the inputs (default 1)");
  flags.value("name", "NAME", "program name shown in the console (default raccel-run)");
  flags.boolean("ops", "also run and check axpy, vadd and reduceSum");
  flags.boolean("opencl", "also send an OpenCL C kernel as source, run it and check it (needs an OpenCL card)");
  flags.value("kinds", "LIST", "card kinds to accept, comma-separated (gpu, npu, fpga, cpu; default: what the VM allows)");
  flags.value("priority", "P", "priority to ask for (default 0; the VM's policy caps it)");
  flags.value("hold-ms", "MS", "keep the virtual accelerator this long, inputs written, before computing (default 0)");
  flags.value("interval-ms", "MS", "sleep this long between gemm iterations, buffers on the card (default 0)");
  flags.value("wait-ms", "MS", "when the pool is full even by preemption, wait this long for blocks (default 0: fail)");
  flags.boolean("no-wait", "while suspended by a higher priority, fail instead of waiting");
  flags.value("rtt", "N", "only time N synchronous tiny round trips and print their p50/p99 (microseconds)");
}

// What the flags ask for, each number checked where it enters (the error names the flag).
struct RunArgs {
  client::Options options;
  uint32_t n = 256;
  int iterations = 3, holdMs = 0, intervalMs = 0, rtt = 0;
  unsigned seed = 1;
};
Result<RunArgs> argsOf(const Flags& flags) {
  RunArgs r;
  client::Options& options = r.options;
  options.socket = flags.get("socket", options.socket);
  options.program = flags.get("name", "raccel-run");
  auto tflops = flags.getDouble("tflops", 1, 1e-6, 1e9);
  if (!tflops) return fail(tflops.error());
  auto priority = flags.getInt("priority", 0, limits::kMinPriority, limits::kMaxPriority);
  if (!priority) return fail(priority.error());
  constexpr unsigned long long kDay = 86400000;
  auto holdMsArg = flags.getUnsigned("hold-ms", 0, kDay);
  if (!holdMsArg) return fail(holdMsArg.error());
  auto intervalMsArg = flags.getUnsigned("interval-ms", 0, kDay);
  if (!intervalMsArg) return fail(intervalMsArg.error());
  auto waitMsArg = flags.getUnsigned("wait-ms", 0, kDay);
  if (!waitMsArg) return fail(waitMsArg.error());
  auto rttArg = flags.getUnsigned("rtt", 0, 10000000);
  if (!rttArg) return fail(rttArg.error());
  auto sizeArg = flags.getUnsigned("size", 256, 8192);
  if (!sizeArg) return fail(sizeArg.error());
  auto iterationsArg = flags.getUnsigned("iterations", 3, 1000000);
  if (!iterationsArg) return fail(iterationsArg.error());
  if (*sizeArg == 0 || *iterationsArg == 0 || (flags.has("rtt") && *rttArg == 0))
    return fail(Code::invalidArgument, "--size, --iterations and --rtt must be at least 1");
  options.tflops = *tflops;
  options.priority = static_cast<int>(*priority);
  options.admitWaitMs = static_cast<unsigned>(*waitMsArg);
  options.noWait = flags.has("no-wait");
  if (flags.has("kinds")) {
    const std::string list = flags.get("kinds");
    size_t start = 0;
    while (start <= list.size()) {
      size_t end = std::min(list.find(',', start), list.size());
      auto kind = parseKind(list.substr(start, end - start));
      if (!kind) return fail(Code::invalidArgument, "--kinds " + list + ": " + kind.error().message);
      options.kinds.push_back(*kind);
      start = end + 1;
    }
  }
  r.n = static_cast<uint32_t>(*sizeArg);
  r.iterations = static_cast<int>(*iterationsArg);
  r.holdMs = static_cast<int>(*holdMsArg), r.intervalMs = static_cast<int>(*intervalMsArg);
  r.rtt = static_cast<int>(*rttArg);
  auto seed = flags.getUnsigned("seed", 1, 0xffffffffu);
  if (!seed) return fail(seed.error());
  r.seed = static_cast<unsigned>(*seed);
  return r;
}

// The gemms: random inputs from the seed, checked against a reference computed here;
// the largest error, or none after saying why (FAIL).
std::optional<double> runGemms(client::Session& s, const RunArgs& r) {
  const uint32_t n = r.n;
  std::mt19937 rng(r.seed);
  std::uniform_real_distribution<float> dist(-1, 1);
  std::vector<float> a(size_t{n} * n), b(size_t{n} * n);
  for (auto& x : a) x = dist(rng);
  for (auto& x : b) x = dist(rng);
  // Reference on the host, once.
  std::vector<double> ref(size_t{n} * n, 0.0);
  for (uint32_t i = 0; i < n; ++i)
    for (uint32_t p = 0; p < n; ++p) {
      double aip = a[size_t{i} * n + p];
      for (uint32_t j = 0; j < n; ++j) ref[size_t{i} * n + j] += aip * b[size_t{p} * n + j];
    }
  auto ha = s.alloc(a.size() * 4), hb = s.alloc(b.size() * 4), hc = s.alloc(a.size() * 4);
  s.writeFloats(ha, a);
  s.writeFloats(hb, b);
  if (r.holdMs > 0) {
    if (auto f = s.fence(); !f) {
      std::printf("raccel-run: FAIL writing the inputs: %s: %s\n", codeName(f.error().code), f.error().message.c_str());
      return std::nullopt;
    }
    // Said once everything before the hold has reached the card (a test waits for it).
    std::printf("raccel-run: holding the virtual accelerator for %d ms, inputs written\n", r.holdMs);
    std::fflush(stdout);
    std::this_thread::sleep_for(std::chrono::milliseconds(r.holdMs));
  }
  double maxErr = 0;
  for (int it = 0; it < r.iterations; ++it) {
    if (it > 0 && r.intervalMs > 0) std::this_thread::sleep_for(std::chrono::milliseconds(r.intervalMs));
    s.fill(hc, 0, a.size() * 4, 0);
    s.gemm(n, n, n, 1.0f, ha, hb, 0.0f, hc);
    auto c = s.readFloats(hc, a.size());
    if (!c) {
      std::printf("raccel-run: FAIL gemm %u (iteration %d): %s: %s\n", n, it, codeName(c.error().code), c.error().message.c_str());
      return std::nullopt;
    }
    for (size_t i = 0; i < c->size(); ++i) maxErr = std::max(maxErr, std::abs((*c)[i] - ref[i]));
    if (r.intervalMs > 0) {
      std::printf("raccel-run: iteration %d max error %.2g\n", it, maxErr);
      std::fflush(stdout);
    }
  }
  return maxErr;
}

// --ops: axpy, vadd and reduceSum over 100,000 elements, each checked.
bool opsHold(client::Session& s) {
  bool ok = true;
  const uint64_t len = 100000;
  std::vector<float> x(len), y(len);
  for (uint64_t i = 0; i < len; ++i) {
    x[i] = static_cast<float>(i % 17);
    y[i] = 0.5f;
  }
  auto hx = s.alloc(len * 4), hy = s.alloc(len * 4), hout = s.alloc(len * 4), hsum = s.alloc(4);
  s.writeFloats(hx, x);
  s.writeFloats(hy, y);
  s.vadd(len, hx, hy, hout);
  s.axpy(len, 3.0f, hx, hy);
  s.reduceSum(len, hx, hsum);
  auto out = s.readFloats(hout, len), yy = s.readFloats(hy, len), sum = s.readFloats(hsum, 1);
  double refSum = 0;
  for (uint64_t i = 0; i < len && out && yy; ++i) {
    ok = ok && (*out)[i] == x[i] + 0.5f && (*yy)[i] == 3.0f * x[i] + 0.5f;
    refSum += x[i];
  }
  ok = ok && out && yy && sum && std::abs((*sum)[0] - refSum) <= 1e-6 * refSum;
  return ok;
}
}  // namespace

int main(int argc, char** argv) {
  Flags flags("raccel-run", "Runs a gemm on a raccel virtual accelerator and checks the result.");
  declareFlags(flags);
  int code = 0;
  if (!parseFlagsOrExit(flags, argc, argv, &code)) return code;
  auto args = argsOf(flags);
  if (!args) {
    std::fprintf(stderr, "raccel-run: %s\n", args.error().message.c_str());
    return 2;
  }
  auto start = std::chrono::steady_clock::now();
  auto session = client::Session::open(args->options);
  if (!session) {
    std::printf("raccel-run: FAIL cannot get a virtual accelerator: %s: %s\n", codeName(session.error().code),
                session.error().message.c_str());
    return 1;
  }
  auto& s = **session;
  if (args->rtt > 0) return runRtt(s, args->rtt);
  auto maxErr = runGemms(s, *args);
  if (!maxErr) return 1;
  const uint32_t n = args->n;
  bool ok = *maxErr <= 1e-3 * n;
  if (ok && flags.has("ops")) ok = opsHold(s);
  std::string openclProblem;
  if (ok && flags.has("opencl")) {
    openclProblem = runOpencl(s);
    ok = openclProblem.empty();
  }
  auto fence = s.fence();
  double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  if (!fence) {
    std::printf("raccel-run: FAIL %s: %s\n", codeName(fence.error().code), fence.error().message.c_str());
    return 1;
  }
  if (!openclProblem.empty()) std::printf("raccel-run: FAIL OpenCL C kernel: %s\n", openclProblem.c_str());
  (void)s.describeVaccel();  // where it ran last (moved or rebuilt meanwhile); else as welcomed
  std::printf("raccel-run: %s gemm %ux%ux%u x%d%s%s on %s, max error %.2g, %.1f ms\n", ok ? "OK" : "FAIL", n, n, n,
              args->iterations, flags.has("ops") ? " + axpy/vadd/reduceSum" : "", flags.has("opencl") ? " + OpenCL C" : "",
              s.vaccel().describe().c_str(), *maxErr, ms);
  return ok ? 0 : 1;
}
