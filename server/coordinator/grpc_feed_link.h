// GrpcFeedLinkFactory: the gRPC shell's FeedLinkFactory — a link::PeerLink to the rank's
// StageWorker (Exchange), announcing the coordinator as the peer.
#ifndef PIPETRAIN_SERVER_COORDINATOR_GRPC_FEED_LINK_H_
#define PIPETRAIN_SERVER_COORDINATOR_GRPC_FEED_LINK_H_

#include <memory>

#include "server/coordinator/feed_link.h"
#include "server/link/peer_link.h"

namespace grpc {
class ChannelCredentials;
}  // namespace grpc

namespace pipetrain::coordinator {

class GrpcFeedLinkFactory final : public FeedLinkFactory {
 public:
  // `credentials`: TLS with the coordinator's certificate under mTLS; null: plaintext.
  GrpcFeedLinkFactory(link::LinkOptions options,
                      std::shared_ptr<grpc::ChannelCredentials> credentials)
      : options_(std::move(options)), credentials_(std::move(credentials)) {}

  absl::StatusOr<std::unique_ptr<FeedLink>> Dial(
      const FeedTarget& target, std::function<void(const absl::Status&)> on_error) override;

 private:
  const link::LinkOptions options_;
  const std::shared_ptr<grpc::ChannelCredentials> credentials_;
};

}  // namespace pipetrain::coordinator

#endif  // PIPETRAIN_SERVER_COORDINATOR_GRPC_FEED_LINK_H_
