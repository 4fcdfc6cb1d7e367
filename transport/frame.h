// Framing for every raccel link: a 16-byte header (schema/frame.capnp documents it)
// followed by a Cap'n Proto message in stream encoding. Pure functions and value
// types; usable from any thread.
#pragma once

#include <capnp/message.h>
#include <capnp/serialize.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "common/error.h"

namespace raccel::transport {

constexpr size_t kHeaderBytes = 16;
constexpr uint32_t kControlChannel = 0;

struct FrameHeader {
  uint32_t channel = 0;
  uint32_t length = 0;  // body bytes
  uint64_t sequence = 0;
};

// Little-endian integers, as every header and descriptor on a link carries them.
template <class T>
void putLe(std::byte* out, T value) {
  for (size_t i = 0; i < sizeof(T); ++i) out[i] = static_cast<std::byte>((value >> (8 * i)) & 0xff);
}
template <class T>
T getLe(const std::byte* in) {
  T value = 0;
  for (size_t i = 0; i < sizeof(T); ++i) value |= static_cast<T>(std::to_integer<uint8_t>(in[i])) << (8 * i);
  return value;
}

void encodeHeader(const FrameHeader& header, std::byte* out);
FrameHeader decodeHeader(const std::byte* in);

// An owned, 8-byte-aligned frame body (Cap'n Proto needs word alignment). Storage of
// large bodies is recycled through a process-wide pool (any thread), so streaming
// megabyte frames does not pay fresh pages (mmap, faults, zeroing) for every frame.
class Body {
 public:
  Body() = default;
  explicit Body(size_t bytes);
  ~Body();
  Body(Body&& other) noexcept
      : words_(other.words_), capacityWords_(other.capacityWords_), bytes_(other.bytes_), shared_(other.shared_) {
    other.words_ = nullptr;
    other.capacityWords_ = other.bytes_ = 0;
    other.shared_ = nullptr;
  }
  Body& operator=(Body&& other) noexcept;
  Body(const Body&) = delete;
  Body& operator=(const Body&) = delete;

  std::byte* data() { return reinterpret_cast<std::byte*>(words_); }
  const std::byte* data() const { return reinterpret_cast<const std::byte*>(words_); }
  size_t size() const { return bytes_; }
  // Drops trailing bytes (a body built in place that came out smaller than reserved).
  void shrink(size_t bytes) { bytes_ = bytes < bytes_ ? bytes : bytes_; }
  kj::ArrayPtr<const capnp::word> words() const { return {words_, bytes_ / sizeof(capnp::word)}; }
  // Another owner of the same bytes, without copying them (a relay that keeps what it
  // forwards). The storage goes when its last owner does; no owner may write to it after.
  Body share();
  // A body over memory someone else owns (a lane's shared memory): `onLast` runs instead
  // of freeing it, on whichever thread drops the last owner. `data` is 8-byte aligned.
  static Body external(std::byte* data, size_t bytes, std::function<void()> onLast);

 private:
  struct Owners {
    std::atomic<uint32_t> count{1};
    std::function<void()> onLast;  // set: the storage is external
  };
  void release();
  capnp::word* words_ = nullptr;
  size_t capacityWords_ = 0;
  size_t bytes_ = 0;
  Owners* shared_ = nullptr;  // the owners' count, once shared or external (any thread)
};

// Bytes of the stream encoding of `message` (segment table + segments).
size_t encodedSize(capnp::MessageBuilder& message);
// Appends header + encoded message to `out`.
void appendFrame(std::vector<std::byte>& out, uint32_t channel, uint64_t sequence, capnp::MessageBuilder& message);
// Encodes a message into an owned body (for zero-copy sends of large messages).
Body encodeBody(capnp::MessageBuilder& message);
// A copy of a body (a relay that must be able to send it again).
Body copyBody(const Body& body);

// Builds a single-segment message in place inside a Body: no copy between building and
// sending. The reservation is zeroed first (no stale memory can leak into a reply) and
// must hold the whole message (building past it throws); finish() trims the rest.
//
// A message that is mostly one blob its maker fills whole (a read's data) need not pay
// for zeroing the blob: with `zeroHeadOnly`, only the first kHeadWords are zeroed, the
// message's structs must be built there, and fillsBlob() names the blob once it is
// initialised; everything else of the reservation is zeroed then. The maker must write
// every byte of the blob, or drop the message.
class InPlaceMessage {
 public:
  static constexpr size_t kHeadWords = 64;
  explicit InPlaceMessage(size_t reserveWords, bool zeroHeadOnly = false);
  // The same in `storage` (a body built where it will be sent from, e.g. a lane's).
  InPlaceMessage(Body storage, bool zeroHeadOnly);
  capnp::MessageBuilder& builder() { return *builder_; }
  void fillsBlob(const capnp::byte* blob, size_t bytes);
  Body finish();

