// The scheduler's per-connection and per-session state (internal to scheduler.cc and
// remote.cc; owned by the loop thread).
#pragma once

#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "scheduler/admission.h"
#include "scheduler/lineage.h"
#include "scheduler/scheduler.h"
#include "schema/node.capnp.h"
#include "transport/request_table.h"
#include "transport/wire_types.h"

#include <capnp/message.h>

namespace raccel::scheduler {

// A VM the scheduler serves (or served: a VM is never forgotten, links and sessions
// point at it). Attached = listening on its socket, or connected/connecting to it.
struct Scheduler::Vm {
  Scheduler* scheduler = nullptr;
  VmPolicy policy;
  bool active = false;     // attached; false once stopped or rejected
  std::string problem;     // why it was rejected, or why the last connect failed
  std::unique_ptr<transport::Listener> listener;  // attach = listen
  uv_timer_t* retry = nullptr;                    // attach = connect: the next attempt
  unsigned backoffMs = 50;
  uint64_t generation = 0;  // bumped on detach, so a late connect result is dropped
  uint32_t links = 0;
  uint32_t blocksHeld = 0;     // placed now
  uint32_t blocksClaimed = 0;  // by all its sessions, placed, waiting or suspended (the cap applies to this)
  uint64_t memoryUsed = 0;
  uint64_t kernelNsEnded = 0;  // of its programs that ended (tenant usage, kept across restarts)
  uint64_t instructionsEnded = 0, bytesMovedEnded = 0;  // of its programs that ended, since start
  TenantUsage usage;           // blocks held over time: orders equal priorities at admission
};

struct Scheduler::NodeLink {
  transport::ConnectionPtr connection;
  std::string name;  // empty until registered
  long poolIndex = -1;
  uint64_t lastHeardMs = 0;
  uint32_t contexts = 0;
  uint64_t nextContext = 1;  // the next context id on this link (never repeats on it)
  uint64_t acceptedMs = 0;
  std::string lostReason;  // set when the scheduler itself drops the link
  std::string laneToken;   // the same-host lane offered and not yet claimed ("": none)
  uint64_t badReplies = 0;  // malformed, or of a kind only the scheduler makes (dropped)
};

// One card of a vaccel: the slice of it the vaccel holds, and the netaccel context
// that runs its instructions there.
struct Member {
  Scheduler::NodeLink* node = nullptr;  // null once lost
  size_t card = 0;                      // pool card index
  uint32_t context = 0;
  uint32_t blocks = 0;
  uint64_t kernelNs = 0;  // the card's kernel time for this context, as last heard
};

// A guest that keeps streaming behind a long job or a suspended vaccel waits at its link
// (all of its VM's programs share it) once this much waits in the scheduler.
constexpr size_t kHeldHighWater = 64 << 20;
// The same once this many instructions wait (tiny instructions cost more than their bytes).
constexpr size_t kHeldMaxInstructions = 16384;

// What a session's cards may owe it at once: answers are made by the card whether or not
// the guest reads them, and wait in its netaccel's memory while the guest's link is backed
// up. Past either bound the session's next instructions wait in `held` until answers come
// back, so a guest that asks for gibibytes of reads (a few bytes each to ask) and reads
// none of them has its netaccel hold this much, plus one read (of a buffer of its own).
constexpr uint64_t kReadAheadBytes = 64 << 20;
constexpr size_t kMaxAwaitedAnswers = 16384;  // reads, fences, program descriptions

// A netaccel's cards as it registered them (or as the state database kept them).
Result<std::vector<CardSpec>> cardSpecsOf(capnp::List<wire::CardInfo>::Reader cards);

// The buffer a kernel argument passes (whole or from an offset on), if it passes one.
std::optional<uint64_t> bufferArg(wire::Arg::Reader arg);
// The buffers a built-in op writes (a tensor op its output; nllLoss its total weight
// too; layerNorm each row's mean and rstd too).
std::vector<uint64_t> outputsOf(wire::Op::Reader op);
// The highest element a tensor operand's view reaches over `shape`, one stride per
// dimension (saturating: a huge stride gives a number no buffer holds; a dimension of
// no elements adds nothing).
uint64_t lastElementOf(wire::TensorOperand::Reader operand, capnp::List<uint64_t>::Reader shape);

// One event of the stream, as raccelctl and the web console get it.
inline void fillEvent(wire::Event::Builder out, uint64_t unixMs, const std::string& kind, const std::string& subject,
                      const std::string& detail) {
  out.setUnixMs(unixMs);
  out.setKind(kind);
  out.setSubject(subject);
  out.setDetail(detail);
}

// "1-3,7" for the console and the event stream.
inline std::string blocksText(const std::vector<BlockRange>& ranges) {
  std::string out;
  for (auto& r : ranges)
    out += (out.empty() ? "" : ",") + std::to_string(r.first) + (r.count > 1 ? "-" + std::to_string(r.end() - 1) : "");
  return out.empty() ? "none" : out;
}

// Sequence numbers from 2^63 up belong to the scheduler's own instructions on a
// vaccel's contexts (copies between its cards, split ops); guests use the ones below.
constexpr uint64_t kSchedulerSequences = 1ull << 63;
// From 2^62 to 2^63: raccel-guestd's own fences (see vmfrontend/guestd.h).
constexpr uint64_t kGuestdSequences = 1ull << 62;
// Handles from 2^63 up are the scheduler's scratch buffers on a vaccel's cards.
constexpr uint64_t kSchedulerHandles = 1ull << 63;

// Work the scheduler runs on a vaccel's other cards for one guest instruction (a split
// op, a launch of a program that lives on another card). While it runs, the session's
// later instructions wait in `held`, so the guest's order is kept across cards.
struct RemoteJob {
  uint64_t guestSequence = 0;
  std::optional<Error> error;      // the first failure; reported under guestSequence
  unsigned awaiting = 1;           // reads and fences still to answer, +1 until the job is all sent
  std::vector<size_t> touched;     // members that ran something
  std::vector<std::pair<size_t, uint64_t>> scratch;  // (member, handle) to free at the end
  std::function<void()> whenGathered;  // after every read has answered, before the fences
  bool fencing = false;
  // The scheduler's own jobs (saving or restoring a vaccel) answer here, not to the guest.
  std::function<void(std::optional<Error>)> finished;
};

// Calls `then` once `left` ticks have come: one per input copy, and a last one from
// the code that set `then` (so inputs that were all cached run at once).
struct Gate {
  size_t left = 0;
  std::function<void()> then;
  static std::function<void()> ticker(const std::shared_ptr<Gate>& gate) {
    return [gate] {
      if (--gate->left == 0) gate->then();
    };
  }
};

// Where a session is in its life (relocate/relocator.h). Only `running` forwards the guest's
// instructions; in every other phase they wait in `held` (or fail, with noWait).
enum class Phase {
  waiting,     // admitted but not placed yet: waits for blocks (queued, or for its victims)
  running,
  suspending,  // its buffers are being saved to host memory; then `suspended`
  suspended,   // no cards; buffers in `saved`
  moving,      // saving, then restoring on other cards (migration)
  resuming,    // restoring `saved` on its new cards
  recovering,  // restored from the state database: waits for its netaccels to re-register
};
const char* phaseName(Phase phase);

struct Scheduler::Session {
  explicit Session(std::function<void(const uint64_t&, const Status&)> onPendingFailed) : pending(std::move(onPendingFailed)) {}
  VaccelId id = 0;
  Vm* vm = nullptr;
  // The guest's link and channel; null while detached (restored after a restart, until
  // raccel-guestd re-attaches it with `token`). Replies for a detached session wait in
  // `undelivered`.
  VmLink* link = nullptr;
  uint32_t channel = 0;
  uint64_t token = 0;
  std::deque<std::pair<uint64_t, transport::Body>> undelivered;
  uint64_t resumeHello = 0;     // re-attached while recovering: the welcome answers this hello
  bool resumePending = false;
  uint64_t detachedSinceMs = 0;  // restored: ended if nobody re-attaches it within the grace
  uint64_t appliedThrough = 0;
  uint64_t lastForwarded = 0;    // the last guest instruction sent to its primary context (or its saved state holds)
  std::string program;
  int priority = 0;
  std::vector<BlockRange> blocks;
  // Its cards; members[0] is the primary (the most blocks): the guest's buffers live
  // there, and every instruction goes there unless routed elsewhere below.
  std::vector<Member> members;
  std::unordered_map<uint64_t, uint64_t> buffers;  // handle -> bytes charged to the VM
  std::map<uint64_t, uint64_t> unconfirmedAllocs;  // sequence -> handle, until a fence passes
  uint64_t memoryUsed = 0;
  uint64_t instructions = 0;
  std::string unavailable;  // why, once one of the session's cards is gone
  transport::RequestTable<uint64_t> pending;  // guest reads and fences awaiting their reply
  // Of `pending`'s reads: the bytes each has still to bring back, and their sum.
  std::unordered_map<uint64_t, uint64_t> readLeft;
  uint64_t readBytesLeft = 0;
  // A read, fence or program description of the guest's, sent to the card (`readBytes`:
  // what a read asks for); answered by the card, in part (`bytes` of a read's data) or
  // whole; given up (timed out, its card lost), with `pending`'s callback.
  void asked(uint64_t sequence, uint64_t deadlineMs, uint64_t readBytes);
  void answered(uint64_t sequence, uint64_t bytes, bool whole);
  void forgetRead(uint64_t sequence);
  bool owedTooMuch() const { return readBytesLeft >= kReadAheadBytes || pending.size() >= kMaxAwaitedAnswers; }

