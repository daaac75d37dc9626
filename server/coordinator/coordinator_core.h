// CoordinatorCore: the coordinator's job logic without a transport — membership of stage workers
// (WorkerRegistry), the jobs' life, the training step (StepRun), checkpoints, recovery and the
// durable journal. It talks to workers through WorkerChannel and feeds steps through FeedLink;
// the gRPC shell (coordinator_service.h and its reactors) only moves messages in and out.
//
// Threading (docs/architecture.md, "The coordinator"):
//  - Membership hooks (OnWorkerEvent, OnWorkerGone) and the unary client calls never block: they
//    record what arrives under the core's lock and wake the operation waiting for it.
//  - Every job has its own thread (OpThread) that runs its blocking operations — assignment,
//    steps, checkpoints, recovery — one at a time in arrival order, so that jobs never wait for
//    each other. CreateJob's validation and partitioning run on one admission thread.
//  - The housekeeping thread cancels jobs whose client lease ran out and prunes ended jobs.
// Lock order: the core's lock before a WorkerChannel's and an OpThread's own locks; FeedLinks are
// shut down only without it.
//
// Job life (coordinator.proto, JobState): a job ends DONE (FinishJob), CANCELLED (CancelJob, or
// no client for longer than the lease) or FAILED (a fault it could not survive); an ended job
// releases its workers at once. A bad batch or a step a worker failed leaves the job READY; a
// lost worker fails the job unless it recovers (JobSpec.recover: RECOVERING, then READY at its
// last checkpoint; docs/recovery.md). With a state directory every job that has not ended is
// journaled, and a restarted coordinator restores them.
#ifndef PIPETRAIN_SERVER_COORDINATOR_COORDINATOR_CORE_H_
#define PIPETRAIN_SERVER_COORDINATOR_COORDINATOR_CORE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/job/job_spec.h"
#include "common/model/checkpoint.h"
#include "pipetrain/v1/coordinator.pb.h"
#include "pipetrain/v1/worker_control.pb.h"
#include "server/coordinator/coordinator_options.h"
#include "server/coordinator/feed_link.h"
#include "server/coordinator/job.h"
#include "server/coordinator/job_event_log.h"
#include "server/coordinator/job_journal.h"
#include "server/coordinator/job_shape.h"
#include "server/coordinator/op_thread.h"
#include "server/coordinator/staging_ledger.h"
#include "server/coordinator/state_dir_lock.h"
#include "server/coordinator/worker_channel.h"
#include "server/coordinator/worker_registry.h"
#include "server/logging/log_level.h"

namespace pipetrain::coordinator {

class StepRun;

// One checkpoint file a worker fetches (FetchState): its manifest entry, and where it is here:
// `shard.file` in the checkpoint directory `dir` (`path` joins them, for messages).
struct StateFile {
  model::CheckpointShard shard;
  std::string path;
  std::string dir;
};

// Where a PutState stream may store its files: the staging directory of the checkpoint in
// progress and the files of the caller's layers, by file name.
struct UploadTarget {
  std::string staging;
  std::map<std::string, model::CheckpointShard> files;
};

class CoordinatorCore {
 public:
  // `links` dials the data links that feed steps; it must outlive the core.
  CoordinatorCore(CoordinatorOptions options, std::shared_ptr<FeedLinkFactory> links);
  // Shuts down, runs what the job threads have queued (every operation sees the shutdown) and
  // joins every thread.
  ~CoordinatorCore();
  CoordinatorCore(const CoordinatorCore&) = delete;
  CoordinatorCore& operator=(const CoordinatorCore&) = delete;

  const CoordinatorOptions& options() const { return options_; }

  // Writes one log line through options().log (thread-safe; never called under a lock a log
  // sink could need).
  void Log(const std::string& message, logging::LogLevel level = logging::LogLevel::kInfo) const;

  // One housekeeping pass now, as the housekeeping thread makes every housekeeping_interval:
  // cancels the jobs whose client lease ran out (by options().clock) and prunes ended jobs past
  // their retention. Thread-safe.
  void RunHousekeeping() ABSL_LOCKS_EXCLUDED(mu_);

  // Fails every waiting operation with CANCELLED, closes every worker's channel (CANCELLED) and
  // stops accepting work. Idempotent. Jobs stay in the journal (a restart continues them).
  void Shutdown() ABSL_LOCKS_EXCLUDED(mu_);