 private:
  Body body_;
  size_t zeroedBytes_;  // of body_, from its start
  std::optional<capnp::FlatMessageBuilder> builder_;
};

// A decoded message over a body it owns. Decoding problems surface as kj::Exception
// when fields are read; callers catch them at their frame boundary (see decodeGuard).
class MessageIn {
 public:
  explicit MessageIn(Body body);
  template <class Root>
  typename Root::Reader root() { return reader_->getRoot<Root>(); }
  const Body& body() const { return body_; }

 private:
  Body body_;
  std::optional<capnp::FlatArrayMessageReader> reader_;
};

// A decoded view of a body owned by someone else (relays peek, then forward the bytes).
class MessageView {
 public:
  explicit MessageView(const Body& body);
  template <class Root>
  typename Root::Reader root() { return reader_.getRoot<Root>(); }

 private:
  capnp::FlatArrayMessageReader reader_;
};

// Runs `fn`, turning Cap'n Proto decoding exceptions (malformed input from a peer)
// into an invalidArgument error. The only place such exceptions are caught.
template <class Fn>
Status decodeGuard(Fn&& fn) {
  try {
    fn();
    return {};
  } catch (const kj::Exception& e) {
    return fail(Code::invalidArgument, std::string("malformed message: ") + e.getDescription().cStr());
  }
}

// Incremental frame parser over a byte stream. Small frames are staged and copied
// into their own Body; a frame of kDirectBytes or more is read straight into its Body.
// A frame longer than the maximum is skipped without buffering and reported.
class FrameReader {
 public:
  static constexpr size_t kDirectBytes = 64 * 1024;
  // The staging buffer for small frames: none while idle, from kMinStageBytes up to
  // kMaxStageBytes while reads keep filling it, released once drained between bursts.
  static constexpr size_t kMinStageBytes = 4 * 1024;
  static constexpr size_t kMaxStageBytes = 256 * 1024;

  struct Sink {
    virtual ~Sink() = default;
    virtual void onFrame(const FrameHeader& header, Body body) = 0;
    virtual void onOversized(const FrameHeader& header) = 0;
  };

  explicit FrameReader(uint32_t maxFrameBytes);

  void setMaxFrameBytes(uint32_t bytes) { maxFrameBytes_ = bytes; }
  uint32_t maxFrameBytes() const { return maxFrameBytes_; }
  // Where the next bytes from the stream must be put (never empty).
  std::span<std::byte> writable();
  // `n` bytes were placed at writable(); emits the frames they complete.
  void commit(size_t n, Sink& sink);
  // True when a frame is partly received (EOF now means a truncated frame).
  bool midFrame() const;
  // Bytes of staging buffer held now (what an idle peer costs).
  size_t stagedCapacity() const { return stage_.capacity(); }

 private:
  void parseStaged(Sink& sink);
  uint32_t maxFrameBytes_;
  std::vector<std::byte> stage_;
  size_t begin_ = 0, end_ = 0;
  // Direct mode: the current large frame's body being filled.
  std::optional<FrameHeader> directHeader_;
  Body direct_;
  size_t directFilled_ = 0;
  uint64_t skipRemaining_ = 0;
  // After a large frame, the next header is read alone: if it starts another large
  // frame, its body then goes straight into its own Body instead of through the stage.
  bool headerAlone_ = false;
  size_t offered_ = 0;          // bytes writable() last offered
  bool lastReadFilled_ = false;  // the last read filled them: more is probably waiting
};

}  // namespace raccel::transport
