#include "common/schedule/timeline_render.h"

#include <cmath>
#include <string>
#include <vector>

#include "common/schedule/generator.h"
#include "common/schedule/simulator.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace pipetrain::schedule {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

Timeline Simulated(ScheduleKind kind, int s, int m, int v, const OpCosts& per_stage) {
  absl::StatusOr<Plan> plan = GenerateSchedule({kind, s, m, v});
  EXPECT_TRUE(plan.ok()) << plan.status();
  if (!plan.ok()) return {};
  absl::StatusOr<SimulationResult> result =
      Simulate(*plan, UniformCostModel(plan->placement, per_stage));
  EXPECT_TRUE(result.ok()) << result.status();
  return result.ok() ? result->timeline : Timeline{};
}

std::string Picture(ScheduleKind kind, int s, int m, int v, const OpCosts& per_stage) {
  return RenderAscii(Simulated(kind, s, m, v, per_stage));
}

// Golden pictures, checked by eye against the schedules' rules: warm-up lengths, the backward
// chain, W filling the bubbles (ZB-H1), the V-shape start delay of S-1 chunk steps on the last
// worker (ZB-V, DualPipeV), and the bubble lengths of the closed forms.
// 1f1b, S=4, M=6, V=1, per-stage costs F=1 B=2 I=1 W=1.
TEST(RenderAsciiTest, GoldenOneFOneB) {
  EXPECT_EQ(
      Picture(ScheduleKind::kOneFOneB, 4, 6, 1, {1, 2, 1, 1}),
      "time |0              5              10             15             20             25\n"
      "r0   |F0 F1 F2 F3 ..................B0--- F4 B1--- F5 B2--- ...B3--- ...B4--- ...B5---\n"
      "r1   |...F0 F1 F2 ............B0--- F3 B1--- F4 B2--- F5 B3--- ...B4--- ...B5--- ......\n"
      "r2   |......F0 F1 ......B0--- F2 B1--- F3 B2--- F4 B3--- F5 B4--- ...B5--- ............\n"
      "r3   |.........F0 B0--- F1 B1--- F2 B2--- F3 B3--- F4 B4--- F5 B5--- ..................\n"
      "1 cell = 1 time unit; makespan 27; F forward, B backward, I input grad, W weight grad, . "
      "idle\n");
}

// gpipe, S=3, M=4, V=1, per-stage costs F=1 B=1 I=1 W=1.
TEST(RenderAsciiTest, GoldenGPipe) {
  EXPECT_EQ(Picture(ScheduleKind::kGPipe, 3, 4, 1, {1, 1, 1, 1}),
            "time |0              5              10\n"
            "r0   |F0 F1 F2 F3 ............B0 B1 B2 B3\n"
            "r1   |...F0 F1 F2 F3 ......B0 B1 B2 B3 ...\n"
            "r2   |......F0 F1 F2 F3 B0 B1 B2 B3 ......\n"
            "1 cell = 1 time unit; makespan 12; F forward, B backward, I input grad, W weight "
            "grad, . idle\n");
}

// zb-h1, S=4, M=6, V=1, per-stage costs F=1 B=2 I=1 W=1.
TEST(RenderAsciiTest, GoldenZbH1) {
  EXPECT_EQ(Picture(ScheduleKind::kZbH1, 4, 6, 1, {1, 2, 1, 1}),
            "time |0              5              10             15             20\n"
            "r0   |F0 F1 F2 F3 .........I0 W0 F4 I1 W1 F5 I2 W2 I3 W3 I4 W4 I5 W5\n"
            "r1   |...F0 F1 F2 ......I0 F3 I1 W0 F4 I2 W1 F5 I3 W2 I4 W3 I5 W4 W5\n"
            "r2   |......F0 F1 ...I0 F2 I1 F3 I2 W0 F4 I3 W1 F5 I4 W2 I5 W3 W4 W5\n"
            "r3   |.........F0 I0 F1 I1 F2 I2 F3 I3 W0 F4 I4 W1 F5 I5 W2 W3 W4 W5\n"
            "1 cell = 1 time unit; makespan 21; F forward, B backward, I input grad, W weight "
            "grad, . idle\n");
}

