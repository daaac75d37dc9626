// Control-plane protos (coordinator.proto) <-> the worker's domain types: schedule actions and
// step reports. The optimizer's conversion lives in common/model/optimizer_proto.h.
// All functions are pure and thread-safe.
#ifndef PIPETRAIN_SERVER_WORKER_PROTO_CONVERT_H_
#define PIPETRAIN_SERVER_WORKER_PROTO_CONVERT_H_

#include <vector>

#include "absl/status/statusor.h"
#include "common/schedule/ir.h"
#include "pipetrain/v1/coordinator.pb.h"
#include "server/worker/executor.h"

namespace pipetrain::worker {

// INVALID_ARGUMENT for an unspecified or unknown op or a negative micro-batch or chunk.
absl::StatusOr<schedule::Action> ActionFromProto(const v1::Action& action);
v1::Action ActionToProto(const schedule::Action& action);

// The action list of an Assign; errors (as ActionFromProto) name the position.
absl::StatusOr<std::vector<schedule::Action>> ActionsFromProto(
    const google::protobuf::RepeatedPtrField<v1::Action>& actions);

// StepDone for `report` of (job, epoch): losses, per-layer squared gradient norms and the action
// timings in microseconds (start/end relative to the RunStep's start, wait = ready - start).
v1::StepDone StepDoneFromReport(const std::string& job, int64_t epoch, const StepReport& report);

}  // namespace pipetrain::worker

#endif  // PIPETRAIN_SERVER_WORKER_PROTO_CONVERT_H_
