#include "server/coordinator/worker_control_service.h"

#include <grpcpp/grpcpp.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/net/transport_security.h"
#include "server/coordinator/join_reactor.h"
#include "server/coordinator/state_reactors.h"

namespace pipetrain::coordinator {

grpc::ServerBidiReactor<v1::WorkerEvent, v1::WorkerCommand>* WorkerControlService::Join(
    grpc::CallbackServerContext* context) {
  std::optional<std::vector<std::string>> names;
  if (check_certificates_) {
    const std::shared_ptr<const grpc::AuthContext> auth = context->auth_context();
    names = auth == nullptr ? std::vector<std::string>() : net::PeerCertificateNames(*auth);
  }
  return new JoinReactor(core_, std::move(names));
}

grpc::ServerWriteReactor<v1::StateChunk>* WorkerControlService::FetchState(
    grpc::CallbackServerContext* /*context*/, const v1::FetchStateRequest* request) {
  return new FetchReactor(core_->StateFilesFor(*request), io_->Strand());
}

grpc::ServerReadReactor<v1::PutStateRequest>* WorkerControlService::PutState(
    grpc::CallbackServerContext* /*context*/, v1::PutStateResponse* response) {
  return new UploadReactor(core_, response, io_->Strand(), before_state_write_);
}

}  // namespace pipetrain::coordinator
