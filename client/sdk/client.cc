#include "client/sdk/client.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/util/status_macros.h"
#include "common/wire/grpc_status.h"

namespace pipetrain::client {
namespace {

void ToDense(const math::Matrix& m, v1::DenseTensor* out) {
  out->add_shape(m.rows());
  out->add_shape(m.cols());
  out->set_dtype(v1::DTYPE_F32);
  out->set_data(reinterpret_cast<const char*>(m.data()),
                static_cast<size_t>(m.size()) * sizeof(float));
}

// Milliseconds of `d` as a gRPC channel argument (which is an int).
int Millis(absl::Duration d) {
  return static_cast<int>(std::min<int64_t>(absl::ToInt64Milliseconds(d), INT32_MAX));
}

// Why gRPC closed the connection under a failed call, if it was because the coordinator stopped
// answering, in words that follow "stopped answering (" given the keepalive timeout `timeout`; ""
// for any other status (the coordinator's own ones included). gRPC 1.51 reports an unanswered
// keepalive ping as UNAVAILABLE "keepalive watchdog timeout" and data left unacknowledged for the
// keepalive timeout (its TCP_USER_TIMEOUT, e.g. a large batch the frozen coordinator no longer
// reads) as UNAVAILABLE "recvmsg:Connection timed out".
std::string StoppedAnsweringReason(const grpc::Status& status, absl::Duration timeout) {
  if (status.error_code() != grpc::StatusCode::UNAVAILABLE) return "";
  const std::string& message = status.error_message();
  if (absl::StrContains(message, "keepalive")) {
    return absl::StrCat("no keepalive reply within ", absl::FormatDuration(timeout));
  }
  if (absl::StrContains(message, "Connection timed out") &&
      !absl::StrContains(message, "failed to connect")) {
    return absl::StrCat("what was sent to it stayed unacknowledged for ",
                        absl::FormatDuration(timeout));
  }
  return "";
}

// Errors after which a replaying session waits for its job: ABORTED (the job is recovering) and
// UNAVAILABLE (the coordinator or the connection went away; a coordinator restarted with its
// journal continues the job).
bool Recoverable(const absl::Status& status) {
  return absl::IsAborted(status) || absl::IsUnavailable(status);
}

}  // namespace

absl::Status ClientOptions::Check() const {
  const std::pair<const char*, absl::Duration> timeouts[] = {
      {"connect_timeout", connect_timeout},
      {"call_timeout", call_timeout},
      {"long_call_timeout", long_call_timeout},
      {"cleanup_timeout", cleanup_timeout}};
  for (const auto& [name, value] : timeouts) {
    if (value <= absl::ZeroDuration()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "ClientOptions.", name, " must be positive, got ", absl::FormatDuration(value)));
    }
  }
  if (keepalive_interval < absl::Seconds(1) || keepalive_timeout < absl::Seconds(1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ClientOptions.keepalive_interval and keepalive_timeout must be at least 1s, got ",
        absl::FormatDuration(keepalive_interval), " and ",
        absl::FormatDuration(keepalive_timeout)));
  }
  if (max_message_bytes < (int64_t{1} << 20) || max_message_bytes > INT32_MAX) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ClientOptions.max_message_bytes must be in [1 MiB, 2 GiB), got ", max_message_bytes));
  }
  PT_RETURN_IF_ERROR(tls.Check(/*need_identity=*/false));
  if (!token.empty() && !tls.enabled()) {
    return absl::InvalidArgumentError(
        "a token is sent only over TLS: give --tls-ca (the CA of the coordinator's certificate)");
  }
  return absl::OkStatus();
}

v1::TrainRequest MakeTrainRequest(const std::string& job, const BatchView& batch) {
  v1::TrainRequest request;
  request.set_job(job);
  request.set_samples(batch.samples);
  if (batch.inputs != nullptr) ToDense(*batch.inputs, request.mutable_inputs());
  if (batch.targets != nullptr) ToDense(*batch.targets, request.mutable_targets());
  return request;
}

absl::Status TrainOptions::Check() const {
  if (max_kept_batches < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("TrainOptions.max_kept_batches must be >= 1, got ", max_kept_batches));
  }
  const std::pair<const char*, absl::Duration> durations[] = {
      {"recovery_timeout", recovery_timeout},
      {"reconnect_timeout", reconnect_timeout},
      {"max_poll_interval", max_poll_interval}};
  for (const auto& [name, value] : durations) {
    if (value <= absl::ZeroDuration()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "TrainOptions.", name, " must be positive, got ", absl::FormatDuration(value)));
    }
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------- TrainSession

