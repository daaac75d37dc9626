// Evaluation through the service (issue 32), against a real coordinator and stage workers on
// 127.0.0.1: `pipetrain train --eval-every/--eval-samples` evaluates the job's live weights with
// the Evaluate RPC (the client sends its held-out samples; no checkpoint is read), and prints
// exactly the lines `pipetrain reference` prints for the same run and `pipetrain evaluate` prints
// for a checkpoint of the same step; the SDK's Evaluate leaves the job training on.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
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

using ::testing::ElementsAre;
using testing::Example;
using ::testing::HasSubstr;
using testing::ReadFile;
using testing::TempDir;

// The {"eval_...} lines of --json output.
std::vector<std::string> EvalLines(const std::string& out) {
  std::vector<std::string> lines;
  for (absl::string_view line : absl::StrSplit(out, '\n')) {
    if (absl::StartsWith(line, "{\"eval_")) lines.emplace_back(line);
  }
  return lines;
}

class EvaluateTest : public testing::DaemonsTest {
 protected:
  void SetUp() override {
    dir_ = TempDir("pipetrain_evaluate_");
    ASSERT_FALSE(dir_.empty());
    root_ = dir_ + "/root";
    ASSERT_EQ(testing::RunCommand(absl::StrCat("mkdir -p ", root_)).exit_code, 0);
    ASSERT_EQ(daemons_.Start(dir_, 2, {"--checkpoint-root", root_}), "");
  }
  // `pipetrain ARGS`: stdout captured, stderr into dir_/NAME.err.
  testing::CommandRun Pipetrain(const std::string& args, const std::string& name) {
    return testing::RunCommand(
        absl::StrCat(PIPETRAIN_BINARY, " ", args, " 2>", dir_, "/", name, ".err"));
  }
  std::string Err(const std::string& name) { return ReadFile(dir_ + "/" + name + ".err"); }

  // The digits MLP for 4 steps, evaluating 300 held-out samples (chunks of 256 and 44).
  static std::string RunFlags() {
    return absl::StrCat(" --model ", Example("mlp_digits.textproto"),
                        " --data digits --batch 16 --microbatches 2 --seed 7 "
                        "--optimizer adamw:lr=1e-2 --json --steps 4 --eval-samples 300");
  }

  std::string root_;
};

TEST_F(EvaluateTest, EvalEveryThroughTheServicePrintsTheReferencesAndEvaluatesLines) {
  testing::CommandRun reference = Pipetrain("reference --eval-every 2" + RunFlags(), "reference");
  ASSERT_EQ(reference.exit_code, 0) << Err("reference");
  const std::vector<std::string> want = EvalLines(reference.out);
  ASSERT_EQ(want.size(), 3u) << reference.out;  // steps 2 and 4, and the final one.
  EXPECT_THAT(want[0], HasSubstr("{\"eval_step\": 2, \"eval_loss\": "));

  // A checkpoint directory the client cannot read is no obstacle: nothing is read from it.
  const std::string save = root_ + "/run";
  for (const std::string schedule : {"1f1b", "interleaved"}) {
    SCOPED_TRACE(schedule);
    testing::CommandRun train = Pipetrain(
        absl::StrCat("train --coordinator ", daemons_.address(), " --stages 2 --schedule ",
                     schedule, " --eval-every 2 --save ", save, RunFlags()),
        "train");
    ASSERT_EQ(train.exit_code, 0) << Err("train");
    EXPECT_EQ(EvalLines(train.out), want) << train.out;
  }
  // Without --save: the final evaluation of the live weights all the same.
  testing::CommandRun unsaved =
      Pipetrain(absl::StrCat("train --coordinator ", daemons_.address(), " --stages 2", RunFlags()),
                "unsaved");
  ASSERT_EQ(unsaved.exit_code, 0) << Err("unsaved");
  EXPECT_THAT(EvalLines(unsaved.out), ElementsAre(want[2]));

  // `pipetrain evaluate` of the step-4 checkpoint: the figures of the step-4 line.
  testing::CommandRun evaluate =
      Pipetrain(absl::StrCat("evaluate --resume ", save, " --eval-samples 300 --json"), "evaluate");
  ASSERT_EQ(evaluate.exit_code, 0) << Err("evaluate");
  EXPECT_THAT(EvalLines(evaluate.out), ElementsAre(want[2]));
  EXPECT_EQ(absl::StrCat("{\"eval_step\": 4, ", want[2].substr(1)), want[1]);
}