  // Programs loaded on a member other than the primary (their kind needs that card).
  std::unordered_map<uint64_t, size_t> programHome;
  // Copies of guest buffer ranges on other members, valid until the guest changes the
  // buffer: (member, handle, offset, length) -> scratch handle there.
  std::map<std::tuple<size_t, uint64_t, uint64_t, uint64_t>, uint64_t> replicas;
  std::unique_ptr<RemoteJob> job;
  std::unordered_map<uint64_t, std::function<void(transport::Body&)>> remoteReplies;  // by scheduler sequence
  std::deque<std::pair<transport::FrameHeader, transport::Body>> held;
  size_t heldBytes = 0;
  uint64_t nextSequence = kSchedulerSequences;
  uint64_t nextScratch = kSchedulerHandles;
  uint64_t bytesMoved = 0;  // between its cards, by the scheduler
  uint64_t kernelNsBefore = 0;  // of contexts it had before (suspended or moved since)
  uint64_t kernelNs() const {
    uint64_t n = kernelNsBefore;
    for (auto& m : members) n += m.kernelNs;
    return n;
  }

  // Placement and its life (relocate/relocator.h).
  Phase phase = Phase::running;
  uint32_t want = 0;  // blocks
  KindMask kinds = kAllKinds;
  HostVector host;    // of its node's host, while it holds blocks (its VM's policy at hello)
  int askedPriority = 0;
  bool noWait = false;
  bool operatorHold = false;     // suspended by raccelctl preempt: waits for raccelctl resume
  uint64_t helloSequence = 0;    // waiting: the welcome answers it
  uint64_t helloNs = 0;          // uv_hrtime() at its hello, until its first welcome (metrics)
  uint32_t maxFrame = 0;
  uint64_t waitDeadlineMs = 0;   // waiting: refused after this (0 = only victims are awaited)
  std::string why;               // why it waits or is suspended, for the console and noWait errors
  KeptBuffers saved;  // buffer handle -> its bytes, while off its cards
  // Every program it loaded, as sent (reloaded wherever it is restored).
  std::map<uint64_t, std::shared_ptr<capnp::MallocMessageBuilder>> programs;
  // Handles whose creating instruction failed: (sequence, error), poisoned again on restore.
  std::map<uint64_t, std::pair<uint64_t, Error>> failed;
  std::function<void()> idle;  // runs once the job under way has finished (whenIdle)
  bool queuedEventSent = false;
  Service service;          // the admission policy's count of its service (admission.h)
  double ranSince = -1;     // policy clock when it last started running; -1: not running
  double accruedAt = 0;     // policy clock up to which its service is counted
  // What the pool holds it at: its priority, then its service class (admission.h).
  int rank() const { return poolPriority(priority, service.serviceClass); }
  bool settlingWait = false;  // admitted to wait while the pool settles after start (its deadline: then)
  uint64_t ownWaitDeadlineMs = 0;  // what its hello asked for, restored once the pool has settled
  bool refused = false;        // ended before it was placed: no "released" event
  Lineage lineage;             // failover (lineage.h)

