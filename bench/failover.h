// raccel-bench's failover figures (scheduler/lineage.h): what keeping a lineage costs a
// program (instruction stream and bulk data, lineage on against failover = off in the
// same run), how long a 256 MiB vaccel takes to come back after its netaccel is killed,
// and how much memory the lineage holds under a steady workload. Real processes; called
// from raccel-bench's main thread.
#pragma once

#include <cmath>

#include <cstdint>
#include <string>

namespace raccel::bench {

struct FailoverFigures {
  std::string problem;  // why a figure is missing ("" when all were measured)
  double asyncOn = -1, asyncOff = -1;  // instructions per second, lineage on / failover off
  double bulkOn = -1, bulkOff = -1;    // bulk write+read Gbit/s, the same
  double recoveryMs = -1;              // kill -9 to the next completed instruction
  uint64_t recoveryBytes = 0;          // the vaccel's buffers then
  double lineageMaxBytes = -1;         // most the lineage held, sampled once a second
  double steadySeconds = 0;            // how long that workload ran
  // (NaN when not measured: an overhead within noise may be below zero)
  double overheadPct() const { return asyncOff > 0 && asyncOn > 0 ? 100 * (1 - asyncOn / asyncOff) : std::nan(""); }
  double bulkOverheadPct() const { return bulkOff > 0 && bulkOn > 0 ? 100 * (1 - bulkOn / bulkOff) : std::nan(""); }
};

// `steadySeconds`: how long the steady workload runs (the figure is for 600).
FailoverFigures measureFailover(bool quick, double steadySeconds);
// The figures as JSON fields (no braces), and as raccel-bench's text lines.
std::string failoverJson(const FailoverFigures& f);
void printFailoverText(const FailoverFigures& f);

}  // namespace raccel::bench
