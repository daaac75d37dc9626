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
//
// Liveness (ClientOptions): the channel pings the coordinator `keepalive_interval` after it last
// heard from it, also while a call waits, so a coordinator that stops answering (frozen,
// overloaded, its host or the network gone) fails every call on the connection, a Train step
// included, with UNAVAILABLE "the coordinator at HOST:PORT stopped answering (no keepalive reply
// within 5s)" — or "(what was sent to it stayed unacknowledged for 5s)" when a large request
// filled the socket — within keepalive_interval + keepalive_timeout (10 s by default). Unary calls
// also have deadlines (DEADLINE_EXCEEDED "...: the coordinator at HOST:PORT did not answer within
// 30s"); a Train step has none, since a step may legitimately take long.
#ifndef PIPETRAIN_CLIENT_SDK_CLIENT_H_
#define PIPETRAIN_CLIENT_SDK_CLIENT_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/math/tensor.h"
#include "common/net/transport_security.h"
#include "pipetrain/v1/coordinator.grpc.pb.h"
#include "pipetrain/v1/coordinator.pb.h"

namespace pipetrain::client {

// How a Client notices a coordinator that stopped answering, and how long calls may take.
// Defaults suit a coordinator on the same LAN; Check() says whether a set is usable.
struct ClientOptions {
  // How long Connect waits for the channel to be ready. Default 10 s.
  absl::Duration connect_timeout = absl::Seconds(10);
  // An HTTP/2 ping goes to the coordinator when nothing has come from it for this long, whether
  // or not a call is in flight. Default 5 s; at least 1 s (the coordinator accepts pings every half
  // second or slower, see coordinator::AllowClientKeepalive; more frequent ones would make it close
  // the connection).
  absl::Duration keepalive_interval = absl::Seconds(5);
  // A ping unanswered for this long, or data sent and unacknowledged by the coordinator's host for
  // this long (the socket's TCP_USER_TIMEOUT, which gRPC sets to it), closes the connection: every
  // call on it ends UNAVAILABLE ("stopped answering"). Default 5 s; at least 1 s.
  absl::Duration keepalive_timeout = absl::Seconds(5);
  // Deadline of GetJob, ListJobs, ListWorkers, FinishJob and CancelJob. Default 30 s.
  absl::Duration call_timeout = absl::Seconds(30);
  // Deadline of CreateJob (every worker builds, or loads from the --resume checkpoint, its layers)
  // and Checkpoint (every worker uploads its layers' files), which may take minutes for a large
  // model. Default 10 min.
  absl::Duration long_call_timeout = absl::Minutes(10);
  // Deadline of the CancelJob a ScopedJob sends when it goes out of scope unfinished. Short,
  // because the coordinator itself may be why the client stops; best effort (the coordinator's
  // client lease ends the job otherwise). Default 5 s.
  absl::Duration cleanup_timeout = absl::Seconds(5);
  // Largest gRPC message the client sends or receives (a Train batch, a step's results). Match the
  // coordinator's --max-message-size. Default 512 MiB; in [1 MiB, 2 GiB).
  int64_t max_message_bytes = int64_t{512} << 20;

  // TLS to the coordinator (docs/security.md): tls.ca_file verifies its certificate (which must
  // name the host dialled); tls.cert_file/key_file, if given, are this client's certificate.
  // Default: plaintext.
  net::TlsOptions tls;
  // Sent on every call as "authorization: Bearer <token>" when non-empty (needs `tls`): what a
  // coordinator with --auth-token-file checks (net::ResolveClientToken reads --token-file or
  // PIPETRAIN_TOKEN). Default: none.
  std::string token;

