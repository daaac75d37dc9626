#include "client/cli/partition_command.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace pipetrain::cli {
namespace {

using ::testing::HasSubstr;

TEST(PartitionCommandTest, ParsesCostsSpeedsAndCaps) {
  const ModelLayers model{{1, 2, 3, 4}, {1024, 1024, 2048, 2048}};
  absl::StatusOr<PartitionCommandOptions> o =
      ParsePartitionCommandOptions("", "1,2", "3KiB", "2", "json", &model);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->layer_costs, (std::vector<double>{1, 2, 3, 4}));
  EXPECT_EQ(o->speeds, (std::vector<double>{1, 2}));
  EXPECT_EQ(o->memory_caps, (std::vector<double>{3072, 3072}));
  EXPECT_EQ(o->format, PartitionFormat::kJson);
  o = ParsePartitionCommandOptions("", "", "1.5G,2e9", "2", "", &model);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->memory_caps, (std::vector<double>{1.5e9, 2e9}));
  o = ParsePartitionCommandOptions("1,1,1,1,1,1,1,1", "", "", "2", "", nullptr, "zb-v");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->placement, schedule::PlacementKind::kVShape);
  EXPECT_EQ(o->virtual_stages, 2);
  o = ParsePartitionCommandOptions("1,1,1,1,1,1", "", "", "2", "", nullptr, "", "3");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->placement, schedule::PlacementKind::kLooped);
  EXPECT_EQ(o->virtual_stages, 3);
}

TEST(PartitionCommandTest, RefusesBadFlags) {
  const ModelLayers model{{1, 2}, {}};
  auto error = [](absl::StatusOr<PartitionCommandOptions> o) {
    EXPECT_FALSE(o.ok());
    return std::string(o.status().message());
  };
  EXPECT_EQ(error(ParsePartitionCommandOptions("", "", "", "2", "")),
            "give exactly one of --costs and --model");
  EXPECT_EQ(error(ParsePartitionCommandOptions("1,2", "", "", "2", "", &model)),
            "give exactly one of --costs and --model");
  EXPECT_EQ(error(ParsePartitionCommandOptions("1,x", "", "", "2", "")),
            "--costs needs comma-separated numbers in [0, 1e+30] (got \"x\" in \"1,x\")");
  EXPECT_EQ(error(ParsePartitionCommandOptions("1,2", "", "", "", "")),
            "--stages is required: how many pipeline stages to split the layers across");
  EXPECT_EQ(error(ParsePartitionCommandOptions("1,2", "1,0", "", "2", "")),
            "--speeds needs comma-separated numbers in [1e-06, 1e+09] (got \"0\" in \"1,0\")");
  EXPECT_EQ(error(ParsePartitionCommandOptions("1,2", "1", "", "2", "")),
            "--speeds has 1 values; need one per stage (2)");
  EXPECT_EQ(error(ParsePartitionCommandOptions("1,2", "", "1GiB", "2", "")),
            "--memory-cap needs the memory of every layer, which only --model provides");
  EXPECT_THAT(error(ParsePartitionCommandOptions("1,2", "", "lots", "2", "")),
              HasSubstr("--memory-cap needs byte counts in [0, 2^53]"));
  EXPECT_EQ(error(ParsePartitionCommandOptions("1,2", "", "", "2", "yaml")),
            "--format must be text or json (got \"yaml\")");
  EXPECT_THAT(error(ParsePartitionCommandOptions("1,2", "", "", "2", "", nullptr, "zb-v", "3")),
              HasSubstr("virtual stages must be 2"));
}

TEST(PartitionCommandTest, TextReport) {
  absl::StatusOr<PartitionCommandOptions> o =
      ParsePartitionCommandOptions("1,2,3,4,5,6,7,8,9", "", "", "3", "text");
  ASSERT_TRUE(o.ok()) << o.status();
  absl::StatusOr<std::string> out = RunPartitionCommand(*o);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(*out,
            "partition of 9 layers over 3 ranks (linear placement, 3 chunks): optimal\n"
            "rank    chunks    layers        cost        speed    time\n"
            "0       0         0-4           15          1        15\n"
            "1       1         5-6           13          1        13\n"
            "2       2         7-8           17          1        17\n"
            "boundaries: 0 5 7 9\n"
            "bottleneck 17 (rank 2), mean 15, imbalance 1.13333 (max/mean)\n");
}

