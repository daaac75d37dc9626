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
  std::optional<net::PeerCertificate> certificate;
  if (check_certificates_) {
    const std::shared_ptr<const grpc::AuthContext> auth = context->auth_context();
    certificate = auth == nullptr ? net::PeerCertificate() : net::PeerCertificateOf(*auth);
  }
  return new JoinReactor(core_, std::move(certificate));
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