TrainSession::TrainSession(
    Client* client, std::string job, std::unique_ptr<grpc::ClientContext> context,
    std::unique_ptr<grpc::ClientReaderWriter<v1::TrainRequest, v1::StepResult>> stream)
    : client_(client),
      job_(std::move(job)),
      context_(std::move(context)),
      stream_(std::move(stream)) {}

TrainSession::~TrainSession() {
  if (!done_) {
    context_->TryCancel();
    stream_->Finish().ok();
  }
}

absl::Status TrainSession::Fail() {
  if (!done_) {
    done_ = true;
    const grpc::Status status = stream_->Finish();
    // The coordinator ends a stream OK only after the client closed its side: an OK end while a
    // batch waits for its answer is a coordinator that went away (a replaying session then checks
    // the job before it resends anything).
    final_ = status.ok() ? absl::UnavailableError(
                               "the coordinator ended the Train stream without answering the batch")
                         : client_->CallError(status, "");
  }
  return final_;
}

absl::Status TrainSession::OpenStream() {
  auto context = std::make_unique<grpc::ClientContext>();
  auto stream = client_->stub_->Train(context.get());
  if (stream == nullptr) return absl::UnavailableError("cannot open a Train stream");
  stream_ = std::move(stream);  // the old stream before its context.
  context_ = std::move(context);
  done_ = false;
  final_ = absl::OkStatus();
  return absl::OkStatus();
}

void TrainSession::CloseInOrder() {
  if (done_) return;
  done_ = true;
  // Never TryCancel here: the coordinator notices a cancelled stream on its own time, and a new
  // stream's claim could still find the old one holding the job (FAILED_PRECONDITION). A closed
  // one ends once the batches sent on it are answered, and the coordinator releases the job before
  // it sends the final status.
  stream_->WritesDone();
  v1::StepResult unused;
  while (stream_->Read(&unused)) {
  }
  const grpc::Status status = stream_->Finish();
  final_ = status.ok() ? absl::OkStatus() : client_->CallError(status, "");
}

absl::StatusOr<v1::StepResult> TrainSession::Step(const BatchView& batch) {
  return Step(MakeTrainRequest(job_, batch));
}

absl::StatusOr<v1::StepResult> TrainSession::StepOnce(const v1::TrainRequest& request) {
  if (done_) {
    return final_.ok() ? absl::FailedPreconditionError("the Train session is finished") : final_;
  }
  if (!stream_->Write(request)) return Fail();
  return ReadOnce();
}

absl::StatusOr<v1::StepResult> TrainSession::ReadOnce() {
  if (done_) {
    return final_.ok() ? absl::FailedPreconditionError("the Train session is finished") : final_;
  }
  v1::StepResult result;
  if (!stream_->Read(&result)) return Fail();
  return result;
}

absl::StatusOr<v1::StepResult> TrainSession::Step(const v1::TrainRequest& request) {
  if (!sent_.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("Step with ", sent_.size(), " batch(es) sent and unanswered: Receive first"));
  }
  PT_RETURN_IF_ERROR(Send(request));
  return Receive();
}

absl::Status TrainSession::Send(const BatchView& batch) {
  return Send(MakeTrainRequest(job_, batch));
}

