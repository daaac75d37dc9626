// JobPlan: what an Assign asks of this stage worker, checked and parsed before a WorkerJob is
// built from it — the chunk placement, this rank's actions, the model built at the job's
// instruction-set level and the optimizer.
#ifndef PIPETRAIN_SERVER_WORKER_JOB_PLAN_H_
#define PIPETRAIN_SERVER_WORKER_JOB_PLAN_H_

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/math/isa.h"
#include "common/math/optimizer.h"
#include "common/model/model.h"
#include "common/schedule/ir.h"
#include "pipetrain/v1/worker_control.pb.h"

namespace pipetrain::worker {

struct JobPlan {
  int num_chunks = 0;      // stages * virtual_stages.
  std::vector<int> owner;  // [chunk] -> rank.
  // The chunks are two copies of S stages (bidirectional DualPipe): V = 2, chunks [S, 2S) repeat
  // the layers of chunks [0, S) and chunk S + k is on rank S-1-k (see PlanJob).
  bool two_copies = false;
  std::vector<schedule::Action> actions;  // this rank's, in order; never empty.
  std::unique_ptr<model::Model> model;    // built at the job's instruction-set level.
  math::OptimizerConfig optimizer;
  // Data-parallel replicas (Assign.replica, replicas, replica_addresses): this worker is replica
  // `replica` of `replicas` (>= 1, a power of two); replica_addresses[q] is the worker holding
  // this rank in replica q (empty with one replica when the Assign names none).
  int replica = 0;
  int replicas = 1;
  std::vector<std::string> replica_addresses;
};

// Checks `assign` for this worker and parses it. `threads_max` (>= 1) bounds Assign.threads;
// `max_isa` is the highest level this worker runs jobs at (none: any this CPU runs).
// INVALID_ARGUMENT (AssignError) naming the field, checked in this order: job id, generation,
// stages, rank, link_secret, threads, worker addresses, chunk count, replicas (replicas 0 means 1;
// a power of two; replica in [0, replicas); replica_addresses: one "host:port" per replica, the
// entry of this replica being this worker's own worker_addresses[rank]; none at all is accepted
// with one replica), isa, model, chunk tiling, actions, optimizer. The chunks tile the model's
// layers once in order, or -- two copies of the stages, the bidirectional DualPipe placement --
// with V = 2 and chunk S starting at layer 0 again: chunks [0, S) tile the model, chunk S + k has
// chunk k's layers and sits on rank S-1-k; FAILED_PRECONDITION for an instruction set this worker
// cannot run. Thread-safe.
absl::StatusOr<JobPlan> PlanJob(const v1::Assign& assign, int threads_max,
                                const std::optional<math::Isa>& max_isa);

// The instruction-set level named `name` (empty: the lowest level this binary was built with)
// if this worker runs it at most at `max_isa`: INVALID_ARGUMENT "isa: ..." for a name that is
// no level, FAILED_PRECONDITION naming the levels it runs otherwise. Thread-safe.
absl::StatusOr<math::Isa> RunnableIsa(absl::string_view name,
                                      const std::optional<math::Isa>& max_isa);

// INVALID_ARGUMENT "Assign(job J, generation E): <what>", the error of every malformed Assign.
absl::Status AssignError(const v1::Assign& assign, absl::string_view what);

}  // namespace pipetrain::worker

#endif  // PIPETRAIN_SERVER_WORKER_JOB_PLAN_H_
