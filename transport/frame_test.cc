#include "transport/frame.h"

#include <gtest/gtest.h>

#include <thread>

#include "schema/frame.capnp.h"
#include "schema/guest.capnp.h"
#include "transport/request_table.h"

namespace raccel::transport {
namespace {

struct Collect : FrameReader::Sink {
  std::vector<std::pair<FrameHeader, Body>> frames;
  std::vector<FrameHeader> oversized;
  void onFrame(const FrameHeader& h, Body b) override { frames.emplace_back(h, std::move(b)); }
  void onOversized(const FrameHeader& h) override { oversized.push_back(h); }
};

std::vector<std::byte> writeFrame(uint32_t channel, uint64_t seq, size_t dataBytes) {
  capnp::MallocMessageBuilder m;
  auto w = m.initRoot<wire::Instruction>().initWrite();
  w.setBuffer(7);
  auto data = w.initData(dataBytes);
  for (size_t i = 0; i < dataBytes; ++i) data[i] = static_cast<uint8_t>(i * 31);
  std::vector<std::byte> out;
  appendFrame(out, channel, seq, m);
  return out;
}

// Feeds `bytes` to the reader in pieces of `step` bytes, as a socket might deliver them.
void feed(FrameReader& reader, const std::vector<std::byte>& bytes, size_t step, Collect& sink) {
  size_t at = 0;
  while (at < bytes.size()) {
    auto space = reader.writable();
    size_t n = std::min({step, space.size(), bytes.size() - at});
    std::memcpy(space.data(), bytes.data() + at, n);
    reader.commit(n, sink);
    at += n;
  }
}

TEST(Frame, HeaderRoundTripsLittleEndian) {
  std::byte raw[kHeaderBytes];
  encodeHeader(FrameHeader{0x01020304, 0x10, 0x1122334455667788ull}, raw);
  EXPECT_EQ(std::to_integer<int>(raw[0]), 0x04);
  auto h = decodeHeader(raw);
  EXPECT_EQ(h.channel, 0x01020304u);
  EXPECT_EQ(h.length, 0x10u);
  EXPECT_EQ(h.sequence, 0x1122334455667788ull);
}

TEST(Frame, ReaderReassemblesSmallAndLargeFramesFromAnySplit) {
  std::vector<std::byte> stream;
  for (size_t size : {0, 10, 70000, 3, 1 << 20}) {
    auto f = writeFrame(5, size, size);
    stream.insert(stream.end(), f.begin(), f.end());
  }
  for (size_t step : {1, 7, 4096, 1 << 22}) {
    FrameReader reader(4 << 20);
    Collect sink;
    feed(reader, stream, step, sink);
    ASSERT_EQ(sink.frames.size(), 5u) << "step " << step;
    EXPECT_FALSE(reader.midFrame());
    for (auto& [h, body] : sink.frames) {
      MessageIn in(std::move(body));
      auto w = in.root<wire::Instruction>().getWrite();
      auto data = w.getData();
      ASSERT_EQ(data.size(), h.sequence);
      for (size_t i = 0; i < data.size(); ++i) ASSERT_EQ(data[i], static_cast<uint8_t>(i * 31));
    }
  }
}

TEST(Frame, OversizedFrameIsSkippedAndTheNextOneStillArrives) {
  auto big = writeFrame(1, 1, 200000);
  auto small = writeFrame(2, 2, 16);
  std::vector<std::byte> stream(big);
  stream.insert(stream.end(), small.begin(), small.end());
  FrameReader reader(100000);
  Collect sink;
  feed(reader, stream, 1000, sink);
  ASSERT_EQ(sink.oversized.size(), 1u);
  EXPECT_EQ(sink.oversized[0].channel, 1u);
  ASSERT_EQ(sink.frames.size(), 1u);
  EXPECT_EQ(sink.frames[0].first.channel, 2u);
}

TEST(Frame, TruncatedFrameIsReportedAsMidFrame) {
  auto f = writeFrame(1, 1, 100);
  FrameReader reader(1 << 20);
  Collect sink;
  f.resize(f.size() - 9);
  feed(reader, f, 64, sink);
  EXPECT_TRUE(sink.frames.empty());
  EXPECT_TRUE(reader.midFrame());
}

TEST(Frame, GarbageBodyIsAnErrorNotACrash) {
  Body body(64);
  std::memset(body.data(), 0xff, 64);
  auto status = decodeGuard([&] {
    MessageIn in(std::move(body));
    (void)in.root<wire::Instruction>().which();
  });
  ASSERT_FALSE(status);
  EXPECT_EQ(status.error().code, Code::invalidArgument);
}

TEST(RequestTable, ExpiresByDeadlineAndFailsAllInOrder) {
  std::vector<std::pair<int, Code>> seen;
  RequestTable<int> table([&](const int& ctx, const Status& s) { seen.emplace_back(ctx, s ? Code::ok : s.error().code); });
  table.add(1, 10, 100);
  table.add(2, 20, 50);
  table.add(3, 30, 500);
  EXPECT_TRUE(table.complete(1));
  EXPECT_EQ(table.expire(200, "timed out"), 1u);
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0], std::make_pair(20, Code::unavailable));
  table.failAll(Error{Code::unavailable, "node lost"});
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[1].first, 30);
  EXPECT_EQ(table.size(), 0u);
}

}  // namespace
}  // namespace raccel::transport

namespace raccel::transport {
namespace {
TEST(Frame, InPlaceMessageSurvivesItsBuilderAndDecodes) {
  Body body;
  {
    InPlaceMessage out(1000 / 8 + 16);
    auto chunk = out.builder().initRoot<wire::Reply>().initData();
    chunk.setOffset(7);
    chunk.setLast(true);
    auto data = chunk.initData(1000);
    for (size_t i = 0; i < 1000; ++i) data[i] = static_cast<uint8_t>(i);
    body = out.finish();
  }
  MessageIn in(std::move(body));
  auto reply = in.root<wire::Reply>();
  ASSERT_EQ(reply.which(), wire::Reply::DATA);
  EXPECT_EQ(reply.getData().getOffset(), 7u);
  EXPECT_TRUE(reply.getData().getLast());
  auto data = reply.getData().getData();
  ASSERT_EQ(data.size(), 1000u);
  EXPECT_EQ(data[999], static_cast<uint8_t>(999));
}
}  // namespace
}  // namespace raccel::transport

namespace raccel::transport {
namespace {
// A shared body's bytes live as long as any of its owners, on any thread, small or
// pooled; moving an owner moves its share.
TEST(Frame, ASharedBodyOutlivesItsOtherOwnersOnAnyThread) {
  for (size_t bytes : {size_t{24}, size_t{1} << 20}) {
    Body original(bytes);
    for (size_t i = 0; i < bytes; ++i) original.data()[i] = static_cast<std::byte>(i * 7);
    Body kept = original.share();
    EXPECT_EQ(kept.data(), original.data());
    Body moved = std::move(kept);
    std::thread([gone = std::move(original)]() mutable { Body dropped = std::move(gone); }).join();
    ASSERT_EQ(moved.size(), bytes);
    for (size_t i = 0; i < bytes; ++i)
      if (moved.data()[i] != static_cast<std::byte>(i * 7)) {
        ADD_FAILURE() << "byte " << i << " of " << bytes << " changed";
        break;
      }
    Body again = moved.share(), third = again.share();
    moved = Body(8);  // an owner given new storage lets go of the shared one
    EXPECT_EQ(third.data(), again.data());
    EXPECT_EQ(third.size(), bytes);
  }
}
}  // namespace
}  // namespace raccel::transport
