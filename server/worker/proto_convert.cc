#include "server/worker/proto_convert.h"

#include <string>

#include "pipetrain/v1/worker_control.pb.h"
#include "server/control/control_proto.h"

namespace pipetrain::worker {

v1::StepDone StepDoneFromReport(const std::string& job, int64_t generation,
                                const StepReport& report,
                                const std::vector<LinkSpanTiming>& links) {
  v1::StepDone done;
  done.set_job(job);
  done.set_generation(generation);
  done.set_step(report.step);
  for (float loss : report.microbatch_losses) done.add_microbatch_losses(loss);
  done.set_update_us(absl::ToDoubleMicroseconds(report.update_time));
  for (const LayerNormSq& n : report.layer_grad_norm_sq) {
    v1::LayerNormSq* out = done.add_grad_norms();
    out->set_layer(n.layer);
    out->set_norm_sq(n.norm_sq);
  }
  for (const ActionTiming& t : report.timings) {
    v1::ActionTiming* out = done.add_timings();
    *out->mutable_action() = control::ActionToProto(t.action);
    out->set_start_us(absl::ToDoubleMicroseconds(t.start));
    out->set_end_us(absl::ToDoubleMicroseconds(t.end));
    out->set_wait_us(absl::ToDoubleMicroseconds(t.wait()));
    out->set_output_us(absl::ToDoubleMicroseconds(t.output));
  }
  for (const LinkSpanTiming& l : links) {
    v1::LinkSpan* out = done.add_links();
    out->set_direction(l.send ? v1::LINK_DIRECTION_SEND : v1::LINK_DIRECTION_RECEIVE);
    out->set_peer(l.peer);
    // wire::TensorKind and v1::TensorKind share their numbers (tensor.proto).
    out->set_kind(static_cast<v1::TensorKind>(static_cast<int>(l.key.kind)));
    out->set_microbatch(l.key.microbatch);
    out->set_chunk(l.key.chunk);
    out->set_bytes(l.bytes);
    out->set_start_us(absl::ToDoubleMicroseconds(l.start));
    out->set_end_us(absl::ToDoubleMicroseconds(l.end));
    out->set_complete(l.complete);
  }
  return done;
}

}  // namespace pipetrain::worker
