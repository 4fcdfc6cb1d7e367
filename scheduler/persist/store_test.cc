// The state database on its own: records, counters and saved buffers survive closing
// and opening it again; bad folders and files are clear errors.
#include "scheduler/persist/store.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

namespace raccel::scheduler {
namespace {

std::string tempDir() {
  char tmpl[] = "/tmp/raccel-store-XXXXXX";
  return ::mkdtemp(tmpl);
}

TEST(Store, WhatIsWrittenIsThereAfterReopening) {
  std::string root = tempDir(), dir = root + "/nested/state";
  {
    auto store = Store::open(dir);
    ASSERT_TRUE(store) << store.error().message;
    (*store)->begin();
    (*store)->put("vaccel", "00000000000000000002", std::string("two\0bytes", 9));
    (*store)->put("vaccel", "00000000000000000001", "one");
    (*store)->put("vm_policy", "vm1", "priority=3\n");
    (*store)->setCounter("next_vaccel", 3);
    (*store)->putSaved(2, 10, std::string(3 << 20, 'x'));
    (*store)->putSaved(2, 11, "y");
    (*store)->commit();
    (*store)->drop("vaccel", "00000000000000000001");
  }
  auto store = Store::open(dir);
  ASSERT_TRUE(store) << store.error().message;
  auto vaccels = (*store)->all("vaccel");
  ASSERT_EQ(vaccels.size(), 1u);
  EXPECT_EQ(vaccels[0].second, std::string("two\0bytes", 9));
  EXPECT_EQ((*store)->all("vm_policy")[0].second, "priority=3\n");
  EXPECT_EQ((*store)->counter("next_vaccel", 1), 3u);
  EXPECT_EQ((*store)->counter("next_context", 7), 7u);
  auto saved = (*store)->saved(2);
  ASSERT_EQ(saved.size(), 2u);
  EXPECT_EQ(saved[0].second.size(), 3u << 20);
  EXPECT_EQ(saved[1].second, "y");
  (*store)->dropSaved(2);
  EXPECT_TRUE((*store)->saved(2).empty());
  EXPECT_TRUE((*store)->all("no_such_table").empty());
  std::filesystem::remove_all(root);
}

TEST(Store, AFolderItCannotCreateOrAFileThatIsNotADatabaseIsAClearError) {
  auto none = Store::open("/proc/raccel-cannot-be-here");
  ASSERT_FALSE(none);
  EXPECT_NE(none.error().message.find("cannot create the state directory /proc/raccel-cannot-be-here"), std::string::npos)
      << none.error().message;
  std::string dir = tempDir();
  std::ofstream(dir + "/raccel.db") << "this is not SQLite";
  auto bad = Store::open(dir);
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message.find("not a database"), std::string::npos) << bad.error().message;
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace raccel::scheduler
