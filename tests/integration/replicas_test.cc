// Data-parallel replicas end to end (issue 29; docs/scaling.md, "Replicas"): `pipetrain local
// --replicas R` gives the losses, layer files and manifest of `pipetrain reference` with the same
// flags bit for bit (R = 2 over 2 stages under 1F1B and ZB-V, R = 4 over one stage); a checkpoint
// of a replicated run resumes bitwise; a worker of replica 1 killed mid-run is replaced (R kept),
// and without a spare the job drops to one replica, both bitwise the reference. Every process is
// started by the test and signalled by its PID only.
#include <signal.h>
#include <sys/wait.h>

#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/sdk/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/daemons.h"
#include "tests/integration/run_command.h"

namespace pipetrain {
namespace {

using testing::Example;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using testing::ReadFile;
using testing::StepLines;
using testing::TempDir;

// The flags the reference and the replicated runs share: M = 8 splits into 1, 2, 4 or 8
// replicas' shares, each at least 2 micro-batches per stage.
constexpr char kCommon[] =
    " --data digits --batch 32 --microbatches 8 --seed 13 --threads 1 --optimizer adamw:lr=1e-2 "
    "--json";

class ReplicasTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = TempDir("pipetrain_replicas_");
    ASSERT_FALSE(dir_.empty());
  }
  void TearDown() override {
    if (!HasFailure()) testing::RunCommand(absl::StrCat("rm -rf ", dir_));
  }

  // `pipetrain ARGS`, stdout captured, stderr appended to dir_/client.log.
  testing::CommandRun Pipetrain(const std::string& args) {
    return testing::RunCommand(
        absl::StrCat(PIPETRAIN_BINARY, " ", args, " 2>>", dir_, "/client.log"));
  }

  // The reference run of `steps` steps of `model` saved in dir_/`name`; its step lines.
  std::vector<std::string> Reference(const std::string& model, int steps, const std::string& name) {
    const testing::CommandRun ref =
        Pipetrain(absl::StrCat("reference --model ", model, kCommon, " --steps ", steps,
                               " --eval-samples 1 --save ", dir_, "/", name));
    EXPECT_EQ(ref.exit_code, 0) << ref.out << ReadFile(dir_ + "/client.log");
    return StepLines(ref.out, /*pipeline=*/false);
  }

  // Expects the layer files and manifest of dir_/`got` to be dir_/`want`'s, byte for byte.
  void ExpectSameCheckpoint(const std::string& want, const std::string& got, int layer_files) {
    const testing::LayerFiles files =
        testing::CompareLayerFiles(dir_ + "/" + want, dir_ + "/" + got);
    EXPECT_EQ(files.compared, layer_files);
    EXPECT_THAT(files.differ, IsEmpty());
  }

  std::string dir_;
};

struct Shape {
  int stages;
  int replicas;
  std::string schedule;
};

TEST_F(ReplicasTest, LocalReplicasMatchTheReferenceBitwise) {
  const std::string model = Example("mlp_digits.textproto");
  const std::vector<std::string> want = Reference(model, 3, "ref");
  ASSERT_EQ(want.size(), 3u);
  for (const Shape& s : {Shape{2, 2, "1f1b"}, Shape{2, 2, "zb-v"}, Shape{1, 4, "1f1b"}}) {
    SCOPED_TRACE(absl::StrCat(s.stages, " stages x ", s.replicas, " replicas, ", s.schedule));
    const std::string out = absl::StrCat("local-", s.stages, "x", s.replicas, "-", s.schedule);
    const testing::CommandRun local = Pipetrain(absl::StrCat(
        "local --stages ", s.stages, " --replicas ", s.replicas, " --schedule ", s.schedule,
        " --model ", model, kCommon, " --steps 3 --save ", dir_, "/", out));
    ASSERT_EQ(local.exit_code, 0) << local.out << ReadFile(dir_ + "/client.log");
    EXPECT_EQ(StepLines(local.out, /*pipeline=*/true), want);
    ExpectSameCheckpoint("ref", out, 3);
    EXPECT_EQ(ReadFile(dir_ + "/" + out + "/manifest.json"), ReadFile(dir_ + "/ref/manifest.json"));
  }
}