  // OK if usable; INVALID_ARGUMENT naming the field otherwise (every duration must be positive,
  // the keepalive ones at least 1 s, max_message_bytes in range; TLS files as
  // net::TlsOptions::Check; a token needs TLS).
  absl::Status Check() const;
};

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
class JobWatch;

// How a TrainSession survives its job's recovery from a lost worker (JobSpec.recover) or a
// coordinator restart (a coordinator with --state-dir). The Python client's Job does the same
// (pipetrain/client.py; both are checked against tests/client/conformance, docs/architecture.md
// "One client behaviour").
struct TrainOptions {
  // Replay: keep every batch sent since the last checkpoint (Checkpoint or CheckpointDone trims
  // them), and when a step fails because the job is recovering (ABORTED) or the coordinator went
  // away (UNAVAILABLE: crashed, restarting, or it ended the stream without answering), wait until
  // the job is READY again (polling GetJob, also while the coordinator is unreachable), resend the
  // kept batches from the step it restarted at on a new Train stream (checking each replayed loss
  // is bit for bit the first run's) and then the unanswered ones. Memory: the kept batches'
  // tensors.
  bool replay = false;
  // The job's steps done when the session starts (the step of its first batch).
  int64_t first_step = 0;
  // At most this many batches are kept, >= 1; older ones are dropped (a recovery from before them
  // then fails with FAILED_PRECONDITION). Checkpoint every N < this steps to stay within it.
  int64_t max_kept_batches = 10000;
  // Longest wait for the job to be READY again, > 0.
  absl::Duration recovery_timeout = absl::Minutes(5);
  // Longest time the coordinator may stay unreachable during that wait (a restart), > 0; past it
  // the session gives up with the UNAVAILABLE error that began the wait, saying so. Default 1 min.
  absl::Duration reconnect_timeout = absl::Minutes(1);
  // The pauses between two GetJob polls of the wait start at 20 ms and double up to this, > 0.
  // Default 200 ms: READY is noticed at most that late (a restore takes about a second).
  absl::Duration max_poll_interval = absl::Milliseconds(200);
  // Called after each recovery the session replayed through (the coordinator's record).
  std::function<void(const v1::RecoveryEvent&)> on_recovery;
  // Called for each change of shape a result reports (StepResult.shape_change: the job grew
  // before that step, or a growth failed and it kept its shape), before Receive returns it. A
  // growth takes a checkpoint (ShapeChange.checkpoint): the batches before it are no longer kept
  // for a replay, as after Checkpoint; nothing is replayed for a growth.
  std::function<void(const v1::ShapeChange&)> on_shape_change;
  // Called when the session starts waiting for a recovery, with the error that began it.
  std::function<void(const absl::Status&)> on_wait;
  // Makes each pause between two polls (empty: absl::SleepFor). A test may record the pauses
  // through it.
  std::function<void(absl::Duration)> pause;
  // Asked before each pause of the wait (empty: never): true ends the wait with CANCELLED
  // ("interrupted while waiting ..."), e.g. on Ctrl-C.
  std::function<bool()> interrupted;

  // OK if usable; INVALID_ARGUMENT naming the field otherwise.
  absl::Status Check() const;
};

// A Train session: one step per batch, in order, on a Train stream. Step() sends a batch and
// waits for its result; Send() and Receive() split the two, so that a caller may send batch k+1
// before it receives result k: the coordinator reads one batch ahead and starts step k+1 as soon
// as step k is committed, hiding the round trip between two steps (kMaxInFlight batches at most).
// A failed step (Receive's error) is applied nowhere, nor are the batches sent behind it; the job
// stays at the same step, and the next Send continues it on a new Train stream (the batches kept
// for a replay stay). A step has no deadline; a coordinator that stops answering ends it
// UNAVAILABLE through the channel's keepalive (ClientOptions). The session never cancels a stream
// it follows with another: it opens one only after the previous one ended (the coordinator ended
// it, or the session closed it in order and read its final status), so the coordinator has always
// released the job when the new one claims it. Not thread-safe (one thread drives a session); the
// Client must outlive it.
// What to generate (Client::Generate): prompts of token ids of the job's vocabulary and the
// sampling, as `pipetrain generate`'s flags (docs/inference.md, "Sampling").
struct GenerateOptions {
  std::vector<std::vector<int64_t>> prompts;  // 1 .. 64 prompts, each at least one token.
  int64_t max_tokens = 200;                   // per prompt, in [1, 4096].
  double temperature = 1.0;                   // 0: greedy.
  int64_t top_k = 0;                          // 0: the whole vocabulary.
  uint64_t seed = 0;                          // every prompt's sampler is seeded with it.
};

class TrainSession {
 public:
  // Batches that may be sent and not yet answered: the coordinator's running step and one read
  // ahead (more would wait in the connection's buffers and gain nothing).
  static constexpr int kMaxInFlight = 2;
  // A recovery may itself be interrupted by another loss: at most this many rounds of waiting and
  // replaying per call.
  static constexpr int kRecoveryRounds = 3;

