#include "common/io/tokenizer.h"

#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/io/file_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pipetrain::io {
namespace {

using ::testing::HasSubstr;

std::string SourceDir() {
  const char* dir = std::getenv("PIPETRAIN_SOURCE_DIR");
  return dir != nullptr ? dir : ".";
}

std::string BundledText() {
  absl::StatusOr<std::string> text = ReadFile(SourceDir() + "/data/gpl-3.txt");
  EXPECT_TRUE(text.ok()) << text.status();
  return text.ok() ? *text : "";
}

std::string TempDir() {
  std::string pattern = ::testing::TempDir() + "/pipetrain_tokenizer_XXXXXX";
  char* dir = mkdtemp(pattern.data());
  EXPECT_NE(dir, nullptr);
  return pattern;
}

TokenizerTrainOptions Options(int64_t vocab, const std::string& type = "bpe") {
  TokenizerTrainOptions o;
  o.vocab_size = vocab;
  o.model_type = type;
  return o;
}

// One model of the bundled text, trained once for the tests that only use it.
const std::string& BundledModel() {
  static const std::string* const model = [] {
    absl::StatusOr<std::string> m = TrainTokenizer(BundledText(), "gpl-3.txt", Options(300));
    EXPECT_TRUE(m.ok()) << m.status();
    return new std::string(m.ok() ? *m : "");
  }();
  return *model;
}

TEST(TokenizerTest, TrainedModelRoundTripsTheText) {
  if (!TokenizersAvailable()) GTEST_SKIP() << "no tokenizers in a sanitizer build";
  const std::string text = BundledText();
  absl::StatusOr<std::shared_ptr<const Tokenizer>> t = Tokenizer::FromModel(BundledModel(), "m");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ((*t)->vocab_size(), 300);
  absl::StatusOr<std::vector<int32_t>> ids = (*t)->Encode(text);
  ASSERT_TRUE(ids.ok()) << ids.status();
  // Pieces longer than a byte: fewer ids than bytes; every id in the vocabulary.
  EXPECT_LT(ids->size(), text.size() * 3 / 4);
  for (int32_t id : *ids) ASSERT_TRUE(id >= 0 && id < 300) << id;
  absl::StatusOr<std::string> back = (*t)->Decode(*ids);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, text);  // newlines and runs of spaces survive
  EXPECT_EQ((*t)->Piece(-1), "");
  EXPECT_EQ((*t)->Piece(300), "");
  EXPECT_FALSE((*t)->Piece(0).empty());
}

TEST(TokenizerTest, TrainingIsDeterministic) {
  if (!TokenizersAvailable()) GTEST_SKIP() << "no tokenizers in a sanitizer build";
  for (const char* type : {"bpe", "unigram"}) {
    absl::StatusOr<std::string> a = TrainTokenizer(BundledText(), "in", Options(200, type));
    absl::StatusOr<std::string> b = TrainTokenizer(BundledText(), "in", Options(200, type));
    ASSERT_TRUE(a.ok()) << a.status();
    ASSERT_TRUE(b.ok()) << b.status();
    EXPECT_EQ(*a, *b) << type;
  }
}

TEST(TokenizerTest, WrittenDirectoryLoadsAndIsByteIdentical) {
  if (!TokenizersAvailable()) GTEST_SKIP() << "no tokenizers in a sanitizer build";
  const std::string dir1 = TempDir() + "/tok", dir2 = TempDir() + "/tok";
  const std::string& model = BundledModel();
  ASSERT_TRUE(WriteTokenizerDirectory(dir1, model, Options(300), BundledText()).ok());
  ASSERT_TRUE(WriteTokenizerDirectory(dir2, model, Options(300), BundledText()).ok());
  for (const char* file : {kTokenizerModelFile, kTokenizerManifestFile}) {
    EXPECT_EQ(*ReadFile(JoinPath(dir1, file)), *ReadFile(JoinPath(dir2, file))) << file;
  }
  EXPECT_THAT(*ReadFile(JoinPath(dir1, kTokenizerManifestFile)), HasSubstr("\"vocab_size\": 300"));
  absl::StatusOr<std::shared_ptr<const Tokenizer>> from_dir = Tokenizer::Load(dir1);
  ASSERT_TRUE(from_dir.ok()) << from_dir.status();
  EXPECT_EQ((*from_dir)->model(), model);
  absl::StatusOr<std::shared_ptr<const Tokenizer>> from_file =
      Tokenizer::Load(JoinPath(dir1, kTokenizerModelFile));
  ASSERT_TRUE(from_file.ok()) << from_file.status();
  EXPECT_EQ((*from_file)->sha256(), (*from_dir)->sha256());
}

