// JSON form of a plan and of its simulation (the `pipetrain schedule --format json` contract).
// Keys keep the documented order (nlohmann::ordered_json). Pure functions; thread-safe.
#ifndef PIPETRAIN_COMMON_SCHEDULE_PLAN_JSON_H_
#define PIPETRAIN_COMMON_SCHEDULE_PLAN_JSON_H_

#include "common/schedule/ir.h"
#include "common/schedule/timeline.h"
#include "nlohmann/json.hpp"

namespace pipetrain::schedule {

// {"kind": "1f1b", "stages": S, "microbatches": M, "virtual": V,
//  "placement": [[chunks of rank 0], ...],
//  "actions": [[{"op": "F"|"B"|"I"|"W", "mb": int, "chunk": int}, ...], ...]}
nlohmann::ordered_json PlanToJson(const Plan& plan);

// PlanToJson(plan) plus "simulation": {"makespan", "bubble_fraction",
//  "per_worker": [{"busy", "bubble_fraction", "peak_activations"}, ...]}.
nlohmann::ordered_json ScheduleReportToJson(const Plan& plan, const TimelineStats& stats);

}  // namespace pipetrain::schedule

#endif  // PIPETRAIN_COMMON_SCHEDULE_PLAN_JSON_H_
