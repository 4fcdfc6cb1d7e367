// libFuzzer target: raw bytes on a fresh connection to the console socket (queries and actions) of a real scheduler with a
// real netaccel behind it (tests/fuzz/harness.h). Seeds: frames captured from real runs.
#include <cstddef>
#include <cstdint>

#include "tests/fuzz/harness.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  raccel::fuzz::sendToDaemons(raccel::fuzz::Port::console, data, size);
  return 0;
}
