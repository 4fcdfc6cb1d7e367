// libFuzzer target: the frame reader every link uses, over a byte stream cut into reads
// of fuzzer-chosen sizes, and each frame's body decoded as every message the daemons
// read (guest instruction, node message, console request, link control) and walked whole.
#include <capnp/message.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <cstdint>

#include "schema/console.capnp.h"
#include "schema/frame.capnp.h"
#include "schema/guest.capnp.h"
#include "schema/node.capnp.h"
#include "transport/frame.h"

namespace {
template <class Root>
void walk(const raccel::transport::Body& body) {
  (void)raccel::transport::decodeGuard([&] {
    raccel::transport::MessageView view(body);
    (void)kj::str(view.root<Root>());
  });
}

struct Walker : raccel::transport::FrameReader::Sink {
  size_t frames = 0;
  void onFrame(const raccel::transport::FrameHeader&, raccel::transport::Body body) override {
    ++frames;
    // Stringifying reads every field, pointer and list, as a careless handler might;
    // like the daemons, everything that decodes (the reader's constructor too) is guarded.
    walk<raccel::wire::Instruction>(body);
    walk<raccel::wire::NodeMessage>(body);
    walk<raccel::wire::ConsoleRequest>(body);
    walk<raccel::wire::LinkControl>(body);
  }
  void onOversized(const raccel::transport::FrameHeader&) override {}
};
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  // The first byte: the maximum frame size class and the read sizes.
  uint8_t control = data[0];
  raccel::transport::FrameReader reader(control & 1 ? 4096 : (256u << 10));  // both above and below kDirectBytes
  Walker walker;
  size_t at = 1, step = 1 + (control >> 1);
  while (at < size) {
    auto room = reader.writable();
    size_t n = std::min<size_t>({room.size(), size - at, step});
    std::memcpy(room.data(), data + at, n);
    reader.commit(n, walker);
    at += n;
    step = step * 7 % 509 + 1;  // varied read sizes, as a socket gives them
  }
  return 0;
}
