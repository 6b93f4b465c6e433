#include "latency_stats.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

namespace et_trt::runner {

double percentile(std::vector<double> values, double p) {
  if (values.empty()) return std::numeric_limits<double>::quiet_NaN();
  std::sort(values.begin(), values.end());
  const double rank = std::clamp(p, 0.0, 100.0) / 100.0 * double(values.size() - 1);
  const size_t below = size_t(std::floor(rank));
  const size_t above = std::min(below + 1, values.size() - 1);
  return values[below] + (rank - double(below)) * (values[above] - values[below]);
}

LatencySummary summarize_latencies(const std::vector<double>& latencies_ms) {
  LatencySummary s;
  s.calls = latencies_ms.size();
  if (latencies_ms.empty()) return s;
  s.median_ms = percentile(latencies_ms, 50);
  s.p99_ms = percentile(latencies_ms, 99);
  const auto [lo, hi] = std::minmax_element(latencies_ms.begin(), latencies_ms.end());
  s.min_ms = *lo;
  s.max_ms = *hi;
  return s;
}

std::string latency_table(double first_call_ms, int warmup, const LatencySummary& timed) {
  char line[160];
  std::string out;
  std::snprintf(line, sizeof(line), "%-26s %7s %10s %10s %10s %10s\n", "latency per call (ms)", "calls", "median", "p99",
                "min", "max");
  out += line;
  std::snprintf(line, sizeof(line), "%-26s %7d %10.3f %10s %10s %10s\n", "first call", 1, first_call_ms, "-", "-", "-");
  out += line;
  const std::string label = "after " + std::to_string(warmup) + " warm-up call" + (warmup == 1 ? "" : "s");
  std::snprintf(line, sizeof(line), "%-26s %7zu %10.3f %10.3f %10.3f %10.3f\n", label.c_str(), timed.calls,
                timed.median_ms, timed.p99_ms, timed.min_ms, timed.max_ms);
  return out + line;
}

}  // namespace et_trt::runner
