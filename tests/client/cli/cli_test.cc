// Runs the real `pipetrain` binary and checks what a user would: the loss falls, the digits MLP
// generalises, the char model beats the uniform baseline, runs repeat bit for bit, checkpoints
// are written when asked (and `local`'s equal the reference's), each command takes its own flags,
// and bad input fails with a clear message before any training.
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/integration/run_command.h"

namespace pipetrain {
namespace {

using testing::Example;

using ::testing::HasSubstr;
using ::testing::Not;

using CliRun = testing::CommandRun;  // out: stdout and stderr.

CliRun Pipetrain(const std::string& args) {
  return testing::RunCommand(std::string(PIPETRAIN_BINARY) + " " + args + " 2>&1");
}

// Runs `pipetrain ARGS` and expects it to fail (exit code 1) saying `message`.
void ExpectRefused(const std::string& args, const std::string& message) {
  const CliRun r = Pipetrain(args);
  EXPECT_EQ(r.exit_code, 1) << args << "\n" << r.out;
  EXPECT_THAT(r.out, HasSubstr(message)) << args;
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

// `export` and `import` (docs/checkpoints.md, "Export and import"): the round trip through the
// CLI is byte for byte (tests/common/model/test_hf_export.py also compares the logits); what cannot
// be exported, and a missing flag or argument, is an error naming it.
TEST(ExportCliTest, ExportsAGptAndRefusesWhatHasNoHuggingFaceEquivalent) {
  const std::string dir = ::testing::TempDir() + "/cli_export";
  std::filesystem::remove_all(dir);
  CliRun r = Pipetrain("reference --model " + Example("gpt_char.textproto") +
                       " --data text --batch 4 --microbatches 2 --steps 2 --save " + dir + "/gpt");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  r = Pipetrain("export --format hf --resume " + dir + "/gpt " + dir + "/hf");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("as gpt2 (vocab_size "));
  EXPECT_THAT(r.out, HasSubstr("n_layer 2, n_head 4, n_inner 256)"));
  EXPECT_THAT(r.out, HasSubstr("  vocab.json\n"));
  r = Pipetrain("import --format hf " + dir + "/hf --save " + dir + "/back");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("with its pipetrain sidecar"));
  for (const char* f : {"manifest.json", "layer-00000.safetensors", "layer-00002.safetensors",
                        "layer-00004.safetensors"}) {
    EXPECT_EQ(ReadAll(dir + "/gpt/" + f), ReadAll(dir + "/back/" + f)) << f;
  }

