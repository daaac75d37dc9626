// The real `pipetrain` binary with SentencePiece tokenizers (docs/tokenizer.md): `tokenizer train`
// writes the same files for the same input and flags and refuses bad input clearly; text data
// sets take --tokenizer; `local --stages 2` on the char GPT with a tokenizer trained here is
// bitwise `reference`, and both checkpoints carry the tokenizer, which `evaluate` and `--resume`
// use without the flag (and a different one is refused).
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "common/io/tokenizer.h"
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

// Runs `pipetrain ARGS`, expecting exit code 1 and `message` in the output.
void ExpectRefused(const std::string& args, const std::string& message) {
  const testing::CommandRun r = Pipetrain(args);
  EXPECT_EQ(r.exit_code, 1) << args << "\n" << r.out;
  EXPECT_THAT(r.out, HasSubstr(message)) << args;
}

std::string BundledText() { return std::string(PIPETRAIN_SOURCE_DIR) + "/data/gpl-3.txt"; }

// Trains a tokenizer of `vocab` pieces on the bundled text into `dir`.
void TrainTokenizer(const std::string& dir, int vocab, const std::string& type = "bpe") {
  const testing::CommandRun r =
      Pipetrain("tokenizer train --input " + BundledText() + " --vocab-size " +
                std::to_string(vocab) + " --model-type " + type + " --out " + dir);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("tokenizer of " + std::to_string(vocab) + " pieces (" + type +
                               ") written to " + dir + "/tokenizer.model"));
}

struct Parsed {
  std::vector<double> losses;
  nlohmann::json eval;
};

Parsed ParseJson(const std::string& out) {
  Parsed r;
  for (absl::string_view line : absl::StrSplit(out, '\n', absl::SkipEmpty())) {
    const auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded()) continue;
    if (j.contains("step") && j.contains("loss")) {
      r.losses.push_back(j["loss"].get<double>());
    } else if (j.contains("eval_loss")) {
      r.eval = j;
    }
  }
  return r;
}

