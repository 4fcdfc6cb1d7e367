// Writes metrics in the Prometheus text exposition format (version 0.0.4), for the
// daemons' /metrics. A daemon builds the page when it is scraped, from its own state:
// each family once (HELP and TYPE lines), then its samples. Label values are escaped
// here; names are the caller's constants and are checked to be valid.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace raccel {

using Labels = std::vector<std::pair<std::string, std::string>>;

class MetricsPage {
 public:
  // type: counter, gauge or histogram.
  void family(const std::string& name, const char* type, const std::string& help);
  void sample(const std::string& name, const Labels& labels, double value);
  void sample(const std::string& name, double value) { sample(name, {}, value); }
  const std::string& text() const { return out_; }

 private:
  std::string out_;
};

// A cumulative histogram (seconds); observe() and write() on one thread.
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size(), 0) {}
  void observe(double value);
  // Its _bucket, _sum and _count samples under `name` (family() first).
  void write(MetricsPage& page, const std::string& name, const Labels& labels = {}) const;
  uint64_t count() const { return count_; }

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // per bucket, not cumulative
  uint64_t count_ = 0;
  double sum_ = 0;
};

}  // namespace raccel
