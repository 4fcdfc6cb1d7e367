// A vaccel's lineage (docs/ARCHITECTURE.md, "Failover"): what rebuilds its buffers on
// other cards when a netaccel holding one of its cards is lost. It is a checkpoint (every
// buffer's bytes, read back to the scheduler's memory, and the session's record of its
// buffers and programs then) plus the guest's frames forwarded since, kept as they came.
// Recovery restores the checkpoint on newly placed blocks and re-forwards the log in
// order, ahead of whatever waited; a launch that reads and writes one buffer runs again
// from the state before it. Replies the guest already had are not delivered twice.
// Owned by the loop thread, inside the session (state.h); the logic is in lineage.cc.
#pragma once

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include <capnp/message.h>

#include "common/error.h"
#include "scheduler/kept_bytes.h"
#include "transport/frame.h"

namespace raccel::scheduler {

// At most this many frames between checkpoints, whatever their bytes (tiny instructions
// cost the log more than their bytes: a header, a body and a delivered-reply entry each).
constexpr size_t kLineageMaxFrames = 16384;

// What a checkpoint folds into its kept bytes for one logged instruction (the guest's
// own writes, fills, allocs and frees), worked out as the instruction passes, so that
// a checkpoint never decodes its log again.
struct Fold {
  enum class Kind : uint8_t { none, alloc, free, write, fill };
  Kind kind = Kind::none;
  uint8_t value = 0;      // fill
  uint64_t handle = 0;
  uint64_t offset = 0;    // write, fill
  uint64_t length = 0;    // alloc: its size; write: its data's bytes; fill: how many
  uint64_t dataAt = 0;    // write: where its data is in the frame
};

// The frames forwarded since the checkpoint, in order, as received. Large frames are
// kept by sharing the forwarded body (no copy); small ones are copied into chunks of one
// arena, so the log costs no allocation per instruction and empties at once.
class LineageLog {
 public:
  struct Entry {
    transport::FrameHeader header;
    std::span<const std::byte> bytes;  // the frame's body (in a shared body or the arena)
    Fold fold;
    bool shared = false;  // in a shared body (else in arena chunk number `chunk`)
    uint64_t chunk = 0;
  };
  void add(const transport::FrameHeader& header, transport::Body& body, const Fold& fold);
  const std::vector<Entry>& entries() const { return entries_; }
  size_t size() const { return entries_.size(); }
  uint64_t bytes() const { return bytes_; }
  // Every frame as a body of its own, in order; the log is left empty.
  std::deque<std::pair<transport::FrameHeader, transport::Body>> takeFrames();
  // Forgets the first `n` frames (a checkpoint now holds what they did); the rest stay
  // where they are.
  void dropFirst(size_t n);
  // The first `n` entries, with their bytes kept alive whatever becomes of the log (for a
  // fold on another thread).
  struct Pinned {
    std::vector<Entry> entries;
    std::vector<transport::Body> bodies;
    std::vector<std::shared_ptr<capnp::word[]>> chunks;
  };
  Pinned pinFirst(size_t n);
  void clear();

