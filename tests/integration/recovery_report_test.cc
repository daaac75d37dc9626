// `pipetrain train` reports every recovery as it happens, with its stdout a pipe (docs/recovery.md,
// "Report"): a worker lost right after a checkpoint — the recovery restores the very step the run
// is at, and waits for a replacement — shows what failed and that the run waits while it waits,
// then the recovery and the step it restarted from, then training again. Real daemons on
// 127.0.0.1, started by the test and signalled by their PIDs only.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/daemons.h"
#include "tests/integration/daemons_fixture.h"
#include "tests/integration/run_command.h"

namespace pipetrain {
namespace {

using ::testing::HasSubstr;
using testing::ReadFile;

// Whether process `pid` (a child of this one) is blocked in write(2) on its standard output: the
// system call and first argument /proc/PID/syscall shows for its main thread (x86-64: write is 1).
// nullopt if that file cannot be read here.
std::optional<bool> BlockedWritingStdout(pid_t pid) {
  const std::string syscall = ReadFile(absl::StrCat("/proc/", pid, "/syscall"));
  if (syscall.empty()) return std::nullopt;
  return absl::StartsWith(syscall, "1 0x1 ");
}

class RecoveryReportTest : public testing::DaemonsTest {
 protected:
  void SetUp() override {
    dir_ = testing::TempDir("pipetrain_rep_");
    ASSERT_FALSE(dir_.empty());
    ASSERT_EQ(daemons_.Start(dir_, 2, {"--checkpoint-root", dir_}), "");
  }

  void TearDown() override {
    if (train_.pid > 0) {
      kill(train_.pid, SIGKILL);
      std::string rest;
      testing::DrainAndWait(train_, &rest, 10000);
    }
    if (replacement_ > 0) {
      kill(replacement_, SIGTERM);
      waitpid(replacement_, nullptr, 0);
    }
    DaemonsTest::TearDown();
  }

  // Waits (at most 120 s) until `pipetrain train` is blocked writing a line to its full stdout;
  // false if it is not, nullopt if this system does not show it.
  std::optional<bool> AwaitBlockedOutput() {
    const absl::Time deadline = absl::Now() + absl::Seconds(120);
    while (absl::Now() < deadline) {
      const std::optional<bool> blocked = BlockedWritingStdout(train_.pid);
      if (!blocked.has_value() || *blocked) return blocked;
      absl::SleepFor(absl::Milliseconds(20));  // polling a bounded wait.
    }
    return false;
  }

  // Waits (at most 30 s) until job `id` is RECOVERING.
  bool AwaitRecovering(const std::string& id) {
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    while (absl::Now() < deadline) {
      absl::StatusOr<v1::JobStatus> job = daemons_.client().GetJob(id);
      if (job.ok() && job->state() == v1::JOB_STATE_RECOVERING) return true;
      absl::SleepFor(absl::Milliseconds(10));  // polling a bounded wait.
    }
    return false;
  }

