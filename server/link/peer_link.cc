#include "server/link/peer_link.h"

#include <grpc/grpc.h>
#include <grpcpp/channel.h>
#include <grpcpp/client_context.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/support/channel_arguments.h>
#include <grpcpp/support/client_callback.h>
#include <grpcpp/support/server_callback.h>

#include <algorithm>
#include <deque>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/wire/grpc_status.h"
#include "server/link/link_core.h"
#include "server/link/stripe_group.h"
#include "server/link/stripe_registry.h"

namespace pipetrain::link {
namespace internal {
namespace {

// Call metadata carrying the PeerHello ("-bin": arbitrary bytes, base64 on the wire).
constexpr char kPeerKey[] = "pipetrain-peer-bin";
constexpr char kJobKey[] = "pipetrain-job-bin";
constexpr char kGenerationKey[] = "pipetrain-generation";
constexpr char kSecretKey[] = "pipetrain-link-secret-bin";  // optional

// The dialling end of an Exchange stream.
class ClientLinkReactor final : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>,
                                public StreamOps {
 public:
  // Holds no reference to `channel` (the core does): dropping the last reference to a
  // grpc::Channel inside a callback (our OnDone) can shut down gRPC's callback completion queue
  // from one of its own threads.
  ClientLinkReactor(std::shared_ptr<LinkCore> core, const std::shared_ptr<grpc::Channel>& channel,
                    const PeerHello& hello, const StripeHello& stripe)
      : core_(std::move(core)) {
    context_.AddMetadata(kPeerKey, hello.peer);
    context_.AddMetadata(kJobKey, hello.identity.job);
    context_.AddMetadata(kGenerationKey, absl::StrCat(hello.identity.generation));
    if (!hello.secret.empty()) context_.AddMetadata(kSecretKey, hello.secret);
    if (stripe.count > 1) {
      context_.AddMetadata(kStripeKey, absl::StrCat(stripe.index, "/", stripe.count));
      context_.AddMetadata(kLinkIdKey, stripe.link_id);
    }
    grpc::GenericStub stub(channel);
    stub.PrepareBidiStreamingCall(&context_, kExchangeMethod, grpc::StubOptions(), this);
    AddHold();  // Writes are started from Send() outside reactions; removed by EndOp.
  }

  void Begin() {
    core_->Start(this);
    StartCall();
  }

  void OnReadDone(bool ok) override { core_->OnReadDone(ok); }
  void OnWriteDone(bool ok) override { core_->OnWriteDone(ok); }
  void OnDone(const grpc::Status& status) override {
    std::shared_ptr<LinkCore> core = core_;
    core->OnDone(status);
    delete this;
    core->MarkClosed();
  }

  void StartReadOp(grpc::ByteBuffer* buffer) override { StartRead(buffer); }
  void StartWriteOp(const grpc::ByteBuffer* buffer) override { StartWrite(buffer); }
  void CancelOp() override { context_.TryCancel(); }
  void EndOp(const grpc::Status& /*status*/) override { RemoveHold(); }

 private:
  const std::shared_ptr<LinkCore> core_;
  grpc::ClientContext context_;
};

// The accepting end of an Exchange stream.
class ServerLinkReactor final : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>,
                                public StreamOps {
 public:
  explicit ServerLinkReactor(grpc::CallbackServerContext* context) : context_(context) {}

  void Begin(const LinkOptions& options, const AcceptFn& accept, StripeRegistry* registry) {
    absl::StatusOr<PeerHello> hello = ParseHello();
    absl::StatusOr<StripeHello> stripe = absl::UnknownError("");
    if (hello.ok()) {
      stripe = ParseStripeHello(Metadata(kStripeKey), Metadata(kLinkIdKey), context_->peer());
    }
    absl::StatusOr<std::shared_ptr<StripeGroup>> group =
        !hello.ok()    ? hello.status()
        : !stripe.ok() ? stripe.status()
                       : registry->Join(*hello, *stripe, options, accept);
    if (!group.ok()) {
      Finish(wire::ToGrpcStatus(group.status()));
      return;
    }
    core_ = (*group)->stripe(stripe->index);
    core_->Start(this);
  }

  void OnReadDone(bool ok) override { core_->OnReadDone(ok); }
  void OnWriteDone(bool ok) override { core_->OnWriteDone(ok); }
  void OnCancel() override {
    if (core_ != nullptr) core_->OnCancel();
  }
  void OnDone() override {
    std::shared_ptr<LinkCore> core = core_;
    if (core != nullptr) core->OnDone(grpc::Status::OK);
    delete this;
    if (core != nullptr) core->MarkClosed();
  }

  void StartReadOp(grpc::ByteBuffer* buffer) override { StartRead(buffer); }
  void StartWriteOp(const grpc::ByteBuffer* buffer) override { StartWrite(buffer); }
  void CancelOp() override {}
  void EndOp(const grpc::Status& status) override { Finish(status); }

 private:
  std::optional<std::string> Metadata(const char* key) const {
    const auto& metadata = context_->client_metadata();
    auto it = metadata.find(key);
    if (it == metadata.end()) return std::nullopt;
    return std::string(it->second.data(), it->second.size());
  }

  absl::StatusOr<PeerHello> ParseHello() const {
    auto value = [this](const char* key) { return Metadata(key); };
    PeerHello hello;
    std::optional<std::string> peer = value(kPeerKey);
    std::optional<std::string> job = value(kJobKey);
    std::optional<std::string> generation = value(kGenerationKey);
    if (!peer || !job || !generation) {
      return absl::InvalidArgumentError(absl::StrCat("Exchange stream from ", context_->peer(),
                                                     " lacks the ", kPeerKey, ", ", kJobKey,
                                                     " and ", kGenerationKey, " metadata"));
    }
    if (!absl::SimpleAtoi(*generation, &hello.identity.generation) ||
        hello.identity.generation < 0) {
      return absl::InvalidArgumentError(absl::StrCat("Exchange stream from ", context_->peer(),
                                                     ": bad generation '", *generation, "'"));
    }
    hello.peer = *std::move(peer);
    hello.identity.job = *std::move(job);
    hello.secret = value(kSecretKey).value_or("");
    return hello;
  }

  grpc::CallbackServerContext* const context_;
  std::shared_ptr<LinkCore> core_;  // null if the stream was rejected.
};

}  // namespace

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* NewServerLinkReactor(
    grpc::CallbackServerContext* context, const LinkOptions& options, const AcceptFn& accept,
    StripeRegistry* registry) {
  auto* reactor = new ServerLinkReactor(context);
  reactor->Begin(options, accept, registry);
  return reactor;
}

}  // namespace internal

absl::Status LinkOptions::Check() const {
  if (fragment_bytes < wire::kMinFragmentBytes || fragment_bytes > wire::kMaxFragmentBytes) {
    return absl::InvalidArgumentError(absl::StrCat("link fragment_bytes ", fragment_bytes,
                                                   " outside [", wire::kMinFragmentBytes, ", ",
                                                   wire::kMaxFragmentBytes, "]"));
  }
  if (window_bytes < wire::kMaxFragmentBytes || window_bytes > (int64_t{1} << 34)) {
    return absl::InvalidArgumentError(absl::StrCat("link window_bytes ", window_bytes, " outside [",
                                                   wire::kMaxFragmentBytes, ", 16 GiB]"));
  }
  if (stripe_min_bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("link stripe_min_bytes ", stripe_min_bytes, " is negative"));
  }
  return absl::OkStatus();
}

