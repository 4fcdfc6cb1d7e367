// A real etcd cluster on loopback for tests and benchmarks: `members` etcd processes
// (Debian's etcd-server) with their data and logs in a temporary folder. Members can be
// killed and restarted on the same data. Used from one thread.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "common/error.h"
#include "scheduler/etcd/etcd_client.h"
#include "tests/cluster.h"

namespace raccel::testing {

// Why etcd cannot run here ("" when it can).
std::string etcdUnavailable();

class EtcdCluster {
 public:
  // `tlsDir`: serve clients over mutual TLS with scripts/raccel-certs.sh's etcd
  // certificates there (ca.pem, etcd-server.*; clients present etcd-client.*).
  explicit EtcdCluster(int members = 3, std::string tlsDir = "");
  ~EtcdCluster();
  // Starts every member and waits until each answers (a generous ceiling: etcd's first
  // election on a busy machine).
  Status start();
  // "127.0.0.1:A,127.0.0.1:B,...": --etcd's value.
  std::string endpoints() const;
  std::vector<std::string> endpointList() const;
  // The client options of a daemon of the pool (with its client certificate under TLS).
  etcd::Options clientOptions(uint32_t callTimeoutMs = 5000) const;
  void kill(int member);  // SIGKILL
  Status restart(int member);  // on its data; waits until it answers (a quorum must be up)
  Status restartAll();         // every member, on its data
  int members() const { return static_cast<int>(clientPorts_.size()); }
  const std::string& dir() const { return dir_; }

 private:
  std::vector<std::string> args(int member) const;
  Status waitReady(int member);

  std::string dir_, tlsDir_;
  std::vector<int> clientPorts_, peerPorts_;
  std::vector<std::unique_ptr<Process>> processes_;
};

}  // namespace raccel::testing
