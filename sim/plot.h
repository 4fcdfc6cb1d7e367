// Line charts and stacked-area charts as standalone SVG files (the report's figures):
// no plotting library. Axes are ticked at round numbers (1, 2 or 5 times a power of ten;
// powers of ten on a log axis) and extended to the ticks around the data.
#pragma once

#include <string>
#include <vector>

namespace raccel::sim {

struct Series {
  std::string label;
  std::vector<double> x, y;
};

struct Chart {
  std::string title, xLabel, yLabel;
  std::vector<Series> series;
  bool logX = false;
  bool fixedY = false;  // use yMin..yMax instead of the data's range
  double yMin = 0, yMax = 100;
  // Each series is drawn as a filled band on top of the ones before it (all on the
  // first series' x), e.g. tenants' shares adding up to what the cluster holds.
  bool stacked = false;
};

// Round tick values covering [lo, hi] (about `count` of them; 1, 2 or 5 times a power of ten apart).
std::vector<double> niceTicks(double lo, double hi, int count = 5);

std::string renderSvg(const Chart& chart);

}  // namespace raccel::sim
