#include "common/schedule/plan_json.h"

#include <string>
#include <vector>

namespace pipetrain::schedule {

nlohmann::ordered_json PlanToJson(const Plan& plan) {
  nlohmann::ordered_json placement = nlohmann::ordered_json::array();
  for (int w = 0; w < plan.stages(); ++w) placement.push_back(plan.placement.ChunksOf(w));
  nlohmann::ordered_json actions = nlohmann::ordered_json::array();
  for (const std::vector<Action>& list : plan.actions) {
    nlohmann::ordered_json worker = nlohmann::ordered_json::array();
    for (const Action& a : list) {
      worker.push_back({{"op", std::string(OpLetter(a.op))}, {"mb", a.mb}, {"chunk", a.chunk}});
    }
    actions.push_back(std::move(worker));
  }
  return {{"kind", std::string(ScheduleKindName(plan.kind))},
          {"stages", plan.stages()},
          {"microbatches", plan.microbatches},
          {"virtual", plan.virtual_stages()},
          {"placement", std::move(placement)},
          {"actions", std::move(actions)}};
}

nlohmann::ordered_json ScheduleReportToJson(const Plan& plan, const TimelineStats& stats) {
  nlohmann::ordered_json report = PlanToJson(plan);
  nlohmann::ordered_json per_worker = nlohmann::ordered_json::array();
  for (const WorkerStats& w : stats.workers) {
    per_worker.push_back({{"busy", w.busy},
                          {"bubble_fraction", w.bubble_fraction},
                          {"peak_activations", w.peak_activations}});
  }
  report["simulation"] = {{"makespan", stats.makespan},
                          {"bubble_fraction", stats.bubble_fraction},
                          {"per_worker", std::move(per_worker)}};
  return report;
}

}  // namespace pipetrain::schedule
