#include "scheduler/persist/store.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <memory>

#include "common/log.h"

namespace raccel::scheduler {

namespace {

const char* const kTables[] = {"vm_policy", "node", "vaccel", "tenant_usage"};

bool knownTable(const std::string& t) {
  for (auto* k : kTables)
    if (t == k) return true;
  return false;
}

// mkdir -p
Status makeDirs(const std::string& dir) {
  std::string path;
  for (size_t i = 0; i <= dir.size(); ++i) {
    if (i == dir.size() || (dir[i] == '/' && i > 0)) {
      path = dir.substr(0, i);
      if (::mkdir(path.c_str(), 0700) != 0 && errno != EEXIST)
        return fail(Code::permissionDenied, "cannot create the state directory " + path + ": " + std::strerror(errno));
    }
  }
  return {};
}

struct Finalize {
  void operator()(sqlite3_stmt* s) const { sqlite3_finalize(s); }
};
using Statement = std::unique_ptr<sqlite3_stmt, Finalize>;

}  // namespace

Result<std::unique_ptr<Store>> Store::open(const std::string& dir) {
  if (auto made = makeDirs(dir); !made) return fail(made.error());
  std::unique_ptr<Store> store(new Store);
  store->path_ = dir + "/raccel.db";
  if (sqlite3_open_v2(store->path_.c_str(), &store->db_, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX,
                      nullptr) != SQLITE_OK)
    return fail(Code::unavailable, "cannot open the state database " + store->path_ + ": " +
                                       (store->db_ ? sqlite3_errmsg(store->db_) : "out of memory"));
  sqlite3_busy_timeout(store->db_, 2000);
  // WAL: a write is one append, readers never block it, and a kill -9 loses at most the
  // transaction under way. synchronous=NORMAL keeps the database consistent across a
  // power loss too (it may lose the last transactions, not corrupt them).
  std::string schema = "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;"
                       "CREATE TABLE IF NOT EXISTS counter (name TEXT PRIMARY KEY, value INTEGER NOT NULL);"
                       "CREATE TABLE IF NOT EXISTS saved (vaccel INTEGER, handle INTEGER, bytes BLOB,"
                       " PRIMARY KEY (vaccel, handle));";
  for (auto* t : kTables) schema += std::string("CREATE TABLE IF NOT EXISTS ") + t + " (key TEXT PRIMARY KEY, record BLOB);";
  if (auto s = store->exec(schema); !s)
    return fail(Code::unavailable, "cannot set up the state database " + store->path_ + ": " + s.error().message);
  return store;
}

Store::~Store() {
  if (db_) sqlite3_close_v2(db_);
}

Status Store::exec(const std::string& sql) {
  char* error = nullptr;
  if (sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, &error) != SQLITE_OK) {
    std::string message = error ? error : sqlite3_errmsg(db_);
    sqlite3_free(error);
    return fail(Code::internal, message);
  }
  return {};
}

sqlite3_stmt* Store::prepare(const std::string& sql) {
  sqlite3_stmt* s = nullptr;
  check(sqlite3_prepare_v2(db_, sql.c_str(), -1, &s, nullptr), sql.c_str());
  return s;
}

void Store::check(int rc, const char* what) {
  if (rc == SQLITE_OK || rc == SQLITE_DONE || rc == SQLITE_ROW) return;
  // The scheduler keeps running on what it has in memory; the operator learns that a
  // restart now would lose recent changes.
  RLOG_ERROR("scheduler") << "state database " << path_ << ": " << sqlite3_errmsg(db_) << " (" << what
                          << "); recent changes would not survive a restart";
}

void Store::begin() {
  if (depth_++ == 0) check(sqlite3_exec(db_, "BEGIN", nullptr, nullptr, nullptr), "BEGIN");
}

void Store::commit() {
  if (depth_ == 0) return;
  if (--depth_ == 0) check(sqlite3_exec(db_, "COMMIT", nullptr, nullptr, nullptr), "COMMIT");
}

uint64_t Store::counter(const std::string& name, uint64_t otherwise) {
  Statement s(prepare("SELECT value FROM counter WHERE name = ?"));
  if (!s) return otherwise;
  sqlite3_bind_text(s.get(), 1, name.c_str(), -1, SQLITE_TRANSIENT);
  if (sqlite3_step(s.get()) != SQLITE_ROW) return otherwise;
  return static_cast<uint64_t>(sqlite3_column_int64(s.get(), 0));
}

