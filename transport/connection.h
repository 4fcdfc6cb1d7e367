// A framed libuv stream (unix socket, TCP with TCP_NODELAY, or a character device such
// as a virtio-serial port), listeners and connectors. Everything here belongs to the
// loop thread that created it.
//
// Sends are queued and coalesced: the first frame goes out at once, frames sent while
// a write is in flight are gathered into the next write. backlogBytes() and
// whenDrained() let a relay stop reading a fast source until a slow peer catches up.
#pragma once

#include <uv.h>

#include <functional>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "common/error.h"
#include "transport/frame.h"
#include "transport/lane.h"
#include "transport/tls.h"
#include "transport/tls_crypto.h"

namespace raccel::transport {

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  struct Callbacks {
    std::function<void(Connection&, const FrameHeader&, Body)> onFrame;
    // A frame over the maximum was skipped; the connection stays open.
    std::function<void(Connection&, const FrameHeader&)> onOversized;
    // Called once after the frames of one read were delivered (a batch boundary).
    std::function<void(Connection&)> onBatchEnd;
    // Called once when the connection is closed, by either side. `truncated` is true
    // when the peer vanished in the middle of a frame.
    std::function<void(Connection&, bool truncated)> onClose;
  };

  static constexpr size_t kHighWater = 16 * 1024 * 1024;

  // Creates an unopened connection of the given kind on `loop`.
  enum class Kind { pipe, tcp };
  static std::shared_ptr<Connection> create(uv_loop_t* loop, Kind kind, uint32_t maxFrameBytes);

  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  void setCallbacks(Callbacks callbacks) { callbacks_ = std::move(callbacks); }
  // Begins reading. Call once, after the stream is connected.
  void start();
  // Sends one frame; the message is copied into the send queue.
  void send(uint32_t channel, uint64_t sequence, capnp::MessageBuilder& message);
  // Sends one frame whose body is already encoded, without copying it.
  void sendBody(uint32_t channel, uint64_t sequence, Body body);
  // Closes the stream after nothing more is read; queued sends are dropped (but for those
  // a Cork holds: they are written first, as they would have been without it).
  void close();

  // While one is held (on this thread), frames sent on any connection are queued, and
  // each connection with some makes one write when the outermost cork ends, instead of
  // one for its first frame and another, once that completes, for the rest. Held around
  // the delivery of one read's frames (a relay forwards them as one write, and a card's
  // kernel times and fence answer reach the guest as one wake-up) and around a batch of
  // a daemon's own outputs.
  class Cork {
   public:
    Cork();
    ~Cork();
    Cork(const Cork&) = delete;
    Cork& operator=(const Cork&) = delete;
  };
  bool closed() const { return closing_; }

  // Bytes queued to send and in flight (with TLS, handed to the crypto thread and sealed
  // but not yet written too).
  size_t backlogBytes() const { return queuedBytes_ + inflightBytes_; }
  // Runs `fn` once the backlog is below half the high-water mark (at once if it is).
  void whenDrained(std::function<void()> fn);
  void pauseReading();
  void resumeReading();
  bool readingPaused() const { return paused_; }
  // Whether the peer has hung up, asked without reading (a paused stream reads no EOF,
  // so whoever pauses one asks this now and then: a peer gone meanwhile is noticed).
  bool peerHungUp() const;
  // Relay backpressure: call after queueing frames read from `source` onto this
  // connection. Over the high-water mark, `source` stops reading until this drains.
  void throttle(Connection& source);

  // Mutual TLS on this stream (call before start()): frames are delivered, and queued
  // sends leave, only once the handshake has verified the peer's certificate against
  // the context's pool CA. A failed handshake closes the connection (logged with why).
  // With the context's cryptoThread(), the link's cipher work then moves to a thread of
  // its own (transport/tls_crypto.h); frames are still delivered on the loop thread.
  void useTls(std::shared_ptr<TlsContext> context);
  bool secure() const { return tls_ != nullptr; }
  // The verified peer certificate's common name ("" without TLS or before the handshake).
  const std::string& peerName() const;
  // A same-host lane (transport/lane.h), each direction attached on its own, both before
  // or after start(). receiveLane: the peer's big frames may come through `mapping`;
  // `inPlace` hands them on as views into it (given back when their last owner drops
  // them, on any thread), otherwise each is copied out and given back at once.
  // sendLane: from now on big frames go through `mapping` while it has room (the socket
  // carries them when it has none). A peer that breaks the lane's rules is closed.
  void receiveLane(std::shared_ptr<LaneMapping> mapping, bool inPlace);
  void sendLane(std::shared_ptr<LaneMapping> mapping);
  // Our lane (null without one): where a reply can be built to be sent without a copy
  // (LaneOut::buildIn, from any thread).
  std::shared_ptr<LaneOut> outLane() const;
  uint64_t laneFramesSent() const;
  uint64_t laneFramesReceived() const;
  // Writes started on the stream so far (each may carry many frames).
  uint64_t writes() const { return writes_; }
  // Bytes the frame reader holds for this connection now (idle peers cost none).
  size_t bufferedBytes() const { return reader_.stagedCapacity(); }
  // Bytes a TLS link keeps for its next burst: the last write's ciphertext buffers, and
  // with a crypto thread its spare read and ciphertext buffers (up to ~6 MiB a busy link).
  size_t retainedBytes() const;
  // Bytes read and written on its stream, and carried by its same-host lanes, so far.
  uint64_t moved() const { return moved_; }
  // Gives those back if the link moved less than kTrimBelowBytes since the last call
  // (true when it did). A daemon calls it now and then for each link (its tick), so an
  // idle link holds none of them.
  bool trimIdle();
  static constexpr uint64_t kTrimBelowBytes = 1 << 20;

