#include "client/sdk/client.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/util/status_macros.h"
#include "common/wire/grpc_status.h"

namespace pipetrain::client {
namespace {

void ToDense(const math::Matrix& m, v1::DenseTensor* out) {
  out->add_shape(m.rows());
  out->add_shape(m.cols());
  out->set_data(reinterpret_cast<const char*>(m.data()),
                static_cast<size_t>(m.size()) * sizeof(float));
}

}  // namespace

v1::TrainRequest MakeTrainRequest(const std::string& job, const BatchView& batch) {
  v1::TrainRequest request;
  request.set_job(job);
  request.set_samples(batch.samples);
  if (batch.inputs != nullptr) ToDense(*batch.inputs, request.mutable_inputs());
  if (batch.targets != nullptr) ToDense(*batch.targets, request.mutable_targets());
  return request;
}

// ---------------------------------------------------------------- TrainSession

TrainSession::TrainSession(
    std::string job, std::unique_ptr<grpc::ClientContext> context,
    std::unique_ptr<grpc::ClientReaderWriter<v1::TrainRequest, v1::StepResult>> stream)
    : job_(std::move(job)), context_(std::move(context)), stream_(std::move(stream)) {}

TrainSession::~TrainSession() {
  if (!done_) {
    context_->TryCancel();
    stream_->Finish().ok();
  }
}

absl::Status TrainSession::Fail() {
  if (!done_) {
    done_ = true;
    final_ = wire::FromGrpcStatus(stream_->Finish());
    if (final_.ok()) final_ = absl::UnavailableError("the coordinator ended the Train stream");
  }
  return final_;
}

absl::StatusOr<v1::StepResult> TrainSession::Step(const BatchView& batch) {
  return Step(MakeTrainRequest(job_, batch));
}

absl::StatusOr<v1::StepResult> TrainSession::StepOnce(const v1::TrainRequest& request) {
  if (done_) {
    return final_.ok() ? absl::FailedPreconditionError("the Train session is finished") : final_;
  }
  if (!stream_->Write(request)) return Fail();
  v1::StepResult result;
  if (!stream_->Read(&result)) return Fail();
  return result;
}

absl::StatusOr<v1::StepResult> TrainSession::Step(const v1::TrainRequest& request) {
  absl::StatusOr<v1::StepResult> result = StepOnce(request);
  // A recovery may itself be interrupted by another loss: a few rounds, each bounded.
  for (int round = 0; options_.replay && round < 3 && absl::IsAborted(result.status()); ++round) {
    result = Recover(request);
  }
  if (!result.ok()) return result;
  next_step_ = result->step();
  if (options_.replay) {
    kept_.push_back(Kept{result->step() - 1, request, result->loss()});
    while (static_cast<int64_t>(kept_.size()) > options_.max_kept_batches) kept_.pop_front();
  }
  return result;
}

void TrainSession::CheckpointDone(int64_t steps_done) {
  while (!kept_.empty() && kept_.front().step < steps_done) kept_.pop_front();
}

absl::StatusOr<v1::StepResult> TrainSession::Recover(const v1::TrainRequest& request) {
  // Wait (bounded) until the coordinator has re-assigned the job.
  const absl::Time deadline = absl::Now() + options_.recovery_timeout;
  absl::Duration delay = absl::Milliseconds(20);
  v1::JobStatus job;
  for (;;) {
    PT_ASSIGN_OR_RETURN(job, client_->GetJob(job_));
    if (job.state() == v1::JOB_STATE_READY) break;
    if (job.state() != v1::JOB_STATE_RECOVERING && job.state() != v1::JOB_STATE_TRAINING) {
      return absl::FailedPreconditionError(
          absl::StrCat("job ", job_, " did not recover: ", v1::JobState_Name(job.state()),
                       job.reason().empty() ? "" : ": ", job.reason()));
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("job ", job_, " did not recover within ",
                       absl::FormatDuration(options_.recovery_timeout)));
    }
    absl::SleepFor(delay);  // polling interval of a bounded wait.
    delay = std::min(delay * 2, absl::Seconds(1));
  }
  const int64_t restored = job.steps_done();
  const int64_t first_kept = kept_.empty() ? next_step_ : kept_.front().step;
  if (restored > next_step_ || restored < first_kept) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job ", job_, " restarted at step ", restored, " but this session can replay only steps ",
        first_kept, " to ", next_step_, " (checkpoint more often to keep fewer batches)"));
  }
  // A fresh stream for the new epoch.
  if (!done_) {
    context_->TryCancel();
    (void)stream_->Finish();
  }
  auto context = std::make_unique<grpc::ClientContext>();
  auto stream = client_->stub_->Train(context.get());
  if (stream == nullptr) return absl::UnavailableError("cannot reopen the Train stream");
  context_ = std::move(context);
  stream_ = std::move(stream);
  done_ = false;
  final_ = absl::OkStatus();
  for (const Kept& k : kept_) {
    if (k.step < restored) continue;
    PT_ASSIGN_OR_RETURN(v1::StepResult replayed, StepOnce(k.request));
    const float loss = replayed.loss();
    if (replayed.step() != k.step + 1 || std::memcmp(&loss, &k.loss, sizeof(float)) != 0) {
      return absl::DataLossError(absl::StrCat(
          "replaying step ", k.step + 1, " of job ", job_, " gave step ", replayed.step(), " loss ",
          replayed.loss(), ", the first run loss ", k.loss, ": the recovery is not exact"));
    }
  }
  if (options_.on_recovery != nullptr && job.recoveries_size() > 0) {
    options_.on_recovery(job.recoveries(job.recoveries_size() - 1));
  }
  return StepOnce(request);
}

