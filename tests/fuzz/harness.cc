#include "tests/fuzz/harness.h"

#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>

#include "common/log.h"
#include "netaccel/netaccel.h"
#include "schema/frame.capnp.h"
#include "scheduler/scheduler.h"
#include "transport/connection.h"

namespace raccel::fuzz {
namespace {

using Clock = std::chrono::steady_clock;

struct Daemons {
  uv_loop_t loop;
  std::string dir;
  std::unique_ptr<scheduler::Scheduler> scheduler;
  std::unique_ptr<netaccel::Netaccel> netaccel;

  Daemons() {
    log::setLevel(log::Level::error);
    ::signal(SIGPIPE, SIG_IGN);  // as the daemons' main() does: a peer that vanished is an error, not a signal
    uv_loop_init(&loop);
    char tmpl[] = "/tmp/raccel-fuzz-XXXXXX";
    if (!::mkdtemp(tmpl)) std::abort();
    dir = tmpl;
    static std::string made;  // the folder goes when the fuzzer's process ends
    made = dir;
    std::atexit([] {
      std::error_code ignored;
      std::filesystem::remove_all(made, ignored);
    });
    scheduler::SchedulerConfig sc;
    sc.nodeListen = "127.0.0.1:0";
    sc.console = "unix:" + dir + "/console.sock";
    sc.httpListen = "off";  // HTTP is libmicrohttpd's to parse; its bounds have their own tests
    sc.security.insecure = true;  // loopback, one process: the TLS layer has its own tests
    sc.heartbeatTimeoutMs = 600000;
    sc.requestTimeoutMs = 2000;
    sc.registerTimeoutMs = 100;
    sc.forgetOfflineMs = 1;
    scheduler::VmPolicy vm;
    vm.name = "fuzz";
    vm.socket = dir + "/vm.sock";
    vm.tflops = 4;
    vm.memoryQuota = 1 << 20;  // bounds the work one input can ask for
    vm.source = "fuzz";
    sc.vms.push_back(vm);
    scheduler = std::make_unique<scheduler::Scheduler>(&loop, sc);
    if (auto s = scheduler->start(); !s) {
      std::fprintf(stderr, "fuzz harness: scheduler: %s\n", s.error().message.c_str());
      std::abort();
    }
    netaccel::NetaccelConfig nc;
    nc.name = "fuzz-node";
    nc.scheduler = "127.0.0.1:" + std::to_string(scheduler->nodePort());
    nc.security.insecure = true;
    nc.contextGraceMs = 0;
    nc.httpListen = "off";
    netaccel::CardConfig card;
    card.kind = CardKind::gpu;
    card.tflops = 4;
    card.memoryBytes = 64 << 20;
    card.threads = 1;
    nc.cards.push_back(card);
    std::vector<std::string> notes;
    auto devices = netaccel::openCards(nc, &notes);
    if (!devices) std::abort();
    netaccel = std::make_unique<netaccel::Netaccel>(&loop, nc, std::move(*devices));
    if (!netaccel->start()) std::abort();
    pump(Clock::now() + std::chrono::milliseconds(300), [] { return false; });
  }

  // Runs the loop until done() or the deadline, sleeping in it between events (the card
  // worker threads need the cores more than a spinning loop does).
  template <class Done>
  void pump(Clock::time_point until, Done done) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now()).count();
    bool expired = left <= 0;
    uv_timer_t deadline;
    uv_timer_init(&loop, &deadline);
    deadline.data = &expired;
    uv_timer_start(&deadline, [](uv_timer_t* t) { *static_cast<bool*>(t->data) = true; }, left > 0 ? left : 0, 0);
    while (!done() && !expired) uv_run(&loop, UV_RUN_ONCE);
    uv_close(reinterpret_cast<uv_handle_t*>(&deadline), nullptr);
    uv_run(&loop, UV_RUN_NOWAIT);  // the timer's close completes before it leaves scope
  }

  void send(Port port, const uint8_t* data, size_t size) {
    transport::Address address;
    switch (port) {
      case Port::vm: address = {true, dir + "/vm.sock", "", 0}; break;
      case Port::console: address = {true, dir + "/console.sock", "", 0}; break;
      case Port::node: address = {false, "", "127.0.0.1", scheduler->nodePort()}; break;
    }
    transport::ConnectionPtr link;
    bool failed = false, closed = false;
    size_t replies = 0;
    bool pong = false;
    transport::connect(&loop, address, wire::DEFAULT_MAX_FRAME_BYTES, [&](Result<transport::ConnectionPtr> r) {
      if (!r) {
        failed = true;
        return;
      }
      link = *r;
    });
    pump(Clock::now() + std::chrono::seconds(2), [&] { return failed || link; });
    if (!link) return;
    transport::Connection::Callbacks cb;
    cb.onFrame = [&](transport::Connection&, const transport::FrameHeader& h, transport::Body) {
      ++replies;
      if (h.channel == 0 && port == Port::vm) pong = true;
    };
    cb.onClose = [&](transport::Connection&, bool) { closed = true; };
    link->setCallbacks(cb);
    link->start();
    // The input as frames: each header's length is cut to the bytes that follow it, so
    // the stream ends on a frame boundary and what comes after it is read as itself (the
    // frame reader's own handling of partial and oversized frames is fuzz_frames').
    std::vector<std::byte> bytes(reinterpret_cast<const std::byte*>(data), reinterpret_cast<const std::byte*>(data) + size);
    for (size_t at = 0; at + transport::kHeaderBytes <= bytes.size();) {
      auto h = transport::decodeHeader(bytes.data() + at);
      size_t room = bytes.size() - at - transport::kHeaderBytes;
      if (h.length > room) {
        h.length = static_cast<uint32_t>(room);
        transport::encodeHeader(h, bytes.data() + at);
      }
      at += transport::kHeaderBytes + h.length;
      if (bytes.size() - at < transport::kHeaderBytes) bytes.resize(at);  // no partial header at the end
    }
    if (bytes.size() < transport::kHeaderBytes) bytes.clear();
    if (!bytes.empty()) {
      uv_buf_t buf = uv_buf_init(reinterpret_cast<char*>(bytes.data()), bytes.size());
      uv_try_write(link->stream(), &buf, 1);  // a socket buffer holds what a test input is
    }
    if (port == Port::vm) {
      // A ping: its pong says everything before it was read; then the card's replies.
      capnp::MallocMessageBuilder ping;
      ping.initRoot<wire::LinkControl>().setPing();
      link->send(0, 0, ping);
      pump(Clock::now() + std::chrono::milliseconds(500), [&] { return pong || closed; });
      pump(Clock::now() + std::chrono::milliseconds(1), [&] { return closed; });
    } else {
      // Our side ends: the scheduler reads everything, then closes its side, which we see.
      static uv_shutdown_t shutdown;
      uv_shutdown(&shutdown, link->stream(), [](uv_shutdown_t*, int) {});
      pump(Clock::now() + std::chrono::milliseconds(500), [&] { return closed; });
    }
    link->close();
    pump(Clock::now() + std::chrono::milliseconds(50), [&] { return closed; });
    uv_run(&loop, UV_RUN_NOWAIT);  // the scheduler's side of the close
  }
};

}  // namespace

void sendToDaemons(Port port, const uint8_t* data, size_t size) {
  static Daemons* daemons = new Daemons();  // lives for the process: the loop outlives every input
  daemons->send(port, data, size);
}

}  // namespace raccel::fuzz
