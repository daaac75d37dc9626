// EvalRun: one evaluation of held-out samples on a job's committed weights (coordinator.proto,
// Evaluate), run on the job's thread between two steps, as StepRun runs a step:
//
//   admit   the batch is valid and split into evaluation chunks (one micro-batch each, sized as
//           model::EvalChunkSamples sizes `pipetrain evaluate`'s), the job READY with every run
//           answered and its last Commit confirmed; the job is TRAINING (an operation in flight).
//   feed    inputs and targets to the first and last chunk owners under the run's own mailbox
//           steps (wire::EvalKey: from kEvalStepBase + the evaluation steps the job used so far,
//           at most M micro-batches per step; never a training step's).
//   run     EvalRun to every rank: a forward-only pass, no stash, no gradient.
//   await   every rank's EvalDone within the deadline.
//   reduce  the last chunk owner's per-chunk loss sums and correct counts, folded in chunk order.
//
// A failure aborts the run on every rank (Abort names its step) and leaves the job READY, or
// RECOVERING when a worker was lost (as for a step). Nothing of the job changes otherwise.
#ifndef PIPETRAIN_SERVER_COORDINATOR_EVAL_RUN_H_
#define PIPETRAIN_SERVER_COORDINATOR_EVAL_RUN_H_

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/math/tensor.h"
#include "common/model/model.h"
#include "common/wire/eval_key.h"
#include "pipetrain/v1/coordinator.pb.h"
#include "server/coordinator/coordinator_core.h"

namespace pipetrain::coordinator {

// Mailbox steps of evaluation runs start here: far above any training step (< 2^53).
inline constexpr int64_t kEvalStepBase = wire::kEvalStepBase;
// Most evaluation chunks (micro-batches) one Evaluate request may hold.
inline constexpr int64_t kMaxEvalChunks = 4096;
// Samples per evaluation chunk when the request leaves it 0 (as `pipetrain evaluate`).
inline constexpr int64_t kDefaultEvalChunkSamples = 256;

// An Evaluate request's samples, checked and cut into evaluation chunks of consecutive samples.
struct EvalBatch {
  int64_t samples = 0;
  int64_t chunk_samples = 0;                                 // the last chunk may hold fewer.
  std::vector<int64_t> rows;                                 // [chunk] input rows.
  std::vector<std::shared_ptr<const math::Matrix>> inputs;   // [chunk]
  std::vector<std::shared_ptr<const math::Matrix>> targets;  // [chunk]
};

// `request`'s samples checked against `net` (as a training batch, without the multiple of M) and
// cut into chunks of request.chunk_samples (0: kDefaultEvalChunkSamples) capped by
// model::EvalChunkSamples. INVALID_ARGUMENT for a bad batch or chunk_samples < 0;
// RESOURCE_EXHAUSTED beyond kMaxEvalChunks chunks.
absl::StatusOr<EvalBatch> SplitEvalBatch(const v1::EvaluateRequest& request,
                                         const model::Model& net);

class EvalRun {
 public:
  EvalRun(CoordinatorCore& core, const v1::EvaluateRequest& request)
      : core_(core), request_(request) {}
  EvalRun(const EvalRun&) = delete;
  EvalRun& operator=(const EvalRun&) = delete;

  // Runs every phase; the evaluation's figures, or why it failed.
  absl::StatusOr<v1::EvaluateResult> Run() ABSL_LOCKS_EXCLUDED(core_.mu_);

 private:
  // Admit: the batch (without the lock), then the job.
  absl::Status Admit() ABSL_LOCKS_EXCLUDED(core_.mu_);
  absl::Status AdmitJob() ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_.mu_, job_->mu);
  // Feed, without the lock; the feed's error.
  absl::Status Feed() ABSL_LOCKS_EXCLUDED(core_.mu_);
  // EvalRun to every rank (unless the job left TRAINING meanwhile), then the feed's outcome.
  absl::Status Start(const absl::Status& feed) ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_.mu_, job_->mu);
  absl::Status Await() ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_.mu_, job_->mu);
  // The result from the last chunk owner's EvalDone; the job READY again.
  absl::StatusOr<v1::EvaluateResult> Reduce() ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_.mu_, job_->mu);
  // Ends the run with `status` (Abort to every rank), as StepRun::Fail ends a step.
  absl::Status Fail(absl::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_.mu_, job_->mu);
  // EvalDone's deadline: max(step_deadline_floor, step_deadline_factor x the forward FLOPs of
  // every sample on the slowest rank's measured speed).
  absl::Duration Deadline() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_.mu_, job_->mu);

  CoordinatorCore& core_;
  const v1::EvaluateRequest& request_;
  const absl::Time start_ = absl::Now();
  Job* job_ = nullptr;  // set by Admit; lives while its thread runs this evaluation.
  EvalBatch batch_;
  int64_t step_ = 0;        // its first mailbox step (>= kEvalStepBase).
  int per_step_ = 1;        // micro-batches per mailbox step: the job's M.
  int64_t generation_ = 0;  // the generation it runs in.
  std::pair<FeedTarget, FeedTarget> feed_;
  absl::Duration deadline_;
};

}  // namespace pipetrain::coordinator

#endif  // PIPETRAIN_SERVER_COORDINATOR_EVAL_RUN_H_
