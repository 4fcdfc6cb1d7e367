#include "bench/failover.h"
#include "bench/bulk.h"
#include "bench/report.h"

#include <httplib.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <regex>
#include <thread>
#include <map>
#include <vector>

#include "tests/cluster.h"
#include "vmfrontend/raccel.h"

namespace raccel::bench {
namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

double median(std::vector<double> v) {
  if (v.empty()) return -1;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

std::unique_ptr<client::Session> openOn(testing::Cluster& cluster, const std::string& vm, double tflops, std::string* problem) {
  client::Options o;
  o.socket = cluster.vmSocket(vm);
  o.tflops = tflops;
  o.program = "raccel-bench-" + vm;
  o.timeoutMs = 300000;
  auto s = client::Session::open(o);
  if (!s) {
    *problem = s.error().message;
    return nullptr;
  }
  return std::move(*s);
}

// Small asynchronous fills for `seconds`, then a fence: instructions per second.
double stream(client::Session& s, client::Handle tiny, double seconds) {
  auto t = Clock::now();
  uint64_t sent = 0;
  while (since(t) < seconds)
    for (int i = 0; i < 2000; ++i, ++sent) s.fill(tiny, (sent % 1024) * 4, 4, static_cast<uint8_t>(sent));
  if (!s.fence()) return -1;
  return sent / since(t);
}

// The first value of `metric` on the scheduler's /metrics (-1 when absent).
double metric(testing::Cluster& cluster, const std::string& metric) {
  httplib::Client http("127.0.0.1", cluster.httpPort());
  auto page = http.Get("/metrics");
  if (!page || page->status != 200) return -1;
  std::smatch m;
  if (!std::regex_search(page->body, m, std::regex(metric + "\\{[^}]*\\} ([0-9.e+]+)"))) return -1;
  return std::stod(m[1].str());
}

}  // namespace

FailoverFigures measureFailover(bool quick, double steadySeconds) {
  FailoverFigures f;
  const std::string card = "kind=cpu,tflops=4,memory=1GiB";
  {  // What the lineage costs: the same program on a VM with it and one without, alternating.
    testing::VmSpec on{"on", 4}, off{"off", 4};
    on.memoryQuota = off.memoryQuota = "1GiB";
    off.more = "failover=off";
    testing::Cluster cluster({on, off}, "", {"--insecure"});
    cluster.addNetaccel("bench0", {card, card}, 8);
    auto a = openOn(cluster, "on", 4, &f.problem), b = openOn(cluster, "off", 4, &f.problem);
    if (!a || !b) return f;
    auto ta = a->alloc(4096), tb = b->alloc(4096);
    std::vector<double> rateOn, rateOff, bulkOn, bulkOff;
    const size_t bytes = bulkBytes(quick);
    for (int round = 0; round < (quick ? 1 : 5); ++round) {
      rateOff.push_back(stream(*b, tb, quick ? 0.5 : 2));
      rateOn.push_back(stream(*a, ta, quick ? 0.5 : 2));
      bulkOff.push_back(writeAndReadBack(*b, bytes).gbps);
      bulkOn.push_back(writeAndReadBack(*a, bytes).gbps);
    }
    f.asyncOn = median(rateOn);
    f.asyncOff = median(rateOff);
    f.bulkOn = median(bulkOn);
    f.bulkOff = median(bulkOff);
  }
  {  // Recovery of a vaccel holding 256 MiB, and the lineage's memory under a steady load.
    testing::VmSpec vm{"vm1", 4};
    vm.memoryQuota = "1GiB";
    testing::Cluster cluster({vm}, "", {"--insecure"});
    std::map<std::string, testing::Process*> nodes;
    for (const char* name : {"node0", "node1"}) nodes[name] = &cluster.addNetaccel(name, {card}, 4);
    auto s = openOn(cluster, "vm1", 4, &f.problem);
    if (!s) return f;
    const size_t bytes = quick ? (32u << 20) : (256u << 20);
    std::vector<float> data(bytes / 4);
    for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<float>(i % 1000);
    auto big = s->alloc(bytes), tiny = s->alloc(4096);
    s->writeFloats(big, data);
    if (!s->fence()) return f.problem = "the 256 MiB write failed", f;
    // Steady: small writes and ops on the big buffer, the lineage sampled once a second.
    f.steadySeconds = quick ? std::min(steadySeconds, 3.0) : steadySeconds;
    auto t = Clock::now();
    auto next = t;
    std::vector<float> row(1024, 1.0f);
    for (uint64_t i = 0; since(t) < f.steadySeconds; ++i) {
      s->write(big, bytes / 2 + (i * 4096) % (bytes / 2 - 4096), std::as_bytes(std::span(row)));  // the first half stays
      s->axpy(1024, 0.5f, tiny, tiny);
      if (i % 64 == 0 && !s->fence()) return f.problem = "the steady workload failed", f;
      if (Clock::now() >= next) {
        f.lineageMaxBytes = std::max(f.lineageMaxBytes, metric(cluster, "raccel_vaccel_lineage_bytes"));
        next += std::chrono::seconds(1);
      }
    }
    if (!s->fence()) return f.problem = "the steady workload failed", f;
    f.recoveryBytes = bytes + 4096;
    testing::Process* holder = nodes.at(s->vaccel().cards.at(0).node);
    auto kill = Clock::now();
    holder->kill(SIGKILL);
    holder->wait(10000);  // dead before the next instruction is sent
    s->fill(tiny, 0, 4, 1);
    if (auto r = s->fence(); !r) return f.problem = "no recovery: " + r.error().message, f;
    f.recoveryMs = since(kill) * 1e3;
    auto back = s->readFloats(big, 16);
    if (!back || (*back)[5] != 5.0f) f.problem = "the recovered buffer is not what was written";
  }
  return f;
}

std::string failoverJson(const FailoverFigures& f) {
  char b[1024];
  std::snprintf(b, sizeof b,
                "\"failover_recovery_ms\":%s,\"failover_recovery_bytes\":%llu,\"lineage_overhead_pct\":%s,"
                "\"async_instr_per_s_lineage\":%s,\"async_instr_per_s_failover_off\":%s,\"lineage_bulk_overhead_pct\":%s,"
                "\"bulk_write_read_gbps_lineage\":%s,\"bulk_write_read_gbps_failover_off\":%s,\"lineage_memory_bytes\":%s,"
                "\"lineage_steady_seconds\":%.0f",
                jsonNumber(f.recoveryMs, "%.1f").c_str(), static_cast<unsigned long long>(f.recoveryBytes),
                jsonNumber(f.overheadPct(), "%.2f", true).c_str(), jsonNumber(f.asyncOn, "%.0f").c_str(),
                jsonNumber(f.asyncOff, "%.0f").c_str(), jsonNumber(f.bulkOverheadPct(), "%.2f", true).c_str(),
                jsonNumber(f.bulkOn, "%.2f").c_str(), jsonNumber(f.bulkOff, "%.2f").c_str(),
                jsonNumber(f.lineageMaxBytes, "%.0f").c_str(), f.steadySeconds);
  return b + (",\"failover_problem\":\"" + jsonSafe(f.problem) + "\"");
}

void printFailoverText(const FailoverFigures& f) {
  if (!f.problem.empty()) {
    std::printf("%-26s %12s   not measured: %s\n", "failover_recovery_ms", "-", f.problem.c_str());
    return;
  }
  std::printf("%-26s %9.1f ms   kill -9 of its netaccel to its next completed instruction, %.0f MiB of buffers\n",
              "failover_recovery_ms", f.recoveryMs, f.recoveryBytes / 1048576.0);
  std::printf("%-26s %11.2f%%   async_instr_per_s %.0f with lineage, %.0f with failover off, target <= 5%%  %s\n",
              "lineage_overhead_pct", f.overheadPct(), f.asyncOn, f.asyncOff, f.overheadPct() <= 5 ? "met" : "MISSED");
  std::printf("%-26s %11.2f%%   bulk_write_read_gbps %.2f with lineage, %.2f with failover off\n",
              "lineage_bulk_overhead_pct", f.bulkOverheadPct(), f.bulkOn, f.bulkOff);
  std::printf("%-26s %12.0f   most held (checkpoint + log) over a %.0f s steady workload on a 256 MiB vaccel\n",
              "lineage_memory_bytes", f.lineageMaxBytes, f.steadySeconds);
}

}  // namespace raccel::bench
