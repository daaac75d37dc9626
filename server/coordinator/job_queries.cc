// The core's client calls that answer at once: finding a job for its caller, its status, the
// listings, finishing and cancelling, and a Train stream's claim.
#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/net/principal.h"
#include "common/util/status_macros.h"
#include "server/coordinator/coordinator_core.h"

namespace pipetrain::coordinator {

absl::StatusOr<Job*> CoordinatorCore::FindJob(const std::string& id, const std::string& caller) {
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("unknown job '", id, "'"));
  Job* job = it->second.get();
  job->mu.AssertHeld();
  if (!net::MaySee(caller, job->owner)) {
    return absl::NotFoundError(absl::StrCat("unknown job '", id, "'"));
  }
  return job;
}

absl::Time CoordinatorCore::Now() const {
  return options_.clock != nullptr ? options_.clock() : absl::Now();
}

bool CoordinatorCore::LeaseHeld(const Job& job) {
  return IsTerminal(job.state) || job.state == JobState::kAssigning ||
         job.state == JobState::kRecovering || job.train_owner != nullptr || job.checkpointing;
}

void CoordinatorCore::RestartLease(Job& job) const {
  job.lease_expiry = LeaseHeld(job) ? absl::InfiniteFuture() : Now() + options_.client_lease;
}

absl::StatusOr<Job*> CoordinatorCore::ReadyJob(const std::string& id) {
  PT_ASSIGN_OR_RETURN(Job * job, FindJob(id));
  job->mu.AssertHeld();
  PT_RETURN_IF_ERROR(CheckReady(*job));
  return job;
}

absl::StatusOr<v1::JobStatus> CoordinatorCore::GetJob(const std::string& id,
                                                      const std::string& caller) {
  absl::MutexLock lock(&mu_);
  PT_ASSIGN_OR_RETURN(Job * job, FindJob(id, caller));
  job->mu.AssertHeld();
  return StatusOf(*job);
}

absl::StatusOr<v1::JobStatus> CoordinatorCore::FinishJob(const std::string& id,
                                                         const std::string& caller) {
  absl::MutexLock lock(&mu_);
  PT_ASSIGN_OR_RETURN(Job * job, FindJob(id, caller));
  job->mu.AssertHeld();
  if (IsTerminal(job->state)) return EndedError(*job);
  if (job->state != JobState::kReady) {
    return absl::FailedPreconditionError(
        absl::StrCat("job '", job->id, "' is ", JobStateName(job->state),
                     ": finish it once its operation is over (end its Train stream first), or "
                     "cancel it"));
  }
  EndJob(*job, JobState::kDone, "");
  return StatusOf(*job);
}

absl::StatusOr<v1::JobStatus> CoordinatorCore::CancelJob(const std::string& id,
                                                         const std::string& reason,
                                                         const std::string& caller) {
  absl::MutexLock lock(&mu_);
  PT_ASSIGN_OR_RETURN(Job * job, FindJob(id, caller));
  job->mu.AssertHeld();
  if (!IsTerminal(job->state)) {
    EndJob(*job, JobState::kCancelled, reason.empty() ? "cancelled by a client" : reason);
  }
  return StatusOf(*job);
}

absl::Status CoordinatorCore::CheckCaller(const std::string& id, const std::string& caller) {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("unknown job '", id, "'"));
  it->second->mu.AssertHeld();
  if (!net::MaySee(caller, it->second->owner)) {
    return absl::NotFoundError(absl::StrCat("unknown job '", id, "'"));
  }
  return absl::OkStatus();
}

std::vector<v1::JobStatus> CoordinatorCore::ListJobs(const std::string& caller) {
  absl::MutexLock lock(&mu_);
  std::vector<const Job*> order;
  for (const auto& [id, job] : jobs_) {
    job->mu.AssertHeld();
    if (net::MaySee(caller, job->owner)) order.push_back(job.get());
  }
  std::sort(order.begin(), order.end(), [](const Job* a, const Job* b) {
    a->mu.AssertHeld();
    b->mu.AssertHeld();
    return a->created != b->created ? a->created < b->created : a->id < b->id;
  });
  std::vector<v1::JobStatus> statuses;
  for (const Job* job : order) {
    job->mu.AssertHeld();
    statuses.push_back(StatusOf(*job));
  }
  return statuses;
}