TEST(PartitionCommandTest, JsonReportAndVShape) {
  absl::StatusOr<PartitionCommandOptions> o =
      ParsePartitionCommandOptions("6,1,1,1,1,1,1,1,6", "", "", "2", "json", nullptr, "dualpipe-v");
  ASSERT_TRUE(o.ok()) << o.status();
  absl::StatusOr<std::string> out = RunPartitionCommand(*o);
  ASSERT_TRUE(out.ok()) << out.status();
  const nlohmann::json j = nlohmann::json::parse(*out);
  EXPECT_EQ(j["placement"], "v-shape");
  EXPECT_EQ(j["boundaries"], nlohmann::json::parse("[0, 1, 4, 8, 9]"));
  EXPECT_EQ(j["workers"][0]["chunks"], nlohmann::json::parse("[0, 3]"));
  EXPECT_DOUBLE_EQ(j["workers"][0]["cost"].get<double>(), 12);
  EXPECT_DOUBLE_EQ(j["bottleneck"].get<double>(), 12);
  EXPECT_NEAR(j["imbalance"].get<double>(), 12 / 9.5, 1e-12);
  EXPECT_EQ(j["optimal"], true);
  EXPECT_EQ(j["chunks"][3], nlohmann::json::parse(
                                R"({"chunk": 3, "worker": 0, "first_layer": 8, "end_layer": 9,
                                    "cost": 6.0})"));
}

// Numbers beyond the partitioner's ranges are refused by the flag parser, naming the flag, and by
// the run itself for options that skipped the parser. (Before: `pipetrain partition --costs
// 1e308,1e308,1e308 --stages 2` died of a segfault, exit 139.)
TEST(PartitionCommandTest, RefusesNumbersOutsideThePartitionersRanges) {
  auto error = [](absl::StatusOr<PartitionCommandOptions> o) {
    EXPECT_EQ(o.status().code(), absl::StatusCode::kInvalidArgument) << o.status();
    return std::string(o.status().message());
  };
  EXPECT_EQ(error(ParsePartitionCommandOptions("1e308,1e308,1e308", "", "", "2", "")),
            "--costs needs comma-separated numbers in [0, 1e+30] (got \"1e308\" in "
            "\"1e308,1e308,1e308\")");
  EXPECT_EQ(error(ParsePartitionCommandOptions("1,1,1", "1e-310,1", "", "2", "")),
            "--speeds needs comma-separated numbers in [1e-06, 1e+09] (got \"1e-310\" in "
            "\"1e-310,1\")");
  EXPECT_EQ(error(ParsePartitionCommandOptions("1,1,1", "1e200,1", "", "2", "")),
            "--speeds needs comma-separated numbers in [1e-06, 1e+09] (got \"1e200\" in "
            "\"1e200,1\")");
  const ModelLayers model{{1, 1, 1}, {2, 3, 2}};
  EXPECT_THAT(error(ParsePartitionCommandOptions("", "", "8193TiB", "2", "", &model)),
              HasSubstr("--memory-cap needs byte counts in [0, 2^53]"));

  PartitionCommandOptions o;
  o.layer_costs = {1e308, 1e308, 1e308};
  o.stages = 2;
  absl::Status status = RunPartitionCommand(o).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), "cost of layer 0 must be in [0, 1e+30] (got 1e+308)");
}

TEST(PartitionCommandTest, InfeasibleCapsAreResourceExhausted) {
  const ModelLayers model{{1, 1, 1}, {2, 3, 2}};
  absl::StatusOr<PartitionCommandOptions> o =
      ParsePartitionCommandOptions("", "", "4", "2", "", &model);
  ASSERT_TRUE(o.ok()) << o.status();
  absl::Status status = RunPartitionCommand(*o).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(status.message(), HasSubstr("memory caps infeasible"));
}

}  // namespace
}  // namespace pipetrain::cli
