// The lineage's log (lineage.h): frames small and large come back exactly, in order,
// whatever mix of arena chunks and shared bodies holds them.
#include "scheduler/lineage.h"

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <random>
#include <thread>
#include <vector>

namespace raccel::scheduler {
namespace {

transport::Body frame(size_t bytes, uint8_t seed) {
  transport::Body body(bytes);
  for (size_t i = 0; i < bytes; ++i) body.data()[i] = static_cast<std::byte>(seed + i * 13);
  return body;
}

KeptBytes kept(const std::string& bytes) { return KeptBytes(std::as_bytes(std::span<const char>(bytes.data(), bytes.size()))); }

// Kept bytes against a flat copy of the same bytes: random writes (shared from frame
// bodies and copied), fills and zero fills that overlap and split each other (in half
// the rounds small ones, written in place in their blocks), then every byte and random
// ranges read back, and which ranges are still the alloc's zeros.
TEST(KeptBytes, MatchesAFlatCopyThroughOverlappingWritesAndFills) {
  std::mt19937 rng(7);
  for (int round = 0; round < 20; ++round) {
    const uint64_t size = 1 + rng() % (3 << 20);
    KeptBytes k(size);
    std::string flat(size, '\0');
    std::vector<bool> touched(size, false);
    const uint64_t most = round % 2 ? 1 << 19 : 2 * KeptBytes::kSmallBytes;  // (small ones: in place, in blocks)
    for (int op = 0; op < (round % 2 ? 60 : 400); ++op) {
      const uint64_t offset = rng() % size, length = 1 + rng() % std::min<uint64_t>(size - offset, most);
      if (rng() % 3 == 0) {
        const uint8_t value = rng() % 4 == 0 ? 0 : static_cast<uint8_t>(rng());
        k.fill(offset, length, value);
        std::memset(flat.data() + offset, value, length);
        std::fill(touched.begin() + offset, touched.begin() + offset + length, value != 0);
      } else {
        const size_t lead = rng() % 64;  // the data sits inside its frame, after a header
        transport::Body body = frame(lead + length + rng() % 64, static_cast<uint8_t>(rng()));
        std::span<const std::byte> data(body.data() + lead, length);
        k.write(offset, data, rng() % 2 ? &body : nullptr);
        std::memcpy(flat.data() + offset, data.data(), length);
        std::fill(touched.begin() + offset, touched.begin() + offset + length, true);
      }
      const uint64_t past = 1 + rng() % 100;
      k.write(size, std::as_bytes(std::span<const char>(flat.data(), std::min<uint64_t>(past, size))));  // ignored: past the end
      k.fill(size - 1, 2, 9);                                                                           // ignored: past the end
    }
    ASSERT_EQ(k.size(), size);
    ASSERT_EQ(k.flatten(), flat) << "round " << round;
    for (int q = 0; q < 50; ++q) {
      const uint64_t offset = rng() % size, length = 1 + rng() % (size - offset);
      std::string part(length, 'x');
      k.copyOut(offset, {reinterpret_cast<std::byte*>(part.data()), length});
      ASSERT_EQ(part, flat.substr(offset, length));
      const bool untouched = std::none_of(touched.begin() + offset, touched.begin() + offset + length, [](bool t) { return t; });
      if (k.zeros(offset, length)) {
        ASSERT_TRUE(untouched) << "said zeros over written bytes";
      }
    }
  }
}

// A write from a frame body is kept by sharing that body: nothing is copied, and the body
// is held once. Once later writes leave a sliver of it, the sliver is copied out and the
// body is let go.
TEST(KeptBytes, SharesAWritesBodyAndLetsItGoWhenLittleOfItIsLeft) {
  const size_t kMiB = 1 << 20;
  KeptBytes k(4 * kMiB);
  EXPECT_EQ(k.heldBytes(), 0u) << "an alloc holds nothing";
  transport::Body body = frame(kMiB + 32, 3);
  const std::byte* first = body.data() + 32;
  k.write(kMiB, {first, kMiB}, &body);
  EXPECT_EQ(k.heldBytes(), body.size()) << "the body, not a copy of its bytes";
  transport::Body other = frame(kMiB, 5);
  k.write(kMiB, {other.data(), kMiB - 100}, nullptr);  // all but the last 100 bytes of the first write
  EXPECT_EQ(k.heldBytes(), (kMiB - 100) + 100) << "the first body's last 100 bytes copied out of it";
  std::string want(4 * kMiB, '\0');
  std::memcpy(want.data() + kMiB, other.data(), kMiB - 100);
  std::memcpy(want.data() + 2 * kMiB - 100, first + kMiB - 100, 100);
  EXPECT_EQ(k.flatten(), want);
}

// At most three sandbox losses not its own in ten minutes are rebuilt; the count starts
// again once ten minutes have passed since the first of them.
TEST(Lineage, SandboxLossesNotItsOwnAreRebuiltAtMostThreeTimesInTenMinutes) {
  Lineage lin;
  const uint64_t minute = 60'000'000'000ull, t0 = 5 * minute;
  EXPECT_TRUE(lin.countSandboxLoss(t0));
  EXPECT_TRUE(lin.countSandboxLoss(t0 + minute));
  EXPECT_TRUE(lin.countSandboxLoss(t0 + 9 * minute));
  EXPECT_FALSE(lin.countSandboxLoss(t0 + 10 * minute)) << "the fourth within ten minutes of the first";
  EXPECT_TRUE(lin.countSandboxLoss(t0 + 10 * minute + 1)) << "ten minutes on, counted afresh";
  EXPECT_EQ(lin.sandboxLosses, 1u);
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

// The arena's chunks are reused once let go, but never one a fold still reads: frames
// pinned before a drop keep their bytes while the log fills new chunks past them.
TEST(LineageLog, ReusesAChunkItLetGoButNotOneAFoldHolds) {
  LineageLog log;
  size_t next = 0;
  // Adds 1000-byte frames (262 to a 256 KiB chunk) until one starts a new chunk, at most
  // `most`; that frame's address (null: none did).
  auto addUntilANewChunk = [&](size_t most) -> const std::byte* {
    for (size_t k = 0; k < most; ++k) {
      const std::byte* last = log.size() ? log.entries().back().bytes.data() : nullptr;
      auto body = frame(1000, static_cast<uint8_t>(next));
      log.add(transport::FrameHeader{1, 1000, next++}, body, Fold{});
      const std::byte* at = log.entries().back().bytes.data();
      if (last && at != last + 1000) return at;
    }
    return nullptr;
  };
  auto inChunk = [](const std::byte* at, const std::byte* chunk) { return at >= chunk && at < chunk + 256 * 1024; };
  const std::byte* chunk0 = (addUntilANewChunk(1), log.entries().front().bytes.data());
  const std::byte* chunk1 = addUntilANewChunk(400);
  ASSERT_NE(chunk1, nullptr);
  ASSERT_NE(addUntilANewChunk(400), nullptr);  // a third chunk, one frame in it
  auto pinned = log.pinFirst(10);              // a fold holds the first chunk
  log.dropFirst(log.entries().size() - 1);     // the first two go from the log (the last frame's stays)
  const std::byte* next0 = addUntilANewChunk(400);
  EXPECT_EQ(next0, chunk1) << "the next chunk is a new one, not the one let go";
  for (int c = 0; c < 3; ++c) ASSERT_NE(addUntilANewChunk(400), nullptr);
  for (auto& e : log.entries()) EXPECT_FALSE(inChunk(e.bytes.data(), chunk0)) << "a chunk a fold holds was reused";
  for (size_t i = 0; i < pinned.entries.size(); ++i) {
    auto want = frame(1000, static_cast<uint8_t>(i));
    ASSERT_EQ(pinned.entries[i].bytes.size(), 1000u);
    EXPECT_EQ(std::memcmp(pinned.entries[i].bytes.data(), want.data(), 1000), 0) << "pinned frame " << i;
  }
  auto frames = log.takeFrames();
  for (auto& [header, body] : frames) {
    auto want = frame(1000, static_cast<uint8_t>(header.sequence));
    ASSERT_EQ(body.size(), 1000u);
    EXPECT_EQ(std::memcmp(body.data(), want.data(), 1000), 0) << "frame " << header.sequence;
  }
}

// A fold off the loop's thread: the log's writes, fills, allocs and frees applied to the
// kept bytes, what was read back taking precedence, with the log itself emptied meanwhile
// (its bytes stay pinned for the fold).
TEST(FoldWork, FoldsThePinnedFramesIntoTheKeptBytesWhateverBecomesOfTheLog) {
  LineageLog log;
  auto add = [&](Fold fold, size_t bytes, uint8_t seed) {
    auto body = frame(bytes, seed);
    log.add(transport::FrameHeader{1, static_cast<uint32_t>(bytes), 1}, body, fold);
    return frame(bytes, seed);
  };
  // Buffer 1 kept already; buffer 2 allocated since (fresh); buffer 3 read back (dirty);
  // buffer 4 allocated and freed again.
  auto write1 = add(Fold{Fold::Kind::write, 0, 1, 8, 100, 0}, 100, 1);       // small: the arena
  add(Fold{Fold::Kind::alloc, 0, 2, 0, 64 << 10, 0}, 16, 2);
  auto write2 = add(Fold{Fold::Kind::write, 0, 2, 4096, 20000, 0}, 20000, 3);  // large: a shared body
  add(Fold{Fold::Kind::fill, 7, 2, 0, 16, 0}, 16, 4);
  add(Fold{Fold::Kind::write, 0, 3, 0, 64, 0}, 64, 5);                      // dirty: not folded
  add(Fold{Fold::Kind::write, 0, 1, 200, 100, 0}, 100, 6);                  // out of its bounds: not folded
  add(Fold{Fold::Kind::alloc, 0, 4, 0, 128, 0}, 16, 7);
  add(Fold{Fold::Kind::free, 0, 4, 0, 0, 0}, 16, 8);
  auto work = std::make_shared<FoldWork>();
  work->frames = log.pinFirst(log.size());
  log.clear();  // (a recovery took the frames, say): the pinned bytes stay
  for (int i = 0; i < 50; ++i) add(Fold{}, 3000, 0xaa);  // new frames where the old were
  work->changes.dirty = {3};
  work->changes.fresh = {2, 4};
  work->memoryQuota = 1 << 20;
  work->base[1] = kept(std::string(256, 'a'));
  work->base[3] = kept(std::string(64, 'b'));
  work->base[9] = kept(std::string(8, 'c'));  // freed before the mark: not among the buffers
  work->taking[3] = kept(std::string(64, 'r'));
  work->buffers = {1, 2, 3};
  std::thread worker([&] {
    work->run();
    work->done();
  });
  work->wait();
  worker.join();
  auto& base = work->base;
  ASSERT_EQ(base.size(), 3u);
  std::string want1(256, 'a');
  std::memcpy(want1.data() + 8, write1.data(), 100);
  EXPECT_EQ(base[1].flatten(), want1);
  std::string want2(64 << 10, '\0');
  std::memcpy(want2.data() + 4096, write2.data(), 20000);
  std::memset(want2.data(), 7, 16);
  EXPECT_EQ(base[2].flatten(), want2);
  EXPECT_EQ(base[3].flatten(), std::string(64, 'r'));
}

}  // namespace
}  // namespace raccel::scheduler
