// The scheduler's state database (docs/ARCHITECTURE.md, "State that survives a restart"): what must
// survive a restart, in SQLite (WAL) under the state directory. Written by the loop
// thread at each change that matters (a placement, a suspension, a policy, a node's
// layout), read once at start-up. Records are Cap'n Proto messages (schema/state.capnp)
// in BLOB columns, so the database follows the schema's rules for new fields.
#pragma once

#include <sqlite3.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/error.h"

namespace raccel::scheduler {

class Store {
 public:
  // Opens (creating the folder and the database when needed) DIR/raccel.db.
  static Result<std::unique_ptr<Store>> open(const std::string& dir);
  ~Store();
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;
  const std::string& path() const { return path_; }

  // Small named integers (the next vaccel id and context number).
  uint64_t counter(const std::string& name, uint64_t otherwise);
  void setCounter(const std::string& name, uint64_t value);

  // Records by key: one table per kind ("vm_policy", "node", "vaccel", "tenant_usage").
  // A record is a blob (a state.capnp message, or the text of a policy).
  void put(const std::string& table, const std::string& key, const std::string& blob);
  void drop(const std::string& table, const std::string& key);
  std::vector<std::pair<std::string, std::string>> all(const std::string& table);

  // A suspended vaccel's buffer contents (large: one row per buffer).
  void putSaved(uint64_t vaccel, uint64_t handle, const std::string& bytes);
  void dropSaved(uint64_t vaccel);
  std::vector<std::pair<uint64_t, std::string>> saved(uint64_t vaccel);

  // Groups the writes until commit() in one transaction (one WAL append).
  void begin();
  void commit();

 private:
  Store() = default;
  Status exec(const std::string& sql);
  sqlite3_stmt* prepare(const std::string& sql);
  void check(int rc, const char* what);
  sqlite3* db_ = nullptr;
  std::string path_;
  int depth_ = 0;
};

}  // namespace raccel::scheduler
