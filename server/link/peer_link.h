// PeerLink: one StageWorker.Exchange stream to a neighbour (or from the coordinator), carrying
// tensor frames both ways with an application-level credit window.
//
// The lower stage dials the higher one (PeerLink::Connect); the higher stage gets its end from
// ExchangeService's accept callback. Both ends are the same class: Send() queues a tensor without
// blocking or copying; received tensors are handed to LinkCallbacks::on_tensor; a broken stream or
// a bad frame is reported once to LinkCallbacks::on_error.
//
// Credit protocol (docs/wire.md): each end grants its peer `window_bytes` of payload when the
// stream starts and grants again as it consumes frames; a sender writes a fragment only while it
// holds enough credit, so at most window_bytes of this link's payload is ever in flight or under
// reassembly at the receiver.
//
// Threading: the gRPC callback API runs every reaction on gRPC threads; at most one read and one
// write are in flight per stream; reactions never block (the only work in them is decoding one
// frame, i.e. one memcpy of at most one fragment, and the non-blocking user callbacks).
#ifndef PIPETRAIN_SERVER_LINK_PEER_LINK_H_
#define PIPETRAIN_SERVER_LINK_PEER_LINK_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/math/tensor.h"
#include "common/wire/frame_codec.h"
#include "common/wire/tensor_key.h"

namespace grpc {
class Channel;
class ChannelCredentials;
class ChannelArguments;
class CallbackServerContext;
template <class Request, class Response>
class ServerBidiReactor;
}  // namespace grpc

namespace pipetrain::link {

namespace internal {
class StripeGroup;
class StripeRegistry;
}  // namespace internal

// The full gRPC method name of StageWorker.Exchange.
inline constexpr char kExchangeMethod[] = "/pipetrain.v1.StageWorker/Exchange";

// Most HTTP/2 connections ("stripes") one link may use (stage_worker --link-connections).
inline constexpr int kMaxLinkConnections = 8;

// PeerHello.peer of the coordinator's feed streams (inputs and targets), and the prefix of a
// stage worker's ("stage/<rank>").
inline constexpr char kCoordinatorPeer[] = "coordinator";
inline constexpr char kStagePeerPrefix[] = "stage/";

struct LinkOptions {
  // Payload bytes per Frame when sending (the "chunk size"); in [1 MiB, 4 MiB]. Default 1 MiB.
  int64_t fragment_bytes = wire::kDefaultFragmentBytes;
  // Receive window granted to the peer: payload bytes it may have in flight towards us.
  // >= wire::kMaxFragmentBytes (so any legal fragment fits). Default 8 MiB.
  int64_t window_bytes = int64_t{8} << 20;
  // On a link of several connections (Connect with several channels): tensors of at least this
  // many bytes are split into one block per connection; smaller ones go whole on the first.
  // >= 0. Default 4 MiB (docs/wire.md §5).
  int64_t stripe_min_bytes = int64_t{4} << 20;
  // On a link of several connections: send the tensors that are not split whole, round-robin
  // over the connections, instead of all on the first (measured in stream_bench --round_robin;
  // docs/wire.md §5). Default false.
  bool round_robin_whole = false;