// interleaved, S=2, M=4, V=2, per-stage costs F=1 B=2 I=1 W=1.
TEST(RenderAsciiTest, GoldenInterleaved) {
  EXPECT_EQ(Picture(ScheduleKind::kInterleaved, 2, 4, 2, {1, 2, 1, 1}),
            "time |0                   2.5                 5                   7.5                 "
            "10                  12.5\n"
            "r0   |F0a F1a F0b F1b F2a ....B0b---- F3a B1b---- F2b B0a---- F3b B1a---- ....B2b---- "
            "....B3b---- B2a---- B3a----\n"
            "r1   |....F0a F1a F0b B0b---- F1b B1b---- F2a B0a---- F3a B1a---- F2b B2b---- F3b "
            "B3b---- B2a---- B3a---- ........\n"
            "1 cell = 0.5 time units; makespan 13.5; F forward, B backward, I input grad, W weight "
            "grad, . idle; a, b, ... = the rank's chunks in model order\n");
}

// zb-v, S=2, M=4, V=2, per-stage costs F=2 B=4 I=2 W=2.
TEST(RenderAsciiTest, GoldenZbV) {
  EXPECT_EQ(
      Picture(ScheduleKind::kZbV, 2, 4, 2, {2, 4, 2, 2}),
      "time |0                   5                   10                  15                  20\n"
      "r0   |F0a F1a F2a F0b I0b W0b F1b I1b W1b F3a I0a W0a F2b I2b W2b I1a W1a F3b I3b W3b I2a "
      "W2a I3a W3a ....\n"
      "r1   |....F0a F0b F1a F1b I0b W0b F2a I0a W0a F2b I1b W1b F3a I1a W1a F3b I2b W2b I2a I3b "
      "I3a W2a W3b W3a\n"
      "1 cell = 1 time unit; makespan 25; F forward, B backward, I input grad, W weight grad, . "
      "idle; a, b, ... = the rank's chunks in model order\n");
}

// dualpipe-v, S=2, M=4, V=2, per-stage costs F=2 B=4 I=2 W=2.
TEST(RenderAsciiTest, GoldenDualPipeV) {
  EXPECT_EQ(
      Picture(ScheduleKind::kDualPipeV, 2, 4, 2, {2, 4, 2, 2}),
      "time |0                   5                   10                  15                  20\n"
      "r0   |F0a F1a F2a F0b I0b W0b F1b F3a B1b---- F2b B0a---- B2b---- F3b ....B1a---- B3b---- "
      "I2a W2a I3a W3a\n"
      "r1   |....F0a F0b F1a F1b F2a B0b---- F2b B0a---- F3a B1b---- F3b B1a---- B2b---- B2a---- "
      "I3b I3a W3b W3a\n"
      "1 cell = 1 time unit; makespan 25; F forward, B backward, I input grad, W weight grad, . "
      "idle; a, b, ... = the rank's chunks in model order\n");
}

TEST(RenderAsciiTest, LabelsNameTheWorkersChunk) {
  const Placement v{PlacementKind::kVShape, 3, 2};
  EXPECT_EQ(ActionLabel(v, {Op::kForward, 7, 1}), "F7a");
  EXPECT_EQ(ActionLabel(v, {Op::kWeightGrad, 12, 4}), "W12b");
  EXPECT_EQ(ActionLabel(Placement{}, {Op::kBackward, 3, 0}), "B3");
}

// A measured timeline with irregular times: the cell is the shortest action (0.5), times round
// to the nearest cell (B on w0: [3.1, 4.9) -> cells 6..9), and an explicit scale or a cell budget
// coarsens the grid.
TEST(RenderAsciiTest, MeasuredTimelineAndScale) {
  Timeline t;
  t.placement = Placement{PlacementKind::kLinear, 2, 1};
  t.workers = {{{{Op::kForward, 0, 0}, 0, 1}, {{Op::kBackward, 0, 0}, 3.1, 4.9}},
               {{{Op::kForward, 0, 1}, 1.2, 1.7}, {{Op::kBackward, 0, 1}, 1.7, 2.9}}};
  EXPECT_EQ(RenderAscii(t),
            "time |0              2.5\n"
            "r0   |F0--- ............B0---------\n"
            "r1   |......F0 B0------ ............\n"
            "1 cell = 0.5 time units; makespan 4.9; F forward, B backward, I input grad, W weight "
            "grad, . idle\n");
  EXPECT_EQ(RenderAscii(t, {/*time_per_cell=*/1, /*max_cells=*/0, /*time_unit=*/""}),
            "time |0\n"
            "r0   |F0 ......B0---\n"
            "r1   |...F0 B0 ......\n"
            "1 cell = 1 time unit; makespan 4.9; F forward, B backward, I input grad, W weight "
            "grad, . idle\n");
  const std::string coarse =
      RenderAscii(t, {/*time_per_cell=*/0, /*max_cells=*/5, /*time_unit=*/""});
  EXPECT_THAT(coarse, HasSubstr("1 cell = 0.98 time units"));
}

