#include "common/model/decode_window.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pipetrain::model {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Appends run one position each until the window is full; the next slides it to its last
// ceil(T/2) - 1 tokens and the new one, restarting from position 0.
TEST(DecodeWindowTest, AppendsThenSlides) {
  DecodeWindow window(5, 10);
  auto run = window.Start(std::vector<int64_t>{1, 2, 3});
  ASSERT_TRUE(run.ok());
  EXPECT_EQ(run->position, 0);
  EXPECT_TRUE(run->restart);
  EXPECT_THAT(window.RunTokens(*run), ElementsAre(1, 2, 3));
  run = window.Append(4);
  ASSERT_TRUE(run.ok());
  EXPECT_EQ(run->position, 3);
  EXPECT_FALSE(run->restart);
  EXPECT_THAT(window.RunTokens(*run), ElementsAre(4));
  ASSERT_TRUE(window.Append(5).ok());
  run = window.Append(6);  // full (5 tokens): keep ceil(5/2) - 1 = 2, then 6.
  ASSERT_TRUE(run.ok());
  EXPECT_TRUE(run->restart);
  EXPECT_EQ(run->position, 0);
  EXPECT_THAT(window.window(), ElementsAre(4, 5, 6));
  EXPECT_EQ(window.slides(), 1);
}

TEST(DecodeWindowTest, ALongPromptKeepsItsLastContextTokens) {
  DecodeWindow window(3, 10);
  ASSERT_TRUE(window.Start(std::vector<int64_t>{1, 2, 3, 4, 5}).ok());
  EXPECT_THAT(window.window(), ElementsAre(3, 4, 5));
}

TEST(DecodeWindowTest, BadTokensAreRefused) {
  DecodeWindow window(4, 10);
  EXPECT_EQ(window.Append(1).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(window.Start(std::vector<int64_t>{}).status().message(), HasSubstr("empty"));
  EXPECT_THAT(window.Start(std::vector<int64_t>{1, 10}).status().message(),
              HasSubstr("prompt token 1 is 10, outside the vocabulary [0, 10)"));
  EXPECT_FALSE(window.started());
  ASSERT_TRUE(window.Start(std::vector<int64_t>{1}).ok());
  EXPECT_THAT(window.Append(-1).status().message(), HasSubstr("token -1 is outside"));
  EXPECT_THAT(window.window(), ElementsAre(1));
}

}  // namespace
}  // namespace pipetrain::model
