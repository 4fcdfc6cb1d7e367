#include "sim/plot.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

namespace raccel::sim {

namespace {
std::string escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '<') out += "&lt;";
    else if (c == '>') out += "&gt;";
    else if (c == '&') out += "&amp;";
    else out += c;
  }
  return out;
}

std::string num(double v) {
  char buf[32];
  double a = std::fabs(v);
  if (a != 0 && (a >= 1e5 || a < 1e-2)) std::snprintf(buf, sizeof buf, "%.0e", v);
  else if (a >= 100 || v == std::round(v)) std::snprintf(buf, sizeof buf, "%.0f", v);
  else std::snprintf(buf, sizeof buf, "%.3g", v);
  return buf;
}

const char* kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
                         "#bcbd22", "#17becf", "#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173"};
}  // namespace

std::string renderSvg(const Chart& chart) {
  const double W = 760, H = 460, left = 70, right = 200, top = 40, bottom = 60;
  double xMin = std::numeric_limits<double>::infinity(), xMax = -xMin, yMin = xMin, yMax = -xMin;
  auto fx = [&](double x) { return chart.logX ? std::log10(std::max(x, 1e-9)) : x; };
  for (auto& s : chart.series)
    for (size_t i = 0; i < s.x.size() && i < s.y.size(); ++i) {
      if (chart.logX && s.x[i] <= 0) continue;
      xMin = std::min(xMin, fx(s.x[i])), xMax = std::max(xMax, fx(s.x[i]));
      yMin = std::min(yMin, s.y[i]), yMax = std::max(yMax, s.y[i]);
    }
  if (chart.fixedY) yMin = chart.yMin, yMax = chart.yMax;
  if (!std::isfinite(xMin)) xMin = 0, xMax = 1;
  if (!std::isfinite(yMin)) yMin = 0, yMax = 1;
  if (xMax <= xMin) xMax = xMin + 1;
  if (yMax <= yMin) yMax = yMin + 1;
  const double pw = W - left - right, ph = H - top - bottom;
  auto px = [&](double x) { return left + (fx(x) - xMin) / (xMax - xMin) * pw; };
  auto py = [&](double y) { return top + ph - (std::clamp(y, yMin, yMax) - yMin) / (yMax - yMin) * ph; };
  std::string out;
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" font-family=\"sans-serif\" font-size=\"12\">\n"
                "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
                W, H);
  out += buf;
  out += "<text x=\"" + num(W / 2 - right / 2) + "\" y=\"22\" text-anchor=\"middle\" font-size=\"15\">" + escape(chart.title) + "</text>\n";
  // Axes, grid and ticks.
  for (int i = 0; i <= 5; ++i) {
    double yv = yMin + (yMax - yMin) * i / 5, y = py(yv);
    std::snprintf(buf, sizeof buf, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>\n", left, y, left + pw, y);
    out += buf;
    std::snprintf(buf, sizeof buf, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%s</text>\n", left - 6, y + 4, num(yv).c_str());
    out += buf;
    double xv = xMin + (xMax - xMin) * i / 5, x = left + pw * i / 5;
    std::snprintf(buf, sizeof buf, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%s</text>\n", x, top + ph + 18,
                  num(chart.logX ? std::pow(10, xv) : xv).c_str());
    out += buf;
  }
  std::snprintf(buf, sizeof buf, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" stroke=\"#333\"/>\n", left, top, pw, ph);
  out += buf;
  out += "<text x=\"" + num(left + pw / 2) + "\" y=\"" + num(H - 18) + "\" text-anchor=\"middle\">" + escape(chart.xLabel) + "</text>\n";
  out += "<text transform=\"translate(18," + num(top + ph / 2) + ") rotate(-90)\" text-anchor=\"middle\">" + escape(chart.yLabel) + "</text>\n";
  for (size_t k = 0; k < chart.series.size(); ++k) {
    const Series& s = chart.series[k];
    const char* color = kColors[k % (sizeof kColors / sizeof *kColors)];
    std::string points;
    for (size_t i = 0; i < s.x.size() && i < s.y.size(); ++i) {
      if (chart.logX && s.x[i] <= 0) continue;
      std::snprintf(buf, sizeof buf, "%.1f,%.1f ", px(s.x[i]), py(s.y[i]));
      points += buf;
    }
    out += std::string("<polyline fill=\"none\" stroke-width=\"1.8\" stroke=\"") + color + "\" points=\"" + points + "\"/>\n";
    double ly = top + 10 + 18 * k;
    std::snprintf(buf, sizeof buf, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" stroke-width=\"3\"/>\n", left + pw + 12, ly,
                  left + pw + 32, ly, color);
    out += buf;
    out += "<text x=\"" + num(left + pw + 38) + "\" y=\"" + num(ly + 4) + "\">" + escape(s.label) + "</text>\n";
  }
  out += "</svg>\n";
  return out;
}

}  // namespace raccel::sim
