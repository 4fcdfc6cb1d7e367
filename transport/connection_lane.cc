// Connection's same-host lanes (transport/lane.h): big frames through shared memory,
// descriptors and releases on the socket among the other frames.
#include <cstring>

#include "common/log.h"
#include "transport/connection.h"

namespace raccel::transport {

namespace {
// Release frames carry (offset, length) pairs; at most this many each.
constexpr size_t kReleasesPerFrame = 2048;
}  // namespace

void Connection::receiveLane(std::shared_ptr<LaneMapping> mapping, bool inPlace) {
  if (closing_) return;
  if (!lanes_) lanes_ = std::make_unique<LinkLanes>();
  LinkLanes& l = *lanes_;
  l.in = std::move(mapping);
  l.inPlace = inPlace;
  if (inPlace && !l.wake) {
    l.releases = std::make_shared<LaneReleases>();
    l.wake = new uv_async_t;
    uv_async_init(handle_.handle.loop, l.wake, [](uv_async_t* a) {
      auto* c = static_cast<Connection*>(a->data);
      if (c->lanes_ && c->lanes_->releases) c->sendLaneReleases(c->lanes_->releases->take());
    });
    l.wake->data = this;
    l.releases->setWake(l.wake);
  }
}

void Connection::sendLane(std::shared_ptr<LaneMapping> mapping) {
  if (closing_) return;
  if (!lanes_) lanes_ = std::make_unique<LinkLanes>();
  lanes_->out = std::make_shared<LaneOut>(std::move(mapping));
}

uint64_t Connection::laneFramesSent() const { return lanes_ ? lanes_->framesSent : 0; }
uint64_t Connection::laneFramesReceived() const { return lanes_ ? lanes_->framesReceived : 0; }

void Connection::closeLanes() {
  if (!lanes_) return;
  if (lanes_->releases) lanes_->releases->setWake(nullptr);  // views dropped later go nowhere
  if (lanes_->wake)
    uv_close(reinterpret_cast<uv_handle_t*>(lanes_->wake), [](uv_handle_t* h) { delete reinterpret_cast<uv_async_t*>(h); });
  lanes_->wake = nullptr;
  lanes_->out.reset();  // the mapping goes; the peer's views of it are its own
}

std::shared_ptr<LaneOut> Connection::outLane() const { return lanes_ ? lanes_->out : nullptr; }

bool Connection::sendThroughLane(uint32_t channel, uint64_t sequence, const Body& body) {
  if (!lanes_ || !lanes_->out || channel >= kFirstReservedChannel) return false;
  auto at = lanes_->out->claim(body);  // built in the lane (LaneOut::buildIn): nothing to copy
  if (!at) {
    if (body.size() < kLaneMinFrameBytes) return false;
    at = lanes_->out->reserve(body.size());
    if (!at) return false;  // full: this one goes by the socket
    std::memcpy(lanes_->out->at(*at), body.data(), body.size());
  }
  std::byte d[kLaneDescriptorBytes];
  putLe<uint32_t>(d, channel);
  putLe<uint32_t>(d + 4, static_cast<uint32_t>(body.size()));
  putLe<uint64_t>(d + 8, *at);
  queueSmall(kLaneFrameChannel, sequence, d, sizeof d);
  ++lanes_->framesSent;
  moved_ += body.size();
  return true;
}

void Connection::sendLaneReleases(const std::vector<std::pair<uint64_t, uint64_t>>& released) {
  if (closing_) return;
  std::byte pairs[kReleasesPerFrame * 16];
  for (size_t i = 0; i < released.size(); i += kReleasesPerFrame) {
    size_t n = std::min(kReleasesPerFrame, released.size() - i);
    for (size_t k = 0; k < n; ++k) {
      putLe<uint64_t>(pairs + 16 * k, released[i + k].first);
      putLe<uint64_t>(pairs + 16 * k + 8, released[i + k].second);
    }
    queueSmall(kLaneReleaseChannel, 0, pairs, 16 * n);
  }
  if (!released.empty()) flush();
}

void Connection::laneViolation(const std::string& what) {
  RLOG_ERROR("transport") << peer_ << " broke the same-host lane's rules (" << what << "); closing the link";
  close();
}

void Connection::onLaneFrame(const FrameHeader& header, Body body) {
  LinkLanes& l = *lanes_;
  if (header.channel == kLaneReleaseChannel && l.out) {
    if (body.size() % 16 != 0) return laneViolation("a release of " + std::to_string(body.size()) + " bytes");
    for (size_t i = 0; i < body.size(); i += 16)
      if (!l.out->release(getLe<uint64_t>(body.data() + i), getLe<uint64_t>(body.data() + i + 8)))
        return laneViolation("it gave back space that holds no frame sent to it");
    return;
  }
  if (header.channel != kLaneFrameChannel || !l.in)
    return laneViolation("a frame on reserved channel " + std::to_string(header.channel));
  if (body.size() != kLaneDescriptorBytes) return laneViolation("a descriptor of " + std::to_string(body.size()) + " bytes");
  const uint32_t channel = getLe<uint32_t>(body.data());
  const uint32_t length = getLe<uint32_t>(body.data() + 4);
  const uint64_t offset = getLe<uint64_t>(body.data() + 8);
  const uint64_t size = l.in->size();
  if (channel >= kFirstReservedChannel || length == 0 || offset % 8 != 0 || offset > size || length > size - offset)
    return laneViolation("a descriptor of " + std::to_string(length) + " bytes at " + std::to_string(offset) + " on channel " +
                         std::to_string(channel) + " (the lane has " + std::to_string(size) + ")");
  ++l.framesReceived;
  moved_ += length;
  const FrameHeader frame{channel, length, header.sequence};
  if (length > reader_.maxFrameBytes()) {
    sendLaneReleases({{offset, length}});
    if (callbacks_.onOversized) callbacks_.onOversized(*this, frame);
    return;
  }
  Body bytes;
  if (l.inPlace) {
    bytes = Body::external(l.in->data() + offset, length, [releases = l.releases, keep = l.in, offset, length] {
      releases->give(offset, length);
    });
  } else {
    // The peer may still write to its memory: what is decoded is our own copy.
    bytes = Body(length);
    std::memcpy(bytes.data(), l.in->data() + offset, length);
    sendLaneReleases({{offset, length}});
  }
  if (callbacks_.onFrame) callbacks_.onFrame(*this, frame, std::move(bytes));
}

}  // namespace raccel::transport
