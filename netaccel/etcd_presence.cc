#include "netaccel/etcd_presence.h"

#include <chrono>

#include "common/log.h"

namespace raccel::netaccel {

EtcdPresence::EtcdPresence(Settings settings, std::string name, std::vector<scheduler::CardSpec> cards,
                           scheduler::HostVector host)
    : settings_(std::move(settings)), name_(std::move(name)), cards_(std::move(cards)), host_(host),
      thread_([this] { run(); }) {}

EtcdPresence::~EtcdPresence() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

bool EtcdPresence::pause(int64_t ms) {
  std::unique_lock lock(mutex_);
  return !wake_.wait_for(lock, std::chrono::milliseconds(ms), [this] { return stopping_; });
}

void EtcdPresence::run() {
  auto client = etcd::Client::open(settings_.etcd);
  if (!client) {
    RLOG_ERROR("netaccel") << "shared pool: " << client.error().message;
    return;
  }
  std::string lastProblem;
  auto problem = [&](const std::string& what) {
    if (what != lastProblem) RLOG_WARN("netaccel") << "shared pool: " << what << " (trying again every second)";
    lastProblem = what;
  };
  while (pause(0)) {
    auto lease = (*client)->grantLease(settings_.leaseTtlSeconds);
    if (!lease) {
      problem(lease.error().message);
      if (!pause(1000)) break;
      continue;
    }
    auto node = scheduler::registerSharedNode(**client, settings_.prefix, name_, cards_, host_, *lease);
    if (!node) {
      (void)(*client)->revokeLease(*lease);
      problem(node.error().message);
      if (!pause(1000)) break;
      continue;
    }
    lastProblem.clear();
    RLOG_INFO("netaccel") << "shared pool: node " << name_ << " online at " << (*client)->describe() << " as blocks "
                          << node->blocks.first << "-" << (node->blocks.end() - 1);
    registered_ = true;
    {
      std::lock_guard lock(mutex_);
      expired_ = false;
    }
    {
      etcd::LeaseKeeper keeper(**client, *lease, settings_.leaseTtlSeconds, [this] {
        std::lock_guard lock(mutex_);
        expired_ = true;
        wake_.notify_all();
      });
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [this] { return stopping_ || expired_; });
    }
    registered_ = false;
    bool stopping;
    {
      std::lock_guard lock(mutex_);
      stopping = stopping_;
    }
    if (stopping) {
      (void)(*client)->revokeLease(*lease);  // offline now, not when the lease would end
      break;
    }
    RLOG_WARN("netaccel") << "shared pool: the lease of node " << name_ << " expired; registering again";
  }
}

}  // namespace raccel::netaccel
