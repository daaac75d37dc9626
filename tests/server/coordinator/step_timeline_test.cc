// FillStepTimeline: the prediction of a measured step charges the link latency the reports show,
// estimated free of the ranks' clock offsets, and without links it is the compute-only replay.
#include "server/coordinator/step_timeline.h"

#include <vector>

#include "common/schedule/generator.h"
#include "common/schedule/simulator.h"
#include "gtest/gtest.h"
#include "pipetrain/v1/worker_control.pb.h"
#include "server/control/control_proto.h"

namespace pipetrain::coordinator {
namespace {

namespace v1 = ::pipetrain::v1;

constexpr double kLatencyMs = 0.5;
// Each rank's clock starts at its receipt of RunStep: rank r's reads kOffsetMs[r] less.
constexpr double kOffsetMs[] = {0.0, 0.2};

schedule::Plan OneFOneB() {
  schedule::ScheduleParams params;
  params.kind = schedule::ScheduleKind::kOneFOneB;
  params.stages = 2;
  params.microbatches = 4;
  absl::StatusOr<schedule::Plan> plan = schedule::GenerateSchedule(params);
  EXPECT_TRUE(plan.ok()) << plan.status();
  return *plan;
}

// F costs 1 ms, B 2 ms.
schedule::CostModel Costs(const schedule::Plan& plan, double latency) {
  schedule::CostModel costs = schedule::UniformCostModel(plan.placement, {});
  for (schedule::OpCosts& c : costs.chunk_costs) {
    c.f = 1;
    c.b = 2;
  }
  costs.link.latency = latency;
  return costs;
}

v1::LinkSpan Span(v1::LinkDirection direction, int peer, v1::TensorKind kind, int mb, int chunk,
                  double start_ms, double end_ms) {
  v1::LinkSpan s;
  s.set_direction(direction);
  s.set_peer(absl::StrCat("stage/", peer));
  s.set_kind(kind);
  s.set_microbatch(mb);
  s.set_chunk(chunk);
  s.set_start_us(start_ms * 1000);
  s.set_end_us(end_ms * 1000);
  s.set_complete(true);
  return s;
}

// The reports of a step that ran exactly as `sim` (each rank on its own clock), with the link
// spans of every tensor between the ranks when `links`.
std::vector<v1::StepDone> Reports(const schedule::SimulationResult& sim, bool links) {
  std::vector<v1::StepDone> reports(2);
  for (int rank = 0; rank < 2; ++rank) {
    for (const schedule::TimedAction& a : sim.timeline.workers[rank]) {
      v1::ActionTiming* t = reports[rank].add_timings();
      *t->mutable_action() = control::ActionToProto(a.action);
      t->set_start_us((a.start - kOffsetMs[rank]) * 1000);
      t->set_end_us((a.end - kOffsetMs[rank]) * 1000);
      if (!links) continue;
      // Rank 0's F sends an activation to rank 1; rank 1's B sends a gradient back.
      const bool sends = (rank == 0 && a.action.op == schedule::Op::kForward) ||
                         (rank == 1 && a.action.op == schedule::Op::kBackward);
      if (!sends) continue;
      const int peer = 1 - rank;
      const v1::TensorKind kind = rank == 0 ? v1::TENSOR_KIND_ACTIVATION : v1::TENSOR_KIND_GRADIENT;
      const int chunk = rank == 0 ? 1 : 0;
      *reports[rank].add_links() = Span(v1::LINK_DIRECTION_SEND, peer, kind, a.action.mb, chunk,
                                        a.end - kOffsetMs[rank], a.end - kOffsetMs[rank] + 0.05);
      const double arrival = a.end + kLatencyMs - kOffsetMs[peer];
      *reports[peer].add_links() =
          Span(v1::LINK_DIRECTION_RECEIVE, rank, kind, a.action.mb, chunk, arrival - 0.1, arrival);
    }
  }
  return reports;
}

// The plan simulated with the link latency and without.
struct Simulated {
  absl::StatusOr<schedule::SimulationResult> with_links;
  absl::StatusOr<schedule::SimulationResult> compute_only;
  static Simulated Of(const schedule::Plan& plan) {
    return {schedule::Simulate(plan, Costs(plan, kLatencyMs)),
            schedule::Simulate(plan, Costs(plan, 0))};
  }
};

std::vector<const v1::StepDone*> Pointers(const std::vector<v1::StepDone>& reports) {
  std::vector<const v1::StepDone*> out;
  for (const v1::StepDone& r : reports) out.push_back(&r);
  return out;
}

TEST(StepTimelineTest, ThePredictionChargesTheMeasuredLinkLatency) {
  const schedule::Plan plan = OneFOneB();
  const Simulated sim = Simulated::Of(plan);
  ASSERT_TRUE(sim.with_links.ok() && sim.compute_only.ok());
  const schedule::SimulationResult& with_links = *sim.with_links;
  const schedule::SimulationResult& compute_only = *sim.compute_only;
  ASSERT_GT(with_links.stats.bubble_fraction, compute_only.stats.bubble_fraction + 0.05);

  std::vector<v1::StepDone> reports = Reports(with_links, /*links=*/true);
  reports[0].set_update_us(1250.5);  // each rank's update before the step passes through.
  reports[1].set_update_us(0);
  v1::StepResult result;
  FillStepTimeline(plan, Pointers(reports), &result);
  ASSERT_TRUE(result.has_link_latency_ms());
  EXPECT_NEAR(result.link_latency_ms(), kLatencyMs, 1e-9);
  EXPECT_NEAR(result.predicted_bubble_fraction(), with_links.stats.bubble_fraction, 1e-9);
  ASSERT_EQ(result.workers_size(), 2);
  EXPECT_EQ(result.workers(1).links_size(), reports[1].links_size());
  EXPECT_EQ(result.workers(0).timings_size(), static_cast<int>(plan.actions[0].size()));
  EXPECT_EQ(result.workers(0).update_us(), 1250.5);
  EXPECT_EQ(result.workers(1).update_us(), 0.0);
  EXPECT_GT(result.bubble_fraction(), 0.0);
}

TEST(StepTimelineTest, WithoutLinkSpansThePredictionIsComputeOnly) {
  const schedule::Plan plan = OneFOneB();
  const Simulated sim = Simulated::Of(plan);
  ASSERT_TRUE(sim.with_links.ok() && sim.compute_only.ok());
  const schedule::SimulationResult& with_links = *sim.with_links;
  const schedule::SimulationResult& compute_only = *sim.compute_only;
  const std::vector<v1::StepDone> reports = Reports(with_links, /*links=*/false);
  v1::StepResult result;
  FillStepTimeline(plan, Pointers(reports), &result);
  EXPECT_FALSE(result.has_link_latency_ms());
  EXPECT_NEAR(result.predicted_bubble_fraction(), compute_only.stats.bubble_fraction, 1e-9);
}

TEST(StepTimelineTest, ReportsThatDoNotMatchThePlanGetNoPrediction) {
  const schedule::Plan plan = OneFOneB();
  absl::StatusOr<schedule::SimulationResult> sim = schedule::Simulate(plan, Costs(plan, 0));
  ASSERT_TRUE(sim.ok());
  std::vector<v1::StepDone> reports = Reports(*sim, /*links=*/false);
  reports[1].mutable_timings()->RemoveLast();
  v1::StepResult result;
  FillStepTimeline(plan, Pointers(reports), &result);
  EXPECT_EQ(result.predicted_bubble_fraction(), 0.0);
  EXPECT_EQ(result.workers(1).timings_size(), static_cast<int>(plan.actions[1].size()) - 1);
}

}  // namespace
}  // namespace pipetrain::coordinator
