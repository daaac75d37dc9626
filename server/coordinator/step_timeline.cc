#include "server/coordinator/step_timeline.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "common/schedule/link_latency.h"
#include "common/schedule/simulator.h"
#include "common/schedule/timeline.h"
#include "pipetrain/v1/worker_control.pb.h"
#include "server/control/control_proto.h"
#include "server/link/peer_link.h"

namespace pipetrain::coordinator {
namespace {

namespace v1 = ::pipetrain::v1;

// The rank named by a link span's peer ("stage/<rank>"), or -1 (the coordinator, or malformed).
int PeerRank(absl::string_view peer, int stages) {
  int rank = -1;
  if (!absl::ConsumePrefix(&peer, link::kStagePeerPrefix) || !absl::SimpleAtoi(peer, &rank) ||
      rank < 0 || rank >= stages) {
    return -1;
  }
  return rank;
}

// The tensors between workers as each end recorded them (times in ms on its own clock).
std::vector<schedule::LinkObservation> LinkObservations(
    const std::vector<const v1::StepDone*>& reports) {
  const int stages = static_cast<int>(reports.size());
  std::vector<schedule::LinkObservation> out;
  for (int rank = 0; rank < stages; ++rank) {
    for (const v1::LinkSpan& span : reports[rank]->links()) {
      const int peer = PeerRank(span.peer(), stages);
      if (peer < 0 || peer == rank || !span.complete()) continue;
      if (span.direction() != v1::LINK_DIRECTION_SEND &&
          span.direction() != v1::LINK_DIRECTION_RECEIVE) {
        continue;
      }
      out.push_back(schedule::LinkObservation{
          span.direction() == v1::LINK_DIRECTION_SEND, rank, peer, static_cast<int>(span.kind()),
          span.microbatch(), span.chunk(), span.start_us() / 1000.0, span.end_us() / 1000.0});
    }
  }
  return out;
}

}  // namespace

void FillStepTimeline(const schedule::Plan& plan, const std::vector<const v1::StepDone*>& reports,
                      v1::StepResult* result) {
  const int S = static_cast<int>(reports.size());
  schedule::Timeline timeline;
  timeline.placement = plan.placement;
  timeline.workers.resize(S);
  schedule::CostModel costs = schedule::UniformCostModel(plan.placement, {});
  costs.action_durations.resize(S);
  bool replayable = S == plan.stages();
  for (int rank = 0; rank < S; ++rank) {
    v1::WorkerTimeline* wt = result->add_workers();
    wt->set_rank(rank);
    const v1::StepDone& r = *reports[rank];
    *wt->mutable_links() = r.links();
    wt->set_update_us(r.update_us());
    if (!replayable || r.timings_size() != static_cast<int>(plan.actions[rank].size())) {
      replayable = false;
    }
    for (int p = 0; p < r.timings_size(); ++p) {
      const v1::ActionTiming& t = r.timings(p);
      *wt->add_timings() = t;
      schedule::TimedAction ta;
      absl::StatusOr<schedule::Action> action = control::ActionFromProto(t.action());
      if (action.ok()) {
        ta.action = *action;
      } else {
        replayable = false;
      }
      ta.start = (t.start_us() + t.wait_us()) / 1000.0;
      ta.end = std::max(ta.start, t.end_us() / 1000.0);
      timeline.workers[rank].push_back(ta);
      costs.action_durations[rank].push_back(ta.end - ta.start);
      if (replayable && !(ta.action == plan.actions[rank][p])) replayable = false;
    }
  }
  absl::StatusOr<schedule::TimelineStats> stats = schedule::SummarizeTimeline(timeline, {});
  if (stats.ok()) {
    result->set_bubble_fraction(stats->bubble_fraction);
    for (int rank = 0; rank < S && rank < static_cast<int>(stats->workers.size()); ++rank) {
      result->mutable_workers(rank)->set_busy_ms(stats->workers[rank].busy);
      result->mutable_workers(rank)->set_bubble_fraction(stats->workers[rank].bubble_fraction);
    }
  }
  const std::optional<double> latency = schedule::EstimateLinkLatency(LinkObservations(reports));
  if (latency.has_value()) {
    result->set_link_latency_ms(*latency);
    costs.link.latency = *latency;
  }
  if (replayable) {
    absl::StatusOr<schedule::SimulationResult> sim = schedule::Simulate(plan, costs);
    if (sim.ok()) result->set_predicted_bubble_fraction(sim->stats.bubble_fraction);
  }
}

}  // namespace pipetrain::coordinator
