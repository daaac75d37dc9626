// CoordinatorService: the coordinator daemon's gRPC service (pipetrain.v1.Coordinator) —
// membership of stage workers, the job state machine and the orchestration of training steps.
//
// Threading model (docs/architecture.md):
//  - gRPC callback reactors (server/coordinator/reactors.h: one per Join stream, one per Train
//    stream; unary reactors) never block: they validate and record what arrives under `mu_` and
//    hand every blocking operation to a thread.
//  - Every job has its own operation thread (OpThread) that runs its blocking operations
//    (assignment, training steps, checkpoints) one at a time in arrival order, so that jobs never
//    wait for each other. CreateJob's validation and partitioning run on the admission thread.
//  - Operation threads send commands by queueing them on the workers' Join reactors and wait on
//    `mu_` (absl::Mutex::Await) for the events the reactors record (Assigned, StepDone,
//    Committed, ShardsSaved, WorkerError, a lost worker, a cancelled job).
//  - The housekeeping thread cancels jobs whose client lease ran out, prunes ended jobs after
//    the retention period and joins the operation threads of ended jobs.
//
// Job life (coordinator.proto, JobState): a job ends DONE (FinishJob), CANCELLED (CancelJob, or
// no client for longer than the lease) or FAILED (a lost worker, a step not committed
// everywhere, a failed assignment); an ended job releases its workers at once (Release).
// Error policy of Train: a bad batch (shape, values, samples % M) ends that Train stream with
// INVALID_ARGUMENT, and a step a worker failed ends it with the worker's status after Abort was
// sent to every worker; in both cases the job stays READY and a new Train stream may continue
// where the last applied step left off. A lost worker fails the job unless it recovers
// (JobSpec.recover: RECOVERING, then READY at its last checkpoint; docs/recovery.md).
// Durability (OpenJournal): with a state directory, every job that has not ended is recorded
// there, and a restarted coordinator restores them (RECOVERING until workers register again).
#ifndef PIPETRAIN_SERVER_COORDINATOR_COORDINATOR_SERVICE_H_
#define PIPETRAIN_SERVER_COORDINATOR_COORDINATOR_SERVICE_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/math/tensor.h"
#include "common/model/checkpoint.h"
#include "common/model/model.h"
#include "common/schedule/ir.h"
#include "pipetrain/v1/coordinator.grpc.pb.h"
#include "pipetrain/v1/coordinator.pb.h"
#include "server/coordinator/job_journal.h"
#include "server/coordinator/job_spec.h"
#include "server/coordinator/job_state.h"
#include "server/coordinator/op_thread.h"
#include "server/link/peer_link.h"
#include "server/logging/log_level.h"

namespace grpc {
class ChannelCredentials;
class ServerBuilder;
}  // namespace grpc

namespace pipetrain::metrics {
class CoordinatorMetrics;
}  // namespace pipetrain::metrics

namespace pipetrain::coordinator {

struct CoordinatorOptions {
  // Options of the data links the coordinator opens to the first and last chunk owners.
  link::LinkOptions link;
  // Credentials of those links (the workers' Exchange servers): TLS with the coordinator's
  // certificate under mTLS (net::MakeChannelCredentials). Null (default): plaintext.
  std::shared_ptr<grpc::ChannelCredentials> link_credentials;
  // RegisterWorker is refused (PERMISSION_DENIED) unless the Join stream's verified TLS client
  // certificate names the host the worker advertises (net::CheckCertificateNamesHost). Set with
  // mTLS. Default false.
  bool check_worker_certificates = false;
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
  JobLimits job_limits;

