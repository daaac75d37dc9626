// ClientService: pipetrain.v1.Coordinator, the client API of the gRPC shell — jobs, training,
// checkpoints and the workers listing, answered from the CoordinatorCore.
#ifndef PIPETRAIN_SERVER_COORDINATOR_CLIENT_SERVICE_H_
#define PIPETRAIN_SERVER_COORDINATOR_CLIENT_SERVICE_H_

#include "pipetrain/v1/coordinator.grpc.pb.h"
#include "pipetrain/v1/coordinator.pb.h"
#include "server/coordinator/coordinator_core.h"

namespace pipetrain::coordinator {

// Thread-safe. `core` must outlive it.
class ClientService final : public v1::Coordinator::CallbackService {
 public:
  explicit ClientService(CoordinatorCore* core) : core_(core) {}

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
  grpc::ServerUnaryReactor* ListWorkers(grpc::CallbackServerContext* context,
                                        const v1::ListWorkersRequest* request,
                                        v1::ListWorkersResponse* response) override;
  grpc::ServerUnaryReactor* ProfileWorkers(grpc::CallbackServerContext* context,
                                           const v1::ProfileWorkersRequest* request,
                                           v1::ProfileWorkersResponse* response) override;
  grpc::ServerUnaryReactor* Checkpoint(grpc::CallbackServerContext* context,
                                       const v1::CheckpointRequest* request,
                                       v1::CheckpointResponse* response) override;
  grpc::ServerWriteReactor<v1::JobEvent>* WatchJob(grpc::CallbackServerContext* context,
                                                   const v1::WatchJobRequest* request) override;
  // Posts the evaluation to the job's thread (CoordinatorCore::Evaluate).
  grpc::ServerUnaryReactor* Evaluate(grpc::CallbackServerContext* context,
                                     const v1::EvaluateRequest* request,
                                     v1::EvaluateResult* response) override;
  // Posts the generation to the job's thread (CoordinatorCore::Generate); a client that cancels
  // the call ends it between two decode rounds.
  grpc::ServerUnaryReactor* Generate(grpc::CallbackServerContext* context,
                                     const v1::GenerateRequest* request,
                                     v1::GenerateResult* response) override;

 private:
  CoordinatorCore* const core_;
};

}  // namespace pipetrain::coordinator

#endif  // PIPETRAIN_SERVER_COORDINATOR_CLIENT_SERVICE_H_
