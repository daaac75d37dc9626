// A job's recovery (a lost, evicted or stuck worker; fewer stages) and its durable journal
// (restart on --state-dir): docs/recovery.md.
#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/model/checkpoint.h"
#include "common/util/annotate.h"
#include "common/util/status_macros.h"
#include "pipetrain/v1/worker_control.pb.h"
#include "server/coordinator/coordinator_core.h"
#include "server/metrics/coordinator_metrics.h"

namespace pipetrain::coordinator {
namespace {

// "CAUSE[ of WORKER] after step N", for messages about the recovery in progress.
std::string RecoveryCause(const v1::RecoveryEvent& r) {
  return absl::StrCat(r.cause(), r.lost_worker().empty() ? "" : " of " + r.lost_worker(),
                      " after step ", r.steps_done());
}

}  // namespace

void CoordinatorCore::BeginRecovery(Job& job, const std::string& name, int rank,
                                    const std::string& cause) {
  const bool again = job.state == JobState::kRecovering;
  Log(absl::StrCat("job ", job.id, ": ", WorkerLabel(name, rank), " was ",
                   cause == "deadline" ? "evicted (step deadline)" : "lost", " at step ",
                   job.steps_done,
                   again ? "; the recovery in progress starts over without it" : "; recovering"),
      logging::LogLevel::kWarning);
  if (again) {
    // A fault during the recovery: whatever it waits for (an idle worker, the Assigned of the
    // layout it chose) is re-decided with what is left.
    job.recovery_restart = true;
    job.recovering.add_also_lost(name);
  } else {
    job.state = JobState::kRecovering;
    job.recovery_start = absl::Now();
    job.recovering = v1::RecoveryEvent();
    job.recovering.set_lost_worker(name);
    job.recovering.set_rank(rank);
    job.recovering.set_cause(cause);
    job.recovering.set_steps_done(job.steps_done);
    v1::JobEvent event;
    *event.mutable_recovering() = job.recovering;
    RecordEvent(job, std::move(event));
  }
  if (job.op.error.ok()) {
    job.op.error = absl::AbortedError(
        absl::StrCat("job '", job.id, "': ", WorkerLabel(name, rank), " was lost at step ",
                     job.steps_done, "; the job is recovering (replay from its last checkpoint)"));
  }
  Job* raw = &job;  // lives while its thread runs tasks.
  if (job.ops != nullptr && !job.ops->Post([this, raw] { Recover(raw); })) {
    FailJob(job, "lost a worker while shutting down");
  }
}

void CoordinatorCore::Recover(Job* job) {
  std::string id;
  int before = 0;  // the stages before the recovery.
  {
    absl::MutexLock lock(&mu_);
    job->mu.AssertHeld();
    id = job->id;
    before = job->spec.stages();
    if (job->state != JobState::kRecovering) return;
    bool shrink = false;
    int replicas = ShapeOf(job->spec).replicas;
    std::optional<std::vector<std::string>> names = AwaitReplacements(*job, &shrink, &replicas);
    if (!names.has_value()) return;
    job->recovery_restart = false;  // `names` holds no lost worker; a later loss restarts.
    const int fewest =
        shrink ? job->spec.min_stages() : static_cast<int>(names->size()) / std::max(replicas, 1);
    if ((shrink || job->chunks.empty()) && !Relayout(*job, &*names, fewest, replicas)) return;
    StartGeneration(*job, *names);
  }
  // Assign records the recovery as the job becomes READY (RecordRecovery): a client that sees
  // it READY again sees the recovery too.
  // On error Assign fails the job, or leaves it RECOVERING with Recover queued again (a worker of
  // the new layout was lost or did not answer).
  const absl::StatusOr<v1::JobStatus> assigned = Assign(job, before);
  if (!assigned.ok()) return;
  OpenLinksEarly(job);
  JournalJob(id);
}

void CoordinatorCore::RecordRecovery(Job& job, int stages_before) {
  v1::RecoveryEvent& r = job.recovering;
  r.set_seconds(absl::ToDoubleSeconds(absl::Now() - job.recovery_start));
  job.recoveries.push_back(r);
  const JobShape shape = ShapeOf(job.spec);
  Log(absl::StrCat(
          "job ", job.id, ": recovered (", r.cause(),
          r.lost_worker().empty() ? "" : " " + r.lost_worker(), " after step ", r.steps_done(),
          r.also_lost().empty() ? "" : "; then " + absl::StrJoin(r.also_lost(), ", "), ") in ",
          r.seconds(), " s; restarted from step ", job.steps_done, " in generation ",
          job.generation, " on ", shape.ToString(),
          shape.stages < stages_before ? absl::StrCat(" (was ", stages_before, " stages)") : "",
          ": ", absl::StrJoin(job.workers, ", ")),
      logging::LogLevel::kWarning);
  if (options_.metrics != nullptr) options_.metrics->RecordRecovery(job.id);
  RecordRecovered(job, stages_before);
}

std::optional<std::vector<std::string>> CoordinatorCore::AwaitReplacements(Job& job, bool* shrink,
                                                                           int* replicas) {
  const absl::Duration wait = job.spec.replace_timeout_ms() > 0
                                  ? absl::Milliseconds(job.spec.replace_timeout_ms())
                                  : absl::Seconds(30);
  const absl::Time deadline = absl::Now() + wait;
  const JobShape shape = ShapeOf(job.spec);
  const int P = static_cast<int>(job.workers.size());
  const int min_stages = job.spec.min_stages();
  // Replacements must run the job's instruction-set level (its bits depend on it).
  const std::optional<math::Isa> isa = math::IsaFromName(job.spec.isa());
  std::vector<int> lost;
  std::vector<WorkerRecord*> idle;
  for (;;) {
    if (shutting_down_ || IsTerminal(job.state)) return std::nullopt;
    lost.clear();
    for (int p = 0; p < P; ++p) {
      if (!workers_.Holds(job.workers[p], job.id)) lost.push_back(p);
    }
    idle = workers_.Idle(isa);
    if (idle.size() >= lost.size()) break;
    const int reachable = P - static_cast<int>(lost.size()) + static_cast<int>(idle.size());
    if (absl::Now() >= deadline) {
      // A job that may shrink (min_stages > 0) first halves its replicas, keeping its stages
      // (each half's share stays a node of the gradient tree), then drops stages.
      *replicas = shape.replicas;
      while (*replicas > 1 && shape.stages * *replicas > reachable) *replicas /= 2;
      if (min_stages > 0 && (shape.stages * *replicas <= reachable || reachable >= min_stages)) {
        *shrink = true;
        break;
      }
      FailJob(job,
              absl::StrCat("lost ", lost.size(), " of its ", P, " workers (",
                           RecoveryCause(job.recovering), ") and no idle worker replaced ",
                           lost.size() == 1 ? "it" : "them", " within ", absl::FormatDuration(wait),
                           min_stages > 0 ? absl::StrCat("; ", reachable,
                                                         " workers are fewer than its "
                                                         "min_stages ",
                                                         min_stages)
                                          : ""));
      return std::nullopt;
    }
    WaitUntil(deadline);
  }
  // A shrinking job keeps its survivors (in position order) and takes every idle worker; otherwise
  // idle workers take the lost positions.
  std::vector<std::string> names;
  if (*shrink) {
    for (int p = 0; p < P; ++p) {
      if (std::find(lost.begin(), lost.end(), p) == lost.end()) names.push_back(job.workers[p]);
    }
    for (const WorkerRecord* w : idle) names.push_back(w->info.name());
  } else {
    names = job.workers;
    for (size_t i = 0; i < lost.size(); ++i) names[lost[i]] = idle[i]->info.name();
  }
  return names;
}

bool CoordinatorCore::Relayout(Job& job, std::vector<std::string>* names, int fewest,
                               int replicas) {
  // Fewer stages or replicas, or a job restored from the journal: plan and partition anew, with
  // `replicas` replicas and the most stages (at most names.size() / replicas and the stages it
  // had, at least `fewest`) the schedule accepts.
  replicas = std::max(replicas, 1);
  const int most = std::min(static_cast<int>(names->size()) / replicas, job.spec.stages());
  absl::StatusOr<Layout> layout = PlanLayout(job, *names, fewest, most, replicas);
  if (!layout.ok()) {
    FailJob(job, absl::StrCat("cannot re-partition onto ", names->size(),
                              " workers: ", layout.status().ToString()));
    return false;
  }
  *names = layout->workers;
  ApplyLayout(job, *std::move(layout));
  return true;
}

absl::StatusOr<CoordinatorCore::Layout> CoordinatorCore::PlanLayout(
    const Job& job, const std::vector<std::string>& names, int fewest, int most,
    int replicas) const {
  absl::Status laid = absl::InternalError("no stage count to try");
  for (int n = most; n >= std::max(fewest, 1); --n) {
    Layout layout;
    layout.spec = job.spec;
    layout.spec.set_stages(n);
    layout.spec.set_replicas(replicas);
    absl::StatusOr<schedule::Plan> plan = job::PlanFor(layout.spec, *job.model);
    if (!plan.ok()) {
      laid = plan.status();
      continue;
    }
    const JobShape shape = ShapeOf(layout.spec);
    if (shape.positions() > static_cast<int>(names.size())) continue;
    std::vector<double> speeds;
    for (int p = 0; p < shape.positions(); ++p) {
      speeds.push_back(workers_.Find(names[p])->info.gflops());
    }
    const std::vector<int> arranged = ArrangePositions(speeds, shape);
    std::vector<double> placed_speeds;
    for (int p = 0; p < shape.positions(); ++p) {
      layout.workers.push_back(names[arranged[p]]);
      placed_speeds.push_back(speeds[arranged[p]]);
    }
    absl::StatusOr<std::pair<std::vector<v1::ChunkSpec>, double>> cut =
        job::PartitionChunks(layout.spec, *job.model, *plan, RankSpeeds(placed_speeds, shape));
    if (!cut.ok()) {
      laid = cut.status();
      continue;
    }
    layout.plan = *std::move(plan);
    layout.chunks = std::move(cut->first);
    layout.imbalance = cut->second;
    return layout;
  }
  return laid;
}

void CoordinatorCore::ApplyLayout(Job& job, Layout layout) {
  job.spec = std::move(layout.spec);
  job.plan = std::move(layout.plan);
  job.chunks = std::move(layout.chunks);
  job.imbalance = layout.imbalance;
}

void CoordinatorCore::StartGeneration(Job& job, const std::vector<std::string>& names,
                                      const std::string& why) {
  // Survivors left without a rank (a schedule that needs fewer stages) are released.
  v1::WorkerCommand release;
  release.mutable_release()->set_job(job.id);
  release.mutable_release()->set_generation(job.generation);
  release.mutable_release()->set_reason(why);
  for (const std::string& name : job.workers) {
    if (std::find(names.begin(), names.end(), name) != names.end()) continue;
    if (WorkerRecord* w = workers_.Find(name); w != nullptr && w->job == job.id) {
      w->channel->Send(release);
      workers_.Take(name, "", -1);
    }
  }
  const int n = static_cast<int>(names.size());
  job.workers = names;
  for (int rank = 0; rank < n; ++rank) workers_.Take(names[rank], job.id, rank);
  // A new generation: every rank rebuilds its stages from the restore state; frames and answers of
  // the old generation are refused.
  ++job.generation;
  job.steps_done = job.restore.has_value() ? job.restore->step : 0;
  job.op.Reset(n);
  job.commit = CommitBook();  // the restore state replaces whatever was applied.
  job.recovering.set_restored_step(job.steps_done);
  job.recovering.set_generation(job.generation);
  job.recovering.set_stages(ShapeOf(job.spec).stages);
  job.recovering.set_replicas(ShapeOf(job.spec).replicas);
  job.recovering.clear_workers();
  for (const std::string& name : job.workers) job.recovering.add_workers(name);
}

// ---------------------------------------------------------------- journal

absl::Status CoordinatorCore::OpenJournal(const std::string& state_dir,
                                          const std::string& address) {
  {
    absl::MutexLock lock(&mu_);
    if (journal_ != nullptr) return absl::FailedPreconditionError("the journal is already open");
  }
  // One coordinator per state directory: its lock comes before anything in it is read or removed.
  PT_ASSIGN_OR_RETURN(std::unique_ptr<StateDirLock> state_lock,
                      StateDirLock::Acquire(state_dir, address));
  PT_ASSIGN_OR_RETURN(std::unique_ptr<StagingLedger> staging, StagingLedger::Open(state_dir));
  PT_ASSIGN_OR_RETURN(StagingLedger::Cleanup cleanup, staging->RemoveLeftovers());
  for (const std::string& path : cleanup.removed) {
    Log(absl::StrCat("removed ", path,
                     ": the staging directory of a checkpoint a coordinator did not finish (it "
                     "died or was killed)"),
        logging::LogLevel::kWarning);
  }
  for (const auto& [path, why] : cleanup.problems) {
    Log(absl::StrCat("staging ledger: keeping ", path, ": ", why.ToString()),
        logging::LogLevel::kWarning);
  }
  PT_ASSIGN_OR_RETURN(std::unique_ptr<JobJournal> journal, JobJournal::Open(state_dir));
  PT_ASSIGN_OR_RETURN(JobJournal::Contents contents, journal->Load());
  for (const auto& [path, why] : contents.problems) {
    Log(absl::StrCat("journal: ignoring ", path, ": ", why.ToString()));
  }
  absl::MutexLock lock(&mu_);
  if (journal_ != nullptr) return absl::FailedPreconditionError("the journal is already open");
  state_lock_ = std::move(state_lock);
  staging_ = std::move(staging);
  journal_ = std::move(journal);
  for (journal::v1::JobRecord& record : contents.records) RestoreJob(std::move(record));
  Log(absl::StrCat("journal ", journal_->directory(), ": ", contents.records.size(),
                   " job(s) to continue"));
  return absl::OkStatus();
}

void CoordinatorCore::RecordListenAddress(const std::string& address) {
  StateDirLock* state_lock = nullptr;
  {
    absl::MutexLock lock(&mu_);
    state_lock = state_lock_.get();  // lives as long as the core once set.
  }
  if (state_lock == nullptr) return;
  if (const absl::Status s = state_lock->SetAddress(address); !s.ok()) {
    Log(absl::StrCat("cannot record the listen address in the state directory's lock file: ",
                     s.ToString()),
        logging::LogLevel::kWarning);
  }
}

void CoordinatorCore::RestoreJob(journal::v1::JobRecord record) {
  if (jobs_.count(record.job()) != 0) return;
  auto owned = std::make_unique<Job>(mu_, record.job(), options_.job_events);
  Job& j = *owned;
  j.mu.AssertHeld();
  j.spec = record.spec();
  j.owner = record.owner();
  j.generation = record.generation();
  j.created = absl::FromUnixMillis(record.created_unix_ms());
  j.recoveries.assign(record.recoveries().begin(), record.recoveries().end());
  j.state = JobState::kRecovering;
  j.recovery_start = absl::Now();
  j.recovering.set_cause("coordinator restart");
  j.recovering.set_rank(-1);
  j.recovering.set_steps_done(record.restore_step());
  j.ops = std::make_unique<OpThread>();
  jobs_[j.id] = std::move(owned);
  // What the record promises is checked again: the spec (and so the plan), the checkpoint.
  absl::StatusOr<job::CheckedJobSpec> checked = job::CheckJobSpec(options_.job_limits, &j.spec);
  absl::Status usable = checked.status();
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
      usable = util::Annotate(manifest.status(),
                              absl::StrCat("its last checkpoint ", record.restore_dir()));
    }
  }
  if (!usable.ok()) {
    FailJob(j,
            absl::StrCat("cannot continue after the coordinator restarted: ", usable.ToString()));
    return;
  }
  j.model = checked->model;
  j.steps_done = j.restore.has_value() ? j.restore->step : 0;
  if (!record.resume_dir().empty()) {
    j.resume_dir = record.resume_dir();
    absl::StatusOr<model::CheckpointManifest> resumed =
        model::ReadCheckpointManifest(record.resume_dir());
    if (resumed.ok()) j.resume = *std::move(resumed);
  }
  // A checkpoint it wrote stays its own (one writer per directory).
  if (j.restore_dir != j.resume_dir) j.checkpoint_dir = j.restore_dir;
  // No layout yet (Recover partitions for the workers that register): every rank is lost.
  j.workers.assign(ShapeOf(j.spec).positions(), "");
  if (journal_ != nullptr) journal_->Track(j.id);
  Log(absl::StrCat("job ", j.id, ": restored from the journal at step ", j.steps_done,
                   "; waiting for ", j.workers.size(), " workers (", ShapeOf(j.spec).ToString(),
                   ")"));
  Job* raw = &j;  // lives while its thread runs tasks.
  if (!j.ops->Post([this, raw] { Recover(raw); })) FailJob(j, "shutting down");
}

