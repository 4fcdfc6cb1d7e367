#include "vmfrontend/guestd.h"

#include <sys/stat.h>

#include "common/log.h"
#include "schema/frame.capnp.h"
#include "schema/guest.capnp.h"

namespace raccel::guestd {

using transport::Body;
using transport::Connection;
using transport::ConnectionPtr;
using transport::FrameHeader;

Guestd::Guestd(uv_loop_t* loop, GuestdConfig config) : loop_(loop), config_(std::move(config)) {}

Status Guestd::start() {
  auto address = transport::parseAddress("unix:" + config_.listen);
  if (!address) return fail(address.error());
  auto listener = transport::Listener::listen(loop_, *address, wire::DEFAULT_MAX_FRAME_BYTES,
                                              [this](ConnectionPtr c) { acceptClient(std::move(c)); }, 0666);
  if (!listener) return fail(listener.error());
  listener_ = std::move(*listener);
  retry_ = new uv_timer_t;
  uv_timer_init(loop_, retry_);
  retry_->data = this;
  RLOG_INFO("guestd") << "programs connect to " << config_.listen << "; port " << config_.port;
  openPort();
  return {};
}

void Guestd::stop() {
  stopping_ = true;
  listener_.reset();
  if (retry_) {
    uv_close(reinterpret_cast<uv_handle_t*>(retry_), [](uv_handle_t* h) { delete reinterpret_cast<uv_timer_t*>(h); });
    retry_ = nullptr;
  }
  if (port_) port_->close();
  std::vector<ConnectionPtr> all;
  for (auto& [ch, c] : clients_) all.push_back(c->connection);
  for (auto& c : all) c->close();
}

void Guestd::retryLater() {
  if (stopping_) return;
  uv_timer_start(retry_, [](uv_timer_t* t) { static_cast<Guestd*>(t->data)->openPort(); }, backoffMs_, 0);
  backoffMs_ = std::min(backoffMs_ * 2, config_.maxBackoffMs);
}

void Guestd::openPort() {
  if (stopping_ || port_) return;
  struct stat st;
  bool isSocket = ::stat(config_.port.c_str(), &st) == 0 && S_ISSOCK(st.st_mode);
  if (isSocket) {
    auto address = transport::parseAddress("unix:" + config_.port);
    transport::connect(loop_, *address, wire::DEFAULT_MAX_FRAME_BYTES, [this](Result<ConnectionPtr> r) {
      if (stopping_) {
        if (r) (*r)->close();
        return;
      }
      if (!r) {
        if (!warnedAbsent_) RLOG_WARN("guestd") << "host side not there yet (" << r.error().message << "); waiting";
        warnedAbsent_ = true;
        retryLater();
        return;
      }
      portUp(*r);
    });
    return;
  }
  auto device = transport::openDevice(loop_, config_.port, wire::DEFAULT_MAX_FRAME_BYTES);
  if (!device) {
    if (!warnedAbsent_) RLOG_WARN("guestd") << device.error().message << "; waiting";
    warnedAbsent_ = true;
    retryLater();
    return;
  }
  portUp(*device);
}

void Guestd::portUp(ConnectionPtr port) {
  port_ = std::move(port);
  Connection::Callbacks cb;
  cb.onFrame = [this](Connection&, const FrameHeader& h, Body body) { onPortFrame(h, std::move(body)); };
  cb.onOversized = [](Connection&, const FrameHeader& h) {
    RLOG_ERROR("guestd") << "host sent a frame of " << h.length << " bytes on channel " << h.channel << "; skipped";
  };
  cb.onClose = [this](Connection&, bool) { portDown(); };
  port_->setCallbacks(cb);
  port_->start();
  backoffMs_ = 50;
  warnedAbsent_ = false;
  RLOG_INFO("guestd") << "port " << config_.port << " is up";
  for (auto& [ch, c] : clients_) c->connection->resumeReading();
}

void Guestd::portDown() {
  port_.reset();
  if (stopping_) return;
  // A character device reports EOF/HUP while the host side is absent: that is "not
  // connected yet", not an error. Sessions that were running are gone with the link.
  std::vector<ConnectionPtr> drop;
  for (auto& [ch, c] : clients_) {
    if (c->sentAnything) drop.push_back(c->connection);
    else c->connection->pauseReading();
  }
  if (!drop.empty()) RLOG_WARN("guestd") << "port went down; disconnecting " << drop.size() << " program(s)";
  for (auto& c : drop) c->close();
  retryLater();
}

void Guestd::acceptClient(ConnectionPtr connection) {
  auto client = std::make_unique<Client>();
  client->connection = connection;
  uint32_t channel = nextChannel_++;
  if (nextChannel_ == 0) nextChannel_ = 1;
  client->channel = channel;
  Client* raw = client.get();
  Connection::Callbacks cb;
  cb.onFrame = [this, raw](Connection&, const FrameHeader& h, Body body) { onClientFrame(*raw, h, std::move(body)); };
  cb.onOversized = [raw](Connection& c, const FrameHeader& h) {
    // A protocol error: tell the program why, then close its channel (its session ends).
    std::string why = "frame of " + std::to_string(h.length) + " bytes exceeds the maximum of " +
                      std::to_string(c.maxFrameBytes()) + " bytes; write large data in chunks. This session is closed";
    RLOG_WARN("guestd") << "program on channel " << raw->channel << ": " << why;
    capnp::MallocMessageBuilder m;
    auto e = m.initRoot<wire::Reply>().initError();
    e.setSequence(h.sequence);
    auto error = e.initError();
    error.setCode(wire::ErrorCode::INVALID_ARGUMENT);
    error.setMessage(why);
    c.send(raw->localChannel, h.sequence, m);
    c.pauseReading();
    uv_timer_t* linger = new uv_timer_t;
    uv_timer_init(uv_handle_get_loop(reinterpret_cast<uv_handle_t*>(c.stream())), linger);
    linger->data = new std::weak_ptr<Connection>(c.shared_from_this());
    uv_timer_start(linger, [](uv_timer_t* t) {
      auto* weak = static_cast<std::weak_ptr<Connection>*>(t->data);
      if (auto conn = weak->lock()) conn->close();  // after the error has been written
      delete weak;
      uv_close(reinterpret_cast<uv_handle_t*>(t), [](uv_handle_t* h) { delete reinterpret_cast<uv_timer_t*>(h); });
    }, 100, 0);
  };
  cb.onClose = [this, raw](Connection&, bool) { clientGone(*raw); };
  connection->setCallbacks(cb);
  clients_[channel] = std::move(client);
  connection->start();
  if (!port_) connection->pauseReading();
}

void Guestd::onClientFrame(Client& client, const FrameHeader& h, Body body) {
  if (!port_) return;  // cannot happen: reading is paused while the port is down
  client.localChannel = h.channel;
  client.sentAnything = true;
  port_->sendBody(client.channel, h.sequence, std::move(body));
  port_->throttle(*client.connection);
}

void Guestd::onPortFrame(const FrameHeader& h, Body body) {
  if (h.channel == transport::kControlChannel) {
    auto status = transport::decodeGuard([&] {
      transport::MessageIn in(std::move(body));
      auto control = in.root<wire::LinkControl>();
      if (control.which() != wire::LinkControl::CHANNEL_CLOSED) return;
      auto closed = control.getChannelClosed();
      auto it = clients_.find(closed.getChannel());
      if (it == clients_.end()) return;
      RLOG_INFO("guestd") << "host closed channel " << closed.getChannel() << ": " << closed.getReason().getMessage().cStr();
      it->second->connection->close();
    });
    if (!status) RLOG_WARN("guestd") << "bad control frame from the host: " << status.error().message;
    return;
  }
  auto it = clients_.find(h.channel);
  if (it == clients_.end()) return;  // the program left; its late replies go nowhere
  Client& client = *it->second;
  client.connection->sendBody(client.localChannel, h.sequence, std::move(body));
  client.connection->throttle(*port_);
}

void Guestd::clientGone(Client& client) {
  uint32_t channel = client.channel;
  if (port_ && client.sentAnything) {
    capnp::MallocMessageBuilder m;
    auto closed = m.initRoot<wire::LinkControl>().initChannelClosed();
    closed.setChannel(channel);
    closed.initReason().setMessage("the program disconnected");
    port_->send(transport::kControlChannel, 0, m);
  }
  clients_.erase(channel);
}

}  // namespace raccel::guestd
