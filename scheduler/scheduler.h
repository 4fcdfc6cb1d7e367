// The host scheduler daemon. The Scheduler itself carries the guest sessions: their VMs'
// links, admission, and the routing of their instructions to netaccels and of the replies
// back (with multi-card work, task graphs and failover's lineage). It owns one object per
// other responsibility, each with its contract in its header:
//   PoolState    the pool of blocks: this host's, or the one shared through etcd (pool_state.h)
//   NodeLinks    the netaccels' links and the context table (links/node_links.h)
//   Relocator    where and when vaccels run: placement, preemption, suspend/resume, moves,
//                drains (relocate/relocator.h)
//   Persistence  the state database (persist/persistence.h)
//   Console      raccelctl's socket, HTTP, /metrics and the event stream (console/console.h)
// All state is owned by the loop thread (no locks).
//
// Identity comes from the channel: a guest session belongs to the VM whose socket it
// arrived on; a netaccel is known by the name it registered over its own connection.
#pragma once

#include <uv.h>

#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "schema/console.capnp.h"
#include "schema/guest.capnp.h"
#include "schema/node.capnp.h"
#include "scheduler/admission.h"
#include "scheduler/config.h"
#include "scheduler/lineage.h"
#include "scheduler/pool.h"
#include "scheduler/pool_state.h"
#include "scheduler/split.h"
#include "common/metrics.h"
#include "transport/connection.h"
#include "transport/http_server.h"

namespace raccel::scheduler {

struct GraphRun;
struct Member;
class Console;
class NodeLinks;
class Persistence;
class Relocator;

class Scheduler {
 public:
  // `state`: the pool (null: this host's own, a LocalPoolState).
  Scheduler(uv_loop_t* loop, SchedulerConfig config, std::unique_ptr<PoolState> state = nullptr);
  ~Scheduler();

  // Opens the netaccel, console and VM listeners; an error names the address.
  Status start();
  void stop();
  // The bound netaccel TCP port (for tests that ask for port 0).
  int nodePort() const;
  // A shared pool: where netaccels reach this scheduler (node_advertise, or node_listen's
  // host and the bound port), published for those that find schedulers in etcd.
  void advertiseNodePort();

  // VMs that come and go while the scheduler runs (the libvirt watcher). `addVm`
  // attaches a new VM, or gives a known one (same name) its new policy and attaches it
  // again; `removeVm` detaches it: its sessions end and their blocks return to the
  // pool. `rejectVm` detaches it too and keeps why it gets no accelerator (invalid
  // metadata) for the console.
  Status addVm(VmPolicy policy);
  void removeVm(const std::string& name, const std::string& why);
  void rejectVm(const std::string& name, const std::string& source, const std::string& why);

 private:
  struct Vm;
  struct VmLink;
  struct NodeLink;
  struct Session;
  friend struct Member;
  friend class Console;      // reads the state it shows (const); acts through the operator actions
  friend class Persistence;  // writes the scheduler's state, and restores it at start
  friend class NodeLinks;    // the netaccels' links: hands what they bring to the methods below
  friend class Relocator;    // places, suspends, resumes and moves the sessions

  Vm* findVm(const std::string& name);
  Vm& vmNamed(const std::string& name);  // found, or a new detached one
  Status attachVm(Vm& vm);
  void detachVm(Vm& vm);
  // attach = connect: one attempt now; a failure or a later disconnect retries with backoff.
  void connectVm(Vm& vm);
  void acceptVm(Vm& vm, transport::ConnectionPtr connection);
  void onGuestFrame(VmLink& link, const transport::FrameHeader& header, transport::Body body);
  void onGuestOversized(VmLink& link, const transport::FrameHeader& header);
  void admit(VmLink& link, uint32_t channel, uint64_t sequence, transport::Body body);
  // What a hello asks for, checked against the protocol, the pool's bounds and the VM's
  // policy (kinds allowed, priority capped).
  struct Ask {
    std::string program;
    uint32_t blocks = 0;
    KindMask kinds = 0;
    int priority = 0, asked = 0;
    uint32_t maxFrame = 0, waitMs = 0;
    bool noWait = false;
  };
  // Fills `ask` as far as the hello holds up (its program named before anything else is
  // checked, for the refusal's subject).
  Status readHello(const Vm& vm, wire::Hello::Reader hello, Ask& ask) const;
  // A new session for an admitted hello, waiting for the next placement pass (past the
  // pool's settling, where it was asked for while the pool settled).
  void awaitPlacement(VmLink& link, uint32_t channel, uint64_t sequence, const Ask& ask, bool settling);
  std::unique_ptr<Session> makeSession(VaccelId id);
  void forward(VmLink& link, Session& session, const transport::FrameHeader& header, transport::Body body);
  void forwardNow(VmLink& link, Session& session, const transport::FrameHeader& header, transport::Body body);
  // What the scheduler does with an instruction before a card sees it: true when it goes
  // no further (answered here, refused, or routed to another card of the vaccel).
  bool screen(Session& s, const transport::FrameHeader& h, transport::Body& body, wire::Instruction::Reader instruction);
  // An alloc is counted against its VM's memory quota; false (refused, its handle
  // poisoned) when the handle is the scheduler's or in use, or the quota is spent.
  bool countAlloc(Session& s, uint64_t sequence, wire::Alloc::Reader a);
  // A hello answered with `error` (logged and in the event stream as `subject`).
  void refuseHello(VmLink& link, uint32_t channel, uint64_t sequence, const std::string& subject, const Error& error);
  void replyError(VmLink& link, uint32_t channel, uint64_t sequence, const Error& error, uint64_t dependency = 0);
  // To the session's guest; kept in s.undelivered while it is detached.
  void replyError(Session& s, uint64_t sequence, const Error& error, uint64_t dependency = 0);
  void toGuest(Session& s, uint64_t sequence, transport::Body body);
  void closeChannel(VmLink& link, uint32_t channel, const Error& reason);
  void endSession(VmLink& link, uint32_t channel);
  void endSession(Session& s);
  void vmLinkClosed(VmLink& link);