// 3 steps on 2 stages x 2 replicas, saved; 3 more resumed from it on the same shape: the losses of
// steps 4-6 and the final files of 6 reference steps.
TEST_F(ReplicasTest, AReplicatedCheckpointResumesBitwise) {
  const std::string model = Example("mlp_digits.textproto");
  std::vector<std::string> want = Reference(model, 6, "ref6");
  ASSERT_EQ(want.size(), 6u);
  want.erase(want.begin(), want.begin() + 3);
  const std::string shape = absl::StrCat(" --stages 2 --replicas 2 --model ", model, kCommon);
  const testing::CommandRun first =
      Pipetrain(absl::StrCat("local", shape, " --steps 3 --save ", dir_, "/first"));
  ASSERT_EQ(first.exit_code, 0) << first.out << ReadFile(dir_ + "/client.log");
  const testing::CommandRun second = Pipetrain(absl::StrCat(
      "local", shape, " --steps 3 --resume ", dir_, "/first --save ", dir_, "/second"));
  ASSERT_EQ(second.exit_code, 0) << second.out << ReadFile(dir_ + "/client.log");
  EXPECT_EQ(StepLines(second.out, /*pipeline=*/true), want);
  ExpectSameCheckpoint("ref6", "second", 3);
}

// Long-lived daemons: `workers` stage workers for a 2 x 2 job.
class ReplicaRecoveryTest : public ReplicasTest {
 protected:
  // Trains 60 steps on 2 stages x 2 replicas with a checkpoint every 10, kills (SIGKILL) the
  // worker at position 3 (rank 1 of replica 1) after step 25 and expects the run to recover to
  // `replicas_after` replicas, bitwise the reference.
  void ExpectBitwiseRecovery(int workers, const std::string& extra, int replicas_after);
};

void ReplicaRecoveryTest::ExpectBitwiseRecovery(int workers, const std::string& extra,
                                                int replicas_after) {
  testing::Daemons daemons;
  ASSERT_EQ(daemons.Start(dir_, workers, {"--client-lease", "10m", "--checkpoint-root", dir_}), "");
  const std::string model = Example("mlp_digits.textproto");
  const std::vector<std::string> want = Reference(model, 60, "ref");
  ASSERT_EQ(want.size(), 60u);
  std::vector<std::string> argv = {PIPETRAIN_BINARY,
                                   "train",
                                   "--coordinator",
                                   daemons.address(),
                                   "--stages",
                                   "2",
                                   "--replicas",
                                   "2",
                                   "--model",
                                   model,
                                   "--steps",
                                   "60",
                                   "--checkpoint-every",
                                   "10",
                                   "--save",
                                   dir_ + "/pipe"};
  for (absl::string_view f :
       absl::StrSplit(absl::StrCat(kCommon, " ", extra), ' ', absl::SkipEmpty())) {
    argv.emplace_back(f);
  }
  const std::string err = dir_ + "/train.err";
  testing::PipedChild train = testing::SpawnPiped(argv, err);
  ASSERT_GT(train.pid, 0);
  std::string out;
  ASSERT_TRUE(testing::ReadUntil(train, "{\"step\": 1,", &out)) << out << ReadFile(err);
  absl::StatusOr<std::vector<v1::JobStatus>> jobs = daemons.client().ListJobs();
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  ASSERT_EQ(jobs->size(), 1u);
  ASSERT_EQ((*jobs)[0].replicas(), 2);
  ASSERT_EQ((*jobs)[0].stages_size(), 4);
  const v1::StageStatus& victim = (*jobs)[0].stages(3);
  EXPECT_EQ(victim.replica(), 1);
  EXPECT_EQ(victim.rank(), 1);
  const int index = victim.worker().back() - '0';
  ASSERT_TRUE(index >= 0 && index < workers) << victim.worker();
  ASSERT_TRUE(testing::ReadUntil(train, "{\"step\": 25,", &out)) << out << ReadFile(err);
  ASSERT_EQ(kill(daemons.workers()[index], SIGKILL), 0);
  const int status = testing::DrainAndWait(train, &out);
  daemons.Reap(index);
  ASSERT_TRUE(WIFEXITED(status)) << out;
  ASSERT_EQ(WEXITSTATUS(status), 0) << out << ReadFile(err);
  EXPECT_THAT(out, HasSubstr(absl::StrCat("{\"recovery\": {\"lost_worker\": \"", victim.worker(),
                                          "\", \"rank\": 3")));
  EXPECT_THAT(out, HasSubstr(absl::StrCat("\"stages\": 2, \"replicas\": ", replicas_after, ",")));
  EXPECT_EQ(StepLines(out, /*pipeline=*/true), want);
  ExpectSameCheckpoint("ref", "pipe", 3);
  EXPECT_EQ(daemons.Stop(), "");
}

TEST_F(ReplicaRecoveryTest, AKilledWorkerOfReplicaOneIsReplacedKeepingTwoReplicas) {
  ExpectBitwiseRecovery(/*workers=*/5, "", /*replicas_after=*/2);
}

TEST_F(ReplicaRecoveryTest, WithoutASpareTheJobDropsToOneReplicaKeepingItsStages) {
  ExpectBitwiseRecovery(/*workers=*/4, "--min-stages 2 --replace-timeout 1s",
                        /*replicas_after=*/1);
}

}  // namespace
}  // namespace pipetrain
