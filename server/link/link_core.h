// LinkCore: the state machine of one Exchange stream (one stripe of a PeerLink): send queue,
// credit accounting, the stream's reads and writes, failure reporting (docs/wire.md §3-4).
// Internal to pipetrain_link: PeerLink and the stripe group (stripe_group.h) drive it; the
// reactors in peer_link.cc implement its StreamOps.
#ifndef PIPETRAIN_SERVER_LINK_LINK_CORE_H_
#define PIPETRAIN_SERVER_LINK_LINK_CORE_H_

#include <grpcpp/channel.h>
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/status.h>

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/wire/frame_codec.h"
#include "common/wire/tensor_reassembler.h"
#include "server/link/peer_link.h"

namespace pipetrain::link::internal {

// Upper bound on the credit a peer may grant us in total outstanding (a sanity check against
// overflow; real windows are a few MiB).
inline constexpr int64_t kMaxCredit = int64_t{1} << 40;

// The link whose callback is running on this thread, if any (Shutdown() must not wait for
// itself). Defined in link_core.cc.
extern thread_local const void* tls_callback_link;

// Whether the calling thread is inside a link callback.
bool InLinkCallback();

// Keeps `channel` for the life of the process (see ~PeerLink).
void KeepForever(std::shared_ptr<grpc::Channel> channel);

// Whether `key` names a known kind with non-negative step, micro-batch and chunk.
bool ValidKey(const wire::TensorKey& key);

// The gRPC operations of one stream, implemented by the client and the server reactor. LinkCore
// calls them without holding its lock, and never after EndOp.
class StreamOps {
 public:
  virtual ~StreamOps() = default;
  virtual void StartReadOp(grpc::ByteBuffer* buffer) = 0;
  virtual void StartWriteOp(const grpc::ByteBuffer* buffer) = 0;
  // Client: cancels the call. Server: nothing (the server ends a stream with Finish).
  virtual void CancelOp() = 0;
  // Client: removes the hold taken before StartCall. Server: Finish(status). Afterwards the
  // reactor may be deleted at any moment.
  virtual void EndOp(const grpc::Status& status) = 0;
};

// The state of one link, shared by the PeerLink handle and the stream's reactor (which holds a
// reference until its OnDone). All decisions are taken under `mu_`; calls into gRPC (StreamOps)
// and into user callbacks are made outside it. Every StreamOps call is bracketed by `ops_busy_`,
// and EndOp is issued only when no such call is underway and no write is in flight, so the
// reactor is alive for every call made on it.
class LinkCore {
 public:
  using Clock = std::chrono::steady_clock;

  LinkCore(bool client_side, std::string peer, const LinkOptions& options)
      : client_side_(client_side), peer_(std::move(peer)), options_(options) {}

  LinkCore(const LinkCore&) = delete;
  LinkCore& operator=(const LinkCore&) = delete;

  const std::string& peer() const { return peer_; }

  // Installs what to receive with and the identity to send under. Before Start() only.
  // `reassembler`: the link's shared one if it has several stripes (fragments may then come at
  // any offset, on any stripe), else null.
  void Configure(LinkSettings settings, wire::StreamIdentity send_identity,
                 std::shared_ptr<wire::TensorReassembler> reassembler = nullptr)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Begins reading and grants the peer the receive window. `ops` must stay valid until EndOp.
  void Start(StreamOps* ops) ABSL_LOCKS_EXCLUDED(mu_);

  // Marks a core whose stream was rejected before Start(): it is closed with `status`.
  void Abandon(const absl::Status& status) ABSL_LOCKS_EXCLUDED(mu_);

  // Queues bytes [begin, end) of `tensor` (all of it if end < 0). `whole`: the range is the
  // whole tensor, counted in LinkStats::tensors_sent (a stripe's part of a tensor is not).
  absl::Status Send(const wire::TensorKey& key, std::shared_ptr<const math::Matrix> tensor,
                    int64_t begin = 0, int64_t end = -1) ABSL_LOCKS_EXCLUDED(mu_);

  // Drops the queue and ends the stream (cancelling a client's call); then, unless called from
  // a link callback (waiting would deadlock), waits until no user callback of this link runs.
  // Idempotent.
  void Shutdown() ABSL_LOCKS_EXCLUDED(mu_);

  LinkStats stats() const ABSL_LOCKS_EXCLUDED(mu_);
  // Whether `condition` held of the stats within `timeout` (re-evaluated on every change).
  bool WaitFor(const std::function<bool(const LinkStats&)>& condition, absl::Duration timeout) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // The link's first failure; OK while it works.
  absl::Status status() const ABSL_LOCKS_EXCLUDED(mu_);

  // --- Reactions (called by the reactors on gRPC threads). ---

