#include "transport/http_server.h"

#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <cstring>

#include "common/log.h"
#include "transport/connection.h"

namespace raccel::transport {

HttpResponse HttpResponse::text(int status, std::string body) {
  HttpResponse r;
  r.status = status;
  r.body = std::move(body);
  if (r.body.empty() || r.body.back() != '\n') r.body += '\n';
  return r;
}

HttpResponse HttpResponse::json(int status, std::string body) {
  HttpResponse r;
  r.status = status;
  r.contentType = "application/json";
  r.body = std::move(body);
  return r;
}

HttpResponse HttpResponse::metrics(std::string page) {
  HttpResponse r;
  r.contentType = "text/plain; version=0.0.4; charset=utf-8";
  r.body = std::move(page);
  return r;
}

HttpResponse HttpResponse::methodNotAllowed(const HttpRequest& request, const std::string& allow) {
  HttpResponse r = text(405, request.method + " " + request.path + ": only " + allow);
  r.headers.emplace_back("Allow", allow);
  return r;
}

// One open event stream; freed by libmicrohttpd (freeStream) when its connection ends.
struct HttpServer::Stream {
  HttpServer* server;
  MHD_Connection* connection;
  std::string address;  // the reader's host (limits per address)
  std::string backlog;
  bool suspended = false;
  bool ending = false;
};

// One request while it arrives.
struct HttpServer::Pending {
  std::string body;
  bool refused = false;  // answered before its body (413)
};

struct HttpCallbacks {
  static MHD_Result access(void* cls, MHD_Connection* connection, const char* url, const char* method, const char*,
                           const char* upload, size_t* uploadSize, void** state) {
    auto* server = static_cast<HttpServer*>(cls);
    auto* pending = static_cast<HttpServer::Pending*>(*state);
    if (!pending) {  // the headers have arrived
      pending = new HttpServer::Pending;
      *state = pending;
      const char* length = MHD_lookup_connection_value(connection, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
      if (length && std::strtoull(length, nullptr, 10) > server->options_.maxBodyBytes) {
        pending->refused = true;
        return queue(connection, HttpResponse::text(413, "request body over " + std::to_string(server->options_.maxBodyBytes) +
                                                            " bytes"));
      }
      return MHD_YES;
    }
    if (*uploadSize > 0) {
      if (pending->refused) {
        *uploadSize = 0;
        return MHD_YES;
      }
      if (pending->body.size() + *uploadSize > server->options_.maxBodyBytes) {
        RLOG_DEBUG(server->options_.name.c_str()) << "a chunked body over " << server->options_.maxBodyBytes << " bytes: closed";
        return MHD_NO;  // no length was given, so the connection ends here
      }
      pending->body.append(upload, *uploadSize);
      *uploadSize = 0;
      return MHD_YES;
    }
    if (pending->refused) return MHD_YES;
    HttpRequest request;
    request.method = method;
    request.path = url;
    request.body = std::move(pending->body);
    MHD_get_connection_values(connection, MHD_HEADER_KIND, &HttpCallbacks::header, &request.headers);
    MHD_get_connection_values(connection, MHD_GET_ARGUMENT_KIND, &HttpCallbacks::argument, &request.query);
    if (auto* info = MHD_get_connection_info(connection, MHD_CONNECTION_INFO_CLIENT_ADDRESS); info && info->client_addr)
      request.peer = peerText(info->client_addr);
    HttpResponse response;
    try {
      response = server->handler_(request);
    } catch (const std::exception& e) {
      RLOG_WARN(server->options_.name.c_str()) << request.method << " " << request.path << " failed: " << e.what();
      response = HttpResponse::text(500, std::string("internal error: ") + e.what());
    }
    ++server->served_;
    if (!response.stream) return queue(connection, response);
    const std::string address = hostOf(request.peer);
    const unsigned total = std::min(server->options_.maxStreams, server->options_.maxConnections / 2);
    const unsigned perAddress =
        std::min(server->options_.maxStreamsPerAddress, server->options_.maxConnectionsPerAddress / 2);
    if (server->streams_.size() >= total)
      return queue(connection, HttpResponse::text(503, "too many event streams open (" + std::to_string(total) + ")"));
    if (server->streamsFrom(address) >= perAddress)
      return queue(connection, HttpResponse::text(429, "too many event streams open from " + address + " (" +
                                                           std::to_string(perAddress) + "); close one first"));
    auto* stream = new HttpServer::Stream{server, connection, address, std::move(response.body)};
    MHD_Response* r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, &HttpCallbacks::read, stream, &HttpCallbacks::release);
    if (!r) {
      delete stream;
      return MHD_NO;
    }
    server->streams_.push_back(stream);
    response.headers.emplace_back("Cache-Control", "no-store");
    addHeaders(r, response);
    MHD_Result queued = MHD_queue_response(connection, static_cast<unsigned>(response.status), r);
    MHD_destroy_response(r);
    return queued;
  }