TEST(TokenizerCliTest, TrainWritesTheSameFilesForTheSameInput) {
  if (!io::TokenizersAvailable()) GTEST_SKIP() << "no tokenizers in a sanitizer build";
  const std::string dir = testing::TempDir("pipetrain_tokenizer_cli_");
  for (const char* type : {"bpe", "unigram"}) {
    TrainTokenizer(dir + "/a-" + type, 300, type);
    TrainTokenizer(dir + "/b-" + type, 300, type);
    for (const char* file : {"tokenizer.model", "tokenizer.json"}) {
      const std::string a = testing::ReadFile(dir + "/a-" + type + "/" + file);
      EXPECT_FALSE(a.empty()) << file;
      EXPECT_TRUE(a == testing::ReadFile(dir + "/b-" + type + "/" + file)) << type << " " << file;
    }
  }
  const testing::CommandRun json = Pipetrain("tokenizer train --input " + BundledText() +
                                             " --vocab-size 300 --json --out " + dir + "/c");
  ASSERT_EQ(json.exit_code, 0) << json.out;
  const auto j = nlohmann::json::parse(json.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << json.out;
  EXPECT_EQ(j["vocab_size"], 300);
  EXPECT_GT(j["input_bytes"].get<int64_t>(), j["input_tokens"].get<int64_t>());
  EXPECT_TRUE(testing::ReadFile(dir + "/c/tokenizer.model") ==
              testing::ReadFile(dir + "/a-bpe/tokenizer.model"));
}

TEST(TokenizerCliTest, BadInputIsRefusedClearly) {
  if (!io::TokenizersAvailable()) GTEST_SKIP() << "no tokenizers in a sanitizer build";
  const std::string dir = testing::TempDir("pipetrain_tokenizer_cli_");
  const std::string train = "tokenizer train --vocab-size 300 --out " + dir + "/t";
  ExpectRefused(train + " --input " + dir + "/missing.txt",
                "--input training text: cannot read '" + dir + "/missing.txt'");
  ASSERT_EQ(testing::RunCommand("touch " + dir + "/empty.txt").exit_code, 0);
  ExpectRefused(train + " --input " + dir + "/empty.txt", dir + "/empty.txt: is empty");
  ExpectRefused("tokenizer train --vocab-size 50000 --model-type unigram --out " + dir +
                    "/t --input " + BundledText(),
                "Vocabulary size too high (50000)");
  ExpectRefused(
      "tokenizer train --vocab-size 300 --out " + BundledText() + " --input " + BundledText(),
      "--out ");
  ExpectRefused("tokenizer train --vocab-size 300 --input " + BundledText(),
                "--out DIR is required");
  ExpectRefused("tokenizer train --out " + dir + "/t --input " + BundledText(),
                "--vocab-size N is required");
  ExpectRefused("tokenizer train --vocab-size 300 --model-type word --out " + dir + "/t --input " +
                    BundledText(),
                "--model-type must be bpe or unigram");
  ExpectRefused("tokenizer fit --vocab-size 300 --out " + dir + "/t --input " + BundledText(),
                "unknown subcommand 'fit'");
  ExpectRefused("tokenizer --vocab-size 300 --out " + dir + "/t --input " + BundledText(),
                "missing subcommand");
  // Without the SentencePiece module: FAILED_PRECONDITION naming it and where it was looked for.
  const testing::CommandRun no_module = testing::RunCommand(
      "PIPETRAIN_SENTENCEPIECE_MODULE=" + dir + "/none.so " + std::string(PIPETRAIN_BINARY) + " " +
      train + " --input " + BundledText() + " 2>&1");
  EXPECT_EQ(no_module.exit_code, 1) << no_module.out;
  EXPECT_THAT(no_module.out, HasSubstr("tokenizers need pipetrain's SentencePiece module "
                                       "libpipetrain_sentencepiece.so"));
  EXPECT_THAT(no_module.out, HasSubstr(dir + "/none.so"));
  EXPECT_THAT(no_module.out, HasSubstr("[FAILED_PRECONDITION]"));
  // A tokenizer that is not one, for a data set that takes none.
  ExpectRefused("reference --model " + Example("gpt_char.textproto") + " --data text --tokenizer " +
                    BundledText() + " --steps 1",
                "--tokenizer: " + BundledText() + ": not a SentencePiece model");
  ExpectRefused("reference --model " + Example("gpt_char.textproto") + " --data text --tokenizer " +
                    dir + "/none --steps 1",
                "--tokenizer: tokenizer: cannot read '" + dir + "/none'");
}

// The end-to-end check: the char GPT on the bundled text with a tokenizer trained here,
// over a 2-stage pipeline, equals `reference` bit for bit, and both checkpoints carry it.
TEST(TokenizerCliTest, LocalTwoStagesEqualsReferenceAndCheckpointsCarryTheTokenizer) {
  if (!io::TokenizersAvailable()) GTEST_SKIP() << "no tokenizers in a sanitizer build";
  const std::string dir = testing::TempDir("pipetrain_tokenizer_e2e_");
  TrainTokenizer(dir + "/tok", 200);
  const std::string common = " --model " + Example("gpt_char.textproto") +
                             " --data text --tokenizer " + dir +
                             "/tok --batch 8 --microbatches 2 --seed 5 --steps 3 --json "
                             "--eval-samples 40 --save ";
  const testing::CommandRun ref = Pipetrain("reference" + common + dir + "/ref");
  ASSERT_EQ(ref.exit_code, 0) << ref.out;
  const testing::CommandRun local =
      Pipetrain("local --stages 2 --schedule 1f1b" + common + dir + "/local");
  if (local.out.find("cannot find the coordinator binary") != std::string::npos) {
    GTEST_SKIP() << "the daemons are not built";
  }
  ASSERT_EQ(local.exit_code, 0) << local.out;
  const Parsed a = ParseJson(ref.out), b = ParseJson(local.out);
  ASSERT_EQ(a.losses.size(), 3u) << ref.out;
  EXPECT_EQ(a.losses, b.losses);
  EXPECT_EQ(a.eval, b.eval);
  for (const char* f :
       {"manifest.json", "tokenizer.model", "layer-00000.safetensors", "layer-00004.safetensors"}) {
    const std::string x = testing::ReadFile(dir + "/ref/" + f);
    EXPECT_FALSE(x.empty()) << f;
    EXPECT_TRUE(x == testing::ReadFile(dir + "/local/" + f)) << f << " differs";
  }
  EXPECT_TRUE(testing::ReadFile(dir + "/ref/tokenizer.model") ==
              testing::ReadFile(dir + "/tok/tokenizer.model"));
  const auto manifest = nlohmann::json::parse(testing::ReadFile(dir + "/ref/manifest.json"));
  EXPECT_EQ(manifest["tokenizer"]["file"], "tokenizer.model");
  // The model's vocabulary is the tokenizer's (vocab_size 0 in the example).
  EXPECT_THAT(manifest["model_spec"].get<std::string>(), HasSubstr("vocab_size: 200"));

  // evaluate takes the checkpoint's tokenizer without the flag: the same held-out numbers.
  const testing::CommandRun eval =
      Pipetrain("evaluate --json --eval-samples 40 --resume " + dir + "/local");
  ASSERT_EQ(eval.exit_code, 0) << eval.out;
  EXPECT_EQ(ParseJson(eval.out).eval, a.eval);
  // The same tokenizer as a flag is fine; another one is refused, by every command.
  const testing::CommandRun same = Pipetrain("evaluate --json --eval-samples 40 --resume " + dir +
                                             "/local --tokenizer " + dir + "/tok");
  EXPECT_EQ(same.exit_code, 0) << same.out;
  TrainTokenizer(dir + "/other", 150);
  ExpectRefused("evaluate --resume " + dir + "/local --tokenizer " + dir + "/other",
                "is not the tokenizer checkpoint " + dir + "/local was trained with");
  const std::string resume = " --model " + Example("gpt_char.textproto") +
                             " --data text --batch 8 --microbatches 2 --seed 5 --steps 1 --json "
                             "--resume ";
  ExpectRefused("reference" + resume + dir + "/ref --tokenizer " + dir + "/other",
                "is not the tokenizer checkpoint");
  // Resumed without the flag: the checkpoint's tokenizer, and the pipeline equals the reference.
  const testing::CommandRun ref2 = Pipetrain("reference" + resume + dir + "/ref");
  ASSERT_EQ(ref2.exit_code, 0) << ref2.out;
  const testing::CommandRun local2 = Pipetrain("local --stages 2" + resume + dir + "/local");
  ASSERT_EQ(local2.exit_code, 0) << local2.out;
  EXPECT_EQ(ParseJson(ref2.out).losses, ParseJson(local2.out).losses);
  EXPECT_EQ(ParseJson(ref2.out).losses.size(), 1u);
}

std::string BundledTokenizer() { return std::string(PIPETRAIN_SOURCE_DIR) + "/data/gpl-3-bpe256"; }

// Issue 31's check: the tokenized LLaMA example (examples/llama_tok.textproto) with the bundled
// tokenizer -- which is exactly what the documented `tokenizer train` command writes -- trains
// over a 2-stage pipeline to the same files as the reference trainer, byte for byte: every layer
// file, the manifest and the tokenizer.
TEST(TokenizerCliTest, TokenizedLlamaLocalTwoStagesEqualsReference) {
  if (!io::TokenizersAvailable()) GTEST_SKIP() << "no tokenizers in a sanitizer build";
  const std::string dir = testing::TempDir("pipetrain_tokenizer_llama_");
  TrainTokenizer(dir + "/tok", 256);
  for (const char* f : {"tokenizer.model", "tokenizer.json"}) {
    EXPECT_TRUE(testing::ReadFile(dir + "/tok/" + f) ==
                testing::ReadFile(BundledTokenizer() + "/" + f))
        << "data/gpl-3-bpe256/" << f << " is not what `tokenizer train` writes";
  }
  const std::string common = " --model " + Example("llama_tok.textproto") +
                             " --data text --tokenizer " + BundledTokenizer() +
                             " --batch 8 --microbatches 2 --seed 5 --steps 3 --json "
                             "--eval-samples 16 --save ";
  const testing::CommandRun ref = Pipetrain("reference" + common + dir + "/ref");
  ASSERT_EQ(ref.exit_code, 0) << ref.out;
  const testing::CommandRun local =
      Pipetrain("local --stages 2 --schedule 1f1b" + common + dir + "/local");
  if (local.out.find("cannot find the coordinator binary") != std::string::npos) {
    GTEST_SKIP() << "the daemons are not built";
  }
  ASSERT_EQ(local.exit_code, 0) << local.out;
  const Parsed a = ParseJson(ref.out), b = ParseJson(local.out);
  ASSERT_EQ(a.losses.size(), 3u) << ref.out;
  EXPECT_EQ(a.losses, b.losses);
  EXPECT_EQ(a.eval, b.eval);
  std::vector<std::string> files = {"manifest.json", "tokenizer.model"};
  for (int l = 0; l < 9; ++l) files.push_back("layer-0000" + std::to_string(l) + ".safetensors");
  for (const std::string& f : files) {
    const std::string x = testing::ReadFile(dir + "/ref/" + f);
    EXPECT_FALSE(x.empty()) << f;
    EXPECT_TRUE(x == testing::ReadFile(dir + "/local/" + f)) << f << " differs";
  }
  const auto manifest = nlohmann::json::parse(testing::ReadFile(dir + "/ref/manifest.json"));
  EXPECT_THAT(manifest["model_spec"].get<std::string>(), HasSubstr("vocab_size: 256"));
}

// `partition --model` resolves a model whose vocabulary comes from --tokenizer as training does:
// llama_char (vocab_size 0) with the 256-piece tokenizer is llama_tok (vocab_size 256), not the
// byte-level model, and a tokenizer larger than a fixed vocab_size is refused.
TEST(TokenizerCliTest, PartitionResolvesTheVocabularyFromTheTokenizer) {
  if (!io::TokenizersAvailable()) GTEST_SKIP() << "no tokenizers in a sanitizer build";
  const std::string flags = " --stages 2 --format json --batch 8 --microbatches 2";
  const testing::CommandRun tok = Pipetrain("partition --model " + Example("llama_char.textproto") +
                                            " --tokenizer " + BundledTokenizer() + flags);
  ASSERT_EQ(tok.exit_code, 0) << tok.out;
  const testing::CommandRun fixed =
      Pipetrain("partition --model " + Example("llama_tok.textproto") + flags);
  ASSERT_EQ(fixed.exit_code, 0) << fixed.out;
  EXPECT_EQ(tok.out, fixed.out);
  const testing::CommandRun bytes =
      Pipetrain("partition --model " + Example("llama_char.textproto") + flags);
  ASSERT_EQ(bytes.exit_code, 0) << bytes.out;
  EXPECT_NE(bytes.out, tok.out);  // 76 byte tokens: a smaller embedding and head
  const std::string dir = testing::TempDir("pipetrain_tokenizer_partition_");
  TrainTokenizer(dir + "/tok", 300);
  ExpectRefused("partition --model " + Example("llama_tok.textproto") + " --tokenizer " + dir +
                    "/tok" + flags,
                "embedding vocab_size 256 < data set's vocabulary of 300");
  ExpectRefused("partition --model " + Example("llama_tok.textproto") + " --tokenizer " + dir +
                    "/missing" + flags,
                "--tokenizer");
}

// `generate` on a checkpoint trained with a tokenizer encodes the prompt and decodes the tokens
// with the checkpoint's tokenizer (no flag): the text starts with the prompt, is the same for a
// seed, and greedy decoding does not depend on it; `predict`'s data opens through it as well.
TEST(TokenizerCliTest, GenerateUsesTheCheckpointsTokenizer) {
  if (!io::TokenizersAvailable()) GTEST_SKIP() << "no tokenizers in a sanitizer build";
  const std::string dir = testing::TempDir("pipetrain_tokenizer_generate_");
  TrainTokenizer(dir + "/tok", 200);
  const testing::CommandRun trained =
      Pipetrain("reference --model " + Example("gpt_char.textproto") + " --data text --tokenizer " +
                dir + "/tok --batch 8 --seed 5 --steps 20 --json --save " + dir + "/ck");
  ASSERT_EQ(trained.exit_code, 0) << trained.out;
  const std::string base =
      "generate --resume " + dir + "/ck --prompt 'This License' --max-tokens 30 2>/dev/null";
  const testing::CommandRun a =
      testing::RunCommand(std::string(PIPETRAIN_BINARY) + " " + base + " --seed 7");
  ASSERT_EQ(a.exit_code, 0) << a.out;
  EXPECT_THAT(a.out, ::testing::StartsWith("This License"));
  EXPECT_GT(a.out.size(), std::string("This License\n").size()) << a.out;
  EXPECT_EQ(testing::RunCommand(std::string(PIPETRAIN_BINARY) + " " + base + " --seed 7").out,
            a.out);
  const std::string greedy = " --temperature 0";
  EXPECT_EQ(
      testing::RunCommand(std::string(PIPETRAIN_BINARY) + " " + base + greedy + " --seed 1").out,
      testing::RunCommand(std::string(PIPETRAIN_BINARY) + " " + base + greedy + " --seed 2").out);
}

TEST(TokenizerCliTest, ByteLevelCheckpointRefusesATokenizer) {
  if (!io::TokenizersAvailable()) GTEST_SKIP() << "no tokenizers in a sanitizer build";
  const std::string dir = testing::TempDir("pipetrain_tokenizer_bytes_");
  TrainTokenizer(dir + "/tok", 200);
  const testing::CommandRun ref =
      Pipetrain("reference --model " + Example("gpt_char.textproto") +
                " --data text --batch 4 --steps 1 --eval-samples 4 --save " + dir + "/ckpt");
  ASSERT_EQ(ref.exit_code, 0) << ref.out;
  ExpectRefused("evaluate --resume " + dir + "/ckpt --tokenizer " + dir + "/tok",
                "was trained without a tokenizer (byte-level text)");
  ExpectRefused("local --stages 2 --model " + Example("gpt_char.textproto") +
                    " --data text --batch 4 --steps 1 --resume " + dir + "/ckpt --tokenizer " +
                    dir + "/tok",
                "was trained without a tokenizer");
}

}  // namespace
}  // namespace pipetrain
