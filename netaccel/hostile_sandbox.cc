// A sandbox that has been taken over (test only): it speaks netaccel/sandbox.h's
// protocol badly, as guest code that owns its process could. RACCEL_HOSTILE picks how:
//   silent      never says it is ready
//   oversize    answers with a payload larger than the window
//   shortread   answers reads with fewer bytes than asked
//   shrink      tries to shrink and unseal the shared window, then behaves
//   flood       claims a billion kernels in flight and fills the completion ring with
//               made-up kernel times
//   overrun     claims more completions in the ring than it holds
//   extra       sends two replies for each request
//   ahead       an asynchronous device that answers each request and the one after it,
//               before it has been sent
//   ragged      sends each reply with 7 bytes more, a message no whole number of replies
//   burst       sends each reply in a message of kMaxReplies + 1 (the others made up)
//   failwrite   fails every write after taking it
//   failop      an asynchronous device that fails every gemm after taking it
//   stuck       an asynchronous device whose kernels never complete (one always pending)
//   batched     an asynchronous device whose fences fail saying how many requests came
//               before them in their message
//   failfills   an asynchronous device whose fills all fail, each message naming its tag
//   lying       fails allocations with a message said to be longer than the one it sends
// With RACCEL_HOSTILE_MARK=PATH only the first sandbox to create PATH misbehaves; the
// others are asynchronous devices that complete everything at once (and report nothing).
// Every request it does answer, it answers as a working device with nothing in it would.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "hal/device.h"
#include "netaccel/sandbox.h"

using namespace raccel::netaccel::sandbox;

namespace {

constexpr int kSocket = 3, kWindow = 4;

struct Hostile {
  std::string mode;
  CompletionRing* ring = nullptr;
  std::string said;  // the error message of the reply being made, if it fails

  bool send(const Reply& r) { return sendReplies(kSocket, std::span(&r, 1), r.code != 0 ? said : ""); }
  void failWith(Reply& r, std::string message) {
    said = std::move(message);
    r.code = static_cast<uint32_t>(raccel::Code::internal);
    r.payload = said.size();
  }
  bool asynchronous() const {
    for (const char* m : {"flood", "stuck", "honest", "overrun", "failop", "ahead", "batched", "failfills"})
      if (mode == m) return true;
    return false;
  }
  // What the shared memory says while request q is answered.
  void tamperWithTheRing() {
    if (mode == "flood") {
      ring->pending.store(1000000000ull);
      // Tags of every context there may be (others' too), and absurd times, as many as
      // the ring has room for.
      uint64_t head = ring->head.load(), room = kRingEntries - (head - ring->tail.load());
      for (uint64_t i = 0; i < room; ++i) ring->slots[(head + i) % kRingEntries] = {(i % 8) | ((i % 3) << 33), ~0ull};
      ring->head.store(head + room);
    }
    if (mode == "overrun") ring->head.store(ring->tail.load() + kRingEntries + 1);
    if (mode == "stuck") ring->pending.store(1);
  }
  // The reply to q, `inMessage` requests into its message, as this mode makes it.
  Reply replyTo(const Request& q, size_t inMessage) {
    Reply r;
    r.serial = q.serial;
    if (q.op == Op::read) r.payload = q.length;
    if (mode == "oversize") r.payload = kWindowBytes + 1;
    if (mode == "shortread" && q.op == Op::read) r.payload = q.length / 2;
    if (mode == "flood") r.timesKernels = 1;
    if ((mode == "failwrite" && q.op == Op::write) || (mode == "failop" && q.op == Op::gemm)) failWith(r, "nope");
    if (mode == "failfills" && q.op == Op::fill)  // each fill fails, naming its kernel tag
      failWith(r, "the fill of tag " + std::to_string(q.tag) + " failed");
    if (mode == "lying" && q.op == Op::allocate) {  // a message said to be longer than it is
      failWith(r, "nope");
      r.payload = 64;
    }
    if (mode == "batched" && q.op == Op::finish)  // says how many requests came before it in its message
      failWith(r, "after " + std::to_string(inMessage - 1));
    if ((mode == "cardgone" || mode == "lostodd") && q.op == Op::read) {  // says the device is lost, by what
      r.lost = mode == "cardgone" ? uint32_t{kLostByTheCard} : 9u;
      failWith(r, "gone");
    }
    return r;
  }
  // Sends r as this mode does: once, twice, ragged, in a burst, or with the next one's.
  void answer(const Reply& r) {
    if (mode == "ragged" || mode == "burst") {
      std::vector<Reply> many(mode == "burst" ? kMaxReplies + 1 : 2, r);
      const size_t bytes = mode == "burst" ? many.size() * sizeof r : sizeof r + 7;
      (void)::send(kSocket, many.data(), bytes, MSG_NOSIGNAL);
      return;
    }
    send(r);
    if (mode == "extra") send(r);
    if (mode == "ahead") {
      Reply next = r;
      next.serial = r.serial + 1;
      send(next);
    }
  }
};

}  // namespace

int main() {
  Hostile h;
  const char* env = std::getenv("RACCEL_HOSTILE");
  h.mode = env ? env : "";
  if (const char* mark = std::getenv("RACCEL_HOSTILE_MARK"); mark && *mark) {
    int f = ::open(mark, O_CREAT | O_EXCL | O_WRONLY, 0600);
    if (f < 0) h.mode = "honest";
    else ::close(f);
  }
  auto* window = static_cast<std::byte*>(mmap(nullptr, kMappedBytes, PROT_READ | PROT_WRITE, MAP_SHARED, kWindow, 0));
  if (window == MAP_FAILED) return 2;
  h.ring = ringOf(window);
  if (h.mode == "shrink") {
    (void)!ftruncate(kWindow, 0);  // refused: the window is sealed
    (void)fcntl(kWindow, F_ADD_SEALS, 0);
  }
  if (h.mode == "silent") {
    pause();
    return 0;
  }
  Reply ready;
  ready.timesKernels = h.asynchronous();
  h.send(ready);
  std::vector<std::byte> received(kMaxBatchBytes);
  std::span<const std::byte> rest;
  size_t inMessage = 0;  // requests taken from the current message
  for (;;) {
    if (rest.empty()) {
      ssize_t n = ::recv(kSocket, received.data(), received.size(), 0);
      if (n <= 0) return 0;
      rest = std::span<const std::byte>(received.data(), static_cast<size_t>(n));
      inMessage = 0;
    }
    ++inMessage;
    Request q;
    std::span<const std::byte> extra;
    if (!nextRequest(rest, q, extra)) return 1;
    Reply r = h.replyTo(q, inMessage);
    h.tamperWithTheRing();
    h.answer(r);
  }
}
