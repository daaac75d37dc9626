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

// The environment variables that name the daemons' binaries (`local` here, and
// pipetrain.local.LocalCluster in Python). PIPETRAIN_COORDINATOR is the coordinator's address
// (`train`, `jobs`, ...), never a binary.
inline constexpr char kCoordinatorBinaryEnv[] = "PIPETRAIN_COORDINATOR_BINARY";
inline constexpr char kStageWorkerBinaryEnv[] = "PIPETRAIN_STAGE_WORKER_BINARY";

struct LocalCommandOptions {
  // The training options; `train.coordinator` is ignored (the local coordinator's address is
  // used) and `train.stages` x `train.replicas` workers are started.
  TrainCommandOptions train;
  // Paths of the daemons ($PIPETRAIN_COORDINATOR_BINARY and $PIPETRAIN_STAGE_WORKER_BINARY when
  // set: main.cc). Empty: looked up next to the pipetrain binary (same directory, then the build
  // tree's ../server/coordinator/coordinator and ../server/worker/stage_worker), then at the
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

// The daemons' binaries a local run starts.
struct LocalDaemons {
  std::string coordinator;
  std::string worker;
};

// Everything a local run can check before it starts a daemon: PrepareTrainCommand with the
// coordinator's default caps on this file system (the options, the data and model against each
// other, the job as the coordinator checks it, --save writable), --isa and --max-isa against this
// CPU (ReferenceIsaFor: every worker runs here), and that both daemon binaries exist (filled into
// `*daemons`). Errors as those checks (each saying the fix); FAILED_PRECONDITION for a missing
// binary. Starts nothing.
absl::StatusOr<PreparedTrain> PrepareLocalCommand(const LocalCommandOptions& options,
                                                  LocalDaemons* daemons);

// Runs the local cluster and the training. Everything PrepareLocalCommand checks is refused
// before any daemon starts. Errors: those, UNAVAILABLE if a daemon dies or does not come up
// within a minute, CANCELLED on SIGINT/SIGTERM, and every error of RunTrainCommand. Installs
// SIGINT/SIGTERM handlers for its duration (not thread-safe: one local run per process at a time).
absl::Status RunLocalCommand(const LocalCommandOptions& options, std::ostream& out);

}  // namespace pipetrain::cli

#endif  // PIPETRAIN_CLIENT_CLI_LOCAL_COMMAND_H_