  // Takes the state directory `state_dir` for this core's life (StateDirLock, recording `address`
  // as where this coordinator serves), removes the checkpoint staging directories a coordinator
  // that died there left (StagingLedger), opens the durable journal and restores every job
  // recorded there: each is RECOVERING, in a new generation, until enough workers have
  // registered, then READY at its last checkpoint (or step 0), for its client to reconnect and
  // replay. A record that cannot be restored becomes a FAILED job saying why. Call once, before
  // serving. Errors: FAILED_PRECONDITION naming the holder if another coordinator holds the
  // directory, or if a journal is open already; the journal or ledger cannot be opened or listed.
  absl::Status OpenJournal(const std::string& state_dir, const std::string& address = "")
      ABSL_LOCKS_EXCLUDED(mu_);
  // Records `address` (HOST:PORT, once the port is bound) as where the holder of the state
  // directory serves, for the error another coordinator gets. No-op without a state directory.
  void RecordListenAddress(const std::string& address) ABSL_LOCKS_EXCLUDED(mu_);

  // ---- Membership (a worker's Join stream). Non-blocking, thread-safe.
  // Handles one event from `channel`. `*name` is empty until the stream registered (the first
  // event must be RegisterWorker, which sets it). An error ends the stream.
  absl::Status OnWorkerEvent(WorkerChannel* channel, std::string* name,
                             const v1::WorkerEvent& event) ABSL_LOCKS_EXCLUDED(mu_);
  // The stream of `channel`, registered as `name` (empty: never registered), is over; the
  // channel may be destroyed once this returns.
  void OnWorkerGone(WorkerChannel* channel, const std::string& name) ABSL_LOCKS_EXCLUDED(mu_);

  // ---- Client calls. Thread-safe; only CreateJob and the job-thread calls block. `caller` is
  // the principal a client call acts as (net/principal.h; "" without client authentication): a
  // job it may not see (net::MaySee) is NOT_FOUND, as an unknown one.
  // Validates `spec`, takes idle workers and partitions on the admission thread, then assigns on
  // the job's thread; `done` gets the job's status once it is READY, or the error. The job
  // belongs to `caller`.
  void CreateJob(const v1::JobSpec& spec, const std::string& caller,
                 std::function<void(absl::StatusOr<v1::JobStatus>)> done) ABSL_LOCKS_EXCLUDED(mu_);
  // A job's status (NOT_FOUND for an unknown id).
  absl::StatusOr<v1::JobStatus> GetJob(const std::string& id, const std::string& caller = "")
      ABSL_LOCKS_EXCLUDED(mu_);
  // Ends a READY job DONE: FAILED_PRECONDITION while an operation runs or once it ended.
  absl::StatusOr<v1::JobStatus> FinishJob(const std::string& id, const std::string& caller = "")
      ABSL_LOCKS_EXCLUDED(mu_);
  // Cancels a job that has not ended (a step in flight is aborted); no-op for an ended one.
  absl::StatusOr<v1::JobStatus> CancelJob(const std::string& id, const std::string& reason,
                                          const std::string& caller = "") ABSL_LOCKS_EXCLUDED(mu_);
  // OK if job `id` exists and `caller` may see it, else NOT_FOUND.
  absl::Status CheckCaller(const std::string& id, const std::string& caller)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The jobs `caller` may see, oldest first; every worker, in registration order.
  std::vector<v1::JobStatus> ListJobs(const std::string& caller = "") ABSL_LOCKS_EXCLUDED(mu_);
  std::vector<v1::WorkerInfo> ListWorkers() ABSL_LOCKS_EXCLUDED(mu_);

  // Runs `task` on job `id`'s thread: NOT_FOUND, or FAILED_PRECONDITION once it ended.
  absl::Status PostToJob(const std::string& id, std::function<void()> task)
      ABSL_LOCKS_EXCLUDED(mu_);
  // PostToJob for a client's request (a Train stream's batch, a Checkpoint), refused at once when
  // it could only run on a state its client has not seen: CheckReady's ABORTED while the job
  // recovers (instead of waiting, unseen, behind the recovery: the client reports the wait and
  // polls), CheckClaimCurrent's ABORTED once it recovered since its stream's claim.
  absl::Status PostClientRequest(const std::string& id, std::function<void()> task)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Claims job `id` for the Train stream `owner`: NOT_FOUND; FAILED_PRECONDITION if another
  // stream holds it, it ended or it is not assigned yet. The lease stops while it is held.
  absl::Status ClaimJob(const std::string& id, const void* owner, const std::string& caller = "")
      ABSL_LOCKS_EXCLUDED(mu_);
  // Lets go of a claim (no-op unless `owner` holds it); the lease starts again.
  void ReleaseJob(const std::string& id, const void* owner) ABSL_LOCKS_EXCLUDED(mu_);

