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

#include "scheduler/scheduler.h"
#include "transport/request_table.h"

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
  uint32_t blocksHeld = 0;
  uint64_t memoryUsed = 0;
};

struct Scheduler::NodeLink {
  transport::ConnectionPtr connection;
  std::string name;  // empty until registered
  long poolIndex = -1;
  uint64_t lastHeardMs = 0;
  uint32_t contexts = 0;
  std::string lostReason;  // set when the scheduler itself drops the link
};

// One card of a vaccel: the slice of it the vaccel holds, and the netaccel context
// that runs its instructions there.
struct Member {
  Scheduler::NodeLink* node = nullptr;  // null once lost
  size_t card = 0;                      // pool card index
  uint32_t context = 0;
  uint32_t blocks = 0;
};

// Sequence numbers from 2^63 up belong to the scheduler's own instructions on a
// vaccel's contexts (copies between its cards, split ops); guests use the ones below.
constexpr uint64_t kSchedulerSequences = 1ull << 63;
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
};

struct Scheduler::Session {
  explicit Session(std::function<void(const uint64_t&, const Status&)> onPendingFailed) : pending(std::move(onPendingFailed)) {}
  VaccelId id = 0;
  Vm* vm = nullptr;
  VmLink* link = nullptr;  // owns this session
  uint32_t channel = 0;
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

  Member& primary() { return members.front(); }
};

struct Scheduler::VmLink {
  Vm* vm = nullptr;
  transport::ConnectionPtr connection;
  std::unordered_map<uint32_t, std::unique_ptr<Session>> sessions;
};

}  // namespace raccel::scheduler
