// The scheduler's and netaccel's HTTP side with real processes: the web API answers what
// raccelctl prints (one encoder), /metrics is valid Prometheus text (promtool) with the
// console's numbers, bad HTTP is refused without harm, and the web console works in a
// real headless Chromium (tests/web/console_test.py, Selenium).
#include <gtest/gtest.h>
#include <httplib.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <thread>

#include "tests/cluster.h"
#include "tests/raw_http.h"

namespace raccel::testing {
namespace {

using Json = nlohmann::json;
constexpr const char* kToken = "test-token-0123456789abcdef";

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// The value of one sample line (`name{labels} value`) on a metrics page, or -1.
double sample(const std::string& page, const std::string& series) {
  std::istringstream in(page);
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(series + " ", 0) == 0) return std::stod(line.substr(series.size() + 1));
  return -1;
}

using namespace rawhttp;

class WebConsole : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = makeTempDir();
    tokenFile_ = dir_ + "/token";
    std::ofstream(tokenFile_) << kToken << "\n";
    cluster_ = std::make_unique<Cluster>(std::vector<VmSpec>{VmSpec{}}, dir_,
                                         std::vector<std::string>{"--http-token-file", tokenFile_, "--set",
                                                                  "http_client_timeout_s=2"});
    cluster_->addNetaccel("n1", {"kind=gpu,tflops=8,memory=1GiB"}, 8);
    cluster_->addNetaccel("n2", {"kind=cpu,tflops=4,memory=1GiB"}, 4);
    guestd_ = cluster_->startGuestd();
  }

  // A program that holds `tflops` blocks for a minute; waits until it is placed.
  Process& hold(const std::string& name, int tflops) {
    programs_.emplace_back("raccel-run",
                           std::vector<std::string>{"--socket", guestd_, "--name", name, "--tflops", std::to_string(tflops),
                                                    "--hold-ms", "60000", "--iterations", "1"},
                           dir_ + "/" + name + ".log");
    // Placed, and its inputs allocated and written: the program says so once its fence
    // has come back, and sends nothing more for the minute it holds them.
    const std::string log = dir_ + "/" + name + ".log";
    bool holding = waitFor([&] { return readFile(log).find("holding the virtual accelerator") != std::string::npos; }, 60000);
    EXPECT_TRUE(holding) << readFile(log) << cluster_->logs();
    return programs_.back();
  }

  httplib::Client client() const {
    httplib::Client c("127.0.0.1", cluster_->httpPort());
    c.set_read_timeout(10, 0);
    return c;
  }

  std::string dir_, tokenFile_, guestd_;
  std::unique_ptr<Cluster> cluster_;
  std::vector<Process> programs_;
};

