// A run must never be lost at the end (issue 33) and one job writes a checkpoint directory at a
// time (issue 34), against a real coordinator and stage workers on 127.0.0.1:
//  - `pipetrain train --save DIR` with DIR outside the coordinator's --checkpoint-root is refused
//    when the job is created, before step 1, with the coordinator's reason (PERMISSION_DENIED
//    naming DIR and the root), whatever the coordinator's address;
//  - so is a directory a save could not write, and a second job saving into a directory another
//    job writes (naming it);
//  - a final save that fails all the same (the directory removed mid-run) leaves the job with its
//    weights; `pipetrain train` prints the command that saves them, which does, and the checkpoint
//    it writes resumes bit for bit as the reference's of the same step;
//  - `pipetrain checkpoint` leaves a job that a client still trains running.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "client/sdk/client.h"
#include "common/math/tensor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/daemons.h"
#include "tests/integration/daemons_fixture.h"
#include "tests/integration/run_command.h"

namespace pipetrain {
namespace {

using testing::Example;
using ::testing::HasSubstr;
using ::testing::Not;
using testing::ReadFile;
using testing::TempDir;

// The {"step": N, "loss": X of each --json step line (the rest are timings).
std::vector<std::string> LossLines(const std::string& out) {
  std::vector<std::string> lines;
  for (absl::string_view line : absl::StrSplit(out, '\n')) {
    if (!absl::StartsWith(line, "{\"step\"")) continue;
    const size_t loss = line.find("\"loss\": ");
    lines.emplace_back(line.substr(0, line.find_first_of(",}", loss)));
  }
  return lines;
}

// The {"step": ...} lines of --json output.
std::vector<std::string> StepLines(const std::string& out) {
  std::vector<std::string> lines;
  for (absl::string_view line : absl::StrSplit(out, '\n')) {
    if (absl::StartsWith(line, "{\"step\"")) lines.emplace_back(line);
  }
  return lines;
}

class SaveTest : public testing::DaemonsTest {
 protected:
  void SetUp() override {
    dir_ = TempDir("pipetrain_save_");
    ASSERT_FALSE(dir_.empty());
    root_ = dir_ + "/root";
    ASSERT_EQ(testing::RunCommand(absl::StrCat("mkdir -p ", root_)).exit_code, 0);
    const std::string error =
        daemons_.Start(dir_, 2, {"--client-lease", "10m", "--checkpoint-root", root_});
    ASSERT_EQ(error, "");
  }

  // `pipetrain ARGS`: stdout captured, stderr into `err` (truncated first).
  testing::CommandRun Pipetrain(const std::string& args, const std::string& err) {
    return testing::RunCommand(absl::StrCat(PIPETRAIN_BINARY, " ", args, " 2>", err));
  }

  // The flags of every run here, `reference` or `train`: the digits MLP, --json.
  static std::string RunFlags(int steps) {
    return absl::StrCat(" --model ", Example("mlp_digits.textproto"),
                        " --data digits --batch 16 --microbatches 2 --seed 7 "
                        "--optimizer adamw:lr=1e-2 --json --steps ",
                        steps);
  }
  // `train` on the coordinator at `coordinator` with `stages` stages.
  static std::string TrainFlags(const std::string& coordinator, int steps, int stages = 2) {
    return absl::StrCat("train --coordinator ", coordinator, " --stages ", stages, RunFlags(steps));
  }

