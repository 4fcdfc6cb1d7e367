// Outstanding requests keyed by sequence number, each with a deadline. Time comes in as
// a parameter (no clock of its own). Not thread-safe: owned by one thread.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <unordered_map>

#include "common/error.h"

namespace raccel::transport {

template <class Context>
class RequestTable {
 public:
  // Called with the request's context and an error (timeout, peer lost) or ok.
  using Done = std::function<void(const Context&, const Status&)>;

  explicit RequestTable(Done done) : done_(std::move(done)) {}

  void add(uint64_t sequence, Context context, uint64_t deadlineMs) {
    auto [it, inserted] = entries_.emplace(sequence, Entry{std::move(context), deadlineMs});
    if (!inserted) return;
    byDeadline_.emplace(deadlineMs, sequence);
  }
  bool contains(uint64_t sequence) const { return entries_.count(sequence) != 0; }
  size_t size() const { return entries_.size(); }

  // The request was answered: forget it without calling back.
  bool complete(uint64_t sequence) { return entries_.erase(sequence) != 0; }

  // Fails every request whose deadline is at or before nowMs. Returns how many.
  size_t expire(uint64_t nowMs, const std::string& what) {
    size_t n = 0;
    while (!byDeadline_.empty() && byDeadline_.begin()->first <= nowMs) {
      uint64_t seq = byDeadline_.begin()->second;
      byDeadline_.erase(byDeadline_.begin());
      auto it = entries_.find(seq);
      if (it == entries_.end() || it->second.deadlineMs > nowMs) continue;
      Context context = std::move(it->second.context);
      entries_.erase(it);
      done_(context, fail(Code::unavailable, what));
      ++n;
    }
    if (entries_.empty()) byDeadline_.clear();
    return n;
  }

  // Fails every outstanding request with `error` (e.g. the peer is gone).
  void failAll(const Error& error) {
    auto entries = std::move(entries_);
    entries_.clear();
    byDeadline_.clear();
    std::map<uint64_t, Context> ordered;
    for (auto& [seq, e] : entries) ordered.emplace(seq, std::move(e.context));
    for (auto& [seq, context] : ordered) done_(context, std::unexpected<Error>(error));
  }

 private:
  struct Entry {
    Context context;
    uint64_t deadlineMs;
  };
  Done done_;
  std::unordered_map<uint64_t, Entry> entries_;
  std::multimap<uint64_t, uint64_t> byDeadline_;
};

}  // namespace raccel::transport