  // A read completed (`ok`: a frame is in read_buf_): takes a credit grant, a fragment or a
  // complete tensor (delivered to on_tensor, after on_transfer), or fails the link on a bad
  // frame, too much data for the credit granted, or a refused delivery.
  void OnReadDone(bool ok) ABSL_LOCKS_EXCLUDED(mu_);
  // A write completed: reports a tensor's last fragment written (on_transfer), or the broken
  // stream.
  void OnWriteDone(bool ok) ABSL_LOCKS_EXCLUDED(mu_);

  // Server only: the client cancelled or the server is shutting down.
  void OnCancel() ABSL_LOCKS_EXCLUDED(mu_);

  // The stream is over; `status` is the client's final status (OK on the server). The reactor is
  // deleted right after, then MarkClosed() is called.
  void OnDone(const grpc::Status& status) ABSL_LOCKS_EXCLUDED(mu_);

  // The reactor is gone (with its ClientContext, which holds a channel reference): the stream's
  // resources are released and the handle may drop the channel.
  void MarkClosed() ABSL_LOCKS_EXCLUDED(mu_);

  // Client side: keeps the channel alive for the call (the call performs its operations through
  // the grpc::Channel object) until the handle releases it outside any gRPC callback.
  void SetChannel(std::shared_ptr<grpc::Channel> channel) ABSL_LOCKS_EXCLUDED(mu_);
  std::shared_ptr<grpc::Channel> TakeChannel() ABSL_LOCKS_EXCLUDED(mu_);
  bool client_side() const { return client_side_; }

 private:
  struct WaitArgs {
    const LinkCore* core;
    const std::function<bool(const LinkStats&)>* condition;
  };
  // Runs under mu_ (absl::Condition is evaluated with the mutex held).
  static bool EvaluateWaitCondition(WaitArgs* args) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    return (*args->condition)(args->core->StatsLocked());
  }

  // A tensor accepted by Send() and not completely handed to gRPC.
  struct Outgoing {
    wire::TensorKey key;
    std::shared_ptr<const math::Matrix> tensor;
    int64_t begin = 0;   // the range to send: [begin, end) of the tensor's bytes.
    int64_t offset = 0;  // bytes before this one have been handed to gRPC.
    int64_t end = 0;
    bool whole = true;         // the range is the whole tensor.
    Clock::time_point queued;  // when Send() accepted it.
  };

  // What to do outside the lock, decided by CollectLocked / FailLocked.
  struct Pending {
    StreamOps* cancel = nullptr;
    StreamOps* read = nullptr;
    StreamOps* write = nullptr;
    StreamOps* end = nullptr;
    grpc::Status end_status;
    absl::Status report;  // non-OK: deliver to on_error.
    std::shared_ptr<const LinkCallbacks> report_to;
    std::optional<LinkTransfer> transfer;  // deliver to on_transfer.
    std::shared_ptr<const LinkCallbacks> transfer_to;

    int busy() const { return (cancel ? 1 : 0) + (read ? 1 : 0) + (write ? 1 : 0); }
  };

  LinkStats StatsLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Steps of OnReadDone. The read ends (read_in_flight_ cleared) in each of them, except when a
  // complete tensor is handed to DeliverTensor, which ends it after the delivery.
  // The read failed: the client ends the call (OnDone reports its status); the server fails the
  // link as UNAVAILABLE.
  void OnReadFailed() ABSL_LOCKS_EXCLUDED(mu_);
  // Takes the frame read: a decoding error or more payload than the credit granted fails the
  // link; a credit grant is added. Returns the callbacks to hand a complete tensor to (then one
  // callback is counted running and received->start is set), else null.
  std::shared_ptr<const LinkCallbacks> TakeFrameLocked(
      const absl::StatusOr<wire::DecodedFrame>& decoded, Clock::time_point arrived,
      LinkTransfer* received, Pending* pending) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Adds the peer's grant of `credit_bytes`, or fails the link if the total would be absurd
  // (kMaxCredit).
  void TakeCreditLocked(int64_t credit_bytes, Pending* pending) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Counts a data frame that arrived at `arrived`: a partial tensor's credit is returned at once,
  // a complete tensor is dropped after Shutdown, else returned for delivery (TakeFrameLocked).
  std::shared_ptr<const LinkCallbacks> TakeFragmentLocked(const wire::DecodedFrame& frame,
                                                          Clock::time_point arrived,
                                                          LinkTransfer* received, Pending* pending)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Hands `frame`'s complete tensor to `to` outside mu_ (on_transfer first, so that whoever the
  // tensor wakes up finds it recorded), then returns its last fragment's credit and ends the read;
  // a refused delivery fails the link.
  void DeliverTensor(const std::shared_ptr<const LinkCallbacks>& to, wire::DecodedFrame* frame,
                     LinkTransfer received) ABSL_LOCKS_EXCLUDED(mu_);