void Store::setCounter(const std::string& name, uint64_t value) {
  Statement s(prepare("INSERT OR REPLACE INTO counter (name, value) VALUES (?, ?)"));
  if (!s) return;
  sqlite3_bind_text(s.get(), 1, name.c_str(), -1, SQLITE_TRANSIENT);
  sqlite3_bind_int64(s.get(), 2, static_cast<sqlite3_int64>(value));
  check(sqlite3_step(s.get()), "set counter");
}

void Store::put(const std::string& table, const std::string& key, const std::string& blob) {
  if (!knownTable(table)) return;
  Statement s(prepare("INSERT OR REPLACE INTO " + table + " (key, record) VALUES (?, ?)"));
  if (!s) return;
  sqlite3_bind_text(s.get(), 1, key.c_str(), -1, SQLITE_TRANSIENT);
  sqlite3_bind_blob64(s.get(), 2, blob.data(), blob.size(), SQLITE_TRANSIENT);
  check(sqlite3_step(s.get()), table.c_str());
}

void Store::drop(const std::string& table, const std::string& key) {
  if (!knownTable(table)) return;
  Statement s(prepare("DELETE FROM " + table + " WHERE key = ?"));
  if (!s) return;
  sqlite3_bind_text(s.get(), 1, key.c_str(), -1, SQLITE_TRANSIENT);
  check(sqlite3_step(s.get()), table.c_str());
}

std::vector<std::pair<std::string, std::string>> Store::all(const std::string& table) {
  std::vector<std::pair<std::string, std::string>> out;
  if (!knownTable(table)) return out;
  Statement s(prepare("SELECT key, record FROM " + table + " ORDER BY key"));
  if (!s) return out;
  while (sqlite3_step(s.get()) == SQLITE_ROW) {
    auto* key = reinterpret_cast<const char*>(sqlite3_column_text(s.get(), 0));
    auto* blob = static_cast<const char*>(sqlite3_column_blob(s.get(), 1));
    out.emplace_back(key ? key : "", std::string(blob ? blob : "", static_cast<size_t>(sqlite3_column_bytes(s.get(), 1))));
  }
  return out;
}

void Store::putSaved(uint64_t vaccel, uint64_t handle, const std::string& bytes) {
  Statement s(prepare("INSERT OR REPLACE INTO saved (vaccel, handle, bytes) VALUES (?, ?, ?)"));
  if (!s) return;
  sqlite3_bind_int64(s.get(), 1, static_cast<sqlite3_int64>(vaccel));
  sqlite3_bind_int64(s.get(), 2, static_cast<sqlite3_int64>(handle));
  sqlite3_bind_blob64(s.get(), 3, bytes.data(), bytes.size(), SQLITE_STATIC);
  check(sqlite3_step(s.get()), "saved buffer");
}

void Store::dropSaved(uint64_t vaccel) {
  Statement s(prepare("DELETE FROM saved WHERE vaccel = ?"));
  if (!s) return;
  sqlite3_bind_int64(s.get(), 1, static_cast<sqlite3_int64>(vaccel));
  check(sqlite3_step(s.get()), "drop saved buffers");
}

std::vector<std::pair<uint64_t, std::string>> Store::saved(uint64_t vaccel) {
  std::vector<std::pair<uint64_t, std::string>> out;
  Statement s(prepare("SELECT handle, bytes FROM saved WHERE vaccel = ?"));
  if (!s) return out;
  sqlite3_bind_int64(s.get(), 1, static_cast<sqlite3_int64>(vaccel));
  while (sqlite3_step(s.get()) == SQLITE_ROW) {
    auto* blob = static_cast<const char*>(sqlite3_column_blob(s.get(), 1));
    out.emplace_back(static_cast<uint64_t>(sqlite3_column_int64(s.get(), 0)),
                     std::string(blob ? blob : "", static_cast<size_t>(sqlite3_column_bytes(s.get(), 1))));
  }
  return out;
}

}  // namespace raccel::scheduler
