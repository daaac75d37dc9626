#include "server/metrics/metrics_registry.h"

#include <prometheus/counter.h>

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pipetrain::metrics {
namespace {

using ::testing::HasSubstr;
using ::testing::MatchesRegex;
using ::testing::Optional;

TEST(MetricsRegistryTest, CarriesBuildInfo) {
  MetricsRegistry r("coordinator");
  const std::string text = r.TextExposition();
  EXPECT_THAT(text, HasSubstr("# TYPE pipetrain_build_info gauge"));
  EXPECT_THAT(
      SampleValue(
          text, "pipetrain_build_info",
          {{"daemon", "coordinator"}, {"version", BuildVersion()}, {"commit", BuildCommit()}}),
      Optional(1.0));
  // The CMake project version, and the source tree's commit (12 hex digits) when the build knew
  // it.
  EXPECT_THAT(BuildVersion(), MatchesRegex("[0-9]+\\.[0-9]+\\.[0-9]+"));
  EXPECT_THAT(BuildCommit(), MatchesRegex("[0-9a-f]{12}|unknown"));
}

TEST(SampleValueTest, MatchesNameAndExactLabels) {
  const std::string text =
      "# HELP x_total help\n# TYPE x_total counter\n"
      "x_total{a=\"1\",b=\"2\"} 3\nx_total{a=\"1\"} 4.5\nx_total 7\ny 1e+03\n";
  EXPECT_THAT(SampleValue(text, "x_total", {{"b", "2"}, {"a", "1"}}), Optional(3.0));
  EXPECT_THAT(SampleValue(text, "x_total", {{"a", "1"}}), Optional(4.5));
  EXPECT_THAT(SampleValue(text, "x_total"), Optional(7.0));
  EXPECT_THAT(SampleValue(text, "y"), Optional(1000.0));
  EXPECT_EQ(SampleValue(text, "x_total", {{"a", "2"}}), std::nullopt);
  EXPECT_EQ(SampleValue(text, "x"), std::nullopt);
}

TEST(MetricsRegistryTest, ExposesWhatIsRegistered) {
  MetricsRegistry r("stage_worker");
  prometheus::BuildCounter().Name("t_total").Help("h").Register(r.registry()).Add({}).Increment(2);
  EXPECT_THAT(SampleValue(r.TextExposition(), "t_total"), Optional(2.0));
}

}  // namespace
}  // namespace pipetrain::metrics
