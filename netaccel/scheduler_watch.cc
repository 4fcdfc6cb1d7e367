#include "netaccel/scheduler_watch.h"

#include <chrono>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/log.h"
#include "transport/connection.h"

namespace raccel::netaccel {
namespace {
// A bound on the names held: anyone who may write under the prefix can add keys.
constexpr size_t kMaxSchedulers = 4096;
}  // namespace

SchedulerWatch::SchedulerWatch(etcd::Options options, std::string prefix, std::function<void(const std::string&)> gone,
                               Found found)
    : options_(std::move(options)), prefix_(std::move(prefix) + "schedulers/"), gone_(std::move(gone)),
      found_(std::move(found)), thread_([this] { run(); }) {}

std::string SchedulerWatch::addressIn(const std::string& value) {
  if (value.size() > 4096) return {};
  auto j = nlohmann::json::parse(value, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("address") || !j["address"].is_string()) return {};
  std::string address = j["address"].get<std::string>();
  auto parsed = transport::parseAddress(address);
  if (address.size() > 256 || !parsed || parsed->isUnix || parsed->port <= 0 || parsed->port > 65535) return {};
  return address;
}

bool SchedulerWatch::note(const std::string& name, const std::string& address) {
  if (address.empty()) {  // none advertised (or it does not parse): nothing to tell
    addresses_.erase(name);
    return false;
  }
  auto [it, added] = addresses_.try_emplace(name, address);
  if (!added && it->second == address) return false;
  it->second = address;
  return true;
}

SchedulerWatch::~SchedulerWatch() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

std::optional<bool> SchedulerWatch::live(const std::string& name) const {
  std::lock_guard lock(mutex_);
  if (!live_ || overflowed_) return std::nullopt;  // not known: the caller waits its grace
  return live_->contains(name);
}

bool SchedulerWatch::pause(int64_t ms) {
  std::unique_lock lock(mutex_);
  return !wake_.wait_for(lock, std::chrono::milliseconds(ms), [this] { return stopping_; });
}

void SchedulerWatch::replace(std::map<std::string, std::string> now) {
  std::vector<std::string> went;
  std::vector<std::pair<std::string, std::string>> came;
  {
    std::lock_guard lock(mutex_);
    if (live_)
      for (auto& name : *live_)
        if (!now.contains(name)) {
          went.push_back(name);
          addresses_.erase(name);
        }
    overflowed_ = now.size() >= kMaxSchedulers;
    live_.emplace();
    for (auto& [name, address] : now) {
      live_->insert(name);
      if (note(name, address)) came.push_back({name, address});
    }
  }
  for (auto& name : went) gone_(name);
  if (found_)
    for (auto& [name, address] : came) found_(name, address);
}

void SchedulerWatch::applyEvents(const etcd::Watcher::Events& events) {
  std::vector<std::string> went;
  std::vector<std::pair<std::string, std::string>> came;
  {
    std::lock_guard lock(mutex_);  // live_ was set by replace() before the watch began
    for (auto& e : events) {
      const std::string& key = e.kv().key();
      if (!key.starts_with(prefix_)) continue;
      std::string name = key.substr(prefix_.size());
      if (e.type() == mvccpb::Event::DELETE) {
        addresses_.erase(name);
        if (live_->erase(name)) went.push_back(name);
      } else if (live_->size() < kMaxSchedulers || live_->contains(name)) {
        live_->insert(name);
        if (std::string address = addressIn(e.kv().value()); note(name, address)) came.push_back({name, address});
      } else {
        overflowed_ = true;
      }
    }
  }
  for (auto& name : went) gone_(name);
  if (found_)
    for (auto& [name, address] : came) found_(name, address);
}

void SchedulerWatch::run() {
  auto client = etcd::Client::open(options_);
  if (!client) {
    RLOG_ERROR("netaccel") << "watching the pool's schedulers: " << client.error().message;
    return;
  }
  std::string lastProblem;
  while (pause(0)) {
    auto all = (*client)->range(prefix_);
    if (!all) {
      if (all.error().message != lastProblem)
        RLOG_WARN("netaccel") << "watching the pool's schedulers: " << all.error().message << " (trying again every second)";
      lastProblem = all.error().message;
      if (!pause(1000)) break;
      continue;
    }
    lastProblem.clear();
    std::map<std::string, std::string> now;  // name -> the address it advertises ("" when none)
    for (auto& kv : all->kvs())
      if (kv.key().starts_with(prefix_) && now.size() < kMaxSchedulers) now[kv.key().substr(prefix_.size())] = addressIn(kv.value());
    replace(std::move(now));
    {
      std::lock_guard lock(mutex_);
      broken_ = false;
    }
    {
      etcd::Watcher watcher(
          **client, prefix_, all->header().revision() + 1, false,
          [this](etcd::Watcher::Events events, int64_t) { applyEvents(events); },
          [this](Error) {
            std::lock_guard lock(mutex_);
            broken_ = true;
            wake_.notify_all();
          });
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [this] { return stopping_ || broken_; });
    }
    if (!pause(1000)) break;
  }
}

}  // namespace raccel::netaccel
