// A same-host lane: when both ends of a link run on one host, the big frames of each
// direction travel through shared memory (a sealed memfd the two map) and only a
// 16-byte descriptor crosses the socket, in order with the link's other frames.
//
// The memfds are made by the side that connects (the netaccel) and passed over a unix
// socket of the listening side (the scheduler's lane socket) with a one-use token that
// the listening side sent over the link itself: only the peer of that link can claim
// them. Each direction's sender reserves space in its memfd in ring order, copies the
// frame in and sends the descriptor; the receiver gives the space back with a release
// frame, in any order, once it is done with the bytes. A receiver either copies a frame
// out at once (a side that trusts nothing of the peer's memory: the scheduler) or hands
// the bytes on in place (the netaccel, whose bodies are then views into the scheduler's
// memfd). Everything a peer says about a lane is checked: the memfd's seals and size,
// each descriptor's bounds, each release against the space outstanding.
#pragma once

#include <uv.h>

#include <cstddef>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/error.h"
#include "transport/frame.h"

namespace raccel::transport {

// Channels a link's contexts never use: the lane's own frames travel on them.
constexpr uint32_t kFirstReservedChannel = 0xFFFFFF00u;
constexpr uint32_t kLaneFrameChannel = 0xFFFFFFFFu;    // body: a LaneDescriptor
constexpr uint32_t kLaneReleaseChannel = 0xFFFFFFFEu;  // body: (offset, length) pairs
constexpr size_t kLaneDescriptorBytes = 16;             // channel u32, length u32, offset u64
constexpr size_t kLaneTokenBytes = 16;

// Each direction's memfd, and the bounds a peer's must be within.
constexpr size_t kLaneBytes = size_t{64} << 20;
constexpr size_t kMinLaneBytes = size_t{1} << 20, kMaxLaneBytes = size_t{1} << 30;
// Frames smaller than this stay on the socket (a copy costs more than it saves).
constexpr size_t kLaneMinFrameBytes = 64 * 1024;

// An fd closed when it goes.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept;
  ~UniqueFd();
  int get() const { return fd_; }
  explicit operator bool() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

// A new memfd of `bytes`, sealed so that its size can never change (a peer that maps it
// cannot be made to fault by shrinking it).
Result<UniqueFd> makeLaneMemfd(size_t bytes);

// One lane memfd, mapped. `map` checks a peer's first: a regular file sealed against
// growing, shrinking and further seals, of a page-multiple size within the bounds.
class LaneMapping {
 public:
  static Result<std::shared_ptr<LaneMapping>> map(const UniqueFd& fd);
  ~LaneMapping();
  LaneMapping(const LaneMapping&) = delete;
  LaneMapping& operator=(const LaneMapping&) = delete;
  std::byte* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  LaneMapping(std::byte* data, size_t size) : data_(data), size_(size) {}
  std::byte* data_;
  size_t size_;
};

// The sender's side of one direction: space in ring order, given back in any order.
// Any thread: a reply can be built in the lane where it is made (buildIn), then sent
// without a copy (claim).
class LaneOut {
 public:
  explicit LaneOut(std::shared_ptr<LaneMapping> mapping) : mapping_(std::move(mapping)) {}
  // The offset of `bytes` of space (64-byte aligned) for a frame sent now, or nothing
  // while the lane is full.
  std::optional<uint64_t> reserve(size_t bytes);
  std::byte* at(uint64_t offset) const { return mapping_->data() + offset; }
  // A body of `bytes` to build a frame in, inside the lane (an empty body while it is
  // full). Dropped unsent, its space is free again. With `waitMs`, a full lane is waited
  // for that long while the peer gives space back (a reply made faster than the link
  // carries it: sent by the socket instead, it would go at the socket's speed, through
  // TLS where the link has it). A wait that ran out marks the lane stalled (the peer is
  // not reading it): later builds do not wait until the peer gives space back again, so
  // a peer that stops reading costs a worker one wait, not one a frame.
  static Body buildIn(const std::shared_ptr<LaneOut>& lane, size_t bytes, unsigned waitMs = 0);
  // The offset of `body` when it was built in this lane and is sent now (it may have
  // shrunk meanwhile): from then on the peer gives its space back.
  std::optional<uint64_t> claim(const Body& body);
  // The receiver is done with [offset, offset + bytes). False when that is not a frame
  // outstanding (a peer that lies; its link should end).
  bool release(uint64_t offset, uint64_t bytes);
  size_t outstandingBytes() const;
  size_t waitingBuilds() const;  // builds waiting for space now

