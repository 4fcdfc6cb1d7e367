#include "common/free_memory.h"

#include <gtest/gtest.h>

namespace raccel {
namespace {

constexpr uint64_t kMiB = 1 << 20;

TEST(FreeMemory, GivenBackOnceWhenTheLinksGoQuietAfterABurst) {
  FreeMemoryAfterBursts f;
  EXPECT_FALSE(f.tick(0)) << "nothing has moved yet";
  EXPECT_FALSE(f.tick(100)) << "heartbeats are not a burst";
  EXPECT_FALSE(f.tick(100 + 64 * kMiB)) << "busy: kept for the next burst";
  EXPECT_FALSE(f.tick(100 + 128 * kMiB)) << "still busy";
  EXPECT_TRUE(f.tick(100 + 128 * kMiB + 500)) << "the first quiet period gives it back";
  EXPECT_FALSE(f.tick(100 + 128 * kMiB + 900)) << "once";
  EXPECT_FALSE(f.tick(3 * kMiB)) << "a link gone (the sum fell) is no burst";
  EXPECT_FALSE(f.tick(3 * kMiB + FreeMemoryAfterBursts::kBusyBytes - 1)) << "just under a burst";
  EXPECT_FALSE(f.tick(5 * kMiB));
  EXPECT_TRUE(f.tick(5 * kMiB));
}

TEST(FreeMemory, ThisTestRunsOnGlibcsMalloc) {
  // The daemons link tcmalloc (raccel_daemon_malloc); the tests do not.
  EXPECT_STREQ(releaseFreeMemory(), "glibc");
}

}  // namespace
}  // namespace raccel