 private:
  static constexpr size_t kChunkBytes = 256 * 1024, kSharedFromBytes = 4096, kKeptEntries = 1024;
  // A vector, not a deque: a deque's blocks hold four entries, so a stream of tiny
  // instructions cost an allocation every four frames. Dropping the first frames at a
  // checkpoint moves the few logged since its mark.
  std::vector<Entry> entries_;
  std::deque<transport::Body> shared_;  // the shared entries' bodies, in their order
  std::deque<std::shared_ptr<capnp::word[]>> chunks_;  // (shared: a fold may hold some)
  uint64_t firstChunk_ = 0;  // the number of chunks_.front() (chunks are numbered as made)
  size_t usedInLast_ = 0;    // bytes of the last chunk in use
  // A chunk the log let go of and no fold holds, kept for the next one the log needs: a
  // steady stream of checkpoints then reuses two chunks rather than faulting in new pages.
  std::shared_ptr<capnp::word[]> spare_;
  void letGo(std::shared_ptr<capnp::word[]>& chunk);
  uint64_t bytes_ = 0;
};

// What the log's frames may have changed on the card since a point: the buffers a card
// may have written (all, after a graph) and those allocated since (they start from zeros).
struct Changes {
  std::unordered_set<uint64_t> dirty;
  std::unordered_set<uint64_t> fresh;
  bool allDirty = false;
  // A checkpoint with kept bytes `base` reads `handle` back from the card, rather than
  // folding the guest's own writes into it.
  bool readsBack(uint64_t handle, const KeptBuffers& base) const {
    return allDirty || dirty.count(handle) || (!base.count(handle) && !fresh.count(handle));
  }
  void clear() { *this = Changes{}; }
  // Adds a failed checkpoint's changes back (its next try reads them too).
  void merge(Changes& other) {
    dirty.merge(other.dirty);
    fresh.merge(other.fresh);
    allDirty |= other.allDirty;
  }
};

// A checkpoint's fold, run on the loop's thread pool once every byte it needs is in hand:
// the frames before its mark (pinned), the kept bytes it folds them into (the lineage's
// `base` is empty until it ends), what was read back, and the buffers the checkpoint has
// (the others leave the kept bytes). Nothing here is touched by the loop's thread while
// it runs, except through wait().
struct FoldWork {
  LineageLog::Pinned frames;
  Changes changes;
  uint64_t memoryQuota = 0;
  KeptBuffers base, taking;
  std::unordered_set<uint64_t> buffers;
  uint64_t heldBytes = 0;  // base and taking as they came (for the metrics meanwhile)

  void run();   // on the worker
  void wait();  // until run() has ended
  void done();
  bool finished();  // run() has ended (any thread)

 private:
  std::mutex mutex_;
  std::condition_variable ended_;
  bool done_ = false;
};

// Folds `frames` of a log (writes, fills, allocs and frees) into kept bytes `base`, for
// every buffer that `changes` does not read back. A write in a shared body is kept by
// sharing that body (no copy); an alloc holds nothing until written.
void foldFrames(LineageLog::Pinned& frames, const Changes& changes, uint64_t memoryQuota, KeptBuffers& base);

// A checkpoint under way. Its reads went to the card behind the log's first `mark`
// frames and ahead of every later one, so they see the buffers as those frames left them
// while the guest's stream goes on (the background). It keeps the session's record as it
// was at the mark; when the last read is back it becomes the checkpoint, and those
// `mark` frames leave the log.
struct CheckpointUnderWay {
  uint64_t generation = 0;  // replies to an abandoned one's reads are ignored
  size_t mark = 0;
  std::unordered_map<uint64_t, uint64_t> buffers;
  std::map<uint64_t, std::shared_ptr<capnp::MallocMessageBuilder>> programs;
  std::map<uint64_t, std::pair<uint64_t, Error>> failed;
  uint64_t memoryUsed = 0;
  std::map<uint64_t, uint64_t> unconfirmedAllocs;  // sequence -> handle: allocs before the mark a card may yet refuse
  Changes changes;                                 // what the first `mark` frames changed
  KeptBuffers taking;  // the bytes read back so far
  unsigned awaiting = 0;
  std::optional<Error> error;
  std::shared_ptr<FoldWork> folding;  // its fold, once every read is back
};

// A card refused the alloc (buffer or program) of guest instruction `sequence`: the
// record (a session's, or a checkpoint's as of its mark) stops counting it and keeps the
// failure for restores elsewhere. Returns the bytes it no longer holds, or nothing when
// `sequence` was not an alloc the record still awaited.
template <class Record>
std::optional<uint64_t> refuseAlloc(Record& r, uint64_t sequence, const Error& error) {
  auto alloc = r.unconfirmedAllocs.find(sequence);
  if (alloc == r.unconfirmedAllocs.end()) return std::nullopt;
  const uint64_t handle = alloc->second;
  r.unconfirmedAllocs.erase(alloc);
  r.failed[handle] = {sequence, error};
  r.programs.erase(handle);
  uint64_t freed = 0;
  if (auto b = r.buffers.find(handle); b != r.buffers.end()) {
    freed = std::min(r.memoryUsed, b->second);
    r.memoryUsed -= freed;
    r.buffers.erase(b);
  }
  return freed;
}

struct Lineage {
  bool on = false;
  uint64_t capBytes = 0;  // log bytes that start a checkpoint (the VM's lineage_bytes)
  // On, but with no checkpoint yet to rebuild from (started again on a vaccel that was
  // running when the scheduler restarted: its first checkpoint reads every buffer back).
  bool unprotected = false;
  bool canRebuild() const { return on && !unprotected; }

