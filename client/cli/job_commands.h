// `pipetrain jobs`, `pipetrain status JOB` and `pipetrain cancel JOB`: what a coordinator's jobs
// are doing, and ending one, from the command line.
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
  std::string coordinator;  // --coordinator: HOST:PORT. Required.
  std::string job;          // the JOB argument of `status` and `cancel`.
  std::string reason;       // --reason (cancel): recorded with the job. Default: "cancelled by
                            // pipetrain cancel".
  bool json = false;        // --json: one JSON object per job instead of text.
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

// The JSON object of one job (as `jobs --json` and `status --json` print it), relative to `now`.
std::string JobStatusJson(const v1::JobStatus& job, absl::Time now);

}  // namespace pipetrain::cli

#endif  // PIPETRAIN_CLIENT_CLI_JOB_COMMANDS_H_
