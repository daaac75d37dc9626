// Plan validation: what the executor and the numerics rely on.
//
// Thread-safe pure functions. Every error is INVALID_ARGUMENT and names the rank, the position in
// its action list and the action, e.g. "rank 1 position 4: W(mb=0, chunk=1) accumulates weight
// gradients after W(mb=2, chunk=1) at position 3; ...".
#ifndef PIPETRAIN_COMMON_SCHEDULE_VALIDATOR_H_
#define PIPETRAIN_COMMON_SCHEDULE_VALIDATOR_H_

#include "absl/status/status.h"
#include "common/schedule/ir.h"

namespace pipetrain::schedule {

// Checks everything but deadlock freedom:
//  - the placement is valid, M >= 1, M*S*V <= kMaxChunkMicrobatches (generator.h) and there is
//    one action list per rank;
//  - every action names a micro-batch in [0, M) and a chunk in [0, S*V) held by its rank and
//    on the micro-batch's route (Plan::RouteBegin/RouteEnd: every chunk unless bidirectional);
//  - every (mb, chunk) on the route has exactly one F and either exactly one B or exactly one I
//    and one W;
//  - per (mb, chunk), F runs before its B or I, and I before its W;
//  - per chunk, the weight-gradient accumulations (its Bs and Ws) run in increasing micro-batch
//    order, so that gradient sums are bitwise identical under every schedule.
absl::Status CheckPlanStructure(const Plan& plan);

// CheckPlanStructure() and then proves the plan completes under the executor's model (in-order
// actions per rank, non-blocking sends, a rank waits only for its next action's inputs) by
// running it. A deadlock error lists each blocked rank with its position, the action it cannot
// start and the input it waits for. O(number of actions).
absl::Status ValidatePlan(const Plan& plan);

}  // namespace pipetrain::schedule

#endif  // PIPETRAIN_COMMON_SCHEDULE_VALIDATOR_H_
