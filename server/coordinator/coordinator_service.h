// CoordinatorService: the coordinator's gRPC shell (pipetrain.v1.Coordinator). It owns the
// transport-free CoordinatorCore (coordinator_core.h) and only moves messages: unary calls are
// answered from the core's results, the streams are reactors (join_reactor.h, train_reactor.h,
// state_reactors.h) whose disk I/O runs on the shell's own I/O threads.
#ifndef PIPETRAIN_SERVER_COORDINATOR_COORDINATOR_SERVICE_H_
#define PIPETRAIN_SERVER_COORDINATOR_COORDINATOR_SERVICE_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "pipetrain/v1/coordinator.grpc.pb.h"
#include "pipetrain/v1/coordinator.pb.h"
#include "server/coordinator/coordinator_core.h"
#include "server/coordinator/io_pool.h"
#include "server/coordinator/shard_transfer.h"
#include "server/link/peer_link.h"

namespace grpc {
class ChannelCredentials;
class ServerBuilder;
}  // namespace grpc

namespace pipetrain::coordinator {

// The shell's own options: how it reaches workers and stores checkpoint files.
struct ServiceTransport {
  // Options of the data links the coordinator opens to the first and last chunk owners.
  link::LinkOptions link;
  // Credentials of those links (the workers' Exchange servers): TLS with the coordinator's
  // certificate under mTLS (net::MakeChannelCredentials). Null (default): plaintext.
  std::shared_ptr<grpc::ChannelCredentials> link_credentials;
  // RegisterWorker is refused (PERMISSION_DENIED) unless the Join stream's verified TLS client
  // certificate names the host the worker advertises (net::CheckCertificateNamesHost). Set with
  // mTLS. Default false.
  bool check_worker_certificates = false;
  // Threads for checkpoint uploads and downloads (disk I/O). Default 2.
  int io_threads = 2;
  // Called on an I/O thread before each chunk of an uploaded checkpoint file is written (tests:
  // a slow disk). Default none.
  ShardUpload::WriteHook before_state_write;

  // OK, or INVALID_ARGUMENT naming the bad field.
  absl::Status Check() const;
};

// Thread-safe: every public method may be called from any thread. Create it, register it on a
// grpc::ServerBuilder, start the server; to stop, call Shutdown(), then shut the server down,
// then destroy the service.
class CoordinatorService final : public v1::Coordinator::CallbackService {
 public:
  explicit CoordinatorService(CoordinatorOptions options = {}, ServiceTransport transport = {});
  ~CoordinatorService() override;
  CoordinatorService(const CoordinatorService&) = delete;
  CoordinatorService& operator=(const CoordinatorService&) = delete;

  // CoordinatorCore::Shutdown and OpenJournal.
  void Shutdown() { core_.Shutdown(); }
  absl::Status OpenJournal(const std::string& state_dir) { return core_.OpenJournal(state_dir); }

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
  grpc::ServerUnaryReactor* ListWorkers(grpc::CallbackServerContext* context,
                                        const v1::ListWorkersRequest* request,
                                        v1::ListWorkersResponse* response) override;
  grpc::ServerUnaryReactor* Checkpoint(grpc::CallbackServerContext* context,
                                       const v1::CheckpointRequest* request,
                                       v1::CheckpointResponse* response) override;
  grpc::ServerWriteReactor<v1::StateChunk>* FetchState(
      grpc::CallbackServerContext* context, const v1::FetchStateRequest* request) override;
  grpc::ServerReadReactor<v1::PutStateRequest>* PutState(grpc::CallbackServerContext* context,
                                                         v1::PutStateResponse* response) override;

 private:
  const ServiceTransport transport_;
  CoordinatorCore core_;
  IoPool io_;  // after core_: destroyed first, its queued tasks may still call the core.
};

// Sets on `builder` (of a server that registers the CoordinatorService) the ping policy that lets
// clients and workers keep their connections alive: HTTP/2 pings every 0.5 s or slower are
// accepted, with or without calls in flight and however long no data moves. gRPC's default (at
// most one ping per 5 minutes without data) answers a client's keepalive (client::ClientOptions,
// every 5 s by default) with GOAWAY "too_many_pings" during a long step. Not thread-safe (as
// the builder).
void AllowClientKeepalive(grpc::ServerBuilder& builder);

}  // namespace pipetrain::coordinator

#endif  // PIPETRAIN_SERVER_COORDINATOR_COORDINATOR_SERVICE_H_
