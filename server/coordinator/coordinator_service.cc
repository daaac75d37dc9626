#include "server/coordinator/coordinator_service.h"

#include <grpcpp/grpcpp.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "server/coordinator/grpc_feed_link.h"

namespace pipetrain::coordinator {

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
      io_(transport_.io_threads),
      clients_(&core_),
      workers_(&core_, &io_, transport_.check_worker_certificates, transport_.before_state_write) {}

CoordinatorService::~CoordinatorService() { core_.Shutdown(); }

void CoordinatorService::RegisterOn(grpc::ServerBuilder& builder) {
  builder.RegisterService(&clients_);
  builder.RegisterService(&workers_);
}

std::vector<std::string> CoordinatorService::ServiceNames() {
  return {v1::Coordinator::service_full_name(), v1::WorkerControl::service_full_name()};
}

}  // namespace pipetrain::coordinator
