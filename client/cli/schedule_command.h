// `pipetrain schedule`: generate, validate, simulate and draw a pipeline schedule.
//
//   pipetrain schedule --schedule gpipe|1f1b|interleaved|zb-h1|zb-v|dualpipe-v|1f1b-overlap|
//                                 interleaved-overlap|dualpipe --stages S
//       --microbatches M [--virtual V] [--costs F,B,I,W] --format ascii|json|chrome|svg
//
// main() parses the flags into strings and calls ParseScheduleCommandOptions() once; the run
// function returns the text to print. Thread-safe pure functions.
#ifndef PIPETRAIN_CLIENT_CLI_SCHEDULE_COMMAND_H_
#define PIPETRAIN_CLIENT_CLI_SCHEDULE_COMMAND_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/schedule/generator.h"
#include "common/schedule/simulator.h"

namespace pipetrain::cli {

enum class ScheduleFormat {
  kAscii,   // Picture, one row per worker, plus the figures.
  kJson,    // One JSON object: plan + simulation (see common/schedule/plan_json.h).
  kChrome,  // Chrome trace event JSON; one time unit is shown as 1 ms.
  kSvg,     // Standalone SVG document.
};

struct ScheduleCommandOptions {
  // --schedule (required; or its former name --kind), --stages S (required, >= 1),
  // --microbatches M (required, >= 1), --virtual V (default: 2 for interleaved,
  // interleaved-overlap, zb-v, dualpipe-v and dualpipe, else 1). Checked against the kind's
  // rules (schedule::CheckScheduleParams).
  schedule::ScheduleParams params;
  // --costs F,B,I,W (default 1,2,1,1): time of one micro-batch through one worker's share of the
  // model (1/S of it) for forward, full backward, input-gradient and weight-gradient; each of a
  // worker's V chunks costs 1/V of it. Each in [0, schedule::kMaxSimulatedTime] (1e33).
  schedule::OpCosts costs;
  ScheduleFormat format = ScheduleFormat::kAscii;  // --format (default ascii).
};

// Parses raw flag values (empty = flag not given) and validates them once. INVALID_ARGUMENT
// naming the flag and the rule, e.g. "--stages must be an integer >= 1 (got \"0\")" or the
// schedule's own rule ("interleaved 1F1B needs microbatches (3) >= stages (4)").
absl::StatusOr<ScheduleCommandOptions> ParseScheduleCommandOptions(
    absl::string_view kind, absl::string_view stages, absl::string_view microbatches,
    absl::string_view virtual_stages, absl::string_view costs_csv, absl::string_view format);

// Generates, validates and simulates the schedule and returns the output in the chosen format
// (ending with a newline). Errors: INVALID_ARGUMENT for options that did not come from the parser
// and break a rule; INTERNAL if a generated plan fails validation (a bug).
absl::StatusOr<std::string> RunScheduleCommand(const ScheduleCommandOptions& options);

// A number as `schedule` and `partition` print it: 6 significant digits ("%.6g"). Pure.
std::string FormatNumber(double x);

}  // namespace pipetrain::cli

#endif  // PIPETRAIN_CLIENT_CLI_SCHEDULE_COMMAND_H_