  r = Pipetrain("reference --model " + Example("mlp_digits.textproto") + " --steps 1 --save " +
                dir + "/mlp");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const std::vector<std::pair<std::string, std::string>> refused = {
      {"export --format hf --resume " + dir + "/mlp " + dir + "/x",
       "model 'mlp_digits' has no Hugging Face equivalent pipetrain exports: gpt2: layer 0 "
       "(linear): GPT-2 starts with an embedding"},
      {"export --resume " + dir + "/gpt " + dir + "/x", "--format hf is required"},
      {"export --format onnx --resume " + dir + "/gpt " + dir + "/x",
       "--format 'onnx' is not one pipetrain exports (hf)"},
      {"export --format hf " + dir + "/x", "--resume DIR is required"},
      {"export --format hf --resume " + dir + "/gpt",
       "the directory to write is required: pipetrain export --format hf --resume CHECKPOINT DIR"},
      {"import --format hf " + dir + "/hf", "--save DIR is required"},
      {"import --format hf --save " + dir + "/y", "the directory to read is required"},
      {"import --format hf " + dir + "/gpt --save " + dir + "/y", "config.json"},
  };
  for (const auto& [args, message] : refused) {
    r = Pipetrain(args);
    EXPECT_EQ(r.exit_code, 1) << args;
    EXPECT_THAT(r.out, HasSubstr(message)) << args;
  }
  EXPECT_FALSE(std::filesystem::exists(dir + "/x"));
  EXPECT_FALSE(std::filesystem::exists(dir + "/y"));
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
  EXPECT_THAT(none.out, HasSubstr("--resume DIR is required"));
}

// The "step" of the checkpoint manifest in `dir` (-1 if there is none).
int ManifestStep(const std::string& dir) {
  const auto j = nlohmann::json::parse(ReadAll(dir + "/manifest.json"), nullptr, false);
  return j.is_discarded() || !j.contains("step") ? -1 : j["step"].get<int>();
}

// The "checkpoint of step N written to" lines of a text-mode run: the N in order.
std::vector<int> CheckpointLines(const std::string& out) {
  std::vector<int> steps;
  for (absl::string_view line : absl::StrSplit(out, '\n', absl::SkipEmpty())) {
    if (!absl::ConsumePrefix(&line, "checkpoint of step ")) continue;
    int step = -1;
    EXPECT_TRUE(absl::SimpleAtoi(line.substr(0, line.find(' ')), &step)) << line;
    steps.push_back(step);
  }
  return steps;
}

// --checkpoint-every and --keep-checkpoints are training options of reference, train and local
// (validated by each: a bad value names the flag); train and local also take --eval-samples (it
// evaluates the final checkpoint, so it needs --save) and --resume (distributed_test); the other
// commands refuse all of them.
TEST(TrainingOptionsCliTest, EachCommandTakesItsTrainingFlags) {
  const std::string model = " --model " + Example("mlp_digits.textproto");
  for (const std::string command : {"reference", "train", "local"}) {
    SCOPED_TRACE(command);
    ExpectRefused(command + model + " --keep-checkpoints 0",
                  "--keep-checkpoints must be >= 1, got 0 [INVALID_ARGUMENT]");
    ExpectRefused(command + model + " --checkpoint-every -1",
                  "--checkpoint-every must be >= 0, got -1 [INVALID_ARGUMENT]");
    ExpectRefused(command + model + " --checkpoint-every 5",
                  "--checkpoint-every 5 needs --save DIR");
    ExpectRefused(command + model + " --eval-samples -1",
                  "--eval-samples must be >= 0 (0: all), got -1");
  }
  // dualpipe runs (two copies of the stages), on an even number of them: refused before `local`
  // starts a daemon.
  ExpectRefused("local" + model + " --stages 3 --schedule dualpipe",
                "dualpipe needs an even number of stages (got 3)");
  ExpectRefused("evaluate --checkpoint /tmp/ckpt --resume /tmp/ckpt",
                "--checkpoint is the former name of --resume: give one of them");
  ExpectRefused("evaluate --checkpoint /tmp/ckpt --checkpoint-every 2",
                "--checkpoint-every not used by `pipetrain evaluate`");
  ExpectRefused("schedule --kind 1f1b --stages 2 --microbatches 4 --keep-checkpoints 3",
                "--keep-checkpoints not used by `pipetrain schedule`");
  ExpectRefused("partition --costs 1,2,3 --stages 2 --save /tmp/x",
                "--save not used by `pipetrain partition`");
}

// --checkpoint-every N: a checkpoint after every step whose number is a multiple of N and one at
// the end, each overwriting --save; a last step that is a multiple of N is saved once.
TEST(ReferenceCliTest, CheckpointEveryWritesEveryNStepsAndAtTheEnd) {
  const std::string dir = ::testing::TempDir() + "/cli_checkpoint_every";
  const std::string common = "reference --model " + Example("mlp_digits.textproto") +
                             " --batch 16 --microbatches 2 --seed 2 --eval-samples 1";
  CliRun r = Pipetrain(common + " --steps 5 --checkpoint-every 2 --save " + dir + "/five");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(CheckpointLines(r.out), (std::vector<int>{2, 4, 5})) << r.out;
  EXPECT_EQ(ManifestStep(dir + "/five"), 5);

  r = Pipetrain(common + " --steps 4 --checkpoint-every 2 --save " + dir + "/every2");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(CheckpointLines(r.out), (std::vector<int>{2, 4})) << r.out;
  EXPECT_EQ(ManifestStep(dir + "/every2"), 4);
  // The checkpoint at step N is the one a run of N steps writes at its end.
  r = Pipetrain(common + " --steps 2 --checkpoint-every 2 --save " + dir + "/two");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(CheckpointLines(r.out), (std::vector<int>{2})) << r.out;
  EXPECT_EQ(ManifestStep(dir + "/two"), 2);
  r = Pipetrain(common + " --steps 2 --save " + dir + "/plain");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(CheckpointLines(r.out), (std::vector<int>{2})) << r.out;
  for (const char* f : {"layer-00000.safetensors", "layer-00004.safetensors", "manifest.json"}) {
    const std::string x = ReadAll(dir + "/plain/" + f);
    EXPECT_FALSE(x.empty()) << f;
    EXPECT_EQ(x, ReadAll(dir + "/two/" + f)) << f;
  }
  // Resumed at step 2, the multiples of N count from the start of training: 4, then the end (5).
  r = Pipetrain(common + " --steps 3 --checkpoint-every 2 --resume " + dir + "/two --save " + dir +
                "/resumed");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(CheckpointLines(r.out), (std::vector<int>{4, 5})) << r.out;
  EXPECT_EQ(ManifestStep(dir + "/resumed"), 5);
  EXPECT_EQ(ReadAll(dir + "/resumed/layer-00000.safetensors"),
            ReadAll(dir + "/five/layer-00000.safetensors"));
}

// A --save that cannot be a writable directory fails with FAILED_PRECONDITION naming it before
// anything is trained (and, for local, before any daemon starts); a missing one is created.
// (`train`'s is checked by its coordinator when it creates the job: tests/integration/save_test.)
TEST(TrainingOptionsCliTest, UnwritableSaveIsRefusedBeforeTheFirstStep) {
  const std::string dir = ::testing::TempDir() + "/cli_bad_save";
  ASSERT_EQ(
      std::system(
          ("rm -rf '" + dir + "' && mkdir -p '" + dir + "' && : > '" + dir + "/file'").c_str()),
      0);
  // A path below a regular file cannot be created, even by root. Had training started, a "step"
  // line (and for local the cluster's line) would be printed before the save failed.
  const std::string model = " --model " + Example("mlp_digits.textproto") + " --steps 2";
  for (const std::string& command : {std::string("reference"), std::string("local --stages 2")}) {
    SCOPED_TRACE(command);
    for (const std::string& bad : {dir + "/file", dir + "/file/sub"}) {
      const CliRun r = Pipetrain(command + model + " --save " + bad);
      EXPECT_EQ(r.exit_code, 1);
      EXPECT_THAT(r.out, HasSubstr("--save " + bad + ": "));
      EXPECT_THAT(r.out, HasSubstr("[FAILED_PRECONDITION]"));
      EXPECT_THAT(r.out, Not(HasSubstr("step")));
      EXPECT_THAT(r.out, Not(HasSubstr("local cluster")));
    }
  }
  if (geteuid() != 0) {  // root writes anywhere
    const std::string read_only = dir + "/read-only";
    ASSERT_EQ(
        std::system(("mkdir -p '" + read_only + "' && chmod 555 '" + read_only + "'").c_str()), 0);
    ExpectRefused("reference" + model + " --save " + read_only,
                  "--save " + read_only + ": directory is not writable");
  }
  // A missing directory is created (and used).
  const CliRun ok = Pipetrain("reference --model " + Example("mlp_digits.textproto") +
                              " --steps 1 --batch 8 --eval-samples 1 --save " + dir + "/new/ckpt");
  ASSERT_EQ(ok.exit_code, 0) << ok.out;
  EXPECT_EQ(ManifestStep(dir + "/new/ckpt"), 1);
}

// `local` (a coordinator and two workers here) with --checkpoint-every and --eval-samples: the
// checkpoint the coordinator's workers write, completed by the client, is byte for byte the
// reference's, and its evaluation the reference's to the last digit.
TEST(LocalCliTest, CheckpointEveryAndEvalSamplesMatchTheReference) {
  const std::string dir = ::testing::TempDir() + "/cli_local_checkpoint";
  const std::string common = " --model " + Example("mlp_digits.textproto") +
                             " --batch 16 --microbatches 4 --seed 3 --steps 3 --json "
                             "--eval-samples 0 --checkpoint-every 2 --save ";
  const CliRun ref = Pipetrain("reference" + common + dir + "/ref");
  ASSERT_EQ(ref.exit_code, 0) << ref.out;
  const CliRun local = Pipetrain("local --stages 2 --schedule 1f1b" + common + dir + "/local");
  if (local.out.find("cannot find the coordinator binary") != std::string::npos) {
    GTEST_SKIP() << "the daemons are not built";
  }
  ASSERT_EQ(local.exit_code, 0) << local.out;
  // Losses are printed with 9 significant digits: equal doubles mean equal floats.
  const Parsed a = ParseJsonLines(ref.out);
  const Parsed b = ParseJsonLines(local.out);
  ASSERT_EQ(a.losses.size(), 3u) << ref.out;
  EXPECT_EQ(a.losses, b.losses);
  ASSERT_TRUE(a.eval.contains("eval_accuracy")) << ref.out;
  EXPECT_EQ(a.eval, b.eval);
  EXPECT_EQ(ManifestStep(dir + "/local"), 3);
  // Every step of the pipeline measured its link latency (tensors went both ways between the
  // two ranks) and predicted its bubble with it.
  int steps = 0;
  for (absl::string_view line : absl::StrSplit(local.out, '\n', absl::SkipEmpty())) {
    const auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.contains("step")) continue;
    ++steps;
    ASSERT_TRUE(j["link_latency_ms"].is_number()) << line;
    EXPECT_GT(j["link_latency_ms"].get<double>(), 0.0) << line;
    EXPECT_GT(j["predicted_bubble_fraction"].get<double>(), 0.0) << line;
  }
  EXPECT_EQ(steps, 3);
  for (const char* f : {"layer-00000.safetensors", "layer-00002.safetensors",
                        "layer-00004.safetensors", "manifest.json"}) {
    const std::string x = ReadAll(dir + "/ref/" + f);
    EXPECT_FALSE(x.empty()) << f;
    EXPECT_TRUE(x == ReadAll(dir + "/local/" + f)) << f << " differs";
  }
  // Resuming the AdamW checkpoint with SGD would drop its moment tensors and train on silently:
  // refused by both (docs/training.md, "Resume"); a different AdamW lr is fine.
  const std::string resume = " --model " + Example("mlp_digits.textproto") +
                             " --batch 16 --microbatches 4 --seed 3 --steps 1 --resume ";
  for (const std::string command : {"reference", "local --stages 2 --schedule 1f1b"}) {
    const CliRun sgd = Pipetrain(command + resume + dir + "/local --optimizer sgd:lr=0.1");
    EXPECT_EQ(sgd.exit_code, 1) << command << "\n" << sgd.out;
    EXPECT_THAT(sgd.out, HasSubstr(dir + "/local: the checkpoint was trained with optimizer "
                                         "adamw, this run asks for sgd"));
    EXPECT_THAT(sgd.out, HasSubstr("[FAILED_PRECONDITION]"));
    const CliRun other_lr = Pipetrain(command + resume + dir + "/local --optimizer adamw:lr=0.5");
    EXPECT_EQ(other_lr.exit_code, 0) << command << "\n" << other_lr.out;
  }
}

