#include "scheduler/kept_bytes.h"

#include <algorithm>
#include <cstring>
#include <unordered_set>

namespace raccel::scheduler {

KeptBytes::KeptBytes(std::span<const std::byte> bytes) : size_(bytes.size()) {
  for (uint64_t at = 0; at < size_; at += kPieceBytes)
    pieces_.emplace(at, ownedCopy(bytes.subspan(at, std::min<uint64_t>(kPieceBytes, size_ - at))));
}

KeptBytes::Piece KeptBytes::ownedPiece(std::string bytes) {
  auto store = std::make_shared<Store>();
  store->owned = std::move(bytes);
  Piece p{store->owned.size(), reinterpret_cast<const std::byte*>(store->owned.data()), nullptr, 0};
  p.store = std::move(store);
  return p;
}

KeptBytes::Piece KeptBytes::ownedCopy(std::span<const std::byte> data) {
  return ownedPiece(std::string(reinterpret_cast<const char*>(data.data()), data.size()));
}

template <class Pieces>
auto KeptBytes::firstFrom(Pieces& pieces, uint64_t offset) {
  auto it = pieces.upper_bound(offset);
  if (it != pieces.begin()) {
    auto before = std::prev(it);
    if (before->first + before->second.length > offset) return before;
  }
  return it;
}

void KeptBytes::keep(uint64_t at, const Piece& piece, uint64_t skip, uint64_t length) {
  Piece part{length, piece.bytes ? piece.bytes + skip : nullptr, piece.store, piece.value};
  if (part.store && length * 2 < part.store->bytes()) part = ownedCopy({part.bytes, length});
  pieces_.emplace(at, std::move(part));
}

void KeptBytes::carve(uint64_t begin, uint64_t end) {
  auto it = firstFrom(pieces_, begin);
  while (it != pieces_.end() && it->first < end) {
    const uint64_t first = it->first, last = first + it->second.length;
    Piece piece = std::move(it->second);
    it = pieces_.erase(it);
    if (first < begin) keep(first, piece, 0, begin - first);
    if (last > end) keep(end, piece, end - first, last - end);  // (after every piece the loop visits)
  }
}

void KeptBytes::small(uint64_t offset, uint64_t length, const std::byte* data, uint8_t value) {
  const uint64_t block = offset / kBlockBytes * kBlockBytes, blockEnd = std::min(size_, block + kBlockBytes);
  if (offset + length > blockEnd) {  // across two blocks: a part in each
    const uint64_t first = blockEnd - offset;
    small(offset, first, data, value);
    small(blockEnd, length - first, data ? data + first : nullptr, value);
    return;
  }
  auto it = firstFrom(pieces_, offset);
  const bool inPlace = it != pieces_.end() && it->first <= offset && it->first + it->second.length >= offset + length &&
                       it->second.bytes && it->second.store && it->second.store.use_count() == 1 &&
                       it->second.store->body.data() == nullptr;
  if (!inPlace) {  // the block's bytes as one owned piece, first
    std::string bytes(blockEnd - block, '\0');
    copyOut(block, {reinterpret_cast<std::byte*>(bytes.data()), bytes.size()});
    carve(block, blockEnd);
    it = pieces_.emplace(block, ownedPiece(std::move(bytes))).first;
  }
  // Exclusively this piece's (use_count 1, its own string): written in place.
  auto* at = const_cast<std::byte*>(it->second.bytes) + (offset - it->first);
  if (data) std::memcpy(at, data, length);
  else std::memset(at, value, length);
}

void KeptBytes::write(uint64_t offset, std::span<const std::byte> data, transport::Body* owner) {
  if (data.empty() || offset > size_ || data.size() > size_ - offset) return;
  if (data.size() <= kSmallBytes) {
    small(offset, data.size(), data.data(), 0);
    return;
  }
  carve(offset, offset + data.size());
  const bool inOwner = owner && owner->data() && data.data() >= owner->data() &&
                       data.data() + data.size() <= owner->data() + owner->size();
  if (!inOwner) {
    pieces_.emplace(offset, ownedCopy(data));
    return;
  }
  auto store = std::make_shared<Store>();
  store->body = owner->share();
  pieces_.emplace(offset, Piece{data.size(), data.data(), std::move(store), 0});
}

void KeptBytes::fill(uint64_t offset, uint64_t length, uint8_t value) {
  if (length == 0 || offset > size_ || length > size_ - offset) return;
  if (length <= kSmallBytes) {
    small(offset, length, nullptr, value);
    return;
  }
  carve(offset, offset + length);
  if (value != 0) pieces_.emplace(offset, Piece{length, nullptr, nullptr, value});  // (zeros are the background)
}

void KeptBytes::copyOut(uint64_t offset, std::span<std::byte> out) const {
  std::memset(out.data(), 0, out.size());
  const uint64_t end = offset + out.size();
  for (auto it = firstFrom(pieces_, offset); it != pieces_.end() && it->first < end; ++it) {
    const uint64_t from = std::max(offset, it->first), to = std::min(end, it->first + it->second.length);
    std::byte* at = out.data() + (from - offset);
    if (it->second.bytes) std::memcpy(at, it->second.bytes + (from - it->first), to - from);
    else std::memset(at, it->second.value, to - from);
  }
}

bool KeptBytes::zeros(uint64_t offset, uint64_t length) const {
  auto it = firstFrom(pieces_, offset);
  return it == pieces_.end() || it->first >= offset + length;
}

std::string KeptBytes::flatten() const {
  std::string bytes(size_, '\0');
  copyOut(0, {reinterpret_cast<std::byte*>(bytes.data()), bytes.size()});
  return bytes;
}

uint64_t KeptBytes::heldBytes() const {
  uint64_t n = 0;
  std::unordered_set<const Store*> counted;
  for (auto& [at, piece] : pieces_)
    if (piece.store && counted.insert(piece.store.get()).second) n += piece.store->bytes();
  return n;
}

}  // namespace raccel::scheduler
