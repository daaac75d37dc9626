// StepRun: one training step of a job, run on the job's thread as an explicit state machine
// (docs/architecture.md, "One step"):
//
//   kAdmit   the job is READY, the batch is valid and split, every aborted attempt answered,
//            the step is the one the client expects; the job is TRAINING.
//   kFeed    inputs and targets go to the first and last chunk owners (before RunStep: a worker
//            keeps tensors of a step it has not been told to run yet).
//   kRun     RunStep to every rank; the previous step's Commit, if it left it to this step, is
//            confirmed (every rank confirms it before it answers this RunStep).
//   kAwait   every rank's StepDone, within the step deadline; a recoverable job evicts the ranks
//            that are stuck.
//   kReduce  the loss (micro-batch losses in increasing order) and, when the job clips, the
//            global gradient norm (per-layer norms in increasing layer order).
//   kCommit  Commit(clip scale) to every rank; confirmed now, or by the next step if its batch
//            is queued already.
//   kDone    the result (loss, timelines) for the client.
//
// A failure in any phase ends the step: Abort to every rank and the job READY again (or
// RECOVERING / ended, if that is what failed it).
#ifndef PIPETRAIN_SERVER_COORDINATOR_STEP_RUN_H_
#define PIPETRAIN_SERVER_COORDINATOR_STEP_RUN_H_

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "pipetrain/v1/coordinator.pb.h"
#include "server/coordinator/coordinator_core.h"
#include "server/coordinator/step_batch.h"

namespace pipetrain::coordinator {

class StepRun {
 public:
  enum class Phase { kAdmit, kFeed, kRun, kAwait, kReduce, kCommit, kDone };

  // `next_queued` is called with the core's lock held (see CoordinatorCore::TrainStep).
  StepRun(CoordinatorCore& core, const v1::TrainRequest& request,
          const std::function<bool()>& next_queued)
      : core_(core), request_(request), next_queued_(next_queued) {}
  StepRun(const StepRun&) = delete;
  StepRun& operator=(const StepRun&) = delete;

  // Runs every phase; the step's result, or why it failed.
  absl::StatusOr<v1::StepResult> Run() ABSL_LOCKS_EXCLUDED(core_.mu_);

  // The phase reached (kDone after a successful Run).
  Phase phase() const { return phase_; }

 private:
  // kAdmit, in two halves: the batch (without the lock) and the job.
  absl::Status Admit() ABSL_LOCKS_EXCLUDED(core_.mu_);
  absl::Status AdmitJob() ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_.mu_, job_->mu);
  // Waits until every rank answered each RunStep it was sent (an aborted attempt's answer may
  // trail the failure the client heard; a worker answers only after it dropped the aborted run's
  // tensors). OK at once when nothing is unanswered.
  absl::Status AwaitAbortedRuns() ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_.mu_, job_->mu);
  // kFeed, without the lock; the feed's error.
  absl::Status Feed() ABSL_LOCKS_EXCLUDED(core_.mu_);
  // kRun: RunStep to every rank (unless the job left TRAINING meanwhile), then the previous
  // Commit's confirmation.
  absl::Status Start(const absl::Status& feed) ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_.mu_, job_->mu);
  // kAwait.
  absl::Status AwaitReports() ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_.mu_, job_->mu);
  // After a missed deadline: aborts the step and evicts the ranks that do not answer the Abort
  // within loss_grace (stuck or stopped; those waiting on them answer at once).
  void EvictStuckRanks() ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_.mu_, job_->mu);
  // kReduce: fills the result's loss (every replica's micro-batch losses in the step's order,
  // summed in that order); the clip scale.
  absl::StatusOr<float> Reduce(v1::StepResult* result)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_.mu_, job_->mu);
  // From replica 0's grad norms; INTERNAL if another replica's differ in any bit (their
  // reduction went wrong).
  absl::StatusOr<float> ClipScale() ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_.mu_, job_->mu);
  // kCommit.
  absl::Status Commit(float clip) ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_.mu_, job_->mu);
  // kDone: the job READY at the next step, the timelines, metrics and log line.
  void Finish(v1::StepResult* result) ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_.mu_, job_->mu);
  // Ends the step with `status`: a recoverable job's transport failure first waits loss_grace
  // for the lost worker to be noticed (the client then hears "recovering" and replays).
  absl::Status Fail(absl::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_.mu_, job_->mu);
  // StepDone's deadline for this step's micro-batches.
  absl::Duration Deadline() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_.mu_, job_->mu);

  CoordinatorCore& core_;
  const v1::TrainRequest& request_;
  const std::function<bool()>& next_queued_;
  Phase phase_ = Phase::kAdmit;
  const absl::Time start_ = absl::Now();
  Job* job_ = nullptr;  // set by Admit; lives while its thread runs this step.
  StepBatch batch_;
  int64_t step_ = 0;        // its number: the job's steps_done + 1 (steps are numbered from 1).
  int64_t generation_ = 0;  // the generation the step runs in.
  // Each replica's first and last chunk owners, by replica.
  std::vector<std::pair<FeedTarget, FeedTarget>> feeds_;
  absl::Duration deadline_;
};

}  // namespace pipetrain::coordinator

#endif  // PIPETRAIN_SERVER_COORDINATOR_STEP_RUN_H_
