#include "server/metrics/coordinator_metrics.h"

#include <map>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pipetrain::metrics {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::Optional;

StepSample Step(double seconds, double loss) {
  StepSample s;
  s.seconds = seconds;
  s.loss = loss;
  s.bubble = 0.25;
  s.predicted_bubble = 0.2;
  s.samples_per_second = 64 / seconds;
  return s;
}

TEST(CoordinatorMetricsTest, StepsOfAJob) {
  MetricsRegistry r("coordinator");
  CoordinatorMetrics m(r);
  m.RecordStep("job-a-1", Step(0.5, 2.5));
  m.RecordStep("job-a-1", Step(0.003, 1.25));
  const std::string t = r.TextExposition();
  const std::map<std::string, std::string> job = {{"job_id", "job-a-1"}};
  EXPECT_THAT(SampleValue(t, "pipetrain_job_steps_total", job), Optional(2.0));
  EXPECT_THAT(SampleValue(t, "pipetrain_job_loss", job), Optional(1.25));
  EXPECT_THAT(SampleValue(t, "pipetrain_job_step_seconds_count", job), Optional(2.0));
  EXPECT_THAT(SampleValue(t, "pipetrain_job_step_seconds_sum", job),
              Optional(testing::DoubleNear(0.503, 1e-12)));
  // 0.003 s falls in the 0.004 bucket (1 ms doubling), 0.5 s in the 0.512 one.
  EXPECT_THAT(
      SampleValue(t, "pipetrain_job_step_seconds_bucket", {{"job_id", "job-a-1"}, {"le", "0.004"}}),
      Optional(1.0));
  EXPECT_THAT(
      SampleValue(t, "pipetrain_job_step_seconds_bucket", {{"job_id", "job-a-1"}, {"le", "0.512"}}),
      Optional(2.0));
  EXPECT_THAT(
      SampleValue(t, "pipetrain_job_bubble_ratio", {{"job_id", "job-a-1"}, {"source", "measured"}}),
      Optional(0.25));
  EXPECT_THAT(SampleValue(t, "pipetrain_job_bubble_ratio",
                          {{"job_id", "job-a-1"}, {"source", "predicted"}}),
              Optional(0.2));
  EXPECT_THAT(SampleValue(t, "pipetrain_job_samples_per_second", job),
              Optional(testing::DoubleNear(64 / 0.003, 1e-6)));
  EXPECT_THAT(SampleValue(t, "pipetrain_job_recoveries_total", job), Optional(0.0));
}

TEST(CoordinatorMetricsTest, IsaOfAJobIsOneSeriesDroppedWithTheJob) {
  MetricsRegistry r("coordinator");
  CoordinatorMetrics m(r);
  m.RecordIsa("j", "x86-64-v3");
  m.RecordIsa("j", "x86-64-v4");  // replaces the first level's series.
  std::string t = r.TextExposition();
  EXPECT_THAT(SampleValue(t, "pipetrain_job_isa_info", {{"job_id", "j"}, {"isa", "x86-64-v4"}}),
              Optional(1.0));
  EXPECT_EQ(SampleValue(t, "pipetrain_job_isa_info", {{"job_id", "j"}, {"isa", "x86-64-v3"}}),
            std::nullopt);
  m.RecordState({}, {}, /*known_jobs=*/{});
  t = r.TextExposition();
  EXPECT_THAT(t, Not(HasSubstr("pipetrain_job_isa_info{")));
}

TEST(CoordinatorMetricsTest, Recoveries) {
  MetricsRegistry r("coordinator");
  CoordinatorMetrics m(r);
  m.RecordRecovery("j");
  m.RecordRecovery("j");
  EXPECT_THAT(SampleValue(r.TextExposition(), "pipetrain_job_recoveries_total", {{"job_id", "j"}}),
              Optional(2.0));
}

TEST(CoordinatorMetricsTest, StatesAndForgottenJobsAreDropped) {
  MetricsRegistry r("coordinator");
  CoordinatorMetrics m(r);
  m.RecordStep("old", Step(1, 1));
  m.RecordStep("live", Step(1, 1));
  m.RecordState({{"ready", 1}, {"done", 0}}, {{"idle", 2}, {"busy", 3}}, {"live"});
  const std::string t = r.TextExposition();
  EXPECT_THAT(SampleValue(t, "pipetrain_jobs", {{"state", "ready"}}), Optional(1.0));
  EXPECT_THAT(SampleValue(t, "pipetrain_jobs", {{"state", "done"}}), Optional(0.0));
  EXPECT_THAT(SampleValue(t, "pipetrain_workers", {{"state", "busy"}}), Optional(3.0));
  EXPECT_THAT(SampleValue(t, "pipetrain_job_steps_total", {{"job_id", "live"}}), Optional(1.0));
  EXPECT_THAT(t, Not(HasSubstr("\"old\"")));
  // A forgotten job that comes back starts from zero.
  m.RecordStep("old", Step(1, 1));
  EXPECT_THAT(SampleValue(r.TextExposition(), "pipetrain_job_steps_total", {{"job_id", "old"}}),
              Optional(1.0));
}

}  // namespace
}  // namespace pipetrain::metrics