  // Job thread (PostToJob): one training step (StepRun). `next_queued` tells whether another
  // batch of the same stream is queued behind this one: the step then returns once its Commit is
  // sent and the next step confirms it. It is called with the core's lock held.
  absl::StatusOr<v1::StepResult> TrainStep(const v1::TrainRequest& request,
                                           const std::function<bool()>& next_queued)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Job thread: confirms job `id`'s unconfirmed Commit, if any (see ConfirmCommit).
  absl::Status ConfirmCommitOf(const std::string& id) ABSL_LOCKS_EXCLUDED(mu_);
  // Job thread: writes a checkpoint of the job's last step (every rank uploads its shards).
  absl::StatusOr<v1::CheckpointResponse> Checkpoint(const v1::CheckpointRequest& request)
      ABSL_LOCKS_EXCLUDED(mu_);

  // ---- Watching a job (WatchJob; job_events.cc). Non-blocking, thread-safe; never a client call
  // for the job's lease.
  struct WatchStart {
    int64_t watch = 0;     // the watch's id in its job.
    v1::JobStatus status;  // the job as the watch began.
  };
  // Opens a watch of job `id` for `caller` (NOT_FOUND as GetJob; RESOURCE_EXHAUSTED beyond
  // options().max_watches_per_job) that reads the events of the job's log after number `after`
  // (JobEventLog::AddWatch). `watcher` must stay valid until CloseWatch returns or it heard
  // OnWatchClosed; it hears OnJobEvent only after NextWatchEvent returned none.
  absl::StatusOr<WatchStart> OpenWatch(const std::string& id, const std::string& caller,
                                       int64_t after, JobWatcher* watcher) ABSL_LOCKS_EXCLUDED(mu_);
  // The watch's next event (JobEventLog::Next), or none (then its watcher's OnJobEvent gets the
  // next). NOT_FOUND once the watch or its job is gone.
  absl::StatusOr<std::optional<v1::JobEvent>> NextWatchEvent(const std::string& id, int64_t watch)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Ends the watch: its watcher hears nothing after this returns. No-op for an unknown one.
  void CloseWatch(const std::string& id, int64_t watch) ABSL_LOCKS_EXCLUDED(mu_);

  // Job thread (PostClientRequest): evaluates held-out samples on the job's committed weights
  // with a forward-only pass over its pipeline (EvalRun; coordinator.proto, Evaluate).
  absl::StatusOr<v1::EvaluateResult> Evaluate(const v1::EvaluateRequest& request)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Job thread (PostClientRequest): generates tokens from the job's committed weights, decoding
  // through its pipeline with KV caches on the workers (GenRun; coordinator.proto, Generate).
  // `cancelled`, if given, is asked between decode rounds (true: end with CANCELLED).
  absl::StatusOr<v1::GenerateResult> Generate(const v1::GenerateRequest& request,
                                              const std::function<bool()>& cancelled = nullptr)
      ABSL_LOCKS_EXCLUDED(mu_);

  // ---- Layer profiles (profile_workers.cc; coordinator.proto, ProfileWorkers). Thread-safe.
  // Sends ProfileLayers to every idle worker and gives `done` (on the profiling thread) each
  // one's answer, or an error for the worker that fails, is lost or has not answered by the
  // request's deadline. Errors of the call: INVALID_ARGUMENT for a bad request,
  // FAILED_PRECONDITION for no idle worker or no level they all run, RESOURCE_EXHAUSTED while
  // another profile is queued or runs, UNAVAILABLE when the coordinator shuts down.
  void ProfileWorkers(const v1::ProfileWorkersRequest& request,
                      std::function<void(absl::StatusOr<v1::ProfileWorkersResponse>)> done)
      ABSL_LOCKS_EXCLUDED(mu_);

  // ---- Checkpoint transfer (PutState, FetchState). Non-blocking, thread-safe.
  // Where the first message of a PutState stream may store its files, or FAILED_PRECONDITION /
  // PERMISSION_DENIED / NOT_FOUND / ABORTED.
  absl::StatusOr<UploadTarget> AcceptUpload(const v1::PutStateRequest& first)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The files of `request`'s rank of its job, or why it gets none.
  absl::StatusOr<std::vector<StateFile>> StateFilesFor(const v1::FetchStateRequest& request)
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  friend class StepRun;
  friend class EvalRun;
  friend class GenerateRun;

