#include "server/link/exchange_service.h"

#include <grpc/grpc.h>
#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/server_builder.h>

#include <utility>

#include "common/wire/frame_codec.h"

namespace pipetrain::link {

// Hands every incoming generic call to a server link reactor (which rejects other methods).
class ExchangeService::GenericService final : public grpc::CallbackGenericService {
 public:
  GenericService(const LinkOptions& options, AcceptFn accept)
      : options_(options), accept_(std::move(accept)) {}

  grpc::ServerGenericBidiReactor* CreateReactor(
      grpc::GenericCallbackServerContext* context) override {
    return internal::NewServerLinkReactor(context, options_, accept_);
  }

 private:
  // Constant after construction.
  const LinkOptions options_;
  const AcceptFn accept_;
};

absl::StatusOr<std::unique_ptr<ExchangeService>> ExchangeService::Create(const LinkOptions& options,
                                                                         AcceptFn accept) {
  if (absl::Status checked = options.Check(); !checked.ok()) return checked;
  if (!accept) return absl::InvalidArgumentError("ExchangeService: an accept callback is required");
  return std::unique_ptr<ExchangeService>(
      new ExchangeService(std::make_unique<GenericService>(options, std::move(accept))));
}

ExchangeService::ExchangeService(std::unique_ptr<GenericService> service)
    : service_(std::move(service)) {}

ExchangeService::~ExchangeService() = default;

void ExchangeService::RegisterOn(grpc::ServerBuilder* builder) {
  builder->RegisterCallbackGenericService(service_.get());
  builder->SetMaxReceiveMessageSize(static_cast<int>(wire::kMaxFrameMessageBytes));
  builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, 30000);
  builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 10000);
  builder->AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 10000);
  builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 0);
}

}  // namespace pipetrain::link
