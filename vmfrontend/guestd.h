// raccel-guestd: owns the VM's virtio-serial port (a character device, or in tests the
// unix socket that stands for it) and multiplexes local guest programs onto it, one
// channel each. Runs on one libuv loop thread.
//
// While the host side is absent (the device reports EOF/HUP, or the socket refuses),
// it retries with backoff and holds local programs' frames (their reading is paused)
// until the port is up. When the port drops, programs with a session are disconnected
// (their sessions ended with the link); programs that had not yet been admitted keep
// waiting.
#pragma once

#include <uv.h>

#include <memory>
#include <string>
#include <unordered_map>

#include "transport/connection.h"

namespace raccel::guestd {

struct GuestdConfig {
  std::string port;                             // character device or unix socket path
  std::string listen = "/run/raccel/guestd.sock";
  unsigned maxBackoffMs = 2000;
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
  };
  void openPort();
  void portUp(transport::ConnectionPtr port);
  void portDown();
  void retryLater();
  void acceptClient(transport::ConnectionPtr connection);
  void onClientFrame(Client& client, const transport::FrameHeader& header, transport::Body body);
  void onPortFrame(const transport::FrameHeader& header, transport::Body body);
  void clientGone(Client& client);

  uv_loop_t* loop_;
  GuestdConfig config_;
  std::unique_ptr<transport::Listener> listener_;
  transport::ConnectionPtr port_;
  std::unordered_map<uint32_t, std::unique_ptr<Client>> clients_;  // by port channel
  uint32_t nextChannel_ = 1;
  unsigned backoffMs_ = 50;
  uv_timer_t* retry_ = nullptr;
  bool stopping_ = false;
  bool warnedAbsent_ = false;
};

}  // namespace raccel::guestd
