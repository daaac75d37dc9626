#include "server/worker/proto_convert.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace pipetrain::worker {

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

v1::StepDone StepDoneFromReport(const std::string& job, int64_t epoch, const StepReport& report) {
  v1::StepDone done;
  done.set_job(job);
  done.set_epoch(epoch);
  done.set_step(report.step);
  for (float loss : report.microbatch_losses) done.add_microbatch_losses(loss);
  for (const LayerNormSq& n : report.layer_grad_norm_sq) {
    v1::LayerNormSq* out = done.add_grad_norms();
    out->set_layer(n.layer);
    out->set_norm_sq(n.norm_sq);
  }
  for (const ActionTiming& t : report.timings) {
    v1::ActionTiming* out = done.add_timings();
    *out->mutable_action() = ActionToProto(t.action);
    out->set_start_us(absl::ToDoubleMicroseconds(t.start));
    out->set_end_us(absl::ToDoubleMicroseconds(t.end));
    out->set_wait_us(absl::ToDoubleMicroseconds(t.wait()));
  }
  return done;
}

}  // namespace pipetrain::worker
