#include "server/metrics/coordinator_metrics.h"

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

CoordinatorMetrics::JobSeries& CoordinatorMetrics::SeriesOf(const std::string& job) {
  auto it = series_.find(job);
  if (it != series_.end()) return it->second;
  const prometheus::Labels labels = {{"job_id", job}};
  JobSeries s;
  s.steps = &steps_.Add(labels);
  s.step_seconds = &step_seconds_.Add(labels, StepBuckets());
  s.loss = &loss_.Add(labels);
  s.bubble = &bubble_.Add({{"job_id", job}, {"source", "measured"}});
  s.predicted_bubble = &bubble_.Add({{"job_id", job}, {"source", "predicted"}});
  s.samples_per_second = &samples_per_second_.Add(labels);
  s.recoveries = &recoveries_.Add(labels);
  return series_.emplace(job, s).first->second;
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
}

void CoordinatorMetrics::RecordRecovery(const std::string& job) {
  absl::MutexLock lock(&mu_);
  SeriesOf(job).recoveries->Increment();
}

void CoordinatorMetrics::RecordIsa(const std::string& job, const std::string& isa) {
  absl::MutexLock lock(&mu_);
  JobSeries& s = SeriesOf(job);
  if (s.isa != nullptr) isa_.Remove(s.isa);
  s.isa = &isa_.Add({{"job_id", job}, {"isa", isa}});
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
    const JobSeries& s = it->second;
    steps_.Remove(s.steps);
    step_seconds_.Remove(s.step_seconds);
    loss_.Remove(s.loss);
    bubble_.Remove(s.bubble);
    bubble_.Remove(s.predicted_bubble);
    samples_per_second_.Remove(s.samples_per_second);
    recoveries_.Remove(s.recoveries);
    if (s.isa != nullptr) isa_.Remove(s.isa);
    it = series_.erase(it);
  }
}

}  // namespace pipetrain::metrics
