// A dualpipe job survives a lost worker bitwise: `pipetrain train --schedule dualpipe` on 2 of 3
// workers (two copies of 2 stages: rank 0 holds stage 0 down and stage 1 up, rank 1 the other
// copies), one of its workers SIGKILLed after step 12 (while the run, its output unread, cannot
// get far); the job restores its last checkpoint (each layer saved once, from the down copy; both
// copies load it) onto the spare, replays, and ends with every loss and the final checkpoint's
// files bit for bit those of `pipetrain reference`. Real daemons on 127.0.0.1, started by the
// test and signalled by their PIDs only.
#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/sdk/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/daemons.h"
#include "tests/integration/daemons_fixture.h"
#include "tests/integration/run_command.h"

namespace pipetrain {
namespace {

using testing::Example;
using testing::ReadFile;
using testing::StepLines;

constexpr int kSteps = 100;

class DualPipeRecoveryTest : public testing::DaemonsTest {
 protected:
  void SetUp() override {
    dir_ = testing::TempDir("pipetrain_dualpipe_");
    ASSERT_FALSE(dir_.empty());
    ASSERT_EQ(daemons_.Start(dir_, 3, {"--checkpoint-root", dir_}), "");
  }
};

TEST_F(DualPipeRecoveryTest, AWorkerLostMidRunIsReplacedAndTheRunEndsBitwiseTheReference) {
  const std::string flags = absl::StrCat(
      " --model ", Example("gpt_char.textproto"),
      " --data text --batch 8 --microbatches 4 --seed 5 --optimizer adamw:lr=1e-2 --json --steps ",
      kSteps);
  const testing::CommandRun ref = testing::RunReference(flags, dir_ + "/ref");
  ASSERT_EQ(ref.exit_code, 0) << ref.out;

  const std::string err = dir_ + "/train.err";
  testing::PipedChild train =
      testing::SpawnThrottledTrain(daemons_.address(),
                                   {"--stages", "2", "--schedule", "dualpipe", "--checkpoint-every",
                                    "5", "--save", dir_ + "/pipe"},
                                   flags, err);
  ASSERT_GT(train.pid, 0);
  std::string out;
  ASSERT_TRUE(testing::ReadUntil(train, "{\"step\": 12,", &out)) << out << ReadFile(err);
  absl::StatusOr<std::vector<v1::JobStatus>> jobs = daemons_.client().ListJobs();
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  ASSERT_EQ(jobs->size(), 1u);
  ASSERT_EQ((*jobs)[0].stages_size(), 2);
  // Rank 1: the down copy's stage 1 (the loss of micro-batches 0, 1) and the up copy's stage 0.
  const std::string victim = (*jobs)[0].stages(1).worker();
  ASSERT_EQ(daemons_.KillWorker(victim), "");

  const int status = testing::DrainAndWait(train, &out, 300000);
  ASSERT_TRUE(WIFEXITED(status)) << out;
  ASSERT_EQ(WEXITSTATUS(status), 0) << out << ReadFile(err) << ReadFile(dir_ + "/coordinator.log");
  const std::vector<std::string> want = StepLines(ref.out, /*pipeline=*/false);
  ASSERT_EQ(want.size(), static_cast<size_t>(kSteps));
  EXPECT_EQ(StepLines(out, /*pipeline=*/true), want);
  const testing::LayerFiles layers = testing::CompareLayerFiles(dir_ + "/ref", dir_ + "/pipe");
  EXPECT_GT(layers.compared, 0);
  EXPECT_THAT(layers.differ, ::testing::IsEmpty());
  absl::StatusOr<v1::JobStatus> job = daemons_.client().GetJob((*jobs)[0].job());
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->state(), v1::JOB_STATE_DONE);
  ASSERT_EQ(job->recoveries_size(), 1) << job->DebugString();
  EXPECT_EQ(job->recoveries(0).lost_worker(), victim);
}

}  // namespace
}  // namespace pipetrain
