// Mutual TLS on framed connections, on a real loopback TCP socket with certificates
// made by scripts/raccel-certs.sh: the handshake verifies both sides, the node's name
// comes from its certificate, frames small and large cross intact both ways, and a
// peer with a certificate of another CA never gets a frame through.
#include "transport/tls.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>

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
  bool serverClosed = false;

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
      cb.onClose = [this](Connection&, bool) { serverClosed = true; };
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
      client->setCallbacks(cb);
      if (clientTls) client->useTls(clientTls);
      client->start();
    });
    run([&] { return client && server; });
  }
};

Body pattern(size_t bytes, uint8_t seed) {
  Body b(bytes);
  for (size_t i = 0; i < bytes; ++i) b.data()[i] = static_cast<std::byte>((i * 31 + seed) & 0xff);
  return b;
}

TEST(Tls, BothSidesVerifyTheNodeNameComesFromItsCertificateAndFramesCrossIntact) {
  std::string dir = makeCerts(std::filesystem::temp_directory_path() / ("raccel-tls-" + std::to_string(::getpid())), "node7");
  auto serverTls = TlsContext::create(TlsContext::Role::server, filesOf(dir, "scheduler"));
  auto clientTls = TlsContext::create(TlsContext::Role::client, filesOf(dir, "node7"));
  ASSERT_TRUE(serverTls) << serverTls.error().message;
  ASSERT_TRUE(clientTls) << clientTls.error().message;
  EXPECT_EQ((*clientTls)->ownName(), "node7");
  Link link;
  link.open(*serverTls, *clientTls);
  ASSERT_TRUE(link.client && link.server);
  // Sent before the handshake is done: they wait for it, then go.
  link.client->sendBody(3, 1, pattern(40, 1));
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

}  // namespace
}  // namespace raccel::transport
