#include "client/cli/step_trace.h"

#include <map>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace pipetrain::cli {
namespace {

using nlohmann::json;

v1::ActionTiming Timing(v1::ActionOp op, int mb, double start, double wait, double end) {
  v1::ActionTiming t;
  t.mutable_action()->set_op(op);
  t.mutable_action()->set_microbatch(mb);
  t.mutable_action()->set_chunk(0);
  t.set_start_us(start);
  t.set_wait_us(wait);
  t.set_end_us(end);
  return t;
}

v1::LinkSpan Span(bool send, v1::TensorKind kind, int mb, double start, double end) {
  v1::LinkSpan l;
  l.set_direction(send ? v1::LINK_DIRECTION_SEND : v1::LINK_DIRECTION_RECEIVE);
  l.set_peer("stage/1");
  l.set_kind(kind);
  l.set_microbatch(mb);
  l.set_bytes(1024);
  l.set_start_us(start);
  l.set_end_us(end);
  l.set_complete(true);
  return l;
}

// A one-rank step `step` of `step_ms`: F0 waits 10 us then computes to 50; two overlapping sends
// and one receive (of the replicas' reduction).
v1::StepResult Step(int64_t step, double step_ms) {
  v1::StepResult r;
  r.set_step(step);
  r.set_loss(0.5f);
  r.set_step_ms(step_ms);
  r.set_bubble_fraction(0.25);
  r.set_predicted_bubble_fraction(0.125);
  v1::WorkerTimeline* w = r.add_workers();
  *w->add_timings() = Timing(v1::ACTION_OP_FORWARD, 0, 0, 10, 50);
  *w->add_timings() = Timing(v1::ACTION_OP_BACKWARD, 0, 50, 0, 80);
  *w->add_links() = Span(true, v1::TENSOR_KIND_ACTIVATION, 0, 50, 70);
  *w->add_links() = Span(true, v1::TENSOR_KIND_ACTIVATION, 1, 60, 90);  // overlaps the first
  *w->add_links() = Span(false, v1::TENSOR_KIND_REPLICA_GRADIENT, 0, 75, 78);
  return r;
}

// The "X" events of `trace` by category.
std::map<std::string, std::vector<json>> ByCategory(const json& trace) {
  std::map<std::string, std::vector<json>> events;
  for (const json& e : trace["traceEvents"]) {
    if (e["ph"] == "X") events[e["cat"]].push_back(e);
  }
  return events;
}

TEST(ParseTraceStepsTest, RangesAndSingleSteps) {
  absl::StatusOr<TraceSteps> s = ParseTraceSteps("3:7");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->first, 3);
  EXPECT_EQ(s->last, 7);
  EXPECT_TRUE(s->Contains(3) && s->Contains(7));
  EXPECT_FALSE(s->Contains(2) || s->Contains(8));
  s = ParseTraceSteps("5");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->first, 5);
  EXPECT_EQ(s->last, 5);
  for (const char* bad : {"", "0:3", "4:3", "a:b", "1:2:3", "3:", ":3", "-1"}) {
    absl::StatusOr<TraceSteps> r = ParseTraceSteps(bad);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(r.status().message(), ::testing::HasSubstr("--trace-steps")) << bad;
  }
}

