// The daemons as a fuzz target meets them: a real raccel-scheduler and a real netaccel
// (one CPU card) in this process, on one libuv loop, started once; each input is sent as
// raw bytes on a fresh connection to one of the scheduler's listeners, the loop runs
// until the scheduler has answered or gone quiet, and the connection closes. Used from
// the fuzzer's thread only. A crash, a sanitizer report or a leak is the finding.
#pragma once

#include <uv.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace raccel::fuzz {

enum class Port { vm, node, console };

// Starts the daemons on the first call (a temporary folder for sockets; logs at error
// level only), then sends `data` to `port` and pumps the loop. Never throws.
void sendToDaemons(Port port, const uint8_t* data, size_t size);

}  // namespace raccel::fuzz
