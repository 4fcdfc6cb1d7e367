// A netaccel's registration in the pool shared through etcd (scheduler/etcd/
// shared_pool.h): its node, online under a lease of its own, so that every scheduler of
// the pool sees it, and sees it go offline when the netaccel dies and the lease ends.
// A thread of its own registers, keeps the lease alive, and registers again under a new
// lease when etcd has let the old one expire (etcd was away too long). Constructed and
// destroyed on the loop thread; it never calls into the loop.
#pragma once

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "scheduler/etcd/shared_pool.h"

namespace raccel::netaccel {

class EtcdPresence {
 public:
  struct Settings {
    etcd::Options etcd;
    std::string prefix = "/raccel/";
    int64_t leaseTtlSeconds = 5;
  };
  EtcdPresence(Settings settings, std::string name, std::vector<scheduler::CardSpec> cards, scheduler::HostVector host);
  // Revokes the lease: the node goes offline at once for every scheduler.
  ~EtcdPresence();
  bool registered() const { return registered_; }

 private:
  void run();
  // Waits up to `ms` (false: stopping).
  bool pause(int64_t ms);

  Settings settings_;
  std::string name_;
  std::vector<scheduler::CardSpec> cards_;
  scheduler::HostVector host_;
  std::atomic<bool> registered_{false};
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false, expired_ = false;
  std::thread thread_;
};

}  // namespace raccel::netaccel
