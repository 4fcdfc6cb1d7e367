// The torch device's record of what it knows of i64 values (known_values.h).
#include "vmfrontend/python/known_values.h"

#include <gtest/gtest.h>

#include <limits>
#include <vector>

namespace raccel::python {
namespace {

TEST(KnownValues, BoundsCountTheSmallestTheLargestAndTheLargestNegative) {
  const std::vector<int64_t> values = {3, -100, 7, 0, -100};
  auto b = boundsOf(values);
  EXPECT_EQ(b.lo, -100);
  EXPECT_EQ(b.hi, 7);
  EXPECT_EQ(b.negativeHi, -100);
  EXPECT_FALSE(b.allWithin(0, 9));
  EXPECT_TRUE(b.allWithin(0, 9, -100));  // every negative is the ignored target
  EXPECT_FALSE(b.allWithin(0, 6, -100));
  EXPECT_EQ(b.outside(0, 9), -100);
  EXPECT_EQ(b.outside(-100, 6), 7);
  EXPECT_EQ(b.outside(-100, 7), std::nullopt);

  const std::vector<int64_t> mixed = {-100, -5, 2};
  EXPECT_FALSE(boundsOf(mixed).allWithin(0, 9, -100));  // -5 is not ignored
  const std::vector<int64_t> positive = {4, 2};
  EXPECT_EQ(boundsOf(positive).negativeHi, std::nullopt);
  const std::vector<int64_t> extremes = {std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()};
  EXPECT_FALSE(boundsOf(extremes).allWithin(std::numeric_limits<int64_t>::min() + 1, 0));
  EXPECT_TRUE(boundsOf(extremes).allWithin(std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()));
}

TEST(KnownValues, ASpanIsFoundWithinWhatWasNotedUntilAWriteTouchesIt) {
  KnownValues known;
  EXPECT_TRUE(known.empty());
  known.note(1, 256, 512, {0, 9, std::nullopt});
  EXPECT_EQ(known.find(1, 256, 512)->hi, 9);
  EXPECT_EQ(known.find(1, 264, 296)->hi, 9);  // a slice of it
  EXPECT_FALSE(known.find(1, 248, 296));      // reaching before it
  EXPECT_FALSE(known.find(1, 264, 520));      // reaching past it
  EXPECT_FALSE(known.find(2, 256, 512));      // another buffer
  known.forget(2, 0, 1024);                   // a write elsewhere
  known.forget(1, 0, 256);                    // a write just before it
  EXPECT_TRUE(known.find(1, 256, 512));
  known.forget(1, 511, 600);  // a write over its last byte
  EXPECT_FALSE(known.find(1, 256, 512));
  EXPECT_TRUE(known.empty());
}

TEST(KnownValues, TheNewestNotingWinsAndTheOldestGoFirst) {
  KnownValues known;
  known.note(1, 0, 64, {0, 1, std::nullopt});
  known.note(1, 0, 64, {5, 6, std::nullopt});  // the same span again: the old bounds go
  EXPECT_EQ(known.find(1, 0, 64)->lo, 5);
  for (uint64_t i = 1; i <= KnownValues::kMax; ++i) known.note(1, i * 64, i * 64 + 64, {int64_t(i), int64_t(i), std::nullopt});
  EXPECT_FALSE(known.find(1, 0, 64));  // the oldest, dropped for the newest
  EXPECT_EQ(known.find(1, KnownValues::kMax * 64, KnownValues::kMax * 64 + 64)->lo, int64_t(KnownValues::kMax));
}

}  // namespace
}  // namespace raccel::python