absl::Status TrainSession::Finish() {
  if (done_) return final_;
  done_ = true;
  stream_->WritesDone();
  final_ = wire::FromGrpcStatus(stream_->Finish());
  return final_;
}

// ---------------------------------------------------------------- Client

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(const std::string& target,
                                                        absl::Duration timeout) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(512 << 20);
  args.SetMaxSendMessageSize(512 << 20);
  std::shared_ptr<grpc::Channel> channel =
      grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
  const auto deadline = std::chrono::system_clock::now() + absl::ToChronoMilliseconds(timeout);
  if (!channel->WaitForConnected(deadline)) {
    return absl::UnavailableError(absl::StrCat("cannot reach the coordinator at ", target,
                                               " within ", absl::FormatDuration(timeout)));
  }
  return std::unique_ptr<Client>(new Client(v1::Coordinator::NewStub(channel)));
}

absl::StatusOr<v1::JobStatus> Client::CreateJob(const v1::JobSpec& spec) {
  grpc::ClientContext context;
  v1::CreateJobRequest request;
  *request.mutable_spec() = spec;
  v1::JobStatus response;
  const grpc::Status status = stub_->CreateJob(&context, request, &response);
  if (!status.ok()) return wire::FromGrpcStatus(status, "CreateJob");
  return response;
}

absl::StatusOr<std::unique_ptr<TrainSession>> Client::StartTraining(const std::string& job,
                                                                    TrainOptions options) {
  auto context = std::make_unique<grpc::ClientContext>();
  auto stream = stub_->Train(context.get());
  if (stream == nullptr) return absl::UnavailableError("cannot open a Train stream");
  std::unique_ptr<TrainSession> session(
      new TrainSession(job, std::move(context), std::move(stream)));
  session->client_ = this;
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

namespace {

// One unary call of `method` on `stub`; errors are the coordinator's statuses, prefixed `what`.
template <typename Request, typename Response>
absl::StatusOr<Response> Unary(v1::Coordinator::Stub* stub,
                               grpc::Status (v1::Coordinator::Stub::*method)(grpc::ClientContext*,
                                                                             const Request&,
                                                                             Response*),
                               const Request& request, const char* what) {
  grpc::ClientContext context;
  Response response;
  const grpc::Status status = (stub->*method)(&context, request, &response);
  if (!status.ok()) return wire::FromGrpcStatus(status, what);
  return response;
}

}  // namespace

absl::StatusOr<v1::JobStatus> Client::GetJob(const std::string& job) {
  v1::GetJobRequest request;
  request.set_job(job);
  return Unary(stub_.get(), &v1::Coordinator::Stub::GetJob, request, "GetJob");
}

absl::StatusOr<v1::JobStatus> Client::FinishJob(const std::string& job) {
  v1::FinishJobRequest request;
  request.set_job(job);
  return Unary(stub_.get(), &v1::Coordinator::Stub::FinishJob, request, "FinishJob");
}

absl::StatusOr<v1::JobStatus> Client::CancelJob(const std::string& job, const std::string& reason) {
  v1::CancelJobRequest request;
  request.set_job(job);
  request.set_reason(reason);
  return Unary(stub_.get(), &v1::Coordinator::Stub::CancelJob, request, "CancelJob");
}

absl::StatusOr<std::vector<v1::JobStatus>> Client::ListJobs() {
  PT_ASSIGN_OR_RETURN(
      v1::ListJobsResponse response,
      Unary(stub_.get(), &v1::Coordinator::Stub::ListJobs, v1::ListJobsRequest(), "ListJobs"));
  return std::vector<v1::JobStatus>(response.jobs().begin(), response.jobs().end());
}

absl::StatusOr<std::vector<v1::WorkerInfo>> Client::ListWorkers() {
  PT_ASSIGN_OR_RETURN(v1::ListWorkersResponse response,
                      Unary(stub_.get(), &v1::Coordinator::Stub::ListWorkers,
                            v1::ListWorkersRequest(), "ListWorkers"));
  return std::vector<v1::WorkerInfo>(response.workers().begin(), response.workers().end());
}

absl::StatusOr<v1::CheckpointResponse> Client::Checkpoint(const std::string& job,
                                                          const std::string& directory) {
  grpc::ClientContext context;
  v1::CheckpointRequest request;
  request.set_job(job);
  request.set_directory(directory);
  v1::CheckpointResponse response;
  const grpc::Status status = stub_->Checkpoint(&context, request, &response);
  if (!status.ok()) return wire::FromGrpcStatus(status, "Checkpoint");
  return response;
}

ScopedJob::~ScopedJob() {
  if (!ended_) Cancel().IgnoreError();  // best effort: the lease ends the job otherwise.
}

absl::Status ScopedJob::Finish() {
  ended_ = true;
  return client_->FinishJob(job_).status();
}

absl::Status ScopedJob::Cancel() {
  ended_ = true;
  return client_->CancelJob(job_, cancel_reason_).status();
}

}  // namespace pipetrain::client
