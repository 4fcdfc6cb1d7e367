// The network-accelerator daemon: joins one scheduler or several over TCP (a pool
// shared by many VM hosts: `scheduler = A:7700,B:7700`), registers its cards with each,
// heartbeats, and runs forwarded instructions on one CardWorker per card. Everything
// here runs on the loop thread; the workers hand results back through a uv_async.
//
// Each link owns its contexts: a scheduler's context ids are its own (they never reach
// the cards: the netaccel gives every context an id of its own, never reused), its
// frames reach only its contexts, and its replies, usage and faults name only its
// contexts. Every card's fair share counts the tenants of all schedulers alike.
//
// If a scheduler goes away, the daemon reconnects to it with backoff and keeps its
// contexts for context_grace_ms: their queued work runs, their replies wait. It
// registers again with the contexts it kept (once their queues have run dry); the
// scheduler adopts those it knows (their waiting replies are sent) and closes the rest.
// When the grace ends first, they are dropped: no tenant data outlives its scheduler
// by more than the grace. In a pool shared through etcd they go sooner: when the
// scheduler's lease ends (its blocks return to the pool then), the contexts of a link
// lost to it are dropped at once. The other schedulers' links are untouched throughout.
#pragma once

#include <uv.h>

#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/free_memory.h"
#include "hal/device.h"
#include "netaccel/card_worker.h"
#include "netaccel/config.h"
#include "schema/node.capnp.h"
#include "transport/connection.h"
#include "transport/http_server.h"

namespace raccel::netaccel {

// Opens the cards a config serves: its [card] sections in order, then every device the
// discovered backends see that no section names; one cpu card when that is nothing.
// A configured card that cannot be opened is an error naming it; a discovered one is
// skipped with a note. `notes` gets a line per backend (what discovery found, and why
// not) for logs and --list-devices.
Result<std::vector<std::unique_ptr<hal::Device>>> openCards(const NetaccelConfig& config, std::vector<std::string>* notes);

class Netaccel {
 public:
  Netaccel(uv_loop_t* loop, NetaccelConfig config, std::vector<std::unique_ptr<hal::Device>> devices);
  ~Netaccel();

  // The link to the scheduler is mutual TLS with this context (null: plain TCP).
  void useTls(std::shared_ptr<transport::TlsContext> tls) { tls_ = std::move(tls); }
  // Serves /metrics (http_listen) and joins the scheduler; an error: the metrics address.
  Status start();
  // Closes the link and every handle so the loop can end.
  void stop();

  // In a pool shared through etcd (netaccel/scheduler_watch.h): whether the scheduler
  // of a name holds a lease now (nullopt: not known). A link lost to one that holds
  // none drops its contexts at once rather than after the grace.
  void useSchedulerLiveness(std::function<std::optional<bool>(const std::string&)> live) { live_ = std::move(live); }
  // Any thread: the scheduler of that name lost its lease. The contexts of a link lost
  // to it are dropped (on the loop thread, soon after).
  void schedulerGone(const std::string& name);
  // Any thread (scheduler = etcd): scheduler `name` of the shared pool advertised that
  // netaccels reach it at `address`. Linked to (on the loop thread, soon after), unless a
  // link to that address exists; at most kMaxSchedulerLinks links. A found scheduler
  // whose lease ends is not reconnected to (its contexts go as any gone scheduler's).
  void schedulerFound(const std::string& name, const std::string& address);

 private:
  struct Link;  // one scheduler
  struct Context {
    Link* link = nullptr;
    uint32_t theirs = 0;  // the scheduler's id for it
    size_t card = 0;
    uint64_t lastGuestSequence = 0;
  };
  Link& addLink(const transport::Address& address);
  void connect(Link& link);
  void onPoolChange();  // the schedulers found and gone since last time (loop thread)
  void scheduleReconnect(Link& link);
  void onConnected(Link& link, transport::ConnectionPtr connection);
  void onFrame(Link& link, const transport::FrameHeader& header, transport::Body body);
  void onControl(Link& link, transport::Body body);
  void registered(Link& link, wire::Registered::Reader r);
  void adoptContext(Link& link, uint32_t context);
  void openContext(Link& link, wire::OpenContext::Reader open);
  // A same-host lane the scheduler offered: the memfds handed to its lane socket.
  void takeLane(Link& link, capnp::Text::Reader path, capnp::Data::Reader token);
  // Where the read replies of every context of `link` are built from now on (null: in
  // bodies of their own).
  void setReplyLanes(Link& link, const std::shared_ptr<transport::LaneOut>& lane);
  void closeContext(uint32_t ours);
  void onLinkClosed(Link& link);
  void sendHeartbeat(Link& link);
  void sendRegister(Link& link);
  void graceOver(Link& link);
  // Drops the contexts a lost link kept; `why` ends the log line.
  void dropKept(Link& link, const std::string& why);
  void dropKeptOfGone();
  void closeContextsOf(Link& link);
  void drainOutputs();
  // Input backpressure over every link: the cards' queues are shared.
  void checkInputPressure();
  std::string metricsText();

  uv_loop_t* loop_;
  NetaccelConfig config_;
  std::shared_ptr<transport::TlsContext> tls_;
  std::vector<std::unique_ptr<CardWorker>> workers_;
  std::vector<std::unique_ptr<Link>> links_;
  FreeMemoryAfterBursts freeMemory_;  // the heap back once the links go quiet (each heartbeat)
  std::unordered_map<uint32_t, Context> contexts_;  // by the netaccel's own id
  // Closed contexts whose final kernel time the cards have not reported yet: whose it is.
  struct Closed {
    Link* link = nullptr;
    uint32_t theirs = 0;
  };
  std::unordered_map<uint32_t, Closed> closed_;
  uint32_t nextContext_ = 1;                        // never reused (refused when spent)
  bool stopping_ = false, inputPaused_ = false;
  uv_async_t* async_;
  std::function<std::optional<bool>(const std::string&)> live_;
  // Schedulers whose lease ended (schedulerGone, any thread), for dropKeptOfGone, and
  // those found in etcd (schedulerFound), for onPoolChange.
  uv_async_t* goneAsync_;
  std::mutex goneMutex_;  // guards the three below; held while goneAsync_ may be sent to
  std::vector<std::string> gone_;
  std::vector<std::pair<std::string, std::string>> found_;
  bool goneAsyncOpen_ = true;
  std::vector<CardWorker::Output> outputs_;
  std::unique_ptr<transport::HttpServer> http_;
  uint64_t instructionsReceived_ = 0, linksLost_ = 0;
};

}  // namespace raccel::netaccel