  static void completed(void*, MHD_Connection*, void** state, MHD_RequestTerminationCode) {
    delete static_cast<HttpServer::Pending*>(*state);
    *state = nullptr;
  }

  static ssize_t read(void* cls, uint64_t, char* buf, size_t max) {
    auto* s = static_cast<HttpServer::Stream*>(cls);
    if (!s->backlog.empty()) {
      size_t n = std::min(max, s->backlog.size());
      std::memcpy(buf, s->backlog.data(), n);
      s->backlog.erase(0, n);
      return static_cast<ssize_t>(n);
    }
    if (s->ending) return MHD_CONTENT_READER_END_OF_STREAM;
    // Nothing to send: parked until publish() has more (suspending from the reader is
    // allowed, the response being this connection's own).
    MHD_suspend_connection(s->connection);
    s->suspended = true;
    return 0;
  }

  static void release(void* cls) {
    auto* s = static_cast<HttpServer::Stream*>(cls);
    std::erase(s->server->streams_, s);
    delete s;
  }

  static MHD_Result queue(MHD_Connection* connection, const HttpResponse& response) {
    MHD_Response* r = MHD_create_response_from_buffer(response.body.size(), const_cast<char*>(response.body.data()),
                                                      MHD_RESPMEM_MUST_COPY);
    if (!r) return MHD_NO;
    addHeaders(r, response);
    MHD_Result queued = MHD_queue_response(connection, static_cast<unsigned>(response.status), r);
    MHD_destroy_response(r);
    return queued;
  }

  static void addHeaders(MHD_Response* r, const HttpResponse& response) {
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, response.contentType.c_str());
    MHD_add_response_header(r, "X-Content-Type-Options", "nosniff");
    for (auto& [name, value] : response.headers) MHD_add_response_header(r, name.c_str(), value.c_str());
  }

  static MHD_Result header(void* cls, MHD_ValueKind, const char* key, const char* value) {
    std::string name = key;
    std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
    (*static_cast<std::map<std::string, std::string>*>(cls))[name] = value ? value : "";
    return MHD_YES;
  }

  static MHD_Result argument(void* cls, MHD_ValueKind, const char* key, const char* value) {
    (*static_cast<std::map<std::string, std::string>*>(cls))[key] = value ? value : "";
    return MHD_YES;
  }

  // "127.0.0.1:41234" -> "127.0.0.1", "[::1]:5" -> "[::1]".
  static std::string hostOf(const std::string& peer) {
    auto colon = peer.rfind(':');
    return colon == std::string::npos ? peer : peer.substr(0, colon);
  }

  static std::string peerText(const sockaddr* addr) {
    char host[INET6_ADDRSTRLEN] = "?";
    int port = 0;
    if (addr->sa_family == AF_INET) {
      auto* in = reinterpret_cast<const sockaddr_in*>(addr);
      ::inet_ntop(AF_INET, &in->sin_addr, host, sizeof host);
      port = ntohs(in->sin_port);
    } else if (addr->sa_family == AF_INET6) {
      auto* in = reinterpret_cast<const sockaddr_in6*>(addr);
      ::inet_ntop(AF_INET6, &in->sin6_addr, host, sizeof host);
      port = ntohs(in->sin6_port);
    }
    return std::string(host) + ":" + std::to_string(port);
  }

  static void log(void* cls, const char* format, va_list args) {
    char line[512];
    std::vsnprintf(line, sizeof line, format, args);
    std::string text = line;
    while (!text.empty() && text.back() == '\n') text.pop_back();
    RLOG_DEBUG(static_cast<HttpServer*>(cls)->options_.name.c_str()) << "libmicrohttpd: " << text;
  }
};

HttpServer::HttpServer(uv_loop_t* loop, Options options, Handler handler)
    : loop_(loop), options_(std::move(options)), handler_(std::move(handler)) {}

HttpServer::~HttpServer() { stop(); }

