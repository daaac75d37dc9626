#include "server/coordinator/job_state.h"

namespace pipetrain::coordinator {

bool IsTerminal(JobState state) {
  return state == JobState::kDone || state == JobState::kFailed || state == JobState::kCancelled;
}

absl::string_view JobStateName(JobState state) {
  switch (state) {
    case JobState::kAssigning:
      return "assigning";
    case JobState::kReady:
      return "ready";
    case JobState::kTraining:
      return "training";
    case JobState::kRecovering:
      return "recovering";
    case JobState::kDone:
      return "done";
    case JobState::kFailed:
      return "failed";
    case JobState::kCancelled:
      return "cancelled";
  }
  return "unknown";
}

v1::JobState JobStateToProto(JobState state) {
  switch (state) {
    case JobState::kAssigning:
      return v1::JOB_STATE_ASSIGNING;
    case JobState::kReady:
      return v1::JOB_STATE_READY;
    case JobState::kTraining:
      return v1::JOB_STATE_TRAINING;
    case JobState::kRecovering:
      return v1::JOB_STATE_RECOVERING;
    case JobState::kDone:
      return v1::JOB_STATE_DONE;
    case JobState::kFailed:
      return v1::JOB_STATE_FAILED;
    case JobState::kCancelled:
      return v1::JOB_STATE_CANCELLED;
  }
  return v1::JOB_STATE_UNSPECIFIED;
}

}  // namespace pipetrain::coordinator