  // OK, or INVALID_ARGUMENT naming the bad field.
  absl::Status Check() const;
};

class JoinReactor;
class TrainReactor;

// One checkpoint file a worker fetches (FetchState): its manifest entry and its path here.
struct StateFile {
  model::CheckpointShard shard;
  std::string path;
};

// The Coordinator service. Thread-safe: every public method may be called from any thread.
// Create it, register it on a grpc::ServerBuilder, start the server; to stop, call Shutdown(),
// then shut the server down, then destroy the service.
class CoordinatorService final : public v1::Coordinator::CallbackService {
 public:
  explicit CoordinatorService(CoordinatorOptions options = {});
  ~CoordinatorService() override;
  CoordinatorService(const CoordinatorService&) = delete;
  CoordinatorService& operator=(const CoordinatorService&) = delete;

  // Fails every waiting operation with CANCELLED, ends every Join stream (CANCELLED) and stops
  // accepting work; operations queued afterwards fail with CANCELLED. Idempotent. Jobs stay in
  // the journal (a restart continues them).
  void Shutdown();

  // Opens the durable journal in `state_dir` (JobJournal) and restores every job recorded there:
  // each is RECOVERING, in a new epoch, until enough workers have registered (within its
  // replace timeout; fewer stages down to its min_stages), then READY at its last checkpoint (or
  // step 0), for its client to reconnect and replay; its client lease starts now. A record that
  // cannot be restored (its spec or checkpoint no longer valid) becomes a FAILED job saying why.
  // Call once, before the server starts serving. Errors: the journal cannot be opened or listed
  // (naming the path); FAILED_PRECONDITION if a journal is already open.
  absl::Status OpenJournal(const std::string& state_dir) ABSL_LOCKS_EXCLUDED(mu_);

  // ---- gRPC handlers (callback API).
  grpc::ServerBidiReactor<v1::WorkerEvent, v1::WorkerCommand>* Join(
      grpc::CallbackServerContext* context) override;
  grpc::ServerUnaryReactor* CreateJob(grpc::CallbackServerContext* context,
                                      const v1::CreateJobRequest* request,
                                      v1::JobStatus* response) override;
  grpc::ServerBidiReactor<v1::TrainRequest, v1::StepResult>* Train(
      grpc::CallbackServerContext* context) override;
  grpc::ServerUnaryReactor* GetJob(grpc::CallbackServerContext* context,
                                   const v1::GetJobRequest* request,
                                   v1::JobStatus* response) override;
  grpc::ServerUnaryReactor* FinishJob(grpc::CallbackServerContext* context,
                                      const v1::FinishJobRequest* request,
                                      v1::JobStatus* response) override;
  grpc::ServerUnaryReactor* CancelJob(grpc::CallbackServerContext* context,
                                      const v1::CancelJobRequest* request,
                                      v1::JobStatus* response) override;
  grpc::ServerUnaryReactor* ListJobs(grpc::CallbackServerContext* context,
                                     const v1::ListJobsRequest* request,
                                     v1::ListJobsResponse* response) override;
  grpc::ServerWriteReactor<v1::StateChunk>* FetchState(
      grpc::CallbackServerContext* context, const v1::FetchStateRequest* request) override;
  grpc::ServerReadReactor<v1::PutStateRequest>* PutState(grpc::CallbackServerContext* context,
                                                         v1::PutStateResponse* response) override;

  // Where the first message of a PutState stream may store its files: the staging directory of
  // the checkpoint in progress and the files of the caller's layers (name -> layer range), or
  // FAILED_PRECONDITION / PERMISSION_DENIED / NOT_FOUND / ABORTED. Thread-safe.
  absl::StatusOr<std::pair<std::string, std::map<std::string, model::CheckpointShard>>>
  AcceptUpload(const v1::PutStateRequest& first) ABSL_LOCKS_EXCLUDED(mu_);
  grpc::ServerUnaryReactor* ListWorkers(grpc::CallbackServerContext* context,
                                        const v1::ListWorkersRequest* request,
                                        v1::ListWorkersResponse* response) override;
  grpc::ServerUnaryReactor* Checkpoint(grpc::CallbackServerContext* context,
                                       const v1::CheckpointRequest* request,
                                       v1::CheckpointResponse* response) override;

 private:
  friend class JoinReactor;
  friend class TrainReactor;

