// WorkerControlService: pipetrain.v1.WorkerControl, the stage workers' side of the gRPC shell —
// their control streams (Join) and checkpoint transfers (FetchState, PutState), whose disk I/O
// runs on the shell's IoPool.
#ifndef PIPETRAIN_SERVER_COORDINATOR_WORKER_CONTROL_SERVICE_H_
#define PIPETRAIN_SERVER_COORDINATOR_WORKER_CONTROL_SERVICE_H_

#include "pipetrain/v1/worker_control.grpc.pb.h"
#include "pipetrain/v1/worker_control.pb.h"
#include "server/coordinator/coordinator_core.h"
#include "server/coordinator/io_pool.h"
#include "server/coordinator/shard_transfer.h"

namespace pipetrain::coordinator {

// Thread-safe. `core` and `io` must outlive it.
class WorkerControlService final : public v1::WorkerControl::CallbackService {
 public:
  // `check_certificates`: a registration must name a host and a worker name its TLS certificate
  // vouches for (net::CheckCertificateVouchesForWorker).
  WorkerControlService(CoordinatorCore* core, IoPool* io, bool check_certificates,
                       ShardUpload::WriteHook before_state_write)
      : core_(core),
        io_(io),
        check_certificates_(check_certificates),
        before_state_write_(std::move(before_state_write)) {}

  grpc::ServerBidiReactor<v1::WorkerEvent, v1::WorkerCommand>* Join(
      grpc::CallbackServerContext* context) override;
  grpc::ServerWriteReactor<v1::StateChunk>* FetchState(
      grpc::CallbackServerContext* context, const v1::FetchStateRequest* request) override;
  grpc::ServerReadReactor<v1::PutStateRequest>* PutState(grpc::CallbackServerContext* context,
                                                         v1::PutStateResponse* response) override;

 private:
  CoordinatorCore* const core_;
  IoPool* const io_;
  const bool check_certificates_;
  const ShardUpload::WriteHook before_state_write_;
};

}  // namespace pipetrain::coordinator

#endif  // PIPETRAIN_SERVER_COORDINATOR_WORKER_CONTROL_SERVICE_H_
