#include "server/coordinator/job_isa.h"

#include <vector>

#include "common/job/job_spec.h"
#include "gtest/gtest.h"
#include "pipetrain/v1/worker_control.pb.h"

namespace pipetrain::coordinator {
namespace {

v1::RegisterWorker Worker(const std::string& name, std::vector<std::string> levels) {
  v1::RegisterWorker w;
  w.set_name(name);
  for (const std::string& l : levels) w.add_isa_levels(l);
  return w;
}

TEST(JobIsaTest, WorkerLevelsAreSortedUnknownNamesDroppedAndNoneMeansTheLowestBuilt) {
  EXPECT_EQ(WorkerIsas(Worker("a", {"x86-64-v4", "x86-64-v3", "x86-64-v9"})),
            (std::vector<math::Isa>{math::Isa::kX86_64_V3, math::Isa::kX86_64_V4}));
  EXPECT_EQ(WorkerIsas(Worker("old", {})), std::vector<math::Isa>{math::BuiltIsas().front()});
  EXPECT_TRUE(WorkerRunsIsa(Worker("a", {"x86-64-v3"}), math::Isa::kX86_64_V3));
  EXPECT_FALSE(WorkerRunsIsa(Worker("a", {"x86-64-v3"}), math::Isa::kX86_64_V4));
}

TEST(JobIsaTest, TheJobRunsAtTheHighestLevelEveryWorkerRuns) {
  const v1::RegisterWorker fast = Worker("fast", {"x86-64-v3", "x86-64-v4"});
  const v1::RegisterWorker avx2 = Worker("avx2", {"x86-64-v3"});
  v1::JobSpec spec;
  absl::StatusOr<math::Isa> both_fast = ChooseJobIsa(spec, {&fast, &fast});
  ASSERT_TRUE(both_fast.ok()) << both_fast.status();
  EXPECT_EQ(*both_fast, math::Isa::kX86_64_V4);
  absl::StatusOr<math::Isa> mixed = ChooseJobIsa(spec, {&fast, &avx2});
  ASSERT_TRUE(mixed.ok()) << mixed.status();
  EXPECT_EQ(*mixed, math::Isa::kX86_64_V3);
}

TEST(JobIsaTest, AForcedLevelNeedsEveryWorkerToRunIt) {
  const v1::RegisterWorker fast = Worker("fast", {"x86-64-v3", "x86-64-v4"});
  const v1::RegisterWorker avx2 = Worker("avx2", {"x86-64-v3"});
  v1::JobSpec spec;
  spec.set_isa("x86-64-v3");
  absl::StatusOr<math::Isa> forced = ChooseJobIsa(spec, {&fast, &fast});
  ASSERT_TRUE(forced.ok());
  EXPECT_EQ(*forced, math::Isa::kX86_64_V3);
  spec.set_isa("x86-64-v4");
  absl::StatusOr<math::Isa> refused = ChooseJobIsa(spec, {&fast, &avx2});
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(refused.status().message(),
            "isa x86-64-v4: worker 'avx2' cannot run it (it runs x86-64-v3)");
  spec.set_isa("avx2");
  EXPECT_EQ(job::CheckJobIsa(spec).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ChooseJobIsa(spec, {&fast}).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pipetrain::coordinator
