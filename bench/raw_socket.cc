#include "bench/raw_socket.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

namespace raccel::bench {

bool readAll(int fd, void* buf, size_t n) {
  auto* p = static_cast<char*>(buf);
  while (n) {
    ssize_t r = ::read(fd, p, n);
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

bool writeAll(int fd, const void* buf, size_t n) {
  auto* p = static_cast<const char*>(buf);
  while (n) {
    ssize_t r = ::send(fd, p, n, MSG_NOSIGNAL);
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

int tcpListen(int* port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(*port));
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(fd, 4) != 0) return -1;
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  *port = ntohs(a.sin_port);
  return fd;
}

int tcpConnect(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  for (int i = 0; i < 200; ++i) {
    if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
      int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      return fd;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return -1;
}

int unixConnect(const std::string& path) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::strncpy(a.sun_path, path.c_str(), sizeof a.sun_path - 1);
  for (int i = 0; i < 200; ++i) {
    if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) return fd;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return -1;
}

// Baseline hop 2: echoes every byte it gets back on the same TCP connection.
int rawEcho(int port) {
  int l = tcpListen(&port);
  if (l < 0) return 1;
  int c = ::accept(l, nullptr, nullptr);
  int one = 1;
  ::setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  char buf[65536];
  for (;;) {
    ssize_t n = ::read(c, buf, sizeof buf);
    if (n <= 0 || !writeAll(c, buf, static_cast<size_t>(n))) return 0;
  }
}

// Baseline hop 1: relays bytes between a unix-socket client and the TCP echo.
int rawRelay(const std::string& path, int port) {
  int l = ::socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::strncpy(a.sun_path, path.c_str(), sizeof a.sun_path - 1);
  ::unlink(path.c_str());
  if (::bind(l, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(l, 4) != 0) return 1;
  int up = tcpConnect(port);
  int down = ::accept(l, nullptr, nullptr);
  char buf[65536];
  pollfd fds[2] = {{down, POLLIN, 0}, {up, POLLIN, 0}};
  for (;;) {
    if (::poll(fds, 2, -1) <= 0) return 0;
    for (int i = 0; i < 2; ++i) {
      if (!(fds[i].revents & (POLLIN | POLLHUP))) continue;
      ssize_t n = ::read(fds[i].fd, buf, sizeof buf);
      if (n <= 0 || !writeAll(fds[1 - i].fd, buf, static_cast<size_t>(n))) return 0;
    }
  }
}

double rawSocketGbps(size_t bytes) {
  int port = 0;
  int l = tcpListen(&port);
  std::thread receiver([&] {
    int c = ::accept(l, nullptr, nullptr);
    std::vector<char> buf(1 << 20);
    size_t got = 0;
    while (got < bytes) {
      ssize_t n = ::read(c, buf.data(), buf.size());
      if (n <= 0) break;
      got += static_cast<size_t>(n);
    }
    ::close(c);
  });
  int fd = tcpConnect(port);
  std::vector<char> chunk(1 << 20, 1);
  auto t = std::chrono::steady_clock::now();
  for (size_t sent = 0; sent < bytes; sent += chunk.size()) writeAll(fd, chunk.data(), chunk.size());
  ::shutdown(fd, SHUT_WR);
  receiver.join();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
  ::close(fd);
  ::close(l);
  return bytes * 8.0 / secs / 1e9;
}

}  // namespace raccel::bench
