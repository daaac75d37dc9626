// The speed a stage worker registers: --gflops, --emulate-gflops, else the probe.
#include <string>

#include "gtest/gtest.h"
#include "server/worker/stage_worker_daemon.h"

namespace pipetrain::worker {
namespace {

StageWorkerOptions ValidOptions() {
  StageWorkerOptions o;
  o.coordinator = "127.0.0.1:1";
  return o;
}

TEST(WorkerSpeedTest, GivenGflopsIsRegisteredAsIs) {
  StageWorkerOptions o = ValidOptions();
  o.gflops = 42.5;
  o.emulate_gflops = 3;  // --gflops wins over the emulated rate.
  ASSERT_TRUE(o.Check().ok());
  absl::StatusOr<WorkerSpeed> speed = ChooseWorkerSpeed(o, math::SupportedIsas().back());
  ASSERT_TRUE(speed.ok()) << speed.status();
  EXPECT_EQ(speed->gflops, 42.5);
  EXPECT_EQ(speed->source, "given by --gflops");
}

TEST(WorkerSpeedTest, EmulatedRateWithoutGflops) {
  StageWorkerOptions o = ValidOptions();
  o.emulate_gflops = 0.25;
  absl::StatusOr<WorkerSpeed> speed = ChooseWorkerSpeed(o, math::SupportedIsas().back());
  ASSERT_TRUE(speed.ok()) << speed.status();
  EXPECT_EQ(speed->gflops, 0.25);
}

TEST(WorkerSpeedTest, ProbeGivesAPositiveSpeedAndSaysHow) {
  absl::StatusOr<WorkerSpeed> speed =
      ChooseWorkerSpeed(ValidOptions(), math::SupportedIsas().back());
  ASSERT_TRUE(speed.ok()) << speed.status();
  EXPECT_GT(speed->gflops, 0);
  EXPECT_NE(speed->source.find("sgemm samples"), std::string::npos) << speed->source;
}

TEST(WorkerSpeedTest, GflopsOutsideThePartitionersRangeIsRefused) {
  for (double bad : {-1.0, 1e-9, 2e9}) {
    StageWorkerOptions o = ValidOptions();
    o.gflops = bad;
    absl::Status s = o.Check();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(s.message().find("--gflops must be in"), std::string::npos) << s;
  }
}

}  // namespace
}  // namespace pipetrain::worker
