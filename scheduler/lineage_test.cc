// The lineage's log (lineage.h): frames small and large come back exactly, in order,
// whatever mix of arena chunks and shared bodies holds them.
#include "scheduler/lineage.h"

#include <gtest/gtest.h>

#include <vector>

namespace raccel::scheduler {
namespace {

transport::Body frame(size_t bytes, uint8_t seed) {
  transport::Body body(bytes);
  for (size_t i = 0; i < bytes; ++i) body.data()[i] = static_cast<std::byte>(seed + i * 13);
  return body;
}

TEST(LineageLog, KeepsEveryFrameExactlyInOrderAndEmptiesAtOnce) {
  LineageLog log;
  // Small frames past several arena chunks, large ones between them, an empty one.
  std::vector<size_t> sizes;
  for (size_t i = 0; i < 3000; ++i) sizes.push_back(i % 500 == 7 ? (1u << 20) + i : 8 + (i * 37) % 2000);
  sizes.push_back(0);
  uint64_t total = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    auto body = frame(sizes[i], static_cast<uint8_t>(i));
    Fold fold;
    fold.handle = i;
    log.add(transport::FrameHeader{1, static_cast<uint32_t>(sizes[i]), 100 + i}, body, fold);
    body = frame(16, 0xee);  // what the forwarded body later becomes does not touch the log
    total += sizes[i];
  }
  EXPECT_EQ(log.size(), sizes.size());
  EXPECT_EQ(log.bytes(), total);
  for (size_t i = 0; i < sizes.size(); ++i) {
    const auto& e = log.entries()[i];
    EXPECT_EQ(e.fold.handle, i);
    ASSERT_EQ(e.bytes.size(), sizes[i]);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(e.bytes.data()) % 8, 0u) << "frame " << i << " is not word-aligned";
  }
  auto frames = log.takeFrames();
  EXPECT_EQ(log.size(), 0u);
  EXPECT_EQ(log.bytes(), 0u);
  ASSERT_EQ(frames.size(), sizes.size());
  for (size_t i = 0; i < sizes.size(); ++i) {
    EXPECT_EQ(frames[i].first.sequence, 100 + i);
    auto want = frame(sizes[i], static_cast<uint8_t>(i));
    ASSERT_EQ(frames[i].second.size(), sizes[i]);
    EXPECT_EQ(std::memcmp(frames[i].second.data(), want.data(), sizes[i]), 0) << "frame " << i;
  }
  // Emptied, it takes frames again.
  auto body = frame(40, 3);
  log.add(transport::FrameHeader{1, 40, 7}, body, Fold{});
  log.clear();
  EXPECT_EQ(log.size(), 0u);
  EXPECT_EQ(log.bytes(), 0u);
}

// A checkpoint taken in the background drops the frames before its mark; those after it
// stay exactly, and the arena's chunks before them are let go.
TEST(LineageLog, DropsItsFirstFramesAndKeepsTheRestExactly) {
  LineageLog log;
  std::vector<size_t> sizes;
  for (size_t i = 0; i < 2000; ++i) sizes.push_back(i % 300 == 5 ? (1u << 16) + i : 16 + (i * 53) % 1500);
  uint64_t total = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    auto body = frame(sizes[i], static_cast<uint8_t>(i));
    log.add(transport::FrameHeader{1, static_cast<uint32_t>(sizes[i]), 100 + i}, body, Fold{});
    total += sizes[i];
  }
  size_t dropped = 0;
  for (size_t n : {0u, 1u, 700u, 6u, 900u}) {  // (a shared frame among the first dropped each time)
    log.dropFirst(n);
    for (size_t i = dropped; i < dropped + n; ++i) total -= sizes[i];
    dropped += n;
    ASSERT_EQ(log.size(), sizes.size() - dropped);
    EXPECT_EQ(log.bytes(), total);
  }
  // More frames after the drops go after the rest.
  for (size_t i = sizes.size(); i < sizes.size() + 50; ++i) {
    auto body = frame(100, static_cast<uint8_t>(i));
    log.add(transport::FrameHeader{1, 100, 100 + i}, body, Fold{});
  }
  for (size_t i = 0; i < 50; ++i) sizes.push_back(100);
  auto frames = log.takeFrames();
  ASSERT_EQ(frames.size(), sizes.size() - dropped);
  for (size_t k = 0; k < frames.size(); ++k) {
    const size_t i = dropped + k;
    EXPECT_EQ(frames[k].first.sequence, 100 + i);
    auto want = frame(sizes[i], static_cast<uint8_t>(i));
    ASSERT_EQ(frames[k].second.size(), sizes[i]);
    EXPECT_EQ(std::memcmp(frames[k].second.data(), want.data(), sizes[i]), 0) << "frame " << i;
  }
  log.dropFirst(5);  // (empty: nothing to drop)
  EXPECT_EQ(log.size(), 0u);
}

}  // namespace
}  // namespace raccel::scheduler
