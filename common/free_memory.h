// Giving a daemon's free heap back to the system once its traffic stops.
//
// Bulk frames come and go in buffers of megabytes. Whichever allocator the daemon runs
// on keeps what they freed for the next burst: tcmalloc (the daemons', CMake's
// raccel_daemon_malloc) in its page heap, glibc in its arenas. That is right while data
// flows, and only holds the host's memory once it has stopped: a scheduler that relayed
// 1.5 GiB (on tcmalloc) kept 751 MiB resident after the program ended, and 218 MiB a
// second after it with this, most of that its same-host lanes' shared memory.
#pragma once

#include <cstdint>

namespace raccel {

// The allocator's free memory back to the system: tcmalloc's
// (MallocExtension_ReleaseFreeMemory) where the process runs on it, else glibc's
// (malloc_trim). Returns which ("tcmalloc" or "glibc").
const char* releaseFreeMemory();

// Called once a period (a second or so) with the bytes the daemon's links have moved so
// far: after a period that moved kBusyBytes or more, the first quiet period gives the
// free memory back, once.
class FreeMemoryAfterBursts {
 public:
  static constexpr uint64_t kBusyBytes = 1 << 20;
  // True when it gave the memory back now.
  bool tick(uint64_t movedSoFar);

 private:
  uint64_t last_ = 0;
  bool busy_ = false;
};

}  // namespace raccel