TEST(TokenizerTest, LoadErrorsNameThePath) {
  if (!TokenizersAvailable()) GTEST_SKIP() << "no tokenizers in a sanitizer build";
  const std::string dir = TempDir();
  absl::StatusOr<std::shared_ptr<const Tokenizer>> missing = Tokenizer::Load(dir + "/nope");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr(dir + "/nope"));

  absl::StatusOr<std::shared_ptr<const Tokenizer>> empty_dir = Tokenizer::Load(dir);
  EXPECT_EQ(empty_dir.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(empty_dir.status().message(), HasSubstr("holds no tokenizer.model"));

  ASSERT_TRUE(WriteFileAtomically(dir + "/text.model", "hello, this is no model\n").ok());
  absl::StatusOr<std::shared_ptr<const Tokenizer>> text = Tokenizer::Load(dir + "/text.model");
  EXPECT_EQ(text.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(text.status().message(), HasSubstr("text.model: not a SentencePiece model"));

  ASSERT_TRUE(WriteFileAtomically(dir + "/empty.model", "").ok());
  EXPECT_EQ(Tokenizer::Load(dir + "/empty.model").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Tokenizer::Load("/dev/zero").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(TokenizerTest, ChangedModelIsDataLoss) {
  if (!TokenizersAvailable()) GTEST_SKIP() << "no tokenizers in a sanitizer build";
  const std::string dir = TempDir() + "/tok";
  ASSERT_TRUE(WriteTokenizerDirectory(dir, BundledModel(), Options(300), "x").ok());
  absl::StatusOr<std::string> other = TrainTokenizer(BundledText(), "in", Options(100));
  ASSERT_TRUE(other.ok());
  ASSERT_TRUE(WriteFileAtomically(JoinPath(dir, kTokenizerModelFile), *other).ok());
  absl::StatusOr<std::shared_ptr<const Tokenizer>> t = Tokenizer::Load(dir);
  EXPECT_EQ(t.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(t.status().message(), HasSubstr("differs from the tokenizer.json's"));

  ASSERT_TRUE(WriteFileAtomically(JoinPath(dir, kTokenizerManifestFile), "{}").ok());
  EXPECT_EQ(Tokenizer::Load(dir).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(TokenizerTest, DecodeRefusesIdsOutsideTheVocabulary) {
  if (!TokenizersAvailable()) GTEST_SKIP() << "no tokenizers in a sanitizer build";
  absl::StatusOr<std::shared_ptr<const Tokenizer>> t = Tokenizer::FromModel(BundledModel(), "m");
  ASSERT_TRUE(t.ok());
  const std::vector<int32_t> ids = {5, 300};
  absl::StatusOr<std::string> text = (*t)->Decode(ids);
  EXPECT_EQ(text.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(text.status().message(), HasSubstr("token id 300 at position 1"));
}

TEST(TokenizerTest, TrainingErrors) {
  if (!TokenizersAvailable()) GTEST_SKIP() << "no tokenizers in a sanitizer build";
  EXPECT_THAT(TrainTokenizer("", "in.txt", Options(100)).status().message(),
              HasSubstr("in.txt: is empty"));
  EXPECT_THAT(TrainTokenizer("\n\n", "in.txt", Options(100)).status().message(),
              HasSubstr("holds only newlines"));
  absl::StatusOr<std::string> big = TrainTokenizer(BundledText(), "gpl", Options(50000, "unigram"));
  EXPECT_EQ(big.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(big.status().message(), HasSubstr("Vocabulary size too high (50000)"));
  EXPECT_THAT(big.status().message(), ::testing::Not(HasSubstr("./src/")));
  absl::StatusOr<std::string> small = TrainTokenizer(BundledText(), "gpl", Options(20));
  EXPECT_EQ(small.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(small.status().message(), HasSubstr("gpl: cannot train a bpe tokenizer"));
  EXPECT_THAT(TrainTokenizer("abc", "in", Options(4)).status().message(),
              HasSubstr("--vocab-size must be in [5, "));
  EXPECT_THAT(TrainTokenizer("abc", "in", Options(100, "word")).status().message(),
              HasSubstr("--model-type must be bpe or unigram"));
  TokenizerTrainOptions coverage = Options(100);
  coverage.character_coverage = 0;
  EXPECT_THAT(TrainTokenizer("abc", "in", coverage).status().message(),
              HasSubstr("--character-coverage must be in (0, 1]"));
  const std::string long_line(kMaxTrainLineBytes + 1, 'a');
  EXPECT_THAT(TrainTokenizer("x\n" + long_line, "in", Options(100)).status().message(),
              HasSubstr("in:2: line of 1048577 bytes"));
}

TEST(TokenizerTest, UnwritableOutputDirectory) {
  if (!TokenizersAvailable()) GTEST_SKIP() << "no tokenizers in a sanitizer build";
  if (geteuid() == 0) GTEST_SKIP() << "root writes anywhere";
  const std::string dir = TempDir();
  ASSERT_EQ(chmod(dir.c_str(), 0500), 0);
  const absl::Status s =
      WriteTokenizerDirectory(dir + "/tok", BundledModel(), Options(300), "text");
  chmod(dir.c_str(), 0700);
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr(dir + "/tok"));
}

TEST(TokenizerTest, OutputPathThatIsAFile) {
  if (!TokenizersAvailable()) GTEST_SKIP() << "no tokenizers in a sanitizer build";
  const std::string dir = TempDir();
  ASSERT_TRUE(WriteFileAtomically(dir + "/file", "x").ok());
  const absl::Status s = WriteTokenizerDirectory(dir + "/file", BundledModel(), Options(300), "t");
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr(dir + "/file"));
}

}  // namespace
}  // namespace pipetrain::io
