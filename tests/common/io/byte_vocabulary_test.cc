#include "common/io/byte_vocabulary.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pipetrain::io {
namespace {

using ::testing::HasSubstr;

TEST(ByteVocabularyTest, EncodesAndDecodesByTheVocabularysOrder) {
  absl::StatusOr<ByteVocabulary> v = ByteVocabulary::Create("\n !abc");
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->size(), 6);
  absl::StatusOr<std::vector<int64_t>> ids = v->Encode("a cab!\n");
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_EQ(*ids, (std::vector<int64_t>{3, 1, 5, 3, 4, 2, 0}));
  EXPECT_EQ(*v->Decode(*ids), "a cab!\n");
  EXPECT_TRUE(v->Encode("")->empty());
}

TEST(ByteVocabularyTest, RefusesWhatItDoesNotHold) {
  absl::StatusOr<ByteVocabulary> v = ByteVocabulary::Create("abc");
  ASSERT_TRUE(v.ok());
  absl::Status s = v->Encode("abz").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(),
              HasSubstr("byte 0x7a ('z') at offset 2 is not in the model's vocabulary"));
  s = v->Encode("a\xc3\xa9").status();
  EXPECT_THAT(s.message(), HasSubstr("byte 0xc3 at offset 1"));
  EXPECT_EQ(v->Decode({0, 3}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ByteVocabulary::Create("").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(ByteVocabulary::Create("aba").status().message(), HasSubstr("twice"));
}

}  // namespace
}  // namespace pipetrain::io
