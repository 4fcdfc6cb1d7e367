#include "bench/bulk.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

#include "bench/raw_socket.h"
#include "bench/report.h"
#include "hal/backends.h"
#include "tests/cluster.h"
#include "transport/tls.h"
#include "vmfrontend/raccel.h"

namespace raccel::bench {
namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// The steady bulk rate on a cluster of one VM and one `card`, with the scheduler's
// `args` and the netaccel's `nodeArgs`.
BulkRun onCluster(size_t bytes, int rounds, std::vector<std::string> args, const std::string& card = "kind=cpu,tflops=4,memory=1GiB",
                  std::vector<std::string> nodeArgs = {}) {
  testing::VmSpec vm;
  vm.memoryQuota = "1GiB";
  testing::Cluster cluster({vm}, "", std::move(args));
  const pid_t node = cluster.addNetaccel("bench0", {card}, 4, std::move(nodeArgs)).pid();
  client::Options options;
  options.socket = cluster.vmSocket();
  options.program = "raccel-bench";
  auto session = client::Session::open(options);
  if (!session) {
    BulkRun failed;
    failed.problem = session.error().message;
    return failed;
  }
  // The session's first instruction takes the netaccel's warm sandbox (a sandboxed card),
  // and the new one started in its place builds its kernels: not measured beside it.
  if (auto first = (*session)->fence(); !first) {
    BulkRun failed;
    failed.problem = first.error().message;
    return failed;
  }
  awaitIdleChildren(node, rounds > 1 ? 30000 : 5000);
  auto cpuMs = [&] { return processCpuMs(cluster.scheduler().pid()) + processCpuMs(node); };
  const double before = cpuMs();
  BulkRun run = steadyBulk(**session, bytes, rounds);
  const double gib = 2.0 * (rounds + 1) * static_cast<double>(bytes) / (1ull << 30);  // (steadyBulk's warm-up too)
  if (run.problem.empty()) run.daemonCpuMsPerGib = (cpuMs() - before) / gib;
  return run;
}

}  // namespace

BulkRun writeAndReadBack(client::Session& s, size_t bytes) {
  BulkRun run;
  run.bytes = bytes;
  std::vector<std::byte> data(bytes), back(bytes);
  for (size_t i = 0; i < bytes; i += 4096) data[i] = static_cast<std::byte>(i / 4096);
  auto big = s.alloc(bytes);
  if (auto r = s.fence(); !r) {
    run.problem = r.error().message;
    return run;
  }
  auto t = Clock::now();
  s.write(big, 0, data);
  auto written = s.fence();
  run.writeSecs = since(t);
  auto tr = Clock::now();
  auto r = written ? s.read(big, 0, back) : written;
  run.readSecs = since(tr);
  const double secs = since(t);
  s.free(big);
  (void)s.fence();
  if (!r) run.problem = r.error().message;
  else if (std::memcmp(data.data(), back.data(), bytes) != 0) run.problem = "the bulk data did not come back intact";
  else run.gbps = 2.0 * bytes * 8 / secs / 1e9;
  return run;
}

BulkRun steadyBulk(client::Session& s, size_t bytes, int rounds) {
  std::vector<BulkRun> runs;
  for (int i = 0; i <= rounds; ++i) {
    BulkRun run = writeAndReadBack(s, bytes);
    if (!run.problem.empty()) return run;
    if (i > 0) runs.push_back(run);  // (the first warmed the path)
  }
  std::sort(runs.begin(), runs.end(), [](const BulkRun& a, const BulkRun& b) { return a.gbps < b.gbps; });
  return runs[runs.size() / 2];
}

BulkFigures measureBulk(bool quick) {
  BulkFigures f;
  f.bytes = bulkBytes(quick);
  f.rawGbps = rawSocketGbps(f.bytes);
  // As deployed on one host: the link in TLS, its big frames through the same-host lane.
  f.lane = onCluster(f.bytes, quick ? 1 : 3, {});
  // The node link alone, as between two hosts (no lane): in TLS as deployed, and plain.
  f.tls = onCluster(f.bytes, quick ? 1 : 3, {"--lane-socket", "off"});
  f.plain = onCluster(f.bytes, quick ? 1 : 3, {"--insecure", "--lane-socket", "off"});
  f.tlsThread = onCluster(f.bytes, quick ? 1 : 3, {"--lane-socket", "off", "--tls-crypto-thread", "on"},
                          "kind=cpu,tflops=4,memory=1GiB", {"--tls-crypto-thread", "on"});
  f.tlsThreadDeployed = std::thread::hardware_concurrency() >= transport::kCryptoThreadCores;
  if (!hal::discover("opencl").devices.empty()) {
    const std::string card = "backend=opencl,kind=gpu,tflops=4,memory=1GiB";
    f.sandbox = onCluster(f.bytes, quick ? 1 : 3, {}, card);
    f.inProcess = onCluster(f.bytes, quick ? 1 : 3, {}, card, {"--no-sandbox"});
  }
  for (auto [what, run] : {std::pair{"lane", &f.lane}, {"TLS", &f.tls}, {"plain", &f.plain}, {"TLS with crypto threads", &f.tlsThread},
                           {"sandbox", &f.sandbox}, {"in process", &f.inProcess}})
    if (f.problem.empty() && !run->problem.empty()) f.problem = std::string(what) + ": " + run->problem;
  return f;
}

