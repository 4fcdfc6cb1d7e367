// Spin-then-block waits (transport/spin_wait.h): how the window learns from the waits it
// sees, that a wait returns when its socket becomes readable whether it spun or slept,
// that a timeout still times out, and that a malformed RACCEL_SPIN_US is refused by name.
#include "transport/spin_wait.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <future>

namespace raccel::transport {
namespace {

constexpr int64_t kUs = 1000;

TEST(SpinWindow, LongWaitsShrinkItToNothingAndAShortOneSetsItAgain) {
  SpinWindow w(300 * kUs);
  EXPECT_EQ(w.ns(), 300 * kUs);  // starts at its most
  w.saw(120 * kUs);              // ended within the window: kept
  EXPECT_EQ(w.ns(), 300 * kUs);
  int longWaits = 0;
  while (w.ns() > 0) {
    w.saw(2000 * kUs);  // a training step's sync: longer than the most
    ASSERT_LT(++longWaits, 20);
  }
  EXPECT_EQ(longWaits, 9);  // 300 -> 150 -> ... -> 1.17 µs -> 0
  w.saw(40 * kUs);          // a short wait again: twice its length
  EXPECT_EQ(w.ns(), 80 * kUs);
  w.saw(10 * kUs);  // shorter still: the window is not cut by a quick reply
  EXPECT_EQ(w.ns(), 80 * kUs);
  w.saw(250 * kUs);  // within the most, but twice it is more: capped at the most
  EXPECT_EQ(w.ns(), 300 * kUs);
  w.saw(-5);  // (a clock that stepped back counts as an instant reply)
  EXPECT_EQ(w.ns(), 300 * kUs);
}

TEST(SpinWindow, ZeroOrLessNeverSpins) {
  for (int64_t most : {int64_t(0), int64_t(-7)}) {
    SpinWindow w(most);
    EXPECT_EQ(w.ns(), 0);
    w.saw(1);
    EXPECT_EQ(w.ns(), 0);
    EXPECT_EQ(w.most(), 0);
  }
}

struct Pair {
  int fd[2] = {-1, -1};
  Pair() { EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, fd), 0); }
  ~Pair() {
    ::close(fd[0]);
    ::close(fd[1]);
  }
};

TEST(WaitReadable, ReturnsWhenTheReplyComesWhetherItSpunOrSlept) {
  for (int64_t most : {int64_t(0), 300 * kUs, kMaxSpinNs}) {
    Pair p;
    SpinWindow w(most);
    char byte = 'x';
    ASSERT_EQ(::write(p.fd[1], &byte, 1), 1);
    EXPECT_EQ(waitReadable(p.fd[0], -1, w), 1) << most;  // already there
    ASSERT_EQ(::read(p.fd[0], &byte, 1), 1);
    // A reply written by another thread while the wait spins or sleeps (whichever it
    // does, it must see the byte: the writer waits for nothing but the wait to start).
    std::promise<void> started;
    auto writer = std::async(std::launch::async, [&] {
      started.get_future().wait();
      return ::write(p.fd[1], &byte, 1);
    });
    started.set_value();
    EXPECT_EQ(waitReadable(p.fd[0], 60000, w), 1) << most;
    EXPECT_EQ(writer.get(), 1);
    ASSERT_EQ(::read(p.fd[0], &byte, 1), 1);
    EXPECT_LE(w.ns(), most > 0 ? most : 0);
  }
}

TEST(WaitReadable, TimesOutWithNothingToReadAndSeesAHangUp) {
  Pair p;
  SpinWindow w(300 * kUs);
  EXPECT_EQ(waitReadable(p.fd[0], 20, w), 0);  // nothing came within 20 ms: a timeout, after the spin
  EXPECT_EQ(w.ns(), 150 * kUs);                // a wait longer than the most halves the window
  ::shutdown(p.fd[1], SHUT_WR);
  EXPECT_EQ(waitReadable(p.fd[0], 60000, w), 1);  // the peer's end: readable (read() gives 0)
}

TEST(SpinFromEnvironment, TakesMicrosecondsAndRefusesAnythingElseByName) {
  const char* before = std::getenv("RACCEL_SPIN_US");
  const std::string saved = before ? before : "";
  ::setenv("RACCEL_SPIN_US", "120", 1);
  auto ok = spinFromEnvironment();
  ASSERT_TRUE(ok.has_value());
  EXPECT_EQ(*ok, 120 * kUs);
  ::setenv("RACCEL_SPIN_US", "0", 1);
  EXPECT_EQ(spinFromEnvironment().value_or(-1), 0);
  for (const char* bad : {"", "abc", "12us", "-1", "1001", "99999999999999999999999"}) {
    ::setenv("RACCEL_SPIN_US", bad, 1);
    auto r = spinFromEnvironment();
    ASSERT_FALSE(r.has_value()) << bad;
    EXPECT_EQ(r.error().code, Code::invalidArgument);
    EXPECT_NE(r.error().message.find("RACCEL_SPIN_US"), std::string::npos) << r.error().message;
  }
  ::unsetenv("RACCEL_SPIN_US");
  auto byCpus = spinFromEnvironment();
  ASSERT_TRUE(byCpus.has_value());
  EXPECT_EQ(*byCpus, sysconf(_SC_NPROCESSORS_ONLN) >= 2 ? kDefaultSpinNs : 0);
  if (before) ::setenv("RACCEL_SPIN_US", saved.c_str(), 1);
}

}  // namespace
}  // namespace raccel::transport
