// The data formats users bring (docs/data.md), through the real `pipetrain` binary: an npy:
// classification set (and `local --stages 2` on it bitwise equal to `reference`), a CSV of
// regression targets for an mse model, a nanoGPT token corpus for examples/gpt_char.textproto,
// and --data's default and mismatch messages.
#include <cmath>
#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/common/io/npy_test_util.h"
#include "tests/integration/run_command.h"

namespace pipetrain {
namespace {

using ::pipetrain::testing::Bytes;
using ::pipetrain::testing::Example;
using ::pipetrain::testing::Npy;
using ::pipetrain::testing::WriteBytes;
using ::testing::HasSubstr;

testing::CommandRun Pipetrain(const std::string& args) {
  return testing::RunCommand(std::string(PIPETRAIN_BINARY) + " " + args + " 2>&1");
}

struct Losses {
  std::vector<double> losses;
  nlohmann::json eval;
};

// The --json lines of `out`: the step losses and the final evaluation.
Losses Parse(const std::string& out) {
  Losses r;
  for (absl::string_view line : absl::StrSplit(out, '\n', absl::SkipEmpty())) {
    const auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded()) continue;
    if (j.contains("step")) {
      r.losses.push_back(j["loss"].get<double>());
    } else if (j.contains("eval_loss")) {
      r.eval = j;
    }
  }
  return r;
}

double Mean(const std::vector<double>& v, size_t begin, size_t end) {
  double s = 0;
  for (size_t i = begin; i < end; ++i) s += v[i];
  return s / static_cast<double>(end - begin);
}

std::string WriteText(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::trunc) << text;
  return path;
}

// A deterministic value in [-1, 1) for (row, column).
float Feature(int row, int column) {
  return static_cast<float>(((row * 37 + column * 11) % 64) - 32) / 32.0f;
}

// 240 rows of 8 features in dir/x.npy, labelled 0..2 by the sign pattern of two sums (y.npy).
std::string WriteNpyClasses(const std::string& dir) {
  std::vector<float> x;
  std::vector<int64_t> y;
  for (int r = 0; r < 240; ++r) {
    float a = 0, b = 0;
    for (int c = 0; c < 8; ++c) {
      x.push_back(Feature(r, c));
      (c < 4 ? a : b) += Feature(r, c);
    }
    y.push_back(a > 0 ? 0 : (b > 0 ? 1 : 2));
  }
  WriteBytes(dir + "/x.npy", Npy("<f4", "(240, 8)", Bytes(x)));
  WriteBytes(dir + "/y.npy", Npy("<i8", "(240,)", Bytes(y)));
  return WriteText(dir + "/mlp.textproto",
                   "input_features: 8\n"
                   "layers { linear { out_features: 32 } }\nlayers { relu {} }\n"
                   "layers { linear { out_features: 3 } }\n"
                   "loss { softmax_cross_entropy {} }\n");
}

TEST(DataFormatsCliTest, NpyClassificationTrainsAndLocalEqualsReferenceBitwise) {
  const std::string dir = testing::TempDir("cli_npy_");
  const std::string model = WriteNpyClasses(dir);
  const std::string common = " --model " + model + " --data npy:" + dir +
                             " --steps 30 --batch 16 --microbatches 4 --seed 5 --json "
                             "--optimizer adamw:lr=1e-2 --eval-samples 0 --save ";
  const testing::CommandRun ref = Pipetrain("reference" + common + dir + "/ref");
  ASSERT_EQ(ref.exit_code, 0) << ref.out;
  const Losses a = Parse(ref.out);
  ASSERT_EQ(a.losses.size(), 30u) << ref.out;
  EXPECT_LT(Mean(a.losses, 25, 30), 0.7 * Mean(a.losses, 0, 5)) << ref.out;
  ASSERT_TRUE(a.eval.contains("eval_accuracy")) << ref.out;
  // 48 held-out rows (every 5th of 240): the accuracy is a multiple of 1/48.
  const double correct = a.eval["eval_accuracy"].get<double>() * 48;
  EXPECT_NEAR(correct, std::round(correct), 1e-6);

  const testing::CommandRun local =
      Pipetrain("local --stages 2 --schedule 1f1b" + common + dir + "/local");
  if (local.out.find("cannot find the coordinator binary") != std::string::npos) {
    GTEST_SKIP() << "the daemons are not built";
  }
  ASSERT_EQ(local.exit_code, 0) << local.out;
  const Losses b = Parse(local.out);
  // Losses are printed with 9 significant digits: equal doubles mean equal floats.
  EXPECT_EQ(a.losses, b.losses);
  EXPECT_EQ(a.eval, b.eval);
  // The checkpoints name the data set, and their weights are the same bits.
  for (const char* f : {"manifest.json", "layer-00000.safetensors", "layer-00002.safetensors"}) {
    const std::string x = testing::ReadFile(dir + "/ref/" + f);
    EXPECT_FALSE(x.empty()) << f;
    EXPECT_TRUE(x == testing::ReadFile(dir + "/local/" + f)) << f << " differs";
  }
  EXPECT_THAT(testing::ReadFile(dir + "/ref/manifest.json"), HasSubstr("npy:" + dir));
}

