#include "server/coordinator/coordinator_service.h"

#include <grpcpp/grpcpp.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/net/transport_security.h"
#include "common/wire/grpc_status.h"
#include "server/coordinator/grpc_feed_link.h"
#include "server/coordinator/join_reactor.h"
#include "server/coordinator/state_reactors.h"
#include "server/coordinator/train_reactor.h"

namespace pipetrain::coordinator {
namespace {

// Answers a unary call with `result`'s value in `response`, or its error.
template <typename T>
grpc::ServerUnaryReactor* Answer(grpc::CallbackServerContext* context, absl::StatusOr<T> result,
                                 T* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (result.ok()) *response = *std::move(result);
  reactor->Finish(wire::ToGrpcStatus(result.status()));
  return reactor;
}

}  // namespace

void AllowClientKeepalive(grpc::ServerBuilder& builder) {
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 500);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
}

absl::Status ServiceTransport::Check() const {
  if (io_threads < 1 || io_threads > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("io_threads must be in [1, 64], got ", io_threads));
  }
  return link.Check();
}

CoordinatorService::CoordinatorService(CoordinatorOptions options, ServiceTransport transport)
    : transport_(std::move(transport)),
      core_(std::move(options),
            std::make_shared<GrpcFeedLinkFactory>(transport_.link, transport_.link_credentials)),
      io_(transport_.io_threads) {}

CoordinatorService::~CoordinatorService() { core_.Shutdown(); }

grpc::ServerBidiReactor<v1::WorkerEvent, v1::WorkerCommand>* CoordinatorService::Join(
    grpc::CallbackServerContext* context) {
  std::optional<std::vector<std::string>> names;
  if (transport_.check_worker_certificates) {
    const std::shared_ptr<const grpc::AuthContext> auth = context->auth_context();
    names = auth == nullptr ? std::vector<std::string>() : net::PeerCertificateNames(*auth);
  }
  return new JoinReactor(&core_, std::move(names));
}

grpc::ServerBidiReactor<v1::TrainRequest, v1::StepResult>* CoordinatorService::Train(
    grpc::CallbackServerContext* /*context*/) {
  return new TrainReactor(&core_);
}

grpc::ServerUnaryReactor* CoordinatorService::CreateJob(grpc::CallbackServerContext* context,
                                                        const v1::CreateJobRequest* request,
                                                        v1::JobStatus* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  core_.CreateJob(request->spec(), [reactor, response](absl::StatusOr<v1::JobStatus> status) {
    if (status.ok()) *response = *std::move(status);
    reactor->Finish(wire::ToGrpcStatus(status.status()));
  });
  return reactor;
}

grpc::ServerUnaryReactor* CoordinatorService::Checkpoint(grpc::CallbackServerContext* context,
                                                         const v1::CheckpointRequest* request,
                                                         v1::CheckpointResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  const absl::Status posted = core_.PostToJob(request->job(), [this, reactor, request, response] {
    absl::StatusOr<v1::CheckpointResponse> result = core_.Checkpoint(*request);
    if (result.ok()) *response = *std::move(result);
    reactor->Finish(wire::ToGrpcStatus(result.status()));
  });
  if (!posted.ok()) reactor->Finish(wire::ToGrpcStatus(posted));
  return reactor;
}

grpc::ServerUnaryReactor* CoordinatorService::GetJob(grpc::CallbackServerContext* context,
                                                     const v1::GetJobRequest* request,
                                                     v1::JobStatus* response) {
  return Answer(context, core_.GetJob(request->job()), response);
}

grpc::ServerUnaryReactor* CoordinatorService::FinishJob(grpc::CallbackServerContext* context,
                                                        const v1::FinishJobRequest* request,
                                                        v1::JobStatus* response) {
  return Answer(context, core_.FinishJob(request->job()), response);
}

grpc::ServerUnaryReactor* CoordinatorService::CancelJob(grpc::CallbackServerContext* context,
                                                        const v1::CancelJobRequest* request,
                                                        v1::JobStatus* response) {
  return Answer(context, core_.CancelJob(request->job(), request->reason()), response);
}

grpc::ServerUnaryReactor* CoordinatorService::ListJobs(grpc::CallbackServerContext* context,
                                                       const v1::ListJobsRequest* /*request*/,
                                                       v1::ListJobsResponse* response) {
  for (v1::JobStatus& job : core_.ListJobs()) *response->add_jobs() = std::move(job);
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* CoordinatorService::ListWorkers(grpc::CallbackServerContext* context,
                                                          const v1::ListWorkersRequest* /*request*/,
                                                          v1::ListWorkersResponse* response) {
  for (v1::WorkerInfo& w : core_.ListWorkers()) *response->add_workers() = std::move(w);
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerWriteReactor<v1::StateChunk>* CoordinatorService::FetchState(
    grpc::CallbackServerContext* /*context*/, const v1::FetchStateRequest* request) {
  return new FetchReactor(core_.StateFilesFor(*request), io_.Strand());
}

grpc::ServerReadReactor<v1::PutStateRequest>* CoordinatorService::PutState(
    grpc::CallbackServerContext* /*context*/, v1::PutStateResponse* response) {
  return new UploadReactor(&core_, response, io_.Strand(), transport_.before_state_write);
}

}  // namespace pipetrain::coordinator
