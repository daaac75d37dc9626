#include "client/cli/schedule_command.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace pipetrain::cli {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

std::string ParseError(absl::string_view kind, absl::string_view stages, absl::string_view m,
                       absl::string_view v, absl::string_view costs, absl::string_view format) {
  absl::StatusOr<ScheduleCommandOptions> o =
      ParseScheduleCommandOptions(kind, stages, m, v, costs, format);
  EXPECT_FALSE(o.ok());
  EXPECT_EQ(o.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(o.status().message());
}

TEST(ScheduleCommandTest, ParsesAndDefaults) {
  absl::StatusOr<ScheduleCommandOptions> o =
      ParseScheduleCommandOptions("zb-v", "4", "8", "", "", "");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->params.kind, schedule::ScheduleKind::kZbV);
  EXPECT_EQ(o->params.stages, 4);
  EXPECT_EQ(o->params.microbatches, 8);
  EXPECT_EQ(o->params.virtual_stages, 2);
  EXPECT_EQ(o->costs.f, 1);
  EXPECT_EQ(o->costs.b, 2);
  EXPECT_EQ(o->format, ScheduleFormat::kAscii);
  o = ParseScheduleCommandOptions("interleaved", "2", "4", "3", "1, 2.5,1.5,1", "svg");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->params.virtual_stages, 3);
  EXPECT_EQ(o->costs.b, 2.5);
  EXPECT_EQ(o->costs.i, 1.5);
  EXPECT_EQ(o->format, ScheduleFormat::kSvg);
}

TEST(ScheduleCommandTest, RefusesBadFlagsWithTheRule) {
  EXPECT_THAT(ParseError("", "4", "8", "", "", ""), HasSubstr("--schedule is required"));
  EXPECT_THAT(ParseError("zb-h2", "4", "8", "", "", ""), HasSubstr("unknown schedule kind"));
  EXPECT_EQ(ParseError("1f1b", "0", "8", "", "", ""),
            "--stages must be an integer >= 1 (got \"0\")");
  EXPECT_EQ(ParseError("1f1b", "4", "x", "", "", ""),
            "--microbatches must be an integer >= 1 (got \"x\")");
  EXPECT_EQ(ParseError("1f1b", "4", "", "", "", ""), "--microbatches is required");
  EXPECT_EQ(ParseError("1f1b", "4", "8", "0", "", ""),
            "--virtual must be an integer >= 1 (got \"0\")");
  EXPECT_EQ(ParseError("1f1b", "4", "8", "", "1,2,3", ""),
            "--costs needs four numbers in [0, 1e+33], F,B,I,W (got \"1,2,3\")");
  EXPECT_EQ(ParseError("1f1b", "4", "8", "", "1,-2,1,1", ""),
            "--costs needs four numbers in [0, 1e+33], F,B,I,W (got \"1,-2,1,1\")");
  EXPECT_EQ(ParseError("1f1b", "4", "8", "", "", "png"),
            "--format must be ascii, json, chrome or svg (got \"png\")");
  EXPECT_EQ(ParseError("interleaved", "4", "3", "", "", ""),
            "interleaved 1F1B needs microbatches (3) >= stages (4)");
  EXPECT_EQ(ParseError("1f1b", "4", "8", "2", "", ""),
            "1f1b holds one chunk per rank: virtual stages must be 1 (got 2)");
}

TEST(ScheduleCommandTest, AsciiReport) {
  absl::StatusOr<ScheduleCommandOptions> o =
      ParseScheduleCommandOptions("1f1b", "2", "2", "", "1,2,1,1", "ascii");
  ASSERT_TRUE(o.ok()) << o.status();
  absl::StatusOr<std::string> out = RunScheduleCommand(*o);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(*out,
            "1f1b: S=2 M=2 V=1; per-stage costs F=1 B=2 I=1 W=1\n"
            "time |0              5\n"
            "r0   |F0 F1 ......B0--- ...B1---\n"
            "r1   |...F0 B0--- F1 B1--- ......\n"
            "1 cell = 1 time unit; makespan 9; F forward, B backward, I input grad, W weight grad, "
            ". idle\n"
            "makespan 9, bubble fraction 0.333333\n"
            "rank    busy        bubble      peak activations\n"
            "0       6           0.333333    2\n"
            "1       6           0.333333    1\n");
}

