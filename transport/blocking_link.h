// A blocking framed link over a unix socket, for client code without an event loop
// (libraccel, raccelctl, tests). Writes never deadlock against a peer that is writing
// to us: while a send waits for room, incoming frames are read into a queue.
// Not thread-safe: one thread at a time.
#pragma once

#include <sys/uio.h>

#include <deque>
#include <string>
#include <vector>

#include "common/error.h"
#include "transport/frame.h"
#include "transport/spin_wait.h"

namespace raccel::transport {

struct ReceivedFrame {
  FrameHeader header;
  Body body;
};

class BlockingLink {
 public:
  BlockingLink() : reader_(1u << 30) {}
  ~BlockingLink();
  BlockingLink(const BlockingLink&) = delete;
  BlockingLink& operator=(const BlockingLink&) = delete;

  // Connects to a unix socket path ("unix:" prefix optional).
  Status connectUnix(const std::string& path);
  // Takes over a socket that is already connected (a socketpair's end, say); it is
  // closed with the link.
  void adopt(int fd);
  bool connected() const { return fd_ >= 0; }
  // The socket, for a caller that writes bytes past the link's framing (a test's flood).
  int fd() const { return fd_; }
  void close();

  // Queues a frame; it is written when the queue is large or on flush().
  void queue(uint32_t channel, uint64_t sequence, capnp::MessageBuilder& message);
  // Writes one frame at once, data segments included, without copying large ones.
  Status sendNow(uint32_t channel, uint64_t sequence, capnp::MessageBuilder& message);
  // Writes raw bytes as they are (tests use this to send malformed input).
  Status sendRaw(const void* data, size_t size);
  Status flush();

  // How long receive()'s waits may poll before they sleep (transport/spin_wait.h); 0,
  // the default: they sleep at once.
  void setSpin(int64_t mostNs) { spin_ = SpinWindow(mostNs); }
  // Waits up to timeoutMs (-1: forever) for the next frame.
  Result<ReceivedFrame> receive(int timeoutMs);
  // Returns a frame already received, if any, without blocking.
  bool tryPop(ReceivedFrame* out);
  // Reads whatever is available now without blocking.
  Status pump();

 private:
  Status writeAll(const ::iovec* iov, int count);
  Status readSome(bool block, int timeoutMs);
  int fd_ = -1;
  SpinWindow spin_;
  std::vector<std::byte> out_;
  FrameReader reader_;
  std::deque<ReceivedFrame> inbox_;
};

}  // namespace raccel::transport