  // A registered worker (live while its Join stream is open).
  struct WorkerConn {
    v1::RegisterWorker info;
    int64_t order = 0;               // registration order.
    JoinReactor* reactor = nullptr;  // null once the stream is done.
    std::string job;                 // assigned job, empty when idle.
    int rank = -1;
  };

  // One job and the bookkeeping of its current operation.
  struct Job {
    std::string id;
    v1::JobSpec spec;  // with V and threads filled in.
    std::shared_ptr<const model::Model> model;
    schedule::Plan plan;
    std::vector<v1::ChunkSpec> chunks;
    std::vector<std::string> workers;  // [rank] worker name (kept after the job ended).
    double imbalance = 1;
    int64_t epoch = 1;
    // The secret of this epoch's data links (Assign.link_secret), new with every Assign.
    std::string link_secret;
    JobState state = JobState::kAssigning;
    std::string reason;  // why it FAILED or was CANCELLED.
    int64_t steps_done = 0;
    // The checkpoint the job started from (JobSpec.resume_from), verified at creation.
    std::string resume_dir;
    std::optional<model::CheckpointManifest> resume;
    // The staging directory of the checkpoint in progress (PutState writes there); empty when
    // none is.
    std::string checkpoint_staging;
    // The state a recovery restarts from: the last checkpoint (or the one it resumed from);
    // none: the initial weights, step 0.
    std::string restore_dir;
    std::optional<model::CheckpointManifest> restore;
    // Recoveries so far, and the one in progress (state RECOVERING).
    std::vector<v1::RecoveryEvent> recoveries;
    v1::RecoveryEvent recovering;
    absl::Time recovery_start;
    absl::Time created;
    absl::Time ended = absl::InfinitePast();  // set when it enters a terminal state.
    const void* train_owner = nullptr;        // the TrainReactor holding the job, if any.
    // With no Train stream open, the job is cancelled at this time unless a client call renews
    // it (InfiniteFuture while a stream is open or once the job ended).
    absl::Time lease_expiry = absl::InfiniteFuture();

    // Runs this job's blocking operations (null only while the job is being created).
    std::unique_ptr<OpThread> ops;

    // Current operation (one at a time, run by the job's OpThread).
    int64_t op_step = -1;
    std::vector<bool> assigned;                        // [rank]
    std::vector<int64_t> runs_sent;                    // [rank] RunSteps sent.
    std::vector<int64_t> runs_answered;                // [rank] StepDone/WorkerError received.
    std::vector<std::optional<v1::StepDone>> reports;  // [rank]
    // The last step's Commit until every rank confirmed it (Committed): its step (-1: none
    // unconfirmed), the confirmations, the deadline, and a rank's refusal. A step whose next
    // batch is already queued leaves it to be confirmed by that step, after its RunStep went
    // out (ConfirmCommit), so that the next step does not wait for a round trip.
    int64_t commit_step = -1;
    std::vector<bool> committed;  // [rank]
    absl::Time commit_deadline = absl::InfiniteFuture();
    absl::Duration commit_timeout = absl::ZeroDuration();  // for messages.
    absl::Status commit_error;
    std::vector<bool> saved;  // [rank]
    absl::Status op_error;    // first WorkerError or link failure of the operation.

    // Data links to the first and last chunk owners, by rank, for `links_epoch`. Used by the
    // job's OpThread only (never destroyed under mu_: their Shutdown may wait for a callback that
    // takes mu_).
    std::map<int, std::shared_ptr<link::PeerLink>> links;
    int64_t links_epoch = -1;
  };

  // "worker 'NAME' (rank R)".
  static std::string WorkerLabel(const std::string& name, int rank);