  // ---- profile_workers.cc
  // One ProfileWorkers in flight: its number and, per worker asked (by name), the channel it was
  // asked on and its answer once it came.
  struct ProfileAsk {
    WorkerChannel* channel = nullptr;
    std::optional<v1::LayersProfiled> answer;
  };
  struct ProfileRound {
    int64_t id = 0;
    std::map<std::string, ProfileAsk> asked;
  };
  // Profiling thread: sends the commands, waits for the answers until the deadline and builds
  // the response.
  absl::StatusOr<v1::ProfileWorkersResponse> RunProfile(const v1::ProfileWorkersRequest& request)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Starts a round of `request` on the idle workers (ProfileLayers sent), filling `*response`'s
  // names and speeds in registration order.
  absl::Status StartProfile(const v1::ProfileWorkersRequest& request,
                            v1::ProfileWorkersResponse* response)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // True once every worker of the round answered or is gone.
  bool ProfileSettled() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Worker `name`'s answer on `channel` to profile `p.profile()`, kept if it belongs to the round.
  void RecordProfile(WorkerChannel* channel, const std::string& name, const v1::LayersProfiled& p)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // ---- coordinator_core.cc: jobs' life, status and housekeeping.
  void HousekeepingLoop();
  // Cancels jobs whose lease expired and prunes ended jobs; returns the pruned jobs' threads, to
  // be joined outside the lock.
  std::vector<std::unique_ptr<OpThread>> Housekeep(absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The job `id` if `caller` may see it (NOT_FOUND naming it otherwise). Never renews the lease.
  absl::StatusOr<Job*> FindJob(const std::string& id, const std::string& caller = "")
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // FindJob, and CheckReady's error unless it is READY.
  absl::StatusOr<Job*> ReadyJob(const std::string& id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // PostToJob (`client_request` false) and PostClientRequest (true): one lookup, one post.
  absl::Status Post(const std::string& id, bool client_request, std::function<void()> task)
      ABSL_LOCKS_EXCLUDED(mu_);
  // options().clock's time.
  absl::Time Now() const;
  // Whether `job`'s client lease is stopped: it ended, is assigning or recovering, a Train stream
  // holds it or a Checkpoint is writing it.
  static bool LeaseHeld(const Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(job.mu);
  // Starts `job`'s client lease again from now (a full --client-lease), unless it is held.
  void RestartLease(Job& job) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(job.mu);
  // Moves a job that has not ended into terminal `state` with `reason`: aborts a step in flight,
  // releases and frees its workers, drops its journal record, wakes its waiting operation and
  // closes its thread behind a task that closes its links.
  void EndJob(Job& job, JobState state, const std::string& reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_, job.mu);
  void FailJob(Job& job, const std::string& error) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_, job.mu) {
    EndJob(job, JobState::kFailed, error);
  }
  // Sends `command` to every worker of `job` still registered to it (every position: all
  // replicas). SendToRank: to the worker at position `rank` (job_shape.h; a rank with one
  // replica).
  void SendToRanks(const Job& job, const v1::WorkerCommand& command) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_, job.mu);
  void SendToRank(const Job& job, int rank, const v1::WorkerCommand& command) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_, job.mu);
  // Each position's StageWorker address ("" for a worker no longer registered).
  std::vector<std::string> RankAddresses(const Job& job) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_, job.mu);
  void AbortStep(const Job& job, int64_t step, const std::string& reason) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_, job.mu);
  v1::JobStatus StatusOf(const Job& job) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_, job.mu);
  // Waits until `done` holds, the job ends, the operation has an error, the core shuts down or
  // `timeout` passes; returns why it stopped (OK: `done`). `on_wait`, if given, is called every
  // wait_report_interval with the time waited so far. Both run with the lock held.
  absl::Status AwaitOp(Job& job, const std::function<bool()>& done, absl::Duration timeout,
                       const std::string& what,
                       const std::function<void(absl::Duration)>& on_wait = nullptr)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_, job.mu);
  // Waits on the core's condition until `deadline`.
  void WaitUntil(absl::Time deadline) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // PositionLabel of each of `ranks` (positions of `job`), joined with ", ".
  static std::string RankLabels(const Job& job, const std::vector<int>& ranks)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(job.mu);
  // Metrics hooks (no-ops without options_.metrics).
  void RecordStepMetrics(const std::string& job, int64_t samples,
                         const v1::StepResult& result) const;
  void RecordStateMetrics() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // ---- job_events.cc: each job's event log and pace.
  // Appends `event` to the job's log (its watches waiting for one get it).
  void RecordEvent(Job& job, v1::JobEvent event) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_, job.mu);
  // A step committed: its figures into the job's pace and log.
  void RecordStepCommitted(Job& job, int64_t samples, const v1::StepResult& result)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_, job.mu);
  // The job is READY again after a recovery from `stages_before` stages: its log gets the
  // recovery and the new layout, and its pace starts afresh.
  void RecordRecovered(Job& job, int stages_before) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_, job.mu);
  // JobStatus.progress of `job`.
  v1::JobProgress ProgressOf(const Job& job) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_, job.mu);

  // ---- membership.cc
  absl::Status RegisterWorker(WorkerChannel* channel, const v1::RegisterWorker& r,
                              std::string* name) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // With options_.probe_links: sends worker `name` a ProbeLinks naming the other idle workers.
  void SendProbeLinks(const WorkerRecord& worker) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Keeps the links a worker measured (its LinksProbed); drops (and logs) malformed ones.
  void RecordLinksProbed(WorkerRecord& worker, const v1::LinksProbed& probed)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Records a registered worker's event about its job (Assigned, StepDone, ...).
  absl::Status RecordJobEvent(const WorkerRecord& worker, const v1::WorkerEvent& event)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RecordStepDone(Job& job, int rank, const v1::StepDone& done)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_, job.mu);
  // An evaluation run's answer (counted as RecordStepDone counts a RunStep's).
  void RecordEvalDone(Job& job, int rank, const v1::EvalDone& done)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_, job.mu);
  // A decode round's answer (counted as RecordStepDone counts a RunStep's).
  void RecordGenDone(Job& job, int rank, const v1::GenDone& done)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_, job.mu);
  // Ends a forward-only run (an evaluation or a decode round) of mailbox step `step` with
  // `status`: Abort(step) to every rank and the job READY again, or ABORTED when it recovers
  // (a transport failure of a recoverable job waits loss_grace for the loss to be noticed), as
  // StepRun::Fail ends a step. Returns the status to answer.
  absl::Status FailForwardRun(Job& job, int64_t step, absl::Status status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_, job.mu);
  // The answer deadline of a forward-only run of `flops` FLOPs: that work on the job's slowest
  // worker times step_deadline_factor, at least step_deadline_floor.
  absl::Duration ForwardRunDeadline(const Job& job, double flops) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_, job.mu);
  void RecordWorkerError(Job& job, const WorkerRecord& worker, const v1::WorkerError& error)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_, job.mu);
  // The worker `name` (rank `rank` of job `job_id`, if any) is gone for `cause`: its job
  // recovers or fails with `why`.
  void LoseRank(const std::string& job_id, const std::string& name, int rank,
                const std::string& cause, const std::string& why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends worker `name`'s registration now, as if its stream had broken, and closes its channel.
  void EvictWorker(const std::string& name, const std::string& cause, const std::string& why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Evicts the workers of `ranks` of `job` (stuck or stopped: they missed `what`).
  void EvictRanks(Job& job, const std::vector<int>& ranks, const std::string& why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_, job.mu);

  // ---- job_creation.cc
  void AdmitJob(const v1::JobSpec& request, const std::string& owner,
                const std::function<void(absl::StatusOr<v1::JobStatus>)>& done)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The verified checkpoint `spec` resumes from, if any (confined, checksummed, same model/seed).
  absl::StatusOr<std::optional<model::CheckpointManifest>> VerifyResume(
      v1::JobSpec& spec, const model::Model& net) const;
  // `spec.save_to`, if set, checked as a Checkpoint into it by a job of `owner` would be
  // (SaveTarget, CheckSoleWriter, then model::CheckCheckpointDestination on this file system)
  // and replaced by its confined path.
  absl::Status VerifySaveTo(v1::JobSpec& spec, const std::string& owner) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // A new job on R x S idle workers (under the lock), placed by ArrangePositions.
  absl::StatusOr<Job*> TakeWorkersForJob(v1::JobSpec& spec, const job::CheckedJobSpec& checked,
                                         std::optional<model::CheckpointManifest> resume)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sends Assign to every rank and waits for every Assigned: READY, or FAILED with the error. A
  // recovering job's recovery is recorded in the same step as it becomes READY (RecordRecovery;
  // `stages_before`: its stage count before the recovery, for the log).
  absl::StatusOr<v1::JobStatus> Assign(Job* job, int stages_before = 0) ABSL_LOCKS_EXCLUDED(mu_);
  // Sends Assign (data links' secret `secret`) to every rank and waits for every Assigned (or a
  // recovery restart): the wait's error, with no other consequence.
  absl::Status AssignRanks(Job& job, const std::string& secret)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_, job.mu);
  // Assign's wait ended without every Assigned: `waited`, after the job was failed, or (a
  // recovery whose new layout lost a worker, or did not answer: evicted) left RECOVERING with
  // Recover queued again.
  absl::Status AssignFailed(Job& job, absl::Status waited)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_, job.mu);
  // The Assign of the worker at `position` (its rank and replica, this replica's ranks'
  // addresses and this rank's replicas', one replica's share of micro-batches); `addresses` by
  // position.
  v1::WorkerCommand AssignCommand(const Job& job, int position,
                                  const std::vector<std::string>& addresses) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(job.mu);

  // ---- commit.cc
  // Waits until every rank confirmed the job's last Commit (none unconfirmed: OK at once). A
  // rank that refuses it, or has not confirmed it by the step's deadline, leaves the ranks
  // unequal: a recoverable job evicts the late ones and recovers (ABORTED), any other fails.
  absl::Status ConfirmCommit(Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_, job.mu);
  // Why ConfirmCommit stops waiting before every rank committed (OK: keep waiting).
  absl::Status CommitInterruption(const Job& job) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_, job.mu);
  // A job that is neither ended, recovering nor shutting down.
  bool Live(const Job& job) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_, job.mu);

  // ---- checkpoint_operation.cc
  // `path` (a client's checkpoint directory, named by `what`) confined to the checkpoint root.
  absl::StatusOr<std::string> CheckpointPath(const std::string& path, absl::string_view what) const;
  // CheckpointPath, and `keep` checkpoints of it can be kept under the root (INVALID_ARGUMENT).
  absl::StatusOr<std::string> SaveTarget(const std::string& path, int keep,
                                         absl::string_view what) const;
  // OK unless a job that has not ended, other than `self` (null: none), holds a directory that a
  // save into `path` (confined) would touch (Job::checkpoint_dir): FAILED_PRECONDITION naming
  // the job, or "another client's job" if `caller` may not see it; `what` names `path`.
  absl::Status CheckSoleWriter(const Job* self, const std::string& path, absl::string_view what,
                               const std::string& caller) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The start of a Checkpoint into `directory` (confined): the job READY, its data position kept,
  // the directory its own (CheckSoleWriter), its last Commit confirmed; returns the job with its
  // model and the manifest so far in `*net` and `*manifest`.
  absl::StatusOr<Job*> StartCheckpoint(const v1::CheckpointRequest& request,
                                       const std::string& directory,
                                       std::shared_ptr<const model::Model>* net,
                                       model::CheckpointManifest* manifest)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Job thread: writes the checkpoint `manifest` describes into `directory` (StageCheckpoint),
  // its staging directory recorded in the staging ledger while it may exist.
  absl::Status RecordedCheckpoint(Job& job, const std::string& directory, int keep,
                                  const model::Model& net, model::CheckpointManifest* manifest)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Job thread: every rank uploads its shards into a fresh staging directory beside `directory`,
  // which is verified and published (keeping `keep` checkpoints); fills manifest->shards. The
  // staging directory is removed on every error.
  absl::Status StageCheckpoint(Job& job, const std::string& directory, int keep,
                               const model::Model& net, model::CheckpointManifest* manifest)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Tells every rank to save and waits for every ShardsSaved into `staging`; evicts the silent
  // ranks of a recoverable job past the deadline.
  absl::Status CollectShards(Job& job, int64_t step, const std::string& staging)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_, job.mu);
  // The position `worker` holds in `job`: PERMISSION_DENIED unless it is a live worker of it.
  absl::StatusOr<int> PositionOf(const Job& job, const std::string& worker) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_, job.mu);
  // Job `id` if it has not ended (FAILED_PRECONDITION) and is at `generation` (ABORTED).
  absl::StatusOr<Job*> LiveJobAt(const std::string& id, int64_t generation)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // What the coordinator knows of a checkpoint of `job`'s last step (the manifest before its
  // shards), as a Checkpoint writes it.
  model::CheckpointManifest CheckpointManifestOf(const Job& job) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(job.mu);

  // ---- job_growth.cc (docs/scaling.md, "Jobs that change shape")
  // A layout of a job: its spec (with its shape), plan, chunks and partition imbalance, and its
  // workers by position.
  struct Layout {
    v1::JobSpec spec;
    schedule::Plan plan;
    std::vector<v1::ChunkSpec> chunks;
    double imbalance = 1;
    std::vector<std::string> workers;
  };
  // Job thread, at a step boundary (TrainStep, before the step is admitted): if job `id` may
  // grow (READY, its stream's claim current, max_stages or max_replicas above its shape, idle
  // workers of its instruction-set level registered and a layout of more stages or replicas that
  // the schedule and the model accept: NextShape), takes a checkpoint into options().growth_dir
  // (what a recovery restarts from from then on), re-partitions and re-assigns every rank with
  // restore in a new generation. Returns the change of shape, or the failed growth (the job kept
  // its shape and stays READY, unless a lost old worker made it recover or fail as it would have
  // without the growth); nullopt when it did not try, or when the job left READY meanwhile
  // (recovering, ended).
  std::optional<v1::ShapeChange> MaybeGrow(const std::string& id) ABSL_LOCKS_EXCLUDED(mu_);
  // The layout `job` grows to with the idle workers now, or nullopt (a refused layout is logged
  // and not tried again with the same idle workers).
  std::optional<Layout> GrowthLayout(Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_, job.mu);
  // Assigns `grown` (generation secret `secret`) after the growth's `checkpoint` was written;
  // if that fails without the job recovering or ending, assigns the job's layout before the
  // growth again (`fallback_secret`). The change, the failed growth, or nullopt when the job
  // recovers or ended.
  std::optional<v1::ShapeChange> GrowInto(Job& job, Layout grown, const std::string& secret,
                                          const std::string& fallback_secret, absl::Time start,
                                          const std::string& checkpoint)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_, job.mu);
  // `job` grew from `before` (`joined` joined it): READY, logged, in its shape changes and its
  // event log; returns the change.
  v1::ShapeChange Grown(Job& job, const JobShape& before, absl::Time start,
                        const std::string& checkpoint, const std::vector<std::string>& joined)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_, job.mu);
  // Records a growth of `job` that failed for `why` (logged, in its shape changes and its event
  // log; the idle workers now are not tried again) and returns it. `checkpoint`: the growth's
  // checkpoint if it was written (the job restarts from it from then on), else "".
  v1::ShapeChange GrowthFailed(Job& job, absl::Time start, const std::string& checkpoint,
                               const std::string& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_, job.mu);
  // The layout of `replicas` replicas of n stages over the first R x n of `names` (placed by
  // ArrangePositions), for the largest n in [fewest, most] that the workers given, the schedule
  // (job::PlanFor) and the partitioner accept; the last refusal otherwise.
  absl::StatusOr<Layout> PlanLayout(const Job& job, const std::vector<std::string>& names,
                                    int fewest, int most, int replicas) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_, job.mu);
  // Gives `job` the spec, plan, chunks and imbalance of `layout` (its workers: StartGeneration).
  static void ApplyLayout(Job& job, Layout layout) ABSL_EXCLUSIVE_LOCKS_REQUIRED(job.mu);

  // ---- job_recovery.cc
  // Starts recovering `job` from the loss of `name` (rank `rank`) for `cause` ("lost",
  // "deadline"): RECOVERING, the operation in flight aborted, Recover queued on its thread.
  void BeginRecovery(Job& job, const std::string& name, int rank, const std::string& cause)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_, job.mu);
  // Job thread: replaces the lost ranks with idle workers (waiting up to the replace timeout) or
  // re-partitions onto fewer stages (down to min_stages), bumps the generation and assigns every
  // rank with the restore state: READY (and journaled) or FAILED.
  void Recover(Job* job) ABSL_LOCKS_EXCLUDED(mu_);
  // The workers of the new generation by position, once enough are idle; nullopt if the job
  // failed. Past the replace timeout a job that may shrink (min_stages > 0) sets *shrink and
  // *replicas: the job's replicas halved until its stages fit the workers left (then Relayout
  // drops stages, down to min_stages, if one replica does not fit either).
  std::optional<std::vector<std::string>> AwaitReplacements(Job& job, bool* shrink, int* replicas)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_, job.mu);
  // Plans and partitions `job` anew for `replicas` replicas over `names` (at least `fewest`
  // stages), placing them (ArrangePositions; *names becomes the new layout by position): false
  // if it failed.
  bool Relayout(Job& job, std::vector<std::string>* names, int fewest, int replicas)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_, job.mu);
  // Appends the recovery in progress to the job's recoveries (its duration now), logs it and
  // counts it in the metrics.
  void RecordRecovery(Job& job, int stages_before) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_, job.mu);
  // Gives the ranks to `names`, releases the workers left out (telling them `why`), and starts a
  // new generation.
  void StartGeneration(Job& job, const std::vector<std::string>& names,
                       const std::string& why = "the job shrank to fewer stages")
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_, job.mu);
  // Restores one journal record as a RECOVERING job (or a FAILED one saying why it cannot).
  void RestoreJob(journal::v1::JobRecord record) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Writes job `id`'s journal record (if a journal is open and the job has not ended).
  void JournalJob(const std::string& id) ABSL_LOCKS_EXCLUDED(mu_);

  // ---- feed_links.cc (job thread only, lock not held)
  // Makes the job's links to its first and last chunk owners open and healthy for `generation`.
  absl::Status EnsureFeedLinks(Job* job, const FeedTarget& first, const FeedTarget& last)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The feed targets of replica `replica` of the job's current generation (first, last chunk
  // owner; FeedTarget::rank is their position, microbatches the replica's share M / R).
  std::pair<FeedTarget, FeedTarget> FeedTargets(const Job& job, int replica = 0) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_, job.mu);
  // After an assignment: tells every rank to dial its neighbours and opens the feed links.
  void OpenLinksEarly(Job* job) ABSL_LOCKS_EXCLUDED(mu_);
  // The last task of an ended job's thread: closes its links, and removes its growth checkpoint
  // once it is done or cancelled.
  void CloseJobLinks(Job* job) ABSL_LOCKS_EXCLUDED(mu_);

  // Constant after construction.
  const CoordinatorOptions options_;
  const std::shared_ptr<FeedLinkFactory> link_factory_;
  const std::string id_prefix_;  // "job-<random hex>-": job ids are unique across restarts.

  // Protects the registry, the jobs (every field of a Job: Job::mu refers to it) and the
  // journal. Never held while blocking on I/O or a link's shutdown.
  mutable absl::Mutex mu_;
  WorkerRegistry workers_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::unique_ptr<Job>> jobs_ ABSL_GUARDED_BY(mu_);
  int64_t next_job_ ABSL_GUARDED_BY(mu_) = 1;
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
  // Signalled whenever a worker event, a lost worker, a link failure, an ended job or Shutdown
  // changes what a waiting operation looks at.
  absl::CondVar event_cv_;
  // The state directory's lock, the durable journal and the staging ledger (OpenJournal); null
  // without a state directory. Each lives as long as the core once set.
  std::unique_ptr<StateDirLock> state_lock_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<JobJournal> journal_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<StagingLedger> staging_ ABSL_GUARDED_BY(mu_);

  // Runs CreateJob's validation, worker selection and partitioning, one request at a time.
  std::unique_ptr<OpThread> admission_ = std::make_unique<OpThread>();
  // ProfileWorkers: the round in flight (none between rounds), whether one is queued or runs,
  // and the next round's number. Guarded by mu_.
  std::optional<ProfileRound> profile_ ABSL_GUARDED_BY(mu_);
  bool profile_busy_ ABSL_GUARDED_BY(mu_) = false;
  int64_t next_profile_ ABSL_GUARDED_BY(mu_) = 1;
  // Runs ProfileWorkers' rounds (they block until their workers answer).
  std::unique_ptr<OpThread> profiler_ = std::make_unique<OpThread>();
  // Wakes the housekeeping thread for shutdown.
  absl::Mutex housekeeping_mu_;
  bool stop_housekeeping_ ABSL_GUARDED_BY(housekeeping_mu_) = false;
  std::thread housekeeping_thread_;
};