std::string bulkJson(const BulkFigures& f) {
  char text[1100];
  std::snprintf(text, sizeof text,
                "\"bulk_write_read_gbps_lane\":%s,\"bulk_cpu_ms_per_gib_lane\":%s,\"lane_bulk_met\":%s,"
                "\"bulk_write_read_gbps\":%s,\"bulk_write_read_gbps_tls\":%s,\"raw_socket_gbps\":%s,"
                "\"bulk_gbps_sandbox\":%s,\"bulk_gbps_in_process\":%s,"
                "\"bulk_cpu_ms_per_gib\":%s,\"bulk_cpu_ms_per_gib_tls\":%s,"
                "\"bulk_write_read_gbps_tls_thread\":%s,\"bulk_cpu_ms_per_gib_tls_thread\":%s,"
                "\"bulk_met\":%s,\"tls_bulk_met\":%s,\"bulk_bytes\":%zu,\"bulk_problem\":\"%s\"",
                jsonNumber(f.lane.gbps, "%.2f").c_str(), jsonNumber(f.lane.daemonCpuMsPerGib, "%.0f").c_str(),
                f.laneMet() ? "true" : "false", jsonNumber(f.plain.gbps, "%.2f").c_str(), jsonNumber(f.tls.gbps, "%.2f").c_str(),
                jsonNumber(f.rawGbps, "%.2f").c_str(), jsonNumber(f.sandbox.gbps, "%.2f").c_str(),
                jsonNumber(f.inProcess.gbps, "%.2f").c_str(), jsonNumber(f.plain.daemonCpuMsPerGib, "%.0f").c_str(),
                jsonNumber(f.tls.daemonCpuMsPerGib, "%.0f").c_str(), jsonNumber(f.tlsThread.gbps, "%.2f").c_str(),
                jsonNumber(f.tlsThread.daemonCpuMsPerGib, "%.0f").c_str(), f.plainMet() ? "true" : "false", f.tlsMet() ? "true" : "false",
                f.bytes, jsonSafe(f.problem).c_str());
  return text;
}

void printBulkText(const BulkFigures& f) {
  if (!f.problem.empty()) std::printf("bulk: %s\n", f.problem.c_str());
  std::printf("%-26s %7.2f Gbit/s   raw socket %.2f Gbit/s, target >= %.2f (0.8x)  %s (write %.2f, read %.2f; one host, "
              "TLS link, same-host lane; CPU %.0f ms/GiB)\n",
              "bulk_write_read_gbps_lane", f.lane.gbps, f.rawGbps, 0.8 * f.rawGbps, f.laneMet() ? "met" : "MISSED",
              f.lane.writeGbps(), f.lane.readGbps(), f.lane.daemonCpuMsPerGib);
  std::printf("%-26s %7.2f Gbit/s   raw socket %.2f Gbit/s, target >= %.2f (0.8x)  %s (write %.2f, read %.2f)\n",
              "bulk_write_read_gbps", f.plain.gbps, f.rawGbps, 0.8 * f.rawGbps, f.plainMet() ? "met" : "MISSED",
              f.plain.writeGbps(), f.plain.readGbps());
  std::printf("%-26s %7.2f Gbit/s   plain node link %.2f Gbit/s, target >= %.2f (0.8x)  %s (write %.2f, read %.2f)\n",
              "bulk_write_read_gbps_tls", f.tls.gbps, f.plain.gbps, 0.8 * f.plain.gbps, f.tlsMet() ? "met" : "MISSED",
              f.tls.writeGbps(), f.tls.readGbps());
  std::printf("%-26s %7.2f Gbit/s   TLS as deployed %.2f Gbit/s (crypto threads %s here), plain %.2f (write %.2f, read "
              "%.2f; CPU %.0f ms/GiB)\n",
              "bulk_write_read_gbps_tls_thread", f.tlsThread.gbps, f.tls.gbps, f.tlsThreadDeployed ? "on" : "off",
              f.plain.gbps, f.tlsThread.writeGbps(), f.tlsThread.readGbps(), f.tlsThread.daemonCpuMsPerGib);
  std::printf("%-26s %7.0f ms       the scheduler's and netaccel's CPU per GiB moved; through TLS %.0f ms\n",
              "bulk_cpu_ms_per_gib", f.plain.daemonCpuMsPerGib, f.tls.daemonCpuMsPerGib);
  if (f.sandbox.gbps >= 0 && f.inProcess.gbps >= 0)
    std::printf("%-26s %7.2f Gbit/s   same OpenCL card in the netaccel's process %.2f Gbit/s, target >= %.2f (0.9x)  %s "
                "(write %.2f, read %.2f; in process %.2f, %.2f)\n",
                "bulk_gbps_sandbox", f.sandbox.gbps, f.inProcess.gbps, 0.9 * f.inProcess.gbps, f.sandboxMet() ? "met" : "MISSED",
                f.sandbox.writeGbps(), f.sandbox.readGbps(), f.inProcess.writeGbps(), f.inProcess.readGbps());
}

}  // namespace raccel::bench
