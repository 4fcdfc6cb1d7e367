// A real etcd cluster on loopback for tests and benchmarks: `members` etcd processes
// (Debian's etcd-server) with their data and logs in a temporary folder. Members can be
// killed and restarted on the same data. Used from one thread.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "common/error.h"
#include "tests/cluster.h"

namespace raccel::testing {

// Why etcd cannot run here ("" when it can).
std::string etcdUnavailable();

class EtcdCluster {
 public:
  explicit EtcdCluster(int members = 3);
  ~EtcdCluster();
  // Starts every member and waits until each answers (a generous ceiling: etcd's first
  // election on a busy machine).
  Status start();
  // "127.0.0.1:A,127.0.0.1:B,...": --etcd's value.
  std::string endpoints() const;
  std::vector<std::string> endpointList() const;
  void kill(int member);  // SIGKILL
  Status restart(int member);  // on its data; waits until it answers (a quorum must be up)
  Status restartAll();         // every member, on its data
  int members() const { return static_cast<int>(clientPorts_.size()); }
  const std::string& dir() const { return dir_; }

 private:
  std::vector<std::string> args(int member) const;
  Status waitReady(int member);

  std::string dir_;
  std::vector<int> clientPorts_, peerPorts_;
  std::vector<std::unique_ptr<Process>> processes_;
};

}  // namespace raccel::testing
