// `pipetrain local` and `pipetrain train` refuse a job that cannot run before they start anything
// (issue 33): the exit code, the message with its fix, and that no daemon was started. The
// daemons `local` would start are stand-ins ($PIPETRAIN_COORDINATOR_BINARY,
// $PIPETRAIN_STAGE_WORKER_BINARY) that only record that they ran.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/run_command.h"

namespace pipetrain {
namespace {

using testing::Example;
using ::testing::HasSubstr;
using ::testing::StartsWith;

class LocalRefusalTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::TempDir("local_command_test-");
    ASSERT_FALSE(dir_.empty());
    started_ = dir_ + "/started";
    // A stand-in daemon: records its command line and exits (so a run that does start it fails
    // with "the coordinator exited before it served").
    fake_ = dir_ + "/fake_daemon";
    std::ofstream(fake_) << "#!/bin/sh\necho \"$0 $*\" >> " << started_ << "\nexit 3\n";
    ASSERT_EQ(chmod(fake_.c_str(), 0755), 0);
  }

  void TearDown() override { testing::RunCommand("rm -rf " + dir_); }

  // Runs `pipetrain ARGS` with the stand-in daemons; stdout and stderr together.
  testing::CommandRun Pipetrain(const std::string& args) {
    return testing::RunCommand(absl::StrCat("PIPETRAIN_COORDINATOR_BINARY=", fake_,
                                            " PIPETRAIN_STAGE_WORKER_BINARY=", fake_, " ",
                                            PIPETRAIN_BINARY, " ", args, " 2>&1"));
  }

  // Expects `pipetrain local ARGS` to exit 1 with `message` (after "pipetrain local: ") and to
  // have started no daemon.
  void ExpectRefused(const std::string& args, const std::string& message) {
    const testing::CommandRun r = Pipetrain("local " + args);
    EXPECT_EQ(r.exit_code, 1) << args << "\n" << r.out;
    EXPECT_THAT(r.out, StartsWith("pipetrain local: " + message)) << args;
    EXPECT_FALSE(Started()) << args << ": a daemon was started: " << testing::ReadFile(started_);
  }

  bool Started() const { return access(started_.c_str(), F_OK) == 0; }

  // A copy of examples/`name` with `from` replaced by `to`.
  std::string ModelWith(const std::string& name, const std::string& from, const std::string& to) {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path) << absl::StrReplaceAll(testing::ReadFile(Example(name)), {{from, to}});
    return path;
  }

  std::string dir_, started_, fake_;
};

// The check: a job that can run starts the (stand-in) coordinator, so a refusal that starts none
// is the check's doing, not the stand-in's.
TEST_F(LocalRefusalTest, AJobThatCanRunStartsTheDaemons) {
  const testing::CommandRun r = Pipetrain("local --stages 2 --schedule zb-v --model " +
                                          Example("gpt_char.textproto") + " --data text --steps 1");
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_THAT(r.out, HasSubstr("the coordinator exited before it served"));
  EXPECT_TRUE(Started());
  EXPECT_THAT(testing::ReadFile(started_), HasSubstr("--listen=127.0.0.1:0"));
}

// --plan auto chooses the schedule, virtual stages and micro-batches: giving one too, or a mode
// other than auto, is refused before anything is planned or started. A plan that runs starts the
// daemons with its stages, after saying which plan it chose.
TEST_F(LocalRefusalTest, PlanAutoRefusesWhatItChoosesAndSaysItsChoice) {
  const std::string model = " --model " + Example("mlp_digits.textproto") + " --steps 1";
  ExpectRefused("--plan auto --schedule gpipe" + model,
                "--plan auto chooses --schedule: give one of them, not both");
  ExpectRefused("--plan auto --microbatches 4" + model,
                "--plan auto chooses --microbatches: give one of them, not both");
  ExpectRefused("--plan fastest" + model, "--plan must be auto, got 'fastest'");
  const testing::CommandRun r = Pipetrain("local --plan auto --stages 2 --batch 8" + model);
  EXPECT_THAT(r.out, ::testing::ContainsRegex(
                         "plan auto: 1 replica x [12] stages? x [12] virtual, [a-z0-9-]+, [1248] "
                         "micro-batches of [0-9]+ plans on 2 workers: predicted [0-9]+ samples/s"))
      << r.out;
  EXPECT_TRUE(Started());
  // train plans over the coordinator's idle workers: --stages is its choice too.
  const testing::CommandRun t =
      Pipetrain("train --coordinator 127.0.0.1:1 --plan auto --stages 2" + model);
  EXPECT_EQ(t.exit_code, 1) << t.out;
  EXPECT_THAT(t.out, HasSubstr("--plan auto chooses --stages from the coordinator's idle workers"));
}

TEST_F(LocalRefusalTest, FewerLayersThanChunksSaysWhatFits) {
  ExpectRefused(
      "--stages 4 --schedule zb-v --model " + Example("gpt_char.textproto") + " --data text",
      "the model has 5 layers, fewer than the 8 chunks of 4 stages x 2 virtual stages "
      "(every chunk needs a layer): use 2 stages or fewer, a schedule with one chunk "
      "per stage (gpipe, 1f1b, zb-h1; up to 5 stages), or a model with at least 8 "
      "layers [INVALID_ARGUMENT]");
  ExpectRefused("--stages 6 --model " + Example("mlp_digits.textproto"),
                "the model has 5 layers, fewer than the 6 chunks of 6 stages (every chunk needs a "
                "layer): use 5 stages or fewer, or a model with at least 6 layers");
}