Status HttpServer::start() {
  auto address = parseAddress(options_.listen);
  if (!address) return fail(address.error());
  if (address->isUnix) return fail(Code::invalidArgument, "'" + options_.listen + "' is not an address (host:port)");
  std::string host = address->host;
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  if (host == "localhost") host = "127.0.0.1";
  int port = address->port;
  sockaddr_storage addr{};
  unsigned flags = MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG;
  if (uv_ip4_addr(host.c_str(), port, reinterpret_cast<sockaddr_in*>(&addr)) != 0) {
    if (uv_ip6_addr(host.c_str(), port, reinterpret_cast<sockaddr_in6*>(&addr)) != 0)
      return fail(Code::invalidArgument, "'" + options_.listen + "': the host must be an IP address or localhost");
    flags |= MHD_USE_IPv6;
  }
  daemon_ = MHD_start_daemon(
      flags, 0, nullptr, nullptr, &HttpCallbacks::access, this,                                     //
      MHD_OPTION_SOCK_ADDR, reinterpret_cast<sockaddr*>(&addr),                                     //
      MHD_OPTION_CONNECTION_TIMEOUT, static_cast<unsigned>(options_.timeoutS),                      //
      MHD_OPTION_CONNECTION_LIMIT, static_cast<unsigned>(options_.maxConnections),                  //
      MHD_OPTION_PER_IP_CONNECTION_LIMIT, static_cast<unsigned>(options_.maxConnectionsPerAddress),  //
      MHD_OPTION_CONNECTION_MEMORY_LIMIT, static_cast<size_t>(options_.maxHeaderBytes + 4096),      //
      MHD_OPTION_NOTIFY_COMPLETED, &HttpCallbacks::completed, this,                                  //
      MHD_OPTION_EXTERNAL_LOGGER, &HttpCallbacks::log, this,                                         //
      MHD_OPTION_END);
  if (!daemon_) return fail(Code::unavailable, "cannot serve HTTP on " + options_.listen + ": " + std::strerror(errno));
  if (auto* info = MHD_get_daemon_info(daemon_, MHD_DAEMON_INFO_BIND_PORT)) port_ = info->port;
  auto* epoll = MHD_get_daemon_info(daemon_, MHD_DAEMON_INFO_EPOLL_FD);
  poll_ = new uv_poll_t;
  timer_ = new uv_timer_t;
  keepalive_ = new uv_timer_t;
  poll_->data = timer_->data = keepalive_->data = this;
  uv_poll_init(loop_, poll_, epoll->epoll_fd);
  uv_poll_start(poll_, UV_READABLE, [](uv_poll_t* h, int, int) { static_cast<HttpServer*>(h->data)->run(); });
  uv_timer_init(loop_, timer_);
  uv_timer_init(loop_, keepalive_);
  uv_timer_start(
      keepalive_, [](uv_timer_t* h) { static_cast<HttpServer*>(h->data)->publish(": keepalive\n\n"); }, options_.keepaliveMs,
      options_.keepaliveMs);
  run();
  return {};
}

void HttpServer::run() {
  if (!daemon_ || inRun_) return;
  inRun_ = true;
  resumed_ = false;
  MHD_run(daemon_);
  inRun_ = false;
  MHD_UNSIGNED_LONG_LONG ms = 0;
  if (resumed_) runIn(0);  // a handler published to a parked stream during this run
  else if (MHD_get_timeout(daemon_, &ms) == MHD_YES) runIn(ms);
  else uv_timer_stop(timer_);
}

void HttpServer::runIn(uint64_t ms) {
  uv_timer_start(timer_, [](uv_timer_t* h) { static_cast<HttpServer*>(h->data)->run(); }, ms, 0);
}

size_t HttpServer::streamsFrom(const std::string& address) const {
  return static_cast<size_t>(std::count_if(streams_.begin(), streams_.end(), [&](const Stream* s) { return s->address == address; }));
}

void HttpServer::wake(Stream& stream) {
  if (!stream.suspended) return;
  stream.suspended = false;
  MHD_resume_connection(stream.connection);
  // libmicrohttpd takes the connection back on its next run: soon, from the loop (after
  // the run under way, when a handler published).
  resumed_ = true;
  if (timer_ && !inRun_) runIn(0);
}

void HttpServer::publish(const std::string& chunk) {
  for (Stream* s : streams_) {
    if (s->ending) continue;
    if (s->backlog.size() + chunk.size() > options_.maxStreamBacklog) {
      RLOG_INFO(options_.name.c_str()) << "an event stream reader fell " << s->backlog.size()
                                       << " bytes behind: its stream is ended";
      s->backlog.clear();
      s->ending = true;
    } else {
      s->backlog += chunk;
    }
    wake(*s);
  }
}

void HttpServer::stop() {
  if (!daemon_) return;
  uv_poll_stop(poll_);
  // Streams end, and no connection may be suspended when the daemon stops.
  for (Stream* s : streams_) {
    s->ending = true;
    s->backlog.clear();
    wake(*s);
  }
  MHD_run(daemon_);
  MHD_stop_daemon(daemon_);
  daemon_ = nullptr;
  for (uv_handle_t* h : {reinterpret_cast<uv_handle_t*>(poll_), reinterpret_cast<uv_handle_t*>(timer_),
                         reinterpret_cast<uv_handle_t*>(keepalive_)}) {
    if (h->type == UV_POLL)
      uv_close(h, [](uv_handle_t* p) { delete reinterpret_cast<uv_poll_t*>(p); });
    else
      uv_close(h, [](uv_handle_t* p) { delete reinterpret_cast<uv_timer_t*>(p); });
  }
  poll_ = nullptr;
  timer_ = keepalive_ = nullptr;
}

}  // namespace raccel::transport
