#include "server/metrics/coordinator_metrics.h"

#include <utility>
#include <vector>

namespace pipetrain::metrics {
namespace {

// Step times from 1 ms to ~2 min, doubling.
std::vector<double> StepBuckets() {
  std::vector<double> b;
  for (double s = 0.001; s < 150; s *= 2) b.push_back(s);
  return b;
}

}  // namespace

CoordinatorMetrics::CoordinatorMetrics(MetricsRegistry& registry)
    : steps_(prometheus::BuildCounter()
                 .Name("pipetrain_job_steps_total")
                 .Help("Training steps applied, per job")
                 .Register(registry.registry())),
      step_seconds_(prometheus::BuildHistogram()
                        .Name("pipetrain_job_step_seconds")
                        .Help("Wall time of an applied training step at the coordinator")
                        .Register(registry.registry())),
      loss_(prometheus::BuildGauge()
                .Name("pipetrain_job_loss")
                .Help("Loss of the job's last applied step")
                .Register(registry.registry())),
      bubble_(prometheus::BuildGauge()
                  .Name("pipetrain_job_bubble_ratio")
                  .Help("Pipeline bubble of the last step: idle share of the workers' time "
                        "(source=measured) and the simulator's prediction from the measured "
                        "action costs (source=predicted)")
                  .Register(registry.registry())),
      samples_per_second_(prometheus::BuildGauge()
                              .Name("pipetrain_job_samples_per_second")
                              .Help("Training samples per second "
                                    "in the last step")
                              .Register(registry.registry())),
      samples_(prometheus::BuildCounter()
                   .Name("pipetrain_job_samples_total")
                   .Help("Training samples (batch rows) of the applied steps, per job")
                   .Register(registry.registry())),
      recoveries_(prometheus::BuildCounter()
                      .Name("pipetrain_job_recoveries_total")
                      .Help("Times the job recovered from a lost worker")
                      .Register(registry.registry())),
      isa_(prometheus::BuildGauge()
               .Name("pipetrain_job_isa_info")
               .Help("1 for the instruction-set level the job's math runs at (label isa)")
               .Register(registry.registry())),
      jobs_(prometheus::BuildGauge()
                .Name("pipetrain_jobs")
                .Help("Jobs the coordinator lists, by state")
                .Register(registry.registry())),
      workers_(prometheus::BuildGauge()
                   .Name("pipetrain_workers")
                   .Help("Registered workers, by state (idle, busy: holding a job's stage)")
                   .Register(registry.registry())) {}

template <typename T, typename... Args>
T* CoordinatorMetrics::Track(JobSeries& s, prometheus::Family<T>& family,
                             const prometheus::Labels& labels, Args&&... args) {
  T* series = &family.Add(labels, std::forward<Args>(args)...);
  s.remove[series] = [&family, series] { family.Remove(series); };
  return series;
}

void CoordinatorMetrics::Drop(JobSeries& s, const void* series) {
  auto it = s.remove.find(series);
  if (it == s.remove.end()) return;
  it->second();
  s.remove.erase(it);
}

CoordinatorMetrics::JobSeries& CoordinatorMetrics::SeriesOf(const std::string& job) {
  auto it = series_.find(job);
  if (it != series_.end()) return it->second;
  JobSeries& s = series_[job];
  const prometheus::Labels labels = {{"job_id", job}};
  s.steps = Track(s, steps_, labels);
  s.step_seconds = Track(s, step_seconds_, labels, StepBuckets());
  s.loss = Track(s, loss_, labels);
  s.bubble = Track(s, bubble_, {{"job_id", job}, {"source", "measured"}});
  s.predicted_bubble = Track(s, bubble_, {{"job_id", job}, {"source", "predicted"}});
  s.samples_per_second = Track(s, samples_per_second_, labels);
  s.samples = Track(s, samples_, labels);
  s.recoveries = Track(s, recoveries_, labels);
  return s;
}

void CoordinatorMetrics::RecordStep(const std::string& job, const StepSample& step) {
  absl::MutexLock lock(&mu_);
  JobSeries& s = SeriesOf(job);
  s.steps->Increment();
  s.step_seconds->Observe(step.seconds);
  s.loss->Set(step.loss);
  s.bubble->Set(step.bubble);
  s.predicted_bubble->Set(step.predicted_bubble);
  s.samples_per_second->Set(step.samples_per_second);
  if (step.samples > 0) s.samples->Increment(static_cast<double>(step.samples));
}

void CoordinatorMetrics::RecordRecovery(const std::string& job) {
  absl::MutexLock lock(&mu_);
  SeriesOf(job).recoveries->Increment();
}

void CoordinatorMetrics::RecordIsa(const std::string& job, const std::string& isa) {
  absl::MutexLock lock(&mu_);
  JobSeries& s = SeriesOf(job);
  Drop(s, s.isa);
  s.isa = Track(s, isa_, {{"job_id", job}, {"isa", isa}});
  s.isa->Set(1);
}

void CoordinatorMetrics::RecordState(const std::map<std::string, int>& jobs_by_state,
                                     const std::map<std::string, int>& workers_by_state,
                                     const std::set<std::string>& known_jobs) {
  for (const auto& [state, n] : jobs_by_state) jobs_.Add({{"state", state}}).Set(n);
  for (const auto& [state, n] : workers_by_state) workers_.Add({{"state", state}}).Set(n);
  absl::MutexLock lock(&mu_);
  for (auto it = series_.begin(); it != series_.end();) {
    if (known_jobs.count(it->first) > 0) {
      ++it;
      continue;
    }
    for (auto& [series, remove] : it->second.remove) remove();
    it = series_.erase(it);
  }
}

}  // namespace pipetrain::metrics