  // What the netaccels bring, once NodeLinks (links/node_links.h) has checked it: a node
  // the pool takes (its index) or refuses; its registration answered (its kept contexts
  // adopted, placement); a card's reply for `member` of `s` (an error: not one a card
  // may make, dropped); a context's kernel time so far (`s` null: a closed one's); a
  // card's fault; the link's end.
  Result<size_t> nodeJoined(const std::string& name, const std::vector<CardSpec>& cards, HostVector host,
                            wire::Register::Reader reg);
  void nodeReady(NodeLink& node, const std::string& joined, capnp::List<wire::HeldContext>::Reader held);
  Status cardReply(Session& s, size_t member, NodeLink& node, const transport::FrameHeader& header, transport::Body body);
  void contextTime(NodeLink& node, Session* s, uint32_t context, uint64_t kernelNs);
  void cardFault(NodeLink& node, wire::CardFault::Reader fault);
  void nodeLost(NodeLink& node, const std::string& reason);
  // The context table (NodeLinks's): a member's context is its session's, or no one's.
  void bindContext(const Member& member, Session& s);
  void unbindContext(const Member& member);
  uint64_t contextKey(size_t card, uint32_t context) const;  // NodeLinks::key of its card's node
  // Marks `handle` as failed by instruction `sequence` on the primary's card (remembered
  // for restores when `remember`).
  void sendPoison(Session& session, uint64_t handle, uint64_t sequence, const Error& error, bool remember = true);

  // Multi-card vaccels (remote.cc): instructions another card runs (a program whose
  // kind only that card takes, a built-in op split across the cards in proportion to
  // their blocks), the copies between cards that they need, and holding the guest's
  // later instructions until they finish. Returns true when the instruction was taken.
  bool routeElsewhere(Session& s, uint64_t sequence, wire::Instruction::Reader instruction);
  bool routeLoad(Session& s, uint64_t sequence, wire::LoadProgram::Reader load);
  bool routeLaunch(Session& s, uint64_t sequence, wire::Launch::Reader launch);
  bool routeDescribe(Session& s, uint64_t sequence, uint64_t program);
  bool startSplitOp(Session& s, uint64_t sequence, wire::Op::Reader op);
  std::function<void()> primarySplitPart(Session& s, wire::Op::Reader op, Slice slice,
                                         const std::shared_ptr<std::vector<double>>& partials, size_t p);
  void startSplitPartOn(Session& s, size_t member, wire::Op::Reader op, const SplitPart& part, Slice slice,
                        const std::shared_ptr<std::vector<double>>& partials, size_t p);
  // Task graphs (graph.cc).
  bool startGraph(Session& s, uint64_t sequence, wire::Graph::Reader graph);
  void pumpGraph(Session& s, const std::shared_ptr<GraphRun>& run);
  size_t placeGraphNode(Session& s, GraphRun& run, size_t i);
  void sendGraphNode(Session& s, const std::shared_ptr<GraphRun>& run, size_t i, size_t member);
  void startRemoteLoad(Session& s, uint64_t sequence, size_t member, wire::LoadProgram::Reader load);
  void startRemoteLaunch(Session& s, uint64_t sequence, size_t member, wire::Launch::Reader launch);
  // What a scheduler instruction's answer settles: the session's job, or its checkpoint
  // under way (which runs beside the guest's stream, not as a job).
  enum class Settles { job, checkpoint };
  uint64_t sendRemote(Session& s, size_t member, capnp::MessageBuilder& message,
                      std::function<bool(wire::Reply::Reader)> onReply = {}, Settles settles = Settles::job);
  uint64_t scratch(Session& s, size_t member, uint64_t bytes, bool keep = false);
  // A copy of guest buffer bytes on `member` (cached while the buffer is unchanged);
  // `ready` runs once the copy's writes have all been sent there.
  uint64_t replica(Session& s, size_t member, uint64_t handle, uint64_t offset, uint64_t length, bool cache,
                   std::function<void()> ready);
  // Reads `length` bytes of `handle` on `member` and writes them to `toHandle` at
  // `toOffset` on `toMember`; `done` runs when the last write has been sent.
  void copyBetween(Session& s, size_t member, uint64_t handle, uint64_t offset, uint64_t length, size_t toMember,
                   uint64_t toHandle, uint64_t toOffset, std::function<void()> done);
  // Forgets the copies of `handle` on every member but `except`, freeing them there.
  void dropReplicas(Session& s, uint64_t handle, size_t except = SIZE_MAX);
  void sendFree(Session& s, size_t member, uint64_t handle);
  // Reads the one float a card's part of a reduction left in `handle` into *into.
  void readPartial(Session& s, size_t member, uint64_t handle, double* into);
  void onRemoteReply(Session& s, uint64_t sequence, transport::Body& body);
  void settle(Session& s);  // a read or fence of the job answered
  void finishJob(Session& s);
  void abandonJob(Session& s);
  void hold(Session& s, const transport::FrameHeader& header, transport::Body body);

