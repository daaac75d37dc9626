// `pipetrain watch JOB` against a real coordinator and two workers on 127.0.0.1 (started by the
// test, tests/integration/daemons.h): a watch opened while another client trains prints the
// training client's own step lines, ends with the job, and shows the same history when it starts
// after the job ended; `jobs` and `status` show the job's progress; Ctrl-C ends the watch, not
// the job.
#include <signal.h>
#include <sys/wait.h>

#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/integration/daemons.h"

namespace pipetrain {
namespace {

using testing::CommandRun;
using ::testing::HasSubstr;
using testing::PipedChild;

constexpr int kSteps = 40;

// The lines of `text` that start with `prefix`.
std::vector<std::string> LinesStartingWith(const std::string& text, const std::string& prefix) {
  std::vector<std::string> lines;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (absl::StartsWith(line, prefix)) lines.emplace_back(line);
  }
  return lines;
}

class WatchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::TempDir("watch_test_");
    ASSERT_FALSE(dir_.empty());
    const std::string started = daemons_.Start(dir_, 2);
    ASSERT_EQ(started, "") << started;
  }
  void TearDown() override { EXPECT_EQ(daemons_.Stop(), ""); }

  // `pipetrain train --json` of the digits MLP on 2 stages for `steps` steps, stdout piped.
  PipedChild SpawnTrain(int64_t steps) {
    return testing::SpawnPiped(
        {PIPETRAIN_BINARY, "train", "--coordinator", daemons_.address(), "--stages", "2", "--model",
         testing::Example("mlp_digits.textproto"), "--batch", "16", "--microbatches", "2",
         "--steps", absl::StrCat(steps), "--json"},
        dir_ + "/train.err");
  }

  // The id of the coordinator's only job, once the training client printed its first step.
  std::string FirstJob(PipedChild& train, std::string* out) {
    EXPECT_TRUE(testing::ReadUntil(train, "\n", out, 60000))
        << testing::ReadFile(dir_ + "/train.err");
    absl::StatusOr<std::vector<v1::JobStatus>> jobs = daemons_.client().ListJobs();
    EXPECT_TRUE(jobs.ok()) << jobs.status();
    if (!jobs.ok() || jobs->size() != 1) return "";
    return (*jobs)[0].job();
  }

  CommandRun Pipetrain(const std::string& args) {
    return testing::RunCommand(absl::StrCat(PIPETRAIN_BINARY, " ", args, " --coordinator ",
                                            daemons_.address(), " 2>>", dir_, "/client.err"));
  }

  std::string dir_;
  testing::Daemons daemons_;
};

