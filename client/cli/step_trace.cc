#include "client/cli/step_trace.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/schedule/timeline_render.h"
#include "common/wire/tensor_key.h"
#include "nlohmann/json.hpp"

namespace pipetrain::cli {
namespace {

using nlohmann::json;

// Thread ids within a rank's process: compute, wait, then the send and receive lanes.
constexpr int kComputeTid = 0;
constexpr int kWaitTid = 1;
constexpr int kSendTid = 100;  // lane l: kSendTid + l.
constexpr int kRecvTid = 200;

absl::StatusOr<schedule::Action> ActionOf(const v1::Action& a) {
  schedule::Action action;
  switch (a.op()) {
    case v1::ACTION_OP_FORWARD:
      action.op = schedule::Op::kForward;
      break;
    case v1::ACTION_OP_BACKWARD:
      action.op = schedule::Op::kBackward;
      break;
    case v1::ACTION_OP_INPUT_GRAD:
      action.op = schedule::Op::kInputGrad;
      break;
    case v1::ACTION_OP_WEIGHT_GRAD:
      action.op = schedule::Op::kWeightGrad;
      break;
    default:
      return absl::InvalidArgumentError("a worker reported an action without an op");
  }
  action.mb = a.microbatch();
  action.chunk = a.chunk();
  return action;
}

std::string Label(const schedule::Placement& placement, const schedule::Action& a) {
  if (a.chunk >= 0 && a.chunk < placement.num_chunks()) return schedule::ActionLabel(placement, a);
  const schedule::Placement linear;  // one chunk per worker: no chunk letter.
  return absl::StrCat(schedule::ActionLabel(linear, a), " chunk ", a.chunk);
}

// "activation", "gradient", "input", "target", "tied_gradient" ("unknown" otherwise):
// v1::TensorKind and wire::TensorKind share their numbers (tensor.proto).
const char* KindName(v1::TensorKind kind) {
  if (kind < v1::TENSOR_KIND_ACTIVATION || kind > v1::TENSOR_KIND_COPY_GRADIENT) return "unknown";
  return wire::TensorKindName(static_cast<wire::TensorKind>(kind));
}

// A finite, non-negative time in microseconds (measured times can be anything on the wire).
double Clean(double us) { return std::isfinite(us) && us > 0 ? us : 0.0; }

// How long step `r` lasts in the traces, in microseconds: its step time, or longer if an action
// or a link span ends later (each rank's times start at its receipt of RunStep).
double StepLength(const v1::StepResult& r) {
  double length = Clean(r.step_ms() * 1000);
  for (const v1::WorkerTimeline& w : r.workers()) {
    for (const v1::ActionTiming& t : w.timings()) length = std::max(length, Clean(t.end_us()));
    for (const v1::LinkSpan& l : w.links()) length = std::max(length, Clean(l.end_us()));
  }
  return length;
}

// Metadata naming and ordering a track: `what` "thread" (thread `tid` of process `pid`) or
// "process" (process `pid`).
void NameTrack(json& events, const std::string& what, int pid, int tid, const std::string& name,
               int sort_index) {
  events.push_back({{"name", what + "_name"},
                    {"ph", "M"},
                    {"pid", pid},
                    {"tid", tid},
                    {"args", {{"name", name}}}});
  events.push_back({{"name", what + "_sort_index"},
                    {"ph", "M"},
                    {"pid", pid},
                    {"tid", tid},
                    {"args", {{"sort_index", sort_index}}}});
}

// A complete ("X") event.
json Span(const std::string& name, const std::string& cat, int pid, int tid, double ts, double dur,
          json args) {
  return {{"name", name}, {"cat", cat}, {"ph", "X"},  {"ts", ts},
          {"dur", dur},   {"pid", pid}, {"tid", tid}, {"args", std::move(args)}};
}

// Places possibly overlapping spans on lanes so that each lane's spans follow one another (a
// trace viewer nests or drops overlapping slices of one track): lane_end[l] is lane l's last end.
int LaneFor(std::vector<double>& lane_end, double start, double end) {
  for (size_t l = 0; l < lane_end.size(); ++l) {
    if (lane_end[l] <= start) {
      lane_end[l] = end;
      return static_cast<int>(l);
    }
  }
  lane_end.push_back(end);
  return static_cast<int>(lane_end.size()) - 1;
}

}  // namespace

absl::StatusOr<TraceSteps> ParseTraceSteps(absl::string_view text) {
  const std::vector<absl::string_view> parts = absl::StrSplit(text, ':');
  TraceSteps steps;
  bool parsed = false;
  if (parts.size() == 1) {
    parsed = absl::SimpleAtoi(parts[0], &steps.first);
    steps.last = steps.first;
  } else if (parts.size() == 2) {
    parsed = absl::SimpleAtoi(parts[0], &steps.first) && absl::SimpleAtoi(parts[1], &steps.last);
  }
  if (!parsed || steps.first < 1 || steps.last < steps.first) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--trace-steps must be A:B (steps A to B, 1 <= A <= B) or A, got '", text, "'"));
  }
  return steps;
}

