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
#include "scheduler/relocate/relocator.h"
#include "scheduler/state.h"
#include "transport/wire_types.h"

namespace raccel::scheduler {

void LineageLog::add(const transport::FrameHeader& header, transport::Body& body, const Fold& fold) {
  Entry e{header, {}, fold};
  if (body.size() >= kSharedFromBytes) {
    shared_.push_back(body.share());  // (the bytes forwarded, not a copy)
    e.bytes = {shared_.back().data(), shared_.back().size()};
    e.shared = true;
  } else {
    const size_t words = (body.size() + 7) / 8;  // word-aligned, as a decoder wants them
    if (chunks_.empty() || usedInLast_ + words * 8 > kChunkBytes) {
      // (Not zeroed: a frame's words are all written as it is copied in, its pad too.)
      chunks_.push_back(spare_ ? std::move(spare_) : std::make_shared_for_overwrite<capnp::word[]>(kChunkBytes / 8));
      usedInLast_ = 0;
    }
    std::byte* at = reinterpret_cast<std::byte*>(chunks_.back().get()) + usedInLast_;
    if (body.size()) std::memcpy(at, body.data(), body.size());
    std::memset(at + body.size(), 0, words * 8 - body.size());  // (the word's pad: never stale bytes)
    usedInLast_ += words * 8;
    e.bytes = {at, body.size()};
    e.chunk = firstChunk_ + chunks_.size() - 1;
  }
  entries_.push_back(e);
  bytes_ += body.size();
}

void LineageLog::dropFirst(size_t n) {
  if (n >= entries_.size()) {
    clear();
    return;
  }
  size_t shared = 0;
  for (size_t i = 0; i < n; ++i) {
    bytes_ -= entries_[i].bytes.size();
    shared += entries_[i].shared;
  }
  entries_.erase(entries_.begin(), entries_.begin() + static_cast<std::ptrdiff_t>(n));
  shared_.erase(shared_.begin(), shared_.begin() + static_cast<std::ptrdiff_t>(shared));
  // The chunks before the first one a remaining frame is in go (the last one stays: the
  // next frames go there).
  uint64_t keepFrom = firstChunk_ + chunks_.size() - 1;
  for (auto& e : entries_)
    if (!e.shared) {
      keepFrom = std::min(keepFrom, e.chunk);
      break;
    }
  while (firstChunk_ < keepFrom) {
    letGo(chunks_.front());
    chunks_.pop_front();
    ++firstChunk_;
  }
}

void LineageLog::letGo(std::shared_ptr<capnp::word[]>& chunk) {
  if (!spare_ && chunk.use_count() == 1) spare_ = std::move(chunk);
}

LineageLog::Pinned LineageLog::pinFirst(size_t n) {
  Pinned pinned;
  n = std::min(n, entries_.size());
  pinned.entries.assign(entries_.begin(), entries_.begin() + static_cast<std::ptrdiff_t>(n));
  size_t shared = 0;
  std::optional<uint64_t> lastChunk;
  for (auto& e : pinned.entries) {
    if (e.shared) {
      pinned.bodies.push_back(shared_[shared++].share());
    } else if (!e.bytes.empty() && e.chunk != lastChunk) {
      pinned.chunks.push_back(chunks_[e.chunk - firstChunk_]);
      lastChunk = e.chunk;
    }
  }
  return pinned;
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
  if (entries_.capacity() > kKeptEntries) std::vector<Entry>().swap(entries_);  // (an idle log holds little)
  entries_.clear();
  shared_.clear();
  // One stays for the next frames, unless a fold still reads it.
  while (!chunks_.empty() && (chunks_.size() > 1 || chunks_.front().use_count() > 1)) {
    letGo(chunks_.front());
    chunks_.pop_front();
    ++firstChunk_;
  }
  usedInLast_ = 0;
  bytes_ = 0;
}

uint64_t Lineage::heldBytes() const {
  uint64_t n = log.bytes();
  for (auto& [h, data] : base) n += data.heldBytes();
  if (underWay && underWay->folding) n += underWay->folding->heldBytes;
  else if (underWay)
    for (auto& [h, data] : underWay->taking) n += data.heldBytes();
  return n;
}

void foldFrames(LineageLog::Pinned& frames, const Changes& changes, uint64_t memoryQuota, KeptBuffers& base) {
  size_t shared = 0;  // the next shared entry's body in frames.bodies
  for (const auto& e : frames.entries) {
    transport::Body* owner = e.shared && shared < frames.bodies.size() ? &frames.bodies[shared] : nullptr;
    shared += e.shared;
    const Fold& f = e.fold;
    if (f.kind == Fold::Kind::none || changes.readsBack(f.handle, base)) continue;
    if (f.kind == Fold::Kind::alloc) {  // (one the scheduler refused is dropped after, unless a later one took its place)
      if (f.length <= memoryQuota) base[f.handle] = KeptBytes(f.length);
      continue;
    }
    auto it = base.find(f.handle);
    if (f.kind == Fold::Kind::free) {
      if (it != base.end()) base.erase(it);
      continue;
    }
    // Out of its buffer's bounds the card refused it too.
    if (it == base.end() || f.offset > it->second.size() || f.length > it->second.size() - f.offset) continue;
    if (f.kind == Fold::Kind::fill) {
      it->second.fill(f.offset, f.length, f.value);
    } else if (f.dataAt <= e.bytes.size() && f.length <= e.bytes.size() - f.dataAt) {
      it->second.write(f.offset, e.bytes.subspan(f.dataAt, f.length), owner);
    }
  }
}

void FoldWork::run() {
  foldFrames(frames, changes, memoryQuota, base);
  for (auto& [h, data] : taking) base[h] = std::move(data);
  std::erase_if(base, [this](auto& entry) { return !buffers.count(entry.first); });  // freed, or refused
  frames = {};  // (the log's bytes are let go here, off the loop's thread too)
}

void FoldWork::done() {
  std::lock_guard lock(mutex_);
  done_ = true;
  ended_.notify_all();
}

bool FoldWork::finished() {
  std::lock_guard lock(mutex_);
  return done_;
}

void FoldWork::wait() {
  std::unique_lock lock(mutex_);
  ended_.wait(lock, [this] { return done_; });
}

void Lineage::drop() {
  on = false;
  unprotected = false;
  base.clear();
  baseInSaved = false;
  buffers.clear();
  changes.clear();
  programs.clear();
  failed.clear();
  log.clear();
  delivered.clear();
  underWay.reset();
}

void Scheduler::startLineage(Session& s) {
  s.lineage.on = s.vm->policy.failover;
  s.lineage.capBytes = s.vm->policy.lineageBytes;
}

void Scheduler::protectAfterRestart(Session& s) {
  // Its log before the restart died with the old process: a checkpoint of every buffer
  // (in the background, as any) is where its lineage starts again.
  if (!s.vm->policy.failover || !s.unavailable.empty() || s.phase != Phase::running) return;
  s.lineage.drop();
  startLineage(s);
  s.lineage.unprotected = true;
  s.lineage.changes.allDirty = true;
  maybeCheckpoint(s);
}

void Scheduler::logFrame(Session& s, const transport::FrameHeader& h, transport::Body& body, wire::Instruction::Reader in) {
  Lineage& lin = s.lineage;
  if (!lin.on || h.sequence >= kSchedulerSequences) return;  // (refused unforwarded: nothing to rebuild)
  lin.log.add(h, body, noteInstruction(s, in, body));
  if (lin.underWay) ++lin.overlapped;
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

Fold Scheduler::noteInstruction(Session& s, wire::Instruction::Reader in, const transport::Body& body) {
  Lineage& lin = s.lineage;
  Fold fold;
  switch (in.which()) {
    case wire::Instruction::ALLOC: {  // one of a handle in use changes nothing here, but is not folded
      const uint64_t h = in.getAlloc().getHandle();
      (s.buffers.count(h) ? lin.changes.dirty : lin.changes.fresh).insert(h);
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
        lin.changes.dirty.insert(w.getBuffer());
      break;
    }
    case wire::Instruction::FILL: {
      auto f = in.getFill();
      fold = Fold{Fold::Kind::fill, f.getValue(), f.getBuffer(), f.getOffset(), f.getLength(), 0};
      break;
    }
    case wire::Instruction::COPY: lin.changes.dirty.insert(in.getCopy().getDst()); break;
    case wire::Instruction::LAUNCH:  // a kernel's writes are not declared: every buffer it is passed
      for (auto arg : in.getLaunch().getArgs())
        if (auto h = bufferArg(arg)) lin.changes.dirty.insert(*h);
      break;
    case wire::Instruction::OP:
      if (in.getOp().which() == wire::Op::TENSOR) {  // every operand: the outputs vary by function
        for (auto operand : in.getOp().getTensor().getOperands()) lin.changes.dirty.insert(operand.getBuffer());
      } else {
        for (uint64_t h : outputsOf(in.getOp())) lin.changes.dirty.insert(h);
      }
      break;
    case wire::Instruction::READ:
    case wire::Instruction::FENCE:
    case wire::Instruction::LOAD_PROGRAM:
    case wire::Instruction::DESCRIBE_PROGRAM:
      break;
    default:  // a graph, or what this scheduler does not know: anything may have changed
      lin.changes.allDirty = true;
      break;
  }
  return fold;
}

namespace {
// A read's chunk of data, into its buffer's bytes (within them).
void copyChunk(KeptBuffers& into, uint64_t handle, wire::DataChunk::Reader chunk) {
  auto it = into.find(handle);
  auto data = chunk.getData();
  if (it != into.end()) it->second.write(chunk.getOffset(), {reinterpret_cast<const std::byte*>(data.begin()), data.size()});
}

capnp::MallocMessageBuilder& readOf(capnp::MallocMessageBuilder& m, uint64_t handle, uint64_t bytes) {
  auto r = m.initRoot<wire::Instruction>().initRead();
  r.setBuffer(handle);
  r.setLength(bytes);
  return m;
}
}  // namespace

void Scheduler::readBuffers(Session& s, KeptBuffers& into) {
  for (auto& [handle, bytes] : s.buffers) {
    into[handle] = KeptBytes(bytes);
    capnp::MallocMessageBuilder m;
    ++s.job->awaiting;
    sendRemote(s, 0, readOf(m, handle, bytes), [&s, &into, h = handle](wire::Reply::Reader reply) {
      if (reply.which() == wire::Reply::ERROR) {
        // A buffer whose alloc failed meanwhile is not the guest's; anything else is.
        if (s.buffers.count(h) && !s.job->error) s.job->error = transport::errorFrom(reply.getError().getError());
        into.erase(h);
        return true;
      }
      if (reply.which() != wire::Reply::DATA) return true;
      copyChunk(into, h, reply.getData());
      return reply.getData().getLast();
    });
  }
}

void Scheduler::savedIsCheckpoint(Session& s) {
  Lineage& lin = s.lineage;
  if (!lin.on) return;
  lin.base.clear();
  lin.baseInSaved = true;
  lin.underWay.reset();  // (the save is later than it)
  lin.buffers = s.buffers;
  lin.programs = s.programs;
  lin.failed = s.failed;
  lin.memoryUsed = s.memoryUsed;
  lin.log.clear();
  lin.delivered.clear();  // everything in the log was answered before the save's reads
  lin.changes.clear();
  lin.replayLeft = 0;
  ++lin.checkpoints;
}

std::unique_ptr<CheckpointUnderWay> Scheduler::checkpointNow(Session& s) {
  Lineage& lin = s.lineage;
  auto cp = std::make_unique<CheckpointUnderWay>();
  cp->generation = ++lin.generations;
  cp->mark = lin.log.size();
  cp->buffers = s.buffers;
  cp->programs = s.programs;
  cp->failed = s.failed;
  cp->memoryUsed = s.memoryUsed;
  cp->unconfirmedAllocs = s.unconfirmedAllocs;
  cp->changes = std::move(lin.changes);
  lin.changes.clear();  // from here on: what the frames after the mark change
  return cp;
}

void Scheduler::startFold(Session& s) {
  Lineage& lin = s.lineage;
  CheckpointUnderWay& cp = *lin.underWay;
  auto work = std::make_shared<FoldWork>();
  if (lin.baseInSaved) {  // (the suspension's saved bytes were the checkpoint: they are its start)
    lin.base = std::move(s.saved);  // (a running session's saved bytes serve nothing else)
    s.saved.clear();
    lin.baseInSaved = false;
  }
  work->frames = lin.log.pinFirst(cp.mark);
  work->changes = cp.changes;
  work->memoryQuota = s.vm->policy.memoryQuota;
  work->base = std::move(lin.base);
  lin.base.clear();
  work->taking = std::move(cp.taking);
  for (auto& [h, data] : work->base) work->heldBytes += data.heldBytes();
  for (auto& [h, data] : work->taking) {
    work->heldBytes += data.heldBytes();
    lin.checkpointBytes += data.size();
  }
  for (auto& [h, bytes] : cp.buffers) work->buffers.insert(h);
  cp.folding = work;
  // Off the loop's thread: a fold copies up to a cap of written bytes and zeroes every
  // buffer allocated since, which would stall every vaccel's stream meanwhile.
  struct Request {
    uv_work_t req;
    Scheduler* self;
    VaccelId id;
    uint64_t generation;
    std::shared_ptr<FoldWork> work;
  };
  auto* r = new Request{{}, this, s.id, cp.generation, work};
  r->req.data = r;
  const int queued = uv_queue_work(
      loop_, &r->req,
      [](uv_work_t* req) {
        auto* r = static_cast<Request*>(req->data);
        r->work->run();
        r->work->done();
      },
      [](uv_work_t* req, int) {
        std::unique_ptr<Request> r(static_cast<Request*>(req->data));
        Session* s = r->self->sessionById(r->id);
        if (!s || !s->lineage.underWay || s->lineage.underWay->generation != r->generation) return;  // abandoned
        r->self->finishFold(*s, true);
      });
  if (queued != 0) {  // (the loop is closing): folded here, as the caller waits
    delete r;
    work->run();
    work->done();
    finishFold(s, false);
  }
}

void Scheduler::finishFold(Session& s, bool resume) {
  Lineage& lin = s.lineage;
  auto cp = std::move(lin.underWay);
  lin.base = std::move(cp->folding->base);
  // The frames before the mark were all answered before its reads were, and are never
  // sent again: what was delivered matters only for the frames after it.
  lin.log.dropFirst(cp->mark);
  std::vector<uint64_t> after;  // (sorted, not hashed: no allocation per frame)
  after.reserve(lin.log.size());
  for (auto& e : lin.log.entries()) after.push_back(e.header.sequence);
  if (!std::is_sorted(after.begin(), after.end())) std::sort(after.begin(), after.end());
  std::erase_if(lin.delivered, [&after](auto& key) { return !std::binary_search(after.begin(), after.end(), key.first); });
  lin.buffers = std::move(cp->buffers);
  lin.programs = std::move(cp->programs);
  lin.failed = std::move(cp->failed);
  lin.memoryUsed = cp->memoryUsed;
  lin.unprotected = false;
  ++lin.checkpoints;
  for (auto& [h, bytes] : lin.buffers)
    if (auto it = lin.base.find(h); it == lin.base.end() || it->second.size() != bytes) {
      lin.drop();  // (the scheduler's own record disagrees with itself: never restore from it)
      event("failover-off", labelOf(s), "its checkpoint lacks buffer " + std::to_string(h));
      break;
    }
  if (resume && !s.job && !s.idle) runHeld(s);  // (frames held at twice the cap)
}

bool Scheduler::mustHoldNow(Session& s) {
  CheckpointUnderWay* cp = s.lineage.underWay.get();
  if (cp && cp->folding && s.lineage.atTwiceCap() && cp->folding->finished())
    finishFold(s, false);  // (its end on the loop then finds another generation, or none, and stops)
  return s.mustHold();
}

void Scheduler::awaitFold(Session& s) {
  CheckpointUnderWay* cp = s.lineage.underWay.get();
  if (!cp || !cp->folding) return;
  cp->folding->wait();  // (bounded: at most a cap's copying; only when a card was lost mid-fold)
  finishFold(s, false);
}

void Scheduler::maybeCheckpoint(Session& s) {
  Lineage& lin = s.lineage;
  if (!lin.on || !lin.checkpointDue() || lin.underWay || lin.recovering || s.job || s.idle || s.phase != Phase::running ||
      s.members.empty() || !s.primary().node || !s.unavailable.empty())
    return;
  auto cp = checkpointNow(s);
  // What the guest wrote itself folds from the log: with nothing the card changed and no
  // reply outstanding (a read still to answer would, run again, see later writes), the
  // checkpoint is the scheduler's own bookkeeping.
  std::vector<std::pair<uint64_t, uint64_t>> reads;
  for (auto& [h, bytes] : cp->buffers)
    if (cp->changes.readsBack(h, lin.checkpoint(s.saved))) reads.emplace_back(h, bytes);
  if (reads.empty() && s.pending.size() == 0) {
    lin.underWay = std::move(cp);
    startFold(s);
    return;
  }
  // Otherwise it is taken in the background: the reads (a fence when there are none) go
  // behind the frames so far, and the guest's stream goes on.
  lin.underWay = std::move(cp);
  CheckpointUnderWay& under = *lin.underWay;
  under.awaiting = static_cast<unsigned>(std::max<size_t>(reads.size(), 1));
  auto handler = [this, &s, generation = under.generation](uint64_t h, wire::Reply::Reader reply) {
    CheckpointUnderWay* cp = s.lineage.underWay.get();
    if (!cp || cp->generation != generation) return true;  // abandoned
    bool done = true;
    if (reply.which() == wire::Reply::ERROR) {
      // A buffer whose alloc failed before the mark is not the guest's; anything else is.
      if (cp->buffers.count(h) && !cp->error) cp->error = transport::errorFrom(reply.getError().getError());
      cp->taking.erase(h);
    } else if (reply.which() == wire::Reply::DATA) {
      copyChunk(cp->taking, h, reply.getData());
      done = reply.getData().getLast();
    }
    if (done) --cp->awaiting;
    return done;  // (then settleCheckpoint)
  };
  if (reads.empty()) {
    capnp::MallocMessageBuilder f;
    f.initRoot<wire::Instruction>().setFence();
    sendRemote(s, 0, f, [handler](wire::Reply::Reader reply) { return handler(0, reply); }, Settles::checkpoint);
  }
  for (auto& [h, bytes] : reads) {
    under.taking[h] = KeptBytes(bytes);
    capnp::MallocMessageBuilder m;
    sendRemote(s, 0, readOf(m, h, bytes), [handler, h](wire::Reply::Reader reply) { return handler(h, reply); },
               Settles::checkpoint);
  }
}

void Scheduler::settleCheckpoint(Session& s) {
  Lineage& lin = s.lineage;
  if (!lin.underWay || lin.underWay->awaiting > 0 || lin.underWay->folding) return;
  if (!lin.underWay->error) {
    startFold(s);
  } else {
    auto cp = std::move(lin.underWay);
    // The log is kept (recovery still works from the last checkpoint); the frames it
    // held back go on, and the next frame tries again. Past twice its cap the lineage is
    // given up rather than let the guest wait on checkpoints that keep failing.
    lin.changes.merge(cp->changes);
    if (lin.atTwiceCap()) {
      lin.drop();
      event("failover-off", labelOf(s), "its checkpoint failed with its log at twice its cap (" + cp->error->message +
                                            "); a lost netaccel now ends it as without failover");
    }
    RLOG_WARN("scheduler") << labelOf(s) << ": checkpoint failed: " << cp->error->message;
  }
  if (!s.job && !s.idle) runHeld(s);
}

void Scheduler::recoverLost(Session& s, const std::string& lost) {
  Lineage& lin = s.lineage;
  if (!lin.recovering) lin.lostAtNs = uv_hrtime();
  ++lin.recoveries;
  awaitFold(s);  // (a checkpoint whose bytes were all in hand is the one to rebuild from)
  lin.recovering = true;
  lin.lost = lost;
  // What was under way on its cards is dropped unanswered: the log issues it again. A
  // suspension or move under way ends here too; the vaccel is off its cards either way.
  s.remoteReplies.clear();
  s.job.reset();
  s.idle = nullptr;
  lin.underWay.reset();  // (it was not finished: the last checkpoint and the whole log rebuild it)
  if (s.phase == Phase::suspending) relocator_->suspensionEnded();
  closeMembers(s);
  if (!s.blocks.empty()) relocator_->leaveBlocks(s);
  // Back to the checkpoint's record of its buffers; the log rebuilds the rest.
  s.vm->memoryUsed -= std::min(s.vm->memoryUsed, s.memoryUsed);
  s.buffers = lin.buffers;
  s.programs = lin.programs;
  s.failed = lin.failed;
  s.memoryUsed = lin.memoryUsed;
  s.vm->memoryUsed += s.memoryUsed;
  s.unconfirmedAllocs.clear();
  if (!lin.baseInSaved) s.saved.clear();
  lin.changes.clear();  // (the log notes them again as it is re-forwarded)
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
  relocator_->requestPlacement();
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
