// A step's measured timeline and its prediction, from the workers' StepDone reports: the part of
// a StepResult that describes where the step's time went.
#ifndef PIPETRAIN_SERVER_COORDINATOR_STEP_TIMELINE_H_
#define PIPETRAIN_SERVER_COORDINATOR_STEP_TIMELINE_H_

#include <vector>

#include "common/schedule/ir.h"
#include "pipetrain/v1/coordinator.pb.h"
#include "pipetrain/v1/worker_control.pb.h"

namespace pipetrain::coordinator {

// Fills result->workers (each rank's action timings and link spans, busy time and bubble), the
// measured bubble_fraction, link_latency_ms (schedule::EstimateLinkLatency over the tensors
// between workers; unset when no pair of ranks exchanged tensors both ways) and
// predicted_bubble_fraction: the simulator's replay of `plan` with every action's measured
// duration and that link latency (unset when the reports do not match the plan's actions).
// `reports` has one StepDone per rank of `plan`, in rank order.
void FillStepTimeline(const schedule::Plan& plan, const std::vector<const v1::StepDone*>& reports,
                      v1::StepResult* result);

}  // namespace pipetrain::coordinator

#endif  // PIPETRAIN_SERVER_COORDINATOR_STEP_TIMELINE_H_
