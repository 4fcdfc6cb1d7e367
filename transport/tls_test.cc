// Mutual TLS on framed connections, on a real loopback TCP socket with certificates
// made by scripts/raccel-certs.sh: the handshake verifies both sides, the node's name
// comes from its certificate, frames small and large cross intact both ways, and a
// peer with a certificate of another CA never gets a frame through. With a crypto
// thread on either side or both (transport/tls_crypto.h): the same, frames of both
// directions at once in order, small frames in turn (done on the loop while the thread is
// idle) with big ones between them, the frames a peer sent before it closed all delivered, a
// connection closed while its thread seals, records that do not decrypt closing the link
// (on the loop and on the thread), and the backlog counting what the thread holds.
#include "transport/tls.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>

#include "common/config.h"
#include "schema/frame.capnp.h"
#include "transport/connection.h"

namespace raccel::transport {
namespace {

std::string makeCerts(const std::string& dir, const std::string& node) {
  // Each path one shell word: a checkout's path may hold spaces.
  auto word = [](const std::string& text) {
    std::string out = "'";
    for (char c : text) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return out + "'";
  };
  std::string command = "bash " + word(RACCEL_SOURCE_DIR "/scripts/raccel-certs.sh") + " all " + word(dir) + " " + word(node) +
                        " >/dev/null";
  EXPECT_EQ(std::system(command.c_str()), 0);
  return dir;
}

TlsFiles filesOf(const std::string& dir, const std::string& who) {
  return TlsFiles{dir + "/ca.pem", dir + "/" + who + ".pem", dir + "/" + who + ".key"};
}

struct Link {
  uv_loop_t loop;
  std::unique_ptr<Listener> listener;
  ConnectionPtr server, client;
  std::vector<std::pair<FrameHeader, Body>> atServer, atClient;
  bool serverClosed = false, clientClosed = false, serverTruncated = false;

