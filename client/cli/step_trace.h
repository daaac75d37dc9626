// The measured timelines of training steps as a Chrome trace (JSON that https://ui.perfetto.dev
// and chrome://tracing open), for `pipetrain train|local --trace FILE [--trace-steps A:B]`.
//
// One process per rank ("rank R") with a track per kind of span: "compute" (each action's
// computation, named as in `pipetrain schedule`: "F3", "B3", "I3", "W3", with a chunk letter when
// V > 1), "wait" (the time the action waited for its input before computing), "send" and "recv"
// (tensors crossing the rank's links: StepResult.workers[].links; concurrent ones on extra tracks
// "send 2", "recv 2", ...). A last process, "steps", has one span per step carrying the loss and
// the measured and predicted bubble. Steps are laid end to end: step k starts where step k-1's
// span ends, and each rank's times are relative to its receipt of the step's RunStep. Every event
// has the categories "compute", "wait", "send", "recv" or "step" and args.step.
#ifndef PIPETRAIN_CLIENT_CLI_STEP_TRACE_H_
#define PIPETRAIN_CLIENT_CLI_STEP_TRACE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/schedule/ir.h"
#include "pipetrain/v1/coordinator.pb.h"

namespace pipetrain::cli {

// The steps --trace-steps selects: numbers first..last (1-based, as printed, inclusive).
struct TraceSteps {
  int64_t first = 0;
  int64_t last = 0;
  bool Contains(int64_t step) const { return step >= first && step <= last; }
};

// "A:B" (steps A to B) or "A" (step A alone), 1 <= A <= B. INVALID_ARGUMENT naming --trace-steps
// otherwise. Pure.
absl::StatusOr<TraceSteps> ParseTraceSteps(absl::string_view text);

// The Chrome trace JSON of `steps` (in the order given), their actions labelled for `placement`
// (the job's; a chunk outside it is labelled "F3 chunk 5"). INVALID_ARGUMENT if a timing has no
// op. Pure.
absl::StatusOr<std::string> RenderStepTrace(const std::vector<v1::StepResult>& steps,
                                            const schedule::Placement& placement);

}  // namespace pipetrain::cli

#endif  // PIPETRAIN_CLIENT_CLI_STEP_TRACE_H_