  // The event stream (raccelctl events, the web console): the console's (console/console.h).
  void event(const std::string& kind, const std::string& subject, const std::string& detail);

  // Sessions on their cards (sessions.cc). Where and when vaccels run is the Relocator's
  // (relocate/relocator.h): placement, suspension, resumption, moves, drains.
  std::string labelOf(const Session& s) const;
  std::vector<Session*> allSessions();  // by id
  Session* sessionById(VaccelId id);
  template <class Builder>
  void writePlacement(Builder out, const std::vector<BlockRange>& ranges) const;
  void openMembers(Session& s);   // contexts on the cards of s.blocks
  void closeMembers(Session& s);  // closes them; their buffers there are freed
  void runHeld(Session& s);       // forwards what waited, while it runs and no job is under way
  void awaitDrain(VmLink& link);  // backed up: its sessions' held frames go on once it drains
  // Whether a request of `blocks` of `kinds` for `vm` could ever fit a pool this size
  // (its host needs included): resourceExhausted "can never run here: ..." when not.
  Status couldEverHold(uint32_t blocks, KindMask kinds, const Vm& vm) const;
  double lastTickPolicy_ = 0;  // the policy clock at the last tick
  uint64_t lastTickMs_ = 0;  // nowMs() at the last tick (a loop that stalled is not its netaccels' silence)
  void sendWelcome(Session& s);
  // The welcome answering hello `sequence` (resumedAfter: a resume's, else 0).
  void writeWelcome(Session& s, uint64_t sequence, uint64_t resumedAfter);
  void writeVaccel(Session& s, wire::VaccelInfo::Builder info);
  // Answers the guest's describeVaccel: where its vaccel is now.
  void describeVaccel(Session& s, uint64_t sequence);
  // raccelctl set-policy: checked, recorded (for every host of a shared pool), and
  // applied to the VM if it is served here (applyPolicy: what it is now).
  Result<std::string> setPolicy(const std::string& vm, const std::vector<std::pair<std::string, std::string>>& settings);
  Result<std::string> applyPolicy(Vm& vm, const std::map<std::string, std::string>& settings, const std::string& origin);
  // A shared pool: this host's VMs and unplaced vaccels, for the other hosts' consoles.
  void publishToOtherHosts();