  void HousekeepingLoop();
  // Answers a unary call about job `id` with its status after `act` (run under mu_) returned OK,
  // or with the error of FindJob or `act`.
  grpc::ServerUnaryReactor* AnswerWithJob(grpc::CallbackServerContext* context,
                                          const std::string& id, v1::JobStatus* response,
                                          const std::function<absl::Status(Job&)>& act)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Runs `task` on job `id`'s OpThread; FAILED_PRECONDITION/NOT_FOUND if it has none or ended.
  absl::Status PostToJob(const std::string& id, std::function<void()> task)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Blocking operations. DoCreateJob runs on the admission thread and hands the assignment to
  // the new job's OpThread, which answers `done`; the others run on the job's OpThread.
  void DoCreateJob(const v1::JobSpec& spec,
                   std::function<void(absl::StatusOr<v1::JobStatus>)> done);
  absl::StatusOr<v1::JobStatus> DoAssign(Job* job);
  // `next_queued` tells whether another batch of the same stream is queued behind this one: the
  // step then returns once its Commit is sent, and the next step confirms it. It is called with
  // mu_ held, so it must take no lock ordered before mu_.
  absl::StatusOr<v1::StepResult> DoTrainStep(const v1::TrainRequest& request,
                                             const std::function<bool()>& next_queued);
  // Job thread: confirms the job's unconfirmed Commit, if any (ConfirmCommit).
  absl::Status DoConfirmCommit(const std::string& job_id) ABSL_LOCKS_EXCLUDED(mu_);
  // Job thread only, mu_ not held. Makes the job's data links to its first and last chunk
  // owners (which feed inputs and targets) open and healthy for `epoch`: drops those of another
  // epoch or that failed, dials what is missing. The dial's error if one fails.
  absl::Status EnsureFeedLinks(Job* job, int64_t epoch, const std::string& secret,
                               const std::vector<std::string>& addresses) ABSL_LOCKS_EXCLUDED(mu_);
  // Job thread only, mu_ not held. After an assignment, for a READY job: tells every rank to dial
  // its neighbours (OpenLinks) and makes EnsureFeedLinks, so that its first step does not wait
  // for the handshakes; a failure is logged (the step redials).
  void OpenLinksEarly(Job* job) ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<v1::CheckpointResponse> DoCheckpoint(const v1::CheckpointRequest& request);
  // Replaces the lost ranks of a RECOVERING job with idle workers (waiting for them up to the
  // job's replace timeout) or, past it, re-partitions it onto fewer stages (down to its
  // min_stages); a job restored from the journal is laid out anew. Bumps the epoch and assigns
  // every rank with the restore state: READY on success (and journaled), FAILED otherwise. On the
  // job's OpThread.
  void DoRecover(Job* job) ABSL_LOCKS_EXCLUDED(mu_);
  // DoRecover's work under mu_; true if the job is READY again.
  bool Reassign(Job* job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Starts recovering `job` from the loss of `name` (rank `rank`) for `cause` ("lost",
  // "deadline"): RECOVERING, the operation in flight aborted (ABORTED), DoRecover queued.
  void BeginRecovery(Job& job, const std::string& name, int rank, const std::string& cause)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends worker `name`'s registration now, as if its Join stream had broken (its job recovers or
  // fails), and closes that stream with `why`.
  void EvictWorker(const std::string& name, const std::string& cause, const std::string& why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Workers registered and idle, in registration order.
  std::vector<WorkerConn*> IdleWorkers() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Restores one journal record as a RECOVERING job (or a FAILED one saying why it cannot).
  void RestoreJob(v1::JobRecord record) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Writes job `id`'s journal record (if a journal is open and the job has not ended); a failed
  // write is logged. Takes mu_ to read the job, writes outside it.
  void JournalJob(const std::string& id) ABSL_LOCKS_EXCLUDED(mu_);
  // The last task on an ended job's OpThread: closes its data links.
  void CloseJobLinks(const std::string& id) ABSL_LOCKS_EXCLUDED(mu_);

  // Job `id` if it exists, has not ended (FAILED_PRECONDITION) and is at `epoch` (ABORTED).
  absl::StatusOr<const Job*> LiveJobAt(const std::string& id, int64_t epoch) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The rank `worker` holds in `job`: PERMISSION_DENIED unless it is a live worker of the job.
  absl::StatusOr<int> RankOf(const Job& job, const std::string& worker) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The files of `request`'s rank of its job (FetchState), or why it gets none.
  absl::Status StateFilesFor(const v1::FetchStateRequest& request, std::vector<StateFile>* files)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Reactor hooks (non-blocking).
  // Handles one event of worker `name` (empty before registration); sets *registered_name on a
  // successful RegisterWorker. Returns an error to end the stream with.
  absl::Status OnWorkerEvent(JoinReactor* reactor, std::string* name, const v1::WorkerEvent& event);
  // The Join stream of `name` is over.
  void OnWorkerGone(JoinReactor* reactor, const std::string& name);
  // Claims `job` for Train stream `owner`: NOT_FOUND, FAILED_PRECONDITION if another stream holds
  // it or the job is not ready/training.
  absl::Status ClaimJob(const std::string& job, const void* owner);
  void ReleaseJob(const std::string& job, const void* owner);

  // Helpers; `mu_` held.
  // OK if `job` is READY, else FAILED_PRECONDITION naming its state (and reason).
  static absl::Status CheckReady(const Job& job);
  // The job `id` if it exists and is ready: NOT_FOUND for an unknown job, else CheckReady's error.
  absl::StatusOr<Job*> ReadyJob(const std::string& id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The job `id`: NOT_FOUND naming it if there is none. Renews its client lease.
  absl::StatusOr<Job*> FindJob(const std::string& id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SendToRank(Job& job, int rank, const v1::WorkerCommand& command)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Each rank's StageWorker address, by rank ("" for a worker no longer registered).
  std::vector<std::string> RankAddresses(const Job& job) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AbortStep(Job& job, int64_t step, const std::string& reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Moves a job that has not ended into terminal `state` (DONE, FAILED, CANCELLED) with
  // `reason`: aborts a step in flight, sends Release to its workers and frees them, wakes its
  // waiting operation and closes its OpThread behind a task that closes its links.
  void EndJob(Job& job, JobState state, const std::string& reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FailJob(Job& job, const std::string& error) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    EndJob(job, JobState::kFailed, error);
  }
  // Waits until every rank confirmed the job's last Commit (none unconfirmed: OK at once). A
  // rank that refuses it, or has not confirmed it by the step's deadline, leaves the replicas
  // unequal: a recoverable job waits loss_grace for the others, evicts the late ones and
  // recovers (ABORTED, CheckReady's "recovering"); any other job fails. Job thread.
  absl::Status ConfirmCommit(Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Before a step's batch goes out: waits until every rank answered each RunStep it was sent
  // (an aborted attempt's answer may trail the failure the client heard). A worker answers a run
  // only after it cleaned it up (its mailbox reset after an Abort), and inputs that reached it
  // before would be dropped with the aborted run (docs/worker.md). OK at once when nothing is
  // unanswered; else DEADLINE_EXCEEDED after the step deadline, or CheckReady's error if the job
  // left READY meanwhile.
  absl::Status AwaitAbortedRuns(Job& job, int64_t mb_rows) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ranks that have not answered every RunStep they were sent, increasing.
  static std::vector<int> UnansweredRanks(const Job& job);
  // Ends a failed training step: Abort to every rank and back to READY unless the job ended.
  // Returns `status`.
  absl::Status FailStep(Job& job, int64_t step, const absl::Status& status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  v1::JobStatus StatusOf(const Job& job) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // "job 'ID' is STATE[: REASON]" for an ended job.
  static std::string EndedMessage(const Job& job);
  // What new work on an ended job gets: FAILED_PRECONDITION with EndedMessage.
  static absl::Status EndedError(const Job& job);
  // What an operation in flight gets when its job ends: CANCELLED for a cancelled job,
  // UNAVAILABLE for a failed one, FAILED_PRECONDITION for a finished one.
  static absl::Status InterruptedError(const Job& job);
  // Waits until `done` holds, the job ends, the operation has an error, the service shuts down or
  // `timeout` passes; returns the reason it stopped waiting (OK: `done`).
  // `on_wait`, if given, is called (with mu_ held) every options_.wait_report_interval while it
  // waits, with the time waited so far.
  absl::Status AwaitOp(Job& job, const std::function<bool()>& done, absl::Duration timeout,
                       const std::string& what,
                       const std::function<void(absl::Duration)>& on_wait = nullptr)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `path` (a client's checkpoint directory, named by `what`) confined to the checkpoint root.
  absl::StatusOr<std::string> CheckpointPath(const std::string& path, absl::string_view what) const;
  // StepDone's deadline for micro-batches of `mb_rows` rows (see CoordinatorOptions).
  absl::Duration StepDeadline(const Job& job, int64_t mb_rows) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Metrics hooks (server/coordinator/service_metrics.cc); no-ops without options_.metrics.
  // An applied step of `job` over `samples` samples.
  void RecordStepMetrics(const Job& job, int64_t samples, const v1::StepResult& result) const;
  // Jobs and workers by state; drops the series of jobs no longer listed.
  void RecordStateMetrics() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Writes one log line at `level` (thread-safe; never under a lock that a log sink could need).
  void Log(const std::string& message, logging::LogLevel level = logging::LogLevel::kInfo) const;
  // Cancels jobs whose lease expired and prunes ended jobs (retention); returns the OpThreads of
  // pruned jobs, to be destroyed (joined) outside mu_.
  std::vector<std::unique_ptr<OpThread>> Housekeep(absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Constant after construction.
  const CoordinatorOptions options_;
  const std::string id_prefix_;  // "job-<random hex>-": job ids are unique across restarts.

  // Protects the membership, the jobs and every Join reactor's registration (reactors take it in
  // their callbacks, never while blocking). Lock order: mu_ before any reactor's own mutex, and
  // before an OpThread's.
  mutable absl::Mutex mu_;
  std::map<std::string, WorkerConn> workers_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::unique_ptr<Job>> jobs_ ABSL_GUARDED_BY(mu_);
  int64_t next_worker_order_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t next_job_ ABSL_GUARDED_BY(mu_) = 1;
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
  // Signalled (under mu_) whenever a worker event, a lost worker, a link failure, an ended job or
  // Shutdown changes what a waiting operation looks at.
  absl::CondVar event_cv_;

  // The durable journal (OpenJournal); null without a state directory. Set once, before serving.
  std::unique_ptr<JobJournal> journal_ ABSL_GUARDED_BY(mu_);

  // Runs CreateJob's validation, worker selection and partitioning, one request at a time.
  std::unique_ptr<OpThread> admission_ = std::make_unique<OpThread>();
  // Wakes the housekeeping thread for shutdown.
  absl::Mutex housekeeping_mu_;
  bool stop_housekeeping_ ABSL_GUARDED_BY(housekeeping_mu_) = false;
  std::thread housekeeping_thread_;
};

// Sets on `builder` (of a server that registers the CoordinatorService) the ping policy that lets
// clients and workers keep their connections alive: HTTP/2 pings every 0.5 s or slower are
// accepted, with or without calls in flight and however long no data moves. gRPC's default (at
// most one ping per 5 minutes without data) answers a client's keepalive (client::ClientOptions,
// every 5 s by default) with GOAWAY "too_many_pings" during a long step. Not thread-safe (as
// the builder).
void AllowClientKeepalive(grpc::ServerBuilder& builder);

// Converts a client DenseTensor to a matrix: INVALID_ARGUMENT (naming `what`) unless its dtype is
// DTYPE_F32 (or unset, meaning it) and it is rank 2 with positive dims and exactly rows * cols * 4
// bytes.
absl::StatusOr<math::Matrix> DenseTensorToMatrix(const v1::DenseTensor& tensor,
                                                 const std::string& what);

}  // namespace pipetrain::coordinator

#endif  // PIPETRAIN_SERVER_COORDINATOR_COORDINATOR_SERVICE_H_