TEST_F(WatchTest, AWatchPrintsTheTrainingClientsStepLinesUntilTheJobEnds) {
  PipedChild train = SpawnTrain(kSteps);
  std::string trained;
  const std::string job = FirstJob(train, &trained);
  ASSERT_FALSE(job.empty());
  // Watching while the job trains: the history since its start, then each step as it commits.
  PipedChild watch = testing::SpawnPiped(
      {PIPETRAIN_BINARY, "watch", job, "--coordinator", daemons_.address(), "--json"},
      dir_ + "/watch.err");
  std::string watched;
  const int watch_status = testing::DrainAndWait(watch, &watched, 120000);
  const int train_status = testing::DrainAndWait(train, &trained, 120000);
  ASSERT_TRUE(WIFEXITED(train_status) && WEXITSTATUS(train_status) == 0)
      << trained << testing::ReadFile(dir_ + "/train.err");
  ASSERT_TRUE(WIFEXITED(watch_status) && WEXITSTATUS(watch_status) == 0)
      << watched << testing::ReadFile(dir_ + "/watch.err");
  // Every step line is the training client's, byte for byte (loss, step time, bubbles).
  const std::vector<std::string> steps = LinesStartingWith(trained, "{\"step\": ");
  ASSERT_EQ(steps.size(), static_cast<size_t>(kSteps)) << trained;
  EXPECT_EQ(LinesStartingWith(watched, "{\"step\": "), steps) << watched;
  // It began with the job's status and ended with the job.
  const std::vector<std::string> lines = absl::StrSplit(watched, '\n', absl::SkipEmpty());
  ASSERT_GE(lines.size(), 2u);
  EXPECT_EQ(nlohmann::json::parse(lines.front())["status"]["job"], job);
  const nlohmann::json ended = nlohmann::json::parse(lines.back())["ended"];
  EXPECT_EQ(ended["state"], "done");
  EXPECT_EQ(ended["steps_done"], kSteps);

  // After the job ended: its history, as plain lines, each with the training client's loss.
  CommandRun late = Pipetrain(absl::StrCat("watch ", job, " --log-every 10"));
  EXPECT_EQ(late.exit_code, 0) << late.out << testing::ReadFile(dir_ + "/client.err");
  const std::vector<std::string> printed = LinesStartingWith(late.out, "step ");
  const std::vector<int> shown = {1, 10, 20, 30, 40};
  ASSERT_EQ(printed.size(), shown.size()) << late.out;
  for (size_t i = 0; i < shown.size(); ++i) {
    // The loss as the float the client received (%.9g round-trips it).
    const float loss = nlohmann::json::parse(steps[shown[i] - 1])["loss"].get<float>();
    EXPECT_THAT(printed[i],
                ::testing::StartsWith(absl::StrFormat("step %6d  loss %.6f  ", shown[i], loss)));
  }
  EXPECT_THAT(late.out, HasSubstr(absl::StrCat("job ", job, ": done, ", kSteps, " of ", kSteps,
                                               " steps done; 2 stages, schedule 1f1b")));
  EXPECT_THAT(late.out, HasSubstr(absl::StrCat("job ", job, " done after ", kSteps, " steps\n")));

  // `status` and `jobs` show the progress toward the client's --steps.
  CommandRun status = Pipetrain("status " + job);
  EXPECT_EQ(status.exit_code, 0);
  const float last_loss = nlohmann::json::parse(steps.back())["loss"].get<float>();
  EXPECT_THAT(status.out, HasSubstr(absl::StrFormat("  step %d: loss %.6f, ", kSteps, last_loss)));
  EXPECT_THAT(status.out, HasSubstr("; ETA -\n  target step 40 (0 to go)\n"));
  CommandRun jobs = Pipetrain("jobs --json");
  ASSERT_EQ(jobs.exit_code, 0);
  const nlohmann::json progress = nlohmann::json::parse(jobs.out)["progress"];
  EXPECT_EQ(progress["step"], kSteps);
  EXPECT_EQ(progress["target_step"], kSteps);
  EXPECT_TRUE(progress["eta_s"].is_null());
  EXPECT_GT(progress["samples_per_second"].get<double>(), 0);
}

TEST_F(WatchTest, CtrlCEndsTheWatchAndNotTheJob) {
  PipedChild train = testing::SpawnEndlessTrain(daemons_.address(), dir_ + "/train.err");
  std::string trained;
  const std::string job = FirstJob(train, &trained);
  ASSERT_FALSE(job.empty());
  PipedChild watch = testing::SpawnPiped(
      {PIPETRAIN_BINARY, "watch", job, "--coordinator", daemons_.address(), "--json"},
      dir_ + "/watch.err");
  std::string watched;
  // More step lines than the job's log keeps (256 events): some came as the job made them.
  ASSERT_EQ(testing::ReadWhile(watch, 60000, &watched,
                               [](const std::string& s) {
                                 return !s.empty() && s.back() == '\n' &&
                                        LinesStartingWith(s, "{\"step\": ").size() >= 300;
                               }),
            testing::ReadEnd::kDone)
      << watched;
  kill(watch.pid, SIGINT);
  const int watch_status = testing::DrainAndWait(watch, &watched, 60000);
  EXPECT_TRUE(WIFEXITED(watch_status) && WEXITSTATUS(watch_status) == 130) << watch_status;
  EXPECT_THAT(testing::ReadFile(dir_ + "/watch.err"),
              HasSubstr(absl::StrCat("pipetrain watch: interrupted: stopped watching job ", job,
                                     "; the job goes on [CANCELLED]")));
  // The job trains on: its client gets more steps.
  const size_t before = trained.size();
  EXPECT_TRUE(testing::ReadWhile(train, 60000, &trained, [before](const std::string& s) {
                return s.size() > before + 200;
              }) == testing::ReadEnd::kDone);
  absl::StatusOr<v1::JobStatus> status = daemons_.client().GetJob(job);
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_TRUE(status->state() == v1::JOB_STATE_TRAINING || status->state() == v1::JOB_STATE_READY)
      << status->DebugString();
  kill(train.pid, SIGINT);
  testing::DrainAndWait(train, &trained, 60000);
}

TEST_F(WatchTest, AnUnknownJobIsNotFound) {
  CommandRun run = Pipetrain("watch job-nope-1");
  EXPECT_EQ(run.exit_code, 1);
  EXPECT_THAT(testing::ReadFile(dir_ + "/client.err"),
              HasSubstr("pipetrain watch: WatchJob: unknown job 'job-nope-1' [NOT_FOUND]"));
}

}  // namespace
}  // namespace pipetrain