TEST(ScheduleCommandTest, JsonFollowsTheContract) {
  absl::StatusOr<ScheduleCommandOptions> o =
      ParseScheduleCommandOptions("interleaved", "2", "4", "2", "", "json");
  ASSERT_TRUE(o.ok()) << o.status();
  absl::StatusOr<std::string> out = RunScheduleCommand(*o);
  ASSERT_TRUE(out.ok()) << out.status();
  const nlohmann::json j = nlohmann::json::parse(*out);
  EXPECT_EQ(j["kind"], "interleaved");
  EXPECT_EQ(j["stages"], 2);
  EXPECT_EQ(j["microbatches"], 4);
  EXPECT_EQ(j["virtual"], 2);
  EXPECT_EQ(j["placement"], nlohmann::json::parse("[[0, 2], [1, 3]]"));
  EXPECT_EQ(j["actions"][0].size(), 16u);
  EXPECT_EQ(j["actions"][0][2], nlohmann::json::parse(R"({"op": "F", "mb": 0, "chunk": 2})"));
  // Closed form: (S-1)/(VM+S-1) = 1/9.
  EXPECT_NEAR(j["simulation"]["bubble_fraction"].get<double>(), 1.0 / 9, 1e-12);
  EXPECT_DOUBLE_EQ(j["simulation"]["makespan"].get<double>(), 13.5);
  ASSERT_EQ(j["simulation"]["per_worker"].size(), 2u);
  for (const auto& w : j["simulation"]["per_worker"]) {
    EXPECT_TRUE(w.contains("busy"));
    EXPECT_TRUE(w.contains("bubble_fraction"));
    EXPECT_TRUE(w.contains("peak_activations"));
  }
}

TEST(ScheduleCommandTest, ChromeAndSvg) {
  absl::StatusOr<ScheduleCommandOptions> o =
      ParseScheduleCommandOptions("dualpipe-v", "2", "4", "", "", "chrome");
  ASSERT_TRUE(o.ok()) << o.status();
  absl::StatusOr<std::string> out = RunScheduleCommand(*o);
  ASSERT_TRUE(out.ok()) << out.status();
  const nlohmann::json trace = nlohmann::json::parse(*out);
  EXPECT_TRUE(trace["traceEvents"].is_array());
  o->format = ScheduleFormat::kSvg;
  out = RunScheduleCommand(*o);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_THAT(*out, StartsWith("<?xml"));
}

// The text of the SVG's legend group.
std::string Legend(const std::string& svg) {
  const size_t begin = svg.find("<g id=\"legend\">");
  if (begin == std::string::npos) return "";
  return svg.substr(begin, svg.find("</g>", begin) - begin);
}

// The SVG names the schedule, S, M, V and the predicted bubble in its title, and its legend lists
// only the kinds of action the schedule has.
TEST(ScheduleCommandTest, SvgTitleAndLegend) {
  absl::StatusOr<ScheduleCommandOptions> o =
      ParseScheduleCommandOptions("1f1b", "4", "8", "", "", "svg");
  ASSERT_TRUE(o.ok()) << o.status();
  absl::StatusOr<std::string> svg = RunScheduleCommand(*o);
  ASSERT_TRUE(svg.ok()) << svg.status();
  // 1F1B's bubble (S-1)/(M+S-1) = 3/11.
  const std::string title = "1f1b: S=4 M=8 V=1, predicted bubble 0.272727 (costs F=1 B=2 I=1 W=1)";
  EXPECT_THAT(*svg, HasSubstr("<title>" + title + "</title>"));
  EXPECT_THAT(*svg, HasSubstr(">" + title + "; makespan 33</text>"));
  std::string legend = Legend(*svg);
  EXPECT_THAT(legend, HasSubstr(">F forward</text>"));
  EXPECT_THAT(legend, HasSubstr(">B backward</text>"));
  EXPECT_THAT(legend, Not(HasSubstr("input grad")));
  EXPECT_THAT(legend, Not(HasSubstr("weight grad")));
  EXPECT_THAT(legend, Not(HasSubstr("chunks in model order")));

  // ZB-H1 splits every backward: F, I and W, no B. ZB-V has two chunks per worker (V=2).
  o = ParseScheduleCommandOptions("zb-v", "2", "4", "", "", "svg");
  ASSERT_TRUE(o.ok()) << o.status();
  svg = RunScheduleCommand(*o);
  ASSERT_TRUE(svg.ok()) << svg.status();
  EXPECT_THAT(*svg, HasSubstr("<title>zb-v: S=2 M=4 V=2, predicted bubble "));
  legend = Legend(*svg);
  EXPECT_THAT(legend, HasSubstr(">F forward</text>"));
  EXPECT_THAT(legend, Not(HasSubstr("backward")));
  EXPECT_THAT(legend, HasSubstr(">I input grad</text>"));
  EXPECT_THAT(legend, HasSubstr(">W weight grad</text>"));
  EXPECT_THAT(legend, HasSubstr("chunks in model order"));
}