  ~TrainSession();  // cancels the stream if Finish() was not called.
  TrainSession(const TrainSession&) = delete;
  TrainSession& operator=(const TrainSession&) = delete;

  // Sends `batch`, waits for and returns its step's result (Send, then Receive).
  // FAILED_PRECONDITION while batches sent by Send() are unanswered (Receive them first).
  absl::StatusOr<v1::StepResult> Step(const BatchView& batch);
  // Sends a prepared request (its job must be the session's).
  absl::StatusOr<v1::StepResult> Step(const v1::TrainRequest& request);
  // Sends `batch` without waiting for its result (Receive returns it), on a new Train stream if the
  // last one ended. FAILED_PRECONDITION when kMaxInFlight batches are unanswered or after Finish();
  // a broken stream is reported (or recovered from) by Receive.
  absl::Status Send(const BatchView& batch);
  absl::Status Send(const v1::TrainRequest& request);
  // Waits for and returns the result of the oldest unanswered batch; FAILED_PRECONDITION if none
  // is. With replay on, an ABORTED or UNAVAILABLE step is recovered from (TrainOptions.replay) and
  // answered after the replay: at most kRecoveryRounds rounds, a recoverable error of the replay
  // or of the step starting the next one; the wait's own errors end it at once: FAILED_PRECONDITION
  // if the job ended, is unknown to the coordinator (restarted without its journal), applied steps
  // whose results never arrived, or restarted before the kept batches; DEADLINE_EXCEEDED after
  // recovery_timeout; UNAVAILABLE after reconnect_timeout. DATA_LOSS if a replayed loss differs
  // from the first run's, or the job applied a batch at another step than it was sent for. On any
  // error the unanswered batches are dropped (none of them was applied after the failed one) and
  // the stream ends (closed in order if it was still open).
  absl::StatusOr<v1::StepResult> Receive();
  // Batches sent and not yet answered.
  int in_flight() const { return static_cast<int>(sent_.size()); }
  // Receives the results of the batches still unanswered (dropping them), closes the stream and
  // returns its final status (OK after successful steps; the last error if the last Receive
  // failed and no batch was sent since). Idempotent; Send fails afterwards.
  absl::Status Finish();
  // Client::Checkpoint of the job between two steps (the stream stays open): `directory`, `keep`
  // and `position` as there. With replay on, a checkpoint interrupted by a recovery (ABORTED,
  // UNAVAILABLE) is retried after the replay, as Receive retries a step; a completed one drops the
  // kept batches of the steps before it (CheckpointDone). FAILED_PRECONDITION while batches are
  // unanswered.
  absl::StatusOr<v1::CheckpointResponse> Checkpoint(
      const std::string& directory, int keep = 1,
      const std::optional<v1::DataPosition>& position = std::nullopt);
  // Client::Evaluate of the job between two steps (the stream stays open); with replay on, an
  // evaluation interrupted by a recovery is retried after the replay, as Checkpoint is.
  // FAILED_PRECONDITION while batches are unanswered.
  absl::StatusOr<v1::EvaluateResult> Evaluate(const BatchView& samples, int64_t chunk_samples = 0);
  // Client::Generate of the job between two steps (the stream stays open); with replay on, a
  // generation interrupted by a recovery is retried after the replay, as Checkpoint is.
  // FAILED_PRECONDITION while batches are unanswered.
  absl::StatusOr<v1::GenerateResult> Generate(const GenerateOptions& options);
  // A checkpoint of `steps_done` steps is complete: batches of earlier steps are dropped.
  void CheckpointDone(int64_t steps_done);
  // After another call on the job failed with `why`: if replay is on and `why` is ABORTED or
  // UNAVAILABLE, waits for the job to be READY again and replays the kept batches (rounds and
  // errors as Receive's), so that the job is back at this session's step; OK then. Returns `why`
  // itself when it is not such an error or replay is off. FAILED_PRECONDITION while batches are
  // unanswered (Receive them first).
  absl::Status AwaitRecovery(const absl::Status& why);
  // Batches kept for a replay.
  int64_t kept_batches() const { return static_cast<int64_t>(kept_.size()); }

