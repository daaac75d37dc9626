// The confirmation of a step's Commit: every rank answers Committed before it runs its next
// step, so the coordinator waits for it either at once or overlapped with the next step.
#include "absl/strings/str_cat.h"
#include "server/coordinator/coordinator_core.h"

namespace pipetrain::coordinator {

absl::Status CoordinatorCore::ConfirmCommitOf(const std::string& id) {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return absl::OkStatus();
  it->second->mu.AssertHeld();
  return ConfirmCommit(*it->second);
}

bool CoordinatorCore::Live(const Job& job) const {
  return !shutting_down_ && !IsTerminal(job.state) && job.state != JobState::kRecovering;
}

absl::Status CoordinatorCore::CommitInterruption(const Job& job) const {
  if (!job.commit.refusal.ok()) return job.commit.refusal;
  // An error of the operation in flight: in the step that committed, anything a rank reports (a
  // peer unreachable, say); in the step behind it, only a recoverable job's transport failure
  // (the rank out of reach may be one that has not committed) — any other error fails that later
  // step alone.
  if (!job.op.error.ok() && (job.op.step == job.commit.step ||
                             (job.spec.recover() && IsTransportFailure(job.op.error)))) {
    return job.op.error;
  }
  if (absl::Now() >= job.commit.deadline) {
    // Applying a step takes a fraction of computing it: a rank that has not committed within the
    // step's deadline is stuck or stopped.
    return absl::DeadlineExceededError(absl::StrCat(
        "job '", job.id, "': timed out after ", absl::FormatDuration(job.commit.timeout),
        " waiting for Committed of step ", job.commit.step));
  }
  return absl::OkStatus();
}

absl::Status CoordinatorCore::ConfirmCommit(Job& job) {
  if (job.commit.step < 0) return absl::OkStatus();
  const int64_t step = job.commit.step;
  absl::Status waited;
  while (Live(job) && !job.commit.AllCommitted()) {
    waited = CommitInterruption(job);
    if (!waited.ok()) break;
    WaitUntil(job.commit.deadline);
  }
  if (!waited.ok() && job.spec.recover() && Live(job)) {
    // A recoverable job whose commit was interrupted: the ranks that commit within loss_grace
    // are fine; the others are stuck or stopped and are evicted, and the job recovers without
    // them (every rank restarts from the checkpoint, so a half-applied step does not matter). If
    // all commit after all, the step stands.
    const absl::Time until = absl::Now() + options_.loss_grace;
    while (Live(job) && !job.commit.AllCommitted() && absl::Now() < until) WaitUntil(until);
    if (Live(job) && job.commit.AllCommitted()) {
      waited = absl::OkStatus();
    } else if (Live(job)) {
      EvictRanks(job, job.commit.Unconfirmed(),
                 absl::StrCat("did not commit step ", step, " of job ", job.id,
                              " while its peers reported: ", waited.ToString()));
    }
  }
  job.commit.step = -1;
  // Some workers may have applied the step: the ranks can no longer be trusted to be equal —
  // unless the job is recovering, which restarts every rank from its last checkpoint anyway.
  if (job.state == JobState::kRecovering) return CheckReady(job);
  if (waited.ok() && !Live(job)) {
    waited =
        shutting_down_ ? absl::CancelledError("coordinator shutting down") : InterruptedError(job);
  }
  if (!waited.ok() && !IsTerminal(job.state)) {
    FailJob(job, absl::StrCat("step ", step, " was not committed everywhere: ", waited.ToString()));
  }
  return waited;
}

}  // namespace pipetrain::coordinator