  Member& primary() { return members.front(); }
  bool heldOverLimit() const { return heldBytes >= kHeldHighWater || held.size() >= kHeldMaxInstructions; }
  // The guest's next frame waits: behind a job, off its cards, for a checkpoint under
  // way with its log at twice the cap, for answers its cards owe it, or for its guest to
  // read the answers it has (its link backed up).
  bool mustHold() const;
};

struct Scheduler::VmLink {
  Vm* vm = nullptr;
  transport::ConnectionPtr connection;
  uint64_t acceptedMs = 0;
  bool spoke = false;  // has sent a frame (a full VM closes its oldest silent link first)
  std::unordered_map<uint32_t, Session*> sessions;  // by channel (Scheduler::sessions_ owns them)
  bool drainAwaited = false;  // backed up: its sessions' held frames go on once it drains
  bool backedUp() const { return connection->backlogBytes() > transport::Connection::kHighWater; }
};

// Writes a vaccel's block ranges and its cards (with the blocks held on each) into a
// wire struct that has `blocks` and `cards` (Welcome's VaccelInfo, the console's VaccelEntry).
template <class Builder>
void Scheduler::writePlacement(Builder out, const std::vector<BlockRange>& ranges) const {
  auto blocks = out.initBlocks(ranges.size());
  for (size_t i = 0; i < ranges.size(); ++i) {
    blocks[i].setFirst(ranges[i].first);
    blocks[i].setCount(ranges[i].count);
  }
  auto shares = pool().cardsOf(ranges);
  auto cards = out.initCards(shares.size());
  for (size_t i = 0; i < shares.size(); ++i) {
    const Card& c = pool().cards()[shares[i].card];
    cards[i].setNode(pool().nodes()[c.node].name);
    cards[i].setIndex(c.spec.index);
    cards[i].setKind(transport::toWire(c.spec.kind));
    cards[i].setModel(c.spec.model);
    cards[i].setBlocks(shares[i].blocks);
    cards[i].setMemoryBytes(c.spec.memoryBytes);
    auto kinds = cards[i].initProgramKinds(c.spec.programKinds.size());
    for (size_t k = 0; k < c.spec.programKinds.size(); ++k) kinds.set(k, transport::toWire(c.spec.programKinds[k]));
    cards[i].setComputeUnits(c.spec.computeUnits);
    cards[i].setMaxWorkGroupSize(c.spec.maxWorkGroupSize);
    cards[i].setLocalMemBytes(c.spec.localMemBytes);
    cards[i].setOpenclExtensions(c.spec.openclExtensions);
    cards[i].setDoubleFpConfig(c.spec.doubleFpConfig);
    transport::setImageLimits(cards[i].initImages(), c.spec.images);
  }
}

}  // namespace raccel::scheduler
