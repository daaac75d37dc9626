// Checkpoints: where a job may save (under the root, one writer per directory), a job's checkpoint
// (every rank uploads its shards into a staging directory that is published once complete) and
// the checks of the transfers (PutState, FetchState).
#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/io/confined_path.h"
#include "common/io/file_util.h"
#include "common/math/optimizer.h"
#include "common/model/optimizer_proto.h"
#include "common/net/principal.h"
#include "common/util/annotate.h"
#include "common/util/status_macros.h"
#include "pipetrain/v1/worker_control.pb.h"
#include "server/coordinator/coordinator_core.h"
#include "server/coordinator/save_target.h"

namespace pipetrain::coordinator {
namespace {

// What the coordinator knows of a checkpoint of `job` at `step`, with the client's data position
// if one was given for that step (else the data set, batch size and data cursor stay unknown).
model::CheckpointManifest ManifestOf(const Job& job, int64_t step)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(job.mu) {
  model::CheckpointManifest manifest;
  manifest.step = step;
  manifest.model_spec = job.model->spec();
  manifest.seed = job.spec.seed();
  manifest.microbatches = job.spec.microbatches();
  manifest.isa = job.spec.isa();
  // Which steps ran at another level, if any did.
  if (job.resume.has_value())
    manifest.isa_note = model::IsaNoteAfterResume(*job.resume, job.spec.isa());
  absl::StatusOr<math::OptimizerConfig> optimizer = model::OptimizerFromProto(job.spec.optimizer());
  if (optimizer.ok()) manifest.optimizer = math::FormatOptimizerConfig(*optimizer);
  if (job.data_position.has_value() && job.data_position_step == step) {
    ApplyDataPosition(*job.data_position, &manifest);
  }
  return manifest;
}

// The answer to a Checkpoint that published `manifest` as `directory`.
v1::CheckpointResponse ResponseOf(const model::CheckpointManifest& manifest,
                                  const std::string& directory) {
  v1::CheckpointResponse response;
  response.set_step(manifest.step);
  response.set_directory(directory);
  if (manifest.batch_size > 0) {  // a client's data position was written.
    v1::DataPosition* p = response.mutable_data_position();
    p->set_data(manifest.data);
    p->set_batch_size(manifest.batch_size);
    p->set_cursor_epoch(manifest.data_cursor.epoch);
    p->set_cursor_batch(manifest.data_cursor.batch);
  }
  return response;
}

// OK if `keep` checkpoints of `directory` (named by `what`) can be kept: earlier ones go beside
// it, so with keep > 1 its parent must be under the root (`under_root`) too.
absl::Status CheckKeep(int keep, const std::string& directory, absl::string_view what,
                       const std::function<bool(const std::string&)>& under_root) {
  if (keep < 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": keep must be >= 0, got ", keep));
  }
  if (keep > 1 && !under_root(io::DirName(directory))) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": keeping ", keep, " checkpoints of ", directory,
                     " needs its parent under the checkpoint root (earlier ones are kept beside "
                     "it); name a subdirectory"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> CoordinatorCore::CheckpointPath(const std::string& path,
                                                            absl::string_view what) const {
  if (options_.checkpoint_root.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, " '", path,
                     "': this coordinator keeps no checkpoints; start it with --checkpoint-root "
                     "DIR (checkpoint and resume directories must lie under it)"));
  }
  absl::StatusOr<std::string> confined = io::ConfinePath(options_.checkpoint_root, path);
  if (!confined.ok()) return util::Annotate(confined.status(), std::string(what));
  return confined;
}

absl::StatusOr<std::string> CoordinatorCore::SaveTarget(const std::string& path, int keep,
                                                        absl::string_view what) const {
  PT_ASSIGN_OR_RETURN(const std::string directory, CheckpointPath(path, what));
  PT_RETURN_IF_ERROR(CheckKeep(keep, directory, what, [this](const std::string& parent) {
    return CheckpointPath(parent, "").ok();
  }));
  return directory;
}