std::vector<v1::WorkerInfo> CoordinatorCore::ListWorkers() {
  absl::MutexLock lock(&mu_);
  std::vector<v1::WorkerInfo> workers;
  for (const WorkerRecord* w : workers_.InOrder()) {
    v1::WorkerInfo& info = workers.emplace_back();
    info.set_name(w->info.name());
    info.set_address(w->info.address());
    info.set_cores(w->info.cores());
    info.set_gflops(w->info.gflops());
    *info.mutable_isa_levels() = w->info.isa_levels();
    info.set_memory_bytes(w->info.memory_bytes());
    info.set_job(w->job);
    for (const auto& [to, l] : w->links) {
      if (workers_.Find(to) != nullptr) *info.add_links() = l;
    }
    // The registry keeps the worker's position in its job: its rank and replica.
    info.set_rank(w->rank);
    info.set_replica(w->rank < 0 ? -1 : 0);
    if (auto it = jobs_.find(w->job); w->rank >= 0 && it != jobs_.end()) {
      const Job& job = *it->second;
      job.mu.AssertHeld();
      const JobShape shape = ShapeOf(job.spec);
      info.set_rank(shape.RankOf(w->rank));
      info.set_replica(shape.ReplicaOf(w->rank));
    }
  }
  return workers;
}

absl::Status CoordinatorCore::ClaimJob(const std::string& id, const void* owner,
                                       const std::string& caller) {
  absl::MutexLock lock(&mu_);
  PT_ASSIGN_OR_RETURN(Job * job, FindJob(id, caller));
  job->mu.AssertHeld();
  if (job->train_owner != nullptr && job->train_owner != owner) {
    return absl::FailedPreconditionError(
        absl::StrCat("job '", id,
                     "' already has an active Train stream; only one client may train a job at a "
                     "time"));
  }
  if (IsTerminal(job->state)) return EndedError(*job);
  if (job->state == JobState::kAssigning) {
    return absl::FailedPreconditionError(absl::StrCat("job '", id, "' is not ready yet"));
  }
  job->train_owner = owner;
  job->train_generation = job->generation;
  RestartLease(*job);  // held while the stream is.
  return absl::OkStatus();
}

void CoordinatorCore::ReleaseJob(const std::string& id, const void* owner) {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return;
  Job& job = *it->second;
  job.mu.AssertHeld();
  if (job.train_owner != owner) return;
  job.train_owner = nullptr;
  RestartLease(job);
}

v1::JobStatus CoordinatorCore::StatusOf(const Job& job) const {
  v1::JobStatus s;
  s.set_job(job.id);
  s.set_state(JobStateToProto(job.state));
  s.set_generation(job.generation);
  s.set_steps_done(job.steps_done);
  s.set_reason(job.reason);
  s.set_imbalance(job.imbalance);
  s.set_created_unix_ms(absl::ToUnixMillis(job.created));
  if (IsTerminal(job.state)) s.set_ended_unix_ms(absl::ToUnixMillis(job.ended));
  *s.mutable_spec() = job.spec;
  s.mutable_spec()->clear_tokenizer();  // up to megabytes, and the client has it.
  s.set_client_attached(job.train_owner != nullptr);
  s.set_owner(job.owner);
  *s.mutable_progress() = ProgressOf(job);
  for (const v1::RecoveryEvent& r : job.recoveries) *s.add_recoveries() = r;
  for (const v1::ShapeChange& c : job.shape_changes) *s.add_shape_changes() = c;
  if (job.resume.has_value()) {
    v1::ResumedFrom* r = s.mutable_resumed_from();
    r->set_directory(job.resume_dir);
    r->set_step(job.resume->step);
    r->set_data(job.resume->data);
    r->set_batch_size(job.resume->batch_size);
    r->set_cursor_epoch(job.resume->data_cursor.epoch);
    r->set_cursor_batch(job.resume->data_cursor.batch);
  }
  const JobShape shape = ShapeOf(job.spec);
  s.set_replicas(shape.replicas);
  const std::vector<std::string> addresses = RankAddresses(job);
  for (int p = 0; p < static_cast<int>(job.workers.size()); ++p) {
    const int rank = shape.RankOf(p);
    v1::StageStatus* st = s.add_stages();
    st->set_rank(rank);
    st->set_replica(shape.ReplicaOf(p));
    st->set_worker(job.workers[p]);
    st->set_address(addresses[p]);
    for (const v1::ChunkSpec& c : job.chunks) {
      if (c.rank() == rank) *st->add_chunks() = c;
    }
  }
  return s;
}

}  // namespace pipetrain::coordinator
