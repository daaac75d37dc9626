// One coordinator per state directory, end to end (issue 34): a second `coordinator` started on a
// live one's --state-dir exits 1 at start naming the first (pid, host, address) and touches
// nothing; the first one's job and journal record are intact. Once the first is killed (SIGKILL),
// the lock file it leaves blocks nobody: a coordinator restarted on the directory continues the
// job. Every process is started by the test on 127.0.0.1 and signalled by its PID only.
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/daemons.h"
#include "tests/integration/daemons_fixture.h"

namespace pipetrain {
namespace {

using ::testing::HasSubstr;

std::string HostName() {
  char name[256] = {};
  gethostname(name, sizeof(name) - 1);
  return name;
}

class StateDirTest : public testing::DaemonsTest {
 protected:
  void SetUp() override {
    dir_ = testing::TempDir("pipetrain_state_");
    ASSERT_FALSE(dir_.empty());
    state_ = dir_ + "/state";
    const std::string error =
        daemons_.Start(dir_, 1, {"--state-dir", state_, "--checkpoint-root", dir_});
    ASSERT_EQ(error, "");
  }

  // A second coordinator on the state directory (any free port): its wait status once it ended
  // (it is killed after 30 s), with what it wrote to stdout and stderr.
  int StartSecond(std::string* out, std::string* err) {
    const std::string log = dir_ + "/second.log";
    testing::PipedChild second = testing::SpawnPiped(
        {PIPETRAIN_COORDINATOR_BINARY, "--listen", "127.0.0.1:0", "--state-dir", state_}, log);
    if (second.pid <= 0) return -1;
    const int status = testing::DrainAndWait(second, out, 30000);
    *err = testing::ReadFile(log);
    return status;
  }

  std::string state_;
};

TEST_F(StateDirTest, ASecondCoordinatorOnTheStateDirectoryRefusesToStart) {
  absl::StatusOr<v1::JobSpec> spec = testing::DigitsJobSpec(1);
  ASSERT_TRUE(spec.ok()) << spec.status();
  spec->set_recover(true);
  absl::StatusOr<v1::JobStatus> job = daemons_.client().CreateJob(*spec);
  ASSERT_TRUE(job.ok()) << job.status();
  const std::string record = absl::StrCat(state_, "/jobs/", job->job(), ".pb");
  ASSERT_TRUE(std::filesystem::exists(record));

  std::string out, err;
  const int status = StartSecond(&out, &err);
  ASSERT_TRUE(WIFEXITED(status)) << status << " " << err;
  EXPECT_EQ(WEXITSTATUS(status), 1) << err;
  EXPECT_EQ(out, "");  // it never served.
  EXPECT_THAT(
      err, HasSubstr(absl::StrCat("coordinator: --state-dir ", state_, ": state directory ", state_,
                                  " is in use by another coordinator (pid ", daemons_.coordinator(),
                                  " on host ", HostName(), ", serving on ", daemons_.address(),
                                  "; lock file ", state_,
                                  "/coordinator.lock): one coordinator per state "
                                  "directory")));
  // The first one's job and its journal record are as they were.
  EXPECT_TRUE(std::filesystem::exists(record));
  absl::StatusOr<v1::JobStatus> still = daemons_.client().GetJob(job->job());
  ASSERT_TRUE(still.ok()) << still.status();
  EXPECT_EQ(still->state(), v1::JOB_STATE_READY);

  // Killed, the first leaves its lock file (naming it) and no lock: a restart continues the job.
  const pid_t first = daemons_.coordinator();
  daemons_.KillCoordinator();
  EXPECT_THAT(testing::ReadFile(state_ + "/coordinator.lock"),
              HasSubstr(absl::StrCat("pid ", first, "\n")));
  ASSERT_EQ(daemons_.RestartCoordinator(), "");
  EXPECT_THAT(testing::ReadFile(state_ + "/coordinator.lock"),
              HasSubstr(absl::StrCat("pid ", daemons_.coordinator(), "\n")));
  absl::StatusOr<v1::JobStatus> restored = daemons_.client().GetJob(job->job());
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (!restored.ok() && absl::IsUnavailable(restored.status()) && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(50));  // polling the reconnection, not synchronisation.
    restored = daemons_.client().GetJob(job->job());
  }
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_EQ(restored->job(), job->job());
  EXPECT_NE(restored->state(), v1::JOB_STATE_FAILED) << restored->reason();
}

}  // namespace
}  // namespace pipetrain
