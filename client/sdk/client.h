// The pipetrain client SDK: a small synchronous C++ API over the coordinator's client RPCs.
//
//   PT_ASSIGN_OR_RETURN(auto client, client::Client::Connect("127.0.0.1:7070"));
//   PT_ASSIGN_OR_RETURN(v1::JobStatus job, client->CreateJob(spec));
//   PT_ASSIGN_OR_RETURN(auto session, client->StartTraining(job.job()));
//   for (...) { PT_ASSIGN_OR_RETURN(v1::StepResult r, session->Step(batch)); }
//   PT_RETURN_IF_ERROR(session->Finish());
//   PT_RETURN_IF_ERROR(client->FinishJob(job.job()).status());  // frees the workers
//
// Results are the wire messages of coordinator.proto (StepResult, JobStatus, WorkerInfo): the
// SDK is the client's edge. Errors are the coordinator's statuses (see coordinator.proto and
// docs/architecture.md): INVALID_ARGUMENT for a bad spec or batch, FAILED_PRECONDITION for too few
// workers or a second Train stream, NOT_FOUND for an unknown job, UNAVAILABLE when the
// coordinator cannot be reached or a worker was lost.
#ifndef PIPETRAIN_CLIENT_SDK_CLIENT_H_
#define PIPETRAIN_CLIENT_SDK_CLIENT_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/math/tensor.h"
#include "pipetrain/v1/coordinator.grpc.pb.h"
#include "pipetrain/v1/coordinator.pb.h"

namespace pipetrain::client {

// One training batch: `samples` samples whose rows are inputs [samples * tokens_per_sample,
// input_features] and targets [samples * tokens_per_sample, target_features] (io::Batch's form).
struct BatchView {
  const math::Matrix* inputs = nullptr;
  const math::Matrix* targets = nullptr;
  int64_t samples = 0;
};

// The TrainRequest of `batch` for `job` (copies the tensors' bytes).
v1::TrainRequest MakeTrainRequest(const std::string& job, const BatchView& batch);

class Client;

// How a TrainSession survives its job's recovery from a lost worker (JobSpec.recover).
struct TrainOptions {
  // Replay: keep every batch sent since the last checkpoint (CheckpointDone trims them), and
  // when a step fails because the job is recovering (ABORTED), wait until it is READY again,
  // resend the kept batches from the step it restarted at (checking each replayed loss is bit
  // for bit the first run's) and then the failed one. Memory: the kept batches' tensors.
  bool replay = false;
  // The job's steps done when the session starts (the step of its first batch).
  int64_t first_step = 0;
  // At most this many batches are kept; older ones are dropped (a recovery from before them
  // then fails with FAILED_PRECONDITION). Checkpoint every N < this steps to stay within it.
  int64_t max_kept_batches = 10000;
  // Longest wait for the job to be READY again.
  absl::Duration recovery_timeout = absl::Minutes(5);
  // Called after each recovery the session replayed through (the coordinator's record).
  std::function<void(const v1::RecoveryEvent&)> on_recovery;
};

// A Train stream: one step per Step() call, in order. A failed step ends the stream (its status is
// returned, and every later call returns it too); the job stays usable and a new session may be
// started. Not thread-safe (one thread drives a session); the Client must outlive it.
class TrainSession {
 public:
  ~TrainSession();  // cancels the stream if Finish() was not called.
  TrainSession(const TrainSession&) = delete;
  TrainSession& operator=(const TrainSession&) = delete;

  // Sends `batch`, waits for and returns its step's result.
  absl::StatusOr<v1::StepResult> Step(const BatchView& batch);
  // Sends a prepared request (its job must be the session's).
  absl::StatusOr<v1::StepResult> Step(const v1::TrainRequest& request);
  // Closes the stream and returns its final status (OK after successful steps). Idempotent.
  absl::Status Finish();
  // A checkpoint of `steps_done` steps is complete: batches of earlier steps are dropped.
  void CheckpointDone(int64_t steps_done);
  // Batches kept for a replay.
  int64_t kept_batches() const { return static_cast<int64_t>(kept_.size()); }

 private:
  friend class Client;
  TrainSession(std::string job, std::unique_ptr<grpc::ClientContext> context,
               std::unique_ptr<grpc::ClientReaderWriter<v1::TrainRequest, v1::StepResult>> stream);
  // Ends the stream after a failed read or write and returns (and remembers) its status.
  absl::Status Fail();
  // One request on the current stream.
  absl::StatusOr<v1::StepResult> StepOnce(const v1::TrainRequest& request);
  // After an ABORTED step: waits for the job, reopens the stream, replays, resends `request`.
  absl::StatusOr<v1::StepResult> Recover(const v1::TrainRequest& request);