 private:
  friend class Client;
  TrainSession(Client* client, std::string job, std::unique_ptr<grpc::ClientContext> context,
               std::unique_ptr<grpc::ClientReaderWriter<v1::TrainRequest, v1::StepResult>> stream);
  // Ends the stream after a failed read or write and returns (and remembers) its status.
  absl::Status Fail();
  // Replaces the ended stream by a new one.
  absl::Status OpenStream();
  // Ends the stream in order if it is still open: half-closes it, reads what the coordinator
  // still sends and waits for its final status.
  void CloseInOrder();
  // One request on the current stream.
  absl::StatusOr<v1::StepResult> StepOnce(const v1::TrainRequest& request);
  // The next result on the current stream.
  absl::StatusOr<v1::StepResult> ReadOnce();
  // attempt()'s value; when it fails ABORTED or UNAVAILABLE and replay is on: waits for the job
  // (AwaitReady), replays (Replay) and attempts again, at most kRecoveryRounds rounds.
  template <typename T>
  absl::StatusOr<T> ThroughRecovery(const std::function<absl::StatusOr<T>()>& attempt);
  // Polls GetJob until the job is READY again after `why`; returns its status.
  absl::StatusOr<v1::JobStatus> AwaitReady(const absl::Status& why);
  // With `job` READY at its steps_done: a new stream, the kept batches from there replayed and
  // checked, the unanswered ones resent; then on_recovery.
  absl::Status Replay(const v1::JobStatus& job, const absl::Status& why);

  // A batch kept for replay: its step (0-based), the request and the loss it gave.
  struct Kept {
    int64_t step = 0;
    v1::TrainRequest request;
    float loss = 0;
  };
  // A batch sent and not yet answered: its step (0-based) and, when replaying, the request.
  struct Sent {
    int64_t step = 0;
    v1::TrainRequest request;
  };
  TrainOptions options_;
  int64_t next_step_ = 0;  // the steps answered: the step of the oldest unanswered batch.
  std::deque<Kept> kept_;
  std::deque<Sent> sent_;  // oldest first.

  Client* const client_;
  const std::string job_;
  std::unique_ptr<grpc::ClientContext> context_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::TrainRequest, v1::StepResult>> stream_;
  absl::Status final_;     // the stream's end (or the last failed Receive's error) once done_.
  bool done_ = false;      // the stream has ended.
  bool finished_ = false;  // Finish() was called.
};

// A connection to a coordinator. Thread-safe: the stub may be used from several threads.
class Client {
 public:
  // Connects to `target` ("host:port") with `options`, waiting up to options.connect_timeout for
  // the channel to be ready. INVALID_ARGUMENT for unusable options, UNAVAILABLE if the channel is
  // not ready in time.
  static absl::StatusOr<std::unique_ptr<Client>> Connect(const std::string& target,
                                                         const ClientOptions& options = {});

  const std::string& target() const { return target_; }
  const ClientOptions& options() const { return options_; }

  // Every call below fails UNAVAILABLE when the coordinator stops answering keepalive pings and
  // DEADLINE_EXCEEDED when it does not answer within the call's deadline (call_timeout, or
  // long_call_timeout where said); both messages name the coordinator.

