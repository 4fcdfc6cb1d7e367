#include "common/metrics.h"

#include <gtest/gtest.h>

namespace raccel {
namespace {

TEST(MetricsPage, EscapesLabelValuesAndHelpAndRefusesBadNames) {
  MetricsPage page;
  page.family("raccel_x_total", "counter", "line one\nline \\ two");
  page.sample("raccel_x_total", {{"vm", "a\"b\\c\nd"}}, 3);
  page.sample("raccel_x_total", {{"vm", "plain"}}, 0.25);
  EXPECT_EQ(page.text(),
            "# HELP raccel_x_total line one\\nline \\\\ two\n# TYPE raccel_x_total counter\n"
            "raccel_x_total{vm=\"a\\\"b\\\\c\\nd\"} 3\nraccel_x_total{vm=\"plain\"} 0.25\n");
  EXPECT_THROW(page.family("9bad", "gauge", "x"), std::logic_error);
  EXPECT_THROW(page.sample("ok", {{"bad-label", "v"}}, 1), std::logic_error);
}

TEST(Histogram, WritesCumulativeBucketsSumAndCount) {
  Histogram h({0.1, 1});
  for (double v : {0.05, 0.1, 0.5, 2.0}) h.observe(v);
  MetricsPage page;
  h.write(page, "raccel_h_seconds");
  EXPECT_EQ(page.text(),
            "raccel_h_seconds_bucket{le=\"0.1\"} 2\nraccel_h_seconds_bucket{le=\"1\"} 3\n"
            "raccel_h_seconds_bucket{le=\"+Inf\"} 4\nraccel_h_seconds_sum 2.65\nraccel_h_seconds_count 4\n");
}

}  // namespace
}  // namespace raccel