// A CSV with two regression targets for a model whose loss is mse: the last two columns are
// the targets (the model's output width), and the loss falls.
TEST(DataFormatsCliTest, CsvRegressionTargetsForAnMseModel) {
  const std::string dir = testing::TempDir("cli_csv_regression_");
  std::string csv = "x1,x2,x3,y1,y2\n";
  for (int r = 0; r < 200; ++r) {
    const float x1 = Feature(r, 0), x2 = Feature(r, 1), x3 = Feature(r, 2);
    absl::StrAppend(&csv, x1, ",", x2, ",", x3, ",", 0.5f * x1 - x2 + 0.25f, ",",
                    x3 * 2.0f - 0.125f, "\n");
  }
  const std::string data = WriteText(dir + "/regression.csv", csv);
  const std::string model = WriteText(dir + "/mse.textproto",
                                      "layers { linear { out_features: 16 } }\n"
                                      "layers { relu {} }\n"
                                      "layers { linear { out_features: 2 } }\n"
                                      "loss { mse {} }\n");
  const testing::CommandRun r =
      Pipetrain("reference --model " + model + " --data csv:" + data +
                " --steps 40 --batch 20 --seed 2 --json --optimizer adamw:lr=1e-2");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const Losses p = Parse(r.out);
  ASSERT_EQ(p.losses.size(), 40u) << r.out;
  EXPECT_LT(Mean(p.losses, 35, 40), 0.3 * Mean(p.losses, 0, 5)) << r.out;
  // Such targets with a class-label loss: the fraction says which loss to use.
  const std::string classes = WriteText(dir + "/ce.textproto",
                                        "layers { linear { out_features: 3 } }\n"
                                        "loss { softmax_cross_entropy {} }\n");
  const std::string fractions = WriteText(dir + "/fractions.csv", "1,2,0\n3,4,0.5\n");
  const testing::CommandRun wrong =
      Pipetrain("reference --model " + classes + " --data csv:" + fractions);
  EXPECT_EQ(wrong.exit_code, 1);
  EXPECT_THAT(wrong.out, HasSubstr("fractions.csv:2:3: class label '0.5' is not an integer (for "
                                   "regression targets, train a model whose loss is mse)"));
  // An mse model and no --data: nothing bundled fits; the message says what to pass.
  const testing::CommandRun none = Pipetrain("reference --model " + model);
  EXPECT_EQ(none.exit_code, 1);
  EXPECT_THAT(none.out, HasSubstr("no --data given, and the model fits no bundled data set"));
  EXPECT_THAT(none.out, HasSubstr("pass --data csv:PATH, npy:FEATURES.npy,TARGETS.npy"));
}

