// `pipetrain plan`'s options, its choice for --plan auto and its table (client/cli/plan_command.h).
#include "client/cli/plan_command.h"

#include <string>

#include "gtest/gtest.h"

namespace pipetrain::cli {
namespace {

plan::PlanChoice Choice(int stages, schedule::ScheduleKind kind, int m, double sps, bool fits,
                        double peak) {
  plan::PlanChoice p;
  p.stages = stages;
  p.kind = kind;
  p.microbatches = m;
  p.samples_per_second = sps;
  p.step_seconds = 64 / sps;
  p.bubble = 0.125;
  p.imbalance = 1.04;
  p.fits_memory = fits;
  p.peak_memory_bytes.assign(stages, peak);
  return p;
}

PlanResult Result() {
  PlanResult r;
  r.batch = 64;
  r.local_gflops = 100;
  r.workers = {{"a", 100, 1 << 30}, {"b", 100, 1 << 30}};
  r.plans = {Choice(2, schedule::ScheduleKind::kZbH1, 16, 2400, true, 3 << 20),
             Choice(2, schedule::ScheduleKind::kOneFOneB, 1, 420, true, 1 << 20)};
  return r;
}

TEST(PlanCommandTest, BestPlanIsTheFirstThatFits) {
  absl::StatusOr<plan::PlanChoice> best = BestPlan(Result());
  ASSERT_TRUE(best.ok()) << best.status();
  EXPECT_EQ(best->kind, schedule::ScheduleKind::kZbH1);
  EXPECT_EQ(best->microbatches, 16);
}

// --plan auto skips plans of more replicas than it may run (kAutoPlanMaxReplicas); the table
// lists them with their reduction.
TEST(PlanCommandTest, BestPlanKeepsToTheReplicasItMayRun) {
  PlanResult r = Result();
  plan::PlanChoice two = Choice(1, schedule::ScheduleKind::kGPipe, 16, 3000, true, 1 << 20);
  two.replicas = 2;
  two.reduction_seconds = 1.5e-3;
  r.plans.insert(r.plans.begin(), two);
  absl::StatusOr<plan::PlanChoice> best = BestPlan(r, 1);
  ASSERT_TRUE(best.ok()) << best.status();
  EXPECT_EQ(best->replicas, 1);
  EXPECT_EQ(best->kind, schedule::ScheduleKind::kZbH1);
  best = BestPlan(r, 2);
  ASSERT_TRUE(best.ok()) << best.status();
  EXPECT_EQ(best->replicas, 2);
  const std::string text = FormatPlans(r, 1, false);
  EXPECT_NE(text.find("REDUCE MS"), std::string::npos) << text;
  EXPECT_NE(text.find("1    2        1      gpipe"), std::string::npos) << text;
  EXPECT_NE(text.find(" 1.50 "), std::string::npos) << text;
}

TEST(PlanCommandTest, NoPlanFitsIsAnErrorNamingTheSmallestNeed) {
  PlanResult r = Result();
  for (plan::PlanChoice& p : r.plans) p.fits_memory = false;
  absl::Status s = BestPlan(r).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("the smallest needs 1.0 MiB"), std::string::npos) << s;
}

TEST(PlanCommandTest, TableHasAReplicaColumnAndEveryPlan) {
  const std::string text = FormatPlans(Result(), 10, false);
  EXPECT_NE(text.find("2 plans for batch 64 on 2 workers (a 100.0 GFLOP/s 1.0 GiB"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("REPLICAS STAGES SCHEDULE"), std::string::npos) << text;
  EXPECT_NE(text.find("zb-h1"), std::string::npos) << text;
  EXPECT_NE(text.find("2400"), std::string::npos) << text;
  EXPECT_NE(text.find("12.5%"), std::string::npos) << text;
  EXPECT_NE(text.find("3.0 MiB"), std::string::npos) << text;
  // --top 1: the header and one plan.
  const std::string top = FormatPlans(Result(), 1, false);
  EXPECT_EQ(top.find("1f1b "), std::string::npos) << top;
  const std::string json = FormatPlans(Result(), 10, true);
  EXPECT_NE(json.find("{\"rank\":1,\"replicas\":1,\"stages\":2,\"schedule\":\"zb-h1\""),
            std::string::npos)
      << json;
}

TEST(PlanCommandTest, RefusesBadOptionsBeforeMeasuring) {
  PlanCommandOptions o;
  o.training.model_path = "examples/gpt_char.textproto";
  absl::Status neither = ComputePlans(o).status();
  EXPECT_EQ(neither.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(neither.message().find("give exactly one of --local N"), std::string::npos) << neither;
  o.local_workers = 2;
  o.coordinator = "127.0.0.1:1";
  EXPECT_EQ(ComputePlans(o).status().code(), absl::StatusCode::kInvalidArgument);
  o.coordinator.clear();
  o.link_bytes_per_second = -1;
  absl::Status bw = ComputePlans(o).status();
  EXPECT_NE(bw.message().find("--link-bandwidth"), std::string::npos) << bw;
  o.link_bytes_per_second = 0;
  o.message_cpu_seconds = -1;
  absl::Status cpu = ComputePlans(o).status();
  EXPECT_NE(cpu.message().find("--message-cpu"), std::string::npos) << cpu;
  o.message_cpu_seconds = 0;
  o.top = 0;
  EXPECT_NE(ComputePlans(o).status().message().find("--top"), std::string::npos);
}

}  // namespace
}  // namespace pipetrain::cli
