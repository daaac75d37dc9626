#include "server/link/exchange_service.h"

#include <grpc/grpc.h>
#include <grpcpp/server_builder.h>

#include <utility>

#include "common/wire/frame_codec.h"
#include "pipetrain/v1/worker.grpc.pb.h"
#include "server/link/stripe_registry.h"

namespace pipetrain::link {

// StageWorker with Exchange as a raw (grpc::ByteBuffer) callback method: registered under its
// service name, so reflection lists it, while frames stay undecoded ByteBuffers (frame_codec).
class ExchangeService::StageWorkerService final
    : public v1::StageWorker::WithRawCallbackMethod_Exchange<v1::StageWorker::Service> {
 public:
  StageWorkerService(const LinkOptions& options, AcceptFn accept)
      : options_(options), accept_(std::move(accept)) {}

  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* Exchange(
      grpc::CallbackServerContext* context) override {
    return internal::NewServerLinkReactor(context, options_, accept_, &registry_);
  }

 private:
  // Constant after construction.
  const LinkOptions options_;
  const AcceptFn accept_;
  // Groups the stripes of striped links.
  internal::StripeRegistry registry_;
};

absl::StatusOr<std::unique_ptr<ExchangeService>> ExchangeService::Create(const LinkOptions& options,
                                                                         AcceptFn accept) {
  if (absl::Status checked = options.Check(); !checked.ok()) return checked;
  if (!accept) return absl::InvalidArgumentError("ExchangeService: an accept callback is required");
  return std::unique_ptr<ExchangeService>(
      new ExchangeService(std::make_unique<StageWorkerService>(options, std::move(accept))));
}

ExchangeService::ExchangeService(std::unique_ptr<StageWorkerService> service)
    : service_(std::move(service)) {}

ExchangeService::~ExchangeService() = default;

void ExchangeService::RegisterOn(grpc::ServerBuilder* builder) {
  // Links worker.proto's descriptor into the program (Exchange is a raw method, so nothing else
  // refers to it): server reflection describes pipetrain.v1.StageWorker from it.
  static const void* volatile worker_proto = &descriptor_table_pipetrain_2fv1_2fworker_2eproto;
  static_cast<void>(worker_proto);
  builder->RegisterService(service_.get());
  builder->SetMaxReceiveMessageSize(static_cast<int>(wire::kMaxFrameMessageBytes));
  builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, 30000);
  builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 10000);
  builder->AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 10000);
  builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 0);
}

}  // namespace pipetrain::link