TEST(RenderAsciiTest, EmptyTimeline) {
  EXPECT_EQ(RenderAscii(Timeline{}),
            "time |\n1 cell = 1 time unit; makespan 0; F forward, B backward, I input grad, W "
            "weight grad, . idle\n");
}

// Measured timelines may hold garbage (clock skew, missing stamps): such actions are left out.
TEST(RenderAsciiTest, SkipsUndrawableActions) {
  Timeline t;
  t.placement = Placement{PlacementKind::kLinear, 1, 1};
  t.workers = {{{{Op::kForward, 0, 0}, 0, 1},
                {{Op::kForward, 1, 0}, -5, 2},
                {{Op::kBackward, 0, 0}, std::nan(""), 3},
                {{Op::kBackward, 1, 0}, 2, 1e308 * 10},
                {{Op::kBackward, 2, 0}, 1, 2}}};
  EXPECT_EQ(RenderAscii(t),
            "time |0\n"
            "r0   |F0 B2\n"
            "1 cell = 1 time unit; makespan 2; F forward, B backward, I input grad, W weight grad, "
            ". idle\n");
  const nlohmann::json trace = nlohmann::json::parse(RenderChromeTrace(t));
  int complete = 0;
  for (const nlohmann::json& e : trace["traceEvents"]) complete += e["ph"] == "X";
  EXPECT_EQ(complete, 2);
  EXPECT_THAT(RenderSvg(t), HasSubstr(">makespan 2</text>"));
}

TEST(ChromeTraceTest, OneTrackPerWorkerOneEventPerAction) {
  const Timeline t = Simulated(ScheduleKind::kZbV, 2, 4, 2, {2, 4, 2, 2});
  const nlohmann::json trace = nlohmann::json::parse(RenderChromeTrace(t, 1000));
  ASSERT_TRUE(trace.contains("traceEvents"));
  int threads = 0;
  int complete = 0;
  for (const nlohmann::json& e : trace["traceEvents"]) {
    if (e["ph"] == "M" && e["name"] == "thread_name") {
      EXPECT_EQ(e["args"]["name"], "rank " + std::to_string(e["tid"].get<int>()));
      ++threads;
    }
    if (e["ph"] == "X") ++complete;
  }
  EXPECT_EQ(threads, 2);
  EXPECT_EQ(complete, 48);
  // Rank 1's first action: F(mb=0, chunk=1) from 1 to 2 time units = 1000 us to 2000 us.
  bool found = false;
  for (const nlohmann::json& e : trace["traceEvents"]) {
    if (e["ph"] == "X" && e["tid"] == 1 && e["args"]["chunk"] == 1 && e["args"]["mb"] == 0 &&
        e["args"]["op"] == "F") {
      EXPECT_EQ(e["name"], "F0a");
      EXPECT_DOUBLE_EQ(e["ts"].get<double>(), 1000);
      EXPECT_DOUBLE_EQ(e["dur"].get<double>(), 1000);
      EXPECT_EQ(e["pid"], 0);
      found = true;
    }
  }
  EXPECT_TRUE(found);
}

TEST(SvgTest, OneRectanglePerAction) {
  const Timeline t = Simulated(ScheduleKind::kOneFOneB, 4, 8, 1, {1, 2, 1, 1});
  const std::string svg = RenderSvg(t);
  EXPECT_THAT(svg, StartsWith("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<svg "));
  EXPECT_THAT(svg, HasSubstr("</svg>\n"));
  EXPECT_THAT(svg, HasSubstr(">rank 3</text>"));
  EXPECT_THAT(svg, HasSubstr(">makespan 33</text>"));
  size_t rects = 0;
  for (size_t at = svg.find("<rect "); at != std::string::npos; at = svg.find("<rect ", at + 1)) {
    ++rects;
  }
  EXPECT_EQ(rects, 1 + 64 + 2);  // Background, 4 workers x 16 actions, legend (F and B only).
  // Every action has a tooltip with its chunk and interval; F0 on worker 3 runs [3, 4).
  EXPECT_THAT(svg, HasSubstr("<title>F0 chunk 3 [3, 4)</title>"));
}

