// The learning-rate schedules: their values at the points that define them, their text in the
// optimizer's canonical form, and OptimizerStep applying exactly the scheduled rate.
#include "common/math/lr_schedule.h"

#include <cmath>
#include <vector>

#include "common/math/optimizer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pipetrain::math {
namespace {

using ::testing::HasSubstr;

LrSchedule Make(LrScheduleKind kind, int64_t warmup, int64_t decay, float min_lr) {
  LrSchedule s;
  s.kind = kind;
  s.warmup_steps = warmup;
  s.decay_steps = decay;
  s.min_lr = min_lr;
  return s;
}

TEST(LrScheduleTest, ConstantIsTheBaseRateExactly) {
  for (int64_t step : {1, 2, 1000}) EXPECT_EQ(LearningRateAt(LrSchedule(), 0.01f, step), 0.01f);
}

TEST(LrScheduleTest, WarmupRisesLinearlyToTheBaseRate) {
  const LrSchedule s = Make(LrScheduleKind::kConstant, 4, 0, 0);
  EXPECT_EQ(LearningRateAt(s, 1.0f, 1), 0.25f);
  EXPECT_EQ(LearningRateAt(s, 1.0f, 2), 0.5f);
  EXPECT_EQ(LearningRateAt(s, 1.0f, 4), 1.0f);
  EXPECT_EQ(LearningRateAt(s, 1.0f, 5), 1.0f);
}

TEST(LrScheduleTest, DecaysReachTheMinimumAtDecayStepsAndStayThere) {
  const float lr = 0.1f, low = 0.01f;
  const LrSchedule cosine = Make(LrScheduleKind::kWarmupCosine, 10, 110, low);
  const LrSchedule linear = Make(LrScheduleKind::kWarmupLinear, 10, 110, low);
  for (const LrSchedule& s : {cosine, linear}) {
    EXPECT_EQ(LearningRateAt(s, lr, 10), lr);    // end of warm-up: the base rate
    EXPECT_EQ(LearningRateAt(s, lr, 110), low);  // p = 1
    EXPECT_EQ(LearningRateAt(s, lr, 500), low);  // after: the minimum
    EXPECT_LT(LearningRateAt(s, lr, 11), lr);    // decaying right after warm-up
    EXPECT_GT(LearningRateAt(s, lr, 109), low);
  }
  // Halfway (p = 1/2): both at the midpoint, cosine to float precision.
  EXPECT_EQ(LearningRateAt(linear, lr, 60), static_cast<float>((0.1 + 0.01) / 2));
  EXPECT_NEAR(LearningRateAt(cosine, lr, 60), (0.1 + 0.01) / 2, 1e-7);
  // A quarter of the way, cosine is above linear (slow start), three quarters below.
  EXPECT_GT(LearningRateAt(cosine, lr, 35), LearningRateAt(linear, lr, 35));
  EXPECT_LT(LearningRateAt(cosine, lr, 85), LearningRateAt(linear, lr, 85));
  EXPECT_NEAR(LearningRateAt(cosine, lr, 35), low + (lr - low) * (1 + std::cos(M_PI / 4)) / 2,
              1e-7);
}

TEST(LrScheduleTest, BadSchedulesNameTheField) {
  EXPECT_THAT(ValidateLrSchedule(Make(LrScheduleKind::kConstant, -1, 0, 0), 1).message(),
              HasSubstr("warmup_steps must be >= 0"));
  EXPECT_THAT(ValidateLrSchedule(Make(LrScheduleKind::kWarmupCosine, 10, 10, 0), 1).message(),
              HasSubstr("decay_steps (10) must be greater than warmup_steps (10)"));
  EXPECT_THAT(ValidateLrSchedule(Make(LrScheduleKind::kWarmupLinear, 0, 10, 2), 1).message(),
              HasSubstr("min_lr = 2 must be in [0, lr = 1]"));
  EXPECT_TRUE(ValidateLrSchedule(Make(LrScheduleKind::kWarmupLinear, 0, 10, 1), 1).ok());
  EXPECT_EQ(ParseLrScheduleKind("warmup_cosine").value(), LrScheduleKind::kWarmupCosine);
  EXPECT_THAT(ParseLrScheduleKind("cosine").status().message(), HasSubstr("'cosine'"));
}

TEST(LrScheduleTest, OptimizerTextCarriesTheScheduleOnlyWhenSet) {
  absl::StatusOr<OptimizerConfig> plain = ParseOptimizerConfig("adamw:lr=0.01");
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(FormatOptimizerConfig(*plain),
            "adamw:lr=0.00999999978,weight_decay=0,beta1=0.899999976,beta2=0.999000013,"
            "eps=9.99999994e-09,clip_norm=0");
  absl::StatusOr<OptimizerConfig> scheduled = ParseOptimizerConfig(
      "sgd:lr=0.5,lr_schedule=warmup-cosine,warmup_steps=3,decay_steps=30,lr_min=0.05");
  ASSERT_TRUE(scheduled.ok()) << scheduled.status();
  EXPECT_EQ(scheduled->schedule, Make(LrScheduleKind::kWarmupCosine, 3, 30, 0.05f));
  const std::string text = FormatOptimizerConfig(*scheduled);
  EXPECT_THAT(text, HasSubstr(",lr_schedule=warmup-cosine,warmup_steps=3,decay_steps=30,"
                              "lr_min=0.0500000007"));
  absl::StatusOr<OptimizerConfig> again = ParseOptimizerConfig(text);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(FormatOptimizerConfig(*again), text);
  EXPECT_THAT(
      ParseOptimizerConfig("adamw:lr_schedule=warmup-linear,decay_steps=0").status().message(),
      HasSubstr("decay_steps (0) must be greater than warmup_steps (0)"));
}

// A scheduled update is bitwise the unscheduled update at the scheduled rate.
TEST(LrScheduleTest, OptimizerStepUsesTheScheduledRate) {
  for (OptimizerKind kind : {OptimizerKind::kSgd, OptimizerKind::kAdamW}) {
    OptimizerConfig scheduled;
    scheduled.kind = kind;
    scheduled.lr = 0.3f;
    scheduled.momentum = kind == OptimizerKind::kSgd ? 0.9f : 0.0f;
    scheduled.weight_decay = 0.01f;
    scheduled.schedule = Make(LrScheduleKind::kWarmupCosine, 2, 7, 0.003f);
    for (int64_t step = 1; step <= 9; ++step) {
      OptimizerConfig fixed = scheduled;
      fixed.schedule = LrSchedule();
      fixed.lr = LearningRateAt(scheduled.schedule, scheduled.lr, step);
      std::vector<float> grad = {0.5f, -1.25f, 3.0f}, a = {1.0f, 2.0f, -3.0f}, b = a;
      const size_t states = OptimizerStateNames(scheduled).size();
      std::vector<std::vector<float>> sa(states, std::vector<float>(3, 0.1f)), sb = sa;
      OptimizerStep(scheduled, step, 0.75f, grad, absl::MakeSpan(a), absl::MakeSpan(sa));
      OptimizerStep(fixed, step, 0.75f, grad, absl::MakeSpan(b), absl::MakeSpan(sb));
      EXPECT_EQ(a, b) << "step " << step;
      EXPECT_EQ(sa, sb) << "step " << step;
    }
  }
}

}  // namespace
}  // namespace pipetrain::math
