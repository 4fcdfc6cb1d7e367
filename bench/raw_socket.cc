#include "bench/raw_socket.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "tests/cluster.h"
#include "transport/spin_wait.h"

namespace raccel::bench {
namespace {
// The median of a non-empty set of samples (reordered).
double medianOf(std::vector<double>& us) {
  std::nth_element(us.begin(), us.begin() + static_cast<long>(us.size() / 2), us.end());
  return us[us.size() / 2];
}
}  // namespace

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

namespace {
bool pinTo(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  return pthread_setaffinity_np(pthread_self(), sizeof set, &set) == 0;
}
}  // namespace

double wakeupRttUs(bool sameCpu, int iterations) {
  cpu_set_t allowed;
  if (sched_getaffinity(0, sizeof allowed, &allowed) != 0) return -1;
  std::vector<int> cpus;
  for (int c = 0; c < CPU_SETSIZE && cpus.size() < 2; ++c)
    if (CPU_ISSET(c, &allowed)) cpus.push_back(c);
  if (cpus.empty() || (!sameCpu && cpus.size() < 2)) return -1;
  int there[2], back[2];
  if (::pipe(there) != 0) return -1;
  if (::pipe(back) != 0) {
    ::close(there[0]), ::close(there[1]);
    return -1;
  }
  const int mine = cpus[0], theirs = sameCpu ? cpus[0] : cpus[1];
  std::thread echo([&] {
    char b = 0;
    bool pinned = pinTo(theirs);
    for (int i = 0; i < iterations; ++i) {
      if (!readAll(there[0], &b, 1)) break;
      if (!pinned) b = 1;  // tells the other side
      if (::write(back[1], &b, 1) != 1) break;
    }
    ::close(back[1]);  // a side that stopped early: the other reads the end
  });
  cpu_set_t before;
  pthread_getaffinity_np(pthread_self(), sizeof before, &before);
  bool pinned = pinTo(mine);
  std::vector<double> us;
  us.reserve(static_cast<size_t>(iterations));
  char b = 0;
  for (int i = 0; i < iterations; ++i) {
    auto t = std::chrono::steady_clock::now();
    if (::write(there[1], &b, 1) != 1 || !readAll(back[0], &b, 1)) break;
    us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t).count());
  }
  pthread_setaffinity_np(pthread_self(), sizeof before, &before);
  ::close(there[1]);  // an echo that stopped early sees the end
  echo.join();
  ::close(there[0]);
  ::close(back[0]);
  if (!pinned || b != 0 || us.size() != static_cast<size_t>(iterations)) return -1;
  return medianOf(us);
}

double rawTwoHopRttUs(const std::string& dir, int iterations) {
  int port = 0;
  int probe = tcpListen(&port);
  if (probe < 0) return -1;
  ::close(probe);
  const std::string relayPath = dir + "/raw-relay.sock";
  testing::Process echo("raccel-bench", {"--raw-echo", std::to_string(port)}, dir + "/raw-echo.log");
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  testing::Process relay("raccel-bench", {"--raw-relay", relayPath + ":" + std::to_string(port)}, dir + "/raw-relay.log");
  int fd = unixConnect(relayPath);
  if (fd < 0) return -1;
  // The same sizes as the measured path: two small frames out, one small frame back,
  // waited for as raccel's client waits (transport/spin_wait.h, RACCEL_SPIN_US).
  char out[96] = {}, back[96];
  std::vector<double> us;
  auto spin = transport::spinFromEnvironment();
  transport::SpinWindow window(spin ? *spin : 0);
  for (int i = 0; i < iterations + 100; ++i) {
    auto t = std::chrono::steady_clock::now();
    if (!writeAll(fd, out, sizeof out) || transport::waitReadable(fd, -1, window) <= 0 || !readAll(fd, back, sizeof back))
      break;
    if (i >= 100) us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t).count());
  }
  ::close(fd);
  if (us.empty()) return -1;
  return medianOf(us);
}

}  // namespace raccel::bench
