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
#include "server/coordinator/feed_link.h"
#include "server/coordinator/job.h"
#include "server/coordinator/job_journal.h"
#include "server/coordinator/op_thread.h"
#include "server/coordinator/worker_channel.h"
#include "server/coordinator/worker_registry.h"
#include "server/logging/log_level.h"

namespace pipetrain::metrics {
class CoordinatorMetrics;
}  // namespace pipetrain::metrics

namespace pipetrain::coordinator {

class StepRun;

struct CoordinatorOptions {
  // Longest wait for every worker's Assigned after Assign. Default 2 minutes.
  absl::Duration assign_timeout = absl::Minutes(2);
  // Longest wait for every worker's Committed or ShardsSaved (a checkpoint's upload). A lost
  // worker is detected sooner by its broken Join stream. Default 30 minutes.
  absl::Duration step_timeout = absl::Minutes(30);
  // Longest wait for a step's StepDone from every worker: max(step_deadline_floor,
  // step_deadline_factor x the plan's simulated step time), the simulation charging every action
  // its chunk's FLOPs for the step's micro-batch size at the owner's measured GFLOP/s. A worker
  // that misses it (stopped, stuck) fails the step with DEADLINE_EXCEEDED naming it. Defaults:
  // 60 s, 50.
  absl::Duration step_deadline_floor = absl::Seconds(60);
  double step_deadline_factor = 50;
  // While a step waits longer than this for some ranks, a line "waiting for rank R (worker W)
  // for T s" is logged, again every interval. Default 10 s.
  absl::Duration wait_report_interval = absl::Seconds(10);
  // Every checkpoint directory a client names (Checkpoint, JobSpec.resume_from) must lie under
  // this directory (io::ConfinePath; PERMISSION_DENIED otherwise). Empty (default): the
  // coordinator reads and writes no checkpoints (FAILED_PRECONDITION saying so).
  std::string checkpoint_root;
  // How long a recoverable job's step that failed on a transport error waits for a worker's loss
  // to be noticed (its Join stream ending) before the error goes to the client; also how long
  // ranks have to answer the Abort of a step that missed its deadline before the silent ones are
  // evicted as stuck. Default 3 s.
  absl::Duration loss_grace = absl::Seconds(3);
  // Prometheus metrics to record (steps, recoveries, jobs and workers by state); null: none.
  std::shared_ptr<metrics::CoordinatorMetrics> metrics;
  // Where log lines go, with their level; null: logging::Log("coordinator", ...) (spdlog, as
  // configured in main by --log-format / --log-level).
  std::function<void(logging::LogLevel, const std::string&)> log;
  // A job with no Train stream and no client call naming it for this long is cancelled
  // ("client gone"). Default 5 minutes.
  absl::Duration client_lease = absl::Minutes(5);
  // Ended jobs stay listed (ListJobs, GetJob) this long, at most `max_ended_jobs` of them (the
  // oldest go first). Defaults: 1 hour, 1000.
  absl::Duration job_retention = absl::Hours(1);
  int max_ended_jobs = 1000;
  // How often the housekeeping thread looks at leases and retention. Default 1 s.
  absl::Duration housekeeping_interval = absl::Seconds(1);
  // Caps on a job's model and step (CreateJob: RESOURCE_EXHAUSTED naming the flag).
  job::JobLimits job_limits;

  // OK, or INVALID_ARGUMENT naming the bad field.
  absl::Status Check() const;
};

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

  // Fails every waiting operation with CANCELLED, closes every worker's channel (CANCELLED) and
  // stops accepting work. Idempotent. Jobs stay in the journal (a restart continues them).
  void Shutdown() ABSL_LOCKS_EXCLUDED(mu_);