absl::StatusOr<std::string> RenderStepTrace(const std::vector<v1::StepResult>& steps,
                                            const schedule::Placement& placement) {
  json events = json::array();
  int ranks = 0;
  for (const v1::StepResult& r : steps) ranks = std::max(ranks, r.workers_size());
  const int steps_pid = ranks;
  NameTrack(events, "process", steps_pid, 0, "steps", -1);
  NameTrack(events, "thread", steps_pid, 0, "step", 0);
  // Lanes per rank; they carry on across steps (which do not overlap).
  std::vector<std::vector<double>> send_lanes(ranks), recv_lanes(ranks);
  std::vector<int> send_named(ranks, 0), recv_named(ranks, 0);
  for (int rank = 0; rank < ranks; ++rank) {
    NameTrack(events, "process", rank, 0, absl::StrCat("rank ", rank), rank);
    NameTrack(events, "thread", rank, kComputeTid, "compute", 0);
    NameTrack(events, "thread", rank, kWaitTid, "wait", 1);
  }
  double offset = 0;  // where the current step starts, in microseconds.
  for (const v1::StepResult& r : steps) {
    const double length = StepLength(r);
    events.push_back(
        Span(absl::StrCat("step ", r.step()), "step", steps_pid, 0, offset, length,
             {{"step", r.step()},
              {"loss", r.loss()},
              {"step_ms", r.step_ms()},
              {"bubble_fraction", r.bubble_fraction()},
              {"predicted_bubble_fraction", r.predicted_bubble_fraction()},
              {"link_latency_ms", r.has_link_latency_ms() ? nlohmann::json(r.link_latency_ms())
                                                          : nlohmann::json(nullptr)}}));
    for (int rank = 0; rank < r.workers_size(); ++rank) {
      const v1::WorkerTimeline& w = r.workers(rank);
      for (const v1::ActionTiming& t : w.timings()) {
        absl::StatusOr<schedule::Action> action = ActionOf(t.action());
        if (!action.ok()) return action.status();
        const std::string label = Label(placement, *action);
        const double start = Clean(t.start_us());
        const double ready = std::max(start, Clean(t.start_us() + t.wait_us()));
        const double end = std::max(ready, Clean(t.end_us()));
        const json args = {{"step", r.step()}, {"mb", action->mb}, {"chunk", action->chunk}};
        if (ready > start) {
          events.push_back(
              Span("wait " + label, "wait", rank, kWaitTid, offset + start, ready - start, args));
        }
        events.push_back(
            Span(label, "compute", rank, kComputeTid, offset + ready, end - ready, args));
      }
      for (const v1::LinkSpan& l : w.links()) {
        const bool send = l.direction() == v1::LINK_DIRECTION_SEND;
        const double start = Clean(l.start_us());
        const double end = std::max(start, Clean(l.end_us()));
        std::vector<double>& lanes = send ? send_lanes[rank] : recv_lanes[rank];
        const int lane = LaneFor(lanes, offset + start, offset + end);
        const int tid = (send ? kSendTid : kRecvTid) + lane;
        int& named = send ? send_named[rank] : recv_named[rank];
        for (; named <= lane; ++named) {
          const std::string track = send ? "send" : "recv";
          NameTrack(events, "thread", rank, (send ? kSendTid : kRecvTid) + named,
                    named == 0 ? track : absl::StrCat(track, " ", named + 1),
                    (send ? 2 : 3) * 1000 + named);
        }
        events.push_back(Span(absl::StrCat(KindName(l.kind()), " mb ", l.microbatch(),
                                           send ? " to " : " from ", l.peer()),
                              send ? "send" : "recv", rank, tid, offset + start, end - start,
                              {{"step", r.step()},
                               {"peer", l.peer()},
                               {"kind", KindName(l.kind())},
                               {"mb", l.microbatch()},
                               {"chunk", l.chunk()},
                               {"bytes", l.bytes()},
                               {"complete", l.complete()}}));
      }
    }
    offset += length;
  }
  json trace = {{"traceEvents", std::move(events)}, {"displayTimeUnit", "ms"}};
  return trace.dump() + "\n";
}

TraceFormat TraceFormatOf(absl::string_view path) {
  if (absl::EndsWithIgnoreCase(path, ".svg")) return TraceFormat::kSvg;
  if (absl::EndsWithIgnoreCase(path, ".txt")) return TraceFormat::kAscii;
  return TraceFormat::kChrome;
}