  // A batch kept for replay: its step (0-based), the request and the loss it gave.
  struct Kept {
    int64_t step = 0;
    v1::TrainRequest request;
    float loss = 0;
  };
  Client* client_ = nullptr;  // set by Client::StartTraining.
  TrainOptions options_;
  int64_t next_step_ = 0;  // the step of the next new batch.
  std::deque<Kept> kept_;

  const std::string job_;
  std::unique_ptr<grpc::ClientContext> context_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::TrainRequest, v1::StepResult>> stream_;
  absl::Status final_;  // set once the stream is over.
  bool done_ = false;
};

// A connection to a coordinator. Thread-safe: the stub may be used from several threads.
class Client {
 public:
  // Connects to `target` ("host:port"), waiting up to `timeout` for the channel to be ready.
  // UNAVAILABLE if it is not.
  static absl::StatusOr<std::unique_ptr<Client>> Connect(
      const std::string& target, absl::Duration timeout = absl::Seconds(10));

  // Creates a job and returns once every worker has accepted its assignment ("ready").
  absl::StatusOr<v1::JobStatus> CreateJob(const v1::JobSpec& spec);
  // One training step on its own Train stream.
  absl::StatusOr<v1::StepResult> TrainStep(const std::string& job, const BatchView& batch);
  // Opens a Train stream for many steps. The coordinator refuses a second concurrent stream of a
  // job at its first Step (FAILED_PRECONDITION).
  absl::StatusOr<std::unique_ptr<TrainSession>> StartTraining(const std::string& job,
                                                              TrainOptions options = {});
  absl::StatusOr<v1::JobStatus> GetJob(const std::string& job);
  // Ends a job that trained successfully: DONE, its workers freed. FAILED_PRECONDITION while a
  // step is in flight or once the job ended (the message names its state).
  absl::StatusOr<v1::JobStatus> FinishJob(const std::string& job);
  // Ends a job at once (a step in flight is aborted): CANCELLED with `reason`, its workers freed.
  // OK (and no change) for a job that already ended.
  absl::StatusOr<v1::JobStatus> CancelJob(const std::string& job, const std::string& reason = "");
  // Every job the coordinator knows (ended ones for its retention period), oldest first.
  absl::StatusOr<std::vector<v1::JobStatus>> ListJobs();
  absl::StatusOr<std::vector<v1::WorkerInfo>> ListWorkers();
  // Every worker writes its layers' files into `directory` (on the workers' and coordinator's
  // file system), then the coordinator writes the manifest (see docs/architecture.md).
  absl::StatusOr<v1::CheckpointResponse> Checkpoint(const std::string& job,
                                                    const std::string& directory);

 private:
  friend class TrainSession;
  explicit Client(std::unique_ptr<v1::Coordinator::Stub> stub) : stub_(std::move(stub)) {}
  std::unique_ptr<v1::Coordinator::Stub> stub_;
};

// Ends a job when it goes out of scope, so that a client that stops early (an error, Ctrl-C)
// never leaves workers held until the coordinator's client lease runs out: CancelJob with the
// cancel reason unless Finish() ended it first. Not thread-safe; `client` must outlive it.
class ScopedJob {
 public:
  ScopedJob(Client* client, std::string job) : client_(client), job_(std::move(job)) {}
  ~ScopedJob();
  ScopedJob(const ScopedJob&) = delete;
  ScopedJob& operator=(const ScopedJob&) = delete;

  const std::string& job() const { return job_; }
  // The reason the destructor gives CancelJob. Default "the client stopped before the job
  // finished".
  void set_cancel_reason(std::string reason) { cancel_reason_ = std::move(reason); }
  // FinishJob (DONE). Returns its status; the destructor does nothing afterwards.
  absl::Status Finish();
  // CancelJob with the cancel reason now; the destructor does nothing afterwards.
  absl::Status Cancel();

 private:
  Client* const client_;
  const std::string job_;
  std::string cancel_reason_ = "the client stopped before the job finished";
  bool ended_ = false;
};

}  // namespace pipetrain::client

#endif  // PIPETRAIN_CLIENT_SDK_CLIENT_H_
