// Each job's event log (WatchJob) and training pace (JobStatus.progress): what is recorded as
// steps commit, recoveries end, checkpoints are published and the job ends, and the watches that
// read it.
#include <algorithm>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/net/principal.h"
#include "common/util/annotate.h"
#include "common/util/status_macros.h"
#include "server/coordinator/coordinator_core.h"

namespace pipetrain::coordinator {

absl::StatusOr<CoordinatorCore::WatchStart> CoordinatorCore::OpenWatch(const std::string& id,
                                                                       const std::string& caller,
                                                                       int64_t after,
                                                                       JobWatcher* watcher) {
  absl::MutexLock lock(&mu_);
  if (shutting_down_) return absl::CancelledError("coordinator shutting down");
  // As FindJob, but without renewing the client lease: a watcher does not keep a job alive.
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("unknown job '", id, "'"));
  Job& job = *it->second;
  job.mu.AssertHeld();
  if (!net::MaySee(caller, job.owner)) {
    return absl::NotFoundError(absl::StrCat("unknown job '", id, "'"));
  }
  absl::StatusOr<int64_t> watch = job.events.AddWatch(
      watcher, after, static_cast<size_t>(std::max(1, options_.max_watches_per_job)));
  if (!watch.ok()) return util::Annotate(watch.status(), absl::StrCat("job '", id, "'"));
  return WatchStart{*watch, StatusOf(job)};
}

absl::StatusOr<std::optional<v1::JobEvent>> CoordinatorCore::NextWatchEvent(const std::string& id,
                                                                            int64_t watch) {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("unknown job '", id, "'"));
  it->second->mu.AssertHeld();
  return it->second->events.Next(watch);
}

void CoordinatorCore::CloseWatch(const std::string& id, int64_t watch) {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return;
  it->second->mu.AssertHeld();
  it->second->events.RemoveWatch(watch);
}

void CoordinatorCore::RecordEvent(Job& job, v1::JobEvent event) {
  job.events.Append(std::move(event), absl::Now());
}

void CoordinatorCore::RecordStepCommitted(Job& job, int64_t samples, const v1::StepResult& result) {
  v1::JobEvent event;
  v1::StepCommitted* step = event.mutable_step();
  step->set_step(result.step());
  step->set_loss(result.loss());
  step->set_step_ms(result.step_ms());
  step->set_bubble_fraction(result.bubble_fraction());
  step->set_predicted_bubble_fraction(result.predicted_bubble_fraction());
  if (result.has_link_latency_ms()) step->set_link_latency_ms(result.link_latency_ms());
  step->set_samples(samples);
  job.pace.OnCommitted(*step, absl::Now());
  RecordEvent(job, std::move(event));
}

void CoordinatorCore::RecordRecovered(Job& job, int stages_before) {
  v1::JobEvent event;
  v1::JobRecovered* recovered = event.mutable_recovered();
  if (!job.recoveries.empty()) *recovered->mutable_recovery() = job.recoveries.back();
  recovered->set_stages_before(stages_before);
  *recovered->mutable_stages() = StatusOf(job).stages();
  recovered->set_imbalance(job.imbalance);
  job.pace.Restart();
  RecordEvent(job, std::move(event));
}

v1::JobProgress CoordinatorCore::ProgressOf(const Job& job) const {
  // The target: the step the job started at (its resumed checkpoint's) plus the planned steps.
  int64_t target = 0;
  if (job.spec.planned_steps() > 0) {
    target = (job.resume.has_value() ? job.resume->step : 0) + job.spec.planned_steps();
  }
  return job.pace.Progress(job.steps_done, target, !IsTerminal(job.state));
}

}  // namespace pipetrain::coordinator
