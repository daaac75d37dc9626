#include "common/schedule/plan_json.h"

#include <string>

#include "common/schedule/generator.h"
#include "common/schedule/simulator.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace pipetrain::schedule {
namespace {

TEST(PlanJsonTest, ReportFollowsTheCliContract) {
  absl::StatusOr<Plan> plan = GenerateSchedule({ScheduleKind::kZbV, 2, 2, 2});
  ASSERT_TRUE(plan.ok()) << plan.status();
  absl::StatusOr<SimulationResult> sim =
      Simulate(*plan, UniformCostModel(plan->placement, {2, 4, 2, 2}));
  ASSERT_TRUE(sim.ok()) << sim.status();
  const std::string text = ScheduleReportToJson(*plan, sim->stats).dump();
  // Keys in the documented order.
  EXPECT_EQ(text.rfind(R"({"kind":"zb-v","stages":2,"microbatches":2,"virtual":2,"placement":)", 0),
            0u);
  EXPECT_NE(text.find(R"({"op":"F","mb":0,"chunk":0})"), std::string::npos);
  EXPECT_NE(text.find(R"("simulation":{"makespan":)"), std::string::npos);
  const nlohmann::json j = nlohmann::json::parse(text);
  EXPECT_EQ(j["kind"], "zb-v");
  EXPECT_EQ(j["stages"], 2);
  EXPECT_EQ(j["microbatches"], 2);
  EXPECT_EQ(j["virtual"], 2);
  EXPECT_EQ(j["placement"], nlohmann::json::parse("[[0, 3], [1, 2]]"));
  ASSERT_EQ(j["actions"].size(), 2u);
  ASSERT_EQ(j["actions"][0].size(), plan->actions[0].size());
  EXPECT_EQ(j["actions"][0][0], nlohmann::json::parse(R"({"op": "F", "mb": 0, "chunk": 0})"));
  EXPECT_EQ(j["actions"][1][3], nlohmann::json::parse(R"({"op": "F", "mb": 1, "chunk": 2})"));
  const nlohmann::json& s = j["simulation"];
  EXPECT_DOUBLE_EQ(s["makespan"].get<double>(), sim->stats.makespan);
  EXPECT_DOUBLE_EQ(s["bubble_fraction"].get<double>(), sim->stats.bubble_fraction);
  ASSERT_EQ(s["per_worker"].size(), 2u);
  EXPECT_DOUBLE_EQ(s["per_worker"][1]["busy"].get<double>(), 12);
  EXPECT_DOUBLE_EQ(s["per_worker"][1]["bubble_fraction"].get<double>(),
                   sim->stats.workers[1].bubble_fraction);
  EXPECT_EQ(s["per_worker"][0]["peak_activations"], 3);
  EXPECT_EQ(PlanToJson(*plan).count("simulation"), 0u);
}

}  // namespace
}  // namespace pipetrain::schedule
