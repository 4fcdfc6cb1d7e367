// raccel-guestd: owns the VM's virtio-serial port (a character device, or in tests the
// unix socket that stands for it) and multiplexes local guest programs onto it, one
// channel each. Runs on one libuv loop thread.
//
// While the host side is absent (the device reports EOF/HUP, or the socket refuses),
// it retries with backoff and holds local programs' frames (their reading is paused)
// until the port is up.
//
// Surviving a scheduler restart (docs/ARCHITECTURE.md, "State that survives a restart"): guestd
// keeps a copy of each program's frames until a read or fence reply shows the vaccel
// took them (and fences on its own behalf when that copy grows past replayBytes). When
// the port drops, programs stay connected; when it is back, each admitted session is
// re-attached (hello with resume: its vaccel and the welcome's token) and the frames
// after the last instruction the vaccel took are resent, in order. A program not yet
// admitted sends its hello again. A resume the scheduler refuses (the vaccel ended)
// disconnects that program, with the reason in guestd's log.
#pragma once

#include <uv.h>

#include <deque>
#include <memory>
#include <string>
#include <unordered_map>

#include "transport/connection.h"

namespace raccel::guestd {

// Sequence numbers guestd uses for its own fences (schema/frame.capnp).
constexpr uint64_t kGuestdSequences = 1ull << 62;

struct GuestdConfig {
  std::string port;                             // character device or unix socket path
  std::string listen = "/run/raccel/guestd.sock";
  unsigned maxBackoffMs = 2000;
  // Unacknowledged bytes kept per program before guestd fences for it; a program that
  // keeps going past 4x this waits (reading paused) until its fence answers.
  size_t replayBytes = 64 << 20;
};

class Guestd {
 public:
  Guestd(uv_loop_t* loop, GuestdConfig config);
  Status start();
  void stop();

 private:
  struct Client {
    transport::ConnectionPtr connection;
    uint32_t channel = 0;       // on the port
    uint32_t localChannel = 1;  // what the program uses on its own socket
    bool sentAnything = false;
    // Its session, once welcomed: what re-attaches it.
    bool welcomed = false;
    uint64_t vaccel = 0, token = 0, helloSequence = 0;
    bool resuming = false;  // its resume hello is out; frames wait
    bool resumed = false;   // re-attached at least once: duplicate answers are possible
    // Frames sent that no reply has acknowledged yet, oldest first.
    std::deque<std::pair<uint64_t, transport::Body>> unacked;
    size_t unackedBytes = 0;
    uint64_t fenceOut = 0;  // guestd's own fence under way (its sequence), 0 = none
    bool heldBack = false;  // reading paused until acknowledged
  };
  void openPort();
  void portUp(transport::ConnectionPtr port);
  void portDown();
  void retryLater();
  void acceptClient(transport::ConnectionPtr connection);
  void onClientFrame(Client& client, const transport::FrameHeader& header, transport::Body body);
  void onPortFrame(const transport::FrameHeader& header, transport::Body body);
  void clientGone(Client& client);
  // Closes the programs that hung up while their reading was paused (no EOF is read
  // then), so their sessions end and release what they hold.
  void reapHungUp();
  void keep(Client& client, uint64_t sequence, transport::Body body);  // (shared with the frame sent)
  // Drops unacked frames up to and including the one with `sequence` (if there is one).
  void acknowledge(Client& client, uint64_t sequence);
  void reattach(Client& client);
  static bool answers(const transport::Body& frame);
  // The reply handled here (guestd's own fence, a resume's welcome): not the program's.
  bool ownReply(Client& client, const transport::FrameHeader& header, const transport::Body& body);
  void resume(Client& c, uint64_t after);  // its vaccel re-attached after instruction `after`
  bool failedOwn(Client& c, uint64_t sequence, capnp::Text::Reader message);  // an error of guestd's own

  uv_loop_t* loop_;
  GuestdConfig config_;
  std::unique_ptr<transport::Listener> listener_;
  transport::ConnectionPtr port_;
  std::unordered_map<uint32_t, std::unique_ptr<Client>> clients_;  // by port channel
  uint32_t nextChannel_ = 1;
  uint64_t nextFence_ = kGuestdSequences;
  unsigned backoffMs_ = 50;
  uv_timer_t* retry_ = nullptr;
  uv_timer_t* reaper_ = nullptr;  // reapHungUp() every second
  bool stopping_ = false;
  bool warnedAbsent_ = false;
};

}  // namespace raccel::guestd
