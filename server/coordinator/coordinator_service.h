// CoordinatorService: the coordinator daemon's gRPC service (pipetrain.v1.Coordinator) —
// membership of stage workers, the job state machine and the orchestration of training steps.
//
// Threading model (docs/architecture.md):
//  - gRPC callback reactors (one per Join stream, one per Train stream, unary reactors) never
//    block: they validate and record what arrives under `mu_` and hand every blocking operation
//    (CreateJob's assignment, a training step, a checkpoint) to the job thread, a single thread
//    that runs those operations one at a time in arrival order.
//  - The job thread sends commands by queueing them on the workers' Join reactors and waits on
//    `mu_` (absl::Mutex::Await) for the events the reactors record (Assigned, StepDone,
//    Committed, ShardsSaved, WorkerError, a lost worker).
//
// Error policy of Train: a bad batch (shape, values, samples % M) ends that Train stream with
// INVALID_ARGUMENT, and a step a worker failed ends it with the worker's status after Abort was
// sent to every worker; in both cases the job stays "ready" and a new Train stream may continue
// where the last applied step left off. A lost worker (its Join stream broke) fails the job
// ("failed" with the reason; recovery is future work) and releases its other workers.
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
#include "common/model/model.h"
#include "common/schedule/ir.h"
#include "pipetrain/v1/coordinator.grpc.pb.h"
#include "pipetrain/v1/coordinator.pb.h"
#include "server/worker/peer_link.h"

namespace pipetrain::coordinator {

struct CoordinatorOptions {
  // Options of the data links the coordinator opens to the first and last chunk owners.
  worker::LinkOptions link;
  // Longest wait for every worker's Assigned after Assign. Default 2 minutes.
  absl::Duration assign_timeout = absl::Minutes(2);
  // Longest wait for a step's StepDone (or Committed, ShardsSaved) from every worker. A lost
  // worker is detected sooner by its broken Join stream. Default 30 minutes.
  absl::Duration step_timeout = absl::Minutes(30);
};

class JoinReactor;
class TrainReactor;

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
  // accepting work; operations queued afterwards fail with CANCELLED. Idempotent.
  void Shutdown();

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
    std::vector<std::string> workers;  // [rank] worker name.
    double imbalance = 1;
    int64_t epoch = 1;
    std::string state = "assigning";  // assigning | ready | training | failed
    std::string error;
    int64_t steps_done = 0;
    const void* train_owner = nullptr;  // the TrainReactor holding the job, if any.

    // Current operation (one at a time, run by the job thread).
    int64_t op_step = -1;
    std::vector<bool> assigned;                        // [rank]
    std::vector<int64_t> runs_sent;                    // [rank] RunSteps sent.
    std::vector<int64_t> runs_answered;                // [rank] StepDone/WorkerError received.
    std::vector<std::optional<v1::StepDone>> reports;  // [rank]
    std::vector<bool> committed;                       // [rank]
    std::vector<bool> saved;                           // [rank]
    absl::Status op_error;  // first WorkerError or link failure of the operation.

    // Data links to the first and last chunk owners, by rank, for `links_epoch`. Used by the
    // job thread only (never destroyed under mu_: their Shutdown may wait for a callback that
    // takes mu_).
    std::map<int, std::shared_ptr<worker::PeerLink>> links;
    int64_t links_epoch = -1;
  };

  // Queues `task` on the job thread.
  void Post(std::function<void()> task);
  void JobThreadLoop();
  bool HasTaskOrStop() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(queue_mu_) {
    return stop_thread_ || !queue_.empty();
  }

  // Shuts down the data links of failed jobs (job thread only; takes mu_).
  void CloseLinksOfFailedJobs() ABSL_LOCKS_EXCLUDED(mu_);

  // Blocking operations, run on the job thread.
  absl::StatusOr<v1::JobStatus> DoCreateJob(const v1::JobSpec& spec);
  absl::StatusOr<v1::StepResult> DoTrainStep(const v1::TrainRequest& request);
  absl::StatusOr<v1::CheckpointResponse> DoCheckpoint(const v1::CheckpointRequest& request);

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
  // OK if `job` is "ready", else FAILED_PRECONDITION naming its state (and error).
  static absl::Status CheckReady(const Job& job);
  // The job `id` if it exists and is ready: NOT_FOUND for an unknown job, else CheckReady's error.
  absl::StatusOr<Job*> ReadyJob(const std::string& id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SendToRank(Job& job, int rank, const v1::WorkerCommand& command)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AbortStep(Job& job, int64_t step, const std::string& reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FailJob(Job& job, const std::string& error) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends a failed training step: Abort to every rank and back to "ready" unless the job failed.
  // Returns `status`.
  absl::Status FailStep(Job& job, int64_t step, const absl::Status& status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  v1::JobStatus StatusOf(const Job& job) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Waits until `done` holds, the job fails, the operation has an error, the service shuts down or
  // `timeout` passes; returns the reason it stopped waiting (OK: `done`).
  absl::Status AwaitOp(Job& job, const std::function<bool()>& done, absl::Duration timeout,
                       const std::string& what) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Constant after construction.
  const CoordinatorOptions options_;

  // Protects the membership, the jobs and every Join reactor's registration (reactors take it in
  // their callbacks, never while blocking). Lock order: mu_ before any reactor's own mutex.
  mutable absl::Mutex mu_;
  std::map<std::string, WorkerConn> workers_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::unique_ptr<Job>> jobs_ ABSL_GUARDED_BY(mu_);
  int64_t next_worker_order_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t next_job_ ABSL_GUARDED_BY(mu_) = 1;
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
  // Signalled (under mu_) whenever a worker event, a lost worker, a link failure or Shutdown
  // changes what a waiting operation looks at.
  absl::CondVar event_cv_;

  // Protects the job thread's queue.
  absl::Mutex queue_mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(queue_mu_);
  bool stop_thread_ ABSL_GUARDED_BY(queue_mu_) = false;
  std::thread job_thread_;
};

// Converts a client DenseTensor to a matrix: INVALID_ARGUMENT (naming `what`) unless it is rank 2
// with positive dims and exactly rows * cols * 4 bytes.
absl::StatusOr<math::Matrix> DenseTensorToMatrix(const v1::DenseTensor& tensor,
                                                 const std::string& what);

}  // namespace pipetrain::coordinator

#endif  // PIPETRAIN_SERVER_COORDINATOR_COORDINATOR_SERVICE_H_
