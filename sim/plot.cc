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
  // Plain decimals from 0.0001 up to a million (0.001, not 1e-03); powers beyond.
  if (a != 0 && (a >= 1e7 || a < 1e-4)) std::snprintf(buf, sizeof buf, "%.0e", v);
  else if (a >= 100 || v == std::round(v)) std::snprintf(buf, sizeof buf, "%.0f", v);
  else std::snprintf(buf, sizeof buf, "%.3g", v);
  return buf;
}

// 16 distinguishable colours (Tableau 10, then darker and lighter relatives), enough for
// the Philly trace's 15 tenants without repeats.
const char* kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
                         "#bcbd22", "#17becf", "#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173", "#a6cee3"};
}  // namespace

std::vector<double> niceTicks(double lo, double hi, int count) {
  if (!(hi > lo) || !std::isfinite(lo) || !std::isfinite(hi)) return {lo};
  double raw = (hi - lo) / std::max(1, count);
  double power = std::pow(10, std::floor(std::log10(raw)));
  double step = power;
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (m * power >= raw) {
      step = m * power;
      break;
    }
  std::vector<double> ticks;
  for (double v = std::floor(lo / step + 1e-9) * step; v < hi + step * 0.999; v += step)
    ticks.push_back(std::fabs(v) < step * 1e-9 ? 0 : v);
  return ticks;
}

