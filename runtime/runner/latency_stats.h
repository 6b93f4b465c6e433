// et_trt_runner's per-call latency: the first call apart from the rest (it
// pays for what is done lazily: CUDA context, kernel loads, allocations), and
// the timed calls after the warm-up as median, p99, min and max.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace et_trt::runner {

struct LatencySummary {
  size_t calls = 0;
  double median_ms = 0, p99_ms = 0, min_ms = 0, max_ms = 0;
};

// The p-th percentile (0..100), interpolated linearly between the closest
// ranks (numpy's default); NaN for no values.
double percentile(std::vector<double> values, double p);

LatencySummary summarize_latencies(const std::vector<double>& latencies_ms);

// The table the runner prints: a row for the first call, a row for the calls
// timed after `warmup` untimed ones.
std::string latency_table(double first_call_ms, int warmup, const LatencySummary& timed);

}  // namespace et_trt::runner
