// Generation through the service (issue 32), against a real coordinator and stage workers on
// 127.0.0.1: a few steps of examples/gpt_char on the bundled text, a checkpoint, then the SDK's
// Generate on the live job gives exactly the text `pipetrain generate --resume` gives for the
// checkpoint with the same sampling and seed, for several prompts decoded together.
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/sdk/client.h"
#include "common/io/byte_vocabulary.h"
#include "common/io/dataset.h"
#include "common/io/tokenizer.h"
#include "common/model/model.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/daemons.h"
#include "tests/integration/daemons_fixture.h"
#include "tests/integration/run_command.h"

namespace pipetrain {
namespace {

using testing::Example;
using ::testing::HasSubstr;
using testing::ReadFile;
using testing::TempDir;

class GenerateTest : public testing::DaemonsTest {
 protected:
  void SetUp() override {
    dir_ = TempDir("pipetrain_generate_");
    ASSERT_FALSE(dir_.empty());
    root_ = dir_ + "/root";
    ASSERT_EQ(testing::RunCommand(absl::StrCat("mkdir -p ", root_)).exit_code, 0);
    ASSERT_EQ(daemons_.Start(dir_, 2, {"--checkpoint-root", root_}), "");
  }

  // `pipetrain generate` of the checkpoint in `ck` from `prompt`: its standard output.
  testing::CommandRun LocalGenerate(const std::string& ck, const std::string& prompt) {
    return testing::RunCommand(
        absl::StrCat(PIPETRAIN_BINARY, " generate --resume ", ck,
                     " --data text --data-dir " PIPETRAIN_SOURCE_DIR "/data --prompt '", prompt,
                     "' --max-tokens 40 --temperature 0.8 --top-k 5 "
                     "--seed 3 2>",
                     dir_, "/generate.err"));
  }

  // A 2-stage 1F1B job (AdamW, M=2, one thread) of `model` on data set `data`'s shape, with the
  // SentencePiece model file `tokenizer` (empty: none).
  absl::StatusOr<v1::JobStatus> CreateJob(const v1::ModelSpec& model, const io::Dataset& data,
                                          uint64_t seed, const std::string& tokenizer = "") {
    v1::JobSpec spec;
    *spec.mutable_model() = model;
    spec.mutable_optimizer()->mutable_adamw()->set_lr(1e-2f);
    spec.set_schedule("1f1b");
    spec.set_stages(2);
    spec.set_microbatches(2);
    spec.set_threads(1);
    spec.set_seed(seed);
    spec.set_tokenizer(tokenizer);
    const io::DatasetInfo& info = data.info();
    v1::DataShape* shape = spec.mutable_data_shape();
    shape->set_input_features(info.input_features);
    shape->set_target_features(info.target_features);
    shape->set_num_classes(info.num_classes);
    shape->set_tokens_per_sample(info.tokens_per_sample);
    return daemons_.client().CreateJob(spec);
  }

  std::string root_;
};

TEST_F(GenerateTest, GenerateOnTheLiveJobGivesTheLocalGeneratorsTextForTheSameSeed) {
  absl::StatusOr<v1::ModelSpec> model =
      model::ParseModelSpecText(ReadFile(Example("gpt_char.textproto")), "gpt_char");
  ASSERT_TRUE(model.ok()) << model.status();
  io::DatasetOptions data_options;
  data_options.context = model->layers(0).embedding().context();
  data_options.data_dir = PIPETRAIN_SOURCE_DIR "/data";
  absl::StatusOr<std::unique_ptr<io::Dataset>> data = io::OpenDataset("text", data_options);
  ASSERT_TRUE(data.ok()) << data.status();
  absl::StatusOr<io::ByteVocabulary> bytes = io::ByteVocabulary::Create((*data)->info().vocabulary);
  ASSERT_TRUE(bytes.ok()) << bytes.status();

  absl::StatusOr<v1::JobStatus> job = CreateJob(*model, **data, 7);
  ASSERT_TRUE(job.ok()) << job.status();
  absl::StatusOr<std::unique_ptr<client::TrainSession>> session =
      daemons_.client().StartTraining(job->job());
  ASSERT_TRUE(session.ok()) << session.status();
  for (int step = 0; step < 3; ++step) {
    const io::Batch batch = io::MakeEvalBatch(**data, 8 * step, 8);
    ASSERT_TRUE((*session)->Step({&batch.inputs, &batch.targets, batch.samples}).ok());
  }
  const std::string ck = root_ + "/ck";
  absl::StatusOr<v1::CheckpointResponse> saved = (*session)->Checkpoint(ck);
  ASSERT_TRUE(saved.ok()) << saved.status();

  const std::vector<std::string> prompts = {"The ", "of the", "GNU"};
  client::GenerateOptions options;
  for (const std::string& p : prompts) {
    absl::StatusOr<std::vector<int64_t>> ids = bytes->Encode(p);
    ASSERT_TRUE(ids.ok()) << ids.status();
    options.prompts.push_back(*ids);
  }
  options.max_tokens = 40;
  options.temperature = 0.8;
  options.top_k = 5;
  options.seed = 3;
  absl::StatusOr<v1::GenerateResult> live = (*session)->Generate(options);
  ASSERT_TRUE(live.ok()) << live.status();
  EXPECT_EQ(live->step(), 3);
  ASSERT_EQ(live->sequences_size(), 3);
  for (size_t p = 0; p < prompts.size(); ++p) {
    SCOPED_TRACE(prompts[p]);
    std::string text = prompts[p];
    for (int64_t id : live->sequences(static_cast<int>(p)).tokens()) text += bytes->byte(id);
    const testing::CommandRun local = LocalGenerate(ck, prompts[p]);
    ASSERT_EQ(local.exit_code, 0) << ReadFile(dir_ + "/generate.err");
    EXPECT_EQ(local.out, text + "\n");
  }
  // `pipetrain generate --coordinator --job`: the same text as --resume, from the live job.
  const testing::CommandRun remote =
      testing::RunCommand(absl::StrCat(
          PIPETRAIN_BINARY, " generate --coordinator ", daemons_.address(), " --job ", job->job(),
          " --data text --data-dir " PIPETRAIN_SOURCE_DIR "/data --prompt 'of the' --max-tokens 40 "
          "--temperature 0.8 --top-k 5 --seed 3 2>",
          dir_, "/remote.err"));
  ASSERT_EQ(remote.exit_code, 0) << ReadFile(dir_ + "/remote.err");
  EXPECT_EQ(remote.out, LocalGenerate(ck, "of the").out);
  // The job trains on, and the Client's Generate of the same weights gives the same tokens.
  absl::StatusOr<v1::GenerateResult> again = daemons_.client().Generate(job->job(), options);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->sequences(2).tokens_size(), 40);
  for (int p = 0; p < 3; ++p) {
    EXPECT_EQ(again->sequences(p).SerializeAsString(), live->sequences(p).SerializeAsString());
  }
  const io::Batch batch = io::MakeEvalBatch(**data, 24, 8);
  absl::StatusOr<v1::StepResult> next =
      (*session)->Step({&batch.inputs, &batch.targets, batch.samples});
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(next->step(), 4);
  options.prompts = {{static_cast<int64_t>((*data)->info().num_classes)}};
  absl::StatusOr<v1::GenerateResult> bad = (*session)->Generate(options);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("outside the vocabulary"));
  EXPECT_TRUE((*session)->Finish().ok());
  EXPECT_TRUE(daemons_.client().FinishJob(job->job()).ok());
}