 private:
  enum class State { building, sent, released };
  struct Span {
    uint64_t offset, bytes, reserved;
    State state;
  };
  std::optional<uint64_t> reserveLocked(size_t bytes, State state);
  std::optional<uint64_t> placeLocked(uint64_t need) const;
  void dropped(uint64_t offset);  // a body built in the lane is gone
  void popReleased();
  std::shared_ptr<LaneMapping> mapping_;
  mutable std::mutex mu_;
  std::deque<Span> spans_;  // oldest first
  size_t outstanding_ = 0;
  std::condition_variable room_;
  bool stalled_ = false;
  size_t waiting_ = 0;
};

// Releases the receiving side makes on any thread (a card worker drops a body), handed
// to the link's loop thread through `wake`.
class LaneReleases {
 public:
  void give(uint64_t offset, uint64_t bytes);
  std::vector<std::pair<uint64_t, uint64_t>> take();
  // The loop's wake-up; null once the link is gone (later releases go nowhere).
  void setWake(uv_async_t* wake);

 private:
  std::mutex mu_;
  std::vector<std::pair<uint64_t, uint64_t>> done_;
  uv_async_t* wake_ = nullptr;
};

// A link's lanes, as its Connection holds them (loop thread).
struct LinkLanes {
  std::shared_ptr<LaneMapping> in;  // the peer's frames (null: none come this way)
  bool inPlace = false;
  std::shared_ptr<LaneReleases> releases;  // inPlace: views given back on any thread
  uv_async_t* wake = nullptr;              // ... and the loop told
  std::shared_ptr<LaneOut> out;            // ours (null: every frame goes by the socket)
  uint64_t framesSent = 0, framesReceived = 0;
};

// The listening side's lane socket: a unix socket (mode 0600) where a peer hands over
// its two memfds with the token it was sent. `onOffer` gets the token and the fds
// (up: what the peer sends, down: what it receives), not yet checked. Loop thread only.
class LaneListener {
 public:
  using OfferFn = std::function<void(const std::string& token, UniqueFd up, UniqueFd down)>;
  static Result<std::unique_ptr<LaneListener>> listen(uv_loop_t* loop, const std::string& path, OfferFn onOffer);
  ~LaneListener();
  const std::string& path() const { return path_; }

 private:
  struct Pending;
  LaneListener() = default;
  static void readable(uv_poll_t* handle, int status, int events);
  void acceptAll();
  void receive(Pending& p);
  void drop(Pending& p);
  uv_loop_t* loop_ = nullptr;
  std::string path_;
  UniqueFd fd_;
  uv_poll_t* poll_ = nullptr;
  uv_timer_t* retry_ = nullptr;  // out of descriptors: polling again after a pause
  OfferFn onOffer_;
  std::vector<std::unique_ptr<Pending>> pending_;
};

// The connecting side: hands `up` and `down` with `token` to the lane socket at `path`
// (a unix connect and one message; an error says why, e.g. no such socket on this host).
Status offerLane(const std::string& path, const std::string& token, const UniqueFd& up, const UniqueFd& down);

// The connecting side's whole hand-over: two new memfds of `bytes`, mapped, handed to
// the lane socket at `path` with `token`. `up` is what this side sends through.
struct HandedLane {
  std::shared_ptr<LaneMapping> up, down;
};
Result<HandedLane> handOverLane(const std::string& path, const std::string& token, size_t bytes = kLaneBytes);

// A new random token.
std::string newLaneToken();

}  // namespace raccel::transport
