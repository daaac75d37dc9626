// CoordinatorMetrics: what the coordinator exports to Prometheus (docs/observability.md) — per job
// (label job_id): steps, step seconds, loss, measured and predicted bubble, samples (a counter,
// for rate()) and samples per second of the last step, recoveries, ISA; per daemon: jobs by
// state, workers by state. The coordinator calls the Record* hooks; the values live in a
// MetricsRegistry, so tests read them without HTTP.
//
// Label values stay bounded: every per-job series is dropped once the coordinator forgets the job
// (RecordState without it: after --job-retention, at most --max-ended-jobs ended jobs), and the
// state labels take a fixed set of values. Thread-safe.
#ifndef PIPETRAIN_SERVER_METRICS_COORDINATOR_METRICS_H_
#define PIPETRAIN_SERVER_METRICS_COORDINATOR_METRICS_H_

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>

#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "server/metrics/metrics_registry.h"

namespace pipetrain::metrics {

// One applied training step as the coordinator measured it.
struct StepSample {
  double seconds = 0;             // wall time of the step at the coordinator.
  double loss = 0;                // the step's loss.
  double bubble = 0;              // measured bubble fraction (0..1).
  double predicted_bubble = 0;    // the simulator's bubble fraction from the measured costs.
  double samples_per_second = 0;  // training samples per second.
  int64_t samples = 0;            // training samples (batch rows) of the step.
};

class CoordinatorMetrics {
 public:
  // Registers the coordinator's families in `registry`, which must outlive this object.
  explicit CoordinatorMetrics(MetricsRegistry& registry);
  CoordinatorMetrics(const CoordinatorMetrics&) = delete;
  CoordinatorMetrics& operator=(const CoordinatorMetrics&) = delete;

  // A step of job `job` was applied: steps +1, samples + step.samples, the step time observed,
  // the gauges set to the step's values.
  void RecordStep(const std::string& job, const StepSample& step) ABSL_LOCKS_EXCLUDED(mu_);
  // Job `job` recovered from a lost worker (it continues in a new generation).
  void RecordRecovery(const std::string& job) ABSL_LOCKS_EXCLUDED(mu_);
  // Job `job` runs its math at instruction-set level `isa` (e.g. "x86-64-v4"):
  // pipetrain_job_isa_info{job_id, isa} = 1 (a level it ran at before is removed).
  void RecordIsa(const std::string& job, const std::string& isa) ABSL_LOCKS_EXCLUDED(mu_);
  // Sets pipetrain_jobs{state} and pipetrain_workers{state} to the given counts (states not
  // named keep their value; pass every state, with 0s) and drops every series of every job not
  // in `known_jobs` (the jobs the coordinator still lists). A dropped job that records again
  // starts from zero.
  void RecordState(const std::map<std::string, int>& jobs_by_state,
                   const std::map<std::string, int>& workers_by_state,
                   const std::set<std::string>& known_jobs) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // The series of one job. Every series is created through Track, which files its removal in
  // `remove`, so dropping a job drops all of them, whichever family they belong to.
  struct JobSeries {
    prometheus::Counter* steps = nullptr;
    prometheus::Histogram* step_seconds = nullptr;
    prometheus::Gauge* loss = nullptr;
    prometheus::Gauge* bubble = nullptr;
    prometheus::Gauge* predicted_bubble = nullptr;
    prometheus::Gauge* samples_per_second = nullptr;
    prometheus::Counter* samples = nullptr;
    prometheus::Counter* recoveries = nullptr;
    prometheus::Gauge* isa = nullptr;  // null until RecordIsa.
    // Removes a series from its family, by the series' address.
    std::map<const void*, std::function<void()>> remove;
  };
  JobSeries& SeriesOf(const std::string& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Adds the series `labels` (plus `args` for histograms) to `family` for job series `s`.
  template <typename T, typename... Args>
  static T* Track(JobSeries& s, prometheus::Family<T>& family, const prometheus::Labels& labels,
                  Args&&... args);
  // Removes one tracked series of `s` (a no-op for null).
  static void Drop(JobSeries& s, const void* series);

  // Families (constant after construction; thread-safe themselves).
  prometheus::Family<prometheus::Counter>& steps_;
  prometheus::Family<prometheus::Histogram>& step_seconds_;
  prometheus::Family<prometheus::Gauge>& loss_;
  prometheus::Family<prometheus::Gauge>& bubble_;
  prometheus::Family<prometheus::Gauge>& samples_per_second_;
  prometheus::Family<prometheus::Counter>& samples_;
  prometheus::Family<prometheus::Counter>& recoveries_;
  prometheus::Family<prometheus::Gauge>& isa_;
  prometheus::Family<prometheus::Gauge>& jobs_;
  prometheus::Family<prometheus::Gauge>& workers_;

  // Protects the per-job series map (adding and removing a job's series).
  absl::Mutex mu_;
  std::map<std::string, JobSeries> series_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pipetrain::metrics

#endif  // PIPETRAIN_SERVER_METRICS_COORDINATOR_METRICS_H_
