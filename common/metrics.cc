#include "common/metrics.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>

namespace raccel {
namespace {

bool validName(const std::string& name) {
  if (name.empty()) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    char c = name[i];
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':' || (i > 0 && c >= '0' && c <= '9');
    if (!ok) return false;
  }
  return true;
}

std::string number(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[40];
  for (int precision = 1; precision <= 17; ++precision) {  // the shortest text that reads back as v
    std::snprintf(buf, sizeof buf, "%.*g", precision, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  return buf;
}

}  // namespace

void MetricsPage::family(const std::string& name, const char* type, const std::string& help) {
  if (!validName(name)) throw std::logic_error("bad metric name " + name);
  out_ += "# HELP " + name + " ";
  for (char c : help) out_ += c == '\\' ? "\\\\" : c == '\n' ? "\\n" : std::string(1, c);
  out_ += "\n# TYPE " + name + " " + type + "\n";
}

void MetricsPage::sample(const std::string& name, const Labels& labels, double value) {
  out_ += name;
  if (!labels.empty()) {
    out_ += '{';
    for (size_t i = 0; i < labels.size(); ++i) {
      if (!validName(labels[i].first)) throw std::logic_error("bad label name " + labels[i].first);
      out_ += (i ? "," : "") + labels[i].first + "=\"";
      for (char c : labels[i].second) out_ += c == '\\' ? "\\\\" : c == '"' ? "\\\"" : c == '\n' ? "\\n" : std::string(1, c);
      out_ += '"';
    }
    out_ += '}';
  }
  out_ += ' ' + number(value) + '\n';
}

void Histogram::observe(double value) {
  for (size_t i = 0; i < bounds_.size(); ++i)
    if (value <= bounds_[i]) {
      ++counts_[i];
      break;
    }
  ++count_;
  sum_ += value;
}

void Histogram::write(MetricsPage& page, const std::string& name, const Labels& labels) const {
  uint64_t cumulative = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    cumulative = i < bounds_.size() ? cumulative + counts_[i] : count_;
    Labels l = labels;
    l.emplace_back("le", i < bounds_.size() ? number(bounds_[i]) : "+Inf");
    page.sample(name + "_bucket", l, static_cast<double>(cumulative));
  }
  page.sample(name + "_sum", labels, sum_);
  page.sample(name + "_count", labels, static_cast<double>(count_));
}

}  // namespace raccel