  // Asks for the stream to end with `status` (server) once no operation is underway; `cancel`
  // also cancels the call first (client).
  void RequestEndLocked(const grpc::Status& status, bool cancel) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Records the link's first failure, schedules its report and ends the stream.
  void FailLocked(const absl::Status& status, bool cancel, Pending* pending)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Whether to return consumed credit now. Grants are batched to half a window, so credit frames
  // stay rare, except when the peer may be short of credit: with less than one maximal fragment
  // of credit outstanding the peer could be stalled, so whatever was consumed is granted at once.
  // This keeps the protocol deadlock-free whatever fragment size (<= kMaxFragmentBytes) the peer
  // uses.
  bool GrantDueLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Fills write_buf_ with the next frame if one may be written now: a pending credit grant
  // first, else the next fragment if the peer's credit covers it.
  bool PrepareWriteLocked(Pending* pending) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Decides which stream operations to start now (see the class comment for the protocol).
  void CollectLocked(Pending* pending) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Carries out `pending` without the lock, then whatever became possible meanwhile.
  void Execute(Pending pending) ABSL_LOCKS_EXCLUDED(mu_);

  // Constant after construction.
  const bool client_side_;
  const std::string peer_;
  const LinkOptions options_;

  // Read side, owned by the stream's read chain: set by Configure() before Start(), then touched
  // only between a StartRead and the end of its OnReadDone (one read in flight at a time).
  std::unique_ptr<wire::FrameDecoder> decoder_;
  grpc::ByteBuffer read_buf_;
  // Write side: filled under mu_ only while no write is in flight; read by gRPC until
  // OnWriteDone.
  grpc::ByteBuffer write_buf_;

  // Protects the stream state machine, the send queue, credit accounting, counters, callbacks
  // and the failure status. Never held while calling gRPC or a user callback.
  mutable absl::Mutex mu_;
  std::shared_ptr<const LinkCallbacks> callbacks_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<grpc::Channel> channel_ ABSL_GUARDED_BY(mu_);  // client side only.
  wire::StreamIdentity send_identity_ ABSL_GUARDED_BY(mu_);
  // Stream state machine.
  StreamOps* ops_ ABSL_GUARDED_BY(mu_) = nullptr;  // null before Start and after EndOp.
  int ops_busy_ ABSL_GUARDED_BY(mu_) = 0;          // StreamOps calls underway.
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  bool read_in_flight_ ABSL_GUARDED_BY(mu_) = false;  // includes processing the frame read.
  bool write_in_flight_ ABSL_GUARDED_BY(mu_) = false;
  bool broken_ ABSL_GUARDED_BY(mu_) = false;  // an operation failed: start no more.
  bool end_requested_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status end_status_ ABSL_GUARDED_BY(mu_);
  bool cancel_requested_ ABSL_GUARDED_BY(mu_) = false;
  bool cancel_issued_ ABSL_GUARDED_BY(mu_) = false;
  bool ended_ ABSL_GUARDED_BY(mu_) = false;   // EndOp issued.
  bool closed_ ABSL_GUARDED_BY(mu_) = false;  // OnDone seen (or never started).
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status failure_ ABSL_GUARDED_BY(mu_);
  int callbacks_running_ ABSL_GUARDED_BY(mu_) = 0;
  // Sending.
  std::deque<Outgoing> queue_ ABSL_GUARDED_BY(mu_);
  int64_t credit_ ABSL_GUARDED_BY(mu_) = 0;          // payload bytes we may still send.
  int64_t credit_granted_ ABSL_GUARDED_BY(mu_) = 0;  // total credit the peer granted us.
  int64_t initial_credit_ ABSL_GUARDED_BY(mu_) = 0;  // the peer's first grant (its window).
  int64_t bytes_sent_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t tensors_sent_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t peak_in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t credit_stalls_ ABSL_GUARDED_BY(mu_) = 0;
  bool blocked_on_credit_ ABSL_GUARDED_BY(mu_) = false;
  // The tensor whose last fragment is the write in flight (for on_transfer); else empty.
  std::optional<LinkTransfer> written_ ABSL_GUARDED_BY(mu_);
  // Receiving.
  // When the first fragment of the tensor being reassembled arrived (a stream carries one tensor
  // at a time); empty between tensors.
  std::optional<Clock::time_point> receiving_since_ ABSL_GUARDED_BY(mu_);
  int64_t pending_grant_ ABSL_GUARDED_BY(mu_) = 0;   // consumed bytes not yet granted back.
  int64_t granted_total_ ABSL_GUARDED_BY(mu_) = 0;   // credit granted to the peer so far.
  int64_t received_total_ ABSL_GUARDED_BY(mu_) = 0;  // payload bytes received.
  int64_t tensors_received_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace pipetrain::link::internal

#endif  // PIPETRAIN_SERVER_LINK_LINK_CORE_H_
