// A real Prometheus (Debian's prometheus) scrapes a scheduler and a netaccel every second
// during a workload; its HTTP API must then give the pool's and the kernel time's
// values the console gives.
#include <gtest/gtest.h>
#include <httplib.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "tests/cluster.h"

namespace raccel::testing {
namespace {

using Json = nlohmann::json;
using Clock = std::chrono::steady_clock;

class Prometheus {
 public:
  Prometheus(const std::string& dir, const std::vector<std::pair<std::string, int>>& jobs) : dir_(dir) {
    port_ = freePort();
    std::ofstream config(dir + "/prometheus.yml");
    config << "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n";
    for (auto& [job, port] : jobs)
      config << "  - job_name: " << job << "\n    static_configs:\n      - targets: ['127.0.0.1:" << port << "']\n";
    config.close();
    process_ = std::make_unique<Process>("/usr/bin/prometheus",
                                         std::vector<std::string>{"--config.file=" + dir + "/prometheus.yml",
                                                                  "--storage.tsdb.path=" + dir + "/tsdb",
                                                                  "--web.listen-address=127.0.0.1:" + std::to_string(port_),
                                                                  "--log.level=warn"},
                                         dir + "/prometheus.log");
  }
  bool ready(int timeoutMs) {
    auto until = Clock::now() + std::chrono::milliseconds(timeoutMs);
    while (Clock::now() < until) {
      httplib::Client c("127.0.0.1", port_);
      auto r = c.Get("/-/ready");
      if (r && r->status == 200) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    return false;
  }
  // The instant value of a PromQL expression that yields one series, or NaN.
  double query(const std::string& promql) {
    httplib::Client c("127.0.0.1", port_);
    auto r = c.Get("/api/v1/query", httplib::Params{{"query", promql}}, httplib::Headers{});
    if (!r || r->status != 200) return NAN;
    auto j = Json::parse(r->body, nullptr, false);
    if (j.is_discarded() || j["status"] != "success" || j["data"]["result"].size() != 1) return NAN;
    return std::stod(j["data"]["result"][0]["value"][1].get<std::string>());
  }
  // Polls `promql` until `ok` holds for its value (up to timeoutMs); the last value.
  double waitFor(const std::string& promql, const std::function<bool(double)>& ok, int timeoutMs = 20000) {
    auto until = Clock::now() + std::chrono::milliseconds(timeoutMs);
    double v = NAN;
    while (Clock::now() < until) {
      v = query(promql);
      if (!std::isnan(v) && ok(v)) return v;
      std::this_thread::sleep_for(std::chrono::milliseconds(250));
    }
    return v;
  }
  std::string log() const { return readFile(dir_ + "/prometheus.log"); }

 private:
  std::string dir_;
  int port_ = 0;
  std::unique_ptr<Process> process_;
};

TEST(Prometheus, ScrapesTheSchedulerAndANetaccelAndAgreesWithTheConsole) {
  if (!std::filesystem::exists("/usr/bin/prometheus")) GTEST_SKIP() << "prometheus not found (apt-get install prometheus)";
  Cluster cluster;
  cluster.addNetaccel("n1", {"kind=gpu,tflops=8,memory=1GiB"}, 8);
  std::string guestd = cluster.startGuestd();
  Prometheus prometheus(cluster.dir(), {{"raccel-scheduler", cluster.httpPort()}, {"raccel-netaccel", cluster.netaccelHttpPort("n1")}});
  ASSERT_TRUE(prometheus.ready(30000)) << prometheus.log();

  // A holder keeps 2 blocks; a worker runs gemms on 3 more and ends.
  Process holder("raccel-run", {"--socket", guestd, "--name", "holder", "--tflops", "2", "--hold-ms", "60000", "--iterations", "1"},
                 cluster.dir() + "/holder.log");
  cluster.waitConsole("vaccels", [](const std::string& s) { return s.find("\"running\"") != std::string::npos; });
  Process worker("raccel-run", {"--socket", guestd, "--name", "worker", "--tflops", "3", "--size", "384", "--iterations", "30"},
                 cluster.dir() + "/worker.log");
  ASSERT_EQ(worker.wait(120000), 0) << readFile(cluster.dir() + "/worker.log");

  // The console's kernel time settles once the netaccel's heartbeats have reported it all.
  auto kernelMs = [&] { return Json::parse(cluster.console("vms"))["vms"][0]["kernelMs"].get<double>(); };
  double consoleMs = kernelMs();
  for (int i = 0; i < 20; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1200));
    double again = kernelMs();
    if (again == consoleMs && again > 0) break;
    consoleMs = again;
  }
  ASSERT_GT(consoleMs, 0);
  Json pool = Json::parse(cluster.console("pool"));
  uint32_t used = 0;
  for (auto& r : pool["ranges"])
    if (r["state"] == "used") used += r["count"].get<uint32_t>();

  EXPECT_EQ(prometheus.waitFor("up{job=\"raccel-scheduler\"}", [](double v) { return v == 1; }), 1) << prometheus.log();
  EXPECT_EQ(prometheus.waitFor("up{job=\"raccel-netaccel\"}", [](double v) { return v == 1; }), 1) << prometheus.log();
  // The VM's kernel time: the console prints whole milliseconds.
  double promSeconds = prometheus.waitFor("raccel_vm_kernel_seconds_total{vm=\"vm1\"}",
                                          [&](double v) { return std::floor(v * 1000 + 1e-9) == consoleMs; });
  EXPECT_EQ(std::floor(promSeconds * 1000 + 1e-9), consoleMs) << "Prometheus " << promSeconds << " s, console " << consoleMs << " ms";
  double usedSeries = prometheus.waitFor("sum(raccel_pool_blocks{state=\"used\"})", [&](double v) { return v == used; });
  EXPECT_EQ(usedSeries, used);
  EXPECT_EQ(used, 2u);
  EXPECT_EQ(prometheus.waitFor("sum(raccel_pool_blocks)", [&](double v) { return v == pool["total"].get<double>(); }),
            pool["total"].get<double>());
  EXPECT_EQ(prometheus.waitFor("raccel_pool_blocks{node=\"n1\",kind=\"gpu\",state=\"free\"}",
                               [&](double v) { return v == pool["free"].get<double>(); }),
            pool["free"].get<double>());
  // The card's own busy time (netaccel) covers the same kernels the scheduler heard of.
  double busy = prometheus.waitFor("raccel_card_busy_seconds_total{node=\"n1\",card=\"0\"}",
                                   [&](double v) { return v * 1000 >= consoleMs - 1; });
  EXPECT_NEAR(busy * 1000, consoleMs, std::max(2.0, consoleMs * 0.02)) << "card busy " << busy << " s";
  double admissions = prometheus.waitFor("raccel_admission_latency_seconds_count", [](double v) { return v == 2; });
  EXPECT_EQ(admissions, 2);
  double instructions = prometheus.waitFor("raccel_vm_instructions_total{vm=\"vm1\"}", [](double v) { return v > 30; });
  EXPECT_GT(instructions, 30);
  double p99 = prometheus.query("histogram_quantile(0.99, raccel_admission_latency_seconds_bucket)");
  std::printf("prometheus: vm1 kernel %.6f s (console %.0f ms), card busy %.6f s, used blocks %.0f of %.0f, "
              "%.0f instructions, admission p99 <= %.4f s\n",
              promSeconds, consoleMs, busy, usedSeries, pool["total"].get<double>(), instructions, p99);
}

}  // namespace
}  // namespace raccel::testing
