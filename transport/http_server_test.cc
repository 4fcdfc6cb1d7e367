// HttpServer against raw sockets: what it answers, and what it refuses from a peer that
// sends too much, too little or nonsense, while it keeps serving everyone else.
#include "transport/http_server.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <future>
#include <thread>

#include "tests/raw_http.h"

namespace raccel::transport {
namespace {

using namespace raccel::testing::rawhttp;

// The server on a libuv loop in a thread of its own; `onLoop` runs code there.
class Served {
 public:
  Served(HttpServer::Options options, HttpServer::Handler handler) {
    uv_loop_init(&loop_);
    uv_async_init(&loop_, &async_, [](uv_async_t* a) { static_cast<Served*>(a->data)->drainCalls(); });
    async_.data = this;
    server_ = std::make_unique<HttpServer>(&loop_, std::move(options), std::move(handler));
    started_ = server_->start();
    thread_ = std::thread([this] { uv_run(&loop_, UV_RUN_DEFAULT); });
  }
  ~Served() {
    onLoop([this] {
      server_->stop();
      uv_close(reinterpret_cast<uv_handle_t*>(&async_), nullptr);
    });
    thread_.join();
    uv_loop_close(&loop_);
  }
  const Status& started() const { return started_; }
  int port() const { return server_->port(); }
  HttpServer& server() { return *server_; }
  void onLoop(std::function<void()> fn) {
    std::promise<void> done;
    {
      std::lock_guard<std::mutex> lock(mu_);
      calls_.emplace_back([&] {
        fn();
        done.set_value();
      });
    }
    uv_async_send(&async_);
    done.get_future().wait();
  }

