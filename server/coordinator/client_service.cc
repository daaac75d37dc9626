#include "server/coordinator/client_service.h"

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/net/principal.h"
#include "common/wire/grpc_status.h"
#include "server/coordinator/train_reactor.h"
#include "server/coordinator/watch_reactor.h"

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

// The principal the call acts as (net/principal.h): what TokenAuthProcessor recorded, "" on a
// server without client authentication.
std::string CallerOf(grpc::CallbackServerContext* context) {
  const std::shared_ptr<const grpc::AuthContext> auth = context->auth_context();
  if (auth == nullptr) return "";
  const std::vector<grpc::string_ref> values = auth->FindPropertyValues(net::kPrincipalProperty);
  return values.empty() ? "" : std::string(values.front().data(), values.front().size());
}

}  // namespace

grpc::ServerBidiReactor<v1::TrainRequest, v1::StepResult>* ClientService::Train(
    grpc::CallbackServerContext* context) {
  return new TrainReactor(core_, CallerOf(context));
}

grpc::ServerWriteReactor<v1::JobEvent>* ClientService::WatchJob(
    grpc::CallbackServerContext* context, const v1::WatchJobRequest* request) {
  return new WatchReactor(core_, *request, CallerOf(context));
}

grpc::ServerUnaryReactor* ClientService::CreateJob(grpc::CallbackServerContext* context,
                                                   const v1::CreateJobRequest* request,
                                                   v1::JobStatus* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  core_->CreateJob(request->spec(), CallerOf(context),
                   [reactor, response](absl::StatusOr<v1::JobStatus> status) {
                     if (status.ok()) *response = *std::move(status);
                     reactor->Finish(wire::ToGrpcStatus(status.status()));
                   });
  return reactor;
}

grpc::ServerUnaryReactor* ClientService::ProfileWorkers(grpc::CallbackServerContext* context,
                                                        const v1::ProfileWorkersRequest* request,
                                                        v1::ProfileWorkersResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  core_->ProfileWorkers(*request,
                        [reactor, response](absl::StatusOr<v1::ProfileWorkersResponse> result) {
                          if (result.ok()) *response = *std::move(result);
                          reactor->Finish(wire::ToGrpcStatus(result.status()));
                        });
  return reactor;
}

grpc::ServerUnaryReactor* ClientService::Checkpoint(grpc::CallbackServerContext* context,
                                                    const v1::CheckpointRequest* request,
                                                    v1::CheckpointResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  absl::Status posted = core_->CheckCaller(request->job(), CallerOf(context));
  if (posted.ok())
    posted = core_->PostClientRequest(request->job(), [this, reactor, request, response] {
      absl::StatusOr<v1::CheckpointResponse> result = core_->Checkpoint(*request);
      if (result.ok()) *response = *std::move(result);
      reactor->Finish(wire::ToGrpcStatus(result.status()));
    });
  if (!posted.ok()) reactor->Finish(wire::ToGrpcStatus(posted));
  return reactor;
}

grpc::ServerUnaryReactor* ClientService::Evaluate(grpc::CallbackServerContext* context,
                                                  const v1::EvaluateRequest* request,
                                                  v1::EvaluateResult* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  absl::Status posted = core_->CheckCaller(request->job(), CallerOf(context));
  if (posted.ok())
    posted = core_->PostClientRequest(request->job(), [this, reactor, request, response] {
      absl::StatusOr<v1::EvaluateResult> result = core_->Evaluate(*request);
      if (result.ok()) *response = *std::move(result);
      reactor->Finish(wire::ToGrpcStatus(result.status()));
    });
  if (!posted.ok()) reactor->Finish(wire::ToGrpcStatus(posted));
  return reactor;
}

grpc::ServerUnaryReactor* ClientService::Generate(grpc::CallbackServerContext* context,
                                                  const v1::GenerateRequest* request,
                                                  v1::GenerateResult* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  absl::Status posted = core_->CheckCaller(request->job(), CallerOf(context));
  if (posted.ok())
    posted = core_->PostClientRequest(request->job(), [this, context, reactor, request, response] {
      absl::StatusOr<v1::GenerateResult> result =
          core_->Generate(*request, [context] { return context->IsCancelled(); });
      if (result.ok()) *response = *std::move(result);
      reactor->Finish(wire::ToGrpcStatus(result.status()));
    });
  if (!posted.ok()) reactor->Finish(wire::ToGrpcStatus(posted));
  return reactor;
}

grpc::ServerUnaryReactor* ClientService::GetJob(grpc::CallbackServerContext* context,
                                                const v1::GetJobRequest* request,
                                                v1::JobStatus* response) {
  return Answer(context, core_->GetJob(request->job(), CallerOf(context)), response);
}

grpc::ServerUnaryReactor* ClientService::FinishJob(grpc::CallbackServerContext* context,
                                                   const v1::FinishJobRequest* request,
                                                   v1::JobStatus* response) {
  return Answer(context, core_->FinishJob(request->job(), CallerOf(context)), response);
}

grpc::ServerUnaryReactor* ClientService::CancelJob(grpc::CallbackServerContext* context,
                                                   const v1::CancelJobRequest* request,
                                                   v1::JobStatus* response) {
  return Answer(context, core_->CancelJob(request->job(), request->reason(), CallerOf(context)),
                response);
}

grpc::ServerUnaryReactor* ClientService::ListJobs(grpc::CallbackServerContext* context,
                                                  const v1::ListJobsRequest* /*request*/,
                                                  v1::ListJobsResponse* response) {
  for (v1::JobStatus& job : core_->ListJobs(CallerOf(context)))
    *response->add_jobs() = std::move(job);
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* ClientService::ListWorkers(grpc::CallbackServerContext* context,
                                                     const v1::ListWorkersRequest* /*request*/,
                                                     v1::ListWorkersResponse* response) {
  for (v1::WorkerInfo& w : core_->ListWorkers()) *response->add_workers() = std::move(w);
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace pipetrain::coordinator