  testing::PipedChild train_;
  pid_t replacement_ = -1;
};

// The run is held exactly between a checkpoint and its next step: its stdout is a pipe of one
// page that the test does not read, and with no progress lines (--log-every) every line after the
// first step is a checkpoint's, so the run blocks writing "checkpoint of step N written" — after
// the checkpoint, before the next batch. Then the worker of rank 1 is killed, with no spare: the
// job recovers from that very checkpoint, and waits for a replacement. Before, the next batch
// waited behind the recovery and the run printed nothing until it resumed; now it is refused at
// once and the run says what failed and that it waits — while no replacement exists — then, once
// the test starts one, that it recovered and from which step, and it trains on.
TEST_F(RecoveryReportTest, AWorkerLostRightAfterACheckpointIsReportedAsItHappens) {
  train_ = testing::SpawnPiped({PIPETRAIN_BINARY,
                                "train",
                                "--coordinator",
                                daemons_.address(),
                                "--stages",
                                "2",
                                "--model",
                                testing::Example("mlp_digits.textproto"),
                                "--data",
                                "digits",
                                "--batch",
                                "16",
                                "--microbatches",
                                "2",
                                "--steps",
                                "100000",
                                "--checkpoint-every",
                                "5",
                                "--save",
                                dir_ + "/ck",
                                "--log-every",
                                "1000000",
                                "--replace-timeout",
                                "5m"},
                               dir_ + "/train.err");
  ASSERT_GT(train_.pid, 0);
  // One page: what the run writes before its first step fits, so this never fails for timing.
  ASSERT_GE(fcntl(train_.out, F_SETPIPE_SZ, 4096), 4096);
  const std::optional<bool> blocked = AwaitBlockedOutput();
  if (!blocked.has_value()) GTEST_SKIP() << "/proc/PID/syscall cannot be read here";
  ASSERT_TRUE(*blocked) << ReadFile(dir_ + "/train.err");

  absl::StatusOr<std::vector<v1::JobStatus>> jobs = daemons_.client().ListJobs();
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  ASSERT_EQ(jobs->size(), 1u);
  const v1::JobStatus job = (*jobs)[0];
  const int64_t step = job.steps_done();  // the checkpoint the run is writing the line of.
  ASSERT_GT(step, 0);
  ASSERT_EQ(step % 5, 0);
  const std::string victim = job.stages(1).worker();
  ASSERT_EQ(daemons_.KillWorker(victim), "");
  ASSERT_TRUE(AwaitRecovering(job.job()));

  // No worker can replace it yet: the wait itself must show.
  std::string out;
  ASSERT_TRUE(testing::ReadUntil(train_, "waiting for job", &out, 60000))
      << "nothing said while the job waits for a replacement:\n"
      << out << ReadFile(dir_ + "/train.err");
  const std::string checkpoint = absl::StrCat("checkpoint of step ", step, " written to ");
  const std::string waiting =
      absl::StrCat("after step ", step, ": job '", job.job(), "' is recovering (worker '", victim,
                   "' lost); retry once it is ready; waiting for job ", job.job(),
                   " to recover (a replacement worker, then a restart from its last checkpoint)");
  EXPECT_TRUE(testing::ReadUntil(train_, waiting + "\n", &out, 10000)) << out;
  EXPECT_THAT(out, HasSubstr(checkpoint));
  EXPECT_LT(out.find(checkpoint), out.find(waiting));

  replacement_ = testing::Spawn({PIPETRAIN_STAGE_WORKER_BINARY, "--coordinator", daemons_.address(),
                                 "--listen", "127.0.0.1:0", "--name", "w2"},
                                dir_ + "/worker-2.log");
  ASSERT_GT(replacement_, 0);
  const std::string next = absl::StrCat("checkpoint of step ", step + 5, " written to ");
  ASSERT_TRUE(testing::ReadUntil(train_, next, &out, 60000))
      << out << ReadFile(dir_ + "/train.err");
  const std::string recovered =
      absl::StrCat("recovered: lost ", victim, " (rank 1, lost) after step ", step,
                   "; restarted from step ", step, " on 2 stages (");
  EXPECT_THAT(out, HasSubstr(recovered));
  EXPECT_THAT(out, HasSubstr("; replayed 0 steps\n"));
  EXPECT_LT(out.find(waiting), out.find(recovered));
  EXPECT_LT(out.find(recovered), out.find(next));

  // Ctrl-C ends the run between two steps and cancels its job.
  ASSERT_EQ(kill(train_.pid, SIGINT), 0);
  const int status = testing::DrainAndWait(train_, &out, 60000);
  train_.pid = -1;
  ASSERT_TRUE(WIFEXITED(status)) << out;
  EXPECT_EQ(WEXITSTATUS(status), 130) << ReadFile(dir_ + "/train.err");
  absl::StatusOr<v1::JobStatus> ended = daemons_.client().GetJob(job.job());
  ASSERT_TRUE(ended.ok()) << ended.status();
  EXPECT_EQ(ended->state(), v1::JOB_STATE_CANCELLED);
  ASSERT_EQ(ended->recoveries_size(), 1);
  EXPECT_EQ(ended->recoveries(0).restored_step(), step);
}

}  // namespace
}  // namespace pipetrain
