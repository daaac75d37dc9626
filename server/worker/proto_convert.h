// The worker's step report -> its StepDone event. (Conversions shared with the coordinator live
// in server/control/control_proto.h.) Pure and thread-safe.
#ifndef PIPETRAIN_SERVER_WORKER_PROTO_CONVERT_H_
#define PIPETRAIN_SERVER_WORKER_PROTO_CONVERT_H_

#include <vector>

#include "absl/status/statusor.h"
#include "common/schedule/ir.h"
#include "pipetrain/v1/coordinator.pb.h"
#include "pipetrain/v1/worker_control.pb.h"
#include "server/worker/executor.h"
#include "server/worker/link_span_log.h"

namespace pipetrain::worker {

// StepDone for `report` of (job, generation): losses, per-layer squared gradient norms, the action
// timings in microseconds (start/end relative to the RunStep's start, wait = ready - start) and
// the step's tensors sent and received, `links` (LinkSpanLog::TakeStep), in the same time base.
v1::StepDone StepDoneFromReport(const std::string& job, int64_t generation,
                                const StepReport& report,
                                const std::vector<LinkSpanTiming>& links = {});

}  // namespace pipetrain::worker

#endif  // PIPETRAIN_SERVER_WORKER_PROTO_CONVERT_H_