absl::Status TrainSession::Send(const v1::TrainRequest& request) {
  if (finished_) return absl::FailedPreconditionError("the Train session is finished");
  if (sent_.size() >= kMaxInFlight) {
    return absl::FailedPreconditionError(absl::StrCat(
        kMaxInFlight, " batches are sent and unanswered: Receive one before sending another"));
  }
  // The last stream ended with a failure Receive reported: the job is where it was, continue it
  // on a new stream. (With batches unanswered on an ended stream, Receive reports or recovers.)
  if (done_ && sent_.empty()) PT_RETURN_IF_ERROR(OpenStream());
  const int64_t step = next_step_ + static_cast<int64_t>(sent_.size());
  v1::TrainRequest replayable;
  if (options_.replay) {
    // A replaying session names the step each batch is for: a job that a recovery restored
    // between two steps refuses it (ABORTED) instead of applying it at the restored step.
    replayable = request;
    replayable.set_expected_steps_done(step);
  }
  sent_.push_back(Sent{step, std::move(replayable)});
  // A write on a broken stream is left to Receive: it reports the stream's status, or recovers
  // and resends this batch.
  if (!done_ && !stream_->Write(options_.replay ? sent_.back().request : request)) {
    Fail().IgnoreError();
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::StepResult> TrainSession::Receive() {
  if (sent_.empty()) return absl::FailedPreconditionError("no batch is sent and unanswered");
  absl::StatusOr<v1::StepResult> result =
      ThroughRecovery<v1::StepResult>([this] { return ReadOnce(); });
  if (result.ok() && options_.replay && result->step() != sent_.front().step + 1) {
    // The coordinator recovered the job while the stream was idle and applied the batch at its
    // restored step (one that ignores TrainRequest.expected_steps_done): the state is no longer the
    // first run's.
    result = absl::DataLossError(absl::StrCat(
        "job ", job_, " applied this batch as step ", result->step(), ", expected step ",
        sent_.front().step + 1,
        ": it restarted from an earlier step between two steps without ending the Train stream, "
        "so the batches since were not replayed"));
  }
  if (!result.ok()) {
    sent_.clear();
    CloseInOrder();
    final_ = result.status();
    return result;
  }
  Sent answered = std::move(sent_.front());
  sent_.pop_front();
  next_step_ = result->step();
  if (result->has_shape_change()) {
    const v1::ShapeChange& change = result->shape_change();
    // A recovery restarts from the growth's checkpoint at the earliest.
    if (!change.checkpoint().empty()) CheckpointDone(change.step());
    if (options_.on_shape_change) options_.on_shape_change(change);
  }
  if (options_.replay) {
    kept_.push_back(Kept{answered.step, std::move(answered.request), result->loss()});
    while (static_cast<int64_t>(kept_.size()) > options_.max_kept_batches) kept_.pop_front();
  }
  return result;
}

void TrainSession::CheckpointDone(int64_t steps_done) {
  while (!kept_.empty() && kept_.front().step < steps_done) kept_.pop_front();
}

absl::StatusOr<v1::CheckpointResponse> TrainSession::Checkpoint(
    const std::string& directory, int keep, const std::optional<v1::DataPosition>& position) {
  if (!sent_.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "Checkpoint with ", sent_.size(), " batch(es) sent and unanswered: Receive first"));
  }
  absl::StatusOr<v1::CheckpointResponse> saved = ThroughRecovery<v1::CheckpointResponse>(
      [&] { return client_->Checkpoint(job_, directory, keep, position); });
  // A recovery restarts from this step at the earliest.
  if (saved.ok()) CheckpointDone(saved->step());
  return saved;
}

absl::StatusOr<v1::EvaluateResult> TrainSession::Evaluate(const BatchView& samples,
                                                          int64_t chunk_samples) {
  if (!sent_.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "Evaluate with ", sent_.size(), " batch(es) sent and unanswered: Receive first"));
  }
  return ThroughRecovery<v1::EvaluateResult>(
      [&] { return client_->Evaluate(job_, samples, chunk_samples); });
}

absl::StatusOr<v1::GenerateResult> TrainSession::Generate(const GenerateOptions& options) {
  if (!sent_.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "Generate with ", sent_.size(), " batch(es) sent and unanswered: Receive first"));
  }
  return ThroughRecovery<v1::GenerateResult>([&] { return client_->Generate(job_, options); });
}

absl::Status TrainSession::AwaitRecovery(const absl::Status& why) {
  if (!options_.replay || !Recoverable(why)) return why;
  if (!sent_.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot recover with ", sent_.size(), " batch(es) sent and unanswered: Receive first"));
  }
  bool first = true;  // the first attempt is the call that failed with `why`; later ones succeed.
  return ThroughRecovery<bool>([&]() -> absl::StatusOr<bool> {
           if (!first) return true;
           first = false;
           return why;
         })
      .status();
}