TEST_F(WebConsole, TheApiAnswersWhatRaccelctlPrintsAndMetricsAgreeWithTheConsole) {
  hold("holder", 3);
  auto http = client();
  for (std::string query : {"pool", "cards", "vms", "vaccels", "nodes"}) {
    auto r = http.Get(("/api/" + query).c_str());
    ASSERT_TRUE(r) << query << ": " << httplib::to_string(r.error());
    EXPECT_EQ(r->status, 200);
    EXPECT_EQ(r->get_header_value("Content-Type"), "application/json");
    Json web = Json::parse(r->body), ctl = Json::parse(cluster_->console(query));
    if (query == "nodes")  // heard from at different moments
      for (auto* doc : {&web, &ctl})
        for (auto& n : (*doc)["nodes"]) n.erase("msSinceHeartbeat");
    if (query == "vaccels" || query == "vms")  // heartbeats bring kernel time in between
      for (auto* doc : {&web, &ctl})
        for (auto& v : (*doc)[query]) v.erase("kernelMs");
    EXPECT_EQ(web, ctl) << query;
  }

  auto metrics = http.Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_TRUE(has(metrics->get_header_value("Content-Type"), "text/plain; version=0.0.4")) << metrics->get_header_value("Content-Type");
  const std::string& page = metrics->body;
  Json pool = Json::parse(cluster_->console("pool"));
  Json vaccels = Json::parse(cluster_->console("vaccels"));
  ASSERT_EQ(vaccels["vaccels"].size(), 1u);
  uint64_t id = vaccels["vaccels"][0]["id"];
  uint32_t used = 0;
  for (auto& r : pool["ranges"])
    if (r["state"] == "used") used += r["count"].get<uint32_t>();
  EXPECT_EQ(used, 3u);
  EXPECT_EQ(sample(page, "raccel_pool_blocks{node=\"n1\",kind=\"gpu\",state=\"used\"}") +
                sample(page, "raccel_pool_blocks{node=\"n2\",kind=\"cpu\",state=\"used\"}"),
            used)
      << page;
  EXPECT_EQ(sample(page, "raccel_pool_blocks{node=\"n2\",kind=\"cpu\",state=\"free\"}"), 4) << page;
  EXPECT_EQ(sample(page, "raccel_vaccel_blocks{vm=\"vm1\",vaccel=\"" + std::to_string(id) + "\"}"), 3) << page;
  EXPECT_EQ(sample(page, "raccel_vaccels{state=\"running\"}"), 1) << page;
  EXPECT_GE(sample(page, "raccel_admission_latency_seconds_count"), 1) << page;
  EXPECT_EQ(sample(page, "raccel_node_up{node=\"n1\"}"), 1) << page;
  EXPECT_GE(sample(page, "raccel_vm_instructions_total{vm=\"vm1\"}"), 1) << page;

  httplib::Client node("127.0.0.1", cluster_->netaccelHttpPort("n1"));
  // The card has run the holder's writes once its buffers show there.
  std::string nodeText;
  for (int i = 0; i < 100; ++i) {
    auto got = node.Get("/metrics");
    ASSERT_TRUE(got);
    nodeText = got->body;
    if (sample(nodeText, "raccel_card_memory_used_bytes{node=\"n1\",card=\"0\",kind=\"gpu\",model=\"sim-gpu\"}") > 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_EQ(sample(nodeText, "raccel_netaccel_connected{node=\"n1\"}"), 1) << nodeText;
  EXPECT_GT(sample(nodeText, "raccel_card_memory_used_bytes{node=\"n1\",card=\"0\",kind=\"gpu\",model=\"sim-gpu\"}"), 0)
      << nodeText;
  EXPECT_EQ(sample(nodeText, "raccel_card_contexts{node=\"n1\",card=\"0\",kind=\"gpu\",model=\"sim-gpu\"}"), 1)
      << nodeText;

  // Both pages are valid exposition text, by Prometheus' own checker.
  if (std::system("command -v promtool >/dev/null 2>&1") != 0) GTEST_SKIP() << "promtool not found (apt-get install prometheus)";
  for (auto [name, text] : {std::pair{"scheduler", page}, std::pair{"netaccel", nodeText}}) {
    std::string file = dir_ + "/" + name + ".prom";
    std::ofstream(file) << text;
    int status = -1;
    std::string out = runCommand("promtool check metrics < " + sh(file), &status);
    EXPECT_EQ(status, 0) << name << ": " << out;
  }
}

TEST_F(WebConsole, BadHttpIsRefusedClearlyAndTheDaemonsCarryOn) {
  hold("holder", 3);
  int port = cluster_->httpPort();
  // Malformed requests: libmicrohttpd answers 400 (or closes, with no request line to answer).
  auto malformed = [](int at) {
    for (const std::string& bad : std::vector<std::string>{"GARBAGE\r\n\r\n", "GET /api/pool HTTP/1.1\r\nBroken header line\r\n\r\n",
                                                         std::string("\0\1\2\3\r\n\r\n", 8)}) {
      std::string r = roundTrip(at, bad);
      EXPECT_TRUE(statusOf(r) == 400 || r.empty()) << r;
    }
    EXPECT_EQ(statusOf(roundTrip(at, "GET /metrics HTTP/1.1\r\nBroken header line\r\n\r\n")), 400);
  };
  malformed(port);
  // Oversized headers and bodies.
  EXPECT_EQ(statusOf(roundTrip(port, "GET /api/pool HTTP/1.1\r\nHost: x\r\nX-Big: " + std::string(100000, 'a') + "\r\n\r\n")), 431);
  std::string big = roundTrip(port, "POST /api/actions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + std::string(kToken) +
                                  "\r\nContent-Length: 10000000\r\nConnection: close\r\n\r\n{");
  EXPECT_EQ(statusOf(big), 413) << big;
  // A client that never finishes its request is closed after http_client_timeout_s (2 s).
  int slow = connectTo(port);
  ASSERT_GE(slow, 0);
  sendAll(slow, "GET /api/pool HTTP/1.1\r\nHo");
  EXPECT_TRUE(closedByServer(slow, 10000)) << "a slow client was not closed";
  ::close(slow);

  // Too many connections from one address: the extra ones are closed at once.
  std::vector<int> idle;
  for (int i = 0; i < 20; ++i) idle.push_back(connectTo(port));
  std::string refused = roundTrip(port, "GET /api/pool HTTP/1.1\r\nHost: x\r\n\r\n", 2000);
  EXPECT_TRUE(refused.empty()) << refused;
  for (int fd : idle) ::close(fd);
  // Their slots free once the server has seen them close.
  for (int i = 0; i < 100 && statusOf(roundTrip(port, "GET /api/pool HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")) != 200; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));

  auto http = client();
  auto post = [&](const std::string& body, const std::string& token) {
    httplib::Headers h;
    if (!token.empty()) h.emplace("Authorization", token);
    return http.Post("/api/actions", h, body, "application/json");
  };
  struct Case {
    std::string body, auth;
    int status;
    std::string says;
  };
  const std::string bearer = "Bearer " + std::string(kToken);
  for (auto& k : std::vector<Case>{
           {R"({"action":"preempt","args":["1"]})", "", 401, "Authorization: Bearer"},
           {R"({"action":"preempt","args":["1"]})", "Bearer wrong-token-wrong-token!", 401, "not the scheduler's"},
           {R"({"action":"preempt","args":["1"]})", "Basic dXNlcjpwYXNz", 401, "not the scheduler's"},
           {R"({"action":"preempt","args":["1"]})", bearer + "x", 401, "not the scheduler's"},
           {"{not json", bearer, 400, "JSON object"},
           {"[1,2]", bearer, 400, "JSON object"},
           {R"({"args":["1"]})", bearer, 400, "\\\"action\\\" must be a string"},
           {R"({"action":"format-disks"})", bearer, 400, "unknown action"},
           {R"({"action":"preempt","args":[1]})", bearer, 400, "strings only"},
           {R"({"action":"preempt","args":["99999999999999999999999"]})", bearer, 400, "is not a vaccel id"},
           {R"({"action":"preempt","args":["-1"]})", bearer, 400, "is not a vaccel id"},
           {R"({"action":"preempt","args":["424242"]})", bearer, 404, "no vaccel #424242"},
           {R"({"action":"defrag","maxMoves":-4})", bearer, 400, "maxMoves"},
           {R"({"action":"drain","args":["nowhere"]})", bearer, 404, "nowhere"},
           {R"({"action":"drain","args":["n2"],"undo":"yes"})", bearer, 400, "undo"},
           {R"({"action":"set-policy","args":["vm1","priority=banana"]})", bearer, 400, "priority"},
       }) {
    auto r = post(k.body, k.auth);
    ASSERT_TRUE(r) << k.body;
    EXPECT_EQ(r->status, k.status) << k.body << " -> " << r->body;
    EXPECT_TRUE(has(r->body, k.says)) << k.body << " -> " << r->body;
  }
  auto args = Json::object({{"action", "set-policy"}, {"args", Json::array()}});
  for (int i = 0; i < 100; ++i) args["args"].push_back("k=v");
  auto many = post(args.dump(), bearer);
  ASSERT_TRUE(many);
  EXPECT_EQ(many->status, 400);
  auto get = http.Get("/api/actions");
  ASSERT_TRUE(get);
  EXPECT_EQ(get->status, 405);
  EXPECT_EQ(get->get_header_value("Allow"), "POST");
  auto postMetrics = http.Post("/metrics", "x", "text/plain");
  ASSERT_TRUE(postMetrics);
  EXPECT_EQ(postMetrics->status, 405);
  auto missing = http.Get("/etc/passwd");
  ASSERT_TRUE(missing);
  EXPECT_EQ(missing->status, 404);
  auto dots = http.Get("/../../etc/passwd");
  ASSERT_TRUE(dots);
  EXPECT_NE(dots->status, 200);

  // The netaccel's /metrics port: the same server, one route.
  int nodePort = cluster_->netaccelHttpPort("n1");
  malformed(nodePort);
  httplib::Client node("127.0.0.1", nodePort);
  auto nodeMissing = node.Get("/api/pool");
  ASSERT_TRUE(nodeMissing);
  EXPECT_EQ(nodeMissing->status, 404);

  // Nothing changed: the holder runs on its blocks, the nodes are online, raccelctl
  // and the API answer, and an action with the token works.
  Json vaccels = Json::parse(cluster_->console("vaccels"));
  ASSERT_EQ(vaccels["vaccels"].size(), 1u);
  EXPECT_EQ(vaccels["vaccels"][0]["state"], "running");
  EXPECT_TRUE(has(cluster_->console("nodes"), "\"online\":true"));
  EXPECT_FALSE(has(cluster_->console("nodes"), "\"online\":false"));
  auto ok = post(R"({"action":"defrag"})", bearer);
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200) << ok->body;
  EXPECT_TRUE(has(ok->body, "move(s) started")) << ok->body;
  EXPECT_TRUE(cluster_->scheduler().running());
  std::string log = readFile(dir_ + "/scheduler.log");
  EXPECT_TRUE(has(log, "with a wrong token, refused")) << log;
}

