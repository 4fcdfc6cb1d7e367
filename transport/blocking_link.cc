#include "transport/blocking_link.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

namespace raccel::transport {
namespace {
struct InboxSink : FrameReader::Sink {
  std::deque<ReceivedFrame>& inbox;
  bool oversized = false;
  explicit InboxSink(std::deque<ReceivedFrame>& q) : inbox(q) {}
  void onFrame(const FrameHeader& header, Body body) override { inbox.push_back({header, std::move(body)}); }
  void onOversized(const FrameHeader&) override { oversized = true; }
};
constexpr size_t kQueueFlushBytes = 256 * 1024;
}  // namespace

BlockingLink::~BlockingLink() { close(); }

Status BlockingLink::connectUnix(const std::string& address) {
  close();
  std::string path = address.rfind("unix:", 0) == 0 ? address.substr(5) : address;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof addr.sun_path) return fail(Code::invalidArgument, "socket path too long: " + path);
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return fail(Code::internal, std::string("socket: ") + std::strerror(errno));
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    int err = errno;
    ::close(fd);
    return fail(Code::unavailable, "cannot connect to " + path + ": " + std::strerror(err));
  }
  adopt(fd);
  return {};
}

void BlockingLink::adopt(int fd) {
  close();
  int size = 4 << 20;
  ::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &size, sizeof size);
  ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &size, sizeof size);
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  fd_ = fd;
}

void BlockingLink::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  out_.clear();
}

void BlockingLink::queue(uint32_t channel, uint64_t sequence, capnp::MessageBuilder& message) {
  appendFrame(out_, channel, sequence, message);
  if (out_.size() >= kQueueFlushBytes) (void)flush();
}

Status BlockingLink::flush() {
  if (out_.empty()) return {};
  iovec iov{out_.data(), out_.size()};
  auto status = writeAll(&iov, 1);
  out_.clear();
  return status;
}

Status BlockingLink::sendNow(uint32_t channel, uint64_t sequence, capnp::MessageBuilder& message) {
  if (auto s = flush(); !s) return s;
  auto segments = message.getSegmentsForOutput();
  size_t tableWords = (segments.size() + 2) / 2;
  std::vector<uint32_t> table(tableWords * 2, 0);
  table[0] = static_cast<uint32_t>(segments.size() - 1);
  size_t bytes = tableWords * 8;
  for (size_t i = 0; i < segments.size(); ++i) {
    table[i + 1] = static_cast<uint32_t>(segments[i].size());
    bytes += segments[i].size() * 8;
  }
  std::byte header[kHeaderBytes];
  encodeHeader(FrameHeader{channel, static_cast<uint32_t>(bytes), sequence}, header);
  std::vector<iovec> iov;
  iov.push_back({header, kHeaderBytes});
  iov.push_back({table.data(), tableWords * 8});
  for (auto& s : segments) iov.push_back({const_cast<capnp::word*>(s.begin()), s.size() * 8});
  return writeAll(iov.data(), static_cast<int>(iov.size()));
}

Status BlockingLink::sendRaw(const void* data, size_t size) {
  if (auto s = flush(); !s) return s;
  iovec iov{const_cast<void*>(data), size};
  return writeAll(&iov, 1);
}

Status BlockingLink::writeAll(const iovec* iovIn, int count) {
  if (fd_ < 0) return fail(Code::unavailable, "not connected");
  std::vector<iovec> iov(iovIn, iovIn + count);
  size_t first = 0;
  while (first < iov.size()) {
    msghdr msg{};
    msg.msg_iov = iov.data() + first;
    msg.msg_iovlen = std::min<size_t>(iov.size() - first, IOV_MAX);
    ssize_t n = ::sendmsg(fd_, &msg, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK)
        return fail(Code::unavailable, std::string("connection lost: ") + std::strerror(errno));
      // No room: wait for room, reading what the peer sends meanwhile.
      pollfd p{fd_, POLLOUT | POLLIN, 0};
      if (::poll(&p, 1, -1) < 0 && errno != EINTR) return fail(Code::internal, "poll failed");
      if (p.revents & POLLIN) {
        if (auto s = readSome(false, 0); !s) return s;
      }
      if (p.revents & (POLLERR | POLLHUP) && !(p.revents & POLLOUT))
        return fail(Code::unavailable, "connection lost while sending");
      continue;
    }
    size_t left = static_cast<size_t>(n);
    while (first < iov.size() && left >= iov[first].iov_len) left -= iov[first++].iov_len;
    if (first < iov.size()) {
      iov[first].iov_base = static_cast<char*>(iov[first].iov_base) + left;
      iov[first].iov_len -= left;
    }
  }
  return {};
}

Status BlockingLink::readSome(bool block, int timeoutMs) {
  if (fd_ < 0) return fail(Code::unavailable, "not connected");
  if (block) {
    int rc = waitReadable(fd_, timeoutMs, spin_);
    if (rc == 0) return fail(Code::unavailable, "timed out after " + std::to_string(timeoutMs) + " ms waiting for a reply");
    if (rc < 0 && errno != EINTR) return fail(Code::internal, "poll failed");
  }
  InboxSink sink(inbox_);
  for (;;) {
    auto space = reader_.writable();
    ssize_t n = ::read(fd_, space.data(), space.size());
    if (n > 0) {
      reader_.commit(static_cast<size_t>(n), sink);
      if (sink.oversized) return fail(Code::internal, "peer sent a frame over the limit");
      if (static_cast<size_t>(n) < space.size()) return {};
      continue;
    }
    if (n == 0) {
      ::close(fd_);
      fd_ = -1;
      return fail(Code::unavailable, "connection closed by the peer");
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return {};
    return fail(Code::unavailable, std::string("connection lost: ") + std::strerror(errno));
  }
}

Status BlockingLink::pump() {
  if (auto s = flush(); !s) return s;
  return readSome(false, 0);
}

bool BlockingLink::tryPop(ReceivedFrame* out) {
  if (inbox_.empty()) return false;
  *out = std::move(inbox_.front());
  inbox_.pop_front();
  return true;
}

Result<ReceivedFrame> BlockingLink::receive(int timeoutMs) {
  if (auto s = flush(); !s) return std::unexpected(s.error());
  auto start = std::chrono::steady_clock::now();
  while (inbox_.empty()) {
    int left = timeoutMs;
    if (timeoutMs >= 0) {
      auto spent = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start).count();
      left = std::max<int>(0, timeoutMs - static_cast<int>(spent));
    }
    if (auto s = readSome(true, left); !s) return std::unexpected(s.error());
  }
  ReceivedFrame frame = std::move(inbox_.front());
  inbox_.pop_front();
  return frame;
}

}  // namespace raccel::transport