  // Failover (lineage.cc, lineage.h).
  void startLineage(Session& s);  // on or off, and its cap, from its VM's policy
  void protectAfterRestart(Session& s);  // lineage again for a vaccel that ran before a restart
  // A frame forwarded to the vaccel's cards, kept in its log.
  void logFrame(Session& s, const transport::FrameHeader& h, transport::Body& body, wire::Instruction::Reader in);
  // Whether reply `body` to `sequence` is new to the guest (false: a re-forwarded
  // instruction's reply it already had).
  bool firstDelivery(Session& s, uint64_t sequence, const transport::Body& body);
  // Reads every buffer of the primary into `into`, under the job s.job (a save).
  void readBuffers(Session& s, KeptBuffers& into);
  // The buffers instruction `in` (in `body`) may change on the card, marked dirty in the
  // lineage; what a checkpoint folds for it instead (the guest's own writes and fills).
  Fold noteInstruction(Session& s, wire::Instruction::Reader in, const transport::Body& body);
  void savedIsCheckpoint(Session& s);  // a save succeeded: s.saved is the checkpoint
  // The log at its cap: a checkpoint, taken at once when the card changed nothing (the
  // bookkeeping of what the log holds), else in the background (lineage.h).
  void maybeCheckpoint(Session& s);
  // The session's record now, as a checkpoint's start; the changes noted start again.
  std::unique_ptr<CheckpointUnderWay> checkpointNow(Session& s);
  // The checkpoint under way has every byte it needs: the log's frames before its mark
  // are folded into the kept bytes, with what was read back, on the loop's thread pool.
  void startFold(Session& s);
  // The fold has ended: its bytes are the checkpoint, those frames leave the log, and
  // (with `resume`) the frames held for it go on.
  void finishFold(Session& s, bool resume);
  // Whether `s`'s next frame waits (Session::mustHold), once a fold that ended on its
  // thread, with the log at twice its cap, is finished here rather than when the loop
  // gets to its end: the frames go on now, not after the loop's other work.
  bool mustHoldNow(Session& s);
  void awaitFold(Session& s);  // a fold under way, waited for and finished (a loss mid-fold)
  // After a reply to the checkpoint under way: when it has all, it ends (kept or failed).
  void settleCheckpoint(Session& s);
  // One of its cards' netaccels was lost (`lost` says how): off its cards, placed again,
  // restored from the checkpoint, the log re-forwarded.
  void recoverLost(Session& s, const std::string& lost);
  void failRecovery(Session& s, const Error& why);  // it cannot be placed again: unavailable

  void refuseWhileSuspended(Session& s, const transport::FrameHeader& h, const transport::Body& body);

  // After a restart (rejoin.cc); what was persisted is the Persistence's (persist/persistence.h).
  // A netaccel registered with the contexts it kept: adopts those of restored vaccels,
  // closes the rest.
  void adoptContexts(NodeLink& node, capnp::List<wire::HeldContext>::Reader held);
  // A restored vaccel whose netaccels are back (or given up on): runs again, and answers
  // the guest's resume when it has re-attached.
  void recovered(Session& s);
  // raccel-guestd re-attaching a session (hello with resume): refused, or attached.
  void resumeSession(VmLink& link, uint32_t channel, uint64_t sequence, wire::Resume::Reader resume);
  void sendResumed(Session& s);
  void expireDetached();     // tick: the restart's grace has passed
  void forgetOfflineNodes(uint64_t now);  // tick: offline past forget_offline_ms with nothing on them
  void tick();
  uint64_t nowMs() const { return uv_now(loop_); }
  // A VM's blocks held change (placement, release): charged to its usage first.
  void holdBlocks(Vm& vm, int64_t delta);

  uv_loop_t* loop_;
  SchedulerConfig config_;
  std::unique_ptr<PoolState> state_;  // the pool: this host's, or the shared one (--etcd)
  const Pool& pool() const { return state_->view(); }
  std::vector<std::unique_ptr<Vm>> vms_;
  std::unordered_map<transport::Connection*, std::unique_ptr<VmLink>> vmLinks_;
  std::unique_ptr<NodeLinks> links_;  // the netaccels' links, and which session each context is
  // Until then the pool has not heard from any netaccel: a request it cannot hold waits
  // (startup_grace_ms after start, ended by the first netaccel that joins).
  uint64_t settledAtMs_ = 0;
  bool settling() const { return nowMs() < settledAtMs_; }
  std::map<VaccelId, std::unique_ptr<Session>> sessions_;  // every session, attached or not
  std::unique_ptr<Persistence> persistence_;  // the state database (state_dir), and the restart
  std::map<std::string, std::map<std::string, std::string>> policyOverrides_;  // raccelctl set-policy, by VM
  uint64_t restoredAtMs_ = 0;
  std::unique_ptr<Console> console_;  // the operators' side: console socket, HTTP, events
  uv_timer_t* ticker_ = nullptr;
  std::unique_ptr<Relocator> relocator_;  // where and when vaccels run
  // Contexts closed since their card's last heartbeat, by contextKey: their final kernel
  // time, in the next one, is credited to the vaccel (or its VM, once it has ended).
  struct ClosedContext {
    VaccelId vaccel;
    Vm* vm;
    uint64_t kernelNsCredited;
    uint64_t closedMs;
  };
  std::unordered_map<uint64_t, ClosedContext> closedContexts_;
  void creditClosed(uint64_t key, uint64_t kernelNs);
  VaccelId nextVaccel_ = 1;
  uint64_t refusedLinks_ = 0;                    // connections over a limit, for the log
  bool stopping_ = false;
};

}  // namespace raccel::scheduler
