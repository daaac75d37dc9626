// `pipetrain jobs`, `pipetrain status JOB`, `pipetrain cancel JOB`, `pipetrain checkpoint JOB` and
// `pipetrain workers`: what a coordinator's jobs are doing, ending one, saving one's weights, and
// the stage workers it has, from the command line.
#ifndef PIPETRAIN_CLIENT_CLI_JOB_COMMANDS_H_
#define PIPETRAIN_CLIENT_CLI_JOB_COMMANDS_H_

#include <ostream>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "client/sdk/client.h"
#include "pipetrain/v1/coordinator.pb.h"

namespace pipetrain::cli {

struct JobCommandOptions {
  std::string coordinator;   // --coordinator: HOST:PORT. Required.
  std::string job;           // the JOB argument of `status`, `cancel` and `checkpoint`.
  std::string reason;        // --reason (cancel): recorded with the job. Default: "cancelled by
                             // pipetrain cancel".
  bool json = false;         // --json: one JSON object per job instead of text.
  std::string save_dir;      // --save (checkpoint): the checkpoint directory, on the
                             // coordinator's host. Required by `checkpoint`.
  int keep_checkpoints = 2;  // --keep-checkpoints (checkpoint): checkpoints of it kept, >= 1.
  // Keepalive and deadlines of the connection to the coordinator (the SDK's defaults).
  client::ClientOptions client;
};

// `jobs`: one line per job the coordinator knows (ended ones for its retention period), oldest
// first: id, state, steps done (of the target step, when its client said how many it runs),
// stages, schedule, age, the last step's loss, samples/s and step time, the ETA ("unknown" without
// a target, "-" once ended) and the reason of an ended job.
absl::Status RunJobsCommand(const JobCommandOptions& options, std::ostream& out);

// `status JOB`: the job's state, steps, progress (as `jobs`), spec and stages (worker, address,
// layers). NOT_FOUND for an unknown job.
absl::Status RunStatusCommand(const JobCommandOptions& options, std::ostream& out);

// `cancel JOB`: cancels the job (a step in flight is aborted, its workers freed) and prints its
// final status. Cancelling a job that already ended changes nothing and says so.
absl::Status RunCancelCommand(const JobCommandOptions& options, std::ostream& out);

// `checkpoint JOB --save DIR`: writes a checkpoint of the job's weights into DIR on the
// coordinator's host (with the data position its client gave for that step, if any: a retry of a
// `train` whose save failed resumes exactly), then finishes the job (DONE, its workers freed) —
// unless a client is training it (a Train stream is open), which it then leaves running. Prints
// what it did (`--json`: one object {"job", "step", "directory", "state", "data_position"}).
// INVALID_ARGUMENT without JOB or --save; the coordinator's errors otherwise (a failed save
// leaves the job as it was, for another try).
absl::Status RunCheckpointCommand(const JobCommandOptions& options, std::ostream& out);

// `workers`: one line per stage worker registered with the coordinator, in registration order:
// name, address, cores, measured GFLOP/s, memory, the instruction-set levels its math runs, and
// the job, rank and replica it serves ("-" when idle). "no workers" when none has registered.
// `--json`: one object {"name", "address", "cores", "gflops", "memory_bytes", "isa_levels", "job",
// "rank", "replica"} per worker (job "" and rank and replica -1 when idle).
absl::Status RunWorkersCommand(const JobCommandOptions& options, std::ostream& out);

// The JSON object of one job (as `jobs --json` and `status --json` print it), relative to `now`.
std::string JobStatusJson(const v1::JobStatus& job, absl::Time now);

// The job's shape in words: "S stages" (also for S = 1, as every line of the CLI says it), or "S
// stages x R replicas" with data-parallel replicas (JobStatus.replicas; 0, from a coordinator that
// predates replicas, is 1).
std::string ShapeText(const v1::JobStatus& job);

// "rank R" of a StageStatus, "replica Q rank R" when the job has replicas.
std::string PositionText(const v1::JobStatus& job, const v1::StageStatus& stage);

}  // namespace pipetrain::cli

#endif  // PIPETRAIN_CLIENT_CLI_JOB_COMMANDS_H_