  // Creates a job and returns once every worker has accepted its assignment ("ready"). Deadline:
  // long_call_timeout.
  absl::StatusOr<v1::JobStatus> CreateJob(const v1::JobSpec& spec);
  // One training step on its own Train stream.
  absl::StatusOr<v1::StepResult> TrainStep(const std::string& job, const BatchView& batch);
  // Opens a Train stream for many steps. INVALID_ARGUMENT for unusable options
  // (TrainOptions::Check). The coordinator refuses a second concurrent stream of a job at its
  // first Step (FAILED_PRECONDITION).
  absl::StatusOr<std::unique_ptr<TrainSession>> StartTraining(const std::string& job,
                                                              TrainOptions options = {});
  absl::StatusOr<v1::JobStatus> GetJob(const std::string& job);
  // Ends a job that trained successfully: DONE, its workers freed. FAILED_PRECONDITION while a
  // step is in flight or once the job ended (the message names its state).
  absl::StatusOr<v1::JobStatus> FinishJob(const std::string& job);
  // Ends a job at once (a step in flight is aborted): CANCELLED with `reason`, its workers freed.
  // OK (and no change) for a job that already ended. `timeout` overrides call_timeout when
  // given.
  absl::StatusOr<v1::JobStatus> CancelJob(const std::string& job, const std::string& reason = "",
                                          absl::Duration timeout = absl::ZeroDuration());
  // Every job the coordinator knows (ended ones for its retention period), oldest first.
  absl::StatusOr<std::vector<v1::JobStatus>> ListJobs();
  absl::StatusOr<std::vector<v1::WorkerInfo>> ListWorkers();
  // Has every idle worker time the layers of `request`'s model on its own CPUs and returns each
  // one's per-layer seconds or its error (coordinator.proto, ProfileWorkers). Deadline: the
  // request's deadline_ms (0: 5 minutes) plus a minute. Errors of the call as documented there.
  absl::StatusOr<v1::ProfileWorkersResponse> ProfileWorkers(
      const v1::ProfileWorkersRequest& request);
  // Every worker writes its layers' files into `directory` (on the workers' and coordinator's
  // file system), then the coordinator writes the manifest (see docs/architecture.md). Deadline:
  // long_call_timeout.
  // `keep` (>= 1): checkpoints of `directory` kept, the newest in it and earlier ones beside it
  // (CheckpointRequest.keep). `position`: the client's data set and next batch, for the manifest
  // (CheckpointRequest.data_position). A failed Checkpoint is remembered (failed_checkpoint) until
  // one of the job succeeds or the job is finished or cancelled through this Client.
  absl::StatusOr<v1::CheckpointResponse> Checkpoint(
      const std::string& job, const std::string& directory, int keep = 1,
      const std::optional<v1::DataPosition>& position = std::nullopt);
  // Evaluates `samples` (held-out samples, checked as a training batch but any count >= 1) on
  // `job`'s committed weights with a forward-only pass over its pipeline, between two steps
  // (coordinator.proto, Evaluate): per-chunk loss sums and correct counts in chunks of
  // `chunk_samples` (0: 256, as `pipetrain evaluate`; capped as it caps it), bitwise those of
  // `pipetrain evaluate` on a checkpoint of the same weights. Changes nothing. Deadline:
  // long_call_timeout. Errors as Evaluate's (INVALID_ARGUMENT, RESOURCE_EXHAUSTED beyond 4096
  // chunks, FAILED_PRECONDITION, ABORTED while recovering, a worker's failure).
  absl::StatusOr<v1::EvaluateResult> Evaluate(const std::string& job, const BatchView& samples,
                                              int64_t chunk_samples = 0);
  // Generates options.max_tokens tokens after each of options.prompts from `job`'s committed
  // weights (a language model), decoding through its pipeline with KV caches on its workers,
  // between two steps (coordinator.proto, Generate): each prompt's tokens are those
  // `pipetrain generate --resume` gives it alone on a checkpoint of the same weights with the same
  // sampling and seed. Changes nothing. Deadline: long_call_timeout. Errors as Generate's
  // (INVALID_ARGUMENT, RESOURCE_EXHAUSTED, FAILED_PRECONDITION for a job that is not READY or not
  // a language model, ABORTED while recovering, a worker's failure).
  absl::StatusOr<v1::GenerateResult> Generate(const std::string& job,
                                              const GenerateOptions& options);
  // The directory of `job`'s last Checkpoint through this Client if it failed (its weights are
  // unsaved: ScopedJob then leaves the job running, for a retry); nullopt otherwise. Thread-safe.
  std::optional<std::string> failed_checkpoint(const std::string& job) const;
  // Follows job `job` (client/sdk/job_watch.h): its status, the events its log keeps after number
  // `after_sequence` (0: all it keeps), then each event until the job ended. No deadline (a job
  // may run for days): keepalive notices a coordinator that stops answering. Does not keep the
  // job alive. The stream's errors come from JobWatch::Next.
  absl::StatusOr<std::unique_ptr<JobWatch>> WatchJob(const std::string& job,
                                                     int64_t after_sequence = 0) const;