// Why the browser test cannot run here, or "".
std::string browserUnavailable() {
  for (const char* path : {"/usr/bin/chromium", "/usr/bin/chromedriver"})
    if (!std::filesystem::exists(path)) return std::string(path) + " not found (apt-get install chromium chromium-driver)";
  if (std::system("/usr/bin/python3 -c 'import selenium' >/dev/null 2>&1") != 0)
    return "python3-selenium not found (apt-get install python3-selenium)";
  return "";
}

TEST_F(WebConsole, ChromiumShowsTheBlockMapLiveEventsGuardsActionsAndAgreesDuringADrain) {
  if (auto why = browserUnavailable(); !why.empty()) GTEST_SKIP() << why;
  hold("holder", 3);  // blocks 1-3 of n1: the first fit
  hold("wide", 6);    // the next six: 4-8 on n1 and 9 on n2
  Json vaccels = Json::parse(cluster_->console("vaccels"));
  ASSERT_EQ(vaccels["vaccels"].size(), 2u);
  std::vector<std::string> expect;
  std::string known;
  for (auto& v : vaccels["vaccels"]) {
    std::string owner = "vm1/" + v["program"].get<std::string>() + "#" + std::to_string(v["id"].get<uint64_t>());
    ASSERT_EQ(v["blocks"].size(), 1u) << v;
    uint32_t first = v["blocks"][0]["first"], count = v["blocks"][0]["count"];
    expect.push_back("--expect '" + owner + "=" + std::to_string(first) + "-" + std::to_string(first + count - 1) + "'");
    known += owner + " " + std::to_string(first) + "-" + std::to_string(first + count - 1) + "; ";
  }
  EXPECT_EQ(known, "vm1/holder#1 1-3; vm1/wide#2 4-9; ");
  std::string artifacts = std::string(RACCEL_BIN_DIR) + "/../test-artifacts/web-console";
  std::string command = "/usr/bin/python3 " + sourcePath("tests/web/console_test.py") + " --url http://127.0.0.1:" +
                        std::to_string(cluster_->httpPort()) + " --token " + kToken + " --start " + sh(sh(binary("raccel-run")) +
                        " --socket " + sh(guestd_) + " --name late-arrival --iterations 1") + " --started late-arrival --preempt 1" +
                        " --artifacts " + sh(artifacts);
  for (auto& e : expect) command += " " + e;
  // During a drain of n1 (8 blocks), raccelctl's views and a program of 5 blocks, more
  // than n2's 4 alone: it is told "not now", naming the drain, not "never".
  const std::string ctl = sh(binary("raccelctl")) + " --socket " + sh(cluster_->consoleSocket());
  command += " --drain n1 --during-drain " + sh(ctl + " nodes; " + ctl + " pool; " + sh(binary("raccel-run")) + " --socket " +
                                                sh(guestd_) + " --name too-big --tflops 5 --iterations 1");
  int status = -1;
  std::string out = runCommand(command + " 2>&1", &status);
  std::printf("%s", out.c_str());
  EXPECT_EQ(status, 0) << out << cluster_->logs();
  EXPECT_TRUE(has(out, "PASS")) << out;
  EXPECT_TRUE(has(out, "drain of n1: page, /api/nodes, /api/pool and raccelctl agree")) << out;
  for (const char* shot : {"1-block-map.png", "2-live-event.png", "3-preempted-with-token.png", "4-resumed.png", "5-draining.png"})
    EXPECT_TRUE(std::filesystem::exists(artifacts + "/" + shot)) << shot;
}

}  // namespace
}  // namespace raccel::testing