// Runs `pipetrain schedule --kind K --stages S --microbatches M --format json` and parses it.
nlohmann::json JsonOf(absl::string_view kind, absl::string_view s, absl::string_view m) {
  absl::StatusOr<ScheduleCommandOptions> o =
      ParseScheduleCommandOptions(kind, s, m, "", "", "json");
  EXPECT_TRUE(o.ok()) << o.status();
  if (!o.ok()) return {};
  absl::StatusOr<std::string> out = RunScheduleCommand(*o);
  EXPECT_TRUE(out.ok()) << out.status();
  return out.ok() ? nlohmann::json::parse(*out) : nlohmann::json{};
}

// The actions of one worker as "F0 F1 B0 ..." (chunk appended as ".c" when `with_chunk`).
std::string Ops(const nlohmann::json& worker, bool with_chunk) {
  std::string out;
  for (const nlohmann::json& a : worker) {
    if (!out.empty()) out += " ";
    out += a["op"].get<std::string>() + std::to_string(a["mb"].get<int>());
    if (with_chunk) out += "." + std::to_string(a["chunk"].get<int>());
  }
  return out;
}

// The overlap kinds and dualpipe through the command: plans, simulated figures, pictures.
TEST(ScheduleCommandTest, OverlapKindsAndDualPipe) {
  // 1F1B-overlap, S=2, M=4, costs 1,2,1,1: 1F1B's makespan (M+S-1)(F+B) = 15 with twice the
  // stash (worker 0: 2(S-0) = 4, worker 1: 2).
  nlohmann::json j = JsonOf("1f1b-overlap", "2", "4");
  EXPECT_EQ(j["kind"], "1f1b-overlap");
  EXPECT_EQ(Ops(j["actions"][0], false), "F0 F1 F2 F3 B0 B1 B2 B3");
  EXPECT_EQ(Ops(j["actions"][1], false), "F0 F1 B0 F2 B1 F3 B2 B3");
  EXPECT_DOUBLE_EQ(j["simulation"]["makespan"].get<double>(), 15);
  EXPECT_EQ(j["simulation"]["per_worker"][0]["peak_activations"], 4);
  EXPECT_EQ(j["simulation"]["per_worker"][1]["peak_activations"], 2);

  // Interleaved-overlap, S=2, M=4, V=2 (default): interleaved's makespan M(F+B) + (S-1)(F+B)/V.
  j = JsonOf("interleaved-overlap", "2", "4");
  EXPECT_EQ(j["virtual"], 2);
  EXPECT_DOUBLE_EQ(j["simulation"]["makespan"].get<double>(), 13.5);

  // DualPipe, S=2, M=4: worker 0 holds chunk 0 (down copy, micro-batches 0-1) and chunk 3 (up
  // copy, 2-3); makespan 3M + S/2 - 1 = 12.
  j = JsonOf("dualpipe", "2", "4");
  EXPECT_EQ(j["placement"], nlohmann::json::parse("[[0, 3], [1, 2]]"));
  EXPECT_EQ(Ops(j["actions"][0], true), "F0.0 F2.3 F1.0 B2.3 F3.3 B0.0 B3.3 I1.0 W1.0");
  EXPECT_DOUBLE_EQ(j["simulation"]["makespan"].get<double>(), 12);

  absl::StatusOr<ScheduleCommandOptions> o =
      ParseScheduleCommandOptions("dualpipe", "2", "4", "", "", "ascii");
  ASSERT_TRUE(o.ok()) << o.status();
  absl::StatusOr<std::string> ascii = RunScheduleCommand(*o);
  ASSERT_TRUE(ascii.ok()) << ascii.status();
  EXPECT_THAT(*ascii, StartsWith("dualpipe: S=2 M=4 V=2; per-stage costs F=1 B=2 I=1 W=1 (each "
                                 "chunk a whole stage: two copies of the weights)\n"));
  EXPECT_THAT(*ascii, HasSubstr("r0   |F0a F2b F1a B2b---- F3b B0a---- B3b---- I1a W1a\n"));
  o->format = ScheduleFormat::kSvg;
  EXPECT_TRUE(RunScheduleCommand(*o).ok());

  EXPECT_EQ(ParseError("dualpipe", "3", "4", "", "", "ascii"),
            "dualpipe needs an even number of stages (got 3): it pairs rank w with rank "
            "S-1-w; for odd S use dualpipe-v");
}

TEST(ScheduleCommandTest, RunChecksOptionsThatSkippedTheParser) {
  ScheduleCommandOptions o;
  o.params = {schedule::ScheduleKind::kZbV, 4, 8, 3};
  EXPECT_EQ(RunScheduleCommand(o).status().code(), absl::StatusCode::kInvalidArgument);
  o.params.virtual_stages = 2;
  o.costs.f = -1;
  EXPECT_THAT(RunScheduleCommand(o).status().message(), HasSubstr("must be in [0, 1e+33]"));
}

}  // namespace
}  // namespace pipetrain::cli
