// Spin-then-block waits for a reply on a socket: libraccel's BlockingLink, and the
// bench's raw baseline (so that the floor is measured waiting the same way).
//
// A synchronous call crosses several processes, each woken by the one before. Where the
// woken thread's CPU was idle, the wake-up costs what waking that CPU costs: on a VM host
// that halts idle vCPUs, tens of microseconds a hop (docs/BENCHMARKS.md, wakeup_rtt_us).
// A client that polls its socket for a while before it sleeps keeps its CPU awake, so
// the reply finds it running (no wake-up for the last hop). Between two polls it yields,
// so a thread that is ready on the same CPU (a daemon with work left) runs first: the
// spin takes what would have been idle time, not the daemons'.
// The window is learnt from the waits seen, as a guest kernel's halt polling learns its
// own: waits that end within `most` keep it open, longer ones shrink it to nothing, so
// a program whose waits are long (a training step's sync) soon stops spinning.
#pragma once

#include <cstdint>

#include "common/error.h"

namespace raccel::transport {

// The most a wait spins, in nanoseconds (RACCEL_SPIN_US caps what a user may ask).
inline constexpr int64_t kMaxSpinNs = 1'000'000;
// Without RACCEL_SPIN_US, on a host of two or more CPUs: a round trip through guestd,
// the scheduler and a netaccel to a sandbox takes 100-400 µs on the development machine
// (2 vCPUs), and 300 µs left the slower ones sleeping, then shrank the window for all.
inline constexpr int64_t kDefaultSpinNs = 1'000'000;

// How long the next wait polls before it sleeps. A wait of at most `most` sets the window
// to twice its length if that is more (never above `most`); a longer wait halves it, and
// below 1 µs it is 0 (sleep at once) until a short wait sets it again.
class SpinWindow {
 public:
  explicit SpinWindow(int64_t mostNs = 0) : most_(mostNs > 0 ? mostNs : 0), window_(most_) {}
  int64_t ns() const { return window_; }
  int64_t most() const { return most_; }
  void saw(int64_t waitNs);

 private:
  int64_t most_, window_;
};

// Waits until `fd` is readable (or hung up, or in error) for up to timeoutMs (-1:
// forever): it first polls without sleeping for up to window.ns(), then sleeps in
// poll(). Returns poll()'s result (0: timed out; -1 with errno). The wait's length
// teaches the window.
int waitReadable(int fd, int timeoutMs, SpinWindow& window);

// The most a client's waits spin: RACCEL_SPIN_US (microseconds, 0 to 1000) when set,
// else kDefaultSpinNs with two or more CPUs online, else 0. invalidArgument, naming the
// variable, when it is set to anything else.
Result<int64_t> spinFromEnvironment();

}  // namespace raccel::transport
