// A job's creation (admission thread: validation, workers, partition) and its assignment (the
// job's thread: Assign to every rank, then every Assigned).
#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/model/checkpoint.h"
#include "common/model/optimizer_proto.h"
#include "common/net/secret.h"
#include "common/util/annotate.h"
#include "common/util/status_macros.h"
#include "pipetrain/v1/worker_control.pb.h"
#include "server/control/control_proto.h"
#include "server/coordinator/coordinator_core.h"
#include "server/coordinator/job_isa.h"
#include "server/coordinator/job_shape.h"
#include "server/metrics/coordinator_metrics.h"

namespace pipetrain::coordinator {

void CoordinatorCore::CreateJob(const v1::JobSpec& spec, const std::string& caller,
                                std::function<void(absl::StatusOr<v1::JobStatus>)> done) {
  admission_->Post([this, spec, caller, done = std::move(done)] { AdmitJob(spec, caller, done); });
}

absl::StatusOr<std::optional<model::CheckpointManifest>> CoordinatorCore::VerifyResume(
    v1::JobSpec& spec, const model::Model& net) const {
  if (spec.resume_from().empty()) return std::nullopt;
  // Verified (every file's checksum) before any worker is taken.
  PT_ASSIGN_OR_RETURN(const std::string confined,
                      CheckpointPath(spec.resume_from(), "resume_from"));
  spec.set_resume_from(confined);
  PT_ASSIGN_OR_RETURN(model::CheckpointManifest manifest, model::VerifyCheckpoint(confined));
  if (manifest.model_spec.SerializeAsString() != net.spec().SerializeAsString()) {
    return absl::FailedPreconditionError(
        absl::StrCat("resume_from ", confined, ": the checkpoint is of another model spec"));
  }
  if (manifest.seed != spec.seed()) {
    return absl::FailedPreconditionError(
        absl::StrCat("resume_from ", confined, ": the checkpoint was trained with seed ",
                     manifest.seed, ", the job has seed ", spec.seed()));
  }
  PT_RETURN_IF_ERROR(job::CheckResumeTokenizer(confined, manifest, spec.tokenizer()));
  // The optimizer kind decides which state tensors the checkpoint holds per parameter.
  PT_ASSIGN_OR_RETURN(const math::OptimizerConfig optimizer,
                      model::OptimizerFromProto(spec.optimizer()));
  PT_RETURN_IF_ERROR(model::CheckOptimizerResumes(confined, manifest, optimizer));
  return std::optional<model::CheckpointManifest>(std::move(manifest));
}

absl::Status CoordinatorCore::VerifySaveTo(v1::JobSpec& spec, const std::string& owner) const {
  if (spec.save_to().empty()) return absl::OkStatus();  // keep_checkpoints: job::CheckJobSpec.
  PT_ASSIGN_OR_RETURN(const std::string confined,
                      SaveTarget(spec.save_to(), spec.keep_checkpoints(), "save_to"));
  {
    // Another job's directory is refused before this request touches the file system there
    // (AdmitJob checks again as it takes the workers).
    absl::MutexLock lock(&mu_);
    PT_RETURN_IF_ERROR(CheckSoleWriter(nullptr, confined, "save_to", owner));
  }
  // The save at the end must not be where the run is lost: what would refuse it is refused now.
  PT_RETURN_IF_ERROR(util::Annotate(model::CheckCheckpointDestination(confined), "save_to"));
  spec.set_save_to(confined);
  return absl::OkStatus();
}

void CoordinatorCore::AdmitJob(const v1::JobSpec& request, const std::string& owner,
                               const std::function<void(absl::StatusOr<v1::JobStatus>)>& done) {
  v1::JobSpec spec = request;
  absl::StatusOr<job::CheckedJobSpec> checked = job::CheckJobSpec(options_.job_limits, &spec);
  if (!checked.ok()) return done(checked.status());
  absl::StatusOr<std::optional<model::CheckpointManifest>> resume =
      VerifyResume(spec, *checked->model);
  if (!resume.ok()) return done(resume.status());
  if (absl::Status save = VerifySaveTo(spec, owner); !save.ok()) return done(save);
  Job* job = nullptr;
  std::vector<double> speeds;
  {
    absl::MutexLock lock(&mu_);
    if (absl::Status sole = spec.save_to().empty()
                                ? absl::OkStatus()
                                : CheckSoleWriter(nullptr, spec.save_to(), "save_to", owner);
        !sole.ok()) {
      return done(sole);
    }
    absl::StatusOr<Job*> taken = TakeWorkersForJob(spec, *checked, *std::move(resume));
    if (!taken.ok()) return done(taken.status());
    job = *taken;
    job->mu.AssertHeld();
    job->owner = owner;
    for (const std::string& name : job->workers) {
      speeds.push_back(workers_.Find(name)->info.gflops());
    }
    // One partition for every replica (they hold the same chunks), at each rank's slowest.
    speeds = RankSpeeds(speeds, ShapeOf(job->spec));
  }
  // Partition without the lock: pure compute on this thread's own data.
  absl::StatusOr<std::pair<std::vector<v1::ChunkSpec>, double>> cut =
      job::PartitionChunks(spec, *checked->model, checked->plan, speeds);
  absl::MutexLock lock(&mu_);
  job->mu.AssertHeld();  // the job lives until its thread was joined, after it ended.
  if (!cut.ok() && !IsTerminal(job->state)) FailJob(*job, cut.status().ToString());
  if (IsTerminal(job->state)) return done(cut.ok() ? EndedError(*job) : cut.status());
  job->chunks = std::move(cut->first);
  job->imbalance = cut->second;
  const std::string id = job->id;
  if (!job->ops->Post([this, job, id, done] {
        absl::StatusOr<v1::JobStatus> ready = Assign(job);
        if (ready.ok()) {
          JournalJob(id);
          OpenLinksEarly(job);  // before CreateJob answers: the first step does not dial.
        }
        done(std::move(ready));
      })) {
    done(EndedError(*job));
  }
}

absl::StatusOr<Job*> CoordinatorCore::TakeWorkersForJob(
    v1::JobSpec& spec, const job::CheckedJobSpec& checked,
    std::optional<model::CheckpointManifest> resume) {
  if (shutting_down_) return absl::CancelledError("coordinator shutting down");
  const JobShape shape = ShapeOf(spec);
  const int P = shape.positions();
  // A job forced to one instruction-set level takes only workers that run it.
  const std::optional<math::Isa> forced = math::IsaFromName(spec.isa());
  std::vector<WorkerRecord*> idle = workers_.Idle(forced);
  const int live = static_cast<int>(idle.size());
  if (live < P) {
    const int busy = workers_.Busy();
    return absl::FailedPreconditionError(absl::StrCat(
        "job needs ", P, " workers", shape.replicas > 1 ? " (" + shape.ToString() + ")" : "",
        forced.has_value() ? " that run isa " + spec.isa() : "", ", ", live, " idle: ", P - live,
        " missing", busy > 0 ? absl::StrCat(" (", busy, " more are busy with other jobs)") : ""));
  }
  // The first P idle workers, placed so that each rank's slowest replica is as fast as can be.
  std::vector<double> speeds;
  for (int i = 0; i < P; ++i) speeds.push_back(idle[i]->info.gflops());
  const std::vector<int> arranged = ArrangePositions(speeds, shape);
  // The one level every worker (and the client's reference) runs.
  std::vector<const v1::RegisterWorker*> infos;
  for (int p = 0; p < P; ++p) infos.push_back(&idle[arranged[p]]->info);
  PT_ASSIGN_OR_RETURN(const math::Isa isa, ChooseJobIsa(spec, infos));
  spec.set_isa(std::string(math::IsaName(isa)));
  if (resume.has_value() && resume->isa != spec.isa()) {
    Log(absl::StrCat("job resumes from ", spec.resume_from(), " written at instruction set ",
                     resume->isa.empty() ? "(unrecorded)" : resume->isa, " and runs at ",
                     spec.isa(), ": its bits will differ from a run that stayed on one level"));
  }
  auto owned =
      std::make_unique<Job>(mu_, absl::StrCat(id_prefix_, next_job_++), options_.job_events);
  Job& job = *owned;
  job.mu.AssertHeld();
  for (int p = 0; p < P; ++p) {
    job.workers.push_back(idle[arranged[p]]->info.name());
    workers_.Take(job.workers.back(), job.id, p);
  }
  job.spec = spec;
  job.model = checked.model;
  job.plan = checked.plan;
  job.op.Reset(P);
  if (resume.has_value()) {
    job.resume_dir = spec.resume_from();
    job.steps_done = resume->step;
    job.restore_dir = job.resume_dir;
    job.restore = resume;
    job.resume = std::move(resume);
  }
  job.created = absl::Now();
  job.ops = std::make_unique<OpThread>();
  if (journal_ != nullptr) journal_->Track(job.id);
  jobs_[job.id] = std::move(owned);
  return &job;
}

v1::WorkerCommand CoordinatorCore::AssignCommand(const Job& job, int position,
                                                 const std::vector<std::string>& addresses) const {
  const JobShape shape = ShapeOf(job.spec);
  const int rank = shape.RankOf(position);
  const int replica = shape.ReplicaOf(position);
  v1::WorkerCommand command;
  v1::Assign* a = command.mutable_assign();
  a->set_job(job.id);
  a->set_generation(job.generation);
  a->set_rank(rank);
  *a->mutable_model() = job.model->spec();
  *a->mutable_optimizer() = job.spec.optimizer();
  a->set_seed(job.spec.seed());
  a->set_threads(job.spec.threads());
  a->set_stages(shape.stages);
  a->set_virtual_stages(job.spec.virtual_stages());
  // The replica's share of the step: the plan is for these M / R micro-batches.
  a->set_microbatches(job::MicrobatchesPerReplica(job.spec));
  a->set_replica(replica);
  a->set_replicas(shape.replicas);
  for (const v1::ChunkSpec& c : job.chunks) *a->add_chunks() = c;
  for (int r = 0; r < shape.stages; ++r) {
    a->add_worker_addresses(addresses[shape.Position(replica, r)]);
  }
  for (int q = 0; q < shape.replicas; ++q) {
    a->add_replica_addresses(addresses[shape.Position(q, rank)]);
  }
  for (const schedule::Action& action : job.plan.actions[rank]) {
    *a->add_actions() = control::ActionToProto(action);
  }
  if (job.restore.has_value()) {
    a->set_restore(true);
    a->set_restore_step(job.restore->step);
  }
  a->set_link_secret(job.link_secret);
  a->set_isa(job.spec.isa());
  return command;
}

absl::StatusOr<v1::JobStatus> CoordinatorCore::Assign(Job* job, int stages_before) {
  // A new secret for every generation: streams of an earlier generation's peers no longer get in.
  absl::StatusOr<std::string> secret = net::NewSecret();
  absl::MutexLock lock(&mu_);
  job->mu.AssertHeld();
  if (shutting_down_) return absl::CancelledError("coordinator shutting down");
  if (IsTerminal(job->state)) return EndedError(*job);
  if (!secret.ok()) {
    FailJob(*job, absl::StrCat("cannot make the data links' secret: ", secret.status().message()));
    return secret.status();
  }
  const absl::Status waited = AssignRanks(*job, *secret);
  if (!waited.ok() || job->recovery_restart) return AssignFailed(*job, waited);
  if (job->state == JobState::kRecovering) RecordRecovery(*job, stages_before);
  job->state = JobState::kReady;
  RestartLease(*job);  // the lease runs from here (and again after every recovery).
  Log(absl::StrCat("job ", job->id, " ready in generation ", job->generation, ": ",
                   ShapeOf(job->spec).ToString(), " (", job->spec.schedule(), ") on ",
                   absl::StrJoin(job->workers, ", "), " at instruction set ", job->spec.isa()));
  if (options_.metrics != nullptr) options_.metrics->RecordIsa(job->id, job->spec.isa());
  return StatusOf(*job);
}

absl::Status CoordinatorCore::AssignRanks(Job& job, const std::string& secret) {
  job.link_secret = secret;
  const std::vector<std::string> addresses = RankAddresses(job);
  for (int p = 0; p < static_cast<int>(job.workers.size()); ++p) {
    SendToRank(job, p, AssignCommand(job, p, addresses));
  }
  job.op.error = absl::OkStatus();
  Job* raw = &job;
  return AwaitOp(
      job,
      [raw]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(raw->mu) {
        return raw->op.AllAssigned() || raw->recovery_restart;
      },
      options_.assign_timeout, "every worker's Assigned");
}

absl::Status CoordinatorCore::AssignFailed(Job& job, absl::Status waited) {
  if (job.state == JobState::kRecovering && job.recovery_restart) {
    // A worker of this layout was lost meanwhile: Recover is queued again and starts over.
    return absl::AbortedError(absl::StrCat("job '", job.id,
                                           "': a worker was lost while generation ", job.generation,
                                           " was assigned; the recovery restarts"));
  }
  if (job.state == JobState::kRecovering && job.spec.recover() &&
      absl::IsDeadlineExceeded(waited)) {
    // Ranks that never answered (a replacement that hangs) are evicted like a rank that misses a
    // step's deadline; the recovery starts over with the idle workers left.
    std::vector<int> silent;
    for (int p = 0; p < static_cast<int>(job.workers.size()); ++p) {
      if (!job.op.assigned[p]) silent.push_back(p);
    }
    EvictRanks(job, silent,
               absl::StrCat("no Assigned for generation ", job.generation, " within ",
                            absl::FormatDuration(options_.assign_timeout)));
    if (job.recovery_restart) return waited;
  }
  if (!IsTerminal(job.state)) FailJob(job, waited.ToString());
  return waited;
}

}  // namespace pipetrain::coordinator
