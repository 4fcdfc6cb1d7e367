// Where the traces are by default: $RACCEL_TRACES, else `fallback`: traces/ under the
// current folder (where scripts/get-traces.sh puts them, run from the checkout).
#pragma once

#include <cstdlib>
#include <string>

namespace raccel::sim {

inline std::string tracesDir(const std::string& fallback = "traces") {
  const char* set = std::getenv("RACCEL_TRACES");
  return set && *set ? set : fallback;
}

// What to say when a trace file is not there.
inline std::string howToGetTraces() {
  return "fetch the traces with scripts/get-traces.sh, or point RACCEL_TRACES (or the flag) at them";
}

}  // namespace raccel::sim