// The text of the SVG's legend group.
std::string Legend(const std::string& svg) {
  const size_t begin = svg.find("<g id=\"legend\">");
  if (begin == std::string::npos) return "";
  return svg.substr(begin, svg.find("</g>", begin) - begin);
}

// A measured-looking timeline in ms: two workers, F and W only (no B, no I), two steps.
Timeline Measured() {
  Timeline t;
  t.placement = Placement{PlacementKind::kLinear, 2, 1};
  t.workers = {{{{Op::kForward, 0, 0}, 0, 1.5},
                {{Op::kWeightGrad, 0, 0}, 2, 2.5},
                {{Op::kForward, 0, 0}, 4, 5.5}},
               {{{Op::kForward, 0, 1}, 1.5, 3}, {{Op::kForward, 0, 1}, 5.5, 7}}};
  return t;
}

TEST(SvgTest, TitleUnitMarksAndLegendOfDrawnKinds) {
  SvgOptions o;
  o.title = "steps 1 & 2 <measured>";
  o.time_unit = "ms";
  o.marks = {{0, "step 1"}, {4, "step 2"}, {99, "beyond"}, {-1, "before"}};
  const std::string svg = RenderSvg(Measured(), o);
  // The title is the document's <title> and starts the first line; text is escaped.
  EXPECT_THAT(svg, HasSubstr("<title>steps 1 &amp; 2 &lt;measured&gt;</title>"));
  EXPECT_THAT(svg, HasSubstr(">steps 1 &amp; 2 &lt;measured&gt;; makespan 7 ms</text>"));
  EXPECT_THAT(svg, Not(HasSubstr("<measured>")));
  // Tooltips carry the unit.
  EXPECT_THAT(svg, HasSubstr("<title>W0 chunk 0 [2, 2.5) ms</title>"));
  // A dashed line per mark within the picture, labelled.
  size_t dashed = 0;
  for (size_t at = svg.find("stroke-dasharray"); at != std::string::npos;
       at = svg.find("stroke-dasharray", at + 1)) {
    ++dashed;
  }
  EXPECT_EQ(dashed, 2u);
  EXPECT_THAT(svg, HasSubstr(">step 1</text>"));
  EXPECT_THAT(svg, HasSubstr(">step 2</text>"));
  EXPECT_THAT(svg, Not(HasSubstr("beyond")));
  EXPECT_THAT(svg, Not(HasSubstr("before")));
  // The legend lists F and W, the kinds drawn, and neither B nor I.
  const std::string legend = Legend(svg);
  EXPECT_THAT(legend, HasSubstr(">F forward</text>"));
  EXPECT_THAT(legend, HasSubstr(">W weight grad</text>"));
  EXPECT_THAT(legend, Not(HasSubstr("backward")));
  EXPECT_THAT(legend, Not(HasSubstr("input grad")));
  size_t swatches = 0;
  for (size_t at = legend.find("<rect "); at != std::string::npos;
       at = legend.find("<rect ", at + 1)) {
    ++swatches;
  }
  EXPECT_EQ(swatches, 2u);
}

TEST(SvgTest, NoTitleNoUnitKeepsTheMakespanLine) {
  const std::string svg = RenderSvg(Measured());
  EXPECT_THAT(svg, Not(HasSubstr("<title>steps")));
  EXPECT_THAT(svg, HasSubstr(">makespan 7</text>"));
  EXPECT_THAT(svg, HasSubstr("<title>F0 chunk 0 [0, 1.5)</title>"));
  // Nothing drawn: an empty legend.
  EXPECT_THAT(Legend(RenderSvg(Timeline{})), Not(HasSubstr("<rect")));
}

TEST(RenderAsciiTest, TimeUnitInTheLegend) {
  AsciiOptions o;
  o.time_unit = "ms";
  EXPECT_EQ(RenderAscii(Measured(), o),
            "time |0              2.5            5\n"
            "r0   |F0------ ...W0 .........F0------ .........\n"
            "r1   |.........F0------ ...............F0------\n"
            "1 cell = 0.5 ms; makespan 7 ms; F forward, B backward, I input grad, W weight grad, "
            ". idle\n");
}

}  // namespace
}  // namespace pipetrain::schedule