template <typename T>
absl::StatusOr<T> TrainSession::ThroughRecovery(const std::function<absl::StatusOr<T>()>& attempt) {
  absl::StatusOr<T> result = attempt();
  for (int round = 0; options_.replay && round < kRecoveryRounds && Recoverable(result.status());
       ++round) {
    const absl::Status why = result.status();
    if (options_.on_wait != nullptr) options_.on_wait(why);
    // The wait's own errors (the job ended, the timeouts) end it at once; a replay or an attempt
    // interrupted by another loss starts the next round.
    absl::StatusOr<v1::JobStatus> job = AwaitReady(why);
    if (!job.ok()) return job.status();
    if (absl::Status replayed = Replay(*job, why); !replayed.ok()) {
      result = replayed;
      continue;
    }
    result = attempt();
  }
  return result;
}

absl::StatusOr<v1::JobStatus> TrainSession::AwaitReady(const absl::Status& why) {
  const absl::Time deadline = absl::Now() + options_.recovery_timeout;
  absl::Duration delay = std::min(absl::Milliseconds(20), options_.max_poll_interval);
  // Since when the coordinator has been unreachable (the UNAVAILABLE that began the wait counts).
  absl::Time unreachable_since = absl::IsUnavailable(why) ? absl::Now() : absl::InfiniteFuture();
  // Each poll is short, so that an unreachable coordinator is given up on in time.
  const absl::Duration poll_timeout =
      std::min({std::max(options_.reconnect_timeout, absl::Seconds(1)),
                client_->options().call_timeout, absl::Seconds(5)});
  v1::GetJobRequest get;
  get.set_job(job_);
  for (;;) {
    absl::StatusOr<v1::JobStatus> got =
        client_->Unary(&v1::Coordinator::Stub::GetJob, get, "GetJob", poll_timeout);
    if (got.ok()) {
      unreachable_since = absl::InfiniteFuture();
      if (got->state() == v1::JOB_STATE_READY) return got;
      if (got->state() != v1::JOB_STATE_RECOVERING && got->state() != v1::JOB_STATE_TRAINING) {
        // The job ended: a lost connection's own error says more than "did not recover".
        if (absl::IsUnavailable(why)) return why;
        return absl::FailedPreconditionError(
            absl::StrCat("job ", job_, " did not recover: ", v1::JobState_Name(got->state()),
                         got->reason().empty() ? "" : ": ", got->reason()));
      }
    } else if (absl::IsNotFound(got.status())) {
      return absl::FailedPreconditionError(absl::StrCat(
          "job ", job_, " is unknown to the coordinator at ", client_->target(), " after: ",
          why.ToString(), " (a coordinator restarted without --state-dir forgets its jobs)"));
    } else if (!absl::IsUnavailable(got.status()) && !absl::IsDeadlineExceeded(got.status())) {
      return got.status();
    } else {
      unreachable_since = std::min(unreachable_since, absl::Now());
      if (absl::Now() - unreachable_since >= options_.reconnect_timeout) {
        return absl::UnavailableError(
            absl::StrCat(absl::IsUnavailable(why) ? why.message() : got.status().message(),
                         "; the coordinator was not reachable again within ",
                         absl::FormatDuration(options_.reconnect_timeout)));
      }
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("job ", job_, " did not recover within ",
                       absl::FormatDuration(options_.recovery_timeout), " after: ", why.ToString(),
                       got.ok() ? "" : absl::StrCat("; last attempt: ", got.status().ToString())));
    }
    if (options_.interrupted != nullptr && options_.interrupted()) {
      return absl::CancelledError(
          absl::StrCat("interrupted while waiting for job ", job_, " after: ", why.ToString()));
    }
    // The polling interval of a bounded wait.
    if (options_.pause != nullptr) {
      options_.pause(delay);
    } else {
      absl::SleepFor(delay);
    }
    delay = std::min(delay * 2, options_.max_poll_interval);
  }
}

