#include "common/io/token_text_dataset.h"

#include <stdlib.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "common/io/dataset.h"
#include "common/io/file_util.h"
#include "common/io/tokenizer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pipetrain::io {
namespace {

using ::testing::HasSubstr;

std::string SourceDir() {
  const char* dir = std::getenv("PIPETRAIN_SOURCE_DIR");
  return dir != nullptr ? dir : ".";
}

std::shared_ptr<const Tokenizer> BundledTokenizer() {
  static const std::shared_ptr<const Tokenizer>* const tokenizer = [] {
    TokenizerTrainOptions o;
    o.vocab_size = 300;
    absl::StatusOr<std::string> text = ReadFile(SourceDir() + "/data/gpl-3.txt");
    absl::StatusOr<std::string> model = TrainTokenizer(*text, "gpl-3.txt", o);
    EXPECT_TRUE(model.ok()) << model.status();
    absl::StatusOr<std::shared_ptr<const Tokenizer>> t = Tokenizer::FromModel(*model, "test");
    EXPECT_TRUE(t.ok()) << t.status();
    return new std::shared_ptr<const Tokenizer>(*t);
  }();
  return *tokenizer;
}

DatasetOptions Options(int64_t context) {
  DatasetOptions o;
  o.data_dir = SourceDir() + "/data";
  o.context = context;
  o.tokenizer = BundledTokenizer();
  return o;
}

TEST(TokenTextDatasetTest, BundledTextGivesTheTokenizersIds) {
  if (!TokenizersAvailable()) GTEST_SKIP() << "no tokenizers in a sanitizer build";
  absl::StatusOr<std::unique_ptr<Dataset>> data = OpenDataset("text", Options(16));
  ASSERT_TRUE(data.ok()) << data.status();
  const DatasetInfo& info = (*data)->info();
  EXPECT_EQ(info.name, "text");
  EXPECT_EQ(info.num_classes, 300);
  EXPECT_EQ(info.tokens_per_sample, 16);
  EXPECT_EQ(info.input_features, 1);
  EXPECT_TRUE(info.vocabulary.empty());

  const std::vector<int32_t> ids =
      *BundledTokenizer()->Encode(*ReadFile(SourceDir() + "/data/gpl-3.txt"));
  const int64_t n = static_cast<int64_t>(ids.size());
  const int64_t split = n - n / kTokenTextHoldOutDivisor;
  EXPECT_EQ((*data)->size(Split::kTrain), split - 16);
  EXPECT_EQ((*data)->size(Split::kEval), n - split - 16);
  std::vector<float> inputs(16), targets(16);
  for (int64_t index : {int64_t{0}, int64_t{7}, (*data)->size(Split::kTrain) - 1}) {
    (*data)->GetSample(Split::kTrain, index, inputs.data(), targets.data());
    for (int64_t t = 0; t < 16; ++t) {
      ASSERT_EQ(inputs[t], static_cast<float>(ids[index + t])) << index << " " << t;
      ASSERT_EQ(targets[t], static_cast<float>(ids[index + t + 1])) << index << " " << t;
    }
  }
  (*data)->GetSample(Split::kEval, 0, inputs.data(), targets.data());
  EXPECT_EQ(inputs[0], static_cast<float>(ids[split]));
  EXPECT_TRUE((*data)->CheckLabelsForModel(300).ok());
  EXPECT_FALSE((*data)->CheckLabelsForModel(100).ok());
}

TEST(TokenTextDatasetTest, TextFileWithTooFewTokens) {
  if (!TokenizersAvailable()) GTEST_SKIP() << "no tokenizers in a sanitizer build";
  const std::string path = ::testing::TempDir() + "/pipetrain_token_text_short.txt";
  ASSERT_TRUE(WriteFileAtomically(path, "the license").ok());
  absl::StatusOr<std::unique_ptr<Dataset>> data = OpenDataset("text:" + path, Options(32));
  EXPECT_EQ(data.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(data.status().message(), HasSubstr(path + ": text of 11 bytes is"));
  EXPECT_THAT(data.status().message(), HasSubstr("too few for context 32"));
}

TEST(TokenTextDatasetTest, TooManyWindows) {
  if (!TokenizersAvailable()) GTEST_SKIP() << "no tokenizers in a sanitizer build";
  DatasetOptions o = Options(8);
  o.max_samples = 100;
  absl::StatusOr<std::unique_ptr<Dataset>> data = OpenDataset("text", o);
  EXPECT_EQ(data.status().code(), absl::StatusCode::kResourceExhausted);
}

TEST(TokenTextDatasetTest, TokenizerOnlyForText) {
  if (!TokenizersAvailable()) GTEST_SKIP() << "no tokenizers in a sanitizer build";
  absl::StatusOr<std::unique_ptr<Dataset>> data = OpenDataset("digits", Options(8));
  EXPECT_EQ(data.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(data.status().message(), HasSubstr("a tokenizer applies to text data sets"));
}

}  // namespace
}  // namespace pipetrain::io
