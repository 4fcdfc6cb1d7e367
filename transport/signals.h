// Runs a daemon's loop until SIGINT or SIGTERM, then calls `stop` (which must close the
// daemon's handles) and lets the loop finish. Ignores SIGPIPE: libuv does not.
// Call from the thread that owns `loop`.
#pragma once

#include <uv.h>

#include <functional>

namespace raccel::transport {

void runUntilSignalled(uv_loop_t* loop, std::function<void()> stop);

}  // namespace raccel::transport
