// The control plane's protos (coordinator.proto) <-> domain types, shared by the coordinator and
// the stage worker so that both sides convert and validate the same way: schedule actions, worker
// errors. (The optimizer's conversion lives in common/model/optimizer_proto.h; a worker's step
// report in server/worker/proto_convert.h.) All functions are pure and thread-safe.
#ifndef PIPETRAIN_SERVER_CONTROL_CONTROL_PROTO_H_
#define PIPETRAIN_SERVER_CONTROL_CONTROL_PROTO_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/schedule/ir.h"
#include "pipetrain/v1/coordinator.pb.h"
#include "pipetrain/v1/worker_control.pb.h"

namespace pipetrain::control {

// INVALID_ARGUMENT for an unspecified or unknown op or a negative micro-batch or chunk.
absl::StatusOr<schedule::Action> ActionFromProto(const v1::Action& action);
v1::Action ActionToProto(const schedule::Action& action);

// An action list (Assign.actions, a StepDone's timings); errors (as ActionFromProto) name the
// position.
absl::StatusOr<std::vector<schedule::Action>> ActionsFromProto(
    const google::protobuf::RepeatedPtrField<v1::Action>& actions);

// A WorkerError event of (job, generation, step) carrying `status` (which must not be OK).
v1::WorkerEvent ErrorEvent(const std::string& job, int64_t generation, int64_t step,
                           const absl::Status& status);

// The status a WorkerError carries, its message prefixed with `context`. A code that is not a
// valid non-OK absl::StatusCode becomes UNKNOWN (an error is never turned into OK).
absl::Status StatusFromWorkerError(const v1::WorkerError& error, const std::string& context);

}  // namespace pipetrain::control

#endif  // PIPETRAIN_SERVER_CONTROL_CONTROL_PROTO_H_