// Learning-rate schedules: a run stopped and resumed mid-schedule is bitwise the run that never
// stopped (the schedule is in the checkpoint's optimizer text, a different one is refused), and
// `local` (the schedule travels in the JobSpec to the workers) equals `reference` bit for bit.
TEST(LrScheduleCliTest, ResumedMidScheduleEqualsAStraightRunBitwise) {
  const std::string dir = ::testing::TempDir() + "/cli_lr_resume";
  const std::string common = "reference --model " + Example("mlp_digits.textproto") +
                             " --batch 16 --microbatches 2 --seed 7 --json --eval-samples 8"
                             " --optimizer adamw:lr=2e-2 ";
  const std::string schedule =
      "--lr-schedule warmup-cosine --warmup-steps 2 --lr-decay-steps 6 --lr-min 1e-3 ";
  const CliRun straight = Pipetrain(common + schedule + "--steps 6 --save " + dir + "/straight");
  ASSERT_EQ(straight.exit_code, 0) << straight.out;
  const CliRun first = Pipetrain(common + schedule + "--steps 3 --save " + dir + "/half");
  ASSERT_EQ(first.exit_code, 0) << first.out;
  const CliRun second = Pipetrain(common + schedule + "--steps 3 --resume " + dir +
                                  "/half --save " + dir + "/resumed");
  ASSERT_EQ(second.exit_code, 0) << second.out;
  const Parsed a = ParseJsonLines(straight.out), b = ParseJsonLines(first.out),
               c = ParseJsonLines(second.out, /*first_step=*/4);
  ASSERT_EQ(a.losses.size(), 6u);
  ASSERT_EQ(c.losses.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(a.losses[i], b.losses[i]);
    EXPECT_EQ(a.losses[3 + i], c.losses[i]);
  }
  EXPECT_EQ(a.eval, c.eval);
  for (const char* f : {"layer-00000.safetensors", "layer-00004.safetensors", "manifest.json"}) {
    const std::string x = ReadAll(dir + "/straight/" + f);
    EXPECT_FALSE(x.empty()) << f;
    EXPECT_TRUE(x == ReadAll(dir + "/resumed/" + f)) << f << " differs";
  }
  EXPECT_THAT(ReadAll(dir + "/straight/manifest.json"),
              HasSubstr("lr_schedule=warmup-cosine,warmup_steps=2,decay_steps=6"));
  // The schedule changes the run: without it, step 2 onwards differ.
  const Parsed plain = ParseJsonLines(Pipetrain(common + "--steps 3").out);
  ASSERT_EQ(plain.losses.size(), 3u);
  EXPECT_EQ(plain.losses[0], a.losses[0]);  // the same initial weights
  EXPECT_NE(plain.losses[1], a.losses[1]);
  // Resuming with another schedule would not continue this run: refused.
  ExpectRefused(common +
                    "--lr-schedule warmup-linear --warmup-steps 2 --lr-decay-steps 6 "
                    "--lr-min 1e-3 --steps 1 --resume " +
                    dir + "/half",
                "resume with the same --lr-schedule");
  ExpectRefused(common + "--lr-schedule warmup-cosine --warmup-steps 6 --steps 3",
                "--lr-decay-steps (3, from --steps) must be greater than --warmup-steps (6)");
}

