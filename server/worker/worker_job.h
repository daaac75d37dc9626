// WorkerJob: one (job, generation) assignment on a stage worker — its model chunks, step executor,
// compute thread and data-plane links — and JobHost, what it needs from the daemon running it.
//
// Threads: the daemon's command thread creates and drives a WorkerJob (Create, OnRunStep,
// OnCommit, OnAbort, OnSaveShards, OnLinkFailed, Stop); Accept runs on gRPC threads; the
// executor, Send (the Sender) and the posted tasks run on the job's own compute thread.
#ifndef PIPETRAIN_SERVER_WORKER_WORKER_JOB_H_
#define PIPETRAIN_SERVER_WORKER_WORKER_JOB_H_

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <deque>
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
#include "common/math/isa.h"
#include "common/math/optimizer.h"
#include "common/model/checkpoint.h"
#include "common/model/model.h"
#include "common/schedule/ir.h"
#include "common/wire/tensor_key.h"
#include "pipetrain/v1/coordinator.pb.h"
#include "pipetrain/v1/worker_control.grpc.pb.h"
#include "pipetrain/v1/worker_control.pb.h"
#include "server/link/peer_link.h"
#include "server/logging/log_level.h"
#include "server/worker/compute_pacer.h"
#include "server/worker/executor.h"
#include "server/worker/link_span_log.h"
#include "server/worker/mailbox.h"

namespace pipetrain::metrics {
class WorkerMetrics;
}  // namespace pipetrain::metrics

namespace pipetrain::worker {

// The name a data-parallel replica's worker gives itself, and its peers, on the Exchange streams
// of the gradient reduction over the replicas: "replica/<q>" (PeerHello.peer, StepDone.links).
inline constexpr char kReplicaPeerPrefix[] = "replica/";

// What a WorkerJob needs from the daemon that runs it. Every method is thread-safe and never
// blocks on the network.
class JobHost {
 public:
  virtual ~JobHost() = default;
  // Queues `event` on the current control stream (dropped when there is none).
  virtual void Emit(v1::WorkerEvent event) = 0;
  // Writes one log line at `level`.
  virtual void Log(absl::string_view message,
                   logging::LogLevel level = logging::LogLevel::kInfo) const = 0;
  // A data link of (job, generation) failed; called on any thread. The daemon answers by calling
  // WorkerJob::OnLinkFailed on its command thread if the job is still current.
  virtual void LinkFailed(const std::string& job, int64_t generation, const absl::Status& status,
                          bool coordinator_link) = 0;
  // The coordinator's stub (for FetchState) and this worker's registered name.
  virtual v1::WorkerControl::Stub* coordinator() = 0;
  virtual const std::string& name() const = 0;
  // The coordinator's "host:port", for messages.
  virtual std::string coordinator_address() const { return "the coordinator"; }

  // Logs `status` and emits it as a WorkerError of (job, generation, step).
  void EmitError(const std::string& job, int64_t generation, int64_t step,
                 const absl::Status& status);
};

// How the daemon runs its jobs (constant for the daemon's life).
struct WorkerJobOptions {
  // > 0: pace every action to FLOPs / rate (ComputePacer); 0: off.
  double emulate_gflops = 0;
  // Upper bound on Assign.threads (>= 1).
  int threads_max = 1;
  // Options of every Exchange stream.
  link::LinkOptions link;
  // Connections per link this job dials (1..link::kMaxLinkConnections); 0: automatic,
  // link::AutoLinkConnections(hardware threads, the job's compute threads).
  int link_connections = 0;
  // Prometheus metrics to record after every step (busy time, links, mailbox, stash); null: none.
  std::shared_ptr<metrics::WorkerMetrics> metrics;
  // Largest tensor accepted on an Exchange stream (FrameValidation::max_tensor_bytes).
  int64_t max_tensor_bytes = int64_t{512} << 20;
  // Credentials of the Exchange channels this job dials (its higher-rank neighbours): TLS with
  // this worker's certificate under mTLS. Null: plaintext.
  std::shared_ptr<grpc::ChannelCredentials> link_credentials;
  // The highest instruction-set level this worker runs jobs at (--max-isa); none: any this CPU
  // runs. An Assign at a level above it, or one this CPU lacks, is FAILED_PRECONDITION.
  std::optional<math::Isa> max_isa;
};

// Defined in worker_job.cc (creation, life cycle, commands), worker_job_links.cc (the Exchange
// streams it accepts and dials, routing, link failures) and worker_job_metrics.cc.
class WorkerJob final : public Sender {
 public:
  // Validates `assign` (INVALID_ARGUMENT naming the field: ranks, chunk tiling, actions, model,
  // optimizer, threads) and builds the job with its compute thread running; with
  // `assign.restore`, first fetches its chunks' checkpoint files from the coordinator and loads
  // them (FetchState's errors). `host` must outlive the job. Blocks while fetching.
  static absl::StatusOr<std::shared_ptr<WorkerJob>> Create(const v1::Assign& assign,
                                                           const WorkerJobOptions& options,
                                                           JobHost* host);
  ~WorkerJob() override { Stop("job dropped"); }
  WorkerJob(const WorkerJob&) = delete;
  WorkerJob& operator=(const WorkerJob&) = delete;

