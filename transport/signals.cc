#include "transport/signals.h"

#include <pthread.h>

#include <csignal>

#include "common/log.h"

namespace raccel::transport {
namespace {
struct Signals {
  uv_signal_t sigint, sigterm;
  std::function<void()> stop;
  bool stopped = false;
};
sigset_t stopSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  return set;
}
}  // namespace

void holdStopSignals() {
  sigset_t set = stopSignals();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

bool stopPending() {
  sigset_t pending;
  sigpending(&pending);
  return sigismember(&pending, SIGINT) == 1 || sigismember(&pending, SIGTERM) == 1;
}

void runUntilSignalled(uv_loop_t* loop, std::function<void()> stop) {
  std::signal(SIGPIPE, SIG_IGN);
  Signals s;
  s.stop = std::move(stop);
  uv_signal_init(loop, &s.sigint);
  uv_signal_init(loop, &s.sigterm);
  s.sigint.data = s.sigterm.data = &s;
  auto onSignal = [](uv_signal_t* h, int signum) {
    auto* s = static_cast<Signals*>(h->data);
    if (s->stopped) return;
    s->stopped = true;
    RLOG_INFO("raccel") << "signal " << signum << ": shutting down";
    uv_close(reinterpret_cast<uv_handle_t*>(&s->sigint), nullptr);
    uv_close(reinterpret_cast<uv_handle_t*>(&s->sigterm), nullptr);
    s->stop();
  };
  uv_signal_start(&s.sigint, onSignal, SIGINT);
  uv_signal_start(&s.sigterm, onSignal, SIGTERM);
  sigset_t set = stopSignals();
  pthread_sigmask(SIG_UNBLOCK, &set, nullptr);  // one held back since holdStopSignals arrives now
  uv_run(loop, UV_RUN_DEFAULT);
  if (!s.stopped) {
    uv_close(reinterpret_cast<uv_handle_t*>(&s.sigint), nullptr);
    uv_close(reinterpret_cast<uv_handle_t*>(&s.sigterm), nullptr);
    uv_run(loop, UV_RUN_DEFAULT);
  }
}

}  // namespace raccel::transport
