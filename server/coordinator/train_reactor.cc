#include "server/coordinator/train_reactor.h"

#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/wire/grpc_status.h"

namespace pipetrain::coordinator {

TrainReactor::TrainReactor(CoordinatorCore* core, std::string caller)
    : core_(core), caller_(std::move(caller)) {
  absl::MutexLock lock(&mu_);
  StartReadLocked();
}

void TrainReactor::OnReadDone(bool ok) {
  absl::MutexLock lock(&mu_);
  reading_ = false;
  if (!ok) {  // the client closed its side (or went away): finish once the queued steps are done.
    reads_done_ = true;
    MaybeFinishLocked();
    return;
  }
  if (!error_.ok()) {  // the stream is ending; this batch is applied nowhere.
    MaybeFinishLocked();
    return;
  }
  QueueStepLocked();
}

void TrainReactor::QueueStepLocked() {
  if (job_.empty()) {
    const absl::Status claim = core_->ClaimJob(incoming_.job(), this, caller_);
    if (!claim.ok()) {
      FailLocked(claim);
      return;
    }
    job_ = incoming_.job();
  } else if (incoming_.job() != job_) {
    FailLocked(absl::InvalidArgumentError(
        absl::StrCat("this Train stream trains job '", job_, "', not '", incoming_.job(), "'")));
    return;
  }
  auto request = std::make_shared<const v1::TrainRequest>(std::move(incoming_));
  incoming_.Clear();
  ++steps_in_flight_;
  const absl::Status posted =
      core_->PostClientRequest(job_, [this, request] { RunStep(*request); });
  if (!posted.ok()) {
    --steps_in_flight_;
    FailLocked(posted);
    return;
  }
  if (steps_in_flight_ < kStepsInFlight) StartReadLocked();
}

void TrainReactor::OnWriteDone(bool ok) {
  absl::MutexLock lock(&mu_);
  writing_ = false;
  results_.pop_front();
  if (!ok) {
    results_.clear();
    FailLocked(absl::CancelledError("the client went away"));
    return;
  }
  if (!results_.empty()) {
    writing_ = true;
    StartWrite(&results_.front());
    return;
  }
  MaybeFinishLocked();
}

void TrainReactor::OnCancel() {
  absl::MutexLock lock(&mu_);
  FailLocked(absl::CancelledError("the client cancelled the Train stream"));
}

void TrainReactor::OnDone() {
  std::string job;
  {
    absl::MutexLock lock(&mu_);
    job = job_;
  }
  if (!job.empty()) core_->ReleaseJob(job, this);
  delete this;
}

void TrainReactor::RunStep(const v1::TrainRequest& request) {
  bool skip = false;
  std::string job;
  {
    absl::MutexLock lock(&mu_);
    skip = !error_.ok();
    job = job_;
  }
  if (skip) {
    // The step before may have left its Commit for this one to confirm: confirm it here (a
    // failure ends or recovers the job; this stream reports its first failure already).
    core_->ConfirmCommitOf(job).IgnoreError();
    absl::MutexLock lock(&mu_);
    --steps_in_flight_;
    MaybeFinishLocked();
    return;
  }
  // Another batch of this stream queued behind this one lets the step return once its Commit is
  // sent; read without mu_, which the step must not take.
  absl::StatusOr<v1::StepResult> result = core_->TrainStep(
      request, [this] { return steps_in_flight_.load(std::memory_order_acquire) > 1; });
  // A step refused before it ran (a bad batch, say) confirms no Commit: the one before it may
  // still be unconfirmed, and the stream ends here.
  if (!result.ok()) core_->ConfirmCommitOf(job).IgnoreError();
  absl::MutexLock lock(&mu_);
  --steps_in_flight_;
  if (!result.ok()) {
    FailLocked(result.status());
    return;
  }
  if (!error_.ok()) {  // the client went away during the step.
    MaybeFinishLocked();
    return;
  }
  results_.push_back(*std::move(result));
  if (!writing_) {
    writing_ = true;
    StartWrite(&results_.front());
  }
  if (!reading_ && !reads_done_ && steps_in_flight_ < kStepsInFlight) StartReadLocked();
}

void TrainReactor::StartReadLocked() {
  reading_ = true;
  StartRead(&incoming_);
}

void TrainReactor::FailLocked(const absl::Status& status) {
  if (error_.ok()) {
    error_ = status;
    if (!job_.empty()) core_->ReleaseJob(job_, this);
  }
  MaybeFinishLocked();
}

void TrainReactor::MaybeFinishLocked() {
  if (finished_ || steps_in_flight_ > 0 || writing_) return;
  if (error_.ok() && !reads_done_) return;
  finished_ = true;
  if (!job_.empty()) core_->ReleaseJob(job_, this);  // before the client sees the status.
  Finish(wire::ToGrpcStatus(error_));
}

}  // namespace pipetrain::coordinator