  void setMaxFrameBytes(uint32_t bytes) { reader_.setMaxFrameBytes(bytes); }
  uint32_t maxFrameBytes() const { return reader_.maxFrameBytes(); }
  const std::string& peer() const { return peer_; }
  void setPeer(std::string peer) { peer_ = std::move(peer); }

  uv_stream_t* stream() { return &handle_.stream; }
  // Opaque per-connection slot for the owner (e.g. which VM this socket belongs to).
  std::shared_ptr<void> tag;

 private:
  Connection(uv_loop_t* loop, Kind kind, uint32_t maxFrameBytes);
  struct Sink;
  struct BigChunk {
    std::array<std::byte, kHeaderBytes> header;
    Body body;
  };
  using Chunk = std::variant<std::vector<std::byte>, BigChunk>;
  void flush();     // now, or when the cork ends
  void flushNow();  // starts a write of what is queued, if none is in flight
  void flushTls();
  bool sealQueued();
  bool readRecords();
  void readInline(const std::byte* data, size_t n);
  void sealInline();
  void takeLoopCipher();
  void stopReading();
  size_t queuedPlainBytes() const;
  void flushCrypto();
  void startWrite(const uv_buf_t* bufs, size_t count);
  void wrote(int status);  // the write in flight is done (status 0) or failed
  void startCryptoThread(Bytes rest);
  void onCryptoOutput();
  void queueSmall(uint32_t channel, uint64_t sequence, const std::byte* body, size_t bytes);
  bool sendThroughLane(uint32_t channel, uint64_t sequence, const Body& body);
  void onLaneFrame(const FrameHeader& header, Body body);
  void sendLaneReleases(const std::vector<std::pair<uint64_t, uint64_t>>& released);
  void laneViolation(const std::string& what);
  void closeLanes();
  void receiveTls(const std::byte* data, size_t n);
  void finishClose();
  static void onAlloc(uv_handle_t* handle, size_t suggested, uv_buf_t* buf);
  static void onRead(uv_stream_t* stream, ssize_t nread, const uv_buf_t* buf);
  static void onWrite(uv_write_t* req, int status);
  static void onHandleClosed(uv_handle_t* handle);

  union {
    uv_handle_t handle;
    uv_stream_t stream;
    uv_pipe_t pipe;
    uv_tcp_t tcp;
  } handle_;
  Kind kind_;
  Callbacks callbacks_;
  FrameReader reader_;
  std::shared_ptr<Connection> self_;  // alive until uv_close completes
  std::vector<Chunk> queue_, inflight_;
  size_t queuedBytes_ = 0, inflightBytes_ = 0;
  size_t sealedBytes_ = 0;  // TLS: bytes of queue_'s first chunk already encrypted
  uv_write_t writeReq_;
  bool writing_ = false, reading_ = false, paused_ = false, closing_ = false, started_ = false;
  bool corked_ = false;  // queued frames wait for the end of a Cork (listed there)
  uint64_t writes_ = 0;
  uint64_t moved_ = 0, movedAtTrim_ = 0;  // bytes read, written and through the lanes (moved(), trimIdle)
  bool truncated_ = false;
  int closesPending_ = 0;  // handles (the stream, a crypto thread's wake-up) not yet closed
  std::vector<std::function<void()>> drainWaiters_;
  std::string peer_;
  struct Tls;
  std::unique_ptr<Tls> tls_;
  std::unique_ptr<LinkLanes> lanes_;
};

using ConnectionPtr = std::shared_ptr<Connection>;

// An address: "unix:/path", "/path" (unix), or "host:port" (TCP).
struct Address {
  bool isUnix = false;
  std::string path;  // unix
  std::string host;  // tcp
  int port = 0;
  std::string toString() const { return isUnix ? "unix:" + path : host + ":" + std::to_string(port); }
};
Result<Address> parseAddress(const std::string& text);

// Accepts connections on a unix socket or TCP address. Owned by the loop thread.
class Listener {
 public:
  using AcceptFn = std::function<void(ConnectionPtr)>;
  // A unix socket file is replaced if stale and given `mode` permissions.
  static Result<std::unique_ptr<Listener>> listen(uv_loop_t* loop, const Address& address, uint32_t maxFrameBytes,
                                                  AcceptFn onAccept, int mode = 0660);
  ~Listener();
  // The bound TCP port (useful with port 0).
  int port() const;
  void close();

 private:
  Listener() = default;
  static void onConnection(uv_stream_t* server, int status);
  union {
    uv_handle_t handle;
    uv_stream_t stream;
    uv_pipe_t pipe;
    uv_tcp_t tcp;
  }* handle_ = nullptr;
  Address address_;
  uint32_t maxFrameBytes_ = 0;
  AcceptFn onAccept_;
};

// Connects to `address`; `done` gets the started-but-callbackless connection or an
// error. The caller sets callbacks and calls start().
void connect(uv_loop_t* loop, const Address& address, uint32_t maxFrameBytes,
             std::function<void(Result<ConnectionPtr>)> done);

// Opens a character device (a virtio-serial port) as a framed stream.
Result<ConnectionPtr> openDevice(uv_loop_t* loop, const std::string& path, uint32_t maxFrameBytes);

}  // namespace raccel::transport
