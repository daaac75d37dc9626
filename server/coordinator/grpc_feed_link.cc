#include "server/coordinator/grpc_feed_link.h"

#include <grpcpp/grpcpp.h>

#include <utility>

#include "absl/strings/str_cat.h"

namespace pipetrain::coordinator {
namespace {

class PeerFeedLink final : public FeedLink {
 public:
  explicit PeerFeedLink(std::unique_ptr<link::PeerLink> link) : link_(std::move(link)) {}
  ~PeerFeedLink() override { link_->Shutdown(); }

  absl::Status Send(const wire::TensorKey& key,
                    std::shared_ptr<const math::Matrix> tensor) override {
    return link_->Send(key, std::move(tensor));
  }
  absl::Status status() const override { return link_->status(); }
  void Shutdown() override { link_->Shutdown(); }

 private:
  const std::unique_ptr<link::PeerLink> link_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<FeedLink>> GrpcFeedLinkFactory::Dial(
    const FeedTarget& target, std::function<void(const absl::Status&)> on_error) {
  link::PeerHello hello;
  hello.peer = link::kCoordinatorPeer;
  hello.identity.job = target.job;
  hello.identity.generation = target.generation;
  hello.secret = target.secret;
  link::LinkSettings settings;
  settings.validation.expected = hello.identity;
  settings.validation.num_microbatches = target.microbatches;
  settings.validation.num_chunks = target.chunks;
  settings.validation.allowed_kinds = 0;  // the coordinator receives no tensors.
  settings.callbacks.on_tensor = [](const wire::TensorKey& key, math::Matrix) {
    return absl::InvalidArgumentError(
        absl::StrCat("the coordinator accepts no tensors, got ", key.ToString()));
  };
  settings.callbacks.on_error = std::move(on_error);
  absl::StatusOr<std::unique_ptr<link::PeerLink>> link =
      link::PeerLink::Connect(link::CreateExchangeChannel(target.address, credentials_),
                              target.address, hello, options_, std::move(settings));
  if (!link.ok()) return link.status();
  return std::unique_ptr<FeedLink>(std::make_unique<PeerFeedLink>(*std::move(link)));
}

}  // namespace pipetrain::coordinator