// A job trained with a SentencePiece tokenizer (examples/llama_tok over data/gpl-3-bpe256): the
// CLI's `generate --coordinator --job --tokenizer` encodes the prompt and decodes the tokens with
// it, giving exactly the text `generate --resume` gives with the checkpoint's tokenizer.
TEST_F(GenerateTest, ATokenizedJobGeneratesThroughItsTokenizer) {
  const std::string tokenizer_dir = PIPETRAIN_SOURCE_DIR "/data/gpl-3-bpe256";
  absl::StatusOr<v1::ModelSpec> model =
      model::ParseModelSpecText(ReadFile(Example("llama_tok.textproto")), "llama_tok");
  ASSERT_TRUE(model.ok()) << model.status();
  absl::StatusOr<std::shared_ptr<const io::Tokenizer>> tokenizer =
      io::Tokenizer::Load(tokenizer_dir);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  io::DatasetOptions data_options;
  data_options.context = model->layers(0).embedding().context();
  data_options.data_dir = PIPETRAIN_SOURCE_DIR "/data";
  data_options.tokenizer = *tokenizer;
  absl::StatusOr<std::unique_ptr<io::Dataset>> data = io::OpenDataset("text", data_options);
  ASSERT_TRUE(data.ok()) << data.status();
  absl::StatusOr<v1::JobStatus> job =
      CreateJob(*model, **data, 11, ReadFile(tokenizer_dir + "/tokenizer.model"));
  ASSERT_TRUE(job.ok()) << job.status();
  absl::StatusOr<std::unique_ptr<client::TrainSession>> session =
      daemons_.client().StartTraining(job->job());
  ASSERT_TRUE(session.ok()) << session.status();
  for (int step = 0; step < 2; ++step) {
    const io::Batch batch = io::MakeEvalBatch(**data, 8 * step, 8);
    ASSERT_TRUE((*session)->Step({&batch.inputs, &batch.targets, batch.samples}).ok());
  }
  const std::string ck = root_ + "/ck_tok";
  ASSERT_TRUE((*session)->Checkpoint(ck).ok());
  const std::string sampling = " --prompt 'of the' --max-tokens 12 --temperature 0.8 --seed 5";
  const testing::CommandRun local = testing::RunCommand(absl::StrCat(
      PIPETRAIN_BINARY, " generate --resume ", ck, sampling, " 2>", dir_, "/generate.err"));
  ASSERT_EQ(local.exit_code, 0) << ReadFile(dir_ + "/generate.err");
  const testing::CommandRun remote = testing::RunCommand(absl::StrCat(
      PIPETRAIN_BINARY, " generate --coordinator ", daemons_.address(), " --job ", job->job(),
      " --tokenizer ", tokenizer_dir, sampling, " 2>", dir_, "/remote.err"));
  ASSERT_EQ(remote.exit_code, 0) << ReadFile(dir_ + "/remote.err");
  EXPECT_EQ(remote.out, local.out);
  EXPECT_GT(remote.out.size(), std::string("of the\n").size());
  // The byte vocabulary of --data does not fit a job of 256 tokenizer pieces: refused, naming
  // --tokenizer.
  const testing::CommandRun bytes = testing::RunCommand(absl::StrCat(
      PIPETRAIN_BINARY, " generate --coordinator ", daemons_.address(), " --job ", job->job(),
      " --data text --data-dir " PIPETRAIN_SOURCE_DIR "/data", sampling, " 2>&1"));
  EXPECT_NE(bytes.exit_code, 0);
  EXPECT_THAT(bytes.out, HasSubstr("--tokenizer"));
  EXPECT_TRUE((*session)->Finish().ok());
  EXPECT_TRUE(daemons_.client().FinishJob(job->job()).ok());
}

}  // namespace
}  // namespace pipetrain