namespace {
// Where a chart's values land: its ranges (extended to round ticks) and the plot area.
struct Layout {
  static constexpr double W = 760, H = 460, left = 70, right = 200, top = 40, bottom = 60;
  static constexpr double pw = W - left - right, ph = H - top - bottom;
  bool logX = false;
  double xMin = 0, xMax = 1, yMin = 0, yMax = 1;
  std::vector<double> xTicks, yTicks;
  double fx(double x) const { return logX ? std::log10(std::max(x, 1e-9)) : x; }
  double px(double x) const { return left + (fx(x) - xMin) / (xMax - xMin) * pw; }
  double py(double y) const { return top + ph - (std::clamp(y, yMin, yMax) - yMin) / (yMax - yMin) * ph; }
};

// Stacked: each series' band sits on the sum of those before it (base) up to the sum
// with it (top). Empty for a chart that is not stacked.
struct Bands {
  std::vector<std::vector<double>> base, top;
};
Bands stackedBands(const Chart& chart) {
  Bands b{std::vector<std::vector<double>>(chart.series.size()), std::vector<std::vector<double>>(chart.series.size())};
  if (!chart.stacked || chart.series.empty()) return b;
  std::vector<double> sum(chart.series[0].x.size(), 0);
  for (size_t k = 0; k < chart.series.size(); ++k) {
    b.base[k] = sum;
    for (size_t i = 0; i < sum.size(); ++i) sum[i] += i < chart.series[k].y.size() ? std::max(0.0, chart.series[k].y[i]) : 0;
    b.top[k] = sum;
  }
  return b;
}

Layout layoutOf(const Chart& chart, const Bands& bands) {
  Layout l;
  l.logX = chart.logX;
  double xMin = std::numeric_limits<double>::infinity(), xMax = -xMin, yMin = xMin, yMax = -xMin;
  for (size_t k = 0; k < chart.series.size(); ++k) {
    const Series& s = chart.series[k];
    const auto& xs = chart.stacked ? chart.series[0].x : s.x;
    const auto& ys = chart.stacked ? bands.top[k] : s.y;
    for (size_t i = 0; i < xs.size() && i < ys.size(); ++i) {
      if (chart.logX && xs[i] <= 0) continue;
      xMin = std::min(xMin, l.fx(xs[i])), xMax = std::max(xMax, l.fx(xs[i]));
      yMin = std::min(yMin, ys[i]), yMax = std::max(yMax, ys[i]);
    }
  }
  if (chart.stacked) yMin = std::min(yMin, 0.0);
  if (chart.fixedY) yMin = chart.yMin, yMax = chart.yMax;
  if (!std::isfinite(xMin)) xMin = 0, xMax = 1;
  if (!std::isfinite(yMin)) yMin = 0, yMax = 1;
  if (xMax <= xMin) xMax = xMin + 1;
  if (yMax <= yMin) yMax = yMin + 1;
  // Round ticks, the axes extended to them (a log axis: whole powers of ten).
  l.yTicks = niceTicks(yMin, yMax);
  if (!chart.fixedY) yMin = l.yTicks.front(), yMax = l.yTicks.back();
  if (chart.logX) {
    xMin = std::floor(xMin + 1e-9), xMax = std::max(xMin + 1, std::ceil(xMax - 1e-9));
    for (double e = xMin; e <= xMax + 1e-9; ++e) l.xTicks.push_back(e);
  } else {
    l.xTicks = niceTicks(xMin, xMax, 6);
    xMin = l.xTicks.front(), xMax = l.xTicks.back();
  }
  l.xMin = xMin, l.xMax = xMax, l.yMin = yMin, l.yMax = yMax;
  return l;
}

// The grid, the ticks' values and the axes' labels.
std::string gridSvg(const Layout& l, const Chart& chart) {
  std::string out;
  char buf[512];
  for (double yv : l.yTicks) {
    if (yv < l.yMin - 1e-9 || yv > l.yMax + 1e-9) continue;
    double y = l.py(yv);
    std::snprintf(buf, sizeof buf, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>\n", l.left, y, l.left + l.pw, y);
    out += buf;
    std::snprintf(buf, sizeof buf, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%s</text>\n", l.left - 6, y + 4, num(yv).c_str());
    out += buf;
  }
  for (double xv : l.xTicks) {
    double x = l.left + (xv - l.xMin) / (l.xMax - l.xMin) * l.pw;
    std::snprintf(buf, sizeof buf, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#eee\"/>\n", x, l.top, x, l.top + l.ph);
    out += buf;
    std::snprintf(buf, sizeof buf, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%s</text>\n", x, l.top + l.ph + 18,
                  num(chart.logX ? std::pow(10, xv) : xv).c_str());
    out += buf;
  }
  out += "<text x=\"" + num(l.left + l.pw / 2) + "\" y=\"" + num(Layout::H - 18) + "\" text-anchor=\"middle\">" + escape(chart.xLabel) +
         "</text>\n";
  out += "<text transform=\"translate(18," + num(l.top + l.ph / 2) + ") rotate(-90)\" text-anchor=\"middle\">" + escape(chart.yLabel) +
         "</text>\n";
  return out;
}

// Series `k`: its band (stacked) or line, and its legend entry. The legend lists stacked
// bands top down, as they are drawn.
std::string seriesSvg(const Layout& l, const Chart& chart, const Bands& bands, size_t k) {
  std::string out;
  char buf[512];
  const Series& s = chart.series[k];
  const char* color = kColors[k % (sizeof kColors / sizeof *kColors)];
  std::string points;
  if (chart.stacked) {
    const auto& xs = chart.series[0].x;
    for (size_t i = 0; i < xs.size(); ++i) {
      std::snprintf(buf, sizeof buf, "%.1f,%.1f ", l.px(xs[i]), l.py(bands.top[k][i]));
      points += buf;
    }
    for (size_t i = xs.size(); i-- > 0;) {
      std::snprintf(buf, sizeof buf, "%.1f,%.1f ", l.px(xs[i]), l.py(bands.base[k][i]));
      points += buf;
    }
    out += std::string("<polygon stroke=\"white\" stroke-width=\"0.3\" fill=\"") + color + "\" points=\"" + points + "\"/>\n";
  } else {
    for (size_t i = 0; i < s.x.size() && i < s.y.size(); ++i) {
      if (chart.logX && s.x[i] <= 0) continue;
      std::snprintf(buf, sizeof buf, "%.1f,%.1f ", l.px(s.x[i]), l.py(s.y[i]));
      points += buf;
    }
    out += std::string("<polyline fill=\"none\" stroke-width=\"1.8\" stroke=\"") + color + "\" points=\"" + points + "\"/>\n";
  }
  const double legendStep = std::min(18.0, (l.ph - 10) / std::max<size_t>(1, chart.series.size()));
  double ly = l.top + 10 + legendStep * (chart.stacked ? chart.series.size() - 1 - k : k);
  if (chart.stacked)
    std::snprintf(buf, sizeof buf, "<rect x=\"%.1f\" y=\"%.1f\" width=\"20\" height=\"10\" fill=\"%s\"/>\n", l.left + l.pw + 12, ly - 5, color);
  else
    std::snprintf(buf, sizeof buf, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" stroke-width=\"3\"/>\n",
                  l.left + l.pw + 12, ly, l.left + l.pw + 32, ly, color);
  out += buf;
  out += "<text x=\"" + num(l.left + l.pw + 38) + "\" y=\"" + num(ly + 4) + "\">" + escape(s.label) + "</text>\n";
  return out;
}
}  // namespace

std::string renderSvg(const Chart& chart) {
  const Bands bands = stackedBands(chart);
  const Layout l = layoutOf(chart, bands);
  std::string out;
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" font-family=\"sans-serif\" font-size=\"12\">\n"
                "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
                Layout::W, Layout::H);
  out += buf;
  out += "<text x=\"" + num(Layout::W / 2 - Layout::right / 2) + "\" y=\"22\" text-anchor=\"middle\" font-size=\"15\">" +
         escape(chart.title) + "</text>\n";
  out += gridSvg(l, chart);
  for (size_t k = 0; k < chart.series.size(); ++k) out += seriesSvg(l, chart, bands, k);
  std::snprintf(buf, sizeof buf, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" stroke=\"#333\"/>\n", l.left,
                l.top, l.pw, l.ph);
  out += buf;
  out += "</svg>\n";
  return out;
}

}  // namespace raccel::sim