  const std::string& id() const { return job_; }
  int64_t generation() const { return generation_; }

  // Aborts the running step, joins the compute thread and closes every link. Idempotent; not
  // from a gRPC callback or the compute thread.
  void Stop(absl::string_view why);

  // An Exchange stream opened to this worker for this job (gRPC threads): from the coordinator
  // (inputs/targets), a lower-rank neighbour, or the worker of this rank in a lower replica that
  // the reduction over the replicas pairs with this one (AllReducePartner). ABORTED for another
  // job or generation, UNAUTHENTICATED without the generation's link secret,
  // FAILED_PRECONDITION for a peer that has no business here.
  absl::StatusOr<link::LinkSettings> Accept(const link::PeerHello& hello,
                                            std::unique_ptr<link::PeerLink> link);

  // Commands of this (job, generation), from the command thread.
  // Dials the higher-rank neighbours unless done already (OpenLinks, or the first RunStep).
  void OnOpenLinks();
  void OnRunStep(const v1::RunStep& run);
  void OnCommit(const v1::Commit& commit);
  void OnAbort(const v1::Abort& abort);
  void OnSaveShards(const v1::SaveShards& save);
  // An evaluation's forward-only pass (server/worker/worker_job_eval.cc): counted and aborted as
  // a RunStep is (Abort names its step), answered by EvalDone or WorkerError.
  void OnEvalRun(const v1::EvalRun& run);
  // A decode round of a Generate request (server/worker/worker_job_generate.cc): opens, runs and
  // closes the request's KV caches (StepExecutor::StartDecode, RunDecode, EndDecode); counted and
  // aborted as a RunStep is, answered by GenDone or WorkerError. A failed round frees the caches.
  void OnGenRun(const v1::GenRun& run);
  // A link of this job failed (reported through JobHost::LinkFailed). `coordinator_link`: the
  // coordinator's feed stream, which does not break the generation.
  void OnLinkFailed(const absl::Status& status, bool coordinator_link);

  // Sender: routes an outgoing tensor to this worker's mailbox or the owner's link (compute
  // thread). Never blocks on the network; a failure aborts the mailbox (so the step fails).
  void Send(const wire::TensorKey& key, math::Matrix tensor) override;

 private:
  // Compute thread, after a successful run: returns once every tensor handed to the peer links
  // is written out (none pending for a peer's stream or queued, no write in flight), so that this
  // worker's StepDone never overtakes data its peers still wait for — a worker stopped (SIGSTOP,
  // a stalled host) right after its StepDone would otherwise strand them, and the coordinator
  // would blame the peer that waits. Returns early once a link failed, the links are closed, run
  // `run_index` was aborted or the job is stopping.
  void FlushPeerLinks(int64_t run_index) ABSL_LOCKS_EXCLUDED(links_mu_, state_mu_, compute_mu_);

  struct PeerSlot {
    std::unique_ptr<link::PeerLink> link;  // null until dialled or accepted.
    std::vector<std::pair<wire::TensorKey, std::shared_ptr<const math::Matrix>>> pending;
  };

  WorkerJob(const v1::Assign& assign, const WorkerJobOptions& options, JobHost* host);

