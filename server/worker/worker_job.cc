#include "server/worker/worker_job.h"

#include <algorithm>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/model/stage.h"
#include "common/util/status_macros.h"
#include "common/wire/grpc_status.h"
#include "pipetrain/v1/worker_control.pb.h"
#include "server/control/control_proto.h"
#include "server/worker/job_plan.h"
#include "server/worker/proto_convert.h"
#include "server/worker/state_transfer.h"

namespace pipetrain::worker {

using link::PeerLink;

namespace {

// Loads `chunks`' parameters and optimizer state from the coordinator's checkpoint of step
// a.restore_step() (Assign.restore): FetchState's or Stage::ImportState's error, annotated.
absl::Status RestoreChunks(const v1::Assign& a, JobHost* host, std::vector<OwnedChunk>* chunks) {
  StateRequest request;
  request.job = a.job();
  request.generation = a.generation();
  request.worker = host->name();
  request.step = a.restore_step();
  for (const OwnedChunk& c : *chunks) {
    request.layer_ranges.emplace_back(a.chunks(c.chunk).first_layer(),
                                      a.chunks(c.chunk).last_layer());
    // A tied head's copy of the table is stored in the embedding's file
    // (model/tied_embedding.h), which the coordinator sends along.
    if (c.stage.holds_tied(model::TieEnd::kHead) &&
        !c.stage.holds_tied(model::TieEnd::kEmbedding)) {
      request.layer_ranges.emplace_back(0, 1);
    }
  }
  absl::StatusOr<std::map<std::string, math::Tensor>> state =
      FetchState(host->coordinator(), request);
  if (!state.ok()) {
    return wire::Annotate(state.status(),
                          absl::StrCat("Assign(job ", a.job(), ", generation ", a.generation(),
                                       "): restoring step ", a.restore_step()));
  }
  for (OwnedChunk& c : *chunks) {
    if (absl::Status s = c.stage.ImportState(*state); !s.ok()) {
      return wire::Annotate(s,
                            absl::StrCat("Assign(job ", a.job(), "): restoring chunk ", c.chunk));
    }
  }
  host->Log(absl::StrCat("job ", a.job(), ": restored ", state->size(), " tensors of step ",
                         a.restore_step(), " from the coordinator"));
  return absl::OkStatus();
}

}  // namespace

void JobHost::EmitError(const std::string& job, int64_t generation, int64_t step,
                        const absl::Status& status) {
  Log(absl::StrCat("error (job ", job, ", generation ", generation, ", step ", step,
                   "): ", status.ToString()),
      logging::LogLevel::kWarning);
  Emit(control::ErrorEvent(job, generation, step, status));
}

WorkerJob::WorkerJob(const v1::Assign& assign, const WorkerJobOptions& options, JobHost* host)
    : host_(host),
      options_(options),
      assign_(assign),
      pacer_(options.emulate_gflops > 0 ? std::make_unique<ComputePacer>(options.emulate_gflops)
                                        : nullptr),
      mailbox_(MailboxOptions{0, pacer_.get()}) {
  job_ = assign.job();
  generation_ = assign.generation();
  rank_ = assign.rank();
}

void WorkerJob::Stop(absl::string_view why) {
  if (pacer_ != nullptr) pacer_->Cancel();
  {
    absl::MutexLock lock(&upload_mu_);
    stopping_ = true;
    if (upload_context_ != nullptr) upload_context_->TryCancel();
  }
  mailbox_.Abort(
      absl::AbortedError(absl::StrCat("job ", job_, " generation ", generation_, ": ", why)));
  {
    absl::MutexLock lock(&compute_mu_);
    compute_stop_ = true;
    compute_queue_.clear();
  }
  if (compute_thread_.joinable()) compute_thread_.join();
  std::vector<std::unique_ptr<PeerLink>> links;
  {
    absl::MutexLock lock(&links_mu_);
    RecordLinkMetrics(/*forget=*/true);
    closed_ = true;
    for (auto& [rank, slot] : peers_) {
      if (slot.link != nullptr) links.push_back(std::move(slot.link));
      slot.pending.clear();
    }
    for (auto& link : coordinator_links_) links.push_back(std::move(link));
    coordinator_links_.clear();
  }
  for (auto& link : links) link->Shutdown();
}

void WorkerJob::Post(std::function<void()> task) {
  absl::MutexLock lock(&compute_mu_);
  if (compute_stop_) return;
  compute_queue_.push_back(std::move(task));
}

void WorkerJob::ComputeLoop() {
  for (;;) {
    std::function<void()> task;
    {
      absl::MutexLock lock(&compute_mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(compute_mu_) {
        return compute_stop_ || !compute_queue_.empty();
      };
      compute_mu_.Await(absl::Condition(&ready));
      if (compute_stop_) return;
      task = std::move(compute_queue_.front());
      compute_queue_.pop_front();
    }
    task();
  }
}

absl::StatusOr<std::shared_ptr<WorkerJob>> WorkerJob::Create(const v1::Assign& a,
                                                             const WorkerJobOptions& options,
                                                             JobHost* host) {
  PT_ASSIGN_OR_RETURN(JobPlan plan, PlanJob(a, std::max(1, options.threads_max), options.max_isa));
  std::shared_ptr<WorkerJob> job(new WorkerJob(a, options, host));
  job->num_chunks_ = plan.num_chunks;
  job->microbatches_ = a.microbatches();
  job->owner_ = std::move(plan.owner);
  job->replica_ = plan.replica;
  job->replicas_ = plan.replicas;
  job->replica_addresses_ = std::move(plan.replica_addresses);
  job->two_copies_ = plan.two_copies;
  job->actions_ = std::move(plan.actions);
  job->model_ = std::move(plan.model);
  PT_ASSIGN_OR_RETURN(std::vector<OwnedChunk> chunks, job->BuildChunks(plan.optimizer));
  if (a.restore()) PT_RETURN_IF_ERROR(RestoreChunks(a, host, &chunks));
  ExecutorOptions executor_options;
  executor_options.replica = job->replica_;
  executor_options.replicas = job->replicas_;
  executor_options.two_copies = plan.two_copies;
  absl::StatusOr<std::unique_ptr<StepExecutor>> executor =
      StepExecutor::Create(job->model_.get(), std::move(chunks), job->num_chunks_, &job->mailbox_,
                           job.get(), executor_options);
  if (!executor.ok()) return AssignError(a, executor.status().message());
  job->executor_ = *std::move(executor);
  job->Launch();
  return job;
}

absl::StatusOr<std::vector<OwnedChunk>> WorkerJob::BuildChunks(
    const math::OptimizerConfig& optimizer) {
  const v1::Assign& a = assign_;
  std::vector<OwnedChunk> chunks;
  for (int c = 0; c < num_chunks_; ++c) {
    if (owner_[c] != rank_) continue;
    const v1::ChunkSpec& spec = a.chunks(c);
    absl::StatusOr<model::Stage> stage = model::Stage::Create(
        model_.get(), spec.first_layer(), spec.last_layer(), a.seed(), optimizer);
    if (!stage.ok()) {
      return AssignError(a, absl::StrCat("chunk ", c, ": ", stage.status().message()));
    }
    chunks.push_back(OwnedChunk{c, *std::move(stage)});
    // With two copies of the stages a checkpoint stores each layer once, from the down copy.
    const bool saves = !two_copies_ || c < num_chunks_ / 2;
    for (const model::CheckpointShard& shard :
         model::LayerShards(*model_, spec.first_layer(), spec.last_layer())) {
      if (saves) shards_.push_back(shard);
    }
    for (int n : {c - 1, c + 1}) {
      // The two copies' routes do not join: chunk S-1 ends the down copy, chunk S starts the up.
      const bool joined = !two_copies_ || (n < num_chunks_ / 2) == (c < num_chunks_ / 2);
      if (n < 0 || n >= num_chunks_ || !joined || owner_[n] == rank_) continue;
      std::vector<int>& peers = owner_[n] > rank_ ? higher_peers_ : lower_peers_;
      if (std::find(peers.begin(), peers.end(), owner_[n]) == peers.end()) {
        peers.push_back(owner_[n]);
      }
    }
  }
  if (chunks.empty()) return AssignError(a, absl::StrCat("rank ", rank_, " holds no chunk"));
  AddTiePeer();
  AddReplicaPeers();
  if (two_copies_) AddPeer(CopyPeer());
  return chunks;
}

void WorkerJob::AddReplicaPeers() {
  for (int bit = 1; bit < replicas_; bit <<= 1) {
    const int q = replica_ ^ bit;
    (q > replica_ ? higher_peers_ : lower_peers_).push_back(ReplicaPeer(q));
  }
}

void WorkerJob::AddTiePeer() {
  const int embedding = owner_[0];
  const int head = owner_[num_chunks_ - 1];
  if (!model_->tie().has_value() || embedding == head) return;
  int peer = -1;
  if (rank_ == embedding) peer = head;
  if (rank_ == head) peer = embedding;
  AddPeer(peer);
}

void WorkerJob::AddPeer(int peer) {
  if (peer < 0 || peer == rank_) return;
  std::vector<int>& peers = peer > rank_ ? higher_peers_ : lower_peers_;
  if (std::find(peers.begin(), peers.end(), peer) == peers.end()) peers.push_back(peer);
}

int WorkerJob::CopyPeer() const {
  // Rank w holds stages w (down) and S-1-w (up); rank S-1-w holds their other copies.
  return two_copies_ ? num_chunks_ / 2 - 1 - rank_ : -1;
}

void WorkerJob::Launch() {
  if (pacer_ != nullptr) {
    std::vector<std::pair<int64_t, int64_t>> chunk_layers;
    for (int c = 0; c < num_chunks_; ++c) {
      chunk_layers.emplace_back(assign_.chunks(c).first_layer(), assign_.chunks(c).last_layer());
    }
    pacer_->Configure(model_.get(), actions_, std::move(chunk_layers), num_chunks_);
  }
  {
    absl::MutexLock lock(&links_mu_);
    for (int p : higher_peers_) peers_[p];
    for (int p : lower_peers_) peers_[p];
  }
  // The job's level has its own copy of Eigen's settings (math::Kernels::ConfigureEigen).
  model_->kernels().ConfigureEigen(assign_.threads());
  compute_thread_ = std::thread([this] { ComputeLoop(); });
}

void WorkerJob::OnOpenLinks() {
  if (!dialled_) {
    dialled_ = true;
    DialPeers();
  }
}

void WorkerJob::OnRunStep(const v1::RunStep& run) {
  OnOpenLinks();
  requested_step_ = run.step();
  const int64_t run_index = ++requested_runs_;
  const int64_t step = run.step();
  const int64_t rows = run.batch_rows();
  Post([this, step, rows, run_index] {
    absl::Status broken;
    {
      absl::MutexLock lock(&links_mu_);
      broken = broken_;
    }
    // The pacer paces this replica's micro-batches: rows / replicas of them.
    if (pacer_ != nullptr) pacer_->BeginStep(step, rows / replicas_);
    absl::StatusOr<StepReport> report =
        broken.ok() ? executor_->RunStep(step, actions_, rows) : absl::StatusOr<StepReport>(broken);
    if (report.ok()) FlushPeerLinks(run_index);
    if (pacer_ != nullptr && report.ok()) {
      pacer_->EndStep();
      pacer_->RewriteTimings(&*report);
    }
    bool aborted = false;
    {
      absl::MutexLock lock(&state_mu_);
      ++finished_runs_;
      last_step_failed_ = !report.ok();
      aborted = aborted_run_ == run_index;
    }
    // Clean up before answering, so that the answer tells the coordinator that this worker is
    // ready for the next RunStep (also a re-run of this step): the mailbox is reset after the
    // coordinator's Abort (unless a link broke: the generation is over), a failed step's leftovers
    // are dropped and the executor discards the failed step at once.
    if (aborted && broken.ok()) {
      mailbox_.Reset();
      link_spans_.Clear();
    } else if (!report.ok()) {
      mailbox_.ClearStep(step);
    }
    if (!report.ok()) executor_->Abort();
    step_ok_ = report.ok() && !aborted;
    ran_step_ = step;
    if (!report.ok()) {
      EmitError(step, report.status());
      return;
    }
    RecordStepMetrics(*report);
    v1::WorkerEvent event;
    *event.mutable_step_done() =
        StepDoneFromReport(job_, generation_, *report,
                           link_spans_.TakeStep(step, report->started, LinkSpanLog::Clock::now()));
    Emit(std::move(event));
  });
}

void WorkerJob::OnCommit(const v1::Commit& commit) {
  const int64_t step = commit.step();
  const float clip_scale = commit.clip_scale();
  Post([this, step, clip_scale] {
    if (!step_ok_ || ran_step_ != step) {
      EmitError(step, absl::FailedPreconditionError(absl::StrCat(
                          "Commit(", step, "): step ", step, " has not run successfully here")));
      return;
    }
    step_ok_ = false;
    // Steps are numbered from 1: step N is the N-th optimizer update.
    if (absl::Status s = executor_->CheckCommit(step, clip_scale); !s.ok()) {
      EmitError(step, s);
      return;
    }
    // The update cannot fail once checked, and every later command runs on this thread after
    // it: the coordinator hears Committed at once and answers the step while the update is
    // applied, off the step's critical path (a worker lost meanwhile is lost after its commit,
    // which recovery already handles: every rank restarts from the last checkpoint).
    mailbox_.ClearStep(step);
    v1::WorkerEvent event;
    v1::Committed* committed = event.mutable_committed();
    committed->set_job(job_);
    committed->set_generation(generation_);
    committed->set_step(step);
    Emit(std::move(event));
    // A rank whose step starts with a forward of a later chunk waits for its first activation
    // anyway: it applies the update then, and leaves this core to the ranks (and the control
    // plane) that are on the critical path between two steps.
    const bool defer = !actions_.empty() && actions_.front().op == schedule::Op::kForward &&
                       actions_.front().chunk != 0;
    if (absl::Status s = executor_->Commit(step, clip_scale, defer); !s.ok()) {
      // Unreachable (checked above); fails the next command rather than passing silently.
      EmitError(step, s);
    }
  });
}

void WorkerJob::OnAbort(const v1::Abort& abort) {
  if (abort.step() != requested_step_) {
    host_->Log(absl::StrCat("ignoring Abort(", abort.step(), ") of job ", job_, " generation ",
                            generation_, ": the latest step is ", requested_step_));
    return;
  }
  {
    // Atomic with the compute thread's end-of-run bookkeeping: either the run is still queued
    // or running (then it is woken here and resets the mailbox itself before it answers), or it
    // has answered already (then the mailbox is left alone: a re-run's inputs may be in it).
    absl::MutexLock lock(&state_mu_);
    if (finished_runs_ < requested_runs_) {
      aborted_run_ = requested_runs_;
      mailbox_.Abort(absl::AbortedError(
          absl::StrCat("step ", abort.step(), " aborted by the coordinator: ", abort.reason())));
    }
  }
  Post([this] {
    executor_->Abort();
    step_ok_ = false;
    absl::MutexLock lock(&links_mu_);
    // Outputs of the aborted run still waiting for a lower-rank peer's stream are dropped, so
    // a re-run of the step cannot deliver them twice.
    for (auto& [rank, slot] : peers_) slot.pending.clear();
  });
}

void WorkerJob::OnSaveShards(const v1::SaveShards& save) {
  const int64_t step = save.step();
  Post([this, step] {
    StateUpload upload;
    upload.job = job_;
    upload.generation = generation_;
    upload.step = step;
    upload.worker = host_->name();
    upload.shards = shards_;
    grpc::ClientContext context;
    {
      absl::MutexLock lock(&upload_mu_);
      if (stopping_) return;
      upload_context_ = &context;
    }
    absl::Status s =
        PutState(host_->coordinator(), &context, upload, executor_->ExportState()).status();
    {
      absl::MutexLock lock(&upload_mu_);
      upload_context_ = nullptr;
    }
    if (!s.ok()) {
      EmitError(step, s);
      return;
    }
    v1::WorkerEvent event;
    v1::ShardsSaved* saved = event.mutable_shards_saved();
    saved->set_job(job_);
    saved->set_generation(generation_);
    saved->set_step(step);
    Emit(std::move(event));
  });
}

void WorkerJob::OnLinkFailed(const absl::Status& status, bool coordinator_link) {
  if (coordinator_link) {
    // The coordinator sees its own stream fail: it aborts the step it was feeding (Abort) and
    // dials a new feed stream for the next one; if it died, the control stream ends too.
    // Deciding here would race with the replacement stream, so this is only logged.
    host_->Log(absl::StrCat("feed stream ended: ", status.ToString()));
    return;
  }
  int64_t step = 0;
  {
    absl::MutexLock lock(&state_mu_);
    // A queued or running step fails on the aborted mailbox (or the broken link) and reports
    // the error itself; a step that failed already told the coordinator.
    if (finished_runs_ < requested_runs_ || last_step_failed_) return;
    step = std::max<int64_t>(requested_step_, 0);
  }
  EmitError(step, status);
}

}  // namespace pipetrain::worker
