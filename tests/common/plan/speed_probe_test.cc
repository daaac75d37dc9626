#include "common/plan/speed_probe.h"

#include <cmath>
#include <limits>
#include <vector>

#include "gtest/gtest.h"

namespace pipetrain::plan {
namespace {

// A sampler that replays `samples` in order (the probe of a worker on a host whose load is
// scripted) and counts its calls.
struct Replay {
  std::vector<double> samples;
  int calls = 0;
  double operator()() { return samples[calls++ % samples.size()]; }
};

TEST(RobustSpeedTest, EqualSamplesGiveTheirValue) {
  EXPECT_EQ(*RobustSpeed({50, 50, 50}), 50);
  EXPECT_EQ(*RobustSpeed({7}), 7);
}

// The case: the twin started while the host was busy sees 70 % of its samples at a third
// of the speed (the CPU shared with two busy processes); the quantile still finds the idle speed.
TEST(RobustSpeedTest, BusyHostSamplesGiveTheIdleSpeed) {
  std::vector<double> idle(200, 160.0);
  std::vector<double> busy;
  for (int i = 0; i < 200; ++i) busy.push_back(i % 10 < 7 ? 160.0 / 3 + i % 3 : 160.0 - i % 2);
  const double idle_speed = *RobustSpeed(idle);
  const double busy_speed = *RobustSpeed(busy);
  EXPECT_EQ(idle_speed, 160.0);
  EXPECT_GE(busy_speed / idle_speed, 0.99);
  EXPECT_LE(busy_speed / idle_speed, 1.0);
}

// One glitch (a sample far too fast) does not lift the speed.
TEST(RobustSpeedTest, AFewOutliersDoNotMoveIt) {
  std::vector<double> samples(100, 80.0);
  for (int i = 0; i < 9; ++i) samples[i * 11] = 1e6;
  EXPECT_EQ(*RobustSpeed(samples), 80.0);
}

TEST(RobustSpeedTest, RefusesBadSamples) {
  EXPECT_EQ(RobustSpeed({}).status().code(), absl::StatusCode::kInvalidArgument);
  absl::Status zero = RobustSpeed({1, 0}).status();
  EXPECT_EQ(zero.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(zero.message().find("speed sample 1 is 0"), std::string::npos) << zero;
  EXPECT_FALSE(RobustSpeed({std::numeric_limits<double>::quiet_NaN()}).ok());
  EXPECT_FALSE(RobustSpeed({std::numeric_limits<double>::infinity()}).ok());
}

TEST(ProbeSpeedTest, TakesTheSamplesAndReportsQuantileAndMedian) {
  Replay replay{{30, 30, 30, 90, 30, 30, 90, 30, 30, 90}};
  SpeedProbeOptions options;
  options.samples = 10;
  absl::StatusOr<SpeedProbe> probe = ProbeSpeed(std::ref(replay), options);
  ASSERT_TRUE(probe.ok()) << probe.status();
  EXPECT_EQ(replay.calls, 10);
  EXPECT_EQ(probe->samples, 10);
  EXPECT_EQ(probe->speed, 90);
  EXPECT_EQ(probe->median, 30);
}

// The budget ends the probe on the injected clock: each sample advances it by 1 s, a 3 s budget
// stops after the sample that reaches it.
TEST(ProbeSpeedTest, StopsAtTheBudget) {
  Replay replay{{10, 20, 30, 40, 50}};
  absl::Time t = absl::UnixEpoch();
  auto clock = [&] { return t; };
  auto sample = [&] {
    t += absl::Seconds(1);
    return replay();
  };
  SpeedProbeOptions options;
  options.samples = 100;
  options.budget = absl::Seconds(3);
  absl::StatusOr<SpeedProbe> probe = ProbeSpeed(sample, options, clock);
  ASSERT_TRUE(probe.ok()) << probe.status();
  EXPECT_EQ(probe->samples, 3);
  EXPECT_EQ(probe->speed, 30);
}

TEST(ProbeSpeedTest, RefusesBadOptionsAndSamples) {
  Replay replay{{1}};
  SpeedProbeOptions options;
  options.samples = 0;
  EXPECT_EQ(ProbeSpeed(std::ref(replay), options).status().code(),
            absl::StatusCode::kInvalidArgument);
  options.samples = 5;
  options.budget = absl::ZeroDuration();
  EXPECT_EQ(ProbeSpeed(std::ref(replay), options).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(replay.calls, 0);
  Replay negative{{-1}};
  EXPECT_EQ(ProbeSpeed(std::ref(negative)).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pipetrain::plan