absl::StatusOr<schedule::Timeline> MeasuredTimeline(const std::vector<v1::StepResult>& steps,
                                                    const schedule::Placement& placement) {
  schedule::Timeline timeline;
  timeline.placement = placement;
  double offset = 0;  // where the current step starts, in microseconds.
  for (const v1::StepResult& r : steps) {
    if (timeline.workers.size() < static_cast<size_t>(r.workers_size())) {
      timeline.workers.resize(r.workers_size());
    }
    for (int rank = 0; rank < r.workers_size(); ++rank) {
      for (const v1::ActionTiming& t : r.workers(rank).timings()) {
        absl::StatusOr<schedule::Action> action = ActionOf(t.action());
        if (!action.ok()) return action.status();
        // As in the Chrome trace's compute spans: from the end of the wait to the end.
        const double start = Clean(t.start_us());
        const double ready = std::max(start, Clean(t.start_us() + t.wait_us()));
        const double end = std::max(ready, Clean(t.end_us()));
        timeline.workers[rank].push_back({*action, (offset + ready) / 1000, (offset + end) / 1000});
      }
    }
    offset += StepLength(r);
  }
  return timeline;
}

namespace {

// "1f1b S=2 M=4 V=1, step 4 measured: bubble 0.310 (predicted 0.286)", or for several steps
// "..., steps 2 to 3 measured: mean bubble 0.310 (predicted 0.286)".
std::string PictureTitle(const std::vector<v1::StepResult>& steps,
                         const schedule::ScheduleParams& params) {
  std::string title = absl::StrCat(schedule::ScheduleKindName(params.kind), ": S=", params.stages,
                                   " M=", params.microbatches, " V=", params.virtual_stages, ", ");
  if (steps.empty()) return title + "no steps";
  double bubble = 0;
  double predicted = 0;
  for (const v1::StepResult& r : steps) {
    bubble += r.bubble_fraction();
    predicted += r.predicted_bubble_fraction();
  }
  const double n = static_cast<double>(steps.size());
  if (steps.size() == 1) {
    absl::StrAppend(&title, "step ", steps[0].step(), " measured: bubble ");
  } else {
    absl::StrAppend(&title, "steps ", steps.front().step(), " to ", steps.back().step(),
                    " measured: mean bubble ");
  }
  absl::StrAppend(&title, absl::StrFormat("%.3f (predicted %.3f)", bubble / n, predicted / n));
  return title;
}

// ASCII cells of a measured picture: about this many across (a terminal's worth, two screens).
constexpr double kAsciiCells = 150;

// The smallest 1, 2 or 5 times a power of ten that is >= `x` (> 0), so the ruler reads 0.05,
// 0.1, ... rather than 0.0592754; 1 for anything else.
double NiceAtLeast(double x) {
  if (!(x > 0) || !std::isfinite(x)) return 1;
  const double power = std::pow(10.0, std::floor(std::log10(x)));
  for (double m : {1.0, 2.0, 5.0}) {
    if (m * power >= x) return m * power;
  }
  return 10 * power;
}

}  // namespace

absl::StatusOr<std::string> RenderStepTraceAs(TraceFormat format,
                                              const std::vector<v1::StepResult>& steps,
                                              const schedule::ScheduleParams& params) {
  absl::StatusOr<schedule::Placement> placement = schedule::PlacementFor(params);
  if (!placement.ok()) return placement.status();
  if (format == TraceFormat::kChrome) return RenderStepTrace(steps, *placement);
  absl::StatusOr<schedule::Timeline> timeline = MeasuredTimeline(steps, *placement);
  if (!timeline.ok()) return timeline.status();
  const std::string title = PictureTitle(steps, params);
  if (format == TraceFormat::kSvg) {
    schedule::SvgOptions svg;
    svg.title = title;
    svg.time_unit = "ms";
    double offset = 0;
    for (const v1::StepResult& r : steps) {
      svg.marks.push_back({offset / 1000, absl::StrCat("step ", r.step())});
      offset += StepLength(r);
    }
    return schedule::RenderSvg(*timeline, svg);
  }
  schedule::AsciiOptions ascii;
  ascii.time_unit = "ms";
  ascii.time_per_cell = NiceAtLeast(timeline->Makespan() / kAsciiCells);
  std::string out = absl::StrCat(title, "\n", schedule::RenderAscii(*timeline, ascii));
  for (const v1::StepResult& r : steps) {
    absl::StrAppend(&out, absl::StrFormat("step %d: %.3f ms, loss %.6g, bubble %.3f (predicted "
                                          "%.3f)\n",
                                          r.step(), r.step_ms(), r.loss(), r.bubble_fraction(),
                                          r.predicted_bubble_fraction()));
  }
  return out;
}

}  // namespace pipetrain::cli
