#include "common/schedule/validator.h"

#include <string>
#include <vector>

#include "common/schedule/generator.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pipetrain::schedule {
namespace {

using ::testing::HasSubstr;

constexpr Op F = Op::kForward;
constexpr Op B = Op::kBackward;
constexpr Op I = Op::kInputGrad;
constexpr Op W = Op::kWeightGrad;

Plan Generated(ScheduleKind kind, int s, int m, int v) {
  absl::StatusOr<Plan> plan = GenerateSchedule({kind, s, m, v});
  EXPECT_TRUE(plan.ok()) << plan.status();
  return plan.ok() ? *plan : Plan{};
}

// A linear plan written by hand.
Plan Linear(int m, std::vector<std::vector<Action>> actions) {
  Plan plan;
  plan.kind = ScheduleKind::kOneFOneB;
  plan.microbatches = m;
  plan.placement = Placement{PlacementKind::kLinear, static_cast<int>(actions.size()), 1};
  plan.actions = std::move(actions);
  return plan;
}

std::string Error(const Plan& plan) {
  absl::Status status = ValidatePlan(plan);
  EXPECT_FALSE(status.ok());
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  return std::string(status.message());
}

TEST(ValidatorTest, AcceptsAHandWrittenOneFOneB) {
  const Plan plan = Linear(2, {{{F, 0, 0}, {F, 1, 0}, {B, 0, 0}, {B, 1, 0}},
                               {{F, 0, 1}, {B, 0, 1}, {F, 1, 1}, {B, 1, 1}}});
  EXPECT_TRUE(ValidatePlan(plan).ok()) << ValidatePlan(plan);
}

TEST(ValidatorTest, MissingForward) {
  Plan plan = Generated(ScheduleKind::kOneFOneB, 2, 2, 1);
  plan.actions[1].erase(plan.actions[1].begin());  // F(0, 1).
  EXPECT_EQ(Error(plan), "rank 1: missing F(mb=0, chunk=1)");
}

TEST(ValidatorTest, MissingBackward) {
  Plan plan = Generated(ScheduleKind::kOneFOneB, 2, 2, 1);
  plan.actions[0].pop_back();  // B(1, 0).
  EXPECT_EQ(Error(plan), "rank 0: missing the backward of (mb=1, chunk=0): needs B or I and W");
}

TEST(ValidatorTest, MissingWeightGradient) {
  Plan plan = Generated(ScheduleKind::kZbH1, 2, 2, 1);
  ASSERT_EQ(plan.actions[0].back(), (Action{W, 1, 0}));
  plan.actions[0].pop_back();
  EXPECT_EQ(Error(plan), "rank 0: missing W(mb=1, chunk=0) for the I at position 4");
}

TEST(ValidatorTest, WeightGradientWithoutInputGradient) {
  // Rank 0 runs the full B(1, 0) and also a stray W(1, 0).
  Plan plan = Linear(2, {{{F, 0, 0}, {F, 1, 0}, {B, 0, 0}, {B, 1, 0}, {W, 1, 0}},
                         {{F, 0, 1}, {B, 0, 1}, {F, 1, 1}, {B, 1, 1}}});
  EXPECT_EQ(Error(plan),
            "rank 0 position 3: B(mb=1, chunk=0) repeats the backward already split into "
            "W(mb=1, chunk=0) at position 4; use either B or I and W");
  plan.actions[0].erase(plan.actions[0].begin() + 3);  // Drop the B: W alone remains.
  EXPECT_EQ(Error(plan), "rank 0 position 3: W(mb=1, chunk=0) has no I(mb=1, chunk=0) before it");
}

TEST(ValidatorTest, Duplicate) {
  Plan plan = Generated(ScheduleKind::kGPipe, 2, 2, 1);
  plan.actions[0].push_back({F, 0, 0});
  EXPECT_EQ(Error(plan),
            "rank 0 position 4: F(mb=0, chunk=0) is a duplicate (first at position 0)");
}

TEST(ValidatorTest, WrongOwnerAndRanges) {
  Plan plan = Generated(ScheduleKind::kGPipe, 2, 2, 1);
  plan.actions[0][0].chunk = 1;
  EXPECT_EQ(Error(plan),
            "rank 0 position 0: F(mb=0, chunk=1) runs chunk 1, which the linear placement puts on "
            "rank 1");
  plan = Generated(ScheduleKind::kGPipe, 2, 2, 1);
  plan.actions[1][2].mb = 2;
  EXPECT_EQ(Error(plan),
            "rank 1 position 2: B(mb=2, chunk=1) has micro-batch 2 out of range [0, 2)");
  plan = Generated(ScheduleKind::kGPipe, 2, 2, 1);
  plan.actions[1][2].chunk = -1;
  EXPECT_EQ(Error(plan), "rank 1 position 2: B(mb=0, chunk=-1) has chunk -1 out of range [0, 2)");
}

TEST(ValidatorTest, V_ShapeOwnership) {
  Plan plan = Generated(ScheduleKind::kZbV, 2, 4, 2);
  // Chunk 3 is rank 0's upper chunk; put one of its actions on rank 1.
  plan.actions[1].push_back({F, 0, 3});
  EXPECT_EQ(Error(plan),
            "rank 1 position 24: F(mb=0, chunk=3) runs chunk 3, which the v-shape placement puts "
            "on rank 0");
}

// Bidirectional DualPipe: micro-batches 0..M/2-1 pass the down copy (chunks 0..S-1), the others
// the up copy (chunks S..2S-1); an action off its micro-batch's route is refused, and a route's
// first chunk needs no activation, its last no input gradient.
TEST(ValidatorTest, BidirectionalRoutes) {
  Plan plan = Generated(ScheduleKind::kDualPipe, 2, 2, 2);
  EXPECT_TRUE(ValidatePlan(plan).ok()) << ValidatePlan(plan);
  // Micro-batch 0 goes down: chunk 3 (rank 0's up-copy chunk) is not on its route.
  plan.actions[0].push_back({F, 0, 3});
  EXPECT_EQ(Error(plan),
            "rank 0 position 5: F(mb=0, chunk=3) runs chunk 3, which micro-batch 0 does not "
            "pass through: the bidirectional placement routes it through chunks [0, 2)");
  // A missing action on the up route is named with its owner.
  Plan missing = Generated(ScheduleKind::kDualPipe, 2, 2, 2);
  missing.actions[1].erase(missing.actions[1].begin());  // F(mb=1, chunk=2), the up entry.
  EXPECT_EQ(Error(missing), "rank 1: missing F(mb=1, chunk=2)");
}

TEST(ValidatorTest, BackwardBeforeForward) {
  Plan plan = Generated(ScheduleKind::kOneFOneB, 2, 2, 1);
  std::swap(plan.actions[1][0], plan.actions[1][1]);  // B(0,1) F(0,1) F(1,1) B(1,1).
  EXPECT_EQ(Error(plan), "rank 1 position 0: B(mb=0, chunk=1) runs before its F at position 1");
}

TEST(ValidatorTest, WeightGradientBeforeInputGradient) {
  Plan plan = Generated(ScheduleKind::kZbH1, 2, 2, 1);
  // Rank 1: F0 I0 F1 I1 W0 W1 -> F0 W0 F1 I1 I0 W1.
  ASSERT_EQ(plan.actions[1][1], (Action{I, 0, 1}));
  ASSERT_EQ(plan.actions[1][4], (Action{W, 0, 1}));
  std::swap(plan.actions[1][1], plan.actions[1][4]);
  EXPECT_EQ(Error(plan), "rank 1 position 1: W(mb=0, chunk=1) runs before its I at position 4");
}

TEST(ValidatorTest, AccumulationOrder) {
  Plan plan = Generated(ScheduleKind::kGPipe, 2, 3, 1);
  // Rank 0: F0 F1 F2 B0 B1 B2 -> F0 F1 F2 B0 B2 B1.
  std::swap(plan.actions[0][4], plan.actions[0][5]);
  EXPECT_EQ(Error(plan),
            "rank 0 position 5: B(mb=1, chunk=0) accumulates weight gradients after "
            "B(mb=2, chunk=0) at position 4; per chunk, B and W must run in increasing "
            "micro-batch order");
  // Mixed: a split W after a later full B.
  Plan zb = Linear(2, {{{F, 0, 0}, {F, 1, 0}, {I, 0, 0}, {B, 1, 0}, {W, 0, 0}}});
  EXPECT_EQ(Error(zb),
            "rank 0 position 4: W(mb=0, chunk=0) accumulates weight gradients after "
            "B(mb=1, chunk=0) at position 3; per chunk, B and W must run in increasing "
            "micro-batch order");
}

TEST(ValidatorTest, DeadlockNamesEveryBlockedWorker) {
  // Rank 0 runs its backward before the second forward, rank 1 wants both forwards first.
  const Plan plan = Linear(2, {{{F, 0, 0}, {B, 0, 0}, {F, 1, 0}, {B, 1, 0}},
                               {{F, 0, 1}, {F, 1, 1}, {B, 0, 1}, {B, 1, 1}}});
  EXPECT_TRUE(CheckPlanStructure(plan).ok());
  EXPECT_EQ(Error(plan),
            "plan deadlocks under in-order execution with non-blocking sends: 2 of 2 ranks "
            "cannot finish: rank 0 blocked at position 1 on B(mb=0, chunk=0), waiting for the "
            "input gradient of B or I(mb=0, chunk=1) on rank 1; rank 1 blocked at position 1 "
            "on F(mb=1, chunk=1), waiting for the activation of F(mb=1, chunk=0) on rank 0");
}

TEST(ValidatorTest, DeadlockInAThreeWorkerCycle) {
  // 1F1B on 3 ranks where the middle rank skips its warm-up: rank 1 waits for a gradient
  // that rank 2 only sends after a forward rank 1 has not sent yet. Rank 0 then waits on 1.
  Plan plan = Generated(ScheduleKind::kOneFOneB, 3, 3, 1);
  plan.actions[1] = {{F, 0, 1}, {B, 0, 1}, {F, 1, 1}, {B, 1, 1}, {F, 2, 1}, {B, 2, 1}};
  plan.actions[2] = {{F, 0, 2}, {F, 1, 2}, {B, 0, 2}, {B, 1, 2}, {F, 2, 2}, {B, 2, 2}};
  const std::string message = Error(plan);
  EXPECT_THAT(message, HasSubstr("3 of 3 ranks cannot finish"));
  EXPECT_THAT(message, HasSubstr("rank 0 blocked at position 3 on B(mb=0, chunk=0), waiting for "
                                 "the input gradient of B or I(mb=0, chunk=1) on rank 1"));
  EXPECT_THAT(message, HasSubstr("rank 1 blocked at position 1 on B(mb=0, chunk=1), waiting for "
                                 "the input gradient of B or I(mb=0, chunk=2) on rank 2"));
  EXPECT_THAT(message, HasSubstr("rank 2 blocked at position 1 on F(mb=1, chunk=2), waiting for "
                                 "the activation of F(mb=1, chunk=1) on rank 1"));
}

TEST(ValidatorTest, PlanShape) {
  Plan plan = Generated(ScheduleKind::kOneFOneB, 2, 2, 1);
  plan.actions.pop_back();
  EXPECT_EQ(Error(plan), "plan has 1 action lists for 2 ranks");
  plan = Generated(ScheduleKind::kOneFOneB, 2, 2, 1);
  plan.microbatches = 0;
  EXPECT_EQ(Error(plan), "plan microbatches must be >= 1 (got 0)");
  plan = Generated(ScheduleKind::kOneFOneB, 2, 2, 1);
  plan.microbatches = 1 << 30;  // Refused before any per-(mb, chunk) table is allocated.
  EXPECT_EQ(Error(plan), "plan has 2147483648 (micro-batch, chunk) pairs; the limit is 16777216");
  plan = Generated(ScheduleKind::kOneFOneB, 2, 2, 1);
  plan.placement.virtual_stages = 2;
  EXPECT_EQ(Error(plan),
            "plan placement: the linear placement holds one chunk per rank: virtual stages must "
            "be 1 (got 2)");
}

// Structure checks come first, so a plan that both deadlocks and misses an action reports the
// missing action.
TEST(ValidatorTest, StructureBeforeDeadlock) {
  Plan plan =
      Linear(2, {{{F, 0, 0}, {B, 0, 0}, {F, 1, 0}}, {{F, 0, 1}, {F, 1, 1}, {B, 0, 1}, {B, 1, 1}}});
  EXPECT_EQ(Error(plan), "rank 0: missing the backward of (mb=1, chunk=0): needs B or I and W");
}

}  // namespace
}  // namespace pipetrain::schedule
