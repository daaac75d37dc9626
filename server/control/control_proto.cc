#include "server/control/control_proto.h"

#include "absl/strings/str_cat.h"
#include "pipetrain/v1/worker_control.pb.h"

namespace pipetrain::control {

absl::StatusOr<schedule::Action> ActionFromProto(const v1::Action& action) {
  schedule::Action out;
  switch (action.op()) {
    case v1::ACTION_OP_FORWARD:
      out.op = schedule::Op::kForward;
      break;
    case v1::ACTION_OP_BACKWARD:
      out.op = schedule::Op::kBackward;
      break;
    case v1::ACTION_OP_INPUT_GRAD:
      out.op = schedule::Op::kInputGrad;
      break;
    case v1::ACTION_OP_WEIGHT_GRAD:
      out.op = schedule::Op::kWeightGrad;
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("action has no valid op (", static_cast<int>(action.op()), ")"));
  }
  if (action.microbatch() < 0 || action.chunk() < 0) {
    return absl::InvalidArgumentError(absl::StrCat("action has a negative micro-batch (",
                                                   action.microbatch(), ") or chunk (",
                                                   action.chunk(), ")"));
  }
  out.mb = action.microbatch();
  out.chunk = action.chunk();
  return out;
}

v1::Action ActionToProto(const schedule::Action& action) {
  v1::Action out;
  switch (action.op) {
    case schedule::Op::kForward:
      out.set_op(v1::ACTION_OP_FORWARD);
      break;
    case schedule::Op::kBackward:
      out.set_op(v1::ACTION_OP_BACKWARD);
      break;
    case schedule::Op::kInputGrad:
      out.set_op(v1::ACTION_OP_INPUT_GRAD);
      break;
    case schedule::Op::kWeightGrad:
      out.set_op(v1::ACTION_OP_WEIGHT_GRAD);
      break;
  }
  out.set_microbatch(action.mb);
  out.set_chunk(action.chunk);
  return out;
}

absl::StatusOr<std::vector<schedule::Action>> ActionsFromProto(
    const google::protobuf::RepeatedPtrField<v1::Action>& actions) {
  std::vector<schedule::Action> out;
  out.reserve(actions.size());
  for (int i = 0; i < actions.size(); ++i) {
    absl::StatusOr<schedule::Action> a = ActionFromProto(actions[i]);
    if (!a.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("action ", i, ": ", a.status().message()));
    }
    out.push_back(*a);
  }
  return out;
}

v1::WorkerEvent ErrorEvent(const std::string& job, int64_t generation, int64_t step,
                           const absl::Status& status) {
  v1::WorkerEvent event;
  v1::WorkerError* error = event.mutable_error();
  error->set_job(job);
  error->set_generation(generation);
  error->set_step(step);
  error->set_code(static_cast<int32_t>(status.code()));
  error->set_message(std::string(status.message()));
  return event;
}

absl::Status StatusFromWorkerError(const v1::WorkerError& error, const std::string& context) {
  int code = error.code();
  if (code <= 0 || code > static_cast<int>(absl::StatusCode::kUnauthenticated)) {
    code = static_cast<int>(absl::StatusCode::kUnknown);
  }
  return absl::Status(static_cast<absl::StatusCode>(code),
                      absl::StrCat(context, ": ", error.message()));
}

}  // namespace pipetrain::control
