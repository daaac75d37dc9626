// A job that grows (docs/scaling.md, "Jobs that change shape"): `pipetrain train --stages 2
// --max-stages 3` on 2 workers; a third worker registers mid-run, the job grows to 3 stages at its
// next step boundary (one line of the client's output says so) and ends with every loss and layer
// file bit for bit those of `pipetrain reference`; with `--max-replicas 2` two joining workers
// become a second replica, bitwise the same. Real daemons on 127.0.0.1, started by the test
// and signalled by their PIDs only.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/integration/daemons.h"
#include "tests/integration/daemons_fixture.h"
#include "tests/integration/run_command.h"

namespace pipetrain {
namespace {

using testing::Example;
using testing::ReadFile;
using testing::StepLines;

constexpr int kSteps = 100;

class GrowthTest : public testing::DaemonsTest {
 protected:
  void SetUp() override {
    dir_ = testing::TempDir("pipetrain_grow_");
    ASSERT_FALSE(dir_.empty());
    ASSERT_EQ(
        daemons_.Start(dir_, 2, {"--checkpoint-root", dir_, "--growth-dir", dir_ + "/growth"}), "");
  }

  void TearDown() override {
    if (train_.pid > 0) {
      kill(train_.pid, SIGKILL);
      std::string rest;
      testing::DrainAndWait(train_, &rest, 10000);
    }
    DaemonsTest::TearDown();
  }

  // Waits (at most 30 s) until `count` workers are registered.
  bool AwaitWorkers(size_t count) {
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    while (absl::Now() < deadline) {
      absl::StatusOr<std::vector<v1::WorkerInfo>> listed = daemons_.client().ListWorkers();
      if (listed.ok() && listed->size() == count) return true;
      absl::SleepFor(absl::Milliseconds(10));  // polling a bounded wait.
    }
    return false;
  }

  testing::PipedChild train_;
};

// What a growing run gave: its output and the one change of shape it printed.
struct GrowthRun {
  std::string out;
  nlohmann::json change;
};

class GrowthRunTest : public GrowthTest {
 protected:
  // `pipetrain train` of the digits MLP with `shape_flags` on the 2 workers, `joiners` started
  // once step 5 printed; the run must end with one change of shape and every loss and the final
  // weights of `pipetrain reference`.
  void RunAndCompare(const std::vector<std::string>& shape_flags,
                     const std::vector<std::string>& joiners, GrowthRun* run) {
    const std::string flags = absl::StrCat(
        " --model ", Example("mlp_digits.textproto"),
        " --data digits --batch 16 --microbatches 4 --seed 11 --optimizer adamw:lr=1e-2 --json "
        "--steps ",
        kSteps);
    const testing::CommandRun ref = testing::RunReference(flags, dir_ + "/ref");
    ASSERT_EQ(ref.exit_code, 0) << ref.out;
    std::vector<std::string> train_flags = {"--save", dir_ + "/pipe"};
    train_flags.insert(train_flags.end(), shape_flags.begin(), shape_flags.end());
    const std::string err = dir_ + "/train.err";
    // The run cannot end before the joining workers have registered.
    train_ = testing::SpawnThrottledTrain(daemons_.address(), train_flags, flags, err);
    ASSERT_GT(train_.pid, 0);
    ASSERT_TRUE(testing::ReadUntil(train_, "{\"step\": 5,", &run->out))
        << run->out << ReadFile(err);
    for (const std::string& name : joiners) {
      const pid_t pid =
          testing::Spawn({PIPETRAIN_STAGE_WORKER_BINARY, "--coordinator", daemons_.address(),
                          "--listen", "127.0.0.1:0", "--name", name},
                         dir_ + "/" + name + ".log");
      ASSERT_GT(pid, 0);
      joiners_.push_back(pid);
    }
    ASSERT_TRUE(AwaitWorkers(2 + joiners.size())) << ReadFile(dir_ + "/coordinator.log");
    const int status = testing::DrainAndWait(train_, &run->out, 300000);
    train_.pid = -1;
    ASSERT_TRUE(WIFEXITED(status)) << run->out;
    ASSERT_EQ(WEXITSTATUS(status), 0)
        << run->out << ReadFile(err) << ReadFile(dir_ + "/coordinator.log");

    // One line for the change of shape, after the step it followed.
    std::vector<nlohmann::json> changes;
    for (absl::string_view line : absl::StrSplit(run->out, '\n')) {
      if (!absl::StartsWith(line, "{\"shape_change\"")) continue;
      std::cout << line << "\n";  // its seconds, for docs/scaling.md.
      changes.push_back(nlohmann::json::parse(line).at("shape_change"));
    }
    ASSERT_EQ(changes.size(), 1u) << run->out;
    run->change = changes[0];
    EXPECT_EQ(run->change.at("failed"), "");
    EXPECT_GE(run->change.at("step").get<int>(), 5);
    EXPECT_LT(run->change.at("step").get<int>(), kSteps);

    // Every loss and the final weights are the reference's.
    const std::vector<std::string> want = StepLines(ref.out, /*pipeline=*/false);
    ASSERT_EQ(want.size(), static_cast<size_t>(kSteps));
    EXPECT_EQ(StepLines(run->out, /*pipeline=*/true), want);
    const testing::LayerFiles layers = testing::CompareLayerFiles(dir_ + "/ref", dir_ + "/pipe");
    EXPECT_EQ(layers.compared, 3);  // the model's layers with weights.
    EXPECT_THAT(layers.differ, ::testing::IsEmpty());
  }

