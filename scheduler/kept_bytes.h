// A buffer's bytes kept in the scheduler's memory: a suspended vaccel's saved buffers and
// a lineage's checkpoint (lineage.h). They are pieces over zeros. A piece owns its bytes,
// repeats one value (a fill), or shares the body of a guest's write frame that was
// forwarded: a checkpoint keeps what the guest wrote by reference, so folding a 256 MiB
// write into it copies nothing and an alloc zeroes nothing.
//
// A small write or fill (at most kSmallBytes) goes into an owned piece of the kBlockBytes
// block around it, in place once that piece is there (made from the block's bytes on the
// first): a stream of tiny fills folds at a memset each, not a piece each.
//
// What is kept stays within about twice what can be seen: a piece that later writes cut
// to under half of what its store holds is copied out of it, so a body (or a read-back
// chunk) is not held whole for a sliver of it. Owned pieces are at most kPieceBytes, so
// that copy is small. Not thread-safe; one owner at a time (a fold on the
// loop's thread pool has the whole map while it runs).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>

#include "transport/frame.h"

namespace raccel::scheduler {

class KeptBytes {
 public:
  KeptBytes() = default;
  // `size` zero bytes (an alloc: nothing is held).
  explicit KeptBytes(uint64_t size) : size_(size) {}
  // A copy of these bytes (pieces of kPieceBytes).
  explicit KeptBytes(std::span<const std::byte> bytes);
  static constexpr uint64_t kPieceBytes = 1 << 20;
  static constexpr uint64_t kSmallBytes = 4096, kBlockBytes = 64 << 10;

  uint64_t size() const { return size_; }
  // Overwrites [offset, offset + data.size()) within the bytes (a range past the end is
  // ignored: callers check bounds where the numbers come in). With `owner`, the body that
  // `data` lies inside, the piece shares that body instead of copying it; without, the
  // bytes are copied (callers give at most a chunk, wire::CHUNK_BYTES, at a time).
  void write(uint64_t offset, std::span<const std::byte> data, transport::Body* owner = nullptr);
  void fill(uint64_t offset, uint64_t length, uint8_t value);
  // The bytes of [offset, offset + out.size()) into `out` (which must be within them).
  void copyOut(uint64_t offset, std::span<std::byte> out) const;
  // True when no written piece touches [offset, offset + length): zeros since the alloc.
  bool zeros(uint64_t offset, uint64_t length) const;
  std::string flatten() const;
  // The memory kept alive for these bytes (shared bodies whole, each counted once).
  uint64_t heldBytes() const;
  size_t pieces() const { return pieces_.size(); }

 private:
  struct Store {
    transport::Body body;  // a shared frame body, or
    std::string owned;     // bytes of its own
    size_t bytes() const { return body.data() ? body.size() : owned.size(); }
  };
  struct Piece {
    uint64_t length = 0;
    const std::byte* bytes = nullptr;    // null: every byte is `value`
    std::shared_ptr<const Store> store;  // what `bytes` lies in
    uint8_t value = 0;
  };
  // A small change within one block, in place (`data` null: a fill of `value`).
  void small(uint64_t offset, uint64_t length, const std::byte* data, uint8_t value);
  // Removes every piece's bytes within [begin, end), keeping what lies outside it.
  void carve(uint64_t begin, uint64_t end);
  // Keeps `length` bytes of `piece` from `skip` at `at` (a fragment of a shared body
  // under half that body's bytes is copied out).
  void keep(uint64_t at, const Piece& piece, uint64_t skip, uint64_t length);
  // A piece of its own over `bytes` (moved in), or over a copy of `data`.
  static Piece ownedPiece(std::string bytes);
  static Piece ownedCopy(std::span<const std::byte> data);
  // The first piece of `pieces` (pieces_, const or not) that may overlap [offset, ...).
  template <class Pieces>
  static auto firstFrom(Pieces& pieces, uint64_t offset);

  std::map<uint64_t, Piece> pieces_;  // by their first byte; none overlap
  uint64_t size_ = 0;
};

// Buffer handle -> its kept bytes.
using KeptBuffers = std::unordered_map<uint64_t, KeptBytes>;

}  // namespace raccel::scheduler