  Link() { uv_loop_init(&loop); }
  ~Link() {
    if (server) server->close();
    if (client) client->close();
    listener.reset();
    uv_run(&loop, UV_RUN_DEFAULT);
    uv_loop_close(&loop);
  }
  void run(const std::function<bool()>& done, int ms = 5000) {
    auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
    while (!done() && std::chrono::steady_clock::now() < until) uv_run(&loop, UV_RUN_NOWAIT);
  }
  void open(std::shared_ptr<TlsContext> serverTls, std::shared_ptr<TlsContext> clientTls) {
    auto l = Listener::listen(&loop, Address{false, "", "127.0.0.1", 0}, 8 << 20, [this, serverTls](ConnectionPtr c) {
      server = c;
      Connection::Callbacks cb;
      cb.onFrame = [this](Connection&, const FrameHeader& h, Body b) { atServer.emplace_back(h, std::move(b)); };
      cb.onClose = [this](Connection&, bool truncated) {
        serverClosed = true;
        serverTruncated = truncated;
      };
      c->setCallbacks(cb);
      if (serverTls) c->useTls(serverTls);
      c->start();
    });
    ASSERT_TRUE(l) << l.error().message;
    listener = std::move(*l);
    connect(&loop, Address{false, "", "127.0.0.1", listener->port()}, 8 << 20, [this, clientTls](Result<ConnectionPtr> r) {
      ASSERT_TRUE(r) << r.error().message;
      client = *r;
      Connection::Callbacks cb;
      cb.onFrame = [this](Connection&, const FrameHeader& h, Body b) { atClient.emplace_back(h, std::move(b)); };
      cb.onClose = [this](Connection&, bool) { clientClosed = true; };
      client->setCallbacks(cb);
      if (clientTls) client->useTls(clientTls);
      client->start();
    });
    run([&] { return client && server; });
  }
  // open(), then until the server has verified the client.
  void openVerified(std::shared_ptr<TlsContext> serverTls, std::shared_ptr<TlsContext> clientTls) {
    open(std::move(serverTls), std::move(clientTls));
    if (client && server) run([&] { return !server->peerName().empty(); });
  }
};

Body pattern(size_t bytes, uint8_t seed) {
  Body b(bytes);
  for (size_t i = 0; i < bytes; ++i) b.data()[i] = static_cast<std::byte>((i * 31 + seed) & 0xff);
  return b;
}

void bothSidesVerify(bool serverThread);

// (With a crypto thread on the server's side too: the client's first frames then come in
// the same segment as its Finished, which OpenSSL reads ahead during the handshake.)
TEST(Tls, BothSidesVerifyTheNodeNameComesFromItsCertificateAndFramesCrossIntact) {
  for (bool serverThread : {false, true}) {
    SCOPED_TRACE(serverThread ? "server crypto thread" : "no crypto thread");
    bothSidesVerify(serverThread);
    if (HasFatalFailure()) return;
  }
}
void bothSidesVerify(bool serverThread) {
  std::string dir = makeCerts(std::filesystem::temp_directory_path() / ("raccel-tls-" + std::to_string(::getpid())), "node7");
  auto serverTls = TlsContext::create(TlsContext::Role::server, filesOf(dir, "scheduler"), serverThread);
  auto clientTls = TlsContext::create(TlsContext::Role::client, filesOf(dir, "node7"));
  ASSERT_TRUE(serverTls) << serverTls.error().message;
  ASSERT_TRUE(clientTls) << clientTls.error().message;
  EXPECT_EQ((*clientTls)->ownName(), "node7");
  Link link;
  link.open(*serverTls, *clientTls);
  ASSERT_TRUE(link.client && link.server);
  // Sent before the handshake is done: it waits for it, then goes (in the segment of the
  // client's Finished: all of it in what OpenSSL reads ahead).
  link.client->sendBody(3, 1, pattern(40, 1));
  link.run([&] { return link.atServer.size() == 1; });
  ASSERT_EQ(link.atServer.size(), 1u);
  link.client->sendBody(4, 2, pattern(3 << 20, 2));  // a large frame, past the direct-read size
  link.run([&] { return link.atServer.size() == 2; });
  ASSERT_EQ(link.atServer.size(), 2u);
  EXPECT_EQ(link.server->peerName(), "node7");
  EXPECT_TRUE(link.server->secure());
  for (size_t i = 0; i < 2; ++i) {
    Body expected = pattern(i ? 3 << 20 : 40, static_cast<uint8_t>(i + 1));
    ASSERT_EQ(link.atServer[i].second.size(), expected.size());
    EXPECT_EQ(std::memcmp(link.atServer[i].second.data(), expected.data(), expected.size()), 0);
  }
  link.server->sendBody(5, 9, pattern(1 << 20, 5));
  link.run([&] { return link.atClient.size() == 1; });
  ASSERT_EQ(link.atClient.size(), 1u);
  EXPECT_EQ(link.atClient[0].first.sequence, 9u);
  std::filesystem::remove_all(dir);
}

TEST(Tls, ACertificateOfAnotherCaIsRefusedAtTheHandshakeAndNothingCrosses) {
  auto base = std::filesystem::temp_directory_path() / ("raccel-tls-rogue-" + std::to_string(::getpid()));
  std::string pool = makeCerts(base / "pool", "node1"), rogue = makeCerts(base / "rogue", "node1");
  auto serverTls = TlsContext::create(TlsContext::Role::server, filesOf(pool, "scheduler"));
  auto rogueTls = TlsContext::create(TlsContext::Role::client, filesOf(rogue, "node1"));
  ASSERT_TRUE(serverTls && rogueTls);
  Link link;
  link.open(*serverTls, *rogueTls);
  ASSERT_TRUE(link.client && link.server);
  link.client->sendBody(1, 1, pattern(64, 3));
  link.run([&] { return link.serverClosed; });
  EXPECT_TRUE(link.serverClosed);
  EXPECT_TRUE(link.atServer.empty());
  EXPECT_EQ(link.server->peerName(), "");
  // Files that do not match are refused when the context is made, naming the file.
  auto mismatched = TlsContext::create(TlsContext::Role::server,
                                       TlsFiles{pool + "/ca.pem", pool + "/scheduler.pem", pool + "/node1.key"});
  ASSERT_FALSE(mismatched);
  EXPECT_NE(mismatched.error().message.find("node1.key"), std::string::npos) << mismatched.error().message;
  EXPECT_NE(mismatched.error().message.find("mismatch"), std::string::npos) << mismatched.error().message;
  std::filesystem::remove_all(base);
}

// Contexts for the scheduler's side and node7's, each with or without a crypto thread.
struct Pair {
  std::string dir;
  std::shared_ptr<TlsContext> server, client;
  Pair(bool serverThread, bool clientThread, const std::string& tag) {
    dir = makeCerts(std::filesystem::temp_directory_path() / ("raccel-tls-" + tag + "-" + std::to_string(::getpid())), "node7");
    auto s = TlsContext::create(TlsContext::Role::server, filesOf(dir, "scheduler"), serverThread);
    auto c = TlsContext::create(TlsContext::Role::client, filesOf(dir, "node7"), clientThread);
    EXPECT_TRUE(s && c);
    if (s) server = *s;
    if (c) client = *c;
  }
  ~Pair() { std::filesystem::remove_all(dir); }
};

// link.openVerified() with a pair's contexts: true when both contexts were made and both
// ends are up.
bool openVerified(Link& link, const Pair& tls) {
  if (!tls.server || !tls.client) return false;
  link.openVerified(tls.server, tls.client);
  return link.client && link.server;
}

bool same(const Body& got, size_t bytes, uint8_t seed) {
  Body expected = pattern(bytes, seed);
  return got.size() == bytes && std::memcmp(got.data(), expected.data(), bytes) == 0;
}

// Both sides send at once, small and large frames alternating (the large ones past the
// direct-read size and the thread's seal bursts): each side gets the other's in order,
// byte for byte, whichever side has a crypto thread.
TEST(TlsCryptoThread, FramesOfBothDirectionsAtOnceArriveInOrderWithEitherSideThreaded) {
  for (auto [serverThread, clientThread] : {std::pair{true, true}, {true, false}, {false, true}}) {
    SCOPED_TRACE(std::string("server thread ") + (serverThread ? "on" : "off") + ", client thread " + (clientThread ? "on" : "off"));
    Pair tls(serverThread, clientThread, "both");
    Link link;
    ASSERT_TRUE(openVerified(link, tls));
    constexpr int kFrames = 24;
    auto sizeOf = [](int i) -> size_t { return i % 2 ? size_t(3 << 20) + size_t(i) : size_t(100 + i); };
    for (int i = 0; i < kFrames; ++i) {
      link.client->sendBody(7, uint64_t(i), pattern(sizeOf(i), uint8_t(i)));
      link.server->sendBody(8, uint64_t(1000 + i), pattern(sizeOf(i), uint8_t(100 + i)));
    }
    // Handed over or not, what is queued counts as backlog until it is written.
    EXPECT_GE(link.client->backlogBytes() + link.server->backlogBytes(), size_t(3 << 20));
    link.run([&] { return link.atServer.size() == kFrames && link.atClient.size() == kFrames; }, 30000);
    ASSERT_EQ(link.atServer.size(), size_t(kFrames));
    ASSERT_EQ(link.atClient.size(), size_t(kFrames));
    for (int i = 0; i < kFrames; ++i) {
      EXPECT_EQ(link.atServer[i].first.sequence, uint64_t(i));
      EXPECT_TRUE(same(link.atServer[i].second, sizeOf(i), uint8_t(i))) << "frame " << i << " to the server";
      EXPECT_EQ(link.atClient[i].first.sequence, uint64_t(1000 + i));
      EXPECT_TRUE(same(link.atClient[i].second, sizeOf(i), uint8_t(100 + i))) << "frame " << i << " to the client";
    }
    link.run([&] { return link.client->backlogBytes() == 0 && link.server->backlogBytes() == 0; });
    EXPECT_EQ(link.client->backlogBytes(), 0u);
    EXPECT_EQ(link.server->backlogBytes(), 0u);
    EXPECT_EQ(link.server->peerName(), "node7");
  }
}

// A busy link keeps its burst buffers (the last writes' ciphertext, the crypto thread's
// spares) for the next burst; once it moved less than Connection::kTrimBelowBytes
// between two trimIdle() calls, it gives them back, and the next burst still crosses.
TEST(Tls, AnIdleLinkGivesBackTheBuffersItKeptForBursts) {
  for (bool thread : {false, true}) {
    SCOPED_TRACE(thread ? "crypto threads" : "no crypto thread");
    Pair tls(thread, thread, "trim");
    Link link;
    ASSERT_TRUE(openVerified(link, tls));
    auto burst = [&](size_t expected) {
      for (int i = 0; i < 4; ++i) link.client->sendBody(7, uint64_t(i), pattern(size_t(2) << 20, uint8_t(i)));
      link.run([&] { return link.atServer.size() == expected && link.client->backlogBytes() == 0; }, 30000);
      ASSERT_EQ(link.atServer.size(), expected);
      for (size_t i = expected - 4; i < expected; ++i) EXPECT_TRUE(same(link.atServer[i].second, size_t(2) << 20, uint8_t(i % 4)));
    };
    (void)link.client->trimIdle();  // (the handshake's bytes)
    burst(4);
    if (HasFatalFailure()) return;
    EXPECT_GT(link.client->retainedBytes(), size_t(1) << 20);
    EXPECT_FALSE(link.client->trimIdle());  // 8 MiB moved since the last call: kept
    EXPECT_GT(link.client->retainedBytes(), size_t(1) << 20);
    EXPECT_TRUE(link.client->trimIdle());   // nothing since: given back
    EXPECT_EQ(link.client->retainedBytes(), 0u);
    burst(8);
    if (HasFatalFailure()) return;
  }
}

// Request and answer, one small frame at a time (what a sync instruction is): with the
// thread idle, each side seals and reads such a frame itself (TlsCryptoThread::claim),
// and the frames stay in order with the big ones the thread handles between them.
TEST(TlsCryptoThread, SmallFramesInTurnAndBigOnesBetweenThemKeepTheirOrder) {
  Pair tls(true, true, "turns");
  Link link;
  ASSERT_TRUE(openVerified(link, tls));
  constexpr size_t kTurns = 200;
  for (size_t i = 0; i < kTurns; ++i) {
    const size_t bytes = i % 50 == 49 ? size_t(2 << 20) : 64 + i;
    link.client->sendBody(3, i, pattern(bytes, uint8_t(i)));
    link.run([&] { return link.atServer.size() == i + 1; });
    ASSERT_EQ(link.atServer.size(), i + 1);
    ASSERT_TRUE(same(link.atServer[i].second, bytes, uint8_t(i))) << "turn " << i;
    link.server->sendBody(4, 1000 + i, pattern(32, uint8_t(i + 7)));
    link.run([&] { return link.atClient.size() == i + 1; });
    ASSERT_EQ(link.atClient.size(), i + 1);
    ASSERT_EQ(link.atClient[i].first.sequence, 1000 + i);
    ASSERT_TRUE(same(link.atClient[i].second, 32, uint8_t(i + 7))) << "turn " << i;
  }
}

// A peer that sends and closes at once: every frame it sent is delivered before the
// link is reported closed (the last ones were still with the receiver's crypto thread
// when the EOF was read), and the close is not a truncation.
TEST(TlsCryptoThread, TheFramesAPeerSentBeforeItClosedAllArrive) {
  Pair tls(true, true, "eof");
  Link link;
  ASSERT_TRUE(openVerified(link, tls));
  constexpr int kFrames = 16;
  for (int i = 0; i < kFrames; ++i) link.client->sendBody(3, uint64_t(i), pattern(1 << 20, uint8_t(i)));
  bool drained = false;
  link.client->whenDrained([&] { drained = true; });
  link.run([&] { return drained && link.client->backlogBytes() == 0; }, 30000);
  ASSERT_EQ(link.client->backlogBytes(), 0u);
  link.client->close();
  link.client.reset();
  link.run([&] { return link.serverClosed; }, 30000);
  ASSERT_TRUE(link.serverClosed);
  EXPECT_FALSE(link.serverTruncated);
  ASSERT_EQ(link.atServer.size(), size_t(kFrames));
  for (int i = 0; i < kFrames; ++i) EXPECT_TRUE(same(link.atServer[i].second, 1 << 20, uint8_t(i))) << "frame " << i;
}

// A connection closed while its thread is sealing 64 MiB, and one closed while its
// thread is decrypting: both stop cleanly (the sanitizer build checks the memory), the
// peer sees the link end, and a new link on the same contexts works.
TEST(TlsCryptoThread, ALinkClosedWhileItsThreadWorksStopsCleanly) {
  Pair tls(true, true, "close");
  {
    Link link;
    ASSERT_TRUE(openVerified(link, tls));
    for (int i = 0; i < 16; ++i) link.client->sendBody(3, uint64_t(i), pattern(4 << 20, uint8_t(i)));
    link.run([&] { return !link.atServer.empty(); }, 30000);
    link.server->close();  // decrypting what is still coming
    link.client->close();  // sealing what is left
    link.run([&] { return link.serverClosed && link.clientClosed; });
    EXPECT_TRUE(link.serverClosed && link.clientClosed);
  }
  Link again;
  again.open(tls.server, tls.client);
  ASSERT_TRUE(again.client && again.server);
  again.client->sendBody(3, 1, pattern(2 << 20, 9));
  again.run([&] { return again.atServer.size() == 1; });
  ASSERT_EQ(again.atServer.size(), 1u);
  EXPECT_TRUE(same(again.atServer[0].second, 2 << 20, 9));
}

// A peer whose records do not decrypt, after a good handshake: a short run of them (read
// on the loop while the thread is idle) and a long one (handed to the thread). Either way
// the link closes with nothing delivered from them, and the frames before them arrived.
TEST(TlsCryptoThread, RecordsThatDoNotDecryptCloseTheLink) {
  for (size_t junk : {size_t(64), size_t(64) << 10}) {
    SCOPED_TRACE(std::to_string(junk) + " bytes of bad records");
    Pair tls(true, true, "junk");
    Link link;
    ASSERT_TRUE(openVerified(link, tls));
    link.client->sendBody(3, 1, pattern(100, 1));
    link.run([&] { return link.atServer.size() == 1; });
    ASSERT_EQ(link.atServer.size(), 1u);
    // Application-data records (type 23, TLS 1.2 on the wire) of random bytes, written
    // past the client's TLS onto its socket.
    std::vector<unsigned char> bad;
    for (size_t at = 0; at < junk;) {
      const size_t n = std::min<size_t>(16000, junk - at);
      bad.insert(bad.end(), {23, 3, 3, static_cast<unsigned char>(n >> 8), static_cast<unsigned char>(n & 0xff)});
      for (size_t i = 0; i < n; ++i) bad.push_back(static_cast<unsigned char>((i * 131 + at) & 0xff));
      at += n;
    }
    uv_os_fd_t fd;
    ASSERT_EQ(uv_fileno(reinterpret_cast<uv_handle_t*>(link.client->stream()), &fd), 0);
    size_t written = 0;
    while (written < bad.size()) {
      ssize_t w = ::write(fd, bad.data() + written, bad.size() - written);
      if (w > 0) written += size_t(w);
      else link.run([] { return false; }, 10);
    }
    link.run([&] { return link.serverClosed; });
    EXPECT_TRUE(link.serverClosed);
    EXPECT_EQ(link.atServer.size(), 1u);
  }
}

// tls_crypto_thread is auto, on or off; anything else is refused naming the key.
TEST(TlsCryptoThread, TheSettingIsAutoOnOrOff) {
  for (auto [value, ok] : {std::pair{"auto", true}, {"on", true}, {"off", true}, {"yes", false}, {"2", false}}) {
    auto config = Config::parse(std::string("tls_crypto_thread = ") + value + "\n", "test");
    ASSERT_TRUE(config) << config.error().message;
    auto security = linkSecurityFrom(config->top());
    EXPECT_EQ(bool(security), ok) << value;
    if (!security) {
      EXPECT_NE(security.error().message.find("tls_crypto_thread"), std::string::npos);
    } else if (std::string(value) != "auto") {
      EXPECT_EQ(security->cryptoThread, std::string(value) == "on");
    }
  }
}

}  // namespace
}  // namespace raccel::transport