// The {"eval_step": N, ...} lines of --json output.
std::vector<nlohmann::json> EvalEveryLines(const std::string& out) {
  std::vector<nlohmann::json> lines;
  for (absl::string_view line : absl::StrSplit(out, '\n', absl::SkipEmpty())) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_discarded() && j.contains("eval_step")) lines.push_back(j);
  }
  return lines;
}

// With --eval-every: also the held-out evaluation every 2 steps, equal in both.
TEST(LrScheduleCliTest, LocalEqualsTheReferenceWithASchedule) {
  const std::string dir = ::testing::TempDir() + "/cli_lr_local";
  const std::string common = " --model " + Example("mlp_digits.textproto") +
                             " --batch 16 --microbatches 4 --seed 5 --steps 5 --json"
                             " --eval-samples 64 --optimizer sgd:lr=0.2,momentum=0.9"
                             " --lr-schedule warmup-linear --warmup-steps 2 --lr-min 0.01"
                             " --eval-every 2 --save ";
  const CliRun ref = Pipetrain("reference" + common + dir + "/ref");
  ASSERT_EQ(ref.exit_code, 0) << ref.out;
  const CliRun local = Pipetrain("local --stages 2 --schedule zb-h1" + common + dir + "/local");
  if (local.out.find("cannot find the coordinator binary") != std::string::npos) {
    GTEST_SKIP() << "the daemons are not built";
  }
  ASSERT_EQ(local.exit_code, 0) << local.out;
  const Parsed a = ParseJsonLines(ref.out), b = ParseJsonLines(local.out);
  ASSERT_EQ(a.losses.size(), 5u);
  EXPECT_EQ(a.losses, b.losses);
  // --eval-every 2: held-out evaluations after steps 2 and 4, the same numbers both ways (local
  // evaluates the job's weights through the coordinator's Evaluate), and the final one.
  EXPECT_EQ(EvalEveryLines(ref.out), EvalEveryLines(local.out));
  EXPECT_EQ(a.eval, b.eval);
  ASSERT_EQ(EvalEveryLines(ref.out).size(), 2u) << ref.out;
  EXPECT_EQ(EvalEveryLines(ref.out)[0]["eval_step"], 2);
  EXPECT_EQ(EvalEveryLines(ref.out)[1]["eval_step"], 4);
  EXPECT_NE(EvalEveryLines(ref.out)[0]["eval_loss"], EvalEveryLines(ref.out)[1]["eval_loss"]);
  for (const char* f : {"layer-00000.safetensors", "layer-00004.safetensors", "manifest.json"}) {
    const std::string x = ReadAll(dir + "/ref/" + f);
    EXPECT_FALSE(x.empty()) << f;
    EXPECT_TRUE(x == ReadAll(dir + "/local/" + f)) << f << " differs";
  }
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