 private:
  void drainCalls() {
    std::vector<std::function<void()>> calls;
    {
      std::lock_guard<std::mutex> lock(mu_);
      calls.swap(calls_);
    }
    for (auto& c : calls) c();
  }
  uv_loop_t loop_;
  uv_async_t async_;
  std::unique_ptr<HttpServer> server_;
  Status started_;
  std::thread thread_;
  std::mutex mu_;
  std::vector<std::function<void()>> calls_;
};

HttpResponse echo(const HttpRequest& r) {
  if (r.path == "/throw") throw std::runtime_error("the handler failed");
  if (r.path == "/events") {
    HttpResponse s;
    s.stream = true;
    s.contentType = "text/event-stream";
    s.body = "data: hello\n\n";
    return s;
  }
  std::string out = r.method + " " + r.path + " q=" + (r.query.count("x") ? r.query.at("x") : "") +
                    " auth=" + r.header("authorization") + " body=" + r.body;
  return HttpResponse::text(200, out);
}

HttpServer::Options quick() {
  HttpServer::Options o;
  o.timeoutS = 1;
  o.maxHeaderBytes = 4096;
  o.maxBodyBytes = 64;
  o.maxConnectionsPerAddress = 4;
  o.maxStreams = 2;
  return o;
}

const std::string kGet = "GET /ok?x=1 HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n";

TEST(HttpServer, AnswersWithWhatTheHandlerSaw) {
  Served s(quick(), echo);
  ASSERT_TRUE(s.started()) << s.started().error().message;
  std::string r = roundTrip(s.port(), "POST /a/b?x=y%20z HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer k\r\n"
                                     "Content-Length: 5\r\nConnection: close\r\n\r\nhello");
  EXPECT_EQ(statusOf(r), 200) << r;
  EXPECT_NE(r.find("POST /a/b q=y z auth=Bearer k body=hello"), std::string::npos) << r;
  EXPECT_NE(r.find("X-Content-Type-Options: nosniff"), std::string::npos) << r;
}

TEST(HttpServer, RefusesMalformedRequestsAndKeepsServing) {
  Served s(quick(), echo);
  ASSERT_TRUE(s.started());
  for (const char* bad : {"NONSENSE\r\n\r\n", "GET\r\n\r\n", "GET / HTTP/9.9\r\n\r\n", "GET / HTTP/1.1\r\nNo colon here\r\n\r\n",
                          "\x01\x02\x03\xff\r\n\r\n"}) {
    std::string r = roundTrip(s.port(), bad);
    int status = statusOf(r);
    EXPECT_TRUE(status == 400 || status == 505 || r.empty()) << "for " << bad << ": " << r;
  }
  EXPECT_EQ(statusOf(roundTrip(s.port(), kGet)), 200);
}

TEST(HttpServer, RefusesOversizedHeadersAndBodies) {
  Served s(quick(), echo);
  ASSERT_TRUE(s.started());
  std::string big = "GET / HTTP/1.1\r\nHost: t\r\nX-Big: " + std::string(64 << 10, 'a') + "\r\n\r\n";
  std::string r = roundTrip(s.port(), big);
  EXPECT_EQ(statusOf(r), 431) << r.substr(0, 200);
  std::string url = "GET /" + std::string(64 << 10, 'u') + " HTTP/1.1\r\nHost: t\r\n\r\n";
  int status = statusOf(roundTrip(s.port(), url));
  EXPECT_TRUE(status == 414 || status == 431) << status;
  r = roundTrip(s.port(), "POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 100000\r\nConnection: close\r\n\r\n" + std::string(100, 'b'));
  EXPECT_EQ(statusOf(r), 413) << r;
  EXPECT_NE(r.find("request body over 64 bytes"), std::string::npos) << r;
  // A chunked body past the limit: no length to refuse early, so the connection ends.
  r = roundTrip(s.port(), "POST / HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n100\r\n" + std::string(256, 'c') + "\r\n0\r\n\r\n");
  EXPECT_NE(statusOf(r), 200) << r;
  EXPECT_EQ(statusOf(roundTrip(s.port(), kGet)), 200);
}

TEST(HttpServer, ClosesClientsThatNeverFinishARequest) {
  Served s(quick(), echo);
  ASSERT_TRUE(s.started());
  int slow = connectTo(s.port());
  ASSERT_GE(slow, 0);
  sendAll(slow, "GET / HTTP/1.1\r\nHost:");
  int silent = connectTo(s.port());  // connects and never speaks
  ASSERT_GE(silent, 0);
  // Others are served while they hang.
  EXPECT_EQ(statusOf(roundTrip(s.port(), kGet)), 200);
  EXPECT_TRUE(closedByServer(slow, 5000));
  EXPECT_TRUE(closedByServer(silent, 5000));
  ::close(slow);
  ::close(silent);
  EXPECT_EQ(statusOf(roundTrip(s.port(), kGet)), 200);
}

TEST(HttpServer, BoundsConnectionsPerAddress) {
  Served s(quick(), echo);
  ASSERT_TRUE(s.started());
  std::vector<int> idle;
  for (int i = 0; i < 4; ++i) idle.push_back(connectTo(s.port()));
  int extra = connectTo(s.port());
  ASSERT_GE(extra, 0);  // accepted by the kernel, then closed by the server
  EXPECT_TRUE(closedByServer(extra, 3000));
  ::close(extra);
  for (int fd : idle) ::close(fd);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_EQ(statusOf(roundTrip(s.port(), kGet)), 200);
}

TEST(HttpServer, AHandlerThatThrowsAnswers500) {
  Served s(quick(), echo);
  ASSERT_TRUE(s.started());
  std::string r = roundTrip(s.port(), "GET /throw HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(statusOf(r), 500);
  EXPECT_NE(r.find("the handler failed"), std::string::npos);
}

TEST(HttpServer, EventStreamsGetWhatIsPublishedAndAreBounded) {
  auto options = quick();
  options.maxStreamBacklog = 64 << 10;
  Served s(options, echo);
  ASSERT_TRUE(s.started());
  const std::string get = "GET /events HTTP/1.1\r\nHost: t\r\n\r\n";
  int a = connectTo(s.port());
  sendAll(a, get);
  std::string first = receive(a, 3000, "hello");
  EXPECT_NE(first.find("text/event-stream"), std::string::npos) << first;
  EXPECT_NE(first.find("data: hello"), std::string::npos) << first;
  // An open stream is not a slow client: it outlives the request timeout.
  std::this_thread::sleep_for(std::chrono::milliseconds(2500));
  s.onLoop([&] { s.server().publish("data: one\n\n"); });
  EXPECT_NE(receive(a, 3000, "data: one").find("data: one"), std::string::npos);
  s.onLoop([&] { s.server().publish("data: two\n\n"); });
  EXPECT_NE(receive(a, 3000, "data: two").find("data: two"), std::string::npos);

  int b = connectTo(s.port());
  sendAll(b, get);
  receive(b, 3000, "hello");
  int c = connectTo(s.port());
  sendAll(c, get);
  EXPECT_EQ(statusOf(receive(c, 3000)), 503);  // two streams at most
  ::close(c);

  // b stops reading: once the socket buffers and its backlog are full, its stream ends;
  // a (read below) keeps up.
  std::string chunk = "data: " + std::string(1000, 'x') + "\n\n";
  size_t streams = 2;
  for (int i = 0; i < 20000 && streams == 2; ++i) {
    s.onLoop([&] {
      s.server().publish(chunk);
      streams = s.server().streams();
    });
    receive(a, 1);
  }
  EXPECT_EQ(streams, 1u);
  ::close(b);
  s.onLoop([&] { s.server().publish("data: three\n\n"); });
  EXPECT_NE(receive(a, 3000, "data: three").find("data: three"), std::string::npos);
  ::close(a);
  EXPECT_EQ(statusOf(roundTrip(s.port(), kGet)), 200);
}

TEST(HttpServer, NamesTheAddressItCannotUse) {
  uv_loop_t loop;
  uv_loop_init(&loop);
  HttpServer::Options o;
  o.listen = "not-an-ip:80";
  HttpServer bad(&loop, o, echo);
  auto s = bad.start();
  ASSERT_FALSE(s);
  EXPECT_NE(s.error().message.find("not-an-ip:80"), std::string::npos) << s.error().message;
  Served first(quick(), echo);
  o.listen = "127.0.0.1:" + std::to_string(first.port());
  HttpServer taken(&loop, o, echo);
  s = taken.start();
  ASSERT_FALSE(s);
  EXPECT_NE(s.error().message.find(o.listen), std::string::npos) << s.error().message;
  uv_run(&loop, UV_RUN_DEFAULT);
  uv_loop_close(&loop);
}

}  // namespace
}  // namespace raccel::transport