  std::string root_;  // the coordinator's --checkpoint-root.
};

// The user report of issue 33: 50 steps trained, then the save refused and the weights gone. Now
// the coordinator refuses the job before step 1, for a loopback address by number or by name, a
// directory outside the root or a system path; no job is left behind and nothing is created.
TEST_F(SaveTest, ASaveOutsideTheRootIsRefusedBeforeStepOne) {
  const std::string outside = TempDir("pipetrain_outside_");
  ASSERT_FALSE(outside.empty());
  const std::string port = daemons_.address().substr(daemons_.address().rfind(':') + 1);
  const std::vector<std::string> addresses = {daemons_.address(), "localhost:" + port};
  const std::vector<std::string> saves = {outside + "/ck", "/etc/pipetrain-save-test-ck"};
  for (const std::string& address : addresses) {
    for (const std::string& save : saves) {
      SCOPED_TRACE(absl::StrCat(address, " --save ", save));
      const std::string err = dir_ + "/outside.err";
      const testing::CommandRun run =
          Pipetrain(absl::StrCat(TrainFlags(address, 50), " --save ", save), err);
      EXPECT_EQ(run.exit_code, 1) << run.out;
      EXPECT_THAT(StepLines(run.out), ::testing::IsEmpty());
      const std::string message = ReadFile(err);
      EXPECT_THAT(message, HasSubstr("[PERMISSION_DENIED]"));
      EXPECT_THAT(message, HasSubstr(absl::StrCat("'", save, "' is outside the checkpoint root")));
      EXPECT_THAT(message, HasSubstr(root_));
      EXPECT_THAT(message, Not(HasSubstr("cancelled")));
      EXPECT_EQ(ReadFile(save + "/manifest.json"), "");
    }
  }
  absl::StatusOr<std::vector<v1::JobStatus>> jobs = daemons_.client().ListJobs();
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  EXPECT_THAT(*jobs, ::testing::IsEmpty());
  EXPECT_NE(testing::RunCommand("test -e /etc/pipetrain-save-test-ck").exit_code, 0);
  testing::RunCommand(absl::StrCat("rm -rf ", outside));
}

// A --save under the root that a save could not write (below a regular file) is refused by the
// coordinator before step 1 too, naming the path.
TEST_F(SaveTest, ASaveThatCannotBeWrittenIsRefusedBeforeStepOne) {
  ASSERT_EQ(testing::RunCommand(absl::StrCat(": > ", root_, "/file")).exit_code, 0);
  const std::string save = root_ + "/file/sub", err = dir_ + "/unwritable.err";
  const testing::CommandRun run =
      Pipetrain(absl::StrCat(TrainFlags(daemons_.address(), 50), " --save ", save), err);
  EXPECT_EQ(run.exit_code, 1) << run.out;
  EXPECT_THAT(StepLines(run.out), ::testing::IsEmpty());
  const std::string message = ReadFile(err);
  EXPECT_THAT(message, HasSubstr("[FAILED_PRECONDITION]"));
  EXPECT_THAT(message, HasSubstr(root_ + "/file"));
  absl::StatusOr<std::vector<v1::JobStatus>> jobs = daemons_.client().ListJobs();
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  EXPECT_THAT(*jobs, ::testing::IsEmpty());
}

// Issue 34: two runs saving into one directory. The second is refused when its job is created,
// naming the job that writes there, for the directory itself and for one inside it; once that
// job ended, the directory is free.
TEST_F(SaveTest, ASecondJobSavingIntoTheSameDirectoryIsRefusedUpFront) {
  absl::StatusOr<v1::JobSpec> spec = testing::DigitsJobSpec(1);
  ASSERT_TRUE(spec.ok()) << spec.status();
  spec->set_save_to(root_ + "/shared");
  absl::StatusOr<v1::JobStatus> writer = daemons_.client().CreateJob(*spec);
  ASSERT_TRUE(writer.ok()) << writer.status();
  EXPECT_EQ(writer->spec().save_to(), root_ + "/shared");
  for (const std::string& save : {root_ + "/shared", root_ + "/shared/inner"}) {
    SCOPED_TRACE(save);
    const std::string err = dir_ + "/second.err";
    const testing::CommandRun run = Pipetrain(
        absl::StrCat(TrainFlags(daemons_.address(), 5, /*stages=*/1), " --save ", save), err);
    EXPECT_EQ(run.exit_code, 1) << run.out;
    EXPECT_THAT(StepLines(run.out), ::testing::IsEmpty());
    const std::string message = ReadFile(err);
    EXPECT_THAT(message, HasSubstr("[FAILED_PRECONDITION]"));
    EXPECT_THAT(message, HasSubstr(absl::StrCat("written by job ", writer->job())));
    EXPECT_THAT(message, HasSubstr("one job writes a checkpoint directory at a time"));
  }
  const testing::CommandRun cancel =
      Pipetrain(absl::StrCat("cancel ", writer->job(), " --coordinator ", daemons_.address()),
                dir_ + "/cancel.err");
  ASSERT_EQ(cancel.exit_code, 0) << ReadFile(dir_ + "/cancel.err");
  const testing::CommandRun run = Pipetrain(
      absl::StrCat(TrainFlags(daemons_.address(), 5, /*stages=*/1), " --save ", root_, "/shared"),
      dir_ + "/after.err");
  EXPECT_EQ(run.exit_code, 0) << run.out << ReadFile(dir_ + "/after.err");
  EXPECT_THAT(ReadFile(root_ + "/shared/manifest.json"), HasSubstr("\"step\": 5"));
}

// Issue 33: the final save fails after the job was created (the save directory's parent replaced
// by a file mid-run, as a removed or unmounted directory would). The job keeps its weights; the
// run exits 1 with the reason and the command that saves them; that command writes the
// checkpoint (with the run's data cursor) and ends the job; and the checkpoint is the
// reference's of the same step, byte for byte, and resumes bit for bit.
TEST_F(SaveTest, AFailedFinalSaveKeepsTheJobAndTheRetryResumesBitwise) {
  const testing::CommandRun ref = testing::RunCommand(
      absl::StrCat(PIPETRAIN_BINARY, " reference", RunFlags(80),
                   " --checkpoint-every 60 --eval-samples 1 --save ", dir_, "/ref 2>&1"));
  ASSERT_EQ(ref.exit_code, 0) << ref.out;
  const std::vector<std::string> want = LossLines(ref.out);
  ASSERT_EQ(want.size(), 80u);

  const std::string runs = root_ + "/runs", save = runs + "/ck", err = dir_ + "/train.err";
  std::vector<std::string> argv;
  for (absl::string_view a :
       absl::StrSplit(absl::StrCat(TrainFlags(daemons_.address(), 60), " --save ", save), ' ',
                      absl::SkipEmpty())) {
    argv.emplace_back(a);
  }
  argv.insert(argv.begin(), PIPETRAIN_BINARY);
  testing::PipedChild train = testing::SpawnPiped(argv, err, /*pipe_bytes=*/4096);
  ASSERT_GT(train.pid, 0);
  std::string out;
  // The job exists (its directory was checked); the run cannot pass step ~30 before we read on.
  ASSERT_TRUE(testing::ReadUntil(train, "{\"step\": 1,", &out)) << out << ReadFile(err);
  ASSERT_EQ(testing::RunCommand(absl::StrCat("rm -rf ", runs, " && touch ", runs)).exit_code, 0);
  const int status = testing::DrainAndWait(train, &out);
  ASSERT_TRUE(WIFEXITED(status)) << out;
  EXPECT_EQ(WEXITSTATUS(status), 1) << out << ReadFile(err);
  EXPECT_EQ(StepLines(out).size(), 60u);
  EXPECT_EQ(LossLines(out), std::vector<std::string>(want.begin(), want.begin() + 60));

  absl::StatusOr<std::vector<v1::JobStatus>> jobs = daemons_.client().ListJobs();
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  ASSERT_EQ(jobs->size(), 1u);
  const v1::JobStatus& kept = (*jobs)[0];
  EXPECT_EQ(kept.state(), v1::JOB_STATE_READY) << kept.reason();
  EXPECT_EQ(kept.steps_done(), 60);
  EXPECT_FALSE(kept.client_attached());
  const std::string message = ReadFile(err);
  EXPECT_THAT(message, HasSubstr(absl::StrCat("saving step 60 into ", save, " failed: ")));
  EXPECT_THAT(message, HasSubstr("is not a directory"));
  EXPECT_THAT(message, HasSubstr(runs));
  EXPECT_THAT(message,
              HasSubstr(absl::StrCat("job ", kept.job(), " keeps the weights of its 60 steps")));
  const std::string retry = absl::StrCat("pipetrain checkpoint ", kept.job(), " --save ", save,
                                         " --coordinator ", daemons_.address());
  ASSERT_THAT(message, HasSubstr("\n  " + retry + "\n"));
  EXPECT_THAT(message, HasSubstr(absl::StrCat("pipetrain cancel ", kept.job())));

  // The directory is back: the printed command saves the weights and ends the job.
  ASSERT_EQ(testing::RunCommand(absl::StrCat("rm ", runs)).exit_code, 0);
  const testing::CommandRun saved =
      Pipetrain(retry.substr(std::string("pipetrain ").size()), dir_ + "/retry.err");
  ASSERT_EQ(saved.exit_code, 0) << saved.out << ReadFile(dir_ + "/retry.err");
  EXPECT_THAT(saved.out, HasSubstr(absl::StrCat("checkpoint of step 60 written to ", save)));
  EXPECT_THAT(saved.out, HasSubstr(absl::StrCat("job ", kept.job(), " finished")));
  EXPECT_THAT(saved.out, Not(HasSubstr("no data set")));
  absl::StatusOr<v1::JobStatus> done = daemons_.client().GetJob(kept.job());
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->state(), v1::JOB_STATE_DONE);
  // The reference's checkpoint of step 60, byte for byte: manifest (data cursor too) and layers.
  const std::string ref60 = dir_ + "/ref.step-000000000060";
  EXPECT_EQ(ReadFile(save + "/manifest.json"), ReadFile(ref60 + "/manifest.json"));
  for (const std::string f : {"layer-00000.safetensors", "layer-00002.safetensors"}) {
    EXPECT_FALSE(ReadFile(ref60 + "/" + f).empty()) << f;
    EXPECT_TRUE(ReadFile(save + "/" + f) == ReadFile(ref60 + "/" + f)) << f;
  }

