#include "transport/connection.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <thread>

#include "schema/frame.capnp.h"
#include "transport/blocking_link.h"

namespace raccel::transport {
namespace {

std::string tempSocket(const char* name) { return "/tmp/raccel-test-" + std::to_string(getpid()) + "-" + name; }

// An echo server on a libuv loop in a thread, talking to a BlockingLink client.
TEST(Connection, EchoesFramesBetweenLoopAndBlockingClient) {
  uv_loop_t loop;
  uv_loop_init(&loop);
  std::string path = tempSocket("echo.sock");
  std::vector<ConnectionPtr> accepted;
  auto listener = Listener::listen(&loop, *parseAddress(path), 8 << 20, [&](ConnectionPtr c) {
    Connection::Callbacks cb;
    cb.onFrame = [](Connection& conn, const FrameHeader& h, Body body) { conn.sendBody(h.channel, h.sequence, std::move(body)); };
    cb.onClose = [&](Connection&, bool) { uv_stop(&loop); };
    c->setCallbacks(cb);
    c->start();
    accepted.push_back(c);
  });
  ASSERT_TRUE(listener) << listener.error().message;
  std::thread client([&] {
    BlockingLink link;
    ASSERT_TRUE(link.connectUnix(path));
    for (uint64_t i = 1; i <= 100; ++i) {
      capnp::MallocMessageBuilder m;
      m.initRoot<wire::ChannelClosed>().setChannel(static_cast<uint32_t>(i));
      link.queue(3, i, m);
    }
    capnp::MallocMessageBuilder big;
    auto e = big.initRoot<wire::Error>();
    e.setMessage(std::string(3 << 20, 'x'));
    ASSERT_TRUE(link.sendNow(4, 1000, big));
    for (uint64_t i = 1; i <= 100; ++i) {
      auto f = link.receive(5000);
      ASSERT_TRUE(f) << f.error().message;
      EXPECT_EQ(f->header.sequence, i);
      MessageIn in(std::move(f->body));
      EXPECT_EQ(in.root<wire::ChannelClosed>().getChannel(), i);
    }
    auto f = link.receive(5000);
    ASSERT_TRUE(f) << f.error().message;
    EXPECT_EQ(f->header.channel, 4u);
    MessageIn in(std::move(f->body));
    EXPECT_EQ(in.root<wire::Error>().getMessage().size(), 3u << 20);
  });
  uv_run(&loop, UV_RUN_DEFAULT);
  client.join();
  (*listener)->close();
  uv_run(&loop, UV_RUN_DEFAULT);
  EXPECT_EQ(uv_loop_close(&loop), 0);
  ::unlink(path.c_str());
}

TEST(Connection, TruncatedFrameIsReportedOnClose) {
  uv_loop_t loop;
  uv_loop_init(&loop);
  std::string path = tempSocket("trunc.sock");
  bool truncated = false;
  ConnectionPtr keep;
  auto listener = Listener::listen(&loop, *parseAddress(path), 1 << 20, [&](ConnectionPtr c) {
    Connection::Callbacks cb;
    cb.onClose = [&](Connection&, bool t) {
      truncated = t;
      uv_stop(&loop);
    };
    c->setCallbacks(cb);
    c->start();
    keep = c;
  });
  ASSERT_TRUE(listener);
  std::thread client([&] {
    BlockingLink link;
    ASSERT_TRUE(link.connectUnix(path));
    std::byte header[kHeaderBytes];
    encodeHeader(FrameHeader{1, 64, 1}, header);
    ASSERT_TRUE(link.sendRaw(header, sizeof header));
    ASSERT_TRUE(link.sendRaw("half", 4));
  });
  client.join();
  uv_run(&loop, UV_RUN_DEFAULT);
  EXPECT_TRUE(truncated);
  (*listener)->close();
  uv_run(&loop, UV_RUN_DEFAULT);
  uv_loop_close(&loop);
}

// A relay's cork: the three frames of one read, each forwarded from the read's delivery,
// leave as one write. Without it the first went at once and the other two once that
// write's callback ran: two writes, and a peer that may wake for each.
TEST(Connection, FramesForwardedFromOneReadLeaveAsOneWrite) {
  uv_loop_t loop;
  uv_loop_init(&loop);
  int in[2], out[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, in), 0);
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, out), 0);
  auto open = [&](int fd) {
    auto c = Connection::create(&loop, Connection::Kind::pipe, 1 << 20);
    EXPECT_EQ(uv_pipe_open(reinterpret_cast<uv_pipe_t*>(c->stream()), fd), 0);
    return c;
  };
  auto a = open(in[0]), b = open(out[0]);
  int relayed = 0;
  Connection::Callbacks cb;
  cb.onFrame = [&](Connection&, const FrameHeader& h, Body body) {
    b->sendBody(h.channel, h.sequence, std::move(body));
    ++relayed;
  };
  a->setCallbacks(cb);
  a->start();
  b->setCallbacks({});
  b->start();
  std::vector<std::byte> wire;
  for (uint64_t i = 1; i <= 3; ++i) {
    std::vector<std::byte> frame(kHeaderBytes + 100, std::byte{static_cast<unsigned char>(i)});
    encodeHeader(FrameHeader{7, 100, i}, frame.data());
    wire.insert(wire.end(), frame.begin(), frame.end());
  }
  ASSERT_EQ(::write(in[1], wire.data(), wire.size()), static_cast<ssize_t>(wire.size()));
  for (int turns = 0; relayed < 3 && turns < 1000; ++turns) uv_run(&loop, UV_RUN_NOWAIT);
  ASSERT_EQ(relayed, 3);
  EXPECT_EQ(b->writes(), 1u);
  std::vector<std::byte> got(wire.size() + 1);
  EXPECT_EQ(::recv(out[1], got.data(), got.size(), MSG_DONTWAIT), static_cast<ssize_t>(wire.size()));
  got.resize(wire.size());
  EXPECT_EQ(got, wire);
  a->close();
  b->close();
  ::close(in[1]);
  ::close(out[1]);
  uv_run(&loop, UV_RUN_DEFAULT);
  EXPECT_EQ(uv_loop_close(&loop), 0);
}

TEST(Address, ParsesUnixAndTcpAndRefusesNonsense) {
  EXPECT_TRUE(parseAddress("unix:/run/x.sock")->isUnix);
  EXPECT_EQ(parseAddress("127.0.0.1:7700")->port, 7700);
  EXPECT_FALSE(parseAddress("nonsense"));
  EXPECT_FALSE(parseAddress("host:99999"));
}

}  // namespace
}  // namespace raccel::transport
