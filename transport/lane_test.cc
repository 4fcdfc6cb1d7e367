// The same-host lane: its ring, its checks of a peer's memfd, two connections moving big
// frames through it in order, and a peer that breaks its rules.
#include "transport/lane.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <future>
#include <thread>

#include "transport/connection.h"

namespace raccel::transport {
namespace {

TEST(LaneOut, ReservesInRingOrderAndTakesReleasesInAnyOrder) {
  auto fd = makeLaneMemfd(kMinLaneBytes);
  ASSERT_TRUE(fd) << fd.error().message;
  auto map = LaneMapping::map(*fd);
  ASSERT_TRUE(map) << map.error().message;
  LaneOut out(*map);
  const size_t quarter = kMinLaneBytes / 4;
  auto a = out.reserve(quarter), b = out.reserve(quarter), c = out.reserve(quarter), d = out.reserve(quarter - 100);
  ASSERT_TRUE(a && b && c && d);
  EXPECT_EQ(*a, 0u);
  EXPECT_EQ(*b, quarter);
  EXPECT_FALSE(out.reserve(4096)) << "full";
  // Given back out of order: the space frees only once the oldest goes.
  EXPECT_TRUE(out.release(*b, quarter));
  EXPECT_FALSE(out.reserve(4096)) << "b is free but a, before it, is not: the ring does not skip";
  EXPECT_FALSE(out.release(*b, quarter)) << "given back twice";
  EXPECT_FALSE(out.release(*c, quarter - 1)) << "a length it was not sent";
  EXPECT_FALSE(out.release(12345, 64)) << "no frame there";
  EXPECT_TRUE(out.release(*a, quarter));
  auto e = out.reserve(2 * quarter);  // wraps to the start, where a and b were
  ASSERT_TRUE(e);
  EXPECT_EQ(*e, 0u);
  EXPECT_FALSE(out.reserve(64)) << "wrapped: nothing is free between e and c";
  EXPECT_TRUE(out.release(*c, quarter));
  EXPECT_TRUE(out.release(*d, quarter - 100));
  EXPECT_TRUE(out.release(*e, 2 * quarter));
  EXPECT_EQ(out.outstandingBytes(), 0u);
  EXPECT_FALSE(out.reserve(kMinLaneBytes + 1)) << "more than the lane";
  EXPECT_TRUE(out.reserve(kMinLaneBytes));
}

// A reply made faster than the link carries it waits in a full lane for the peer to give
// space back (rather than go by the socket); a peer that gives none back stalls the lane
// once: the next builds do not wait, until it gives space back again.
TEST(LaneOut, ABuildWaitsForSpaceThePeerGivesBackButWaitsForAStalledPeerOnlyOnce) {
  auto fd = makeLaneMemfd(kMinLaneBytes);
  ASSERT_TRUE(fd) << fd.error().message;
  auto map = LaneMapping::map(*fd);
  ASSERT_TRUE(map) << map.error().message;
  auto lane = std::make_shared<LaneOut>(*map);
  const size_t most = kMinLaneBytes * 3 / 4;
  auto held = lane->reserve(most);  // sent, not yet given back
  ASSERT_TRUE(held);
  EXPECT_FALSE(LaneOut::buildIn(lane, most).size()) << "full, and told not to wait";

  // Given back while a build waits (on a card worker's thread): the build gets it.
  auto waiting = std::async(std::launch::async, [&] { return LaneOut::buildIn(lane, most, 600000).size(); });
  while (lane->waitingBuilds() == 0) std::this_thread::yield();
  EXPECT_TRUE(lane->release(*held, most));
  ASSERT_EQ(waiting.get(), most);
  EXPECT_EQ(lane->outstandingBytes(), 0u) << "dropped unsent: free again";

  // A peer that gives nothing back: the wait runs out, and the lane is stalled.
  held = lane->reserve(most);
  ASSERT_TRUE(held);
  EXPECT_FALSE(LaneOut::buildIn(lane, most, 20).size());
  auto stalled = std::async(std::launch::async, [&] { return LaneOut::buildIn(lane, most, 600000).size(); });
  ASSERT_EQ(stalled.wait_for(std::chrono::seconds(120)), std::future_status::ready)
      << "a stalled lane made a build wait again (it would have waited 600 s)";
  EXPECT_EQ(stalled.get(), 0u);

  // Space given back ends the stall: builds wait for it again.
  auto more = lane->reserve(kMinLaneBytes - most - 64);  // the rest of the ring
  ASSERT_TRUE(more);
  EXPECT_TRUE(lane->release(*held, most));
  held = lane->reserve(most);
  ASSERT_TRUE(held);
  auto again = std::async(std::launch::async, [&] { return LaneOut::buildIn(lane, most, 600000).size(); });
  while (lane->waitingBuilds() == 0) std::this_thread::yield();
  EXPECT_TRUE(lane->release(*more, kMinLaneBytes - most - 64));
  EXPECT_EQ(lane->waitingBuilds(), 1u) << "the space given back is not yet enough";
  EXPECT_TRUE(lane->release(*held, most));
  EXPECT_EQ(again.get(), most);
}

TEST(LaneMapping, RefusesWhatCouldFaultOrIsNoMemfd) {
  // Unsealed: its maker could shrink it under us.
  UniqueFd unsealed(::memfd_create("t", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  ASSERT_EQ(::ftruncate(unsealed.get(), kMinLaneBytes), 0);
  auto m = LaneMapping::map(unsealed);
  ASSERT_FALSE(m);
  EXPECT_NE(m.error().message.find("sealed"), std::string::npos) << m.error().message;
  // Sealed, but too small or not a page multiple.
  for (size_t bytes : {size_t{4096}, kMinLaneBytes + 100}) {
    UniqueFd odd(::memfd_create("t", MFD_CLOEXEC | MFD_ALLOW_SEALING));
    ASSERT_EQ(::ftruncate(odd.get(), static_cast<off_t>(bytes)), 0);
    ASSERT_EQ(::fcntl(odd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL), 0);
    EXPECT_FALSE(LaneMapping::map(odd)) << bytes;
  }
  // Not a file at all.
  int p[2];
  ASSERT_EQ(::pipe(p), 0);
  UniqueFd r(p[0]), w(p[1]);
  EXPECT_FALSE(LaneMapping::map(r));
  // A made one passes.
  auto made = makeLaneMemfd(kMinLaneBytes);
  ASSERT_TRUE(made);
  EXPECT_TRUE(LaneMapping::map(*made));
}

// Two connections over a socketpair on one loop, with lanes both ways (as the netaccel
// and the scheduler attach them: one side in place, the other copying).
struct Pair {
  uv_loop_t loop;
  ConnectionPtr a, b;  // a: receives in place (the netaccel); b: copies out (the scheduler)
  std::vector<std::pair<FrameHeader, Body>> atA, atB;
  bool closedA = false, closedB = false;
  Pair() {
    uv_loop_init(&loop);
    int fds[2];
    EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0);
    a = open(fds[0], atA, closedA);
    b = open(fds[1], atB, closedB);
  }
  ConnectionPtr open(int fd, std::vector<std::pair<FrameHeader, Body>>& into, bool& closed) {
    auto c = Connection::create(&loop, Connection::Kind::pipe, 8 << 20);
    EXPECT_EQ(uv_pipe_open(reinterpret_cast<uv_pipe_t*>(c->stream()), fd), 0);
    Connection::Callbacks cb;
    cb.onFrame = [&into](Connection&, const FrameHeader& h, Body body) { into.emplace_back(h, std::move(body)); };
    cb.onClose = [&closed](Connection&, bool) { closed = true; };
    c->setCallbacks(cb);
    c->start();
    return c;
  }
  void lanes() {
    auto up = makeLaneMemfd(kMinLaneBytes), down = makeLaneMemfd(kMinLaneBytes);
    ASSERT_TRUE(up && down);
    auto upMap = LaneMapping::map(*up), downMap = LaneMapping::map(*down);
    ASSERT_TRUE(upMap && downMap);
    a->receiveLane(*downMap, true);
    a->sendLane(*upMap);
    b->receiveLane(*upMap, false);
    b->sendLane(*downMap);
  }
  // Turns of the loop until `done` (about 10 s at most: the test fails rather than hangs).
  template <class Done>
  bool runUntil(Done done) {
    for (int i = 0; i < 100000 && !done(); ++i)
      if (uv_run(&loop, UV_RUN_NOWAIT) == 0 || !done()) usleep(100);
    return done();
  }
  // Until both sides have every lane frame they sent given back.
  bool settled() {
    return runUntil([&] { return a->outLane()->outstandingBytes() == 0 && b->outLane()->outstandingBytes() == 0; });
  }
  ~Pair() {
    atA.clear();
    atB.clear();
    if (!a->closed()) a->close();
    if (!b->closed()) b->close();
    uv_run(&loop, UV_RUN_DEFAULT);
    EXPECT_EQ(uv_loop_close(&loop), 0);
  }
};

Body pattern(size_t bytes, uint8_t seed) {
  Body body(bytes);
  for (size_t i = 0; i < bytes; ++i) body.data()[i] = static_cast<std::byte>((i * 31 + seed) & 0xff);
  return body;
}

bool samePattern(const Body& body, size_t bytes, uint8_t seed) {
  if (body.size() != bytes) return false;
  for (size_t i = 0; i < bytes; ++i)
    if (body.data()[i] != static_cast<std::byte>((i * 31 + seed) & 0xff)) return false;
  return true;
}

TEST(Lane, BigFramesGoThroughItInOrderWithTheSocketsFrames) {
  Pair p;
  p.lanes();
  // More than the lane holds, both ways, big and small mixed: every frame arrives, in
  // order, intact; the big ones through the lane (the receivers give the space back).
  const size_t big = 300 * 1024, small = 100;
  constexpr int kFrames = 24;  // 24 x 300 KiB = 7 MiB through a 1 MiB lane
  const uint64_t movedBefore = p.a->moved();
  for (int i = 0; i < kFrames; ++i) {
    p.b->sendBody(7, static_cast<uint64_t>(i), pattern(i % 3 == 2 ? small : big, static_cast<uint8_t>(i)));
    p.a->sendBody(9, static_cast<uint64_t>(i), pattern(i % 3 == 2 ? small : big, static_cast<uint8_t>(i + 1)));
    // The in-place receiver drops what it got (a card worker done with a write).
    ASSERT_TRUE(p.runUntil([&] { return p.atA.size() == static_cast<size_t>(i + 1) && p.atB.size() == static_cast<size_t>(i + 1); }));
    EXPECT_TRUE(samePattern(p.atA.back().second, i % 3 == 2 ? small : big, static_cast<uint8_t>(i))) << i;
    EXPECT_EQ(p.atA.back().first.channel, 7u);
    EXPECT_EQ(p.atA.back().first.sequence, static_cast<uint64_t>(i));
    EXPECT_TRUE(samePattern(p.atB.back().second, i % 3 == 2 ? small : big, static_cast<uint8_t>(i + 1))) << i;
    EXPECT_EQ(p.atB.back().first.channel, 9u);
    p.atA.back().second = Body();
    ASSERT_TRUE(p.settled());
  }
  EXPECT_EQ(p.a->laneFramesSent(), 16u);
  EXPECT_EQ(p.b->laneFramesSent(), 16u);
  EXPECT_EQ(p.a->laneFramesReceived(), 16u);
  // What the lane carried counts as moved (Connection::moved: an idle link, a quiet daemon).
  EXPECT_GE(p.a->moved() - movedBefore, 2u * 16 * big);
  EXPECT_FALSE(p.closedA || p.closedB);
}

TEST(Lane, AViewHeldKeepsItsSpaceAndTheSocketCarriesTheRest) {
  Pair p;
  p.lanes();
  const size_t big = 400 * 1024;
  for (int i = 0; i < 4; ++i) p.b->sendBody(7, static_cast<uint64_t>(i), pattern(big, static_cast<uint8_t>(i)));
  ASSERT_TRUE(p.runUntil([&] { return p.atA.size() == 4; }));
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(samePattern(p.atA[static_cast<size_t>(i)].second, big, static_cast<uint8_t>(i)));
  EXPECT_EQ(p.b->laneFramesSent(), 2u) << "two fit in the 1 MiB lane while held; the others took the socket";
  // Dropped on another thread (as a card worker does): the space comes back.
  std::thread([&] { p.atA.clear(); }).join();
  ASSERT_TRUE(p.settled());
  p.b->sendBody(7, 10, pattern(big, 10));
  ASSERT_TRUE(p.runUntil([&] { return p.atA.size() == 1; }));
  EXPECT_EQ(p.b->laneFramesSent(), 3u);
  // A view outlives its connection: the bytes stay readable and dropping it is harmless.
  p.a->close();
  ASSERT_TRUE(p.runUntil([&] { return p.closedA; }));
  EXPECT_TRUE(samePattern(p.atA[0].second, big, 10));
}

TEST(Lane, AReplyBuiltInTheLaneGoesWithoutACopyAndOneDroppedUnsentFreesItsSpace) {
  Pair p;
  p.lanes();
  auto lane = p.a->outLane();
  ASSERT_TRUE(lane);
  // Built on another thread (a card worker), shrunk as InPlaceMessage::finish does.
  Body built;
  std::thread([&] {
    built = LaneOut::buildIn(lane, 512 * 1024);
    ASSERT_EQ(built.size(), 512u * 1024);
    Body want = pattern(300 * 1024, 3);
    std::memcpy(built.data(), want.data(), want.size());
    built.shrink(want.size());
  }).join();
  const std::byte* where = built.data();
  EXPECT_EQ(lane->outstandingBytes(), 512u * 1024) << "held while built";
  p.a->sendBody(9, 1, std::move(built));
  ASSERT_TRUE(p.runUntil([&] { return p.atB.size() == 1; }));
  EXPECT_TRUE(samePattern(p.atB[0].second, 300 * 1024, 3));
  EXPECT_EQ(p.a->laneFramesSent(), 1u);
  EXPECT_EQ(lane->at(0), where) << "sent from where it was built";
  ASSERT_TRUE(p.settled());
  // Built, never sent: dropping it gives the space back at once.
  Body unsent = LaneOut::buildIn(lane, 700 * 1024);
  ASSERT_EQ(unsent.size(), 700u * 1024);
  EXPECT_FALSE(LaneOut::buildIn(lane, 700 * 1024).size()) << "no room for a second";
  unsent = Body();
  EXPECT_EQ(lane->outstandingBytes(), 0u);
  EXPECT_EQ(LaneOut::buildIn(lane, 700 * 1024).size(), 700u * 1024);
  EXPECT_FALSE(LaneOut::buildIn(lane, kMinLaneBytes + 64).size()) << "more than the lane";
}

// A peer that lies about the lane: the connection that reads it is closed, and nothing
// is read outside the mapping.
void expectClosedBy(const std::function<void(std::byte*, FrameHeader&)>& lie) {
  Pair p;
  p.lanes();
  // What b's peer sends, written raw onto a's stream.
  std::byte frame[kHeaderBytes + 32] = {};
  FrameHeader h{kLaneFrameChannel, static_cast<uint32_t>(kLaneDescriptorBytes), 1};
  lie(frame + kHeaderBytes, h);
  encodeHeader(h, frame);
  uv_os_fd_t fd;
  ASSERT_EQ(uv_fileno(reinterpret_cast<uv_handle_t*>(p.b->stream()), &fd), 0);
  ASSERT_EQ(::write(fd, frame, kHeaderBytes + h.length), static_cast<ssize_t>(kHeaderBytes + h.length));
  EXPECT_TRUE(p.runUntil([&] { return p.closedA; }));
  EXPECT_TRUE(p.atA.empty());
}

TEST(Lane, APeerThatLiesAboutItIsClosed) {
  // A descriptor past the end of the lane.
  expectClosedBy([](std::byte* d, FrameHeader&) {
    putLe<uint32_t>(d, 7);
    putLe<uint32_t>(d + 4, 4096);
    putLe<uint64_t>(d + 8, kMinLaneBytes - 64);
  });
  // One whose offset + length wraps around 2^64.
  expectClosedBy([](std::byte* d, FrameHeader&) {
    putLe<uint32_t>(d, 7);
    putLe<uint32_t>(d + 4, 4096);
    putLe<uint64_t>(d + 8, ~uint64_t{0} - 100);
  });
  // A frame for a reserved channel.
  expectClosedBy([](std::byte* d, FrameHeader&) {
    putLe<uint32_t>(d, kLaneReleaseChannel);
    putLe<uint32_t>(d + 4, 4096);
  });
  // A descriptor of the wrong size.
  expectClosedBy([](std::byte*, FrameHeader& h) { h.length = 8; });
  // Space given back that was never sent.
  expectClosedBy([](std::byte* d, FrameHeader& h) {
    h.channel = kLaneReleaseChannel;
    putLe<uint64_t>(d, 4096);
    putLe<uint64_t>(d + 8, 4096);
  });
  // Another reserved channel.
  expectClosedBy([](std::byte*, FrameHeader& h) { h.channel = kFirstReservedChannel; });
}

TEST(LaneListener, TakesAnOfferAndIgnoresMalformedOnes) {
  uv_loop_t loop;
  uv_loop_init(&loop);
  const std::string path = "/tmp/raccel-lane-test-" + std::to_string(getpid()) + ".sock";
  std::vector<std::string> tokens;
  auto listener = LaneListener::listen(&loop, path, [&](const std::string& token, UniqueFd up, UniqueFd down) {
    EXPECT_TRUE(LaneMapping::map(up));
    EXPECT_TRUE(LaneMapping::map(down));
    tokens.push_back(token);
  });
  ASSERT_TRUE(listener) << listener.error().message;
  auto runFor = [&](int turns) {
    for (int i = 0; i < turns; ++i) uv_run(&loop, UV_RUN_NOWAIT), usleep(1000);
  };
  // A connection to the lane socket that hands nothing over (-1 if it cannot connect).
  auto connectBare = [&] {
    int s = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::strcpy(a.sun_path, path.c_str());
    if (::connect(s, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) ::close(s), s = -1;
    return s;
  };
  // Without fds, with too short a token, and one that connects and says nothing.
  for (const char* said : {"0123456789abcdef", "short"}) {
    int s = connectBare();
    ASSERT_GE(s, 0);
    ASSERT_GT(::send(s, said, std::strlen(said), 0), 0);
    runFor(20);
    ::close(s);
  }
  int silent = connectBare();
  ASSERT_GE(silent, 0);
  EXPECT_TRUE(tokens.empty());
  // A good one, after all that.
  const std::string token = newLaneToken();
  std::thread offer([&] {
    auto lane = handOverLane(path, token, kMinLaneBytes);
    EXPECT_TRUE(lane) << lane.error().message;
  });
  for (int i = 0; i < 5000 && tokens.empty(); ++i) runFor(1);
  offer.join();
  ASSERT_EQ(tokens.size(), 1u);
  EXPECT_EQ(tokens[0], token);
  // No socket, no lane: the error says where it looked.
  auto none = handOverLane(path + ".absent", token);
  ASSERT_FALSE(none);
  EXPECT_NE(none.error().message.find(".absent"), std::string::npos) << none.error().message;
  ::close(silent);
  listener->reset();
  uv_run(&loop, UV_RUN_DEFAULT);
  EXPECT_EQ(uv_loop_close(&loop), 0);
  EXPECT_FALSE(std::filesystem::exists(path)) << "the socket goes with its listener";
}

}  // namespace
}  // namespace raccel::transport
