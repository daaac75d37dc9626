// CheckActionList on its own, for a worker holding several chunks (the single-chunk contract is
// also exercised through StepExecutor::RunStep in executor_test.cc).
#include "server/worker/action_list.h"

#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pipetrain::worker {
namespace {

using schedule::Action;
using schedule::Op;

constexpr Op F = Op::kForward, B = Op::kBackward, I = Op::kInputGrad, W = Op::kWeightGrad;

// A worker holding global chunks 1 and 3 of 4 (local chunks 0 and 1).
const std::vector<int> kLocalOfChunk = {-1, 0, -1, 1};

TEST(ActionListTest, ValidListReturnsTheMicrobatchCount) {
  // Weight gradients are ordered per chunk: chunk 3's mb 0 after chunk 1's mb 1 is fine.
  const std::vector<Action> actions = {
      {F, 0, 1}, {F, 1, 1}, {F, 0, 3}, {F, 1, 3}, {B, 0, 1}, {I, 1, 1},
      {W, 1, 1}, {I, 0, 3}, {I, 1, 3}, {W, 0, 3}, {W, 1, 3},
  };
  absl::StatusOr<int> m = CheckActionList(actions, kLocalOfChunk);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(*m, 2);
}

TEST(ActionListTest, ViolationsAreInvalidArgumentNamingTheActionOrGlobalChunk) {
  struct Case {
    std::vector<Action> actions;
    const char* message;
  };
  const Case cases[] = {
      {{}, "the action list is empty"},
      {{{F, 0, 1}, {F, 0, 2}}, "position 1 F(mb=0, chunk=2): chunk 2 is not held by this worker"},
      {{{F, 0, 4}}, "position 0 F(mb=0, chunk=4): chunk 4 is not held by this worker"},
      {{{F, 0, 1}, {F, 2, 1}}, "position 1 F(mb=2, chunk=1): micro-batch 2 is outside [0, 2)"},
      {{{F, 0, 1}, {B, 0, 1}},
       "no F(mb=0, chunk=3) although the actions cover micro-batches [0, 1)"},
      {{{F, 0, 1}, {B, 0, 1}, {F, 0, 3}, {I, 0, 3}},
       "no W(mb=0, chunk=3) after its I at position 3"},
      {{{F, 0, 1}, {F, 1, 1}, {F, 0, 3}, {F, 1, 3}, {B, 0, 3}, {B, 1, 1}, {B, 0, 1}},
       "position 6 B(mb=0, chunk=1): accumulates weight gradients after micro-batch 1 did at "
       "position 5; they must accumulate in increasing micro-batch order for bitwise equality"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<int> m = CheckActionList(c.actions, kLocalOfChunk);
    ASSERT_FALSE(m.ok()) << c.message;
    EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument) << c.message;
    EXPECT_EQ(m.status().message(), c.message);
  }
}

// Two copies of 2 stages (dualpipe, chunks 0..3): rank 0 holds chunk 0 (the down copy's stage 0)
// and chunk 3 (the up copy's stage 1). Micro-batches [0, M/2) run down, [M/2, M) up: each chunk
// needs (and may have) only the micro-batches of its half.
TEST(ActionListTest, TwoCopiesCoverEachMicrobatchOnItsRouteOnly) {
  const std::vector<int> local_of_chunk = {0, -1, -1, 1};
  const absl::StatusOr<ChunkRoutes> routes = ChunkRoutes::TwoCopies(4);
  ASSERT_TRUE(routes.ok()) << routes.status();
  const std::vector<Action> ok = {{F, 0, 0}, {F, 1, 3}, {B, 1, 3}, {B, 0, 0}};
  absl::StatusOr<int> m = CheckActionList(ok, local_of_chunk, &*routes);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(*m, 2);
  // Without the routes the same list lacks chunk 3's micro-batch 0.
  EXPECT_EQ(CheckActionList(ok, local_of_chunk).status().code(),
            absl::StatusCode::kInvalidArgument);

  const std::vector<Action> off_route = {{F, 0, 0}, {F, 0, 3}, {F, 1, 3}, {B, 1, 3}, {B, 0, 0}};
  m = CheckActionList(off_route, local_of_chunk, &*routes);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().message(),
            "position 1 F(mb=0, chunk=3): is not on its micro-batch's route: micro-batch 0 of 2 "
            "runs through chunks 0..1");
  const std::vector<Action> odd = {{F, 0, 0}, {F, 2, 3}, {F, 1, 3}};
  EXPECT_THAT(CheckActionList(odd, local_of_chunk, &*routes).status().message(),
              ::testing::HasSubstr("cover 3 micro-batches; two copies of the stages (dualpipe) "
                                   "need an even number"));
  const std::vector<Action> missing = {{F, 0, 0}, {B, 0, 0}, {F, 1, 3}};
  EXPECT_EQ(CheckActionList(missing, local_of_chunk, &*routes).status().message(),
            "no B or I(mb=1, chunk=3) after its F at position 2");
}

TEST(ActionListTest, ActionAtNamesThePositionAndTheAction) {
  EXPECT_EQ(ActionAt(7, Action{I, 2, 5}), "position 7 I(mb=2, chunk=5)");
}

}  // namespace
}  // namespace pipetrain::worker