absl::Status TrainSession::Replay(const v1::JobStatus& job, const absl::Status& why) {
  const int64_t restored = job.steps_done();
  const int64_t first_kept = kept_.empty() ? next_step_ : kept_.front().step;
  if (restored > next_step_) {
    // The job applied batches whose results never arrived (the stream broke after their steps):
    // their losses are unknown here, so the session cannot continue exactly.
    return absl::FailedPreconditionError(absl::StrCat(
        "job ", job_, " has done ", restored, " steps but this session received the results of ",
        next_step_, ": the results of the steps after it were lost with the Train stream (",
        why.ToString(), ")"));
  }
  if (restored < first_kept) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job ", job_, " restarted at step ", restored, " but this session can replay only steps ",
        first_kept, " to ", next_step_, " (checkpoint more often to keep fewer batches)"));
  }
  // A new stream for the new generation, after the current one (open when another call failed, e.g.
  // a Checkpoint) ended in order.
  CloseInOrder();
  PT_RETURN_IF_ERROR(OpenStream());
  for (const Kept& k : kept_) {
    if (k.step < restored) continue;
    v1::TrainRequest again = k.request;
    again.set_expected_steps_done(k.step);
    PT_ASSIGN_OR_RETURN(v1::StepResult replayed, StepOnce(again));
    const float loss = replayed.loss();
    if (replayed.step() != k.step + 1 || std::memcmp(&loss, &k.loss, sizeof(float)) != 0) {
      return absl::DataLossError(absl::StrFormat(
          "replaying step %d of job %s gave step %d loss %.9g, the first run loss %.9g: the "
          "recovery is not exact",
          k.step + 1, job_, replayed.step(), replayed.loss(), k.loss));
    }
  }
  // The unanswered batches again, behind the replayed ones (their results are Receive's).
  for (const Sent& s : sent_) {
    if (!stream_->Write(s.request)) return Fail();
  }
  if (options_.on_recovery != nullptr && job.recoveries_size() > 0) {
    options_.on_recovery(job.recoveries(job.recoveries_size() - 1));
  }
  return absl::OkStatus();
}

absl::Status TrainSession::Finish() {
  while (!sent_.empty() && !done_) {
    if (absl::StatusOr<v1::StepResult> r = Receive(); !r.ok()) break;
  }
  sent_.clear();
  finished_ = true;
  if (done_) return final_;
  done_ = true;
  stream_->WritesDone();
  const grpc::Status status = stream_->Finish();
  final_ = status.ok() ? absl::OkStatus() : client_->CallError(status, "");
  return final_;
}

// ---------------------------------------------------------------- Client

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(const std::string& target,
                                                        const ClientOptions& options) {
  PT_RETURN_IF_ERROR(options.Check());
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(static_cast<int>(options.max_message_bytes));
  args.SetMaxSendMessageSize(static_cast<int>(options.max_message_bytes));
  // Pings also while no call is in flight and however long no data moves (a long Train step):
  // an unanswered one closes the connection and fails its calls (the coordinator accepts this
  // rate: coordinator::AllowClientKeepalive).
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, Millis(options.keepalive_interval));
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, Millis(options.keepalive_timeout));
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  // A coordinator that restarts is reconnected within a few seconds (gRPC's default backoff grows
  // to 120 s).
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 5000);
  // Calls that change nothing (and CancelJob, which is idempotent) are retried by gRPC when
  // the connection under them broke (UNAVAILABLE), e.g. the first call after a coordinator
  // restart; the call's deadline bounds the attempts.
  args.SetServiceConfigJSON(R"json({"methodConfig": [{
      "name": [{"service": "pipetrain.v1.Coordinator", "method": "GetJob"},
               {"service": "pipetrain.v1.Coordinator", "method": "ListJobs"},
               {"service": "pipetrain.v1.Coordinator", "method": "ListWorkers"},
               {"service": "pipetrain.v1.Coordinator", "method": "CancelJob"}],
      "retryPolicy": {"maxAttempts": 4, "initialBackoff": "0.1s", "maxBackoff": "1s",
                      "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]}}]})json");
  PT_ASSIGN_OR_RETURN(std::shared_ptr<grpc::ChannelCredentials> credentials,
                      net::MakeChannelCredentials(options.tls, options.token));
  std::shared_ptr<grpc::Channel> channel = grpc::CreateCustomChannel(target, credentials, args);
  if (!channel->WaitForConnected(absl::ToChronoTime(absl::Now() + options.connect_timeout))) {
    return absl::UnavailableError(absl::StrCat(
        "cannot reach the coordinator at ", target, " within ",
        absl::FormatDuration(options.connect_timeout),
        options.tls.enabled()
            ? " over TLS (is it running with TLS, is its certificate signed by --tls-ca and does "
              "it name that host? docs/security.md)"
            : ""));
  }
  return std::unique_ptr<Client>(new Client(target, options, v1::Coordinator::NewStub(channel)));
}