// A nanoGPT corpus (uint16 ids, train.bin and val.bin) for the char GPT: its vocabulary comes
// from the ids, it learns the corpus's pattern, and an id beyond the model's vocabulary is named
// with its offset.
TEST(DataFormatsCliTest, TokenCorpusForTheCharGpt) {
  const std::string dir = testing::TempDir("cli_tokens_");
  std::vector<uint16_t> train, val;
  for (int i = 0; i < 3000; ++i) train.push_back(static_cast<uint16_t>((i * 7 + i / 5) % 23));
  for (int i = 0; i < 300; ++i) val.push_back(static_cast<uint16_t>((i * 7 + i / 5) % 23));
  WriteBytes(dir + "/train.bin", Bytes(train));
  WriteBytes(dir + "/val.bin", Bytes(val));
  const testing::CommandRun r =
      Pipetrain("reference --model " + Example("gpt_char.textproto") + " --data tokens:" + dir +
                " --steps 40 --batch 8 --seed 1 --json --optimizer adamw:lr=3e-3 "
                "--eval-samples 16");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const Losses p = Parse(r.out);
  ASSERT_EQ(p.losses.size(), 40u) << r.out;
  EXPECT_GT(p.losses.front(), std::log(15.0));  // about ln(23): uniform over the vocabulary
  EXPECT_LT(Mean(p.losses, 35, 40), 0.7 * p.losses.front()) << r.out;
  // A model whose vocabulary is smaller than the ids.
  const std::string small =
      WriteText(dir + "/small.textproto",
                "input_features: 1\nlayers { embedding { vocab_size: 20 dim: 16 context: 8 } }\n"
                "layers { linear { out_features: 20 } }\nloss { softmax_cross_entropy {} }\n");
  const testing::CommandRun bad = Pipetrain("reference --model " + small + " --data tokens:" + dir);
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_THAT(bad.out, HasSubstr(dir + "/train.bin: token id 21 at token 3 (byte 6) is not below "
                                       "the model's vocabulary of 20"));
}

// Without --data, an embedding model trains on the bundled text (it used to get digits and fail
// "model input_features 1 != data set's 64"); data of the wrong kind says which --data to pass.
TEST(DataFormatsCliTest, DataDefaultsToWhatTheModelImpliesAndMismatchesSayWhatToPass) {
  const testing::CommandRun gpt = Pipetrain("reference --model " + Example("gpt_char.textproto") +
                                            " --steps 1 --batch 2 --json --eval-samples 2");
  EXPECT_EQ(gpt.exit_code, 0) << gpt.out;
  const testing::CommandRun mlp = Pipetrain("reference --model " + Example("mlp_digits.textproto") +
                                            " --steps 1 --batch 2 --json --eval-samples 2");
  EXPECT_EQ(mlp.exit_code, 0) << mlp.out;
  // Issue 33's example: `local` with the char GPT and no --data.
  const testing::CommandRun local = Pipetrain(
      "local --stages 2 --model " + Example("gpt_char.textproto") + " --steps 1 --batch 2 --json");
  if (local.out.find("cannot find the coordinator binary") == std::string::npos) {
    EXPECT_EQ(local.exit_code, 0) << local.out;
    EXPECT_THAT(local.out, HasSubstr("{\"step\": 1, \"loss\": "));
  }
  testing::CommandRun r =
      Pipetrain("reference --model " + Example("gpt_char.textproto") + " --data digits");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.out, HasSubstr("data set 'digits' holds rows of features, but the model starts "
                               "with an embedding layer, which takes token ids: pass --data "
                               "text, text:PATH or tokens:PATH"));
  r = Pipetrain("local --stages 2 --model " + Example("mlp_digits.textproto") + " --data text");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.out, HasSubstr("data set 'text' holds token ids, for a model that starts with an "
                               "embedding layer; this model does not: pass --data digits, "
                               "csv:PATH"));
  const std::string dir = testing::TempDir("cli_data_default_");
  const std::string wide = WriteText(dir + "/wide.textproto",
                                     "input_features: 32\nlayers { linear { out_features: 10 } }\n"
                                     "loss { softmax_cross_entropy {} }\n");
  r = Pipetrain("reference --model " + wide + " --data digits");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.out, HasSubstr("model input_features 32 != data set's 64 (digits): set the "
                               "model's input_features to 64 (or to 0 to take the data set's), "
                               "or pass a data set with 32 features per row"));
  r = Pipetrain("reference --model " + wide);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.out, HasSubstr("because it takes 32 input features, not 64"));
  // The help says what the default is.
  r = Pipetrain("reference --help");
  EXPECT_THAT(r.out, HasSubstr("what --model implies"));
}

}  // namespace
}  // namespace pipetrain