  // OK, or INVALID_ARGUMENT naming the bad field.
  absl::Status Check() const;
};

// One tensor that crossed a link (LinkCallbacks::on_transfer), on the steady clock.
struct LinkTransfer {
  using Clock = std::chrono::steady_clock;
  enum class Direction { kSend, kReceive };
  Direction direction = Direction::kSend;
  wire::TensorKey key;
  int64_t bytes = 0;  // payload bytes.
  // kSend: Send() accepted the tensor. kReceive: its first fragment was read.
  std::chrono::steady_clock::time_point start;
  // kSend: gRPC completed the write of its last fragment. kReceive: its last fragment was read
  // and the tensor reassembled, just before on_tensor.
  std::chrono::steady_clock::time_point end;
};

// Callbacks of one link. Both run on gRPC threads and must not block (e.g. Mailbox::Put); they may
// call Send() and Shutdown() on this or any link.
struct LinkCallbacks {
  // Receives each complete tensor, in stream order on a one-connection link; on a striped link
  // in the order their last bytes arrive, possibly concurrently from several connections'
  // threads. Returning an error closes the stream with it
  // (and reports it to on_error), e.g. a duplicate key refused by the mailbox. Credit for the
  // tensor's last fragment is returned to the peer after this returns. Required.
  std::function<absl::Status(const wire::TensorKey& key, math::Matrix tensor)> on_tensor;
  // Called at most once, when the link fails: the stream broke or ended (UNAVAILABLE unless the
  // peer gave a status), the peer sent a bad frame (its validation code: INVALID_ARGUMENT,
  // ABORTED for a stale generation, ...), or on_tensor failed. Not called after Shutdown().
  // Optional.
  std::function<void(const absl::Status& status)> on_error;
  // Called once per tensor sent (after its last write completed) and received (just before
  // on_tensor, so that the report happens before anything the tensor sets off), for timelines;
  // not for a tensor dropped by Shutdown() or a failure. Optional.
  std::function<void(const LinkTransfer& transfer)> on_transfer;
};

// How a link validates and delivers what it receives.
struct LinkSettings {
  wire::FrameValidation validation;
  LinkCallbacks callbacks;
};

// Who opens a stream: sent by the client as call metadata, checked by the server's AcceptFn.
struct PeerHello {
  std::string peer;               // the dialler's name, e.g. "stage/1" or "coordinator".
  wire::StreamIdentity identity;  // the job and generation the dialler will send frames for.
  std::string secret;  // the (job, generation)'s link secret (Assign.link_secret); may be "".
};

// Counters of one link; a consistent snapshot taken under the link's lock.
struct LinkStats {
  int64_t tensors_sent = 0;        // tensors whose last fragment has been handed to gRPC (a
                                   // striped tensor: whose every block has been written).
  int64_t tensors_received = 0;    // tensors delivered to on_tensor.
  int64_t striped_sent = 0;        // of tensors_sent, those split over several connections.
  int64_t bytes_sent = 0;          // payload bytes handed to gRPC.
  int64_t bytes_received = 0;      // payload bytes received.
  int64_t queued_tensors = 0;      // accepted by Send() and not completely handed to gRPC.
  int64_t credit_bytes = 0;        // payload bytes we may still send before new credit arrives.
  int64_t credit_granted = 0;      // total credit received from the peer.
  int64_t peak_in_flight = 0;      // max over time of bytes_sent - (credit_granted - window):
                                   // never above the peer's window.
  int64_t credit_stalls = 0;       // times a fragment was ready but credit was short.
  bool blocked_on_credit = false;  // a fragment is waiting for credit right now.
  bool writing = false;            // a write is in flight: gRPC has not yet reported it done.
  bool closed = false;             // the stream is over (shut down, failed or ended).
};

// A bidirectional tensor link over one Exchange stream. Thread-safe: every method may be called
// concurrently from any thread. Destroying the link shuts it down.
class PeerLink {
 public:
  // Opens an Exchange stream on `channel` (see CreateExchangeChannel) to the peer named `peer`
  // (its address or stage, used in messages), announcing `hello` (who we are). Frames sent go out
  // under hello.identity; frames received are checked against settings.validation.
  // Returns INVALID_ARGUMENT for bad options or settings. Connection errors are not reported here
  // but through on_error (the stream starts asynchronously), typically as UNAVAILABLE.
  static absl::StatusOr<std::unique_ptr<PeerLink>> Connect(std::shared_ptr<grpc::Channel> channel,
                                                           std::string peer, const PeerHello& hello,
                                                           const LinkOptions& options,
                                                           LinkSettings settings);

  // A striped link: one Exchange stream on each of `channels` (1 to kMaxLinkConnections, each
  // its own connection: see CreateExchangeChannels), the stripes of one link (docs/wire.md §5).
  // Tensors of at least options.stripe_min_bytes are split over them. Errors as above, and
  // INVALID_ARGUMENT for no channel, a null one, or more than kMaxLinkConnections. The link fails
  // (on_error, once) when any stripe fails.
  static absl::StatusOr<std::unique_ptr<PeerLink>> Connect(
      std::vector<std::shared_ptr<grpc::Channel>> channels, std::string peer,
      const PeerHello& hello, const LinkOptions& options, LinkSettings settings);

