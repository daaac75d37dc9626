#include "client/cli/schedule_command.h"

#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/schedule/plan_json.h"
#include "common/schedule/timeline_render.h"
#include "common/schedule/validator.h"
#include "common/util/status_macros.h"

namespace pipetrain::cli {
namespace {

absl::StatusOr<int> ParsePositiveInt(absl::string_view flag, absl::string_view text) {
  int value = 0;
  if (!absl::SimpleAtoi(text, &value) || value < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, " must be an integer >= 1 (got \"", text, "\")"));
  }
  return value;
}

absl::StatusOr<schedule::OpCosts> ParseCosts(absl::string_view text) {
  const std::vector<absl::string_view> parts = absl::StrSplit(text, ',');
  double v[4];
  bool ok = parts.size() == 4;
  for (size_t i = 0; ok && i < 4; ++i) {
    ok = absl::SimpleAtod(absl::StripAsciiWhitespace(parts[i]), &v[i]) && v[i] >= 0 &&
         v[i] <= schedule::kMaxSimulatedTime;
  }
  if (!ok) {
    return absl::InvalidArgumentError(absl::StrCat("--costs needs four numbers in [0, ",
                                                   schedule::kMaxSimulatedTime,
                                                   "], F,B,I,W (got \"", text, "\")"));
  }
  return schedule::OpCosts{v[0], v[1], v[2], v[3]};
}

std::string AsciiReport(const ScheduleCommandOptions& o, const schedule::SimulationResult& r) {
  const schedule::ScheduleParams& p = o.params;
  std::string out =
      absl::StrCat(schedule::ScheduleKindName(p.kind), ": S=", p.stages, " M=", p.microbatches,
                   " V=", p.virtual_stages, "; per-stage costs F=", FormatNumber(o.costs.f),
                   " B=", FormatNumber(o.costs.b), " I=", FormatNumber(o.costs.i),
                   " W=", FormatNumber(o.costs.w));
  if (p.kind == schedule::ScheduleKind::kDualPipe) {
    absl::StrAppend(&out, " (each chunk a whole stage: two copies of the weights)");
  } else if (p.virtual_stages > 1) {
    absl::StrAppend(&out, " (each chunk 1/", p.virtual_stages, ")");
  }
  absl::StrAppend(&out, "\n", schedule::RenderAscii(r.timeline));
  absl::StrAppend(&out, "makespan ", FormatNumber(r.stats.makespan), ", bubble fraction ",
                  FormatNumber(r.stats.bubble_fraction), "\n");
  absl::StrAppend(&out, "rank    busy        bubble      peak activations\n");
  for (size_t w = 0; w < r.stats.workers.size(); ++w) {
    const schedule::WorkerStats& ws = r.stats.workers[w];
    absl::StrAppend(
        &out, absl::StrFormat("%-7d %-11s %-11s %d\n", static_cast<int>(w), FormatNumber(ws.busy),
                              FormatNumber(ws.bubble_fraction), ws.peak_activations));
  }
  return out;
}

// The SVG's title: the schedule, its shape and the simulator's bubble.
std::string SvgTitle(const ScheduleCommandOptions& o, const schedule::SimulationResult& r) {
  const schedule::ScheduleParams& p = o.params;
  return absl::StrCat(schedule::ScheduleKindName(p.kind), ": S=", p.stages, " M=", p.microbatches,
                      " V=", p.virtual_stages, ", predicted bubble ",
                      FormatNumber(r.stats.bubble_fraction), " (costs F=", FormatNumber(o.costs.f),
                      " B=", FormatNumber(o.costs.b), " I=", FormatNumber(o.costs.i),
                      " W=", FormatNumber(o.costs.w), ")");
}

}  // namespace

absl::StatusOr<ScheduleCommandOptions> ParseScheduleCommandOptions(
    absl::string_view kind, absl::string_view stages, absl::string_view microbatches,
    absl::string_view virtual_stages, absl::string_view costs_csv, absl::string_view format) {
  ScheduleCommandOptions o;
  if (kind.empty()) {
    return absl::InvalidArgumentError(
        "--schedule is required: gpipe, 1f1b, interleaved, zb-h1, zb-v, dualpipe-v, "
        "1f1b-overlap, interleaved-overlap or dualpipe");
  }
  PT_ASSIGN_OR_RETURN(o.params.kind, schedule::ParseScheduleKind(kind));
  if (stages.empty()) {
    return absl::InvalidArgumentError("--stages is required: the pipeline's stage count (S)");
  }
  PT_ASSIGN_OR_RETURN(o.params.stages, ParsePositiveInt("stages", stages));
  if (microbatches.empty()) return absl::InvalidArgumentError("--microbatches is required");
  PT_ASSIGN_OR_RETURN(o.params.microbatches, ParsePositiveInt("microbatches", microbatches));
  if (virtual_stages.empty()) {
    o.params.virtual_stages = schedule::DefaultVirtualStages(o.params.kind);
  } else {
    PT_ASSIGN_OR_RETURN(o.params.virtual_stages, ParsePositiveInt("virtual", virtual_stages));
  }
  if (!costs_csv.empty()) {
    PT_ASSIGN_OR_RETURN(o.costs, ParseCosts(costs_csv));
  }
  if (format.empty() || format == "ascii") {
    o.format = ScheduleFormat::kAscii;
  } else if (format == "json") {
    o.format = ScheduleFormat::kJson;
  } else if (format == "chrome") {
    o.format = ScheduleFormat::kChrome;
  } else if (format == "svg") {
    o.format = ScheduleFormat::kSvg;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--format must be ascii, json, chrome or svg (got \"", format, "\")"));
  }
  PT_RETURN_IF_ERROR(schedule::CheckScheduleParams(o.params));
  return o;
}

std::string FormatNumber(double x) { return absl::StrFormat("%.6g", x); }

absl::StatusOr<std::string> RunScheduleCommand(const ScheduleCommandOptions& options) {
  PT_ASSIGN_OR_RETURN(schedule::Plan plan, schedule::GenerateSchedule(options.params));
  if (absl::Status valid = schedule::ValidatePlan(plan); !valid.ok()) {
    return absl::InternalError(absl::StrCat("generated plan is invalid: ", valid.message()));
  }
  PT_ASSIGN_OR_RETURN(
      schedule::SimulationResult result,
      schedule::Simulate(plan, schedule::UniformCostModel(plan.placement, options.costs)));
  switch (options.format) {
    case ScheduleFormat::kAscii:
      return AsciiReport(options, result);
    case ScheduleFormat::kJson:
      return schedule::ScheduleReportToJson(plan, result.stats).dump() + "\n";
    case ScheduleFormat::kChrome:
      return schedule::RenderChromeTrace(result.timeline, 1000);
    case ScheduleFormat::kSvg: {
      schedule::SvgOptions svg;
      svg.title = SvgTitle(options, result);
      return schedule::RenderSvg(result.timeline, svg);
    }
  }
  return absl::InvalidArgumentError("unknown output format");
}

}  // namespace pipetrain::cli
