// The instruction-set level of a job's math: which levels a registered worker runs and the one a
// job runs at (docs/performance.md, "Instruction sets"). Pure functions, thread-safe.
#ifndef PIPETRAIN_SERVER_COORDINATOR_JOB_ISA_H_
#define PIPETRAIN_SERVER_COORDINATOR_JOB_ISA_H_

#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/math/isa.h"
#include "pipetrain/v1/coordinator.pb.h"
#include "pipetrain/v1/worker_control.pb.h"

namespace pipetrain::coordinator {

// The levels `worker` registered (RegisterWorker.isa_levels), in increasing order, names unknown
// to this coordinator left out; a worker that registered none (older than the field) runs the
// lowest level built into this coordinator.
std::vector<math::Isa> WorkerIsas(const v1::RegisterWorker& worker);

// True iff `worker` registered `isa`.
bool WorkerRunsIsa(const v1::RegisterWorker& worker, math::Isa isa);

// The level of a job with `spec` on `workers` (its ranks): spec.isa when set, which every worker
// must run (FAILED_PRECONDITION naming the first that does not and the levels it runs; an isa that
// names no level is INVALID_ARGUMENT, job::CheckJobIsa), else the highest level all of them run
// (FAILED_PRECONDITION listing each worker's levels when there is none).
absl::StatusOr<math::Isa> ChooseJobIsa(const v1::JobSpec& spec,
                                       const std::vector<const v1::RegisterWorker*>& workers);

}  // namespace pipetrain::coordinator

#endif  // PIPETRAIN_SERVER_COORDINATOR_JOB_ISA_H_
