// `pipetrain local`: the embedded default. Starts a coordinator and S stage workers on 127.0.0.1
// as child processes, trains through them exactly like `pipetrain train`, and shuts everything
// down — also on SIGINT/SIGTERM, which are forwarded to the children — leaving no process behind.
#ifndef PIPETRAIN_CLIENT_CLI_LOCAL_COMMAND_H_
#define PIPETRAIN_CLIENT_CLI_LOCAL_COMMAND_H_

#include <ostream>
#include <string>

#include "absl/status/status.h"
#include "client/cli/train_command.h"

namespace pipetrain::cli {

struct LocalCommandOptions {
  // The training options; `train.coordinator` is ignored (the local coordinator's address is
  // used) and `train.stages` workers are started.
  TrainCommandOptions train;
  // Paths of the daemons. Empty: looked up next to the pipetrain binary (same directory, then the
  // build tree's ../server/coordinator/coordinator and ../server/worker/stage_worker), then at the
  // build-time paths.
  std::string coordinator_binary;
  std::string worker_binary;
  // Directory for the daemons' stderr logs (coordinator.log, stage_worker-R.log). Empty: a fresh
  // temporary directory, removed after a successful or interrupted run and kept (and named in
  // the error) after a failure.
  std::string log_dir;
  // Confine each worker to CPUs of its own (stage_worker --cpus: util::CpuGroups of the CPUs this
  // process may use, --threads each) when they fit; else, or if false, they float.
  bool pin_workers = true;
};

// Runs the local cluster and the training. Errors: FAILED_PRECONDITION if --save is not a
// writable directory (before any daemon starts) or a daemon binary is missing, UNAVAILABLE if a
// daemon dies or does not come up within a minute, CANCELLED on SIGINT/SIGTERM, and every error
// of RunTrainCommand. Installs SIGINT/SIGTERM handlers for its
// duration (not thread-safe: one local run per process at a time).
absl::Status RunLocalCommand(const LocalCommandOptions& options, std::ostream& out);

}  // namespace pipetrain::cli

#endif  // PIPETRAIN_CLIENT_CLI_LOCAL_COMMAND_H_
