// JobShape: positions, the placement of workers on ranks and each rank's speed.
#include "server/coordinator/job_shape.h"

#include <optional>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pipetrain::coordinator {
namespace {

using ::testing::ElementsAre;

TEST(JobShapeTest, PositionsAreReplicaTimesStagesPlusRank) {
  const JobShape shape{3, 2};
  EXPECT_EQ(shape.positions(), 6);
  EXPECT_EQ(shape.Position(1, 2), 5);
  EXPECT_EQ(shape.RankOf(5), 2);
  EXPECT_EQ(shape.ReplicaOf(5), 1);
  EXPECT_EQ(shape.RankOf(2), 2);
  EXPECT_EQ(shape.ReplicaOf(2), 0);
  EXPECT_EQ(shape.ToString(), "3 stages x 2 replicas");
  EXPECT_EQ((JobShape{1, 1}).ToString(), "1 stage");
  EXPECT_EQ((JobShape{2, 1}).ToString(), "2 stages");
}

TEST(JobShapeTest, ShapeOfASpecTakesZeroReplicasAsOne) {
  v1::JobSpec spec;
  spec.set_stages(2);
  EXPECT_EQ(ShapeOf(spec), (JobShape{2, 1}));
  spec.set_replicas(4);
  EXPECT_EQ(ShapeOf(spec), (JobShape{2, 4}));
}

TEST(JobShapeTest, OneReplicaKeepsTheWorkersInTheirOrder) {
  EXPECT_THAT(ArrangePositions({1, 9, 5}, JobShape{3, 1}), ElementsAre(0, 1, 2));
}

TEST(JobShapeTest, TheFastestWorkersShareARankSoNoFastWorkerWaitsForASlowOne) {
  // Two fast (10) and two slow (1) workers, 2 stages x 2 replicas: the fast pair takes rank 0
  // and the slow pair rank 1 (slowest per rank 10 and 1), where pairing each fast worker with a
  // slow one would leave both ranks at 1.
  const std::vector<double> speeds = {10, 1, 10, 1};
  const JobShape shape{2, 2};
  const std::vector<int> placed = ArrangePositions(speeds, shape);
  // Rank 0: workers 0 and 2 (replicas 0 and 1 in their order); rank 1: workers 1 and 3.
  EXPECT_THAT(placed, ElementsAre(0, 1, 2, 3));
  std::vector<double> by_position;
  for (int w : placed) by_position.push_back(speeds[w]);
  EXPECT_THAT(RankSpeeds(by_position, shape), ElementsAre(10, 1));
}

TEST(JobShapeTest, EqualSpeedsGroupConsecutiveWorkersByRank) {
  // Ties keep the workers' order: workers 0 and 1 hold rank 0, 2 and 3 rank 1.
  EXPECT_THAT(ArrangePositions({5, 5, 5, 5}, JobShape{2, 2}), ElementsAre(0, 2, 1, 3));
}

TEST(JobShapeTest, ARanksSpeedIsItsSlowestReplica) {
  // Positions: replica 0 = {8, 4}, replica 1 = {2, 6}.
  EXPECT_THAT(RankSpeeds({8, 4, 2, 6}, JobShape{2, 2}), ElementsAre(2, 4));
  EXPECT_THAT(RankSpeeds({8, 4}, JobShape{2, 1}), ElementsAre(8, 4));
}

v1::JobSpec Spec(int stages, int max_stages, int replicas = 0, int max_replicas = 0,
                 int microbatches = 0) {
  v1::JobSpec spec;
  spec.set_stages(stages);
  spec.set_max_stages(max_stages);
  spec.set_replicas(replicas);
  spec.set_max_replicas(max_replicas);
  spec.set_microbatches(microbatches);
  return spec;
}

TEST(JobShapeTest, GrowsToTheMostStagesTheIdleWorkersAllowUpToMaxStages) {
  EXPECT_EQ(NextShape(Spec(2, 3, 0), 1), (JobShape{3, 1}));
  EXPECT_EQ(NextShape(Spec(2, 3, 0), 5), (JobShape{3, 1}));  // not beyond max_stages.
  EXPECT_EQ(NextShape(Spec(2, 8, 0), 3), (JobShape{5, 1}));
}

TEST(JobShapeTest, DoesNotGrowWithoutIdleWorkersOrRoom) {
  EXPECT_EQ(NextShape(Spec(2, 3, 0), 0), std::nullopt);
  EXPECT_EQ(NextShape(Spec(2, 0, 0), 4), std::nullopt);  // max_stages 0: never.
  EXPECT_EQ(NextShape(Spec(3, 3, 0), 4), std::nullopt);  // at max_stages already.
}

TEST(JobShapeTest, AStageMoreTakesOneWorkerPerReplica) {
  EXPECT_EQ(NextShape(Spec(2, 4, 2), 1), std::nullopt);
  EXPECT_EQ(NextShape(Spec(2, 4, 2), 3), (JobShape{3, 2}));
  EXPECT_EQ(NextShape(Spec(2, 4, 2), 4), (JobShape{4, 2}));
}

TEST(JobShapeTest, ToStringNamesReplicasOnlyWhenThereAreSeveral) {
  EXPECT_EQ((JobShape{3, 1}).ToString(), "3 stages");
  EXPECT_EQ((JobShape{1, 1}).ToString(), "1 stage");
  EXPECT_EQ((JobShape{3, 2}).ToString(), "3 stages x 2 replicas");
  EXPECT_EQ(ShapeOf(Spec(2, 0, 0)).positions(), 2);
}

// With max_replicas the job doubles its replicas first, as far as the idle workers complete whole
// pipelines and the step's gradient tree has shares for them; only then does it add stages.
TEST(JobShapeTest, GrowsReplicasFirstWhereTheTreeSupportsThem) {
  EXPECT_EQ(NextShape(Spec(2, 0, 1, 4, 8), 2), (JobShape{2, 2}));
  EXPECT_EQ(NextShape(Spec(2, 0, 1, 4, 8), 6), (JobShape{2, 4}));
  EXPECT_EQ(NextShape(Spec(2, 0, 2, 4, 8), 3), std::nullopt);      // 4 replicas need 8 workers.
  EXPECT_EQ(NextShape(Spec(2, 3, 2, 4, 8), 3), (JobShape{3, 2}));  // so a stage more instead.
  EXPECT_EQ(NextShape(Spec(2, 4, 1, 4, 6), 6), (JobShape{2, 2}));  // M = 6: shares for R <= 2.
  EXPECT_EQ(NextShape(Spec(2, 4, 2, 4, 6), 4), (JobShape{4, 2}));
  EXPECT_EQ(NextShape(Spec(2, 4, 1, 1, 8), 2), (JobShape{4, 1}));  // max_replicas 1: stages.
}

}  // namespace
}  // namespace pipetrain::coordinator
