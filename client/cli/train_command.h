// `pipetrain train`: trains on a running coordinator through the client SDK.
#ifndef PIPETRAIN_CLIENT_CLI_TRAIN_COMMAND_H_
#define PIPETRAIN_CLIENT_CLI_TRAIN_COMMAND_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "client/cli/step_trace.h"
#include "client/cli/training_options.h"
#include "client/cli/training_setup.h"
#include "client/sdk/client.h"
#include "common/job/job_spec.h"
#include "common/math/optimizer.h"
#include "common/schedule/ir.h"
#include "pipetrain/v1/coordinator.pb.h"

namespace pipetrain::cli {

// `training` means exactly what it means for `pipetrain reference` (same data loading, model
// resolution and BatchSampler), so that a run reproduces the reference's losses and weights bit
// for bit; the other fields describe the pipeline.
struct TrainCommandOptions {
  TrainingOptions training;
  std::string coordinator;  // --coordinator HOST:PORT. Required by `train`.
  int stages = 1;           // --stages S: pipeline stages (workers), >= 1.
  // --replicas R: data-parallel copies of the pipeline (JobSpec.replicas; R x S workers), >= 1;
  // CheckJobSpec checks that it splits the step's micro-batches into tree nodes. Default 1.
  int replicas = 1;
  // --schedule: gpipe|1f1b|interleaved|zb-h1|zb-v|dualpipe-v|1f1b-overlap|interleaved-overlap|
  // dualpipe (two copies of the stages: S even, M even, docs/schedules.md "DualPipe").
  std::string schedule = "1f1b";
  int virtual_stages = 0;  // --virtual V: model chunks per worker; 0: the schedule's default.
  // JobSpec.layer_costs: what the coordinator cuts the layers by. Set by --plan auto (the measured
  // costs its plan was cut by and predicted with); empty: each layer's FLOPs.
  std::vector<double> layer_costs;
  // --trace FILE: the measured timeline (client/cli/step_trace.h) of the last step, or of the
  // steps --trace-steps selects — an SVG for FILE.svg, ASCII for FILE.txt, else a Chrome trace;
  // empty: none.
  std::string trace_path;
  // --trace-steps A:B: the steps (1-based, inclusive) --trace writes; unset: the last step. Needs
  // --trace, and must meet the steps the run makes.
  std::optional<TraceSteps> trace_steps;
  // --replace-timeout: how long a job that lost a worker waits for an idle one to take the lost
  // rank (JobSpec.replace_timeout_ms), > 0. Default 30 s.
  absl::Duration replace_timeout = absl::Seconds(30);
  // --min-stages N: with no replacement in time, shrink to the surviving workers, down to N
  // stages (JobSpec.min_stages), 0 <= N <= stages. Default 0: never shrink.
  int min_stages = 0;
  // --max-stages N: grow onto idle workers at a step boundary up to N stages (JobSpec.max_stages;
  // docs/scaling.md, "Jobs that change shape"): 0 or N >= stages. Default 0: never grow.
  int max_stages = 0;
  // --max-replicas N: grow up to N data-parallel replicas (JobSpec.max_replicas): 0 or N >= 1.
  // Default 0: never.
  int max_replicas = 0;
  // --reconnect-timeout: how long the run waits for a coordinator that went away to answer again
  // (client::TrainOptions::reconnect_timeout), > 0. Default 1 min.
  absl::Duration reconnect_timeout = absl::Minutes(1);
  // The coordinator stops when the run ends (`local` started it): a job whose save failed then
  // has no coordinator to keep it for a retry, and the error says so instead of how to retry.
  bool own_coordinator = false;
  // Keepalive and deadlines of the connection to the coordinator: the SDK's defaults, so a
  // coordinator that stops answering is noticed within about 10 s; the run then waits up to
  // reconnect_timeout for it to answer again (a frozen or restarting coordinator that comes back
  // continues the job) and otherwise ends, after at most 5 s more for the best-effort CancelJob
  // of its job (ClientOptions::cleanup_timeout): about 75 s with the defaults.
  client::ClientOptions client;
};

// OK if the options are usable (everything but the coordinator address, which `local` fills in);
// INVALID_ARGUMENT naming the flag otherwise, also for --trace-steps without --trace.
absl::Status CheckTrainCommandOptions(const TrainCommandOptions& options);

// Returns true when the run should stop early (e.g. Ctrl-C); checked between steps.
using InterruptFn = std::function<bool()>;

// A `train` run checked as far as it can be without a coordinator: what it trains, and the job it
// will ask for.
struct PreparedTrain {
  schedule::ScheduleKind kind = schedule::ScheduleKind::kOneFOneB;
  math::OptimizerConfig optimizer;
  TrainingSetup setup;   // the data set, and the model resolved against it.
  v1::JobSpec job_spec;  // what CreateJob gets: the resolved model, schedule, optimizer, ...
  std::string save_dir;  // --save as an absolute path; empty without --save.
};

// Everything a run can check before it starts a daemon or calls CreateJob, so that a job that
// cannot run is refused at once with its fix: the options (CheckTrainCommandOptions), the
// optimizer, the data set and the model against each other (SetUpTraining: input width, labels
// against classes, text against a token model), and the job as the coordinator checks it
// (job::CheckJobSpec under `limits`: the schedule's parameters, at least one layer per chunk,
// the caps). `shares_files`: the coordinator and its workers see this file system (a loopback
// coordinator, `local`), so a --resume checkpoint's optimizer is checked here. --save is the
// coordinator's to check (JobSpec.save_to; `local` checks it too, CheckSaveDirectory). Errors:
// INVALID_ARGUMENT (or the check's code) with the message saying what does not fit and what
// would.
absl::StatusOr<PreparedTrain> PrepareTrainCommand(const TrainCommandOptions& options,
                                                  const job::JobLimits& limits, bool shares_files);

// Trains `prepared` (from PrepareTrainCommand with the same options) on the coordinator at
// `options.coordinator`, as RunTrainCommand does after its checks.
absl::Status RunPreparedTrainCommand(const TrainCommandOptions& options, PreparedTrain& prepared,
                                     std::ostream& out, const InterruptFn& interrupted = nullptr);

// Trains as `options` says on the coordinator at `options.coordinator`, writing progress to `out`
// (JSON lines `{"step", "loss", "step_ms", "bubble_fraction", "predicted_bubble_fraction"}` with
// --json, loss with 9 significant digits). With --save, the coordinator's Checkpoint writes into
// that directory on the coordinator's host every --checkpoint-every steps and at the end, its
// manifest with this run's data set, batch size and data cursor. --eval-every and --eval-samples
// evaluate the job's weights through the coordinator (EvaluateThroughCoordinator: the same figures
// as `pipetrain evaluate` on a checkpoint of them). The coordinator checks --save and --resume when
// it creates the job, before the first step (JobSpec.save_to, resume_from: PERMISSION_DENIED
// outside its --checkpoint-root, FAILED_PRECONDITION for a directory another job writes or a save
// could not replace). A save that fails all the same leaves the job running with its weights: the
// error says how to save them (`pipetrain checkpoint JOB --save DIR`). --trace-steps outside the
// steps the run makes (known once the job exists: it may resume) is INVALID_ARGUMENT before the
// first step. Everything PrepareTrainCommand checks (with the coordinator's caps unknown:
// job::JobLimits::Unlimited()) is refused before it connects. Returns the first error (bad
// options, data, model, the coordinator's statuses); CANCELLED if `interrupted` returned true.
// Each line is flushed as it is written (stdout may be a pipe). While the job recovers, or the
// coordinator cannot be reached, it prints what failed and what it waits for, then the recovery
// (the step the job restarted from, the workers, the time); a run that fails after its job was
// created (other than by its save) cancels the job, and its error says so when the coordinator
// could not be told (the job then ends by the coordinator's client lease).
absl::Status RunTrainCommand(const TrainCommandOptions& options, std::ostream& out,
                             const InterruptFn& interrupted = nullptr);

}  // namespace pipetrain::cli

#endif  // PIPETRAIN_CLIENT_CLI_TRAIN_COMMAND_H_
