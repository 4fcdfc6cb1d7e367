// The whole evaluation in one call (raccel-sim report): experiment A on both openb pod
// lists for every policy over the seeds, experiment B on the Philly VCs for every
// policy over the arrival-rate sweep, the high-priority and span-penalty studies; a CSV
// of every figure, SVG plots beside them, and report.md. Progress goes to stderr.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "common/error.h"
#include "sim/traces_dir.h"

namespace raccel::sim {

struct ReportOptions {
  std::string out = "sim-report";
  std::string openbDir = tracesDir() + "/openb";
  std::string phillyDir = tracesDir() + "/philly-vc";
  std::vector<uint64_t> seeds{42, 43, 44, 45, 46, 47, 48, 49, 50, 51};
  std::vector<double> rates{0.5, 1.0, 1.5, 2.0};
  std::vector<double> spanPenalties{0, 0.05, 0.1, 0.2};
  double highFraction = 0.1;
  size_t maxJobsPerTenant = 0;  // 0 = all
  std::map<std::string, double> modelTflops;
};

Status writeReport(const ReportOptions& options);

}  // namespace raccel::sim
