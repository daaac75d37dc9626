// CoordinatorService's metrics hooks: what it hands to metrics::CoordinatorMetrics
// (docs/observability.md). Kept apart from the orchestration code; each hook is a no-op without
// CoordinatorOptions::metrics.
#include <map>
#include <set>
#include <string>

#include "server/coordinator/coordinator_service.h"
#include "server/metrics/coordinator_metrics.h"

namespace pipetrain::coordinator {

void CoordinatorService::RecordStepMetrics(const Job& job, int64_t samples,
                                           const v1::StepResult& result) const {
  if (options_.metrics == nullptr) return;
  metrics::StepSample s;
  s.seconds = result.step_ms() / 1000;
  s.loss = result.loss();
  s.bubble = result.bubble_fraction();
  s.predicted_bubble = result.predicted_bubble_fraction();
  s.samples_per_second = s.seconds > 0 ? static_cast<double>(samples) / s.seconds : 0;
  options_.metrics->RecordStep(job.id, s);
}

void CoordinatorService::RecordStateMetrics() const {
  if (options_.metrics == nullptr) return;
  std::map<std::string, int> jobs_by_state;
  for (JobState state :
       {JobState::kAssigning, JobState::kReady, JobState::kTraining, JobState::kRecovering,
        JobState::kDone, JobState::kFailed, JobState::kCancelled}) {
    jobs_by_state[std::string(JobStateName(state))] = 0;
  }
  std::set<std::string> known;
  for (const auto& [id, job] : jobs_) {
    ++jobs_by_state[std::string(JobStateName(job->state))];
    known.insert(id);
  }
  std::map<std::string, int> workers_by_state = {{"idle", 0}, {"busy", 0}};
  for (const auto& [name, worker] : workers_) {
    if (worker.reactor == nullptr) continue;  // its stream is over.
    ++workers_by_state[worker.job.empty() ? "idle" : "busy"];
  }
  options_.metrics->RecordState(jobs_by_state, workers_by_state, known);
}

}  // namespace pipetrain::coordinator
