// The measured timelines of training steps, for `pipetrain train|local --trace FILE
// [--trace-steps A:B]`: as a Chrome trace (JSON that https://ui.perfetto.dev and chrome://tracing
// open), or as a picture — SVG or ASCII — drawn by the schedule renderers
// (common/schedule/timeline_render.h) like `pipetrain schedule`'s predicted ones. FILE's extension
// picks the format (TraceFormatOf).
//
// Chrome trace:
// One process per rank ("rank R") with a track per kind of span: "compute" (each action's
// computation, named as in `pipetrain schedule`: "F3", "B3", "I3", "W3", with a chunk letter when
// V > 1), "wait" (the time the action waited for its input before computing), "send" and "recv"
// (tensors crossing the rank's links: StepResult.workers[].links; concurrent ones on extra tracks
// "send 2", "recv 2", ...). A last process, "steps", has one span per step carrying the loss and
// the measured and predicted bubble. Steps are laid end to end: step k starts where step k-1's
// span ends, and each rank's times are relative to its receipt of the step's RunStep. Every event
// has the categories "compute", "wait", "send", "recv" or "step" and args.step.
//
// Pictures: one row per rank with each action's computation (its wait for input shows as idle,
// links are not drawn), in milliseconds, the steps laid end to end as above. The title names the
// schedule, S, M, V, the step(s) and the measured and predicted bubble; the SVG marks where each
// step starts; the ASCII picture ends with one line per step (time, loss, bubbles).
#ifndef PIPETRAIN_CLIENT_CLI_STEP_TRACE_H_
#define PIPETRAIN_CLIENT_CLI_STEP_TRACE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/schedule/generator.h"
#include "common/schedule/ir.h"
#include "common/schedule/timeline.h"
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

// What --trace FILE writes.
enum class TraceFormat {
  kChrome,  // Chrome trace JSON (any extension but the two below; ".json" by convention).
  kSvg,     // ".svg": a standalone SVG picture.
  kAscii,   // ".txt": an ASCII picture.
};

// The format FILE's extension asks for (case-insensitive; see TraceFormat). Pure.
TraceFormat TraceFormatOf(absl::string_view path);

// The computation of each rank's actions in `steps` as a schedule::Timeline in milliseconds:
// action [start + wait, end) of step k shifted by where step k starts (as in the Chrome trace),
// labelled for `placement`. INVALID_ARGUMENT if a timing has no op. Pure.
absl::StatusOr<schedule::Timeline> MeasuredTimeline(const std::vector<v1::StepResult>& steps,
                                                    const schedule::Placement& placement);

// `steps` of a job run with `params` in `format` (RenderStepTrace for kChrome, else a picture of
// MeasuredTimeline, see above). INVALID_ARGUMENT if `params` has no placement or a timing has no
// op. Pure.
absl::StatusOr<std::string> RenderStepTraceAs(TraceFormat format,
                                              const std::vector<v1::StepResult>& steps,
                                              const schedule::ScheduleParams& params);

}  // namespace pipetrain::cli

#endif  // PIPETRAIN_CLIENT_CLI_STEP_TRACE_H_