PeerLink::PeerLink(std::shared_ptr<internal::StripeGroup> group) : group_(std::move(group)) {}

PeerLink::~PeerLink() {
  group_->Shutdown();
  if (!group_->client_side()) return;
  // Release the channels only once the calls are over, and never on a gRPC callback thread (see
  // ClientLinkReactor); where that cannot be guaranteed, keep them for the life of the process.
  const bool in_callback = internal::InLinkCallback();
  for (int i = 0; i < group_->stripes(); ++i) {
    const std::shared_ptr<internal::LinkCore>& core = group_->stripe(i);
    if (in_callback ||
        !core->WaitFor([](const LinkStats& s) { return s.closed; }, absl::Seconds(30))) {
      internal::KeepForever(core->TakeChannel());
      continue;
    }
    std::shared_ptr<grpc::Channel> channel = core->TakeChannel();
    channel.reset();
  }
}

absl::StatusOr<std::unique_ptr<PeerLink>> PeerLink::Connect(std::shared_ptr<grpc::Channel> channel,
                                                            std::string peer,
                                                            const PeerHello& hello,
                                                            const LinkOptions& options,
                                                            LinkSettings settings) {
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  channels.push_back(std::move(channel));
  return Connect(std::move(channels), std::move(peer), hello, options, std::move(settings));
}

