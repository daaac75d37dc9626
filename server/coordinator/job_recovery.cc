#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/model/checkpoint.h"
#include "common/util/status_macros.h"
#include "common/wire/grpc_status.h"
#include "server/coordinator/coordinator_service.h"
#include "server/coordinator/job_isa.h"
#include "server/coordinator/job_spec.h"
#include "server/coordinator/reactors.h"
#include "server/metrics/coordinator_metrics.h"

// The coordinator's recovery of a job (a lost, evicted or stuck worker; fewer stages) and its
// durable journal (restart on --state-dir): docs/recovery.md.
namespace pipetrain::coordinator {

void CoordinatorService::DoRecover(Job* job) {
  bool ready = false;
  std::string id;
  {
    absl::MutexLock lock(&mu_);
    id = job->id;
    ready = Reassign(job);
  }
  if (ready) JournalJob(id);
}

bool CoordinatorService::Reassign(Job* job) {
  if (job->state != JobState::kRecovering) return false;
  const absl::Duration wait = job->spec.replace_timeout_ms() > 0
                                  ? absl::Milliseconds(job->spec.replace_timeout_ms())
                                  : absl::Seconds(30);
  const absl::Time deadline = absl::Now() + wait;
  const int S = static_cast<int>(job->workers.size());
  const int min_stages = job->spec.min_stages();
  std::vector<int> lost;
  std::vector<WorkerConn*> idle;
  bool shrink = false;
  for (;;) {
    if (shutting_down_ || IsTerminal(job->state)) return false;
    lost.clear();
    for (int rank = 0; rank < S; ++rank) {
      auto it = workers_.find(job->workers[rank]);
      if (it == workers_.end() || it->second.reactor == nullptr || it->second.job != job->id) {
        lost.push_back(rank);
      }
    }
    idle = IdleWorkers();
    // Replacements must run the job's instruction-set level (its bits depend on it).
    if (const std::optional<math::Isa> isa = math::IsaFromName(job->spec.isa()); isa.has_value()) {
      idle.erase(std::remove_if(idle.begin(), idle.end(),
                                [&](const WorkerConn* w) { return !WorkerRunsIsa(w->info, *isa); }),
                 idle.end());
    }
    if (idle.size() >= lost.size()) break;
    const int reachable = S - static_cast<int>(lost.size()) + static_cast<int>(idle.size());
    if (absl::Now() >= deadline) {
      if (min_stages > 0 && reachable >= min_stages) {
        shrink = true;
        break;
      }
      FailJob(
          *job,
          absl::StrCat(
              "lost ", lost.size(), " of its ", S, " workers (", job->recovering.cause(),
              job->recovering.lost_worker().empty() ? "" : " of " + job->recovering.lost_worker(),
              " at step ", job->recovering.failed_step(), ") and no idle worker", " replaced ",
              lost.size() == 1 ? "it" : "them", " within ", absl::FormatDuration(wait),
              min_stages > 0 ? absl::StrCat("; ", reachable,
                                            " workers are fewer than its "
                                            "min_stages ",
                                            min_stages)
                             : ""));
      return false;
    }
    event_cv_.WaitWithDeadline(&mu_, deadline);
  }
  // The workers of the new epoch, by rank: a shrinking job keeps its survivors (in rank order)
  // and takes every idle worker; otherwise idle workers take the lost ranks.
  std::vector<std::string> names;
  if (shrink) {
    for (int rank = 0; rank < S; ++rank) {
      if (std::find(lost.begin(), lost.end(), rank) == lost.end()) {
        names.push_back(job->workers[rank]);
      }
    }
    for (const WorkerConn* conn : idle) names.push_back(conn->info.name());
  } else {
    names = job->workers;
    for (size_t i = 0; i < lost.size(); ++i) names[lost[i]] = idle[i]->info.name();
  }
  if (shrink || job->chunks.empty()) {
    // Fewer stages, or a job restored from the journal: plan and partition anew, with the most
    // stages (at most names.size(), at least min_stages) the schedule accepts.
    const int fewest = shrink ? min_stages : static_cast<int>(names.size());
    absl::Status laid = absl::InternalError("no stage count to try");
    for (int n = static_cast<int>(names.size()); n >= std::max(fewest, 1); --n) {
      v1::JobSpec spec = job->spec;
      spec.set_stages(n);
      absl::StatusOr<schedule::Plan> plan = PlanFor(spec, *job->model);
      if (!plan.ok()) {
        laid = plan.status();
        continue;
      }
      std::vector<double> speeds;
      for (int r = 0; r < n; ++r) speeds.push_back(workers_[names[r]].info.gflops());
      absl::StatusOr<std::pair<std::vector<v1::ChunkSpec>, double>> cut =
          PartitionChunks(spec, *job->model, *plan, speeds);
      if (!cut.ok()) {
        laid = cut.status();
        continue;
      }
      job->spec = std::move(spec);
      job->plan = *std::move(plan);
      job->chunks = std::move(cut->first);
      job->imbalance = cut->second;
      names.resize(n);
      laid = absl::OkStatus();
      break;
    }
    if (!laid.ok()) {
      FailJob(*job, absl::StrCat("cannot re-partition onto ", names.size(),
                                 " workers: ", laid.ToString()));
      return false;
    }
  }
  // Survivors left without a rank (a schedule that needs fewer stages) are released.
  v1::WorkerCommand release;
  release.mutable_release()->set_job(job->id);
  release.mutable_release()->set_epoch(job->epoch);
  release.mutable_release()->set_reason("the job shrank to fewer stages");
  for (auto& [name, conn] : workers_) {
    if (conn.job == job->id && std::find(names.begin(), names.end(), name) == names.end()) {
      if (conn.reactor != nullptr) conn.reactor->Send(release);
      conn.job.clear();
      conn.rank = -1;
    }
  }
  const int n = static_cast<int>(names.size());
  job->workers = names;
  for (int rank = 0; rank < n; ++rank) {
    WorkerConn& conn = workers_[names[rank]];
    conn.job = job->id;
    conn.rank = rank;
  }
  // A new epoch: every rank rebuilds its stages from the restore state; frames and answers of
  // the old epoch are rejected.
  ++job->epoch;
  job->steps_done = job->restore.has_value() ? job->restore->step : 0;
  job->assigned.assign(n, false);
  job->runs_sent.assign(n, 0);
  job->runs_answered.assign(n, 0);
  job->reports.assign(n, std::nullopt);
  job->committed.assign(n, false);
  job->commit_step = -1;  // the restore state replaces whatever was applied.
  job->commit_error = absl::OkStatus();
  job->saved.assign(n, false);
  job->op_step = -1;
  job->op_error = absl::OkStatus();
  job->recovering.set_restored_step(job->steps_done);
  job->recovering.set_epoch(job->epoch);
  job->recovering.set_stages(n);
  job->recovering.clear_workers();
  for (const std::string& name : job->workers) job->recovering.add_workers(name);
  mu_.Unlock();
  const absl::StatusOr<v1::JobStatus> assigned = DoAssign(job);
  if (assigned.ok()) OpenLinksEarly(job);
  mu_.Lock();
  if (!assigned.ok()) return false;  // DoAssign failed the job.
  job->recovering.set_seconds(absl::ToDoubleSeconds(absl::Now() - job->recovery_start));
  job->recoveries.push_back(job->recovering);
  Log(absl::StrCat("job ", job->id, ": recovered (", job->recovering.cause(),
                   job->recovering.lost_worker().empty() ? "" : " " + job->recovering.lost_worker(),
                   " at step ", job->recovering.failed_step(), ") in ", job->recovering.seconds(),
                   " s; restarted from step ", job->steps_done, " in epoch ", job->epoch, " on ", n,
                   n < S ? absl::StrCat(" stages (was ", S, "): ") : " stages: ",
                   absl::StrJoin(job->workers, ", ")),
      logging::LogLevel::kWarning);
  if (options_.metrics != nullptr) options_.metrics->RecordRecovery(job->id);
  return true;
}

absl::Status CoordinatorService::OpenJournal(const std::string& state_dir) {
  PT_ASSIGN_OR_RETURN(std::unique_ptr<JobJournal> journal, JobJournal::Open(state_dir));
  PT_ASSIGN_OR_RETURN(JobJournal::Contents contents, journal->Load());
  for (const auto& [path, why] : contents.problems) {
    Log(absl::StrCat("journal: ignoring ", path, ": ", why.ToString()));
  }
  absl::MutexLock lock(&mu_);
  if (journal_ != nullptr) return absl::FailedPreconditionError("the journal is already open");
  journal_ = std::move(journal);
  for (v1::JobRecord& record : contents.records) RestoreJob(std::move(record));
  Log(absl::StrCat("journal ", journal_->directory(), ": ", contents.records.size(),
                   " job(s) to continue"));
  return absl::OkStatus();
}

void CoordinatorService::RestoreJob(v1::JobRecord record) {
  if (jobs_.count(record.job()) != 0) return;
  auto job = std::make_unique<Job>();
  Job& j = *job;
  j.id = record.job();
  j.spec = record.spec();
  j.epoch = record.epoch();
  j.created = absl::FromUnixMillis(record.created_unix_ms());
  j.recoveries.assign(record.recoveries().begin(), record.recoveries().end());
  j.state = JobState::kRecovering;
  j.recovery_start = absl::Now();
  j.recovering.set_cause("coordinator restart");
  j.recovering.set_rank(-1);
  j.recovering.set_failed_step(record.restore_step());
  j.lease_expiry = absl::Now() + options_.client_lease;
  j.ops = std::make_unique<OpThread>();
  jobs_[j.id] = std::move(job);
  // What the record promises is checked again: the spec (and so the plan), the checkpoint.
  std::shared_ptr<const model::Model> net;
  absl::StatusOr<CheckedJobSpec> checked = CheckJobSpec(options_.job_limits, &j.spec);
  absl::Status usable = checked.status();
  if (checked.ok()) net = checked->model;
  if (usable.ok() && !record.restore_dir().empty()) {
    absl::StatusOr<model::CheckpointManifest> manifest =
        model::VerifyCheckpoint(record.restore_dir());
    if (manifest.ok() && manifest->step != record.restore_step()) {
      manifest = absl::DataLossError(
          absl::StrCat("its step is ", manifest->step, ", the journal's ", record.restore_step()));
    }
    if (manifest.ok()) {
      j.restore_dir = record.restore_dir();
      j.restore = *std::move(manifest);
    } else {
      usable = wire::Annotate(manifest.status(),
                              absl::StrCat("its last checkpoint ", record.restore_dir()));
    }
  }
  if (!usable.ok()) {
    FailJob(j,
            absl::StrCat("cannot continue after the coordinator restarted: ", usable.ToString()));
    return;
  }
  j.model = std::move(net);
  j.steps_done = j.restore.has_value() ? j.restore->step : 0;
  if (!record.resume_dir().empty()) {
    j.resume_dir = record.resume_dir();
    absl::StatusOr<model::CheckpointManifest> resumed =
        model::ReadCheckpointManifest(record.resume_dir());
    if (resumed.ok()) j.resume = *std::move(resumed);
  }
  // No layout yet (Reassign partitions for the workers that register): every rank is lost.
  j.workers.assign(j.spec.stages(), "");
  if (journal_ != nullptr) journal_->Track(j.id);
  Log(absl::StrCat("job ", j.id, ": restored from the journal at step ", j.steps_done,
                   "; waiting for ", j.spec.stages(), " workers"));
  Job* raw = &j;  // lives while its OpThread runs tasks.
  if (!j.ops->Post([this, raw] { DoRecover(raw); })) FailJob(j, "shutting down");
}

void CoordinatorService::JournalJob(const std::string& id) {
  JobJournal* journal = nullptr;
  v1::JobRecord record;
  {
    absl::MutexLock lock(&mu_);
    auto it = jobs_.find(id);
    if (journal_ == nullptr || it == jobs_.end() || IsTerminal(it->second->state)) return;
    const Job& job = *it->second;
    journal = journal_.get();  // lives as long as the service.
    record.set_job(job.id);
    *record.mutable_spec() = job.spec;
    record.set_epoch(job.epoch);
    if (job.restore.has_value()) {
      record.set_restore_dir(job.restore_dir);
      record.set_restore_step(job.restore->step);
    }
    record.set_resume_dir(job.resume_dir);
    record.set_created_unix_ms(absl::ToUnixMillis(job.created));
    for (const v1::RecoveryEvent& r : job.recoveries) *record.add_recoveries() = r;
  }
  // Outside mu_ (a file write and two fsyncs); a job that ended meanwhile is no longer tracked,
  // so its record is not written back.
  if (const absl::Status written = journal->Write(record); !written.ok()) {
    Log(absl::StrCat("job ", id, ": cannot write its journal record: ", written.ToString()));
  }
}

}  // namespace pipetrain::coordinator
