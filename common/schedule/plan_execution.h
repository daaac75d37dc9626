// Internal: runs a plan under the executor's model and times every action.
//
// Model: each rank runs its actions strictly in order; an action starts when its rank is free
// and its inputs have arrived; sends never block. Inputs: F(mb, c) needs the activation of
// F(mb, c-1); B or I(mb, c) needs F(mb, c) and the input gradient produced by B or I(mb, c+1)
// (none for the last chunk, whose F computes the loss); W(mb, c) needs I(mb, c). "First" and
// "last" are those of the micro-batch's route (Plan::RouteBegin/RouteEnd). A message between
// chunks on different ranks arrives `boundary_delay[c]` after its producer ends (c is the lower
// chunk of the boundary); on the same rank it is available at once.
#ifndef PIPETRAIN_COMMON_SCHEDULE_PLAN_EXECUTION_H_
#define PIPETRAIN_COMMON_SCHEDULE_PLAN_EXECUTION_H_

#include <vector>

#include "absl/status/statusor.h"
#include "common/schedule/ir.h"
#include "common/schedule/timeline.h"

namespace pipetrain::schedule::internal {

// Times every action of `plan`, which must have passed CheckPlanStructure(). `durations` has the
// shape of plan.actions; `boundary_delay` is empty (no link delay) or has num_chunks-1 entries.
// `output_times` is empty or has the shape of plan.actions: when, after its start, an action's
// output (activation, input gradient) is available (else at its end). `worker_start` is empty or
// has one entry per rank: the earliest start of its first action (else 0).
// Returns the per-rank intervals, or INVALID_ARGUMENT if the plan deadlocks, naming each blocked
// rank, its position, the action it cannot start and the input it waits for. O(number of
// actions) time and O(M * S * V) memory.
absl::StatusOr<std::vector<std::vector<TimedAction>>> ExecuteInOrder(
    const Plan& plan, const std::vector<std::vector<double>>& durations,
    const std::vector<double>& boundary_delay,
    const std::vector<std::vector<double>>& output_times = {},
    const std::vector<double>& worker_start = {});

}  // namespace pipetrain::schedule::internal

#endif  // PIPETRAIN_COMMON_SCHEDULE_PLAN_EXECUTION_H_