  // It resumes bit for bit: steps 61 to 80 and the final weights are the reference's.
  const testing::CommandRun resumed =
      Pipetrain(absl::StrCat(TrainFlags(daemons_.address(), 20), " --resume ", save, " --save ",
                             root_, "/ck80"),
                dir_ + "/resumed.err");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.out << ReadFile(dir_ + "/resumed.err");
  EXPECT_EQ(LossLines(resumed.out), std::vector<std::string>(want.begin() + 60, want.end()));
  EXPECT_EQ(ReadFile(root_ + "/ck80/manifest.json"), ReadFile(dir_ + "/ref/manifest.json"));
}

// `pipetrain checkpoint` saves a job a client is training (its Train stream open) and leaves it
// running; without --save it says how to call it.
TEST_F(SaveTest, TheCheckpointCommandLeavesAJobAClientTrains) {
  absl::StatusOr<v1::JobSpec> spec = testing::DigitsJobSpec(2);
  ASSERT_TRUE(spec.ok()) << spec.status();
  absl::StatusOr<v1::JobStatus> job = daemons_.client().CreateJob(*spec);
  ASSERT_TRUE(job.ok()) << job.status();
  absl::StatusOr<std::unique_ptr<client::TrainSession>> session =
      daemons_.client().StartTraining(job->job());
  ASSERT_TRUE(session.ok()) << session.status();
  const math::Matrix inputs = math::Matrix::Zero(4, 64), targets = math::Matrix::Zero(4, 1);
  absl::StatusOr<v1::StepResult> step = (*session)->Step(client::BatchView{&inputs, &targets, 4});
  ASSERT_TRUE(step.ok()) << step.status();

  const std::string err = dir_ + "/checkpoint.err";
  testing::CommandRun run = Pipetrain(
      absl::StrCat("checkpoint ", job->job(), " --coordinator ", daemons_.address()), err);
  EXPECT_EQ(run.exit_code, 1);
  EXPECT_THAT(ReadFile(err), HasSubstr("usage: pipetrain checkpoint JOB --save DIR"));
  run = Pipetrain(absl::StrCat("checkpoint ", job->job(), " --save ", root_, "/held",
                               " --coordinator ", daemons_.address()),
                  err);
  ASSERT_EQ(run.exit_code, 0) << run.out << ReadFile(err);
  EXPECT_THAT(run.out, HasSubstr(absl::StrCat("checkpoint of step 1 written to ", root_, "/held")));
  EXPECT_THAT(run.out, HasSubstr("no data set or data cursor"));
  EXPECT_THAT(run.out, HasSubstr(absl::StrCat("job ", job->job(),
                                              " left ready: a client is "
                                              "training it")));
  absl::StatusOr<v1::JobStatus> status = daemons_.client().GetJob(job->job());
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(status->state(), v1::JOB_STATE_READY);
  EXPECT_TRUE((*session)->Step(client::BatchView{&inputs, &targets, 4}).ok());
  EXPECT_TRUE((*session)->Finish().ok());
}

}  // namespace
}  // namespace pipetrain
