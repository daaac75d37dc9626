// The tokens: data sets (common/io/token_corpus.h) through OpenDataset, as users open them.
#include <sys/stat.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/io/dataset.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/io/npy_test_util.h"

namespace pipetrain::io {
namespace {

using ::pipetrain::testing::Bytes;
using ::pipetrain::testing::WriteBytes;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string TempPath(const std::string& name) {
  return ::testing::TempDir() + "/token_corpus_" + name;
}

// Ids 0, 1, ..., n - 1 (mod `modulo`).
template <typename T>
std::vector<T> Ids(int n, int modulo) {
  std::vector<T> ids;
  for (int i = 0; i < n; ++i) ids.push_back(static_cast<T>(i % modulo));
  return ids;
}

DatasetOptions Options(int64_t context, int64_t vocab_size = 0) {
  DatasetOptions o;
  o.context = context;
  o.vocab_size = vocab_size;
  return o;
}

// A sample is context + 1 consecutive ids: inputs [i, i + T), targets [i + 1, i + T + 1), as a
// text data set's; the last tenth of a single file is held out.
TEST(TokenCorpusTest, Uint16FileGivesTheTextWindows) {
  const std::string path = TempPath("u16.bin");
  WriteBytes(path, Bytes(Ids<uint16_t>(50, 7)));
  absl::StatusOr<std::unique_ptr<Dataset>> d = OpenDataset("tokens:" + path, Options(4));
  ASSERT_TRUE(d.ok()) << d.status();
  const DatasetInfo& info = (*d)->info();
  EXPECT_EQ(info.name, "tokens:" + path);
  EXPECT_EQ(info.input_features, 1);
  EXPECT_EQ(info.target_features, 1);
  EXPECT_EQ(info.tokens_per_sample, 4);
  EXPECT_EQ(info.num_classes, 7);  // the largest id + 1: the model left vocab_size 0
  EXPECT_TRUE(info.token_ids);
  // 45 training ids, 5 held out: 41 and 1 windows.
  EXPECT_EQ((*d)->size(Split::kTrain), 41);
  EXPECT_EQ((*d)->size(Split::kEval), 1);
  std::vector<float> x(4), y(4);
  (*d)->GetSample(Split::kTrain, 5, x.data(), y.data());
  EXPECT_THAT(x, ElementsAre(5, 6, 0, 1));
  EXPECT_THAT(y, ElementsAre(6, 0, 1, 2));
  (*d)->GetSample(Split::kEval, 0, x.data(), y.data());  // ids 45..49
  EXPECT_THAT(x, ElementsAre(3, 4, 5, 6));
  EXPECT_THAT(y, ElementsAre(4, 5, 6, 0));
  // Both spellings of the default id type give the same data set.
  absl::StatusOr<std::unique_ptr<Dataset>> same =
      OpenDataset("tokens:" + path + ":uint16", Options(4));
  ASSERT_TRUE(same.ok()) << same.status();
  EXPECT_EQ((*same)->size(Split::kTrain), 41);
}

TEST(TokenCorpusTest, Uint32DirectoryOfTrainAndValBins) {
  const std::string dir = TempPath("nanogpt");
  ::mkdir(dir.c_str(), 0755);
  std::vector<uint32_t> train = Ids<uint32_t>(20, 20);
  train[3] = 70000;  // beyond uint16
  WriteBytes(dir + "/train.bin", Bytes(train));
  WriteBytes(dir + "/val.bin", Bytes(std::vector<uint32_t>{9, 8, 7, 6}));
  absl::StatusOr<std::unique_ptr<Dataset>> d =
      OpenDataset("tokens:" + dir + ":uint32", Options(3, 70001));
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ((*d)->info().num_classes, 70001);
  EXPECT_EQ((*d)->size(Split::kTrain), 17);
  EXPECT_EQ((*d)->size(Split::kEval), 1);
  std::vector<float> x(3), y(3);
  (*d)->GetSample(Split::kTrain, 1, x.data(), y.data());
  EXPECT_THAT(x, ElementsAre(1, 2, 70000));
  EXPECT_THAT(y, ElementsAre(2, 70000, 4));
  (*d)->GetSample(Split::kEval, 0, x.data(), y.data());
  EXPECT_THAT(x, ElementsAre(9, 8, 7));
  EXPECT_THAT(y, ElementsAre(8, 7, 6));
  // A head narrower than the ids: the first target beyond it, with its offset.
  EXPECT_EQ((*d)->CheckLabelsForModel(100).message(),
            dir +
                "/train.bin: token id 70000 at token 3 (byte 12) is out of range for the "
                "model, whose last layer outputs 100 classes (tokens 0 to 99); the data set has "
                "70001: set the last linear layer's out_features to 70001, or to 0 to take the "
                "data set's");
  EXPECT_TRUE((*d)->CheckLabelsForModel(70001).ok());
}

void ExpectRefused(const std::string& spec, const DatasetOptions& o, absl::StatusCode code,
                   const std::string& message) {
  absl::StatusOr<std::unique_ptr<Dataset>> d = OpenDataset(spec, o);
  EXPECT_EQ(d.status().code(), code) << spec << ": " << d.status();
  EXPECT_THAT(d.status().message(), HasSubstr(message)) << spec;
}

TEST(TokenCorpusTest, RefusesBadFilesIdsAndSpecs) {
  const auto kInvalid = absl::StatusCode::kInvalidArgument;
  const std::string path = TempPath("ids.bin");
  WriteBytes(path, Bytes(Ids<uint16_t>(40, 9)));
  // An id at or beyond the model's vocabulary, with its offset (id 8 first at token 8).
  ExpectRefused("tokens:" + path, Options(4, 8), kInvalid,
                path +
                    ": token id 8 at token 8 (byte 16) is not below the model's vocabulary "
                    "of 8 (its embedding's vocab_size)");
  // uint32 ids beyond 2^24 when the model leaves the vocabulary to the data.
  const std::string big = TempPath("big.bin");
  WriteBytes(big, Bytes(std::vector<uint32_t>{1, 2, 3, 1u << 24, 5, 6, 7, 8, 9, 10}));
  ExpectRefused("tokens:" + big + ":uint32", Options(2), kInvalid,
                "token id 16777216 at token 3 (byte 12) is not below 16777216 (2^24");
  // A size that is not a whole number of ids.
  const std::string odd = TempPath("odd.bin");
  WriteBytes(odd, std::string(41, '\0'));
  ExpectRefused("tokens:" + odd, Options(2), kInvalid,
                odd +
                    ": 41 bytes is not a whole number of uint16 token ids (2 bytes each); if "
                    "the ids are uint32, say so: tokens:PATH:uint32");
  const std::string even = TempPath("even.bin");
  WriteBytes(even, std::string(42, '\0'));
  ExpectRefused("tokens:" + even + ":uint32", Options(2), kInvalid,
                even + ": 42 bytes is not a whole number of uint32 token ids (4 bytes each)");
  // Too short for the context, empty, a context the model does not give.
  ExpectRefused("tokens:" + path, Options(36), kInvalid,
                path +
                    ": the training part has 36 token ids, too few for context 36: it needs "
                    "at least 37");
  const std::string empty = TempPath("empty.bin");
  WriteBytes(empty, "");
  ExpectRefused("tokens:" + empty, Options(2), kInvalid, "the training part has 0 token ids");
  ExpectRefused("tokens:" + path, Options(0), kInvalid,
                "context 0 is out of range [1, 16777216] (the context of the model's embedding)");
  // Specs and paths.
  ExpectRefused("tokens:", Options(2), kInvalid, "needs a path (tokens:PATH[:uint16|:uint32])");
  ExpectRefused("tokens::uint32", Options(2), kInvalid, "needs a path");
  ExpectRefused("tokens:" + TempPath("missing.bin"), Options(2), absl::StatusCode::kNotFound,
                "missing.bin");
  const std::string no_val = TempPath("no_val");
  ::mkdir(no_val.c_str(), 0755);
  WriteBytes(no_val + "/train.bin", Bytes(Ids<uint16_t>(40, 9)));
  ExpectRefused("tokens:" + no_val, Options(2), absl::StatusCode::kNotFound, "val.bin");
  ExpectRefused("tokens:/dev/zero", Options(2), kInvalid, "is not a regular file");
  // More windows than the limit.
  DatasetOptions few = Options(2);
  few.max_samples = 10;
  ExpectRefused("tokens:" + path, few, absl::StatusCode::kResourceExhausted,
                "40 token ids give 36 windows (one per id): more than the limit of 10 samples");
}

}  // namespace
}  // namespace pipetrain::io