TEST(RenderStepTraceTest, ComputeWaitSendAndReceiveSpansOfConsecutiveSteps) {
  schedule::Placement placement;  // one stage, one chunk
  absl::StatusOr<std::string> text = RenderStepTrace({Step(4, 0.1), Step(5, 0.05)}, placement);
  ASSERT_TRUE(text.ok()) << text.status();
  const json trace = json::parse(*text);
  auto events = ByCategory(trace);
  ASSERT_EQ(events["step"].size(), 2u);
  // Step 4 spans its 100 us; step 5 (50 us of step_ms, but its actions end at 90 us) starts
  // where step 4 ends and lasts 90 us.
  EXPECT_EQ(events["step"][0]["ts"], 0.0);
  EXPECT_EQ(events["step"][0]["dur"], 100.0);
  EXPECT_EQ(events["step"][1]["ts"], 100.0);
  EXPECT_EQ(events["step"][1]["dur"], 90.0);
  EXPECT_EQ(events["step"][1]["args"]["predicted_bubble_fraction"], 0.125);
  // Compute starts after the wait; a wait of 0 draws nothing.
  ASSERT_EQ(events["compute"].size(), 4u);
  EXPECT_EQ(events["compute"][0]["name"], "F0");
  EXPECT_EQ(events["compute"][0]["ts"], 10.0);
  EXPECT_EQ(events["compute"][0]["dur"], 40.0);
  EXPECT_EQ(events["compute"][3]["name"], "B0");
  EXPECT_EQ(events["compute"][3]["ts"], 150.0);
  EXPECT_EQ(events["compute"][3]["args"]["step"], 5);
  ASSERT_EQ(events["wait"].size(), 2u);
  EXPECT_EQ(events["wait"][0]["name"], "wait F0");
  EXPECT_EQ(events["wait"][1]["ts"], 100.0);
  EXPECT_EQ(events["wait"][1]["dur"], 10.0);
  // The overlapping sends are on two lanes (tracks); the receive on its own.
  ASSERT_EQ(events["send"].size(), 4u);
  EXPECT_NE(events["send"][0]["tid"], events["send"][1]["tid"]);
  EXPECT_EQ(events["send"][0]["tid"], events["send"][2]["tid"]) << "lanes are reused";
  EXPECT_EQ(events["send"][0]["name"], "activation mb 0 to stage/1");
  EXPECT_EQ(events["send"][1]["args"]["bytes"], 1024);
  ASSERT_EQ(events["recv"].size(), 2u);
  EXPECT_EQ(events["recv"][0]["name"], "replica_gradient mb 0 from stage/1");
  EXPECT_EQ(events["recv"][1]["ts"], 175.0);
  EXPECT_EQ(events["recv"][1]["dur"], 3.0);
  // Tracks are named per rank: compute, wait, send, send 2, recv; processes rank 0 and steps.
  std::map<std::pair<int, int>, std::string> tracks;
  std::map<int, std::string> processes;
  for (const json& e : trace["traceEvents"]) {
    if (e["name"] == "thread_name") tracks[{e["pid"], e["tid"]}] = e["args"]["name"];
    if (e["name"] == "process_name") processes[e["pid"]] = e["args"]["name"];
  }
  EXPECT_EQ(processes, (std::map<int, std::string>{{0, "rank 0"}, {1, "steps"}}));
  std::vector<std::string> names;
  for (const auto& [key, name] : tracks) {
    if (key.first == 0) names.push_back(name);
  }
  EXPECT_THAT(names, ::testing::UnorderedElementsAre("compute", "wait", "send", "send 2", "recv"));
}

TEST(RenderStepTraceTest, BadTimesAreClampedAndAMissingOpIsRefused) {
  v1::StepResult r = Step(1, 0.1);
  *r.mutable_workers(0)->add_timings() = Timing(v1::ACTION_OP_FORWARD, 1, -5, -1, -2);
  absl::StatusOr<std::string> text = RenderStepTrace({r}, schedule::Placement());
  ASSERT_TRUE(text.ok()) << text.status();
  // The document must outlive the loop: a range-for over a temporary's element would read freed
  // memory.
  const json trace = json::parse(*text);
  for (const json& e : trace["traceEvents"]) {
    if (e["ph"] != "X") continue;
    EXPECT_GE(e["ts"].get<double>(), 0.0) << e.dump();
    EXPECT_GE(e["dur"].get<double>(), 0.0) << e.dump();
  }
  r.mutable_workers(0)->mutable_timings(0)->mutable_action()->clear_op();
  EXPECT_EQ(RenderStepTrace({r}, schedule::Placement()).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pipetrain::cli
