// ExchangeService: the server side of StageWorker.Exchange, registered as the
// pipetrain.v1.StageWorker service with Exchange as a raw callback method (the stream carries
// grpc::ByteBuffers, encoded by common/wire/frame_codec).
//
// Each incoming stream is offered to the AcceptFn with the dialler's PeerHello and the server-side
// PeerLink; accepted streams then run exactly like a dialled PeerLink (see peer_link.h).
#ifndef PIPETRAIN_SERVER_LINK_EXCHANGE_SERVICE_H_
#define PIPETRAIN_SERVER_LINK_EXCHANGE_SERVICE_H_

#include <memory>

#include "absl/status/statusor.h"
#include "server/link/peer_link.h"

namespace grpc {
class ServerBuilder;
}  // namespace grpc

namespace pipetrain::link {

class ExchangeService {
 public:
  // Returns INVALID_ARGUMENT for bad options or a missing `accept`. `accept` runs on gRPC threads,
  // once per incoming stream, and must not block; it may run concurrently with itself.
  static absl::StatusOr<std::unique_ptr<ExchangeService>> Create(const LinkOptions& options,
                                                                 AcceptFn accept);
  ~ExchangeService();
  ExchangeService(const ExchangeService&) = delete;
  ExchangeService& operator=(const ExchangeService&) = delete;

  // Registers the pipetrain.v1.StageWorker service on `builder` (other methods are UNIMPLEMENTED,
  // as for any unregistered method; a server may also have a generic service) and sets what
  // Exchange needs server-wide: receive limit wire::kMaxFrameMessageBytes, keep-alive pings every
  // 30 s, and client pings accepted every 10 s. The service must outlive the server built from
  // `builder`. Not thread-safe with respect to `builder`.
  void RegisterOn(grpc::ServerBuilder* builder);

 private:
  class StageWorkerService;
  explicit ExchangeService(std::unique_ptr<StageWorkerService> service);

  const std::unique_ptr<StageWorkerService> service_;
};

}  // namespace pipetrain::link

#endif  // PIPETRAIN_SERVER_LINK_EXCHANGE_SERVICE_H_
