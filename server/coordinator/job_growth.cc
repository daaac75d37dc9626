// Jobs that grow (docs/scaling.md, "Jobs that change shape"): at a step boundary, a job with
// room to grow (JobSpec.max_stages) and idle workers of its instruction-set level takes a
// checkpoint, re-partitions over more stages and re-assigns every rank with restore in a new
// generation. The math does not depend on the stage count, so training continues bitwise as if
// the job had never changed shape. A growth that fails keeps the job at its shape.
#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/io/file_util.h"
#include "common/math/isa.h"
#include "common/net/secret.h"
#include "server/coordinator/coordinator_core.h"

namespace pipetrain::coordinator {
namespace {

// A change of `job`'s shape from `before`, as the job is now (its step, generation, workers).
// `checkpoint`: the growth's checkpoint, if it was written.
v1::ShapeChange ShapeChangeOf(const Job& job, const JobShape& before, absl::Time start,
                              const std::string& checkpoint) ABSL_EXCLUSIVE_LOCKS_REQUIRED(job.mu) {
  const JobShape now = ShapeOf(job.spec);
  v1::ShapeChange c;
  c.set_step(job.steps_done);
  c.set_stages_before(before.stages);
  c.set_stages(now.stages);
  c.set_replicas_before(before.replicas);
  c.set_replicas(now.replicas);
  for (const std::string& name : job.workers) c.add_workers(name);
  c.set_generation(job.generation);
  c.set_seconds(absl::ToDoubleSeconds(absl::Now() - start));
  c.set_imbalance(job.imbalance);
  c.set_checkpoint(checkpoint);
  return c;
}

// The positions of `job` that have not answered their Assign; with `only`, those of its workers
// only (e.g. the joining ones).
std::vector<int> SilentRanks(const Job& job, const std::vector<std::string>* only = nullptr)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(job.mu) {
  std::vector<int> silent;
  for (int p = 0; p < static_cast<int>(job.op.assigned.size()); ++p) {
    if (job.op.assigned[p]) continue;
    if (only != nullptr && std::find(only->begin(), only->end(), job.workers[p]) == only->end()) {
      continue;
    }
    silent.push_back(p);
  }
  return silent;
}

// Moves the Train stream's claim of `job` to its current generation if it held `from` (a
// stream that claimed another generation, or none, is left alone).
void MoveClaim(Job& job, int64_t from) ABSL_EXCLUSIVE_LOCKS_REQUIRED(job.mu) {
  if (job.train_owner != nullptr && job.train_generation == from) {
    job.train_generation = job.generation;
  }
}

}  // namespace

std::optional<v1::ShapeChange> CoordinatorCore::MaybeGrow(const std::string& id) {
  const absl::Time start = absl::Now();
  Job* job = nullptr;
  std::shared_ptr<const model::Model> net;
  model::CheckpointManifest manifest;
  std::string directory;
  int64_t generation = 0;  // before the growth.
  {
    absl::MutexLock lock(&mu_);
    auto it = jobs_.find(id);
    if (shutting_down_ || it == jobs_.end()) return std::nullopt;
    job = it->second.get();  // lives while its thread runs tasks (this is one).
    job->mu.AssertHeld();
    if (!GrowthLayout(*job).has_value()) return std::nullopt;
    // The checkpoint must hold the last step on every rank; a failure here is the step's to
    // report (the job recovers or fails as it would without the growth).
    if (!ConfirmCommit(*job).ok()) return std::nullopt;
    manifest = CheckpointManifestOf(*job);
    net = job->model;
    generation = job->generation;
    directory = io::JoinPath(options_.growth_dir, job->id);
  }
  // The checkpoint for the growth, where a recovery restarts from afterwards (file I/O and the
  // workers' uploads, without the lock).
  absl::Status written = io::EnsureDirectory(options_.growth_dir);
  if (written.ok()) written = RecordedCheckpoint(*job, directory, 1, *net, &manifest);
  const absl::StatusOr<std::string> secret = net::NewSecret();
  const absl::StatusOr<std::string> fallback_secret = net::NewSecret();
  std::optional<v1::ShapeChange> change;
  {
    absl::MutexLock lock(&mu_);
    job->mu.AssertHeld();
    if (!Live(*job)) return std::nullopt;  // recovering or ended: those paths take over.
    if (!written.ok()) {
      return GrowthFailed(*job, start, "",
                          absl::StrCat("the checkpoint for it failed: ", written.ToString()));
    }
    job->restore_dir = directory;
    job->restore = manifest;
    v1::JobEvent event;
    event.mutable_checkpoint()->set_step(manifest.step);
    event.mutable_checkpoint()->set_directory(directory);
    RecordEvent(*job, std::move(event));
    if (!secret.ok() || !fallback_secret.ok()) {
      change =
          GrowthFailed(*job, start, directory,
                       absl::StrCat("cannot make the data links' secret: ",
                                    (secret.ok() ? fallback_secret : secret).status().message()));
    } else if (std::optional<Layout> grown = GrowthLayout(*job); !grown.has_value()) {
      change = GrowthFailed(*job, start, directory, "the idle workers it was to take are gone");
    } else {
      change = GrowInto(*job, *std::move(grown), *secret, *fallback_secret, start, directory);
    }
  }
  // A new generation (grown, or back at the old shape after a failed assignment): every rank
  // dials its neighbours again. The restore state is the growth's checkpoint either way.
  if (change.has_value() && change->generation() != generation) OpenLinksEarly(job);
  JournalJob(id);
  return change;
}

std::optional<CoordinatorCore::Layout> CoordinatorCore::GrowthLayout(Job& job) {
  const JobShape now = ShapeOf(job.spec);
  if (options_.growth_dir.empty() ||
      (job.spec.max_stages() <= now.stages && job.spec.max_replicas() <= now.replicas) ||
      job.state != JobState::kReady || !CheckClaimCurrent(job).ok() ||
      !job.op.UnansweredRanks().empty()) {
    return std::nullopt;
  }
  // New ranks must run the job's instruction-set level, as a recovery's replacements must.
  std::vector<std::string> idle;
  for (const WorkerRecord* w : workers_.Idle(math::IsaFromName(job.spec.isa()))) {
    idle.push_back(w->info.name());
  }
  if (idle.empty() || idle == job.growth_refused) return std::nullopt;
  const std::optional<JobShape> next = NextShape(job.spec, static_cast<int>(idle.size()));
  if (!next.has_value()) return std::nullopt;
  std::vector<std::string> names = job.workers;
  for (size_t i = 0; static_cast<int>(names.size()) < next->positions(); ++i) {
    names.push_back(idle[i]);
  }
  // More replicas keep the stages; more stages may settle for fewer, down to one more.
  const int fewest = next->replicas > now.replicas ? next->stages : now.stages + 1;
  absl::StatusOr<Layout> layout = PlanLayout(job, names, fewest, next->stages, next->replicas);
  if (!layout.ok()) {
    job.growth_refused = idle;
    Log(absl::StrCat("job ", job.id, ": does not grow beyond ", now.ToString(), " onto idle ",
                     absl::StrJoin(idle, ", "), ": ", layout.status().ToString()),
        logging::LogLevel::kWarning);
    return std::nullopt;
  }
  return *std::move(layout);
}

std::optional<v1::ShapeChange> CoordinatorCore::GrowInto(Job& job, Layout grown,
                                                         const std::string& secret,
                                                         const std::string& fallback_secret,
                                                         absl::Time start,
                                                         const std::string& checkpoint) {
  const JobShape before = ShapeOf(job.spec);
  const int64_t claimed = job.generation;  // the Train stream's claim, if any, is current.
  Layout old{job.spec, job.plan, job.chunks, job.imbalance, job.workers};
  // The workers new to the job (ArrangePositions may have placed them anywhere).
  job.joining.clear();
  for (const std::string& name : grown.workers) {
    if (std::find(old.workers.begin(), old.workers.end(), name) == old.workers.end()) {
      job.joining.push_back(name);
    }
  }
  const std::vector<std::string> joined = job.joining;
  job.state = JobState::kAssigning;
  const std::vector<std::string> names = grown.workers;
  const JobShape after = ShapeOf(grown.spec);
  ApplyLayout(job, std::move(grown));
  StartGeneration(job, names);
  // The Train stream's claim moves with the generation at once (nothing committed is lost, so it
  // replays nothing): a batch that arrives while the ranks are assigned (the lock is released
  // meanwhile) is the job's next step, not a stale one (CheckClaimCurrent).
  MoveClaim(job, claimed);
  const absl::Status assigned = AssignRanks(job, secret);
  if (absl::IsDeadlineExceeded(assigned)) {
    // Joining workers that never answered hang: evicted (while still joining: the growth fails,
    // not the job), they are not chosen again.
    EvictRanks(job, SilentRanks(job, &joined),
               absl::StrCat("no Assigned for generation ", job.generation, " within ",
                            absl::FormatDuration(options_.assign_timeout)));
  }
  job.joining.clear();
  if (shutting_down_ || IsTerminal(job.state) || job.state == JobState::kRecovering) {
    return std::nullopt;
  }
  if (assigned.ok() && !job.recovery_restart) return Grown(job, before, start, checkpoint, joined);
  // Back to the layout before the growth, restored from the growth's checkpoint (the joining
  // workers are released).
  const std::vector<std::string> old_names = old.workers;
  const int64_t grown_generation = job.generation;
  ApplyLayout(job, std::move(old));
  StartGeneration(job, old_names, "the job's growth failed; it keeps its shape");
  MoveClaim(job, grown_generation);
  const absl::Status back = AssignRanks(job, fallback_secret);
  if (!back.ok() || job.recovery_restart) {
    if (job.spec.recover() && absl::IsDeadlineExceeded(back)) {
      // An old rank that does not answer is stuck: a recoverable job recovers without it.
      EvictRanks(job, SilentRanks(job),
                 absl::StrCat("no Assigned for generation ", job.generation, " within ",
                              absl::FormatDuration(options_.assign_timeout)));
    }
    if (job.state != JobState::kRecovering) AssignFailed(job, back).IgnoreError();
    return std::nullopt;
  }
  job.state = JobState::kReady;
  return GrowthFailed(
      job, start, checkpoint,
      absl::StrCat("assigning ", after.ToString(), " failed: ", assigned.ToString()));
}

v1::ShapeChange CoordinatorCore::Grown(Job& job, const JobShape& before, absl::Time start,
                                       const std::string& checkpoint,
                                       const std::vector<std::string>& joined) {
  job.state = JobState::kReady;
  job.growth_refused.clear();
  v1::ShapeChange change = ShapeChangeOf(job, before, start, checkpoint);
  for (const std::string& name : joined) change.add_joined(name);
  job.shape_changes.push_back(change);
  Log(absl::StrCat("job ", job.id, ": grew from ", before.ToString(), " to ",
                   ShapeOf(job.spec).ToString(), " after step ", job.steps_done, " (",
                   absl::StrJoin(joined, ", "), " joined) in ", change.seconds(), " s; generation ",
                   job.generation, " on ", absl::StrJoin(job.workers, ", ")));
  v1::JobEvent event;
  *event.mutable_shape_changed() = change;
  RecordEvent(job, std::move(event));
  job.pace.Restart();  // a new layout: its pace is measured afresh, as after a recovery.
  return change;
}

v1::ShapeChange CoordinatorCore::GrowthFailed(Job& job, absl::Time start,
                                              const std::string& checkpoint,
                                              const std::string& why) {
  const JobShape shape = ShapeOf(job.spec);
  v1::ShapeChange change = ShapeChangeOf(job, shape, start, checkpoint);
  change.set_failed(why);
  job.shape_changes.push_back(change);
  job.growth_refused.clear();
  for (const WorkerRecord* w : workers_.Idle(math::IsaFromName(job.spec.isa()))) {
    job.growth_refused.push_back(w->info.name());
  }
  Log(absl::StrCat("job ", job.id, ": did not grow after step ", job.steps_done, " (", why,
                   "); it stays at ", shape.ToString(), " and trains on"),
      logging::LogLevel::kWarning);
  v1::JobEvent event;
  *event.mutable_shape_changed() = change;
  RecordEvent(job, std::move(event));
  return change;
}

}  // namespace pipetrain::coordinator
