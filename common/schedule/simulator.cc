#include "common/schedule/simulator.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/schedule/plan_execution.h"
#include "common/schedule/validator.h"
#include "common/util/status_macros.h"

namespace pipetrain::schedule {
namespace {

// INVALID_ARGUMENT "<what> must be in [lo, hi] (got value)" unless lo <= value <= hi (NaN fails).
absl::Status CheckRange(double value, double lo, double hi, const std::string& what) {
  if (!(value >= lo && value <= hi)) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " must be in [", lo, ", ", hi, "] (got ", value, ")"));
  }
  return absl::OkStatus();
}

absl::Status CheckTime(double value, const std::string& what) {
  return CheckRange(value, 0.0, kMaxSimulatedTime, what);
}

absl::Status CheckOpCosts(const OpCosts& c, const std::string& what, double max) {
  PT_RETURN_IF_ERROR(CheckRange(c.f, 0.0, max, absl::StrCat(what, " F")));
  PT_RETURN_IF_ERROR(CheckRange(c.b, 0.0, max, absl::StrCat(what, " B")));
  PT_RETURN_IF_ERROR(CheckRange(c.i, 0.0, max, absl::StrCat(what, " I")));
  PT_RETURN_IF_ERROR(CheckRange(c.w, 0.0, max, absl::StrCat(what, " W")));
  return absl::OkStatus();
}

// A link's latency is a time; its bandwidth 0 (infinite) or in range.
absl::Status CheckLink(const LinkModel& link, const std::string& what) {
  PT_RETURN_IF_ERROR(CheckTime(link.latency, what + " latency"));
  if (link.bandwidth != 0 &&
      !(link.bandwidth >= kMinBandwidth && link.bandwidth <= kMaxBandwidth)) {
    return absl::InvalidArgumentError(absl::StrCat(what, " bandwidth must be 0 (infinite) or in [",
                                                   kMinBandwidth, ", ", kMaxBandwidth, "] (got ",
                                                   link.bandwidth, ")"));
  }
  return absl::OkStatus();
}

absl::Status CheckCostModel(const Plan& plan, const CostModel& costs) {
  const size_t c_count = static_cast<size_t>(plan.num_chunks());
  if (costs.action_durations.empty()) {
    if (costs.chunk_costs.size() != c_count) {
      return absl::InvalidArgumentError(absl::StrCat("cost model has ", costs.chunk_costs.size(),
                                                     " chunk costs; the plan has ", c_count,
                                                     " chunks"));
    }
    for (size_t c = 0; c < c_count; ++c) {
      PT_RETURN_IF_ERROR(CheckOpCosts(costs.chunk_costs[c], absl::StrCat("chunk ", c, " cost"),
                                      kMaxSimulatedTime));
    }
  } else {
    if (costs.action_durations.size() != plan.actions.size()) {
      return absl::InvalidArgumentError(absl::StrCat("measured durations cover ",
                                                     costs.action_durations.size(),
                                                     " ranks; the plan has ", plan.actions.size()));
    }
    for (size_t w = 0; w < plan.actions.size(); ++w) {
      if (costs.action_durations[w].size() != plan.actions[w].size()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "measured durations of rank ", w, " have ", costs.action_durations[w].size(),
            " entries; the rank has ", plan.actions[w].size(), " actions"));
      }
      for (size_t p = 0; p < plan.actions[w].size(); ++p) {
        PT_RETURN_IF_ERROR(
            CheckTime(costs.action_durations[w][p],
                      absl::StrCat("measured duration of rank ", w, " position ", p)));
      }
    }
  }
  if (!costs.action_output_times.empty()) {
    if (costs.action_durations.empty() ||
        costs.action_output_times.size() != costs.action_durations.size()) {
      return absl::InvalidArgumentError(
          "measured output times need measured durations of the same shape");
    }
    for (size_t w = 0; w < costs.action_output_times.size(); ++w) {
      if (costs.action_output_times[w].size() != costs.action_durations[w].size()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "measured output times of rank ", w, " have ", costs.action_output_times[w].size(),
            " entries; its durations ", costs.action_durations[w].size()));
      }
      for (size_t p = 0; p < costs.action_output_times[w].size(); ++p) {
        const double t = costs.action_output_times[w][p];
        PT_RETURN_IF_ERROR(
            CheckTime(t, absl::StrCat("measured output time of rank ", w, " position ", p)));
        if (t > costs.action_durations[w][p]) {
          return absl::InvalidArgumentError(
              absl::StrCat("measured output time of rank ", w, " position ", p, " (", t,
                           ") is after the action's end (", costs.action_durations[w][p], ")"));
        }
      }
    }
  }
  if (!costs.worker_start.empty()) {
    if (costs.worker_start.size() != plan.actions.size()) {
      return absl::InvalidArgumentError(absl::StrCat("start times cover ",
                                                     costs.worker_start.size(),
                                                     " ranks; the plan has ", plan.actions.size()));
    }
    for (size_t w = 0; w < costs.worker_start.size(); ++w) {
      PT_RETURN_IF_ERROR(CheckTime(costs.worker_start[w], absl::StrCat("start time of rank ", w)));
    }
  }
  for (const auto& [name, bytes] : {std::pair<const char*, const std::vector<double>*>{
                                        "activation bytes", &costs.activation_bytes},
                                    {"boundary bytes", &costs.boundary_bytes}}) {
    if (!bytes->empty() && bytes->size() != c_count) {
      return absl::InvalidArgumentError(absl::StrCat(
          name, " has ", bytes->size(), " entries; the plan has ", c_count, " chunks"));
    }
    for (size_t c = 0; c < bytes->size(); ++c) {
      PT_RETURN_IF_ERROR(
          CheckRange((*bytes)[c], 0.0, kMaxSimulatedBytes, absl::StrCat(name, " of chunk ", c)));
    }
  }
  PT_RETURN_IF_ERROR(CheckLink(costs.link, "link"));
  if (!costs.boundary_links.empty() && costs.boundary_links.size() != c_count) {
    return absl::InvalidArgumentError(absl::StrCat("boundary links has ",
                                                   costs.boundary_links.size(),
                                                   " entries; the plan has ", c_count, " chunks"));
  }
  for (size_t c = 0; c < costs.boundary_links.size(); ++c) {
    PT_RETURN_IF_ERROR(CheckLink(costs.boundary_links[c], absl::StrCat("link after chunk ", c)));
  }
  return absl::OkStatus();
}

}  // namespace