  // The checkpoint. Its bytes are `base`, except between a suspension's (or move's) save
  // and the restore after it, when they are the session's own `saved` (baseInSaved).
  KeptBuffers base;
  bool baseInSaved = false;
  std::unordered_map<uint64_t, uint64_t> buffers;  // handle -> bytes, as the session had them
  std::map<uint64_t, std::shared_ptr<capnp::MallocMessageBuilder>> programs;
  std::map<uint64_t, std::pair<uint64_t, Error>> failed;
  uint64_t memoryUsed = 0;

  // The guest's frames forwarded since the checkpoint.
  LineageLog log;
  // Replies delivered since the checkpoint, by (guest sequence, part: a data chunk's
  // offset, ~1 for kernel times, ~0 for the answer):
  // a re-forwarded instruction's reply the guest already has is dropped.
  struct PairHash {
    size_t operator()(const std::pair<uint64_t, uint64_t>& p) const { return p.first * 0x9e3779b97f4a7c15ull ^ p.second; }
  };
  std::unordered_set<std::pair<uint64_t, uint64_t>, PairHash> delivered;

  // What the log's frames changed (the next checkpoint reads only those buffers back;
  // what the guest wrote itself it folds from the log into the kept bytes), and the
  // checkpoint under way, if one is.
  Changes changes;
  std::unique_ptr<CheckpointUnderWay> underWay;
  uint64_t generations = 0;

  // Recovery: off its cards after a loss, placed again like a suspended vaccel, then
  // restored from the checkpoint; `replayLeft` frames of the log still to re-forward.
  bool recovering = false;
  std::string lost;       // what was lost, for the console and errors
  uint64_t lostAtNs = 0;  // uv_hrtime() at the loss (the recovery's time)
  size_t replayLeft = 0;
  uint64_t recoveries = 0, checkpoints = 0;  // losses it was rebuilt after; checkpoints taken
  uint64_t checkpointBytes = 0;  // read back from cards by checkpoints, in all
  uint64_t overlapped = 0;       // frames forwarded while a checkpoint was under way

  // Sandbox losses that were not its work's doing (killed from outside, its card gone
  // under it): rebuilt after at most kMaxSandboxLosses of them in kSandboxLossWindowNs.
  // Past that, a sandbox that keeps saying its card went away (a hostile one can) is no
  // longer believed, and the loss fails the vaccel as its own. True: rebuild it.
  static constexpr unsigned kMaxSandboxLosses = 3;
  static constexpr uint64_t kSandboxLossWindowNs = 600'000'000'000ull;  // 10 minutes
  unsigned sandboxLosses = 0;
  uint64_t sandboxLossesSinceNs = 0;
  bool countSandboxLoss(uint64_t nowNs) {
    if (sandboxLosses == 0 || nowNs - sandboxLossesSinceNs > kSandboxLossWindowNs) sandboxLosses = 0, sandboxLossesSinceNs = nowNs;
    return ++sandboxLosses <= kMaxSandboxLosses;
  }

  // Bytes the lineage holds in the scheduler's memory now.
  uint64_t heldBytes() const;
  // What the checkpoint's bytes are (base, or the session's saved buffers).
  KeptBuffers& checkpoint(KeptBuffers& saved) {
    return baseInSaved ? saved : base;
  }
  bool full() const { return log.bytes() >= capBytes || log.size() >= kLineageMaxFrames; }
  bool checkpointDue() const { return full() || unprotected; }
  bool atTwiceCap() const { return log.bytes() >= 2 * capBytes || log.size() >= 2 * kLineageMaxFrames; }
  // Twice its cap while a checkpoint is under way: the guest's frames wait for it.
  bool overBound() const { return underWay && atTwiceCap(); }
  // The checkpoint under way is abandoned with the cards its reads went to (a fold, its
  // bytes all in hand, is left to finish).
  void abandonReads() {
    if (underWay && !underWay->folding) underWay.reset();
  }
  // Forgets everything (failover off, or given up).
  void drop();
};

}  // namespace raccel::scheduler