  // Opens the durable journal in `state_dir` and restores every job recorded there: each is
  // RECOVERING, in a new generation, until enough workers have registered, then READY at its last
  // checkpoint (or step 0), for its client to reconnect and replay. A record that cannot be
  // restored becomes a FAILED job saying why. Call once, before serving. Errors: the journal
  // cannot be opened or listed; FAILED_PRECONDITION if one is open already.
  absl::Status OpenJournal(const std::string& state_dir) ABSL_LOCKS_EXCLUDED(mu_);

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

  // ---- coordinator_core.cc: jobs' life, status and housekeeping.
  void HousekeepingLoop();
  // Cancels jobs whose lease expired and prunes ended jobs; returns the pruned jobs' threads, to
  // be joined outside the lock.
  std::vector<std::unique_ptr<OpThread>> Housekeep(absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The job `id` if `caller` may see it (NOT_FOUND naming it otherwise); renews its client lease.
  absl::StatusOr<Job*> FindJob(const std::string& id, const std::string& caller = "")
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // FindJob, and CheckReady's error unless it is READY.
  absl::StatusOr<Job*> ReadyJob(const std::string& id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Moves a job that has not ended into terminal `state` with `reason`: aborts a step in flight,
  // releases and frees its workers, drops its journal record, wakes its waiting operation and
  // closes its thread behind a task that closes its links.
  void EndJob(Job& job, JobState state, const std::string& reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_, job.mu);
  void FailJob(Job& job, const std::string& error) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_, job.mu) {
    EndJob(job, JobState::kFailed, error);
  }
  // Sends `command` to every rank of `job` still registered to it.
  void SendToRanks(const Job& job, const v1::WorkerCommand& command) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_, job.mu);
  void SendToRank(const Job& job, int rank, const v1::WorkerCommand& command) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_, job.mu);
  // Each rank's StageWorker address ("" for a worker no longer registered).
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
  // "worker 'NAME' (rank R)" for the ranks of `job`, joined with ", ".
  static std::string RankLabels(const Job& job, const std::vector<int>& ranks)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(job.mu);
  // Metrics hooks (no-ops without options_.metrics).
  void RecordStepMetrics(const std::string& job, int64_t samples,
                         const v1::StepResult& result) const;
  void RecordStateMetrics() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // ---- membership.cc
  absl::Status RegisterWorker(WorkerChannel* channel, const v1::RegisterWorker& r,
                              std::string* name) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Records a registered worker's event about its job (Assigned, StepDone, ...).
  absl::Status RecordJobEvent(const WorkerRecord& worker, const v1::WorkerEvent& event)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RecordStepDone(Job& job, int rank, const v1::StepDone& done)
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
  // A new job on S idle workers (under the lock); returns its id and the workers' speeds.
  absl::StatusOr<Job*> TakeWorkersForJob(v1::JobSpec& spec, const job::CheckedJobSpec& checked,
                                         std::optional<model::CheckpointManifest> resume)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sends Assign to every rank and waits for every Assigned: READY, or FAILED with the error. A
  // recovering job's recovery is recorded in the same step as it becomes READY (RecordRecovery;
  // `stages_before`: its stage count before the recovery, for the log).
  absl::StatusOr<v1::JobStatus> Assign(Job* job, int stages_before = 0) ABSL_LOCKS_EXCLUDED(mu_);
  v1::WorkerCommand AssignCommand(const Job& job, int rank,
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
  // Tells every rank to save and waits for every ShardsSaved into `staging`; evicts the silent
  // ranks of a recoverable job past the deadline.
  absl::Status CollectShards(Job& job, int64_t step, const std::string& staging)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_, job.mu);
  // The rank `worker` holds in `job`: PERMISSION_DENIED unless it is a live worker of the job.
  absl::StatusOr<int> RankOf(const Job& job, const std::string& worker) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_, job.mu);
  // Job `id` if it has not ended (FAILED_PRECONDITION) and is at `generation` (ABORTED).
  absl::StatusOr<Job*> LiveJobAt(const std::string& id, int64_t generation)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // ---- job_recovery.cc
  // Starts recovering `job` from the loss of `name` (rank `rank`) for `cause` ("lost",
  // "deadline"): RECOVERING, the operation in flight aborted, Recover queued on its thread.
  void BeginRecovery(Job& job, const std::string& name, int rank, const std::string& cause)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_, job.mu);
  // Job thread: replaces the lost ranks with idle workers (waiting up to the replace timeout) or
  // re-partitions onto fewer stages (down to min_stages), bumps the generation and assigns every
  // rank with the restore state: READY (and journaled) or FAILED.
  void Recover(Job* job) ABSL_LOCKS_EXCLUDED(mu_);
  // The workers of the new generation by rank, once enough are idle; nullopt if the job failed.
  std::optional<std::vector<std::string>> AwaitReplacements(Job& job, bool* shrink)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_, job.mu);
  // Plans and partitions `job` anew for `names` (at least `fewest` of them): false if it failed.
  bool Relayout(Job& job, std::vector<std::string>* names, int fewest)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_, job.mu);
  // Appends the recovery in progress to the job's recoveries (its duration now), logs it and
  // counts it in the metrics.
  void RecordRecovery(Job& job, int stages_before) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_, job.mu);
  // Gives the ranks to `names`, releases the workers left out, and starts a new generation.
  void StartGeneration(Job& job, const std::vector<std::string>& names)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_, job.mu);
  // Restores one journal record as a RECOVERING job (or a FAILED one saying why it cannot).
  void RestoreJob(journal::v1::JobRecord record) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Writes job `id`'s journal record (if a journal is open and the job has not ended).
  void JournalJob(const std::string& id) ABSL_LOCKS_EXCLUDED(mu_);

  // ---- feed_links.cc (job thread only, lock not held)
  // Makes the job's links to its first and last chunk owners open and healthy for `generation`.
  absl::Status EnsureFeedLinks(Job* job, const FeedTarget& first, const FeedTarget& last)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The feed targets of the job's current generation (first, last chunk owner).
  std::pair<FeedTarget, FeedTarget> FeedTargets(const Job& job) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_, job.mu);
  // After an assignment: tells every rank to dial its neighbours and opens the feed links.
  void OpenLinksEarly(Job* job) ABSL_LOCKS_EXCLUDED(mu_);
  // The last task of an ended job's thread: closes its links.
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
  // The durable journal (OpenJournal); null without a state directory.
  std::unique_ptr<JobJournal> journal_ ABSL_GUARDED_BY(mu_);

  // Runs CreateJob's validation, worker selection and partitioning, one request at a time.
  std::unique_ptr<OpThread> admission_ = std::make_unique<OpThread>();
  // Wakes the housekeeping thread for shutdown.
  absl::Mutex housekeeping_mu_;
  bool stop_housekeeping_ ABSL_GUARDED_BY(housekeeping_mu_) = false;
  std::thread housekeeping_thread_;
};

// OK if `job` is READY, else FAILED_PRECONDITION naming its state (ABORTED while it recovers).
absl::Status CheckReady(const Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(job.mu);
// What new work on an ended job gets: FAILED_PRECONDITION "job 'ID' is STATE[: REASON]".
absl::Status EndedError(const Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(job.mu);
// What an operation in flight gets when its job ends: CANCELLED for a cancelled job,
// UNAVAILABLE for a failed one, FAILED_PRECONDITION for a finished one.
absl::Status InterruptedError(const Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(job.mu);
// "worker 'NAME' (rank R)".
std::string WorkerLabel(const std::string& name, int rank);
// A failure of the transport (a peer unreachable, a stream cut, a deadline): one that a lost or
// stopped worker causes, as opposed to an error a worker reports about its work.
bool IsTransportFailure(const absl::Status& status);

}  // namespace pipetrain::coordinator

#endif  // PIPETRAIN_SERVER_COORDINATOR_COORDINATOR_CORE_H_
