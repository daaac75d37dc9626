// JobState: the life of a coordinator job (the domain twin of pipetrain.v1.JobState; see
// coordinator.proto for the transitions). Pure functions, thread-safe.
#ifndef PIPETRAIN_SERVER_COORDINATOR_JOB_STATE_H_
#define PIPETRAIN_SERVER_COORDINATOR_JOB_STATE_H_

#include "absl/strings/string_view.h"
#include "pipetrain/v1/coordinator.pb.h"

namespace pipetrain::coordinator {

enum class JobState {
  kAssigning,   // workers are building their stages.
  kReady,       // idle between steps.
  kTraining,    // a step or checkpoint is in flight.
  kRecovering,  // re-assigning after a lost worker or a coordinator restart.
  kDone,        // finished by its client.
  kFailed,      // a fault it could not survive; see the job's reason.
  kCancelled,   // cancelled by a client or because its client went away.
};

// DONE, FAILED and CANCELLED: the job holds no worker and accepts no more work.
bool IsTerminal(JobState state);

// "assigning", "ready", "training", "recovering", "done", "failed", "cancelled".
absl::string_view JobStateName(JobState state);

v1::JobState JobStateToProto(JobState state);

}  // namespace pipetrain::coordinator

#endif  // PIPETRAIN_SERVER_COORDINATOR_JOB_STATE_H_
