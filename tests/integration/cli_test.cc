// Runs the real `pipetrain reference` binary and checks what a user would: the loss falls, the
// digits MLP generalises, the char model beats the uniform baseline, runs repeat bit for bit,
// and bad input fails with a clear message.
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/integration/run_command.h"

namespace pipetrain {
namespace {

using ::testing::HasSubstr;

using CliRun = testing::CommandRun;  // out: stdout and stderr.

CliRun Pipetrain(const std::string& args) {
  return testing::RunCommand(std::string(PIPETRAIN_BINARY) + " " + args + " 2>&1");
}

std::string Example(const std::string& name) {
  return std::string(PIPETRAIN_SOURCE_DIR) + "/examples/" + name;
}

struct Parsed {
  std::vector<double> losses;
  nlohmann::json eval;
};

// Parses --json output whose first step is numbered `first_step`.
Parsed ParseJsonLines(const std::string& out, int first_step = 1) {
  Parsed p;
  for (absl::string_view line : absl::StrSplit(out, '\n', absl::SkipEmpty())) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    EXPECT_FALSE(j.is_discarded()) << "not JSON: " << line;
    if (j.is_discarded()) continue;
    if (j.contains("step")) {
      EXPECT_EQ(j["step"].get<int>(), static_cast<int>(p.losses.size()) + first_step);
      p.losses.push_back(j["loss"].get<double>());
    } else {
      p.eval = j;
    }
  }
  return p;
}

double Mean(const std::vector<double>& v, size_t begin, size_t end) {
  double s = 0;
  for (size_t i = begin; i < end; ++i) s += v[i];
  return s / static_cast<double>(end - begin);
}

TEST(ReferenceCliTest, DigitsMlpReachesHeldOutAccuracyAndRepeatsBitwise) {
  const std::string args = "reference --model " + Example("mlp_digits.textproto") +
                           " --data digits --steps 300 --batch 64 --microbatches 4 --seed 1 "
                           "--json --eval-samples 0";
  const CliRun a = Pipetrain(args);
  ASSERT_EQ(a.exit_code, 0) << a.out;
  const Parsed p = ParseJsonLines(a.out);
  ASSERT_EQ(p.losses.size(), 300u);
  EXPECT_LT(Mean(p.losses, 280, 300), 0.25 * Mean(p.losses, 0, 20));
  ASSERT_TRUE(p.eval.contains("eval_accuracy")) << a.out;
  EXPECT_GE(p.eval["eval_accuracy"].get<double>(), 0.95);
  // Same seed and data: the same bytes, every loss to the last bit.
  const CliRun b = Pipetrain(args);
  EXPECT_EQ(a.out, b.out);
}

TEST(ReferenceCliTest, CharGptFallsWellBelowTheUniformBaseline) {
  const CliRun r = Pipetrain("reference --model " + Example("gpt_char.textproto") +
                             " --data text --steps 150 --batch 16 --microbatches 2 --seed 3 "
                             "--optimizer adamw:lr=3e-3 --json --eval-samples 64");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const Parsed p = ParseJsonLines(r.out);
  ASSERT_EQ(p.losses.size(), 150u);
  // The first loss is close to ln(vocab) (uniform predictions); training must get far below it.
  const double uniform = p.losses.front();
  EXPECT_GT(uniform, std::log(20.0));
  EXPECT_LT(Mean(p.losses, 140, 150), 0.6 * uniform);
  EXPECT_LT(p.eval["eval_loss"].get<double>(), 0.8 * uniform);
}

TEST(ReferenceCliTest, BadInputFailsWithAClearMessage) {
  CliRun r = Pipetrain("reference --model " + Example("mlp_digits.textproto") +
                       " --batch 10 --microbatches 3");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.out, HasSubstr("--batch 10 is not divisible by --microbatches 3"));
  r = Pipetrain("reference --model /nonexistent.textproto");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.out, HasSubstr("/nonexistent.textproto"));
  r = Pipetrain("reference --model " + Example("gpt_char.textproto") + " --data digits");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.out, HasSubstr("[INVALID_ARGUMENT]"));
  r = Pipetrain("reference --model " + Example("mlp_digits.textproto") + " --optimizer sgd:lr=-1");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.out, HasSubstr("lr = -1"));
  r = Pipetrain("reference --model " + Example("mlp_digits.textproto") + " --stages 4");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.out, HasSubstr("--stages not used by `pipetrain reference`"));
  r = Pipetrain("frobnicate");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.out, HasSubstr("unknown command 'frobnicate'"));
}

std::string ReadAll(const std::string& path) {
  FILE* f = fopen(path.c_str(), "rb");
  std::string out;
  if (f == nullptr) return out;
  char buf[65536];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
  fclose(f);
  return out;
}

