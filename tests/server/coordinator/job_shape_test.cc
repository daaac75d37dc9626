#include "server/coordinator/job_shape.h"

#include <optional>

#include "gtest/gtest.h"

namespace pipetrain::coordinator {
namespace {

v1::JobSpec Spec(int stages, int max_stages, int replicas = 0) {
  v1::JobSpec spec;
  spec.set_stages(stages);
  spec.set_max_stages(max_stages);
  spec.set_replicas(replicas);
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

TEST(JobShapeTest, ShapeTextNamesReplicasOnlyWhenThereAreSeveral) {
  EXPECT_EQ(ShapeText(JobShape{3, 1}), "3 stages");
  EXPECT_EQ(ShapeText(JobShape{1, 1}), "1 stage");
  EXPECT_EQ(ShapeText(JobShape{3, 2}), "2 replicas x 3 stages");
  EXPECT_EQ(ShapeOf(Spec(2, 0, 0)).workers(), 2);
}

}  // namespace
}  // namespace pipetrain::coordinator
