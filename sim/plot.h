// Line charts as standalone SVG files (the report's figures): no plotting library.
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
};

std::string renderSvg(const Chart& chart);

}  // namespace raccel::sim