TEST_F(EvaluateTest, TheSdksEvaluateLeavesTheJobTrainingAndRefusesWhatItCannotRun) {
  absl::StatusOr<v1::JobSpec> spec = testing::DigitsJobSpec(2);
  ASSERT_TRUE(spec.ok()) << spec.status();
  absl::StatusOr<v1::JobStatus> job = daemons_.client().CreateJob(*spec);
  ASSERT_TRUE(job.ok()) << job.status();
  absl::StatusOr<std::unique_ptr<client::TrainSession>> session =
      daemons_.client().StartTraining(job->job());
  ASSERT_TRUE(session.ok()) << session.status();
  math::Matrix inputs(4, 64), targets(4, 1);
  for (int r = 0; r < 4; ++r) {
    for (int c = 0; c < 64; ++c) inputs(r, c) = static_cast<float>((r * 64 + c) % 17) / 16.0f;
    targets(r, 0) = static_cast<float>(r % 10);
  }
  const client::BatchView batch{&inputs, &targets, 4};
  ASSERT_TRUE((*session)->Step(batch).ok());
  absl::StatusOr<v1::EvaluateResult> eval = (*session)->Evaluate(batch, 3);
  ASSERT_TRUE(eval.ok()) << eval.status();
  EXPECT_EQ(eval->step(), 1);
  EXPECT_EQ(eval->samples(), 4);
  ASSERT_EQ(eval->chunks_size(), 2);  // 3 and 1 samples
  EXPECT_EQ(eval->chunks(1).samples(), 1);
  EXPECT_EQ(eval->loss(), (eval->chunks(0).loss_sum() + eval->chunks(1).loss_sum()) / 4.0);
  // The same weights, the same chunks: the same bits.
  absl::StatusOr<v1::EvaluateResult> again = daemons_.client().Evaluate(job->job(), batch, 3);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->loss(), eval->loss());
  EXPECT_EQ(again->chunks(0).loss_sum(), eval->chunks(0).loss_sum());
  EXPECT_EQ(again->correct(), eval->correct());

  // More chunks than the job's 2 micro-batches: keyed over two mailbox steps, as the streams
  // accept micro-batch indices below M only.
  absl::StatusOr<v1::EvaluateResult> singles = (*session)->Evaluate(batch, 1);
  ASSERT_TRUE(singles.ok()) << singles.status();
  ASSERT_EQ(singles->chunks_size(), 4);
  double sum = 0;
  for (const v1::EvaluateChunk& c : singles->chunks()) {
    EXPECT_EQ(c.samples(), 1);
    sum += c.loss_sum();
  }
  EXPECT_EQ(singles->loss(), sum / 4.0);
  EXPECT_EQ(singles->correct(), eval->correct());

  ASSERT_TRUE((*session)->Send(batch).ok());
  absl::StatusOr<v1::EvaluateResult> busy = (*session)->Evaluate(batch);
  EXPECT_EQ(busy.status().code(), absl::StatusCode::kFailedPrecondition);
  absl::StatusOr<v1::StepResult> second = (*session)->Receive();
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->step(), 2);
  absl::StatusOr<v1::EvaluateResult> bad = (*session)->Evaluate(batch, -1);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(daemons_.client().Evaluate("job-none", batch).status().code(),
            absl::StatusCode::kNotFound);
  eval = (*session)->Evaluate(batch);
  ASSERT_TRUE(eval.ok()) << eval.status();
  EXPECT_EQ(eval->step(), 2);
  EXPECT_TRUE((*session)->Finish().ok());
  EXPECT_TRUE(daemons_.client().FinishJob(job->job()).ok());
}

}  // namespace
}  // namespace pipetrain
