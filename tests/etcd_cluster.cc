#include "tests/etcd_cluster.h"

#include <unistd.h>

#include <csignal>
#include <chrono>
#include <filesystem>
#include <thread>

#include "scheduler/etcd/etcd_client.h"

namespace raccel::testing {

std::string etcdUnavailable() {
  if (std::system("command -v etcd >/dev/null 2>&1") != 0) return "etcd not found (apt-get install etcd-server)";
  return "";
}

EtcdCluster::EtcdCluster(int members, std::string tlsDir) : dir_(makeTempDir()), tlsDir_(std::move(tlsDir)) {
  for (int i = 0; i < members; ++i) {
    clientPorts_.push_back(steadyPort());
    peerPorts_.push_back(steadyPort());
    processes_.emplace_back();
  }
}

EtcdCluster::~EtcdCluster() {
  for (int m = 0; m < members(); ++m) kill(m);  // its data goes with it: no graceful stop
  std::error_code ignored;
  std::filesystem::remove_all(dir_, ignored);
}

std::vector<std::string> EtcdCluster::args(int m) const {
  auto url = [](int port) { return "http://127.0.0.1:" + std::to_string(port); };
  auto clientUrl = [this](int port) { return (tlsDir_.empty() ? "http" : "https") + std::string("://127.0.0.1:") + std::to_string(port); };
  std::string initial;
  for (int i = 0; i < members(); ++i)
    initial += (i ? "," : "") + ("m" + std::to_string(i)) + "=" + url(peerPorts_[static_cast<size_t>(i)]);
  size_t i = static_cast<size_t>(m);
  std::vector<std::string> args{"--name", "m" + std::to_string(m), "--data-dir", dir_ + "/m" + std::to_string(m),
          "--listen-client-urls", clientUrl(clientPorts_[i]), "--advertise-client-urls", clientUrl(clientPorts_[i]),
          "--listen-peer-urls", url(peerPorts_[i]), "--initial-advertise-peer-urls", url(peerPorts_[i]),
          "--initial-cluster", initial, "--initial-cluster-state", "new", "--initial-cluster-token", "raccel-test",
          "--heartbeat-interval", "100", "--election-timeout", "1000", "--logger", "zap", "--log-level", "warn"};
  if (!tlsDir_.empty())
    args.insert(args.end(), {"--cert-file", tlsDir_ + "/etcd-server.pem", "--key-file", tlsDir_ + "/etcd-server.key",
                             "--client-cert-auth", "--trusted-ca-file", tlsDir_ + "/ca.pem"});
  return args;
}

std::string EtcdCluster::endpoints() const {
  std::string out;
  for (auto& e : endpointList()) out += (out.empty() ? "" : ",") + e;
  return out;
}

std::vector<std::string> EtcdCluster::endpointList() const {
  std::vector<std::string> out;
  for (int port : clientPorts_) out.push_back((tlsDir_.empty() ? "" : "https://") + std::string("127.0.0.1:") + std::to_string(port));
  return out;
}

etcd::Options EtcdCluster::clientOptions(uint32_t callTimeoutMs) const {
  etcd::Options o{endpointList(), "", "", "", callTimeoutMs};
  if (!tlsDir_.empty()) o.caFile = tlsDir_ + "/ca.pem", o.certFile = tlsDir_ + "/etcd-client.pem", o.keyFile = tlsDir_ + "/etcd-client.key";
  return o;
}

Status EtcdCluster::start() {
  if (auto why = etcdUnavailable(); !why.empty()) return fail(Code::unavailable, why);
  // Each port was free when chosen, but is taken only when etcd binds it: a process of a
  // test running beside this one may bind it first. Then the whole cluster starts again,
  // on new ports and from no data (its members agree on their peers' addresses).
  Status started = fail(Code::unavailable, "not started");
  for (int attempt = 0; attempt < 5; ++attempt) {
    if (attempt) {
      for (int m = 0; m < members(); ++m) {
        kill(m);
        std::error_code ignored;
        std::filesystem::remove_all(dir_ + "/m" + std::to_string(m), ignored);
        clientPorts_[static_cast<size_t>(m)] = steadyPort();
        peerPorts_[static_cast<size_t>(m)] = steadyPort();
      }
    }
    for (int m = 0; m < members(); ++m)
      processes_[static_cast<size_t>(m)] =
          std::make_unique<Process>("/usr/bin/etcd", args(m), dir_ + "/m" + std::to_string(m) + ".log");
    started = {};
    for (int m = 0; m < members() && started; ++m) started = waitReady(m);
    if (started || started.error().message.find("address already in use") == std::string::npos) return started;
  }
  return started;
}

Status EtcdCluster::waitReady(int m) {
  auto end = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  Error last{Code::unavailable, "not started"};
  while (std::chrono::steady_clock::now() < end) {
    if (!processes_[static_cast<size_t>(m)]->running())
      return fail(Code::unavailable, "etcd member m" + std::to_string(m) + " exited: " +
                                         readFile(processes_[static_cast<size_t>(m)]->log()));
    // A fresh channel each time: one made before the member listened waits out its backoff.
    etcd::Options options = clientOptions(1000);
    options.endpoints = {endpointList()[static_cast<size_t>(m)]};
    auto client = etcd::Client::open(options);
    if (!client) return fail(client.error());
    auto r = (*client)->range("/raccel-health");
    if (r) return {};
    last = r.error();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return fail(Code::unavailable, "etcd member m" + std::to_string(m) + " did not answer in 60 s: " + last.message);
}

void EtcdCluster::kill(int m) {
  auto& p = processes_[static_cast<size_t>(m)];
  if (!p) return;
  p->kill(SIGKILL);
  p->wait(10000);
  p.reset();
}

Status EtcdCluster::restart(int m) {
  kill(m);
  processes_[static_cast<size_t>(m)] =
      std::make_unique<Process>("/usr/bin/etcd", args(m), dir_ + "/m" + std::to_string(m) + ".log");
  return waitReady(m);
}

}  // namespace raccel::testing

namespace raccel::testing {

Status EtcdCluster::restartAll() {
  for (int m = 0; m < members(); ++m) {
    kill(m);
    processes_[static_cast<size_t>(m)] =
        std::make_unique<Process>("/usr/bin/etcd", args(m), dir_ + "/m" + std::to_string(m) + ".log");
  }
  for (int m = 0; m < members(); ++m)
    if (auto ok = waitReady(m); !ok) return ok;
  return {};
}

}  // namespace raccel::testing