double OpCosts::Of(Op op) const {
  switch (op) {
    case Op::kForward:
      return f;
    case Op::kBackward:
      return b;
    case Op::kInputGrad:
      return i;
    case Op::kWeightGrad:
      return w;
  }
  return 0;
}

CostModel UniformCostModel(const Placement& placement, const OpCosts& per_stage) {
  // A bidirectional chunk is a whole stage (1/S of the model) that half the micro-batches pass.
  const double v = placement.virtual_stages > 0 && placement.kind != PlacementKind::kBidirectional
                       ? placement.virtual_stages
                       : 1;
  CostModel model;
  model.chunk_costs.assign(
      static_cast<size_t>(std::max(placement.num_chunks(), 0)),
      OpCosts{per_stage.f / v, per_stage.b / v, per_stage.i / v, per_stage.w / v});
  return model;
}

absl::StatusOr<CostModel> CostModelFromFlops(const Placement& placement,
                                             const std::vector<OpCosts>& chunk_flops,
                                             const std::vector<double>& worker_speed) {
  PT_RETURN_IF_ERROR(ValidatePlacement(placement));
  if (static_cast<int>(chunk_flops.size()) != placement.num_chunks()) {
    return absl::InvalidArgumentError(absl::StrCat("chunk FLOPs has ", chunk_flops.size(),
                                                   " entries; the placement has ",
                                                   placement.num_chunks(), " chunks"));
  }
  if (static_cast<int>(worker_speed.size()) != placement.stages) {
    return absl::InvalidArgumentError(absl::StrCat("speeds have ", worker_speed.size(),
                                                   " entries; the placement has ", placement.stages,
                                                   " ranks"));
  }
  for (size_t w = 0; w < worker_speed.size(); ++w) {
    PT_RETURN_IF_ERROR(CheckRange(worker_speed[w], kMinFlopsPerTime, kMaxFlopsPerTime,
                                  absl::StrCat("speed of rank ", w)));
  }
  CostModel model;
  model.chunk_costs.reserve(chunk_flops.size());
  for (int c = 0; c < placement.num_chunks(); ++c) {
    const OpCosts& fl = chunk_flops[c];
    PT_RETURN_IF_ERROR(CheckOpCosts(fl, absl::StrCat("chunk ", c, " FLOPs"), kMaxSimulatedFlops));
    const double speed = worker_speed[placement.OwnerOf(c)];
    model.chunk_costs.push_back(OpCosts{fl.f / speed, fl.b / speed, fl.i / speed, fl.w / speed});
  }
  return model;
}

absl::StatusOr<SimulationResult> Simulate(const Plan& plan, const CostModel& costs) {
  PT_RETURN_IF_ERROR(CheckPlanStructure(plan));
  PT_RETURN_IF_ERROR(CheckCostModel(plan, costs));
  std::vector<std::vector<double>> durations;
  if (!costs.action_durations.empty()) {
    durations = costs.action_durations;
  } else {
    durations.resize(plan.actions.size());
    for (size_t w = 0; w < plan.actions.size(); ++w) {
      durations[w].reserve(plan.actions[w].size());
      for (const Action& a : plan.actions[w]) {
        durations[w].push_back(costs.chunk_costs[a.chunk].Of(a.op));
      }
    }
  }
  // Each boundary's message: its link's latency, plus its bytes over its bandwidth.
  std::vector<double> delay;
  const int c_count = plan.num_chunks();
  bool any_delay = false;
  std::vector<double> boundary(static_cast<size_t>(c_count > 1 ? c_count - 1 : 0), 0.0);
  for (size_t c = 0; c < boundary.size(); ++c) {
    const LinkModel& link = costs.boundary_links.empty() ? costs.link : costs.boundary_links[c];
    boundary[c] = link.latency;
    if (link.bandwidth > 0 && !costs.boundary_bytes.empty()) {
      boundary[c] += costs.boundary_bytes[c] / link.bandwidth;
    }
    any_delay = any_delay || boundary[c] > 0;
  }
  if (any_delay) delay = std::move(boundary);
  SimulationResult result;
  result.timeline.placement = plan.placement;
  PT_ASSIGN_OR_RETURN(result.timeline.workers,
                      internal::ExecuteInOrder(plan, durations, delay, costs.action_output_times,
                                               costs.worker_start));
  PT_ASSIGN_OR_RETURN(result.stats, SummarizeTimeline(result.timeline, costs.activation_bytes));
  return result;
}

}  // namespace pipetrain::schedule