void CoordinatorCore::JournalJob(const std::string& id) {
  JobJournal* journal = nullptr;
  journal::v1::JobRecord record;
  {
    absl::MutexLock lock(&mu_);
    auto it = jobs_.find(id);
    if (journal_ == nullptr || it == jobs_.end()) return;
    const Job& job = *it->second;
    job.mu.AssertHeld();
    if (IsTerminal(job.state)) return;
    journal = journal_.get();  // lives as long as the core.
    record.set_job(job.id);
    record.set_owner(job.owner);
    *record.mutable_spec() = job.spec;
    record.set_generation(job.generation);
    if (job.restore.has_value()) {
      record.set_restore_dir(job.restore_dir);
      record.set_restore_step(job.restore->step);
    }
    record.set_resume_dir(job.resume_dir);
    record.set_created_unix_ms(absl::ToUnixMillis(job.created));
    for (const v1::RecoveryEvent& r : job.recoveries) *record.add_recoveries() = r;
  }
  // Outside the lock (a file write and two fsyncs); a job that ended meanwhile is no longer
  // tracked, so its record is not written back.
  if (const absl::Status written = journal->Write(record); !written.ok()) {
    Log(absl::StrCat("job ", id, ": cannot write its journal record: ", written.ToString()));
  }
}

}  // namespace pipetrain::coordinator
