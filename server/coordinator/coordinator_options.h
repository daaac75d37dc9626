// CoordinatorOptions: what a CoordinatorCore is configured with (timeouts and deadlines, the
// checkpoint root, the client lease, retention, limits, metrics and logging), as the coordinator's
// flags set it (main.cc, docs/deploy.md).
#ifndef PIPETRAIN_SERVER_COORDINATOR_COORDINATOR_OPTIONS_H_
#define PIPETRAIN_SERVER_COORDINATOR_COORDINATOR_OPTIONS_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/job/job_spec.h"
#include "server/logging/log_level.h"

namespace pipetrain::metrics {
class CoordinatorMetrics;
}  // namespace pipetrain::metrics

namespace pipetrain::coordinator {

struct CoordinatorOptions {
  // Longest wait for every worker's Assigned after Assign. Default 2 minutes.
  absl::Duration assign_timeout = absl::Minutes(2);
  // Longest wait for every worker's Committed or ShardsSaved (a checkpoint's upload). A lost
  // worker is detected sooner by its broken Join stream. Default 30 minutes.
  absl::Duration step_timeout = absl::Minutes(30);
  // Longest wait for a step's StepDone from every worker: max(step_deadline_floor,
  // step_deadline_factor x the plan's simulated step time), the simulation charging every action
  // its chunk's FLOPs for the step's micro-batch size at the owner's measured GFLOP/s. A worker
  // that misses it (stopped, stuck) fails the step with DEADLINE_EXCEEDED naming it. Defaults:
  // 60 s, 50.
  absl::Duration step_deadline_floor = absl::Seconds(60);
  double step_deadline_factor = 50;
  // While a step waits longer than this for some ranks, a line "waiting for rank R (worker W)
  // for T s" is logged, again every interval. Default 10 s.
  absl::Duration wait_report_interval = absl::Seconds(10);
  // Every checkpoint directory a client names (Checkpoint, JobSpec.resume_from) must lie under
  // this directory (io::ConfinePath; PERMISSION_DENIED otherwise). Empty (default): the
  // coordinator reads and writes no checkpoints (FAILED_PRECONDITION saying so).
  std::string checkpoint_root;
  // Where a job that grows (JobSpec.max_stages) writes the checkpoint it takes for the growth:
  // <growth_dir>/<job id>, created when needed, one checkpoint per job (replaced by the next
  // growth; removed once the job is done or cancelled), which is also what a later recovery of
  // the job restarts from (docs/scaling.md, "Jobs that change shape"). Not confined to
  // checkpoint_root: only the coordinator names it.
  // Empty (default): jobs never grow.
  std::string growth_dir;
  // How long a recoverable job's step that failed on a transport error waits for a worker's loss
  // to be noticed (its Join stream ending) before the error goes to the client; also how long
  // ranks have to answer the Abort of a step that missed its deadline before the silent ones are
  // evicted as stuck. Default 3 s.
  absl::Duration loss_grace = absl::Seconds(3);
  // Prometheus metrics to record (steps, recoveries, jobs and workers by state); null: none.
  std::shared_ptr<metrics::CoordinatorMetrics> metrics;
  // Where log lines go, with their level; null: logging::Log("coordinator", ...) (spdlog, as
  // configured in main by --log-format / --log-level).
  std::function<void(logging::LogLevel, const std::string&)> log;
  // The client lease: a READY job that no Train stream holds and that no Checkpoint is writing is
  // cancelled ("client gone") once this long has passed since it became READY, its last Train
  // stream ended or its last Checkpoint finished, whichever is latest. Read-only calls (GetJob,
  // ListJobs, ListWorkers) never renew it; neither does anything while the job is assigning or
  // recovering (the coordinator's doing, not the client's). Default 5 minutes.
  absl::Duration client_lease = absl::Minutes(5);
  // The clock of the client lease and of the retention of ended jobs; null: absl::Now. Tests pass
  // a fake one (with RunHousekeeping).
  std::function<absl::Time()> clock;
  // Ended jobs stay listed (ListJobs, GetJob) this long, at most `max_ended_jobs` of them (the
  // oldest go first). Defaults: 1 hour, 1000.
  absl::Duration job_retention = absl::Hours(1);
  int max_ended_jobs = 1000;
  // How often the housekeeping thread looks at leases and retention. Default 1 s.
  absl::Duration housekeeping_interval = absl::Seconds(1);
  // Caps on a job's model and step (CreateJob: RESOURCE_EXHAUSTED naming the flag).
  job::JobLimits job_limits;
  // Sends each worker that registers a ProbeLinks naming the idle workers registered before it,
  // and keeps the links it measures (ListWorkers' WorkerInfo.links; docs/scaling.md, "The cost
  // model"). Default false (the coordinator binary's --probe-links, default true).
  bool probe_links = false;
  // Events each job's log keeps for WatchJob (its recent history; a slower watcher skips the
  // older ones), >= 1. Default 256.
  int job_events = 256;
  // Most WatchJob streams open on one job at a time (RESOURCE_EXHAUSTED beyond), >= 1. Default 64.
  int max_watches_per_job = 64;

  // OK, or INVALID_ARGUMENT naming the bad field.
  absl::Status Check() const;
};

}  // namespace pipetrain::coordinator

#endif  // PIPETRAIN_SERVER_COORDINATOR_COORDINATOR_OPTIONS_H_
