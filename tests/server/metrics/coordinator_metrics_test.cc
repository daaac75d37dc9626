#include "server/metrics/coordinator_metrics.h"

#include <map>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pipetrain::metrics {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::Optional;

StepSample Step(double seconds, double loss) {
  StepSample s;
  s.samples = 64;
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
  // Samples as a counter (rate() gives samples/s over any window): 64 per step.
  EXPECT_THAT(t, HasSubstr("# TYPE pipetrain_job_samples_total counter"));
  EXPECT_THAT(SampleValue(t, "pipetrain_job_samples_total", job), Optional(128.0));
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

// For each sample name of `exposition` with a job_id label (histograms count as their _bucket,
// _sum and _count names), the job ids it has series for, and how many series in all.
struct JobSeriesCount {
  std::map<std::string, std::set<std::string>> jobs_by_name;
  int series = 0;
};
JobSeriesCount CountJobSeries(const std::string& exposition) {
  JobSeriesCount c;
  for (absl::string_view line : absl::StrSplit(exposition, '\n', absl::SkipEmpty())) {
    if (line[0] == '#') continue;
    const size_t at = line.find("job_id=\"");
    if (at == absl::string_view::npos) continue;
    const absl::string_view name = line.substr(0, line.find('{'));
    const absl::string_view rest = line.substr(at + 8);
    c.jobs_by_name[std::string(name)].insert(std::string(rest.substr(0, rest.find('"'))));
    ++c.series;
  }
  return c;
}

// Label cardinality stays bounded: 50 jobs that recorded everything a job records leave, once
// only 3 are still known, exactly those 3 jobs' series in every per-job family.
TEST(CoordinatorMetricsTest, OnlyKnownJobsKeepSeries) {
  MetricsRegistry r("coordinator");
  CoordinatorMetrics m(r);
  std::set<std::string> all;
  for (int j = 0; j < 50; ++j) {
    const std::string job = absl::StrCat("job-", j);
    all.insert(job);
    m.RecordStep(job, Step(0.01 * (j + 1), 1));
    m.RecordRecovery(job);
    m.RecordIsa(job, "x86-64-v3");
    m.RecordIsa(job, j % 2 == 0 ? "x86-64-v4" : "x86-64-v3");
  }
  m.RecordState({}, {}, all);
  const JobSeriesCount before = CountJobSeries(r.TextExposition());
  // Every per-job family (and a histogram's three sample names) holds all 50 jobs.
  const std::set<std::string> names = {"pipetrain_job_steps_total",
                                       "pipetrain_job_step_seconds_bucket",
                                       "pipetrain_job_step_seconds_sum",
                                       "pipetrain_job_step_seconds_count",
                                       "pipetrain_job_loss",
                                       "pipetrain_job_bubble_ratio",
                                       "pipetrain_job_samples_per_second",
                                       "pipetrain_job_samples_total",
                                       "pipetrain_job_recoveries_total",
                                       "pipetrain_job_isa_info"};
  std::set<std::string> seen;
  for (const auto& [name, jobs] : before.jobs_by_name) {
    seen.insert(name);
    EXPECT_EQ(jobs, all) << name;
  }
  EXPECT_EQ(seen, names);
  ASSERT_EQ(before.series % 50, 0);
  const int per_job = before.series / 50;

  const std::set<std::string> known = {"job-7", "job-8", "job-42"};
  m.RecordState({{"done", 3}}, {{"idle", 2}}, known);
  const JobSeriesCount after = CountJobSeries(r.TextExposition());
  for (const auto& [name, jobs] : after.jobs_by_name) EXPECT_EQ(jobs, known) << name;
  EXPECT_EQ(after.jobs_by_name.size(), names.size());
  EXPECT_EQ(after.series, 3 * per_job);
  // The kept jobs' values are untouched.
  const std::string t = r.TextExposition();
  EXPECT_THAT(SampleValue(t, "pipetrain_job_samples_total", {{"job_id", "job-42"}}),
              Optional(64.0));
  EXPECT_THAT(
      SampleValue(t, "pipetrain_job_isa_info", {{"job_id", "job-42"}, {"isa", "x86-64-v4"}}),
      Optional(1.0));

  // Forgetting the rest leaves no per-job series at all.
  m.RecordState({}, {}, {});
  EXPECT_EQ(CountJobSeries(r.TextExposition()).series, 0);
}

}  // namespace
}  // namespace pipetrain::metrics
