#include "transport/frame.h"

#include <algorithm>
#include <mutex>
#include <stdexcept>
#include <unordered_map>

namespace raccel::transport {
namespace {
size_t segmentTableBytes(size_t segments) { return ((segments + 1) * 4 + 7) & ~size_t{7}; }
}  // namespace

void encodeHeader(const FrameHeader& header, std::byte* out) {
  putLe<uint32_t>(out, header.channel);
  putLe<uint32_t>(out + 4, header.length);
  putLe<uint64_t>(out + 8, header.sequence);
}

FrameHeader decodeHeader(const std::byte* in) {
  return FrameHeader{getLe<uint32_t>(in), getLe<uint32_t>(in + 4), getLe<uint64_t>(in + 8)};
}

namespace {
// Recycles the storage of large bodies. Size classes are multiples of 64 KiB; at most
// kCachedBytes are kept.
class BodyPool {
 public:
  static constexpr size_t kPooledBytes = 64 * 1024;
  static constexpr size_t kCachedBytes = 64 * 1024 * 1024;
  static size_t classWords(size_t bytes) {
    size_t rounded = (bytes + kPooledBytes - 1) / kPooledBytes * kPooledBytes;
    return rounded / sizeof(capnp::word);
  }
  capnp::word* take(size_t words) {
    {
      std::lock_guard lock(mu_);
      auto it = free_.find(words);
      if (it != free_.end() && !it->second.empty()) {
        capnp::word* p = it->second.back();
        it->second.pop_back();
        cached_ -= words * sizeof(capnp::word);
        return p;
      }
    }
    return new capnp::word[words];
  }
  void give(capnp::word* p, size_t words) {
    {
      std::lock_guard lock(mu_);
      if (cached_ + words * sizeof(capnp::word) <= kCachedBytes) {
        free_[words].push_back(p);
        cached_ += words * sizeof(capnp::word);
        return;
      }
    }
    delete[] p;
  }

