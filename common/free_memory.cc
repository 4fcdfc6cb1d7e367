#include "common/free_memory.h"

#include <malloc.h>

#include <algorithm>

// gperftools' C interface, there only where the process is linked with tcmalloc.
extern "C" void MallocExtension_ReleaseFreeMemory(void) __attribute__((weak));

namespace raccel {

const char* releaseFreeMemory() {
  if (MallocExtension_ReleaseFreeMemory) {
    MallocExtension_ReleaseFreeMemory();
    return "tcmalloc";
  }
  malloc_trim(0);
  return "glibc";
}

bool FreeMemoryAfterBursts::tick(uint64_t movedSoFar) {
  const uint64_t moved = movedSoFar - std::min(movedSoFar, last_);  // (a link gone lowers the sum)
  last_ = movedSoFar;
  if (moved >= kBusyBytes) {
    busy_ = true;
    return false;
  }
  if (!busy_) return false;
  busy_ = false;
  releaseFreeMemory();
  return true;
}

}  // namespace raccel
