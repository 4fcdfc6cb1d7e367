// Failover (lineage.h): keeping each vaccel's lineage as its guest's frames pass,
// checkpointing it when the log reaches its cap, and recovering a vaccel that lost a
// card from it. Recovery reuses suspension's machinery: the vaccel leaves its cards,
// waits in the admission queue as a suspended one would (its priority and quota as
// they were; unlike a suspended one it may preempt at once, as new work would), and is
// restored on its new blocks from the checkpoint, with the log re-forwarded ahead of
// what waited.
#include <capnp/message.h>

#include <algorithm>
#include <cstring>

#include "common/log.h"
#include "schema/frame.capnp.h"
#include "schema/node.capnp.h"
#include "scheduler/scheduler.h"
#include "scheduler/state.h"
#include "transport/wire_types.h"

namespace raccel::scheduler {

void LineageLog::add(const transport::FrameHeader& header, transport::Body& body, const Fold& fold) {
  std::span<const std::byte> bytes;
  if (body.size() >= kSharedFromBytes) {
    shared_.push_back(body.share());  // (the bytes forwarded, not a copy)
    bytes = {shared_.back().data(), shared_.back().size()};
  } else {
    const size_t words = (body.size() + 7) / 8;  // word-aligned, as a decoder wants them
    if (chunks_.empty() || usedInLast_ + words * 8 > kChunkBytes) {
      chunks_.push_back(std::make_unique<capnp::word[]>(kChunkBytes / 8));
      usedInLast_ = 0;
    }
    std::byte* at = reinterpret_cast<std::byte*>(chunks_.back().get()) + usedInLast_;
    if (body.size()) std::memcpy(at, body.data(), body.size());
    usedInLast_ += words * 8;
    bytes = {at, body.size()};
  }
  entries_.push_back(Entry{header, bytes, fold});
  bytes_ += body.size();
}

std::deque<std::pair<transport::FrameHeader, transport::Body>> LineageLog::takeFrames() {
  std::deque<std::pair<transport::FrameHeader, transport::Body>> frames;
  for (auto& e : entries_) {
    transport::Body body(e.bytes.size());
    if (!e.bytes.empty()) std::memcpy(body.data(), e.bytes.data(), e.bytes.size());
    frames.emplace_back(e.header, std::move(body));
  }
  clear();
  return frames;
}

void LineageLog::clear() {
  entries_.clear();
  shared_.clear();
  if (chunks_.size() > 1) chunks_.resize(1);  // one stays for the next frames
  usedInLast_ = 0;
  bytes_ = 0;
}

uint64_t Lineage::heldBytes() const {
  uint64_t n = log.bytes();
  for (auto& [h, data] : base) n += data.size();
  for (auto& [h, data] : taking) n += data.size();
  return n;
}

void Lineage::drop() {
  on = false;
  base.clear();
  baseInSaved = false;
  buffers.clear();
  dirty.clear();
  fresh.clear();
  allDirty = false;
  programs.clear();
  failed.clear();
  log.clear();
  delivered.clear();
  taking.clear();
}

void Scheduler::startLineage(Session& s) {
  s.lineage.on = s.vm->policy.failover;
  s.lineage.capBytes = s.vm->policy.lineageBytes;
}

void Scheduler::logFrame(Session& s, const transport::FrameHeader& h, transport::Body& body, wire::Instruction::Reader in) {
  Lineage& lin = s.lineage;
  if (!lin.on || h.sequence >= kSchedulerSequences) return;  // (refused unforwarded: nothing to rebuild)
  lin.log.add(h, body, noteWritten(s, in, body));
  if (lin.replayLeft && --lin.replayLeft == 0) {
    const double ms = static_cast<double>(uv_hrtime() - lin.lostAtNs) / 1e6;
    event("recovered", labelOf(s), "the instructions lost with " + lin.lost + " ran again; " + std::to_string(static_cast<long>(ms)) +
                                       " ms after the loss");
  }
}

bool Scheduler::firstDelivery(Session& s, uint64_t sequence, const transport::Body& body) {
  Lineage& lin = s.lineage;
  if (!lin.on || sequence >= kSchedulerSequences) return true;
  // One answer per instruction, but a read's data comes in chunks and a fence's answer
  // follows the kernel times it collected: each part is told apart.
  uint64_t part = ~0ull;
  (void)transport::decodeGuard([&] {
    transport::MessageView in(body);
    auto reply = in.root<wire::Reply>();
    if (reply.which() == wire::Reply::DATA) part = reply.getData().getOffset();
    else if (reply.which() == wire::Reply::KERNEL_TIMES) part = ~1ull;
  });
  return lin.delivered.emplace(sequence, part).second;
}

Fold Scheduler::noteWritten(Session& s, wire::Instruction::Reader in, const transport::Body& body) {
  Lineage& lin = s.lineage;
  Fold fold;
  switch (in.which()) {
    case wire::Instruction::ALLOC: {  // one of a handle in use changes nothing here, but is not folded
      const uint64_t h = in.getAlloc().getHandle();
      (s.buffers.count(h) ? lin.dirty : lin.fresh).insert(h);
      fold = Fold{Fold::Kind::alloc, 0, h, 0, in.getAlloc().getSize(), 0};
      break;
    }
    case wire::Instruction::FREE: fold = Fold{Fold::Kind::free, 0, in.getFree().getHandle(), 0, 0, 0}; break;
    case wire::Instruction::WRITE: {  // the guest's own bytes: folded from the log
      auto w = in.getWrite();
      auto data = w.getData();
      const auto at = reinterpret_cast<const std::byte*>(data.begin()) - body.data();
      if (at >= 0 && static_cast<uint64_t>(at) <= body.size() && data.size() <= body.size() - static_cast<uint64_t>(at))
        fold = Fold{Fold::Kind::write, 0, w.getBuffer(), w.getOffset(), data.size(), static_cast<uint64_t>(at)};
      else
        lin.dirty.insert(w.getBuffer());
      break;
    }
    case wire::Instruction::FILL: {
      auto f = in.getFill();
      fold = Fold{Fold::Kind::fill, f.getValue(), f.getBuffer(), f.getOffset(), f.getLength(), 0};
      break;
    }
    case wire::Instruction::COPY: lin.dirty.insert(in.getCopy().getDst()); break;
    case wire::Instruction::LAUNCH:  // a kernel's writes are not declared: every buffer it is passed
      for (auto arg : in.getLaunch().getArgs())
        if (auto h = bufferArg(arg)) lin.dirty.insert(*h);
      break;
    case wire::Instruction::OP:
      if (in.getOp().which() == wire::Op::TENSOR) {  // every operand: the outputs vary by function
        for (auto operand : in.getOp().getTensor().getOperands()) lin.dirty.insert(operand.getBuffer());
      } else {
        for (uint64_t h : outputsOf(in.getOp())) lin.dirty.insert(h);
      }
      break;
    case wire::Instruction::READ:
    case wire::Instruction::FENCE:
    case wire::Instruction::LOAD_PROGRAM:
    case wire::Instruction::DESCRIBE_PROGRAM:
      break;
    default:  // a graph, or what this scheduler does not know: anything may have changed
      lin.allDirty = true;
      break;
  }
  return fold;
}

void Scheduler::readBuffers(Session& s, std::unordered_map<uint64_t, std::string>& into,
                            const std::function<bool(uint64_t)>& wanted) {
  for (auto& [handle, bytes] : s.buffers) {
    if (wanted && !wanted(handle)) continue;
    into[handle].assign(bytes, '\0');
    capnp::MallocMessageBuilder m;
    auto r = m.initRoot<wire::Instruction>().initRead();
    r.setBuffer(handle);
    r.setLength(bytes);
    ++s.job->awaiting;
    sendRemote(s, 0, m, [&s, &into, h = handle](wire::Reply::Reader reply) {
      if (reply.which() == wire::Reply::ERROR) {
        // A buffer whose alloc failed meanwhile is not the guest's; anything else is.
        if (s.buffers.count(h) && !s.job->error) s.job->error = transport::errorFrom(reply.getError().getError());
        into.erase(h);
        return true;
      }
      if (reply.which() != wire::Reply::DATA) return true;
      auto chunk = reply.getData();
      auto it = into.find(h);
      if (it != into.end() && chunk.getOffset() <= it->second.size() &&
          chunk.getData().size() <= it->second.size() - chunk.getOffset())
        std::memcpy(it->second.data() + chunk.getOffset(), chunk.getData().begin(), chunk.getData().size());
      return chunk.getLast();
    });
  }
}

void Scheduler::foldLog(Session& s) {
  Lineage& lin = s.lineage;
  for (auto& e : lin.log.entries()) {
    const Fold& f = e.fold;
    if (f.kind == Fold::Kind::none || lin.readsBack(f.handle)) continue;
    if (f.kind == Fold::Kind::alloc) {  // (one the scheduler refused is dropped after, unless a later one took its place)
      if (f.length <= s.vm->policy.memoryQuota) lin.base[f.handle].assign(f.length, '\0');
      continue;
    }
    auto it = lin.base.find(f.handle);
    if (f.kind == Fold::Kind::free) {
      if (it != lin.base.end()) lin.base.erase(it);
      continue;
    }
    // Out of its buffer's bounds the card refused it too.
    if (it == lin.base.end() || f.offset > it->second.size() || f.length > it->second.size() - f.offset) continue;
    if (f.kind == Fold::Kind::write) std::memcpy(it->second.data() + f.offset, e.bytes.data() + f.dataAt, f.length);
    else std::memset(it->second.data() + f.offset, f.value, f.length);
  }
}

void Scheduler::markCheckpoint(Session& s) {
  Lineage& lin = s.lineage;
  lin.buffers = s.buffers;
  lin.programs = s.programs;
  lin.failed = s.failed;
  lin.memoryUsed = s.memoryUsed;
  lin.log.clear();
  lin.delivered.clear();  // everything in the log was answered before the checkpoint's reads
  lin.dirty.clear();
  lin.fresh.clear();
  lin.allDirty = false;
  lin.replayLeft = 0;
  ++lin.checkpoints;
}

void Scheduler::savedIsCheckpoint(Session& s) {
  if (!s.lineage.on) return;
  s.lineage.base.clear();
  s.lineage.baseInSaved = true;
  markCheckpoint(s);
}

void Scheduler::completeCheckpoint(Session& s) {
  Lineage& lin = s.lineage;
  foldLog(s);
  for (auto& [h, data] : lin.taking) {
    lin.checkpointBytes += data.size();
    lin.base[h] = std::move(data);
  }
  lin.taking.clear();
  std::erase_if(lin.base, [&s](auto& entry) { return !s.buffers.count(entry.first); });  // freed since
  lin.baseInSaved = false;
  markCheckpoint(s);
  for (auto& [h, bytes] : s.buffers)
    if (auto it = lin.base.find(h); it == lin.base.end() || it->second.size() != bytes) {
      lin.drop();  // (the scheduler's own record disagrees with itself: never restore from it)
      event("failover-off", labelOf(s), "its checkpoint lacks buffer " + std::to_string(h));
      return;
    }
}

void Scheduler::maybeCheckpoint(Session& s) {
  Lineage& lin = s.lineage;
  if (!lin.on || !lin.full() || lin.checkpointing || lin.recovering || s.job || s.idle || s.phase != Phase::running ||
      s.members.empty() || !s.unavailable.empty())
    return;
  // What the guest wrote itself folds from the log: with nothing the card changed and no
  // reply outstanding (a read still to answer would, run again, see later writes), the
  // checkpoint is the scheduler's own bookkeeping, and the stream goes on undisturbed.
  if (s.pending.size() == 0 &&
      std::none_of(s.buffers.begin(), s.buffers.end(), [&lin](auto& b) { return lin.readsBack(b.first); })) {
    completeCheckpoint(s);
    return;
  }
  lin.checkpointing = true;
  s.job = std::make_unique<RemoteJob>();
  s.job->finished = [this, &s](std::optional<Error> error) {
    Lineage& lin = s.lineage;
    lin.checkpointing = false;
    if (!error) {
      completeCheckpoint(s);
    } else {
      lin.taking.clear();
      // The log is kept (recovery still works from the last checkpoint) up to twice its
      // cap; past that the lineage is given up rather than let it grow without bound.
      if (lin.log.bytes() >= 2 * lin.capBytes || lin.log.size() >= 2 * kLineageMaxFrames) {
        lin.drop();
        event("failover-off", labelOf(s), "its checkpoint failed twice over (" + error->message +
                                              "); a lost netaccel now ends it as without failover");
      }
      RLOG_WARN("scheduler") << labelOf(s) << ": checkpoint failed: " << error->message;
    }
    if (s.idle) {  // a suspension or a move waited for the checkpoint
      auto idle = std::move(s.idle);
      s.idle = nullptr;
      idle();
      return;
    }
    runHeld(s);
  };
  lin.taking.clear();
  // Only what the card changed since the last checkpoint is read back.
  readBuffers(s, lin.taking, [&lin](uint64_t h) { return lin.readsBack(h); });
  settle(s);
}

void Scheduler::recoverLost(Session& s, const std::string& lost) {
  Lineage& lin = s.lineage;
  if (!lin.recovering) lin.lostAtNs = uv_hrtime();
  ++lin.recoveries;
  lin.recovering = true;
  lin.lost = lost;
  // What was under way on its cards is dropped unanswered: the log issues it again. A
  // suspension or move under way ends here too; the vaccel is off its cards either way.
  s.remoteReplies.clear();
  s.job.reset();
  s.idle = nullptr;
  lin.checkpointing = false;
  lin.taking.clear();
  if (s.phase == Phase::suspending) --suspending_;
  closeMembers(s);
  if (!s.blocks.empty()) leaveBlocks(s);
  // Back to the checkpoint's record of its buffers; the log rebuilds the rest.
  s.vm->memoryUsed -= std::min(s.vm->memoryUsed, s.memoryUsed);
  s.buffers = lin.buffers;
  s.programs = lin.programs;
  s.failed = lin.failed;
  s.memoryUsed = lin.memoryUsed;
  s.vm->memoryUsed += s.memoryUsed;
  s.unconfirmedAllocs.clear();
  if (!lin.baseInSaved) s.saved.clear();
  lin.dirty.clear();  // (the log notes them again as it is re-forwarded)
  lin.fresh.clear();
  lin.allDirty = false;
  // The log goes back ahead of what waited (a second loss mid-replay: the part re-sent
  // so far, then the rest, which still waits).
  lin.replayLeft += lin.log.size();
  auto frames = lin.log.takeFrames();
  for (auto it = frames.rbegin(); it != frames.rend(); ++it) {
    s.heldBytes += it->second.size();
    s.held.push_front(std::move(*it));
  }
  s.phase = Phase::suspended;
  s.why = "recovering: " + lost;
  RLOG_WARN("scheduler") << labelOf(s) << " recovering from its checkpoint: " << lost << "; " << lin.replayLeft
                         << " instruction(s) to run again";
  event("recovering", labelOf(s), lost + "; placing it again, then " + std::to_string(lin.replayLeft) + " instruction(s) run again");
  requestPlacement();
}

void Scheduler::failRecovery(Session& s, const Error& why) {
  Lineage& lin = s.lineage;
  s.unavailable = "it could not be recovered after " + lin.lost + ": " + why.message;
  RLOG_ERROR("scheduler") << labelOf(s) << ": " << s.unavailable;
  event("recovery-failed", labelOf(s), s.unavailable);
  lin.drop();
  lin.recovering = false;
  s.saved.clear();
  s.why = s.unavailable;
  // The log's frames had their answers (or wait in `pending`, failed below); the rest
  // of what waited hears why. The session stays until its program lets go.
  for (; lin.replayLeft && !s.held.empty(); --lin.replayLeft) {
    s.heldBytes -= std::min(s.heldBytes, s.held.front().second.size());
    s.held.pop_front();
  }
  lin.replayLeft = 0;
  s.phase = Phase::running;
  s.pending.failAll(Error{Code::unavailable, s.unavailable});
  runHeld(s);
}

}  // namespace raccel::scheduler