TEST(ReferenceCliTest, ResumeContinuesBitwise) {
  const std::string dir = ::testing::TempDir() + "/cli_resume";
  const std::string common = "reference --model " + Example("gpt_char.textproto") +
                             " --data text --batch 4 --microbatches 2 --seed 5 --json "
                             "--eval-samples 4 --optimizer adamw:lr=1e-2,clip_norm=0.5";
  const CliRun straight = Pipetrain(common + " --steps 6 --save " + dir + "/straight");
  ASSERT_EQ(straight.exit_code, 0) << straight.out;
  const CliRun first = Pipetrain(common + " --steps 3 --save " + dir + "/half");
  ASSERT_EQ(first.exit_code, 0) << first.out;
  const CliRun second =
      Pipetrain(common + " --steps 3 --resume " + dir + "/half --save " + dir + "/resumed");
  ASSERT_EQ(second.exit_code, 0) << second.out;
  const Parsed a = ParseJsonLines(straight.out);
  const Parsed b = ParseJsonLines(first.out);
  const Parsed c = ParseJsonLines(second.out, /*first_step=*/4);
  ASSERT_EQ(a.losses.size(), 6u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(a.losses[i], b.losses[i]);
    EXPECT_EQ(a.losses[3 + i], c.losses[i]);
  }
  for (const char* f : {"layer-00000.safetensors", "layer-00001.safetensors",
                        "layer-00004.safetensors", "manifest.json"}) {
    const std::string x = ReadAll(dir + "/straight/" + f);
    EXPECT_FALSE(x.empty()) << f;
    EXPECT_EQ(x, ReadAll(dir + "/resumed/" + f)) << f;
  }
  // A different seed is refused.
  const CliRun wrong = Pipetrain("reference --model " + Example("gpt_char.textproto") +
                                 " --data text --batch 4 --microbatches 2 --seed 6 --steps 1 "
                                 "--resume " +
                                 dir + "/half");
  EXPECT_EQ(wrong.exit_code, 1);
  EXPECT_THAT(wrong.out, HasSubstr("FAILED_PRECONDITION"));
}

TEST(EvaluateCliTest, ReproducesTheReferencesFinalEvaluation) {
  const std::string dir = ::testing::TempDir() + "/cli_evaluate";
  const CliRun trained = Pipetrain("reference --model " + Example("mlp_digits.textproto") +
                                   " --data digits --steps 40 --batch 32 --microbatches 2 --seed 4"
                                   " --json --eval-samples 0 --save " +
                                   dir);
  ASSERT_EQ(trained.exit_code, 0) << trained.out;
  const Parsed p = ParseJsonLines(trained.out);
  const CliRun eval = Pipetrain("evaluate --checkpoint " + dir + " --json --eval-samples 0");
  ASSERT_EQ(eval.exit_code, 0) << eval.out;
  const auto j = nlohmann::json::parse(eval.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << eval.out;
  // The same model state on the same held-out data: the same numbers to the last digit.
  EXPECT_EQ(j["eval_loss"], p.eval["eval_loss"]);
  EXPECT_EQ(j["eval_accuracy"], p.eval["eval_accuracy"]);
  const CliRun missing = Pipetrain("evaluate --checkpoint " + dir + "/nope");
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_THAT(missing.out, HasSubstr("[NOT_FOUND]"));
  const CliRun none = Pipetrain("evaluate");
  EXPECT_EQ(none.exit_code, 1);
  EXPECT_THAT(none.out, HasSubstr("--checkpoint is required"));
}

TEST(ScheduleCliTest, JsonCarriesThePlanAndTheSimulation) {
  const CliRun r = Pipetrain("schedule --kind zb-h1 --stages 4 --microbatches 8 --format json");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.out;
  EXPECT_EQ(j["kind"], "zb-h1");
  EXPECT_EQ(j["stages"], 4);
  EXPECT_EQ(j["microbatches"], 8);
  EXPECT_EQ(j["virtual"], 1);
  ASSERT_EQ(j["placement"].size(), 4u);
  ASSERT_EQ(j["actions"].size(), 4u);
  // Every worker runs F, I and W once per micro-batch: 3 * 8 actions.
  for (const auto& worker : j["actions"]) EXPECT_EQ(worker.size(), 24u);
  ASSERT_EQ(j["simulation"]["per_worker"].size(), 4u);
  EXPECT_GT(j["simulation"]["makespan"].get<double>(), 0.0);
}

TEST(ScheduleCliTest, InvalidRequestsExitNonZeroWithTheRule) {
  CliRun r = Pipetrain("schedule --kind interleaved --stages 4 --microbatches 3 --format ascii");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.out, HasSubstr("microbatches"));
  r = Pipetrain("schedule --kind 2f2b --stages 4 --microbatches 8");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.out, HasSubstr("2f2b"));
  r = Pipetrain("schedule --kind 1f1b --microbatches 8");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.out, HasSubstr("--stages"));
  r = Pipetrain("schedule --kind 1f1b --stages 2 --microbatches 4 --steps 3");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.out, HasSubstr("--steps not used by `pipetrain schedule`"));
}

TEST(PartitionCliTest, ModelFileIsCutByFlops) {
  const CliRun r =
      Pipetrain("partition --model " + Example("deep_mlp.textproto") + " --stages 4 --format json");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.out;
  EXPECT_NE(r.out.find("imbalance"), std::string::npos);
  // Costs from a model whose vocabulary comes from the data set.
  const CliRun g =
      Pipetrain("partition --model " + Example("gpt_char.textproto") + " --data text --stages 2");
  ASSERT_EQ(g.exit_code, 0) << g.out;
  const CliRun bad = Pipetrain("partition --costs 1,2,3 --stages 4");
  EXPECT_NE(bad.exit_code, 0);
}

}  // namespace
}  // namespace pipetrain
