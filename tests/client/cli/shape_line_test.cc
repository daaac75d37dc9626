#include "client/cli/shape_line.h"

#include <string>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace pipetrain::cli {
namespace {

v1::ShapeChange Grown() {
  v1::ShapeChange c;
  c.set_step(12);
  c.set_stages_before(2);
  c.set_stages(3);
  c.set_replicas_before(1);
  c.set_replicas(1);
  c.add_joined("w2");
  for (const char* w : {"w0", "w1", "w2"}) c.add_workers(w);
  c.set_generation(2);
  c.set_seconds(0.8);
  c.set_checkpoint("/state/growth/job-1");
  return c;
}

TEST(ShapeLineTest, AGrowthNamesTheShapesTheWorkersThatJoinedAndTheTime) {
  EXPECT_EQ(ShapeChangeLine(Grown(), false),
            "step 12: grew from 2 to 3 stages (worker w2 joined) in 0.80 s; generation 2 on w0, "
            "w1, w2\n");
  v1::ShapeChange two = Grown();
  two.set_stages(4);
  two.add_joined("w3");
  two.set_replicas_before(2);
  two.set_replicas(2);
  EXPECT_NE(ShapeChangeLine(two, false)
                .find("step 12: grew from 2 replicas x 2 stages to 2 replicas x 4 stages (workers "
                      "w2, w3 joined)"),
            std::string::npos);
}

TEST(ShapeLineTest, AFailedGrowthSaysWhyAndTheShapeKept) {
  v1::ShapeChange c = Grown();
  c.set_stages(2);
  c.clear_joined();
  c.set_failed("the checkpoint for it failed: disk full");
  EXPECT_EQ(ShapeChangeLine(c, false),
            "step 12: did not grow (the checkpoint for it failed: disk full); stays at 2 stages\n");
}

TEST(ShapeLineTest, JsonHasEveryField) {
  const nlohmann::json j = nlohmann::json::parse(ShapeChangeLine(Grown(), true));
  const nlohmann::json& c = j.at("shape_change");
  EXPECT_EQ(c.at("step"), 12);
  EXPECT_EQ(c.at("stages_before"), 2);
  EXPECT_EQ(c.at("stages"), 3);
  EXPECT_EQ(c.at("joined"), nlohmann::json::array({"w2"}));
  EXPECT_EQ(c.at("generation"), 2);
  EXPECT_EQ(c.at("checkpoint"), "/state/growth/job-1");
  EXPECT_EQ(c.at("failed"), "");
}

TEST(ShapeLineTest, ShapeOfSpecCountsReplicasOnlyWhenSeveral) {
  v1::JobSpec spec;
  spec.set_stages(3);
  EXPECT_EQ(ShapeOfSpec(spec), "3 stages");
  spec.set_replicas(2);
  EXPECT_EQ(ShapeOfSpec(spec), "2 replicas x 3 stages");
}

}  // namespace
}  // namespace pipetrain::cli