absl::Status Client::CallError(const grpc::Status& status, const char* what, absl::Duration timeout,
                               absl::Time deadline) const {
  absl::Status error = wire::FromGrpcStatus(status);
  if (const std::string reason = StoppedAnsweringReason(status, options_.keepalive_timeout);
      !reason.empty()) {
    error = absl::UnavailableError(
        absl::StrCat("the coordinator at ", target_, " stopped answering (", reason, ")"));
  } else if (status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED &&
             absl::Now() >= deadline) {
    // Our deadline, not the coordinator's own DEADLINE_EXCEEDED (a worker's step timed out).
    error = absl::DeadlineExceededError(absl::StrCat(
        "the coordinator at ", target_, " did not answer within ", absl::FormatDuration(timeout)));
  }
  return *what == '\0' ? error : wire::Annotate(error, what);
}

absl::StatusOr<v1::JobStatus> Client::CreateJob(const v1::JobSpec& spec) {
  v1::CreateJobRequest request;
  *request.mutable_spec() = spec;
  return Unary(&v1::Coordinator::Stub::CreateJob, request, "CreateJob", options_.long_call_timeout);
}

absl::StatusOr<std::unique_ptr<TrainSession>> Client::StartTraining(const std::string& job,
                                                                    TrainOptions options) {
  PT_RETURN_IF_ERROR(options.Check());
  auto context = std::make_unique<grpc::ClientContext>();
  auto stream = stub_->Train(context.get());
  if (stream == nullptr) return absl::UnavailableError("cannot open a Train stream");
  std::unique_ptr<TrainSession> session(
      new TrainSession(this, job, std::move(context), std::move(stream)));
  session->next_step_ = options.first_step;
  session->options_ = std::move(options);
  return session;
}

absl::StatusOr<v1::StepResult> Client::TrainStep(const std::string& job, const BatchView& batch) {
  absl::StatusOr<std::unique_ptr<TrainSession>> session = StartTraining(job);
  if (!session.ok()) return session.status();
  absl::StatusOr<v1::StepResult> result = (*session)->Step(batch);
  const absl::Status finished = (*session)->Finish();
  if (!result.ok()) return result.status();
  if (!finished.ok()) return finished;
  return result;
}

template <typename Request, typename Response>
absl::StatusOr<Response> Client::Unary(
    grpc::Status (v1::Coordinator::Stub::*method)(grpc::ClientContext*, const Request&, Response*),
    const Request& request, const char* what, absl::Duration timeout) const {
  grpc::ClientContext context;
  const absl::Time deadline = absl::Now() + timeout;
  context.set_deadline(absl::ToChronoTime(deadline));
  Response response;
  const grpc::Status status = (stub_.get()->*method)(&context, request, &response);
  if (!status.ok()) return CallError(status, what, timeout, deadline);
  return response;
}

absl::StatusOr<v1::JobStatus> Client::GetJob(const std::string& job) {
  v1::GetJobRequest request;
  request.set_job(job);
  return Unary(&v1::Coordinator::Stub::GetJob, request, "GetJob", options_.call_timeout);
}

absl::StatusOr<v1::JobStatus> Client::FinishJob(const std::string& job) {
  v1::FinishJobRequest request;
  request.set_job(job);
  absl::StatusOr<v1::JobStatus> finished =
      Unary(&v1::Coordinator::Stub::FinishJob, request, "FinishJob", options_.call_timeout);
  if (finished.ok()) {
    absl::MutexLock lock(&mu_);
    failed_checkpoints_.erase(job);
  }
  return finished;
}

absl::StatusOr<v1::JobStatus> Client::CancelJob(const std::string& job, const std::string& reason,
                                                absl::Duration timeout) {
  v1::CancelJobRequest request;
  request.set_job(job);
  request.set_reason(reason);
  absl::StatusOr<v1::JobStatus> cancelled =
      Unary(&v1::Coordinator::Stub::CancelJob, request, "CancelJob",
            timeout > absl::ZeroDuration() ? timeout : options_.call_timeout);
  if (cancelled.ok()) {
    absl::MutexLock lock(&mu_);
    failed_checkpoints_.erase(job);
  }
  return cancelled;
}

