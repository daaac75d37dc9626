// JobPace: the last step's figures, samples/s over the window of recent commits, and the time to
// the target step at that pace, for commits at chosen times.
#include "server/coordinator/job_pace.h"

#include "gtest/gtest.h"

namespace pipetrain::coordinator {
namespace {

v1::StepCommitted Step(int64_t step, int64_t samples, double step_ms) {
  v1::StepCommitted s;
  s.set_step(step);
  s.set_loss(1.0f / static_cast<float>(step));
  s.set_samples(samples);
  s.set_step_ms(step_ms);
  return s;
}

TEST(JobPaceTest, NothingCommittedHasOnlyTheTarget) {
  JobPace pace;
  const v1::JobProgress p = pace.Progress(0, 10, true);
  EXPECT_EQ(p.step(), 0);
  EXPECT_EQ(p.target_step(), 10);
  EXPECT_FALSE(p.has_eta_seconds());
}

TEST(JobPaceTest, OneStepIsMeasuredByItsOwnTime) {
  JobPace pace;
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  pace.OnCommitted(Step(1, 8, 250), t0);
  const v1::JobProgress p = pace.Progress(1, 5, true);
  EXPECT_EQ(p.step(), 1);
  EXPECT_EQ(p.loss(), 1.0f);
  EXPECT_EQ(p.step_ms(), 250);
  EXPECT_DOUBLE_EQ(p.samples_per_second(), 32);  // 8 samples in 0.25 s.
  EXPECT_DOUBLE_EQ(p.eta_seconds(), 1);          // 4 steps left at 0.25 s.
  EXPECT_EQ(p.updated_unix_ms(), 1000 * 1000);
}

TEST(JobPaceTest, ThePaceIsFromCommitToCommitOverTheWindow) {
  JobPace pace;
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  // Steps every 2 s, whatever their own step_ms (the client's time between them counts).
  for (int64_t s = 1; s <= 3; ++s) pace.OnCommitted(Step(s, 8, 100), t0 + absl::Seconds(2 * s));
  v1::JobProgress p = pace.Progress(3, 10, true);
  EXPECT_DOUBLE_EQ(p.samples_per_second(), 4);  // 16 samples in the 4 s after the first commit.
  EXPECT_DOUBLE_EQ(p.eta_seconds(), 14);        // 7 steps at 2 s.
  EXPECT_EQ(p.step(), 3);
  // Unknown target, or an ended job: no ETA. The target reached: 0.
  EXPECT_FALSE(pace.Progress(3, 0, true).has_eta_seconds());
  EXPECT_FALSE(pace.Progress(3, 10, false).has_eta_seconds());
  EXPECT_DOUBLE_EQ(pace.Progress(12, 10, true).eta_seconds(), 0);
  // Only the last kWindow commits count: 30 more at 1 s apart.
  for (int64_t s = 4; s < 4 + 30; ++s) pace.OnCommitted(Step(s, 8, 100), t0 + absl::Seconds(s + 3));
  p = pace.Progress(33, 43, true);
  EXPECT_DOUBLE_EQ(p.samples_per_second(), 8);
  EXPECT_DOUBLE_EQ(p.eta_seconds(), 10);
}

TEST(JobPaceTest, ARestartMeasuresAfreshAndKeepsTheLastStep) {
  JobPace pace;
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  pace.OnCommitted(Step(1, 8, 100), t0);
  pace.OnCommitted(Step(2, 8, 100), t0 + absl::Seconds(1));
  pace.Restart();  // e.g. 60 s of recovery follow: they are no training time.
  v1::JobProgress p = pace.Progress(0, 10, true);
  EXPECT_EQ(p.step(), 2);
  EXPECT_FALSE(p.has_eta_seconds());
  pace.OnCommitted(Step(1, 8, 500), t0 + absl::Seconds(61));
  p = pace.Progress(1, 10, true);
  EXPECT_DOUBLE_EQ(p.samples_per_second(), 16);
  EXPECT_DOUBLE_EQ(p.eta_seconds(), 4.5);
}

}  // namespace
}  // namespace pipetrain::coordinator
