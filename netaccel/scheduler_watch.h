// Which schedulers of a pool shared through etcd are alive: each registers
// `PREFIX/schedulers/NAME` under its lease (scheduler/etcd/shared_pool.h), and the key
// goes when the lease ends. A netaccel watches those keys so that a dead scheduler's
// contexts (its tenants' buffers on the cards) are dropped when its holdings return to
// the pool, not a whole context grace later: the blocks it held may serve another
// tenant from then on.
//
// A netaccel with `scheduler = etcd` also links to every scheduler as it advertises
// itself: each key's value may name the address netaccels reach that scheduler at
// ({"address": "HOST:PORT"}, checked: a host and a port, at most 256 bytes), and
// `found` is told of each new name or changed address.
//
// A thread of its own reads the keys, then watches them; a broken watch is read again
// (a second on), and a name gone meanwhile is reported gone then. `gone` and `found` are
// called on that thread; `live` may be called from any thread. At most 4096 names are
// held.
#pragma once

#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>

#include "scheduler/etcd/etcd_client.h"

namespace raccel::netaccel {

class SchedulerWatch {
 public:
  using Found = std::function<void(const std::string& name, const std::string& address)>;
  SchedulerWatch(etcd::Options options, std::string prefix, std::function<void(const std::string&)> gone, Found found = {});
  ~SchedulerWatch();
  // Whether a scheduler of this name holds a lease now; nullopt until etcd was read.
  std::optional<bool> live(const std::string& name) const;

 private:
  void run();
  // Replaces the names known with `now`, reporting those that went.
  void replace(std::map<std::string, std::string> now);
  void applyEvents(const etcd::Watcher::Events& events);
  // The address a key's value advertises ("" when none, or when it does not parse).
  static std::string addressIn(const std::string& value);
  // Under mutex_: `name` now at `address`; whether `found` is to be told.
  bool note(const std::string& name, const std::string& address);
  bool pause(int64_t ms);

  etcd::Options options_;
  std::string prefix_;  // ".../schedulers/"
  std::function<void(const std::string&)> gone_;
  Found found_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::optional<std::set<std::string>> live_;
  std::map<std::string, std::string> addresses_;  // of the live names that advertised one
  // More names than kept (a stranger wrote keys): liveness is not known.
  bool overflowed_ = false;
  bool stopping_ = false, broken_ = false;
  std::thread thread_;
};

}  // namespace raccel::netaccel