  void TearDown() override {
    for (pid_t pid : joiners_) {
      kill(pid, SIGTERM);
      waitpid(pid, nullptr, 0);
    }
    GrowthTest::TearDown();
  }

  std::vector<pid_t> joiners_;
};

TEST_F(GrowthRunTest, AJobOnTwoWorkersGrowsToThreeWhenOneRegistersAndStaysBitwiseTheReference) {
  GrowthRun run;
  ASSERT_NO_FATAL_FAILURE(RunAndCompare({"--stages", "2", "--max-stages", "3"}, {"w2"}, &run));
  EXPECT_EQ(run.change.at("stages_before"), 2);
  EXPECT_EQ(run.change.at("stages"), 3);
  EXPECT_EQ(run.change.at("joined"), nlohmann::json::array({"w2"}));

  absl::StatusOr<std::vector<v1::JobStatus>> jobs = daemons_.client().ListJobs();
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  ASSERT_EQ(jobs->size(), 1u);
  const v1::JobStatus& job = (*jobs)[0];
  EXPECT_EQ(job.state(), v1::JOB_STATE_DONE);
  EXPECT_EQ(job.spec().stages(), 3);
  ASSERT_EQ(job.shape_changes_size(), 1);
  EXPECT_EQ(job.shape_changes(0).checkpoint(), absl::StrCat(dir_, "/growth/", job.job()));
  EXPECT_EQ(job.recoveries_size(), 0);
}

// With --max-replicas the job takes two joining workers as a second replica of its 2 stages (one
// worker alone completes no pipeline, so it waits for both), bitwise the reference.
TEST_F(GrowthRunTest, AJobOfTwoStagesGrowsASecondReplicaWhenTwoWorkersRegister) {
  GrowthRun run;
  ASSERT_NO_FATAL_FAILURE(
      RunAndCompare({"--stages", "2", "--max-replicas", "2"}, {"w2", "w3"}, &run));
  EXPECT_EQ(run.change.at("stages_before"), 2);
  EXPECT_EQ(run.change.at("stages"), 2);
  EXPECT_EQ(run.change.at("replicas_before"), 1);
  EXPECT_EQ(run.change.at("replicas"), 2);
  EXPECT_EQ(run.change.at("workers").size(), 4u);

  absl::StatusOr<std::vector<v1::JobStatus>> jobs = daemons_.client().ListJobs();
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  ASSERT_EQ(jobs->size(), 1u);
  EXPECT_EQ((*jobs)[0].spec().replicas(), 2);
  EXPECT_EQ((*jobs)[0].state(), v1::JOB_STATE_DONE);
}

}  // namespace
}  // namespace pipetrain