TEST_F(LocalRefusalTest, ScheduleParametersAreTheCoordinators) {
  ExpectRefused("--stages 2 --schedule interleaved --microbatches 3 --batch 63 --model " +
                    Example("mlp_digits.textproto"),
                "interleaved 1F1B needs microbatches (3) to be a multiple of stages (2)");
}

// --replicas R splits each step's micro-batches into R shares that must be nodes of the gradient
// tree, and the schedule's rules apply to a share: both are refused before anything starts.
TEST_F(LocalRefusalTest, ReplicasMustSplitTheStepIntoTreeNodes) {
  const std::string model = " --model " + Example("mlp_digits.textproto");
  ExpectRefused("--replicas 4 --microbatches 6 --batch 48" + model,
                "replicas 4 does not divide microbatches 6 into a node of the gradient tree; "
                "supported: 1, 2");
  ExpectRefused("--replicas 0" + model, "--replicas must be >= 1, got 0");
  ExpectRefused(
      "--stages 2 --schedule interleaved --replicas 2 --microbatches 2 --batch 32" + model,
      "with 2 replicas each runs microbatches / replicas = 1 micro-batches");
  ExpectRefused("--plan auto --replicas 2" + model,
                "--plan auto chooses --replicas: give one of them, not both");
}

TEST_F(LocalRefusalTest, TextNeedsATokenModel) {
  ExpectRefused("--model " + Example("mlp_digits.textproto") + " --data text",
                "data set 'text' holds token ids, for a model that starts with an embedding "
                "layer; this model does not: pass --data digits, csv:PATH");
}

TEST_F(LocalRefusalTest, ATokenModelNeedsText) {
  ExpectRefused("--model " + Example("gpt_char.textproto") + " --data digits",
                "data set 'digits' holds rows of features, but the model starts with an embedding "
                "layer, which takes token ids: pass --data text, text:PATH or tokens:PATH");
}

TEST_F(LocalRefusalTest, InputWidthMustBeTheDatas) {
  ExpectRefused(
      "--data digits --model " +
          ModelWith("mlp_digits.textproto", "input_features: 64", "input_features: 32"),
      "model input_features 32 != data set's 64 (digits): set the model's input_features to 64 "
      "(or to 0 to take the data set's), or pass a data set with 32 features per row");
}

TEST_F(LocalRefusalTest, LabelsMustBeClassesOfTheModel) {
  const testing::CommandRun r =
      Pipetrain("local --data digits --model " +
                ModelWith("mlp_digits.textproto", "out_features: 10", "out_features: 5"));
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_THAT(r.out, HasSubstr("class label 5 is out of range for the model, whose last layer "
                               "outputs 5 classes (labels 0 to 4); the data set has 10: set the "
                               "last linear layer's out_features to 10, or to 0 to take the data "
                               "set's"));
  EXPECT_FALSE(Started());
}

TEST_F(LocalRefusalTest, TheCoordinatorsCapsAndTheBatch) {
  // The coordinator `local` starts has its flags' defaults: --max-microbatches 1024.
  ExpectRefused("--batch 1100 --microbatches 1100 --model " + Example("mlp_digits.textproto"),
                "microbatches 1100 is more than the limit of 1024 (coordinator flag "
                "--max-microbatches)");
  const testing::CommandRun big =
      Pipetrain("local --batch 2000 --model " + Example("mlp_digits.textproto"));
  EXPECT_EQ(big.exit_code, 1) << big.out;
  EXPECT_THAT(big.out, HasSubstr("1438"));
  EXPECT_FALSE(Started());
}

TEST_F(LocalRefusalTest, AMissingModelFileIsNamed) {
  ExpectRefused("--model " + dir_ + "/nothing.textproto",
                "model spec file: cannot read '" + dir_ + "/nothing.textproto'");
}

TEST_F(LocalRefusalTest, AMissingDaemonBinaryIsNamed) {
  const testing::CommandRun r = testing::RunCommand(
      absl::StrCat("PIPETRAIN_COORDINATOR_BINARY=", dir_, "/nothing ", PIPETRAIN_BINARY,
                   " local --model ", Example("mlp_digits.textproto"), " 2>&1"));
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_THAT(r.out, StartsWith(absl::StrCat("pipetrain local: the coordinator binary ", dir_,
                                             "/nothing (from $PIPETRAIN_COORDINATOR_BINARY) is "
                                             "not an executable file [FAILED_PRECONDITION]")));
}

// `train` checks the same before CreateJob: against a coordinator nobody serves, the refusal is
// the job's, not UNAVAILABLE.
TEST_F(LocalRefusalTest, TrainRefusesBeforeItConnects) {
  const testing::CommandRun r =
      Pipetrain("train --coordinator 127.0.0.1:1 --stages 4 --schedule zb-v --model " +
                Example("gpt_char.textproto") + " --data text");
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_THAT(r.out, StartsWith("pipetrain train: the model has 5 layers, fewer than the 8 "
                                "chunks of 4 stages x 2 virtual stages"));
  // A coordinator's flags are its own: train does not apply the default caps.
  const testing::CommandRun caps =
      Pipetrain("train --coordinator 127.0.0.1:1 --batch 1100 --microbatches 1100 --model " +
                Example("mlp_digits.textproto"));
  EXPECT_EQ(caps.exit_code, 1) << caps.out;
  EXPECT_THAT(caps.out, HasSubstr("[UNAVAILABLE]"));
}

}  // namespace
}  // namespace pipetrain