  // Internal: wraps a link's shared state (use Connect, or ExchangeService's AcceptFn).
  explicit PeerLink(std::shared_ptr<internal::StripeGroup> group);

  // The number of connections (stripes) of this link.
  int connections() const;

  ~PeerLink();
  PeerLink(const PeerLink&) = delete;
  PeerLink& operator=(const PeerLink&) = delete;

  // Queues `tensor` for sending under `key` and returns at once; the tensor is not copied and must
  // not be modified afterwards (the link holds a reference until its last frame is released by
  // gRPC). Tensors go out in Send() order, each as consecutive fragments.
  // Errors: INVALID_ARGUMENT for a null/empty tensor or a bad key; the link's failure status, or
  // FAILED_PRECONDITION after Shutdown(), if the link is closed.
  absl::Status Send(const wire::TensorKey& key, std::shared_ptr<const math::Matrix> tensor);

  // Closes the stream: queued tensors are dropped, no callback starts after this returns, and a
  // callback running on another thread is waited for (unless Shutdown is called from inside a
  // callback). The peer sees the stream end (UNAVAILABLE). Idempotent.
  void Shutdown();

  // Counters (see LinkStats).
  LinkStats stats() const;

  // Blocks until `condition(stats())` holds or `timeout` passes; returns whether it held. The
  // condition is re-evaluated under the link's lock whenever the counters change: it must be
  // quick and must not call into the link.
  bool WaitFor(const std::function<bool(const LinkStats&)>& condition,
               absl::Duration timeout) const;

  // OK while the link is healthy; the failure status once it failed (as given to on_error).
  absl::Status status() const;

  // The peer's name: hello.peer on the server side, Connect's `peer` on the client side.
  const std::string& peer() const;

 private:
  std::shared_ptr<internal::StripeGroup> group_;
};

// Decides whether to accept an incoming Exchange stream (called once per stream, on a gRPC thread;
// must not block). `link` is the server end, not yet reading: keep it to send on it (dropping it
// shuts the stream down). Return the settings to receive with, or an error to reject the stream
// with (e.g. ABORTED for a stale generation, FAILED_PRECONDITION for an unknown job); the error is
// the client's stream status.
using AcceptFn = std::function<absl::StatusOr<LinkSettings>(const PeerHello& hello,
                                                            std::unique_ptr<PeerLink> link)>;

// Channel arguments for Exchange channels: receive limit wire::kMaxFrameMessageBytes, unlimited
// send, keep-alive pings every 20 s (timeout 10 s) while streams are open.
grpc::ChannelArguments ExchangeChannelArguments();

// A channel to `target` ("host:port") for Exchange streams; `credentials` default to insecure.
std::shared_ptr<grpc::Channel> CreateExchangeChannel(
    const std::string& target, std::shared_ptr<grpc::ChannelCredentials> credentials = nullptr);

// `count` channels to `target`, each on its own TCP connection (a local subchannel pool and a
// distinct channel argument per channel, so gRPC shares no subchannel between them).
std::vector<std::shared_ptr<grpc::Channel>> CreateExchangeChannels(
    const std::string& target, int count,
    std::shared_ptr<grpc::ChannelCredentials> credentials = nullptr);

// The number of connections `stage_worker --link-connections auto` gives a link: 1 unless the
// host has hardware threads to spare beyond the job's compute threads and one for the worker's
// own I/O (hardware_threads > compute_threads + 1); then min(4, hardware_threads -
// compute_threads). docs/wire.md §5.
int AutoLinkConnections(int hardware_threads, int compute_threads);

namespace internal {
// Creates the server-side reactor of one Exchange stream (used by ExchangeService). The reactor
// deletes itself when the stream is done.
// `registry` groups the stripes of striped links (one per service).
grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* NewServerLinkReactor(
    grpc::CallbackServerContext* context, const LinkOptions& options, const AcceptFn& accept,
    StripeRegistry* registry);
}  // namespace internal

}  // namespace pipetrain::link

#endif  // PIPETRAIN_SERVER_LINK_PEER_LINK_H_
