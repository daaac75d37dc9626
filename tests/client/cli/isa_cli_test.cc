// The instruction-set level end to end, through the real binaries: `reference` runs at the level
// it is given (or the highest this CPU runs, capped by --max-isa), says which, repeats its bits at
// each level; `local` with workers capped by --max-isa runs the job at that level and equals the
// reference at the same level bit for bit, checkpoint included; a checkpoint resumed at another
// level records it. docs/performance.md, "Instruction sets".
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "common/math/isa.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/integration/run_command.h"

namespace pipetrain {
namespace {

using testing::Example;
using ::testing::HasSubstr;

testing::CommandRun Pipetrain(const std::string& args) {
  return testing::RunCommand(std::string(PIPETRAIN_BINARY) + " " + args + " 2>&1");
}

// The losses of --json output.
std::vector<double> Losses(const std::string& out) {
  std::vector<double> losses;
  for (absl::string_view line : absl::StrSplit(out, '\n', absl::SkipEmpty())) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_discarded() && j.contains("step")) losses.push_back(j["loss"].get<double>());
  }
  return losses;
}

nlohmann::json Manifest(const std::string& dir) {
  auto j = nlohmann::json::parse(testing::ReadFile(dir + "/manifest.json"), nullptr, false);
  EXPECT_FALSE(j.is_discarded()) << dir;
  return j;
}

const std::string kRun = " --model " + Example("mlp_digits.textproto") +
                         " --batch 16 --microbatches 4 --seed 3 --steps 3 --eval-samples 0";

TEST(IsaCliTest, ReferenceRunsAtTheLevelItIsGivenAndRepeatsItsBits) {
  const std::vector<math::Isa> levels = math::SupportedIsas();
  ASSERT_FALSE(levels.empty());
  for (math::Isa isa : levels) {
    const std::string name(math::IsaName(isa));
    SCOPED_TRACE(name);
    const testing::CommandRun text = Pipetrain("reference --isa " + name + kRun);
    ASSERT_EQ(text.exit_code, 0) << text.out;
    EXPECT_THAT(text.out, HasSubstr("instruction set " + name));
    const testing::CommandRun a = Pipetrain("reference --json --isa " + name + kRun);
    const testing::CommandRun b = Pipetrain("reference --json --isa " + name + kRun);
    ASSERT_EQ(a.exit_code, 0) << a.out;
    ASSERT_EQ(Losses(a.out).size(), 3u) << a.out;
    EXPECT_EQ(Losses(a.out), Losses(b.out));
  }
  // The default is the highest level this CPU runs; --max-isa caps it.
  const std::string highest(math::IsaName(levels.back()));
  const std::string lowest(math::IsaName(levels.front()));
  EXPECT_EQ(Losses(Pipetrain("reference --json" + kRun).out),
            Losses(Pipetrain("reference --json --isa " + highest + kRun).out));
  const testing::CommandRun capped = Pipetrain("reference --max-isa " + lowest + kRun);
  ASSERT_EQ(capped.exit_code, 0) << capped.out;
  EXPECT_THAT(capped.out, HasSubstr("instruction set " + lowest));
}

TEST(IsaCliTest, BadLevelsAreRefusedBeforeAnyStep) {
  const testing::CommandRun unknown = Pipetrain("reference --isa avx9" + kRun);
  EXPECT_EQ(unknown.exit_code, 1);
  EXPECT_THAT(unknown.out, HasSubstr("--isa: unknown instruction set 'avx9'"));
  const testing::CommandRun above =
      Pipetrain("reference --isa x86-64-v4 --max-isa x86-64-v3" + kRun);
  EXPECT_EQ(above.exit_code, 1);
  EXPECT_THAT(above.out, HasSubstr("--isa x86-64-v4 is above --max-isa x86-64-v3"));
  const testing::CommandRun worker_flag = Pipetrain("train --max-isa x86-64-v3" + kRun);
  EXPECT_EQ(worker_flag.exit_code, 1) << "train has no --max-isa (its workers do)";
}

// Workers capped at the lowest level make the job run there, bitwise equal to the reference at
// that level, and the checkpoint says so.
TEST(IsaCliTest, LocalWorkersCappedByMaxIsaEqualTheReferenceAtThatLevel) {
  const std::vector<math::Isa> levels = math::SupportedIsas();
  const std::string lowest(math::IsaName(levels.front()));
  const std::string dir = ::testing::TempDir() + "/isa_cli_local";
  const testing::CommandRun ref =
      Pipetrain("reference --json --isa " + lowest + kRun + " --save " + dir + "/ref");
  ASSERT_EQ(ref.exit_code, 0) << ref.out;
  const testing::CommandRun local = Pipetrain("local --stages 2 --schedule 1f1b --json --max-isa " +
                                              lowest + kRun + " --save " + dir + "/local");
  if (local.out.find("cannot find the coordinator binary") != std::string::npos) {
    GTEST_SKIP() << "the daemons are not built";
  }
  ASSERT_EQ(local.exit_code, 0) << local.out;
  ASSERT_EQ(Losses(ref.out).size(), 3u);
  EXPECT_EQ(Losses(ref.out), Losses(local.out));
  EXPECT_EQ(Manifest(dir + "/ref")["isa"], lowest);
  EXPECT_EQ(Manifest(dir + "/local")["isa"], lowest);
  EXPECT_EQ(testing::ReadFile(dir + "/ref/layer-00000.safetensors"),
            testing::ReadFile(dir + "/local/layer-00000.safetensors"));
}

// A checkpoint loads at any level; the run says that its bits now differ from a one-level run.
TEST(IsaCliTest, ResumingAtAnotherLevelIsAllowedAndRecorded) {
  const std::vector<math::Isa> levels = math::SupportedIsas();
  if (levels.size() < 2) GTEST_SKIP() << "this CPU runs one level only";
  const std::string lowest(math::IsaName(levels.front()));
  const std::string highest(math::IsaName(levels.back()));
  const std::string dir = ::testing::TempDir() + "/isa_cli_resume";
  ASSERT_EQ(Pipetrain("reference --isa " + lowest + kRun + " --save " + dir + "/a").exit_code, 0);
  const testing::CommandRun resumed = Pipetrain("reference --isa " + highest + kRun + " --resume " +
                                                dir + "/a --save " + dir + "/b");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.out;
  EXPECT_THAT(resumed.out, HasSubstr("was written at instruction set " + lowest));
  const nlohmann::json m = Manifest(dir + "/b");
  EXPECT_EQ(m["isa"], highest);
  ASSERT_TRUE(m.contains("isa_note")) << m.dump();
  EXPECT_THAT(m["isa_note"].get<std::string>(),
              HasSubstr("Steps up to 3 ran at " + lowest + ", later ones at " + highest));
  EXPECT_FALSE(Manifest(dir + "/a").contains("isa_note"));
}

}  // namespace
}  // namespace pipetrain
