// Regression tests for what fuzzing found (docs/reliability.md, "Fuzzing"), stated as plain expectations so
// that they hold in builds without sanitizers too; the inputs themselves stay in tests/fuzz/corpus/.
#include <gtest/gtest.h>

#include "backends/events/metrics_parse.h"

namespace kvroute::fuzz {
namespace {

// fuzz_metrics: an OpenMetrics timestamp of 1.7e22 s was converted to int64 milliseconds (undefined
// behaviour, UBSan: "outside the range of representable values"). Such a line is malformed now.
TEST(FuzzFindings, HugeMetricTimestampIsAMalformedLine) {
  const auto m = events::parse_prometheus_text("vllm:num_requests_running 3 1.7e22\nvllm:num_requests_waiting 1 1.5e9\n");
  EXPECT_EQ(m.malformed_lines, 1u);
  ASSERT_EQ(m.samples.size(), 1u);
  EXPECT_EQ(m.samples[0].timestamp_ms, 1'500'000'000'000);
}

}  // namespace
}  // namespace kvroute::fuzz