// OK if `job` is READY, else FAILED_PRECONDITION naming its state (ABORTED while it recovers).
absl::Status CheckReady(const Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(job.mu);
// OK unless a recovery started a new generation of `job` since its Train stream claimed it:
// then ABORTED naming the recovery, for that stream's batches and its client's checkpoints (the
// job may be back at the client's step, but the client must hear of the recovery: it replays on
// a new stream, whose claim is current).
absl::Status CheckClaimCurrent(const Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(job.mu);
// What new work on an ended job gets: FAILED_PRECONDITION "job 'ID' is STATE[: REASON]".
absl::Status EndedError(const Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(job.mu);
// What an operation in flight gets when its job ends: CANCELLED for a cancelled job,
// UNAVAILABLE for a failed one, FAILED_PRECONDITION for a finished one.
absl::Status InterruptedError(const Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(job.mu);
// "worker 'NAME' (rank R)".
std::string WorkerLabel(const std::string& name, int rank);
// The worker at `position` of `job`: WorkerLabel with one replica, else
// "worker 'NAME' (rank R, replica Q)".
std::string PositionLabel(const Job& job, int position) ABSL_EXCLUSIVE_LOCKS_REQUIRED(job.mu);
// A failure of the transport (a peer unreachable, a stream cut, a deadline): one that a lost or
// stopped worker causes, as opposed to an error a worker reports about its work.
bool IsTransportFailure(const absl::Status& status);

}  // namespace pipetrain::coordinator

#endif  // PIPETRAIN_SERVER_COORDINATOR_COORDINATOR_CORE_H_
