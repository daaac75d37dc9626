// `pipetrain generate` and `pipetrain predict` as a user runs them, on checkpoints that
// `pipetrain reference --save` wrote (docs/inference.md).
#include <cmath>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/model/checkpoint.h"
#include "common/model/generator.h"
#include "common/model/model.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/integration/run_command.h"

namespace pipetrain {
namespace {

using testing::Example;
using ::testing::HasSubstr;
using ::testing::StartsWith;

testing::CommandRun Pipetrain(const std::string& args, bool with_stderr = true) {
  return testing::RunCommand(std::string(PIPETRAIN_BINARY) + " " + args +
                             (with_stderr ? " 2>&1" : " 2>/dev/null"));
}

void ExpectRefused(const std::string& args, const std::string& message) {
  const testing::CommandRun r = Pipetrain(args);
  EXPECT_EQ(r.exit_code, 1) << args << "\n" << r.out;
  EXPECT_THAT(r.out, HasSubstr(message)) << args;
}

// A checkpoint of the character GPT after a short run on the bundled text (once per process).
const std::string& GptCheckpoint() {
  static const std::string* const dir = [] {
    auto* d = new std::string(testing::TempDir("inference_gpt_"));
    const testing::CommandRun r = Pipetrain(
        "reference --model " + Example("gpt_char.textproto") +
        " --data text --steps 30 --batch 8 --seed 3 --json --eval-samples 8 --save " + *d);
    EXPECT_EQ(r.exit_code, 0) << r.out;
    return d;
  }();
  return *dir;
}

// A checkpoint of the digits MLP (once per process).
const std::string& DigitsCheckpoint() {
  static const std::string* const dir = [] {
    auto* d = new std::string(testing::TempDir("inference_digits_"));
    const testing::CommandRun r =
        Pipetrain("reference --model " + Example("mlp_digits.textproto") +
                  " --data digits --steps 40 --batch 32 --seed 4 --json --save " + *d);
    EXPECT_EQ(r.exit_code, 0) << r.out;
    return d;
  }();
  return *dir;
}

TEST(GenerateCliTest, ContinuesThePromptDeterministicallyForASeed) {
  const std::string base =
      "generate --resume " + GptCheckpoint() + " --prompt 'The ' --max-tokens 60";
  const testing::CommandRun a = Pipetrain(base + " --seed 5", /*with_stderr=*/false);
  ASSERT_EQ(a.exit_code, 0) << a.out;
  EXPECT_THAT(a.out, StartsWith("The "));
  EXPECT_EQ(a.out.size(), 4u + 60u + 1u);  // the prompt, 60 bytes, a newline.
  EXPECT_EQ(a.out.back(), '\n');
  EXPECT_EQ(Pipetrain(base + " --seed 5", false).out, a.out);
  EXPECT_NE(Pipetrain(base + " --seed 6", false).out, a.out);
  // --checkpoint is --resume's other name.
  EXPECT_EQ(Pipetrain("generate --checkpoint " + GptCheckpoint() +
                          " --prompt 'The ' --max-tokens 60 --seed 5",
                      false)
                .out,
            a.out);
  // Greedy is the same for every seed, and top-k 1 is greedy.
  const testing::CommandRun greedy = Pipetrain(base + " --temperature 0 --seed 1", false);
  ASSERT_EQ(greedy.exit_code, 0) << greedy.out;
  EXPECT_EQ(Pipetrain(base + " --temperature 0 --seed 2", false).out, greedy.out);
  EXPECT_EQ(Pipetrain(base + " --top-k 1 --seed 3", false).out, greedy.out);
  // Beyond the model's context (32): the window slides.
  const testing::CommandRun longer = Pipetrain(
      "generate --resume " + GptCheckpoint() + " --prompt 'of the' --max-tokens 300 --top-k 5",
      false);
  ASSERT_EQ(longer.exit_code, 0);
  EXPECT_EQ(longer.out.size(), 6u + 300u + 1u);
}

// The LLaMA example (rotary positions, grouped-query heads, RMSNorm) decodes through its KV
// cache too: a short run's checkpoint continues a prompt, the same bytes for the same seed,
// past its context of 32 (the window slides and is rotated again from position 0).
TEST(GenerateCliTest, LlamaCheckpointContinuesDeterministically) {
  const std::string dir = testing::TempDir("inference_llama_");
  const testing::CommandRun train =
      Pipetrain("reference --model " + Example("llama_char.textproto") +
                " --data text --steps 10 --batch 8 --seed 3 --json --eval-samples 8 --save " + dir);
  ASSERT_EQ(train.exit_code, 0) << train.out;
  const std::string base = "generate --resume " + dir + " --prompt 'The ' --max-tokens 80";
  const testing::CommandRun a = Pipetrain(base + " --seed 5", /*with_stderr=*/false);
  ASSERT_EQ(a.exit_code, 0) << a.out;
  EXPECT_THAT(a.out, StartsWith("The "));
  EXPECT_EQ(a.out.size(), 4u + 80u + 1u);  // the prompt, 80 bytes, a newline.
  EXPECT_EQ(Pipetrain(base + " --seed 5", false).out, a.out);
  EXPECT_NE(Pipetrain(base + " --seed 6", false).out, a.out);
  const testing::CommandRun greedy = Pipetrain(base + " --temperature 0", false);
  ASSERT_EQ(greedy.exit_code, 0) << greedy.out;
  EXPECT_EQ(Pipetrain(base + " --top-k 1 --seed 9", false).out, greedy.out);
}

TEST(GenerateCliTest, RefusesWhatItCannotDo) {
  const std::string ckpt = " --resume " + GptCheckpoint();
  ExpectRefused("generate" + ckpt + " --prompt 'caf\xc3\xa9'",
                "--prompt: byte 0xc3 at offset 3 is not in the model's vocabulary");
  ExpectRefused("generate" + ckpt + " --prompt ''", "--prompt TEXT is required");
  ExpectRefused("generate" + ckpt + " --prompt a --temperature -1",
                "--temperature must be a finite number >= 0");
  ExpectRefused("generate" + ckpt + " --prompt a --top-k -2", "--top-k must be >= 0");
  ExpectRefused("generate" + ckpt + " --prompt a --max-tokens 0", "--max-tokens must be in [1, ");
  ExpectRefused("generate --prompt a", "--resume DIR is required");
  ExpectRefused("generate --resume " + DigitsCheckpoint() + " --prompt a",
                "generation needs a language model");
  ExpectRefused("generate" + ckpt + " --checkpoint " + GptCheckpoint() + " --prompt a",
                "--checkpoint is the former name of --resume");
  ExpectRefused("generate" + ckpt + " --prompt a --out x",
                "--out not used by `pipetrain generate`");
}

struct PredictCsv {
  std::vector<std::string> header;
  int64_t rows = 0;
  int64_t correct = 0;
};

PredictCsv ParsePredictions(const std::string& csv) {
  PredictCsv p;
  for (absl::string_view line : absl::StrSplit(csv, '\n', absl::SkipEmpty())) {
    std::vector<std::string> cells = absl::StrSplit(line, ',');
    if (p.header.empty()) {
      p.header = cells;
      continue;
    }
    EXPECT_EQ(cells.size(), p.header.size()) << line;
    if (cells.size() != p.header.size()) continue;
    int64_t row = 0, target = 0, cls = 0;
    EXPECT_TRUE(absl::SimpleAtoi(cells[0], &row) && absl::SimpleAtoi(cells[1], &target) &&
                absl::SimpleAtoi(cells[2], &cls))
        << line;
    EXPECT_EQ(row, p.rows);
    double sum = 0, best = -1;
    for (size_t j = 3; j < cells.size(); ++j) {
      double v = 0;
      EXPECT_TRUE(absl::SimpleAtod(cells[j], &v)) << line;
      sum += v;
      best = std::max(best, v);
    }
    EXPECT_NEAR(sum, 1.0, 1e-6) << line;
    double pc = 0;
    EXPECT_TRUE(absl::SimpleAtod(cells[3 + cls], &pc));
    EXPECT_EQ(pc, best) << line;  // the class is the most probable one.
    p.correct += cls == target;
    ++p.rows;
  }
  return p;
}

TEST(PredictCliTest, ClassifierOutputsMatchEvaluate) {
  const testing::CommandRun eval =
      Pipetrain("evaluate --resume " + DigitsCheckpoint() + " --json --eval-samples 0", false);
  ASSERT_EQ(eval.exit_code, 0) << eval.out;
  const auto j = nlohmann::json::parse(eval.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << eval.out;

  const testing::CommandRun pred = Pipetrain("predict --resume " + DigitsCheckpoint(), false);
  ASSERT_EQ(pred.exit_code, 0) << pred.out;
  const PredictCsv p = ParsePredictions(pred.out);
  ASSERT_EQ(p.header.size(), 13u);
  EXPECT_EQ(p.header[0], "row");
  EXPECT_EQ(p.header[1], "target");
  EXPECT_EQ(p.header[2], "class");
  EXPECT_EQ(p.header[3], "p_0");
  EXPECT_EQ(p.header[12], "p_9");
  ASSERT_GT(p.rows, 100);
  EXPECT_NEAR(static_cast<double>(p.correct) / p.rows, j["eval_accuracy"].get<double>(), 1e-8);

  // --out FILE: the same CSV in the file, a summary on stdout; --eval-samples limits the rows.
  const std::string file = testing::TempDir("inference_predict_") + "/p.csv";
  const testing::CommandRun to_file =
      Pipetrain("predict --checkpoint " + DigitsCheckpoint() + " --out " + file);
  ASSERT_EQ(to_file.exit_code, 0) << to_file.out;
  EXPECT_EQ(testing::ReadFile(file), pred.out);
  EXPECT_THAT(to_file.out, HasSubstr(std::to_string(p.rows) + " rows of"));
  EXPECT_THAT(to_file.out, HasSubstr("accuracy"));
  const testing::CommandRun ten =
      Pipetrain("predict --resume " + DigitsCheckpoint() + " --eval-samples 10 --out -", false);
  ASSERT_EQ(ten.exit_code, 0);
  EXPECT_EQ(ParsePredictions(ten.out).rows, 10);
  ExpectRefused("predict --resume " + DigitsCheckpoint() + " --out /nonexistent-dir/p.csv",
                "/nonexistent-dir/p.csv");
  ExpectRefused("predict", "--resume DIR is required");
}

void WriteText(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::trunc) << text;
}

// The model's own forward pass on `x`: every layer's Forward, at the model's instruction-set
// level with one compute thread (what predict runs).
math::Matrix ModelForward(const model::Model& net, const model::ModelParams& params,
                          math::Matrix x) {
  net.kernels().ConfigureEigen(1);
  for (int64_t l = 0; l < net.num_layers(); ++l) {
    math::Matrix y(x.rows(), net.layer(l).out_features());
    math::Stash stash;
    net.layer(l).Forward(params[l], math::AsConstMap(x), math::AsMap(y), &stash);
    x = std::move(y);
  }
  return x;
}

// A regressor (an mse model of two outputs) on CSV regression data: predict writes, for each
// held-out row (rows 4, 9, 14, ... of the file; docs/data.md), the row's two targets and the
// model's two outputs, which are the checkpoint's weights run through the layers' Forward -- the
// same floats (9 significant digits read back exactly).
TEST(PredictCliTest, RegressorOutputsAreTheModelsForward) {
  const std::string dir = testing::TempDir("inference_regressor_");
  // Features and targets are multiples of 1/8: exact in decimal and in float.
  auto feature = [](int r, int j) { return static_cast<float>((r * (3 + j) + j) % 17) / 8 - 1; };
  auto target = [&](int r, int k) {
    return k == 0 ? feature(r, 0) - feature(r, 1) / 2 : feature(r, 2) * 2 + 0.125f;
  };
  std::string csv = "x1,x2,x3,y1,y2\n";
  for (int r = 0; r < 100; ++r) {
    absl::StrAppend(&csv, feature(r, 0), ",", feature(r, 1), ",", feature(r, 2), ",", target(r, 0),
                    ",", target(r, 1), "\n");
  }
  WriteText(dir + "/regression.csv", csv);
  WriteText(dir + "/mse.textproto",
            "layers { linear { out_features: 8 } }\nlayers { relu {} }\n"
            "layers { linear { out_features: 2 } }\nloss { mse {} }\n");
  const testing::CommandRun train =
      Pipetrain("reference --model " + dir + "/mse.textproto --data csv:" + dir +
                "/regression.csv --steps 30 --batch 20 --seed 2 --json --optimizer "
                "adamw:lr=1e-2 --save " +
                dir + "/ckpt");
  ASSERT_EQ(train.exit_code, 0) << train.out;
  const testing::CommandRun pred = Pipetrain("predict --resume " + dir + "/ckpt", false);
  ASSERT_EQ(pred.exit_code, 0) << pred.out;

  absl::StatusOr<model::LoadedCheckpoint> ckpt = model::LoadCheckpoint(dir + "/ckpt");
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  absl::StatusOr<std::unique_ptr<model::Model>> net =
      model::Model::Build(ckpt->manifest.model_spec);
  ASSERT_TRUE(net.ok()) << net.status();
  absl::StatusOr<model::ModelParams> params = model::TakeModelParams(**net, &ckpt->tensors);
  ASSERT_TRUE(params.ok()) << params.status();
  math::Matrix x(20, 3);
  for (int i = 0; i < 20; ++i) {
    for (int j = 0; j < 3; ++j) x(i, j) = feature(5 * i + 4, j);
  }
  const math::Matrix y = ModelForward(**net, *params, x);

  const std::vector<std::string> lines = absl::StrSplit(pred.out, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 21u) << pred.out;  // the header and the 20 held-out rows
  EXPECT_EQ(lines[0], "row,target_0,target_1,value_0,value_1");
  double spread = 0;
  for (int i = 0; i < 20; ++i) {
    SCOPED_TRACE(lines[i + 1]);
    const std::vector<std::string> cells = absl::StrSplit(lines[i + 1], ',');
    ASSERT_EQ(cells.size(), 5u);
    EXPECT_EQ(cells[0], std::to_string(i));
    double v[4];
    for (int c = 0; c < 4; ++c) ASSERT_TRUE(absl::SimpleAtod(cells[c + 1], &v[c]));
    EXPECT_EQ(static_cast<float>(v[0]), target(5 * i + 4, 0));
    EXPECT_EQ(static_cast<float>(v[1]), target(5 * i + 4, 1));
    EXPECT_EQ(static_cast<float>(v[2]), y(i, 0));
    EXPECT_EQ(static_cast<float>(v[3]), y(i, 1));
    spread += std::abs(v[2] - y(0, 0));
  }
  EXPECT_GT(spread, 0.1);  // the outputs depend on the row
}

}  // namespace
}  // namespace pipetrain