 private:
  std::mutex mu_;
  std::unordered_map<size_t, std::vector<capnp::word*>> free_;
  size_t cached_ = 0;
};

BodyPool& bodyPool() {
  static BodyPool* pool = new BodyPool();  // never destroyed: bodies may outlive statics
  return *pool;
}
}  // namespace

Body::Body(size_t bytes) : bytes_(bytes) {
  if (bytes >= BodyPool::kPooledBytes) {
    capacityWords_ = BodyPool::classWords(bytes);
    words_ = bodyPool().take(capacityWords_);
  } else {
    capacityWords_ = (bytes + 7) / 8;
    words_ = new capnp::word[capacityWords_ ? capacityWords_ : 1];
  }
}

Body::~Body() { release(); }

void Body::release() {
  if (!words_) return;
  if (shared_) {
    if (shared_->count.fetch_sub(1, std::memory_order_acq_rel) != 1) return;  // another owner keeps it
    auto onLast = std::move(shared_->onLast);
    delete shared_;
    shared_ = nullptr;
    if (onLast) {
      onLast();
      return;
    }
  }
  if (capacityWords_ * sizeof(capnp::word) >= BodyPool::kPooledBytes) bodyPool().give(words_, capacityWords_);
  else delete[] words_;
}

Body Body::share() {
  Body other;
  if (!words_) return other;
  if (!shared_) shared_ = new Owners();
  shared_->count.fetch_add(1, std::memory_order_relaxed);
  other.words_ = words_;
  other.capacityWords_ = capacityWords_;
  other.bytes_ = bytes_;
  other.shared_ = shared_;
  return other;
}

Body Body::external(std::byte* data, size_t bytes, std::function<void()> onLast) {
  Body b;
  b.words_ = reinterpret_cast<capnp::word*>(data);
  b.bytes_ = bytes;  // capacityWords_ stays 0: never the pool's
  b.shared_ = new Owners();
  b.shared_->onLast = std::move(onLast);
  return b;
}

Body& Body::operator=(Body&& other) noexcept {
  if (this != &other) {
    release();
    words_ = other.words_;
    capacityWords_ = other.capacityWords_;
    bytes_ = other.bytes_;
    shared_ = other.shared_;
    other.words_ = nullptr;
    other.capacityWords_ = other.bytes_ = 0;
    other.shared_ = nullptr;
  }
  return *this;
}

size_t encodedSize(capnp::MessageBuilder& message) {
  auto segments = message.getSegmentsForOutput();
  size_t bytes = segmentTableBytes(segments.size());
  for (auto& s : segments) bytes += s.size() * sizeof(capnp::word);
  return bytes;
}

static void encodeInto(capnp::MessageBuilder& message, std::byte* out) {
  auto segments = message.getSegmentsForOutput();
  size_t table = segmentTableBytes(segments.size());
  std::memset(out, 0, table);
  putLe<uint32_t>(out, static_cast<uint32_t>(segments.size() - 1));
  for (size_t i = 0; i < segments.size(); ++i) putLe<uint32_t>(out + 4 + 4 * i, static_cast<uint32_t>(segments[i].size()));
  std::byte* p = out + table;
  for (auto& s : segments) {
    size_t n = s.size() * sizeof(capnp::word);
    std::memcpy(p, s.begin(), n);
    p += n;
  }
}

void appendFrame(std::vector<std::byte>& out, uint32_t channel, uint64_t sequence, capnp::MessageBuilder& message) {
  size_t size = encodedSize(message);
  size_t at = out.size();
  out.resize(at + kHeaderBytes + size);
  encodeHeader(FrameHeader{channel, static_cast<uint32_t>(size), sequence}, out.data() + at);
  encodeInto(message, out.data() + at + kHeaderBytes);
}

Body copyBody(const Body& body) {
  Body out(body.size());
  if (body.size()) std::memcpy(out.data(), body.data(), body.size());
  return out;
}

Body encodeBody(capnp::MessageBuilder& message) {
  Body body(encodedSize(message));
  encodeInto(message, body.data());
  return body;
}

InPlaceMessage::InPlaceMessage(size_t reserveWords, bool zeroHeadOnly) : InPlaceMessage(Body(8 + reserveWords * 8), zeroHeadOnly) {}

InPlaceMessage::InPlaceMessage(Body storage, bool zeroHeadOnly) : body_(std::move(storage)) {
  const size_t words = body_.size() / 8 - 1;  // after the segment table
  zeroedBytes_ = zeroHeadOnly ? std::min(body_.size(), 8 + kHeadWords * 8) : body_.size();
  std::memset(body_.data(), 0, zeroedBytes_);
  builder_.emplace(kj::arrayPtr(reinterpret_cast<capnp::word*>(body_.data() + 8), words));
}

void InPlaceMessage::fillsBlob(const capnp::byte* blob, size_t bytes) {
  auto* begin = reinterpret_cast<const std::byte*>(blob);
  const size_t at = static_cast<size_t>(begin - body_.data());
  // The structs must have stayed in the zeroed head, and the blob inside the reservation.
  if (begin < body_.data() || at < 8 || at > zeroedBytes_ || bytes > body_.size() - at)
    throw std::logic_error("InPlaceMessage: a blob outside the reservation, or structs past the zeroed head");
  std::memset(body_.data() + at + bytes, 0, body_.size() - at - bytes);  // its padding and the rest
  zeroedBytes_ = body_.size();
}

Body InPlaceMessage::finish() {
  if (zeroedBytes_ < body_.size()) throw std::logic_error("InPlaceMessage: finished without fillsBlob()");
  auto segments = builder_->getSegmentsForOutput();
  putLe<uint32_t>(body_.data(), 0);
  putLe<uint32_t>(body_.data() + 4, static_cast<uint32_t>(segments[0].size()));
  body_.shrink(8 + segments[0].size() * sizeof(capnp::word));
  builder_.reset();
  return std::move(body_);
}

static capnp::ReaderOptions readerOptions(const Body& body) {
  capnp::ReaderOptions options;
  options.traversalLimitInWords = std::max<uint64_t>(body.size() / 8 * 8, 1 << 20);
  options.nestingLimit = 32;
  return options;
}

MessageIn::MessageIn(Body body) : body_(std::move(body)) { reader_.emplace(body_.words(), readerOptions(body_)); }

MessageView::MessageView(const Body& body) : reader_(body.words(), readerOptions(body)) {}

FrameReader::FrameReader(uint32_t maxFrameBytes) : maxFrameBytes_(maxFrameBytes) {}

std::span<std::byte> FrameReader::writable() {
  if (directHeader_) return {direct_.data() + directFilled_, direct_.size() - directFilled_};
  // Room for the next read: the stage starts empty (an idle peer costs no buffer), and
  // grows while reads fill it or a staged frame needs more, up to kMaxStageBytes.
  size_t pending = end_ - begin_;
  size_t want = kMinStageBytes;
  if (pending >= kHeaderBytes) {
    FrameHeader header = decodeHeader(stage_.data() + begin_);
    if (header.length < kDirectBytes && header.length <= maxFrameBytes_) want = std::max(want, kHeaderBytes + header.length);
  }
  if (lastReadFilled_) want = std::max(want, std::min(kMaxStageBytes, 2 * stage_.size()));
  if (stage_.size() - end_ < want / 2 || stage_.size() < want) {
    if (begin_ > 0) {
      std::memmove(stage_.data(), stage_.data() + begin_, pending);
      end_ = pending;
      begin_ = 0;
    }
    if (stage_.size() < want) stage_.resize(want);
  }
  if (headerAlone_ && skipRemaining_ == 0 && pending < kHeaderBytes) {
    offered_ = kHeaderBytes - pending;
    return {stage_.data() + end_, offered_};
  }
  offered_ = stage_.size() - end_;
  return {stage_.data() + end_, offered_};
}

bool FrameReader::midFrame() const { return directHeader_.has_value() || end_ > begin_ || skipRemaining_ > 0; }

void FrameReader::commit(size_t n, Sink& sink) {
  if (directHeader_) {
    directFilled_ += n;
    if (directFilled_ == direct_.size()) {
      FrameHeader header = *directHeader_;
      directHeader_.reset();
      directFilled_ = 0;
      headerAlone_ = true;
      sink.onFrame(header, std::move(direct_));
    }
    return;
  }
  lastReadFilled_ = n == offered_ && !headerAlone_;
  end_ += n;
  parseStaged(sink);
  // Drained and not streaming: the stage goes back (it is allocated again on the next read).
  if (begin_ == end_ && !lastReadFilled_ && !stage_.empty()) std::vector<std::byte>().swap(stage_);
}

void FrameReader::parseStaged(Sink& sink) {
  for (;;) {
    if (skipRemaining_ > 0) {
      size_t drop = static_cast<size_t>(std::min<uint64_t>(skipRemaining_, end_ - begin_));
      begin_ += drop;
      skipRemaining_ -= drop;
      if (skipRemaining_ > 0) break;
    }
    if (end_ - begin_ < kHeaderBytes) break;
    FrameHeader header = decodeHeader(stage_.data() + begin_);
    headerAlone_ = header.length >= kDirectBytes;
    if (header.length > maxFrameBytes_) {
      begin_ += kHeaderBytes;
      skipRemaining_ = header.length;
      sink.onOversized(header);
      continue;
    }
    size_t available = end_ - begin_ - kHeaderBytes;
    if (header.length >= kDirectBytes) {
      begin_ += kHeaderBytes;
      direct_ = Body(header.length);
      size_t have = std::min<size_t>(available, header.length);
      std::memcpy(direct_.data(), stage_.data() + begin_, have);
      begin_ += have;
      directFilled_ = have;
      if (have == header.length) {
        sink.onFrame(header, std::move(direct_));
        directFilled_ = 0;
        continue;
      }
      directHeader_ = header;
      break;
    }
    if (available < header.length) break;
    Body body(header.length);
    std::memcpy(body.data(), stage_.data() + begin_ + kHeaderBytes, header.length);
    begin_ += kHeaderBytes + header.length;
    sink.onFrame(header, std::move(body));
  }
  if (begin_ == end_) begin_ = end_ = 0;
}

}  // namespace raccel::transport
