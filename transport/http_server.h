// An HTTP/1.1 server on a libuv loop, for the daemons' /metrics and the scheduler's web
// console. GNU libmicrohttpd (Debian's libmicrohttpd-dev) parses and answers HTTP; it
// runs in its "external event loop" mode, so its epoll descriptor is one more handle of
// the daemon's loop and every handler runs on the loop thread with the daemon's state
// (no locks, no threads of its own).
//
// What a peer can make it hold is bounded: connections (all, and per address), the
// bytes of one request's line and headers (larger: 431), a body (larger: 413, or the
// connection closed when it arrives without a length), the time a request may take to
// arrive (a client that never finishes is closed), and the bytes waiting for a slow
// event-stream reader (past them it is dropped), and the event streams themselves (all,
// and per address). Streams never take more than half of the connections, in total or
// of one address, so however many a client holds open, /api/* and /metrics still have
// room to answer. Malformed requests get 400 from libmicrohttpd itself.
//
// Event streams (text/event-stream, for Server-Sent Events): a handler answers with
// `stream` set; that connection stays open, gets the response's body first and then
// everything published to the server, in order.
#pragma once

#include <uv.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/error.h"

struct MHD_Daemon;
struct MHD_Connection;

namespace raccel::transport {

struct HttpRequest {
  std::string method;  // GET, POST, ...
  std::string path;    // without the query
  std::map<std::string, std::string> query;
  std::map<std::string, std::string> headers;  // names lower-cased
  std::string body;
  std::string peer;  // "127.0.0.1:41234"
  // The header's value, or "" (name in lower case).
  std::string header(const std::string& name) const {
    auto it = headers.find(name);
    return it == headers.end() ? "" : it->second;
  }
};

struct HttpResponse {
  int status = 200;
  std::string contentType = "text/plain; charset=utf-8";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;
  bool stream = false;  // an event stream: `body` first, then what is published
  static HttpResponse text(int status, std::string body);
  static HttpResponse json(int status, std::string body);
  // A Prometheus text-format page (/metrics).
  static HttpResponse metrics(std::string page);
  // 405 for `request`, naming the methods `allow` ("GET, HEAD").
  static HttpResponse methodNotAllowed(const HttpRequest& request, const std::string& allow);
};

class HttpServer {
 public:
  struct Options {
    std::string listen = "127.0.0.1:0";  // host:port (IPv4 or IPv6 literal)
    unsigned timeoutS = 10;              // a request must arrive within this (idle keep-alive too)
    unsigned maxConnections = 64;
    unsigned maxConnectionsPerAddress = 16;
    size_t maxHeaderBytes = 16 << 10;  // the request line and headers
    size_t maxBodyBytes = 16 << 10;
    unsigned maxStreams = 16;           // at most maxConnections / 2
    unsigned maxStreamsPerAddress = 4;  // at most maxConnectionsPerAddress / 2
    size_t maxStreamBacklog = 1 << 20;  // bytes waiting for one stream reader
    unsigned keepaliveMs = 15000;       // a comment line to every stream (finds dead readers)
    std::string name = "http";          // for logs
  };
  using Handler = std::function<HttpResponse(const HttpRequest&)>;

  HttpServer(uv_loop_t* loop, Options options, Handler handler);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds and starts serving; an error names the address.
  Status start();
  // Ends every stream and connection and closes the handles (the loop can then end).
  void stop();
  int port() const { return port_; }
  // Sends `chunk` to every open event stream.
  void publish(const std::string& chunk);
  size_t streams() const { return streams_.size(); }
  // Event streams open from one address (a peer's host, without its port).
  size_t streamsFrom(const std::string& address) const;
  uint64_t requestsServed() const { return served_; }

 private:
  struct Stream;
  struct Pending;
  friend struct HttpCallbacks;  // libmicrohttpd's callbacks (http_server.cc)
  void run();  // lets libmicrohttpd do what is ready, then re-arms the timer
  void runIn(uint64_t ms);
  void wake(Stream& stream);

  uv_loop_t* loop_;
  Options options_;
  Handler handler_;
  MHD_Daemon* daemon_ = nullptr;
  uv_poll_t* poll_ = nullptr;
  uv_timer_t* timer_ = nullptr;
  uv_timer_t* keepalive_ = nullptr;
  std::vector<Stream*> streams_;
  int port_ = 0;
  uint64_t served_ = 0;
  bool inRun_ = false;
  bool resumed_ = false;  // a parked stream was resumed: run again at once
};

}  // namespace raccel::transport
