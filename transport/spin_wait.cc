#include "transport/spin_wait.h"

#include <poll.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <string>

namespace raccel::transport {
namespace {
int64_t nowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

void SpinWindow::saw(int64_t waitNs) {
  if (most_ == 0) return;
  if (waitNs <= most_) window_ = std::max(window_, std::min(most_, 2 * std::max<int64_t>(waitNs, 0)));
  else window_ = window_ / 2 < 1000 ? 0 : window_ / 2;
}

int waitReadable(int fd, int timeoutMs, SpinWindow& window) {
  pollfd p{fd, POLLIN, 0};
  const int64_t start = nowNs(), spinUntil = start + window.ns();
  int rc = 0;
  if (window.ns() > 0) {
    do {
      rc = ::poll(&p, 1, 0);
      if (rc == 0) sched_yield();  // (a thread ready on this CPU runs first: the spin only keeps an idle CPU awake)
    } while (rc == 0 && nowNs() < spinUntil);
  }
  if (rc == 0) {
    // What is left of the timeout after the spin (under 1 ms of it).
    const int spunMs = static_cast<int>((nowNs() - start) / 1'000'000);
    rc = ::poll(&p, 1, timeoutMs < 0 ? -1 : std::max(0, timeoutMs - spunMs));
  }
  if (rc >= 0) window.saw(nowNs() - start);
  return rc;
}

Result<int64_t> spinFromEnvironment() {
  const char* text = std::getenv("RACCEL_SPIN_US");
  if (!text) return sysconf(_SC_NPROCESSORS_ONLN) >= 2 ? kDefaultSpinNs : 0;
  char* end = nullptr;
  errno = 0;
  const long long us = std::strtoll(text, &end, 10);
  if (end == text || *end != '\0' || errno != 0 || us < 0 || us > kMaxSpinNs / 1000)
    return fail(Code::invalidArgument, "RACCEL_SPIN_US = '" + std::string(text).substr(0, 64) +
                                           "' is not a number of microseconds from 0 to " + std::to_string(kMaxSpinNs / 1000));
  return us * 1000;
}

}  // namespace raccel::transport
