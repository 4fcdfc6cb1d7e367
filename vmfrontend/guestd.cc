#include "vmfrontend/guestd.h"

#include <sys/stat.h>

#include <algorithm>

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
  reaper_ = new uv_timer_t;
  uv_timer_init(loop_, reaper_);
  reaper_->data = this;
  uv_timer_start(reaper_, [](uv_timer_t* t) { static_cast<Guestd*>(t->data)->reapHungUp(); }, 1000, 1000);
  RLOG_INFO("guestd") << "programs connect to " << config_.listen << "; port " << config_.port;
  openPort();
  return {};
}

void Guestd::stop() {
  stopping_ = true;
  listener_.reset();
  for (uv_timer_t** timer : {&retry_, &reaper_}) {
    if (!*timer) continue;
    uv_close(reinterpret_cast<uv_handle_t*>(*timer), [](uv_handle_t* h) { delete reinterpret_cast<uv_timer_t*>(h); });
    *timer = nullptr;
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
  {
    // Speaks at once: the scheduler keeps a VM's links that have spoken over silent ones.
    capnp::MallocMessageBuilder ping;
    ping.initRoot<wire::LinkControl>().setPing();
    port_->send(transport::kControlChannel, 0, ping);
  }
  backoffMs_ = 50;
  warnedAbsent_ = false;
  RLOG_INFO("guestd") << "port " << config_.port << " is up";
  for (auto& [ch, c] : clients_) {
    if (c->welcomed) {
      reattach(*c);
      continue;
    }
    // Not admitted yet: its hello (and what followed) goes again, as new.
    for (auto& [seq, body] : c->unacked) port_->sendBody(c->channel, seq, transport::copyBody(body));
    if (!c->heldBack) c->connection->resumeReading();
  }
}

void Guestd::reattach(Client& c) {
  capnp::MallocMessageBuilder m;
  auto hello = m.initRoot<wire::Instruction>().initHello();
  hello.setVersionMajor(wire::PROTOCOL_MAJOR);
  hello.setVersionMinor(wire::PROTOCOL_MINOR);
  auto resume = hello.initResume();
  resume.setVaccel(c.vaccel);
  resume.setToken(c.token);
  c.resuming = true;
  port_->send(c.channel, c.helloSequence, m);
  RLOG_INFO("guestd") << "re-attaching vaccel #" << c.vaccel << " (channel " << c.channel << ", " << c.unacked.size()
                      << " unacknowledged frame(s))";
}

void Guestd::portDown() {
  port_.reset();
  if (stopping_) return;
  // A character device reports EOF/HUP while the host side is absent: that is "not
  // connected yet", not an error. Programs wait (reading paused) and carry on when the
  // scheduler is back: their sessions re-attach then.
  size_t waiting = 0;
  for (auto& [ch, c] : clients_) {
    c->connection->pauseReading();
    c->resuming = false;
    c->fenceOut = 0;  // its reply is lost with the link; the resend fences again if needed
    waiting += c->sentAnything;
  }
  if (waiting) RLOG_WARN("guestd") << "port went down; " << waiting << " program(s) wait for the scheduler";
  retryLater();
}

// A read, a fence or a description of the vaccel: instructions that change nothing and answer.
bool Guestd::answers(const Body& frame) {
  bool yes = false;
  transport::decodeGuard([&] {
    transport::MessageView in(frame);
    auto which = in.root<wire::Instruction>().which();
    yes = which == wire::Instruction::READ || which == wire::Instruction::FENCE || which == wire::Instruction::DESCRIBE_VACCEL;
  });
  return yes;
}

void Guestd::keep(Client& c, uint64_t sequence, Body body) {
  c.unackedBytes += body.size();
  c.unacked.emplace_back(sequence, std::move(body));
  if (c.unackedBytes > config_.replayBytes && !c.fenceOut && port_) {
    // Nothing acknowledged for a while (a stream without reads or fences): a fence of
    // guestd's own lets it drop what the vaccel has taken.
    capnp::MallocMessageBuilder m;
    m.initRoot<wire::Instruction>().setFence();
    c.fenceOut = nextFence_++;
    Body fence = transport::encodeBody(m);
    c.unacked.emplace_back(c.fenceOut, transport::copyBody(fence));
    c.unackedBytes += fence.size();  // acknowledge() takes every entry's bytes off again
    port_->sendBody(c.channel, c.fenceOut, std::move(fence));
  }
  if (c.unackedBytes > 4 * config_.replayBytes && !c.heldBack) {
    RLOG_DEBUG("guestd") << "channel " << c.channel << ": " << c.unackedBytes
                         << " bytes not yet acknowledged by its vaccel; its program's reading waits";
    c.heldBack = true;
    c.connection->pauseReading();
  }
}

void Guestd::acknowledge(Client& c, uint64_t sequence) {
  auto it = std::find_if(c.unacked.begin(), c.unacked.end(), [&](auto& e) { return e.first == sequence; });
  if (it == c.unacked.end()) return;
  for (auto e = c.unacked.begin(); e != std::next(it); ++e) c.unackedBytes -= e->second.size();
  c.unacked.erase(c.unacked.begin(), std::next(it));
  if (c.heldBack && c.unackedBytes <= 2 * config_.replayBytes && !c.resuming && port_) {
    c.heldBack = false;
    c.connection->resumeReading();
  }
}

bool Guestd::ownReply(Client& c, const FrameHeader& h, const Body& body) {
  bool own = false;
  auto status = transport::decodeGuard([&] {
    transport::MessageView in(body);
    auto reply = in.root<wire::Reply>();
    switch (reply.which()) {
      case wire::Reply::WELCOME: {
        auto welcome = reply.getWelcome();
        if (c.resuming && h.sequence == c.helloSequence) {
          own = true;
          resume(c, welcome.getResumedAfter());
          return;
        }
        if (!c.welcomed) {
          c.welcomed = true;
          c.vaccel = welcome.getVaccel().getId();
          c.token = welcome.getToken();
          c.helloSequence = h.sequence;
          acknowledge(c, h.sequence);
        }
        return;
      }
      case wire::Reply::DATA:
      case wire::Reply::FENCED: {
        // (Scanned only after a resume: every reply passes here.)
        if (c.resumed &&
            std::none_of(c.unacked.begin(), c.unacked.end(), [&](auto& e) { return e.first == h.sequence; })) {
          own = true;  // a second answer to a read or fence resent after a restart
          return;
        }
        // The vaccel took everything up to this read (its last chunk) or fence, in order.
        if (reply.which() == wire::Reply::FENCED || reply.getData().getLast()) acknowledge(c, h.sequence);
        if (c.fenceOut && h.sequence == c.fenceOut) {
          c.fenceOut = 0;
          own = true;
        }
        return;
      }
      case wire::Reply::ERROR:
        own = failedOwn(c, h.sequence, reply.getError().getError().getMessage());
        return;
      default:
        return;
    }
  });
  if (!status) RLOG_WARN("guestd") << "bad reply from the host on channel " << h.channel << ": " << status.error().message;
  return own;
}

// The vaccel re-attached after instruction `after` (the scheduler came back): what came
// after it goes again, in order. Reads and fences it took last may have answered into
// the old scheduler: they go again too (nothing after them changed a buffer, so they
// answer the same; a reply that does arrive twice is dropped by ownReply).
void Guestd::resume(Client& c, uint64_t after) {
  c.resuming = false;
  auto it = std::find_if(c.unacked.begin(), c.unacked.end(), [&](auto& e) { return e.first == after; });
  auto from = c.unacked.begin();
  if (it != c.unacked.end()) {
    from = std::next(it);
    while (from != c.unacked.begin() && answers(std::prev(from)->second)) --from;
  }
  size_t resent = 0;
  for (auto e = from; e != c.unacked.end(); ++e, ++resent) port_->sendBody(c.channel, e->first, transport::copyBody(e->second));
  c.resumed = true;
  RLOG_INFO("guestd") << "vaccel #" << c.vaccel << " re-attached after instruction " << after << "; resent " << resent
                      << " frame(s)";
  if (!c.heldBack) c.connection->resumeReading();
}

// An error answering `sequence`: guestd's own when it refuses a re-attach (the program is
// disconnected) or answers guestd's fence. A refused hello leaves nothing to resend.
bool Guestd::failedOwn(Client& c, uint64_t sequence, capnp::Text::Reader message) {
  if (c.resuming && sequence == c.helloSequence) {
    RLOG_WARN("guestd") << "vaccel #" << c.vaccel << " cannot be re-attached (" << message.cStr()
                        << "); disconnecting its program";
    c.connection->close();
    return true;
  }
  if (!c.welcomed && !c.unacked.empty() && sequence == c.unacked.front().first) {
    c.unacked.clear();
    c.unackedBytes = 0;
  } else if (c.fenceOut && sequence == c.fenceOut) {
    c.fenceOut = 0;
    return true;
  }
  return false;
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
  if (h.sequence >= kGuestdSequences) {
    // Reserved for guestd's own fences: refused here, as the scheduler refuses its own range.
    capnp::MallocMessageBuilder m;
    auto e = m.initRoot<wire::Reply>().initError();
    e.setSequence(h.sequence);
    auto error = e.initError();
    error.setCode(wire::ErrorCode::INVALID_ARGUMENT);
    error.setMessage("sequence numbers from 2^62 up are reserved for raccel-guestd and the scheduler");
    client.connection->send(client.localChannel, h.sequence, m);
    return;
  }
  // A large frame is sent and kept without a copy, the two sharing its bytes until both
  // are done with them; a small one is copied for keeping (cheaper than sharing it).
  if (body.size() >= transport::FrameReader::kDirectBytes) {
    port_->sendBody(client.channel, h.sequence, body.share());
    keep(client, h.sequence, std::move(body));
  } else {
    keep(client, h.sequence, transport::copyBody(body));
    port_->sendBody(client.channel, h.sequence, std::move(body));
  }
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
  if (ownReply(client, h, body)) return;
  client.connection->sendBody(client.localChannel, h.sequence, std::move(body));
  client.connection->throttle(*port_);
}

void Guestd::reapHungUp() {
  // Only while the port is up: the scheduler is then told (a program that leaves while
  // the port is down is noticed when reading resumes, and its session told then).
  if (!port_) return;
  std::vector<ConnectionPtr> gone;
  for (auto& [ch, c] : clients_)
    if (c->connection->readingPaused() && c->connection->peerHungUp()) gone.push_back(c->connection);
  for (auto& c : gone) {
    RLOG_INFO("guestd") << "a program hung up while it waited; ending its session";
    c->close();
  }
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
