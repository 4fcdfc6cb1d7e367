#include "bench/multi_host.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <vector>

#include "bench/report.h"
#include "tests/etcd_cluster.h"

namespace raccel::bench {
namespace {

struct Race {
  double attempted = 0, admitted = 0, conflicts = 0, seconds = 0, p99Ms = 0;
  std::string problem;
};

// Runs `schedulers` raccel-pool-race processes at once on the pool and sums what they saw.
Race race(testing::EtcdCluster& etcd, const std::string& round, unsigned schedulers, unsigned admissions) {
  std::vector<std::unique_ptr<testing::Process>> racers;
  std::vector<std::string> logs;
  for (unsigned i = 0; i < schedulers; ++i) {
    logs.push_back(etcd.dir() + "/" + round + std::to_string(i) + ".log");
    racers.push_back(std::make_unique<testing::Process>(
        "raccel-pool-race",
        std::vector<std::string>{"--etcd", etcd.endpoints(), "--name", round + std::to_string(i), "--admissions",
                                 std::to_string(admissions), "--window", "4", "--max-blocks", "4", "--seed",
                                 std::to_string(i + 1)},
        logs.back()));
  }
  Race r;
  for (unsigned i = 0; i < schedulers; ++i) {
    int status = racers[i]->wait(600000);
    std::string out = testing::readFile(logs[i]);
    size_t brace = out.find('{');
    auto j = brace == std::string::npos ? nlohmann::json() : nlohmann::json::parse(out.substr(brace), nullptr, false);
    if (status != 0 || !j.is_object()) {
      r.problem = "raccel-pool-race " + round + std::to_string(i) + " failed: " + out.substr(0, 300);
      continue;
    }
    r.attempted += j["admitted"].get<double>() + j["refused"].get<double>();
    r.admitted += j["admitted"].get<double>();
    r.conflicts += j["conflicts"].get<double>();
    r.seconds = std::max(r.seconds, j["seconds"].get<double>());
    r.p99Ms = std::max(r.p99Ms, j["admission_p99_ms"].get<double>());
  }
  return r;
}

}  // namespace

MultiHostFigures measureMultiHost(bool quick) {
  MultiHostFigures f;
  if (auto why = testing::etcdUnavailable(); !why.empty()) {
    f.skipped = why;
    return f;
  }
  testing::EtcdCluster etcd(3);
  if (auto ok = etcd.start(); !ok) {
    f.skipped = ok.error().message;
    return f;
  }
  // The pool: four nodes of four cards of 4 blocks (64 blocks), under a holder
  // process's lease. Three schedulers holding up to 4 vaccels of 1-4 blocks each fit in
  // it most of the time, so they race for the same cards, not for an empty pool.
  std::vector<std::string> args{"--etcd", etcd.endpoints(), "--name", "nodes", "--admissions", "0", "--hold",
                                "--lease-ttl", "60"};
  for (int n = 0; n < 4; ++n) args.insert(args.end(), {"--node", "n" + std::to_string(n) + ":4x4"});
  testing::Process nodes("raccel-pool-race", args, etcd.dir() + "/nodes.log");
  testing::waitFor([&] { return testing::readFile(etcd.dir() + "/nodes.log").find("admitted") != std::string::npos; }, 30000);
  const unsigned admissions = quick ? 60 : 500;
  Race one = race(etcd, "single", 1, admissions);
  Race three = race(etcd, "multi", f.schedulers, admissions);
  if (!one.problem.empty() || !three.problem.empty()) {
    f.skipped = one.problem + three.problem;
    return f;
  }
  f.singleAdmissionsPerS = one.attempted / one.seconds;
  f.singleP99Ms = one.p99Ms;
  f.multiAdmissionsPerS = three.attempted / three.seconds;
  f.multiP99Ms = three.p99Ms;
  f.multiConflictRate = three.conflicts / std::max(1.0, three.conflicts + three.admitted);
  return f;
}

std::string multiHostJson(const MultiHostFigures& f) {
  return "\"multi_admission_per_s\":" + jsonNumber(f.multiAdmissionsPerS, "%.0f") +
         ",\"single_admission_per_s\":" + jsonNumber(f.singleAdmissionsPerS, "%.0f") +
         ",\"multi_admission_p99_ms\":" + jsonNumber(f.multiP99Ms, "%.2f") +
         ",\"single_admission_p99_ms\":" + jsonNumber(f.singleP99Ms, "%.2f") +
         ",\"multi_conflict_rate\":" + jsonNumber(f.multiConflictRate, "%.4f") + ",\"multi_skipped\":\"" +
         jsonSafe(f.skipped) + "\"";
}

void printMultiHostText(const MultiHostFigures& f) {
  if (!f.skipped.empty()) {
    std::printf("%-26s %12s   skipped: %s\n", "multi_admission_per_s", "-", f.skipped.c_str());
    return;
  }
  std::printf("%-26s %12.0f   one scheduler alone on the same pool and etcd: %.0f/s\n", "multi_admission_per_s",
              f.multiAdmissionsPerS, f.singleAdmissionsPerS);
  std::printf("%-26s %9.2f ms   one scheduler alone %.2f ms, target <= 20 ms  %s\n", "multi_admission_p99_ms",
              f.multiP99Ms, f.singleP99Ms, f.multiP99Ms <= 20 ? "met" : "MISSED");
  std::printf("%-26s %12.4f   transactions that met a change by another scheduler and were placed again\n",
              "multi_conflict_rate", f.multiConflictRate);
}

}  // namespace raccel::bench