 private:
  friend class TrainSession;
  friend class JobWatch;
  Client(std::string target, const ClientOptions& options,
         std::unique_ptr<v1::Coordinator::Stub> stub)
      : target_(std::move(target)), options_(options), stub_(std::move(stub)) {}
  // One unary call of `method` with `timeout` as its deadline; errors as CallError.
  template <typename Request, typename Response>
  absl::StatusOr<Response> Unary(grpc::Status (v1::Coordinator::Stub::*method)(grpc::ClientContext*,
                                                                               const Request&,
                                                                               Response*),
                                 const Request& request, const char* what,
                                 absl::Duration timeout) const;
  // The absl status of a failed call `what` whose deadline was `deadline`, `timeout` after it
  // started (none by default): the coordinator's own statuses keep their message, prefixed
  // "`what`: " unless `what` is empty; a connection closed by an unanswered keepalive ping and the
  // call's own deadline say that the coordinator at target_ stopped answering, or did not answer
  // within `timeout`.
  absl::Status CallError(const grpc::Status& status, const char* what,
                         absl::Duration timeout = absl::InfiniteDuration(),
                         absl::Time deadline = absl::InfiniteFuture()) const;

  const std::string target_;
  const ClientOptions options_;
  std::unique_ptr<v1::Coordinator::Stub> stub_;
  // Guards failed_checkpoints_.
  mutable absl::Mutex mu_;
  // By job: the directory of its last Checkpoint, which failed.
  std::map<std::string, std::string> failed_checkpoints_ ABSL_GUARDED_BY(mu_);
};

// Ends a job when it goes out of scope, so that a client that stops early (an error, Ctrl-C)
// never leaves workers held until the coordinator's client lease runs out: CancelJob with the
// cancel reason and the client's cleanup_timeout unless Finish() or Cancel() ended it first —
// or the job's last Checkpoint through `client` failed (Client::failed_checkpoint): the job then
// keeps its weights for a retry of the save (`pipetrain checkpoint JOB --save DIR`, or
// Client::Checkpoint) until that client or `pipetrain cancel` ends it, or the coordinator's
// client lease does (no call naming the job for --client-lease, 5 min by default). The Python
// client's Job does the same. Not thread-safe; `client` must outlive it.
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
  // CancelJob with the cancel reason now, with `timeout` as its deadline (zero: the client's
  // call_timeout); the destructor does nothing afterwards.
  absl::Status Cancel(absl::Duration timeout = absl::ZeroDuration());

 private:
  Client* const client_;
  const std::string job_;
  std::string cancel_reason_ = "the client stopped before the job finished";
  bool ended_ = false;
};

}  // namespace pipetrain::client

#endif  // PIPETRAIN_CLIENT_SDK_CLIENT_H_