  // Steps of Create (server/worker/worker_job.cc), before the compute thread runs.
  // Builds the Stage of every chunk this rank holds and records this rank's checkpoint files
  // (shards_) and neighbours (higher_peers_, lower_peers_). INVALID_ARGUMENT (AssignError) if a
  // Stage cannot be built or the rank holds no chunk.
  absl::StatusOr<std::vector<OwnedChunk>> BuildChunks(const math::OptimizerConfig& optimizer);
  // For a tied embedding whose ends are on two ranks, each of them is the other's peer (the
  // gradient exchange, server/worker/gradient_exchange.h): adds it to higher_peers_ or
  // lower_peers_.
  void AddTiePeer();
  // With replicas: the workers of this rank in the replicas the reduction pairs this one with
  // (replica XOR 2^k), as peers ReplicaPeer(q) in higher_peers_ (q > replica: dialled) or
  // lower_peers_ (accepted).
  void AddReplicaPeers();
  // Peer ids: a stage peer is its rank, replica q's worker of this rank is stages + q.
  int ReplicaPeer(int q) const { return assign_.stages() + q; }
  bool IsReplicaPeer(int peer) const { return peer >= assign_.stages(); }
  // "coordinator" (peer < 0), "stage/<rank>" or "replica/<q>".
  std::string PeerName(int peer) const;
  // The peer id named by a PeerHello's `peer` ("stage/<rank>", "replica/<q>"), -1 if neither.
  int ParsePeer(absl::string_view name) const;
  // Adds `peer` (a rank other than this one; -1: none) to higher_peers_ or lower_peers_.
  void AddPeer(int peer);
  // With two copies of the stages (JobPlan::two_copies): the rank holding the other copies of
  // this rank's stages (S-1-rank), the peer of the copy gradient exchange; -1 otherwise.
  int CopyPeer() const;
  // The kinds a stream with stage peer `peer_rank` carries: activations and gradients, and the
  // tied gradient when a tied embedding's ends are on this rank and that peer, and the copy
  // gradient when that peer holds the other copies of this rank's stages (CopyPeer); with a
  // replica peer, replica gradients only.
  uint32_t StageLinkKinds(int peer_rank) const;
  // Configures the pacer (if any), makes a PeerSlot per neighbour, sets the job's Eigen threads
  // and starts the compute thread.
  void Launch() ABSL_LOCKS_EXCLUDED(links_mu_);

  // Metrics hooks (server/worker/worker_job_metrics.cc); no-ops without options_.metrics.
  // After a successful step: busy time per action kind, links, mailbox, stashed bytes.
  void RecordStepMetrics(const StepReport& report) ABSL_LOCKS_EXCLUDED(links_mu_);
  // Adds every link's traffic since the last call; with `forget`, for the last time.
  void RecordLinkMetrics(bool forget) ABSL_EXCLUSIVE_LOCKS_REQUIRED(links_mu_);

  // The address of link peer `peer` ("coordinator" or "stage/R"), for messages.
  std::string PeerAddress(const std::string& peer) const;
  // Runs `task` on the compute thread after the tasks posted before it.
  void Post(std::function<void()> task);
  // The compute thread: runs the posted tasks in order until Stop.
  void ComputeLoop() ABSL_LOCKS_EXCLUDED(compute_mu_);

  // Steps of Accept (server/worker/worker_job_links.cc).
  // ABORTED for another job or generation, UNAUTHENTICATED without the generation's link secret.
  absl::Status CheckHello(const link::PeerHello& hello) const;
  // The coordinator's feed stream: FAILED_PRECONDITION if this rank holds neither the first nor
  // the last chunk; otherwise AddCoordinatorLinkLocked's errors. Shuts down the streams that
  // ended, outside links_mu_.
  absl::StatusOr<link::LinkSettings> AcceptCoordinator(std::unique_ptr<link::PeerLink> link)
      ABSL_LOCKS_EXCLUDED(links_mu_);
  // Keeps `*link` as a coordinator stream and moves the ended ones to `*ended`. Takes `*link`
  // only when it succeeds: a refused link must be destroyed outside links_mu_ (~PeerLink waits
  // for the link's callbacks, which take it). ABORTED once the job is closed,
  // RESOURCE_EXHAUSTED beyond kMaxCoordinatorLinks live streams.
  absl::Status AddCoordinatorLinkLocked(std::unique_ptr<link::PeerLink>* link,
                                        std::vector<std::unique_ptr<link::PeerLink>>* ended)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(links_mu_);
  // A lower-rank neighbour's stream: takes its slot and sends it the tensors waiting for it.
  // FAILED_PRECONDITION for a peer that is not a lower-rank neighbour or already has a stream,
  // ABORTED once the job is closed.
  absl::StatusOr<link::LinkSettings> AcceptNeighbour(const link::PeerHello& hello,
                                                     std::unique_ptr<link::PeerLink> link)
      ABSL_LOCKS_EXCLUDED(links_mu_);