absl::Status CoordinatorCore::CheckSoleWriter(const Job* self, const std::string& path,
                                              absl::string_view what,
                                              const std::string& caller) const {
  for (const auto& [id, other] : jobs_) {
    other->mu.AssertHeld();
    if (other.get() == self || IsTerminal(other->state)) continue;
    const std::string* const held_dirs[] = {&other->spec.save_to(), &other->checkpoint_dir};
    for (const std::string* held : held_dirs) {
      const std::string how = held->empty() ? "" : CheckpointOverlap(path, *held);
      if (how.empty()) continue;
      const std::string who = net::MaySee(caller, other->owner)
                                  ? absl::StrCat("job ", other->id)
                                  : std::string("another client's job");
      return absl::FailedPreconditionError(absl::StrCat(
          what, " '", path, "' ",
          how == "is" ? "is written by " : absl::StrCat(how, " '", *held, "', written by "), who,
          held == &other->checkpoint_dir ? " (its last checkpoint)" : " (its save_to)",
          " until it ends; one job writes a checkpoint directory at a time: name another "
          "directory, or end that job first"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<Job*> CoordinatorCore::StartCheckpoint(const v1::CheckpointRequest& request,
                                                      const std::string& directory,
                                                      std::shared_ptr<const model::Model>* net,
                                                      model::CheckpointManifest* manifest) {
  absl::MutexLock lock(&mu_);
  if (shutting_down_) return absl::CancelledError("coordinator shutting down");
  PT_ASSIGN_OR_RETURN(Job * j, ReadyJob(request.job()));
  j->mu.AssertHeld();
  // After a recovery its client has not heard of, the job's step may not be the client's.
  PT_RETURN_IF_ERROR(CheckClaimCurrent(*j));
  if (request.has_data_position()) {
    j->data_position = request.data_position();
    j->data_position_step = j->steps_done;
  }
  PT_RETURN_IF_ERROR(CheckSoleWriter(j, directory, "Checkpoint directory", j->owner));
  j->checkpoint_dir = directory;
  // The shards must hold the last step everywhere (SaveShards follows its Commit on every rank's
  // stream; a rank that refused it would save the step before).
  PT_RETURN_IF_ERROR(ConfirmCommit(*j));
  *manifest = ManifestOf(*j, j->steps_done);
  *net = j->model;
  j->checkpointing = true;  // the client's call: its lease stops until the call is over.
  RestartLease(*j);
  return j;
}

absl::StatusOr<v1::CheckpointResponse> CoordinatorCore::Checkpoint(
    const v1::CheckpointRequest& request) {
  if (request.directory().empty()) return absl::InvalidArgumentError("Checkpoint: empty directory");
  if (request.has_data_position()) PT_RETURN_IF_ERROR(CheckDataPosition(request.data_position()));
  PT_ASSIGN_OR_RETURN(const std::string directory,
                      SaveTarget(request.directory(), request.keep(), "Checkpoint directory"));
  std::shared_ptr<const model::Model> net;
  model::CheckpointManifest manifest;
  PT_ASSIGN_OR_RETURN(Job * job, StartCheckpoint(request, directory, &net, &manifest));
  const absl::Status written =
      RecordedCheckpoint(*job, directory, std::max(1, request.keep()), *net, &manifest);
  {
    absl::MutexLock lock(&mu_);
    job->mu.AssertHeld();
    job->checkpointing = false;
    RestartLease(*job);
    if (!written.ok()) return written;
    job->restore_dir = directory;  // the newest state a recovery restarts from.
    job->restore = manifest;
    if (!IsTerminal(job->state)) {  // `ended` stays the last event.
      v1::JobEvent event;
      event.mutable_checkpoint()->set_step(manifest.step);
      event.mutable_checkpoint()->set_directory(directory);
      RecordEvent(*job, std::move(event));
    }
  }
  JournalJob(request.job());
  return ResponseOf(manifest, directory);
}

absl::Status CoordinatorCore::RecordedCheckpoint(Job& job, const std::string& directory, int keep,
                                                 const model::Model& net,
                                                 model::CheckpointManifest* manifest) {
  StagingLedger* ledger = nullptr;
  {
    absl::MutexLock lock(&mu_);
    ledger = staging_.get();  // lives as long as the core once set.
  }
  // Recorded before the staging directory exists: if this coordinator dies before the record is
  // dropped, the next one on the state directory removes what it staged (staging_ledger.h).
  if (ledger != nullptr) {
    if (const absl::Status s = ledger->Begin(job.id, directory); !s.ok()) {
      Log(absl::StrCat("job ", job.id,
                       ": cannot record its checkpoint's staging directory (a "
                       "crash now would leave it behind): ",
                       s.ToString()),
          logging::LogLevel::kWarning);
    }
  }
  const absl::Status written = StageCheckpoint(job, directory, keep, net, manifest);
  // Published or discarded: the staging directory is gone either way.
  if (ledger != nullptr) {
    if (const absl::Status s = ledger->End(job.id); !s.ok()) {
      Log(absl::StrCat("job ", job.id, ": ", s.ToString()), logging::LogLevel::kWarning);
    }
  }
  return written;
}

absl::Status CoordinatorCore::StageCheckpoint(Job& job, const std::string& directory, int keep,
                                              const model::Model& net,
                                              model::CheckpointManifest* manifest) {
  // The workers write into a staging directory, published as `directory` when complete (file
  // I/O outside the lock; only this job's thread runs operations on the job).
  PT_ASSIGN_OR_RETURN(const std::string staging, model::BeginCheckpointStaging(directory));
  absl::Status collected;
  std::string tokenizer;  // the job's, written beside the layer files.
  {
    absl::MutexLock lock(&mu_);
    job.mu.AssertHeld();
    collected = CollectShards(job, manifest->step, staging);
    tokenizer = job.spec.tokenizer();
  }
  if (!collected.ok()) {
    model::DiscardCheckpointStaging(staging).IgnoreError();
    return collected;
  }
  // Every worker uploaded its files and answered ShardsSaved: digest what is there (a missing
  // file is NOT_FOUND), then publish after verifying the whole checkpoint.
  absl::StatusOr<std::vector<model::CheckpointShard>> shards =
      model::DigestCheckpointShards(staging, model::LayerShards(net, 0, net.num_layers()));
  if (!shards.ok()) {
    model::DiscardCheckpointStaging(staging).IgnoreError();
    return shards.status();
  }
  manifest->shards = *std::move(shards);
  manifest->tokenizer.reset();
  if (!tokenizer.empty()) {
    absl::StatusOr<model::CheckpointFile> written =
        model::WriteCheckpointTokenizer(staging, tokenizer);
    if (!written.ok()) {
      model::DiscardCheckpointStaging(staging).IgnoreError();
      return written.status();
    }
    manifest->tokenizer = *std::move(written);
  }
  return model::PublishCheckpoint(staging, directory, *manifest, keep);
}

absl::Status CoordinatorCore::CollectShards(Job& job, int64_t step, const std::string& staging) {
  job.op.step = step;
  job.op.error = absl::OkStatus();
  // Replica 0 writes the checkpoint (every replica holds the same bits): the others have nothing
  // to save.
  const JobShape shape = ShapeOf(job.spec);
  job.op.saved.assign(job.workers.size(), true);
  for (int rank = 0; rank < shape.stages; ++rank) job.op.saved[rank] = false;
  v1::WorkerCommand command;
  v1::SaveShards* save = command.mutable_save_shards();
  save->set_job(job.id);
  save->set_generation(job.generation);
  save->set_step(step);
  job.checkpoint_staging = staging;
  for (int rank = 0; rank < shape.stages; ++rank) SendToRank(job, rank, command);
  // A rank that has not saved within this bound is stuck or stopped: writing and uploading its
  // weights and optimizer state (at most three tensors per parameter) at 10 MB/s takes less. The
  // floor is the step deadline's.
  const absl::Duration save_deadline = std::min(
      options_.step_timeout,
      std::max(options_.step_deadline_floor,
               absl::Seconds(static_cast<double>(job.model->NumParameters()) * 12.0 / 10e6)));
  Job* raw = &job;
  absl::Status waited = AwaitOp(
      job, [raw]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(raw->mu) { return raw->op.AllSaved(); },
      save_deadline, "every worker's ShardsSaved");
  if (absl::IsDeadlineExceeded(waited)) {
    std::vector<int> late;
    for (int p = 0; p < static_cast<int>(job.workers.size()); ++p) {
      if (!job.op.saved[p]) late.push_back(p);
    }
    waited = absl::DeadlineExceededError(
        absl::StrCat(waited.message(), " from ", RankLabels(job, late), " (stopped or stuck)"));
    Log(std::string(waited.message()), logging::LogLevel::kWarning);
    if (job.spec.recover() && Live(job)) {
      // As for a step: a recoverable job evicts the ranks that are stuck and recovers without
      // them; the client then replays from the last checkpoint and checkpoints again.
      EvictRanks(job, late,
                 absl::StrCat("did not save the checkpoint of step ", step, " of job ", job.id,
                              " within ", absl::FormatDuration(save_deadline)));
    }
  }
  if (job.state == JobState::kRecovering && !waited.ok()) waited = CheckReady(job);
  job.op.step = -1;
  job.checkpoint_staging.clear();  // no more uploads are accepted into it.
  return waited;
}

model::CheckpointManifest CoordinatorCore::CheckpointManifestOf(const Job& job) const {
  return ManifestOf(job, job.steps_done);
}

absl::StatusOr<Job*> CoordinatorCore::LiveJobAt(const std::string& id, int64_t generation) {
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("unknown job '", id, "'"));
  Job& job = *it->second;
  job.mu.AssertHeld();
  if (IsTerminal(job.state)) return EndedError(job);
  if (generation != job.generation) {
    return absl::AbortedError(
        absl::StrCat("job '", job.id, "' is at generation ", job.generation, ", not ", generation));
  }
  return &job;
}

absl::StatusOr<int> CoordinatorCore::PositionOf(const Job& job, const std::string& worker) const {
  auto w = std::find(job.workers.begin(), job.workers.end(), worker);
  if (w == job.workers.end() || !workers_.Holds(worker, job.id)) {
    return absl::PermissionDeniedError(
        absl::StrCat("worker '", worker, "' holds no rank of job '", job.id, "'"));
  }
  return static_cast<int>(w - job.workers.begin());
}

absl::StatusOr<UploadTarget> CoordinatorCore::AcceptUpload(const v1::PutStateRequest& first) {
  absl::MutexLock lock(&mu_);
  PT_ASSIGN_OR_RETURN(Job * job, LiveJobAt(first.job(), first.generation()));
  job->mu.AssertHeld();
  PT_ASSIGN_OR_RETURN(const int position, PositionOf(*job, first.worker()));
  const JobShape shape = ShapeOf(job->spec);
  if (shape.ReplicaOf(position) != 0) {
    return absl::PermissionDeniedError(absl::StrCat("worker '", first.worker(), "' runs replica ",
                                                    shape.ReplicaOf(position), " of job '", job->id,
                                                    "': only replica 0 writes checkpoints"));
  }
  const int rank = shape.RankOf(position);
  if (job->checkpoint_staging.empty() || first.step() != job->op.step) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job '", job->id, "' has no checkpoint of step ", first.step(), " in progress"));
  }
  UploadTarget target;
  target.staging = job->checkpoint_staging;
  for (const v1::ChunkSpec& c : job->chunks) {
    // Under dualpipe the chunks past micro-batch 0's route are the up copy of the stages: each
    // layer is saved once, by its down copy.
    if (c.rank() != rank || c.chunk() >= job->plan.RouteEnd(0)) continue;
    for (model::CheckpointShard& s :
         model::LayerShards(*job->model, c.first_layer(), c.last_layer())) {
      target.files.emplace(s.file, s);
    }
  }
  return target;
}

absl::StatusOr<std::vector<StateFile>> CoordinatorCore::StateFilesFor(
    const v1::FetchStateRequest& request) {
  absl::MutexLock lock(&mu_);
  PT_ASSIGN_OR_RETURN(Job * job, LiveJobAt(request.job(), request.generation()));
  job->mu.AssertHeld();
  if (!job->restore.has_value()) {
    return absl::FailedPreconditionError(
        absl::StrCat("job '", job->id, "' restarts from no checkpoint"));
  }
  // Every replica restores: each worker gets the files of its rank's chunks.
  PT_ASSIGN_OR_RETURN(const int position, PositionOf(*job, request.worker()));
  const int rank = ShapeOf(job->spec).RankOf(position);
  // A tied head's copy of the table is stored in the embedding's file (model/tied_embedding.h):
  // the head's rank gets that file too.
  const std::optional<model::TiedEmbedding>& tie = job->model->tie();
  bool holds_head = false;
  for (const v1::ChunkSpec& c : job->chunks) {
    holds_head =
        holds_head || (tie.has_value() && c.rank() == rank && tie->head_layer >= c.first_layer() &&
                       tie->head_layer < c.last_layer());
  }
  std::vector<StateFile> files;
  for (const model::CheckpointShard& shard : job->restore->shards) {
    if (holds_head && shard.first_layer <= tie->embedding_layer &&
        tie->embedding_layer < shard.last_layer) {
      files.push_back(
          StateFile{shard, io::JoinPath(job->restore_dir, shard.file), job->restore_dir});
      continue;
    }
    for (const v1::ChunkSpec& c : job->chunks) {
      if (c.rank() == rank && shard.first_layer >= c.first_layer() &&
          shard.last_layer <= c.last_layer()) {
        files.push_back(
            StateFile{shard, io::JoinPath(job->restore_dir, shard.file), job->restore_dir});
        break;
      }
    }
  }
  return files;
}

}  // namespace pipetrain::coordinator
