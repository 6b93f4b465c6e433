// et_trt_runner's latency statistics and table, without an engine.
#include <gtest/gtest.h>

#include <cmath>

#include "latency_stats.h"

namespace et_trt::runner {
namespace {

TEST(LatencyStats, PercentilesInterpolateBetweenRanks) {
  const std::vector<double> v = {4, 1, 3, 2};  // unsorted on purpose
  EXPECT_DOUBLE_EQ(percentile(v, 50), 2.5);    // the mean of the two middle values
  EXPECT_DOUBLE_EQ(percentile(v, 99), 3.97);   // rank 2.97 of 0..3
  EXPECT_DOUBLE_EQ(percentile(v, 0), 1);
  EXPECT_DOUBLE_EQ(percentile(v, 100), 4);
  EXPECT_DOUBLE_EQ(percentile({7}, 99), 7);
  EXPECT_TRUE(std::isnan(percentile({}, 50)));
}

TEST(LatencyStats, P99SeesTheSlowTail) {
  std::vector<double> v(200, 1.0);
  v[17] = v[80] = v[150] = 9.0;  // three slow calls in 200: 1.5% of them
  const LatencySummary s = summarize_latencies(v);
  EXPECT_EQ(s.calls, 200u);
  EXPECT_DOUBLE_EQ(s.median_ms, 1.0);
  EXPECT_DOUBLE_EQ(s.p99_ms, 9.0);
  EXPECT_DOUBLE_EQ(s.min_ms, 1.0);
  EXPECT_DOUBLE_EQ(s.max_ms, 9.0);
}

TEST(LatencyStats, TableKeepsTheFirstCallApart) {
  const LatencySummary timed = summarize_latencies({2.0, 1.0, 1.5});
  EXPECT_EQ(latency_table(40.25, 3, timed),
            "latency per call (ms)        calls     median        p99        min        max\n"
            "first call                       1     40.250          -          -          -\n"
            "after 3 warm-up calls            3      1.500      1.990      1.000      2.000\n");
  EXPECT_NE(latency_table(40.25, 1, timed).find("\nafter 1 warm-up call "), std::string::npos);
}

}  // namespace
}  // namespace et_trt::runner