absl::StatusOr<std::unique_ptr<PeerLink>> PeerLink::Connect(
    std::vector<std::shared_ptr<grpc::Channel>> channels, std::string peer, const PeerHello& hello,
    const LinkOptions& options, LinkSettings settings) {
  if (channels.empty() || static_cast<int>(channels.size()) > kMaxLinkConnections) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Connect: ", channels.size(), " channels, expected 1 to ", kMaxLinkConnections));
  }
  for (const auto& channel : channels) {
    if (channel == nullptr) return absl::InvalidArgumentError("Connect: no channel");
  }
  if (absl::Status checked = options.Check(); !checked.ok()) return checked;
  if (absl::Status checked = settings.validation.Check(); !checked.ok()) return checked;
  if (!settings.callbacks.on_tensor) {
    return absl::InvalidArgumentError("Connect: LinkCallbacks::on_tensor is required");
  }
  if (hello.identity.generation < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("Connect: negative generation ", hello.identity.generation));
  }
  const int count = static_cast<int>(channels.size());
  std::shared_ptr<internal::StripeGroup> group =
      internal::StripeGroup::Create(/*client_side=*/true, std::move(peer), options, count);
  group->Configure(std::move(settings), hello.identity);
  internal::StripeHello stripe;
  stripe.count = count;
  if (count > 1) {
    // Random, so that a link's stripes find each other and no other link's (16 bytes).
    std::random_device random;
    for (int i = 0; i < 4; ++i) {
      const uint32_t word = random();
      stripe.link_id.append(reinterpret_cast<const char*>(&word), sizeof(word));
    }
  }
  for (int i = 0; i < count; ++i) {
    stripe.index = i;
    group->stripe(i)->SetChannel(channels[i]);
    auto* reactor = new internal::ClientLinkReactor(group->stripe(i), channels[i], hello, stripe);
    reactor->Begin();
  }
  return std::make_unique<PeerLink>(std::move(group));
}

absl::Status PeerLink::Send(const wire::TensorKey& key,
                            std::shared_ptr<const math::Matrix> tensor) {
  return group_->Send(key, std::move(tensor));
}

void PeerLink::Shutdown() { group_->Shutdown(); }

LinkStats PeerLink::stats() const { return group_->stats(); }

bool PeerLink::WaitFor(const std::function<bool(const LinkStats&)>& condition,
                       absl::Duration timeout) const {
  return group_->WaitFor(condition, timeout);
}

absl::Status PeerLink::status() const { return group_->status(); }

const std::string& PeerLink::peer() const { return group_->peer(); }

int PeerLink::connections() const { return group_->stripes(); }

grpc::ChannelArguments ExchangeChannelArguments() {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(static_cast<int>(wire::kMaxFrameMessageBytes));
  args.SetMaxSendMessageSize(-1);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 20000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 10000);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 0);
  return args;
}

std::shared_ptr<grpc::Channel> CreateExchangeChannel(
    const std::string& target, std::shared_ptr<grpc::ChannelCredentials> credentials) {
  if (credentials == nullptr) credentials = grpc::InsecureChannelCredentials();
  return grpc::CreateCustomChannel(target, credentials, ExchangeChannelArguments());
}

std::vector<std::shared_ptr<grpc::Channel>> CreateExchangeChannels(
    const std::string& target, int count, std::shared_ptr<grpc::ChannelCredentials> credentials) {
  if (credentials == nullptr) credentials = grpc::InsecureChannelCredentials();
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  for (int i = 0; i < count; ++i) {
    grpc::ChannelArguments args = ExchangeChannelArguments();
    if (count > 1) {
      // Channels with equal arguments may share a subchannel (one TCP connection) through gRPC's
      // global pool: a local pool and a distinct argument give each stripe its own.
      args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
      args.SetInt("pipetrain.link_stripe", i);
    }
    channels.push_back(grpc::CreateCustomChannel(target, credentials, args));
  }
  return channels;
}

int AutoLinkConnections(int hardware_threads, int compute_threads) {
  if (hardware_threads <= compute_threads + 1) return 1;
  return std::min(4, hardware_threads - compute_threads);
}

}  // namespace pipetrain::link
