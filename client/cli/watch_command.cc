#include "client/cli/watch_command.h"

#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "client/cli/interrupt.h"
#include "client/cli/job_commands.h"
#include "client/cli/progress.h"
#include "client/cli/shape_line.h"
#include "client/sdk/job_watch.h"
#include "common/util/status_macros.h"
#include "nlohmann/json.hpp"

namespace pipetrain::cli {
namespace {

// "done", "failed", ... from JOB_STATE_DONE, ...
std::string StateWord(v1::JobState state) {
  std::string name = v1::JobState_Name(state);
  absl::string_view word = name;
  absl::ConsumePrefix(&word, "JOB_STATE_");
  return absl::AsciiStrToLower(word);
}

// `text` as a JSON string, quotes included.
std::string Json(const std::string& text) { return nlohmann::json(text).dump(); }

// Each of `texts` as a JSON string, joined with ", ".
std::string JsonList(const google::protobuf::RepeatedPtrField<std::string>& texts) {
  std::vector<std::string> quoted;
  for (const std::string& t : texts) quoted.push_back(Json(t));
  return absl::StrJoin(quoted, ", ");
}

// One line per rank, as `pipetrain train` prints the layout: "  rank 0  w0   ADDRESS  layers
// [0, 3)".
void PrintRanks(const google::protobuf::RepeatedPtrField<v1::StageStatus>& stages, int replicas,
                std::ostream& out) {
  for (const v1::StageStatus& s : stages) {
    const std::string where = replicas > 1
                                  ? absl::StrFormat("replica %d rank %d", s.replica(), s.rank())
                                  : absl::StrFormat("rank %d", s.rank());
    out << absl::StrFormat("  %s  %-16s %-22s layers", where, s.worker(), s.address());
    for (const v1::ChunkSpec& c : s.chunks()) {
      out << absl::StrFormat(" [%d, %d)", c.first_layer(), c.last_layer());
    }
    out << "\n";
  }
}

// What happened to the worker a recovery replaces: "worker 'w1' (rank 1) was lost".
std::string LossText(const v1::RecoveryEvent& r) {
  if (r.lost_worker().empty()) return r.cause();  // "coordinator restart"
  return absl::StrFormat(
      "worker '%s' (rank %d) was %s", r.lost_worker(), r.rank(),
      r.cause() == "deadline" ? "evicted (it missed a step's deadline)" : r.cause());
}

}  // namespace

void WatchPrinter::Print(const v1::JobEvent& event) {
  switch (event.kind_case()) {
    case v1::JobEvent::kStatus:
      return PrintStatus(event.status());
    case v1::JobEvent::kStep:
      return PrintStep(event.step(), event.unix_ms());
    case v1::JobEvent::kRecovering:
      return PrintRecovering(event.recovering());
    case v1::JobEvent::kRecovered:
      return PrintRecovered(event.recovered());
    case v1::JobEvent::kCheckpoint:
      return PrintCheckpoint(event.checkpoint());
    case v1::JobEvent::kEnded:
      return PrintEnded(event.ended());
    case v1::JobEvent::kSkipped:
      return PrintSkipped(event.skipped());
    case v1::JobEvent::kShapeChanged:
      return PrintShapeChanged(event.shape_changed());
    case v1::JobEvent::KIND_NOT_SET:
      return;  // a kind this client does not know (a newer coordinator): nothing to print.
  }
}

void WatchPrinter::PrintStatus(const v1::JobStatus& job) {
  job_ = job.job();
  target_step_ = job.progress().target_step();
  if (options_.json) {
    out_ << "{\"status\": " << JobStatusJson(job, absl::Now()) << "}\n";
    return;
  }
  const v1::JobSpec& s = job.spec();
  out_ << absl::StrFormat(
      "job %s: %s, %d%s steps done; %s, schedule %s, imbalance %.3f, instruction set %s\n",
      job.job(), StateWord(job.state()), job.steps_done(),
      target_step_ > 0 ? absl::StrCat(" of ", target_step_) : "", ShapeText(job), s.schedule(),
      job.imbalance(), s.isa());
  PrintRanks(job.stages(), job.replicas(), out_);
}

void WatchPrinter::PrintStep(const v1::StepCommitted& step, int64_t unix_ms) {
  // A recovery restarts the job from its checkpoint and its client replays the steps since: they
  // were printed when first applied, as `pipetrain train` prints them once.
  if (step.step() <= last_step_) return;
  last_step_ = step.step();
  if (options_.json) {
    // The line `pipetrain train --json` prints for the step (client/cli/train_command.cc).
    out_ << absl::StrFormat(
        "{\"step\": %d, \"loss\": %.9g, \"step_ms\": %.3f, \"bubble_fraction\": %.4f, "
        "\"predicted_bubble_fraction\": %.4f, \"link_latency_ms\": %s}\n",
        step.step(), step.loss(), step.step_ms(), step.bubble_fraction(),
        step.predicted_bubble_fraction(),
        step.has_link_latency_ms() ? absl::StrFormat("%.4f", step.link_latency_ms()) : "null");
    return;
  }
  window_samples_ += step.samples();
  window_bubble_ += step.bubble_fraction();
  window_predicted_ += step.predicted_bubble_fraction();
  ++window_steps_;
  // As `pipetrain train` to a file: the first step, every --log-every-th and the last.
  const bool due = window_start_ms_ < 0 ||
                   step.step() % std::max<int64_t>(1, options_.log_every) == 0 ||
                   step.step() == target_step_;
  if (due) {
    PrintStepLine(step, unix_ms);
  } else {
    unprinted_.emplace(step, unix_ms);
  }
}

void WatchPrinter::PrintStepLine(const v1::StepCommitted& step, int64_t unix_ms) {
  // Samples/s over the commits since the last line (the first line: the step's own time).
  double rate = 0;
  if (window_start_ms_ < 0) {
    if (step.step_ms() > 0) rate = static_cast<double>(step.samples()) * 1000 / step.step_ms();
  } else if (unix_ms > window_start_ms_) {
    rate = static_cast<double>(window_samples_) * 1000 /
           static_cast<double>(unix_ms - window_start_ms_);
  }
  const double steps = static_cast<double>(std::max<int64_t>(1, window_steps_));
  out_ << PlainStepLine(step.step(), step.loss(), rate,
                        std::make_pair(window_bubble_ / steps, window_predicted_ / steps))
       << "\n";
  window_start_ms_ = unix_ms;
  window_samples_ = 0;
  window_bubble_ = window_predicted_ = 0;
  window_steps_ = 0;
  unprinted_.reset();
}

void WatchPrinter::FlushStep() {
  if (!unprinted_.has_value()) return;
  const auto [step, unix_ms] = *unprinted_;
  PrintStepLine(step, unix_ms);
}

void WatchPrinter::PrintRecovering(const v1::RecoveryEvent& r) {
  if (options_.json) {
    out_ << absl::StrFormat(
        "{\"recovering\": {\"lost_worker\": %s, \"rank\": %d, \"cause\": %s, "
        "\"after_step\": %d}}\n",
        Json(r.lost_worker()), r.rank(), Json(r.cause()), r.steps_done());
    return;
  }
  // As `pipetrain train` says while it waits for the recovery.
  out_ << absl::StrFormat("after step %d: %s; waiting for job %s to recover\n", r.steps_done(),
                          LossText(r), job_);
}

void WatchPrinter::PrintRecovered(const v1::JobRecovered& recovered) {
  const v1::RecoveryEvent& r = recovered.recovery();
  if (options_.json) {
    // The line `pipetrain train --json` prints for the recovery.
    out_ << absl::StrFormat(
        "{\"recovery\": {\"lost_worker\": %s, \"rank\": %d, \"cause\": %s, "
        "\"steps_done\": %d, \"restored_step\": %d, \"generation\": %d, \"stages\": %d, "
        "\"workers\": [%s], \"seconds\": %.3f}}\n",
        Json(r.lost_worker()), r.rank(), Json(r.cause()), r.steps_done(), r.restored_step(),
        r.generation(), r.stages(), JsonList(r.workers()), r.seconds());
    return;
  }
  const std::string lost =
      r.lost_worker().empty()
          ? r.cause()
          : absl::StrFormat("%s (rank %d, %s)", r.lost_worker(), r.rank(), r.cause());
  out_ << absl::StrFormat(
      "recovered: lost %s after step %d; restarted from step %d on %d stages%s (%s) in %.2f s; "
      "replayed %d steps\n",
      lost, r.steps_done(), r.restored_step(), r.stages(),
      r.replicas() > 1 ? absl::StrCat(" x ", r.replicas(), " replicas") : "",
      absl::StrJoin(r.workers(), ", "), r.seconds(), r.steps_done() - r.restored_step());
  // stages: every worker by position (replica x stages + rank); r.stages(): the stage count.
  if (recovered.stages_before() != r.stages()) {
    out_ << absl::StrFormat("re-partitioned from %d to %d stages, imbalance %.3f:\n",
                            recovered.stages_before(), r.stages(), recovered.imbalance());
    PrintRanks(recovered.stages(), r.replicas(), out_);
  }
}

void WatchPrinter::PrintShapeChanged(const v1::ShapeChange& c) {
  // The line `pipetrain train` prints for it (text or JSON).
  if (!options_.json) FlushStep();
  out_ << ShapeChangeLine(c, options_.json);
}

void WatchPrinter::PrintCheckpoint(const v1::CheckpointWritten& c) {
  if (options_.json) {
    out_ << absl::StrFormat("{\"checkpoint\": {\"step\": %d, \"directory\": %s}}\n", c.step(),
                            Json(c.directory()));
    return;
  }
  // As `pipetrain train` reports its checkpoints.
  out_ << absl::StrFormat("checkpoint of step %d written to %s\n", c.step(), c.directory());
}

void WatchPrinter::PrintEnded(const v1::JobEnded& e) {
  ended_ = e;
  if (options_.json) {
    out_ << absl::StrFormat(
        "{\"ended\": {\"state\": \"%s\", \"reason\": %s, \"steps_done\": %d}}\n",
        StateWord(e.state()), Json(e.reason()), e.steps_done());
    return;
  }
  FlushStep();  // the last step's line, as `pipetrain train` ends with it.
  out_ << absl::StrFormat("job %s %s after %d steps%s\n", job_, StateWord(e.state()),
                          e.steps_done(), e.reason().empty() ? "" : ": " + e.reason());
}

void WatchPrinter::PrintSkipped(const v1::EventsSkipped& s) {
  if (options_.json) {
    out_ << absl::StrFormat("{\"skipped\": {\"count\": %d}}\n", s.count());
    return;
  }
  out_ << absl::StrFormat(
      "(%d events skipped: the coordinator keeps the last --job-events events of a job)\n",
      s.count());
}

absl::Status RunWatchCommand(const WatchCommandOptions& o, std::ostream& out) {
  if (o.job.empty()) {
    return absl::InvalidArgumentError(
        "usage: pipetrain watch JOB --coordinator HOST:PORT (the job id, as `pipetrain jobs` "
        "lists it)");
  }
  if (o.coordinator.empty()) {
    return absl::InvalidArgumentError(
        "--coordinator HOST:PORT is required (or the environment variable "
        "PIPETRAIN_COORDINATOR): the address a running coordinator listens on (its --listen)");
  }
  PT_ASSIGN_OR_RETURN(std::unique_ptr<client::Client> client,
                      client::Client::Connect(o.coordinator, o.client));
  PT_ASSIGN_OR_RETURN(std::unique_ptr<client::JobWatch> watch, client->WatchJob(o.job));
  WatchPrinter printer(o, out);
  // Ctrl-C ends the stream (declared after `watch`, so it stops before the watch goes).
  InterruptWatcher stop([&watch] { watch->Cancel(); });
  for (;;) {
    absl::StatusOr<std::optional<v1::JobEvent>> next = watch->Next();
    if (!next.ok() && InterruptScope::Interrupted()) {
      return absl::CancelledError(
          absl::StrCat("interrupted: stopped watching job ", o.job, "; the job goes on"));
    }
    PT_RETURN_IF_ERROR(next.status());
    if (!next->has_value()) break;
    printer.Print(**next);
    out.flush();
  }
  const std::optional<v1::JobEnded>& ended = printer.ended();
  if (!ended.has_value()) {
    return absl::UnavailableError(
        absl::StrCat("the coordinator ended the watch of job ", o.job, " before the job ended"));
  }
  if (ended->state() == v1::JOB_STATE_DONE) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("job ", o.job, " ", StateWord(ended->state()), " after ", ended->steps_done(),
                   " steps", ended->reason().empty() ? "" : ": " + ended->reason()));
}

}  // namespace pipetrain::cli