  // Receive settings for a stream carrying `kinds` from `peer_rank` (-1: the coordinator).
  link::LinkSettings SettingsFor(uint32_t kinds, int peer_rank);
  // Validates the ownership of a received key and puts it into the mailbox.
  absl::Status Deliver(int peer_rank, const wire::TensorKey& key, math::Matrix tensor);
  // Link `peer` failed (any thread): a stage link breaks the generation (the mailbox is aborted and
  // broken_ set); either way it is logged and reported to the host. Nothing once closed.
  void LinkFailed(const std::string& peer, const absl::Status& status)
      ABSL_LOCKS_EXCLUDED(links_mu_);
  // Dials every higher-rank neighbour (command thread); a failed dial is a LinkFailed.
  void DialPeers() ABSL_LOCKS_EXCLUDED(links_mu_);
  void Emit(v1::WorkerEvent event) { host_->Emit(std::move(event)); }
  void EmitError(int64_t step, const absl::Status& status) {
    host_->EmitError(job_, generation_, step, status);
  }

  // Constant after Create.
  JobHost* const host_;
  const WorkerJobOptions options_;
  const v1::Assign assign_;
  std::string job_;
  int64_t generation_ = 0;
  int rank_ = 0;
  int num_chunks_ = 0;
  int microbatches_ = 0;
  int replica_ = 0;  // this worker's replica, of replicas_ (Assign.replica, replicas).
  int replicas_ = 1;
  std::vector<std::string> replica_addresses_;   // [q]: this rank's worker in replica q.
  std::vector<int> owner_;                       // [chunk] -> rank.
  bool two_copies_ = false;                      // JobPlan::two_copies: bidirectional DualPipe.
  std::vector<int> higher_peers_, lower_peers_;  // peer ids (PeerName), dialled / accepted.
  std::vector<schedule::Action> actions_;
  std::unique_ptr<model::Model> model_;
  std::vector<model::CheckpointShard> shards_;  // this worker's layer files.

  // --emulate-gflops (null when off); before the mailbox, which reports waits to it.
  const std::unique_ptr<ComputePacer> pacer_;
  Mailbox mailbox_;                         // thread-safe.
  LinkSpanLog link_spans_;                  // thread-safe; for StepDone.links.
  std::unique_ptr<StepExecutor> executor_;  // compute thread only (after Create).

  // Command thread only.
  bool dialled_ = false;
  int64_t requested_step_ = -1;  // latest RunStep received.
  int64_t requested_runs_ = 0;   // RunSteps received.

  // Compute thread only.
  bool step_ok_ = false;  // the last RunStep succeeded and awaits Commit or Abort.
  int64_t ran_step_ = -1;

  // Protects the compute thread's queue and stop flag.
  absl::Mutex compute_mu_;
  std::deque<std::function<void()>> compute_queue_ ABSL_GUARDED_BY(compute_mu_);
  bool compute_stop_ ABSL_GUARDED_BY(compute_mu_) = false;
  std::thread compute_thread_;

  // Protects the links, tensors waiting for a link, and the link-failure state.
  absl::Mutex links_mu_;
  std::map<int, PeerSlot> peers_ ABSL_GUARDED_BY(links_mu_);
  std::vector<std::unique_ptr<link::PeerLink>> coordinator_links_ ABSL_GUARDED_BY(links_mu_);
  // Most live coordinator streams a job accepts (one, and its replacement while the old one's
  // failure is still being noticed here).
  static constexpr size_t kMaxCoordinatorLinks = 2;
  absl::Status broken_ ABSL_GUARDED_BY(links_mu_);  // first link failure of this generation.
  bool closed_ ABSL_GUARDED_BY(links_mu_) = false;

  // Protects the call of a checkpoint upload in progress, so that Stop can cancel it.
  absl::Mutex upload_mu_;
  grpc::ClientContext* upload_context_ ABSL_GUARDED_BY(upload_mu_) = nullptr;
  bool stopping_ ABSL_GUARDED_BY(upload_mu_) = false;

  // Protects the step flags read by the command thread when a link fails.
  absl::Mutex state_mu_;
  int64_t finished_runs_ ABSL_GUARDED_BY(state_mu_) = 0;  // RunSteps the compute thread ended.
  int64_t aborted_run_ ABSL_GUARDED_BY(state_mu_) = 0;    // run (1-based) the coordinator aborted.
  bool last_step_failed_ ABSL_GUARDED_BY(state_mu_) = false;
};

}  // namespace pipetrain::worker

#endif  // PIPETRAIN_SERVER_WORKER_WORKER_JOB_H_