absl::StatusOr<std::vector<v1::JobStatus>> Client::ListJobs() {
  PT_ASSIGN_OR_RETURN(v1::ListJobsResponse response,
                      Unary(&v1::Coordinator::Stub::ListJobs, v1::ListJobsRequest(), "ListJobs",
                            options_.call_timeout));
  return std::vector<v1::JobStatus>(response.jobs().begin(), response.jobs().end());
}

absl::StatusOr<std::vector<v1::WorkerInfo>> Client::ListWorkers() {
  PT_ASSIGN_OR_RETURN(v1::ListWorkersResponse response,
                      Unary(&v1::Coordinator::Stub::ListWorkers, v1::ListWorkersRequest(),
                            "ListWorkers", options_.call_timeout));
  return std::vector<v1::WorkerInfo>(response.workers().begin(), response.workers().end());
}

absl::StatusOr<v1::ProfileWorkersResponse> Client::ProfileWorkers(
    const v1::ProfileWorkersRequest& request) {
  // The coordinator answers by the request's deadline (0: its default of 5 minutes); a minute
  // more covers the transfer and the workers' last sample count.
  const absl::Duration deadline =
      absl::Milliseconds(request.deadline_ms() > 0 ? request.deadline_ms() : 300'000);
  return Unary(&v1::Coordinator::Stub::ProfileWorkers, request, "ProfileWorkers",
               deadline + absl::Minutes(1));
}

absl::StatusOr<v1::CheckpointResponse> Client::Checkpoint(
    const std::string& job, const std::string& directory, int keep,
    const std::optional<v1::DataPosition>& position) {
  v1::CheckpointRequest request;
  request.set_job(job);
  request.set_directory(directory);
  request.set_keep(keep);
  if (position.has_value()) *request.mutable_data_position() = *position;
  absl::StatusOr<v1::CheckpointResponse> saved =
      Unary(&v1::Coordinator::Stub::Checkpoint, request, "Checkpoint", options_.long_call_timeout);
  absl::MutexLock lock(&mu_);
  if (saved.ok()) {
    failed_checkpoints_.erase(job);
  } else {
    failed_checkpoints_[job] = directory;
  }
  return saved;
}

absl::StatusOr<v1::EvaluateResult> Client::Evaluate(const std::string& job,
                                                    const BatchView& samples,
                                                    int64_t chunk_samples) {
  v1::EvaluateRequest request;
  request.set_job(job);
  request.set_samples(samples.samples);
  request.set_chunk_samples(chunk_samples);
  if (samples.inputs != nullptr) ToDense(*samples.inputs, request.mutable_inputs());
  if (samples.targets != nullptr) ToDense(*samples.targets, request.mutable_targets());
  return Unary(&v1::Coordinator::Stub::Evaluate, request, "Evaluate", options_.long_call_timeout);
}

absl::StatusOr<v1::GenerateResult> Client::Generate(const std::string& job,
                                                    const GenerateOptions& options) {
  v1::GenerateRequest request;
  request.set_job(job);
  for (const std::vector<int64_t>& prompt : options.prompts) {
    request.add_prompts()->mutable_tokens()->Add(prompt.begin(), prompt.end());
  }
  request.set_max_tokens(options.max_tokens);
  request.set_temperature(options.temperature);
  request.set_top_k(options.top_k);
  request.set_seed(options.seed);
  return Unary(&v1::Coordinator::Stub::Generate, request, "Generate", options_.long_call_timeout);
}

std::optional<std::string> Client::failed_checkpoint(const std::string& job) const {
  absl::MutexLock lock(&mu_);
  auto it = failed_checkpoints_.find(job);
  if (it == failed_checkpoints_.end()) return std::nullopt;
  return it->second;
}

ScopedJob::~ScopedJob() {
  if (ended_) return;
  // Its weights are unsaved: leave the job for a retry of the save.
  if (client_->failed_checkpoint(job_).has_value()) return;
  // Best effort, briefly: the coordinator's client lease ends the job otherwise.
  client_->CancelJob(job_, cancel_reason_, client_->options().cleanup_timeout)
      .status()
      .IgnoreError();
}

absl::Status ScopedJob::Finish() {
  ended_ = true;
  return client_->FinishJob(job_).status();
}

absl::Status ScopedJob::Cancel(absl::Duration timeout) {
  ended_ = true;
  return client_->CancelJob(job_, cancel_reason_, timeout).status();
}

}  // namespace pipetrain::client
