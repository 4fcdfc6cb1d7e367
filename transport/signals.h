// Runs a daemon's loop until SIGINT or SIGTERM, then calls `stop` (which must close the
// daemon's handles) and lets the loop finish. Ignores SIGPIPE: libuv does not.
// Call from the thread that owns `loop`.
#pragma once

#include <uv.h>

#include <functional>

namespace raccel::transport {

void runUntilSignalled(uv_loop_t* loop, std::function<void()> stop);

// Holds SIGINT and SIGTERM back (blocked in the calling thread and every thread it starts
// later), so that a stop asked for while the daemon starts is kept, not fatal: it is
// taken when runUntilSignalled lets them through. Call first thing in main.
void holdStopSignals();
// Whether SIGINT or SIGTERM is held back, waiting (a start that waits long checks it).
bool stopPending();

}  // namespace raccel::transport
