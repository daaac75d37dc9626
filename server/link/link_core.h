// LinkCore: the state machine of one Exchange stream (one stripe of a PeerLink): send queue,
// credit accounting, the stream's reads and writes, failure reporting (docs/wire.md §3-4).
// Internal to pipetrain_link: PeerLink and the stripe group (stripe_group.h) drive it; the
// reactors in peer_link.cc implement its StreamOps.
#ifndef PIPETRAIN_SERVER_LINK_LINK_CORE_H_
#define PIPETRAIN_SERVER_LINK_LINK_CORE_H_

#include <grpcpp/channel.h>
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/status.h>

#include <algorithm>
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
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/wire/frame_codec.h"
#include "common/wire/grpc_status.h"
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
                 std::shared_ptr<wire::TensorReassembler> reassembler = nullptr) {
    decoder_ = std::make_unique<wire::FrameDecoder>(settings.validation, std::move(reassembler));
    absl::MutexLock lock(&mu_);
    callbacks_ = std::make_shared<const LinkCallbacks>(std::move(settings.callbacks));
    send_identity_ = std::move(send_identity);
  }

  // Begins reading and grants the peer the receive window. `ops` must stay valid until EndOp.
  void Start(StreamOps* ops) {
    Pending pending;
    {
      absl::MutexLock lock(&mu_);
      ops_ = ops;
      started_ = true;
      pending_grant_ = options_.window_bytes;
      CollectLocked(&pending);
    }
    Execute(std::move(pending));
  }

  // Marks a core whose stream was rejected before Start(): it is closed with `status`.
  void Abandon(const absl::Status& status) {
    absl::MutexLock lock(&mu_);
    if (failure_.ok()) failure_ = status;
    queue_.clear();
    closed_ = true;
  }

  // Queues bytes [begin, end) of `tensor` (all of it if end < 0). `whole`: the range is the
  // whole tensor, counted in LinkStats::tensors_sent (a stripe's part of a tensor is not).
  absl::Status Send(const wire::TensorKey& key, std::shared_ptr<const math::Matrix> tensor,
                    int64_t begin = 0, int64_t end = -1) {
    if (!ValidKey(key)) {
      return absl::InvalidArgumentError(
          absl::StrCat("Send: invalid tensor key ", key.ToString(), " to '", peer_, "'"));
    }
    if (tensor == nullptr || tensor->size() == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("Send: empty tensor ", key.ToString(), " to '", peer_, "'"));
    }
    Pending pending;
    {
      absl::MutexLock lock(&mu_);
      if (shutdown_) {
        return absl::FailedPreconditionError(
            absl::StrCat("Send ", key.ToString(), ": the link to '", peer_, "' is shut down"));
      }
      if (!failure_.ok()) return failure_;
      const int64_t total = static_cast<int64_t>(tensor->size()) * sizeof(float);
      if (end < 0) end = total;
      if (begin < 0 || begin >= end || end > total) {
        return absl::InvalidArgumentError(absl::StrCat("Send: bytes [", begin, ", ", end, ") of ",
                                                       key.ToString(), " outside its ", total));
      }
      const bool whole = begin == 0 && end == total;
      queue_.push_back(Outgoing{key, std::move(tensor), begin, begin, end, whole, Clock::now()});
      CollectLocked(&pending);
    }
    Execute(std::move(pending));
    return absl::OkStatus();
  }

  void Shutdown() {
    Pending pending;
    {
      absl::MutexLock lock(&mu_);
      if (!shutdown_) {
        shutdown_ = true;
        queue_.clear();
        if (!started_) closed_ = true;
        RequestEndLocked(
            grpc::Status(grpc::StatusCode::UNAVAILABLE, "the peer shut the Exchange link down"),
            /*cancel=*/true);
        CollectLocked(&pending);
      }
    }
    Execute(std::move(pending));
    if (tls_callback_link != nullptr) return;  // inside a callback: waiting would deadlock.
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](int* running) { return *running == 0; }, &callbacks_running_));
  }

  LinkStats stats() const {
    absl::MutexLock lock(&mu_);
    return StatsLocked();
  }

  bool WaitFor(const std::function<bool(const LinkStats&)>& condition,
               absl::Duration timeout) const {
    WaitArgs args{this, &condition};
    absl::MutexLock lock(&mu_);
    return mu_.AwaitWithTimeout(absl::Condition(&EvaluateWaitCondition, &args), timeout);
  }

  absl::Status status() const {
    absl::MutexLock lock(&mu_);
    return failure_;
  }

  // --- Reactions (called by the reactors on gRPC threads). ---

  void OnReadDone(bool ok) {
    const Clock::time_point arrived = Clock::now();
    if (!ok) {
      Pending pending;
      {
        absl::MutexLock lock(&mu_);
        read_in_flight_ = false;
        broken_ = true;
        if (client_side_) {
          RequestEndLocked(grpc::Status::OK, /*cancel=*/false);  // OnDone reports the status.
        } else {
          FailLocked(
              absl::UnavailableError(absl::StrCat("peer '", peer_, "' closed the Exchange stream")),
              /*cancel=*/false, &pending);
        }
        CollectLocked(&pending);
      }
      Execute(std::move(pending));
      return;
    }
    absl::StatusOr<wire::DecodedFrame> decoded = decoder_->Decode(read_buf_);
    read_buf_.Clear();
    Pending pending;
    std::shared_ptr<const LinkCallbacks> deliver_to;
    LinkTransfer received;  // of a complete tensor: its first fragment's arrival.
    received.direction = LinkTransfer::Direction::kReceive;
    {
      absl::MutexLock lock(&mu_);
      if (!decoded.ok()) {
        read_in_flight_ = false;
        FailLocked(
            wire::Annotate(decoded.status(), absl::StrCat("Exchange stream with '", peer_, "'")),
            /*cancel=*/true, &pending);
        CollectLocked(&pending);
      } else if (decoded->type == wire::DecodedFrame::Type::kCredit) {
        read_in_flight_ = false;
        if (decoded->credit_bytes > kMaxCredit - credit_) {
          FailLocked(absl::InvalidArgumentError(absl::StrCat(
                         "Exchange stream with '", peer_, "': credit grant of ",
                         decoded->credit_bytes, " bytes on top of ", credit_, " is absurd")),
                     /*cancel=*/true, &pending);
        } else {
          if (credit_granted_ == 0) initial_credit_ = decoded->credit_bytes;
          credit_ += decoded->credit_bytes;
          credit_granted_ += decoded->credit_bytes;
        }
        CollectLocked(&pending);
      } else if (decoded->payload_bytes > granted_total_ - received_total_) {
        read_in_flight_ = false;
        FailLocked(absl::ResourceExhaustedError(
                       absl::StrCat("Exchange stream with '", peer_, "': ", decoded->key.ToString(),
                                    " fragment of ", decoded->payload_bytes, " bytes exceeds the ",
                                    granted_total_ - received_total_, " bytes of credit granted")),
                   /*cancel=*/true, &pending);
        CollectLocked(&pending);
      } else {
        received_total_ += decoded->payload_bytes;
        if (!receiving_since_.has_value()) receiving_since_ = arrived;
        if (decoded->type == wire::DecodedFrame::Type::kPartial) {
          read_in_flight_ = false;
          pending_grant_ += decoded->payload_bytes;
          CollectLocked(&pending);
        } else if (shutdown_) {
          read_in_flight_ = false;  // dropped: nobody listens any more.
          receiving_since_.reset();
          CollectLocked(&pending);
        } else {
          ++callbacks_running_;
          deliver_to = callbacks_;
          // On a striped link the tensor began with its first fragment on any stripe.
          received.start = decoded->first_fragment.value_or(*receiving_since_);
          receiving_since_.reset();
        }
      }
    }
    if (deliver_to == nullptr) {
      Execute(std::move(pending));
      return;
    }
    // A complete tensor: hand it over, then return its last fragment's credit.
    tls_callback_link = this;
    const wire::TensorKey key = decoded->key;
    received.key = key;
    received.bytes = static_cast<int64_t>(decoded->tensor.size()) * sizeof(float);
    if (deliver_to->on_transfer) {
      // Before on_tensor: whoever the tensor wakes up finds it recorded.
      received.end = Clock::now();
      deliver_to->on_transfer(received);
    }
    absl::Status delivered = deliver_to->on_tensor(key, std::move(decoded->tensor));
    tls_callback_link = nullptr;
    {
      absl::MutexLock lock(&mu_);
      --callbacks_running_;
      read_in_flight_ = false;
      ++tensors_received_;
      pending_grant_ += decoded->payload_bytes;
      if (!delivered.ok()) {
        FailLocked(wire::Annotate(delivered, absl::StrCat("delivering ", key.ToString(), " from '",
                                                          peer_, "'")),
                   /*cancel=*/true, &pending);
      }
      CollectLocked(&pending);
    }
    Execute(std::move(pending));
  }

  void OnWriteDone(bool ok) {
    Pending pending;
    {
      absl::MutexLock lock(&mu_);
      write_in_flight_ = false;
      if (ok && written_.has_value() && !shutdown_ && callbacks_ != nullptr &&
          callbacks_->on_transfer) {
        // The write just completed was a tensor's last fragment.
        pending.transfer = *written_;
        pending.transfer->end = Clock::now();
        pending.transfer_to = callbacks_;
        ++callbacks_running_;
      }
      written_.reset();
      if (!ok) {
        broken_ = true;
        if (client_side_) {
          RequestEndLocked(grpc::Status::OK, /*cancel=*/false);  // OnDone reports the status.
        } else {
          FailLocked(absl::UnavailableError(
                         absl::StrCat("writing to peer '", peer_, "' failed: stream broken")),
                     /*cancel=*/false, &pending);
        }
      }
      CollectLocked(&pending);
    }
    Execute(std::move(pending));
  }

  // Server only: the client cancelled or the server is shutting down.
  void OnCancel() {
    Pending pending;
    {
      absl::MutexLock lock(&mu_);
      broken_ = true;
      FailLocked(absl::UnavailableError(
                     absl::StrCat("the Exchange stream with '", peer_, "' was cancelled")),
                 /*cancel=*/false, &pending);
      CollectLocked(&pending);
    }
    Execute(std::move(pending));
  }

  // The stream is over; `status` is the client's final status (OK on the server). The reactor is
  // deleted right after, then MarkClosed() is called.
  void OnDone(const grpc::Status& status) {
    Pending pending;
    {
      absl::MutexLock lock(&mu_);
      ops_ = nullptr;
      queue_.clear();
      if (client_side_) {
        absl::Status failure;
        if (status.ok() || status.error_code() == grpc::StatusCode::CANCELLED) {
          failure = absl::UnavailableError(
              absl::StrCat("the Exchange stream to '", peer_, "' ended",
                           status.error_message().empty() ? "" : ": ", status.error_message()));
        } else {
          failure = wire::FromGrpcStatus(status, absl::StrCat("Exchange stream to '", peer_, "'"));
        }
        FailLocked(failure, /*cancel=*/false, &pending);
      }
    }
    Execute(std::move(pending));
  }

  // The reactor is gone (with its ClientContext, which holds a channel reference): the stream's
  // resources are released and the handle may drop the channel.
  void MarkClosed() {
    absl::MutexLock lock(&mu_);
    closed_ = true;
  }

  // Client side: keeps the channel alive for the call (the call performs its operations through
  // the grpc::Channel object) until the handle releases it outside any gRPC callback.
  void SetChannel(std::shared_ptr<grpc::Channel> channel) {
    absl::MutexLock lock(&mu_);
    channel_ = std::move(channel);
  }
  std::shared_ptr<grpc::Channel> TakeChannel() {
    absl::MutexLock lock(&mu_);
    return std::move(channel_);
  }
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

  LinkStats StatsLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    LinkStats s;
    s.tensors_sent = tensors_sent_;
    s.tensors_received = tensors_received_;
    s.bytes_sent = bytes_sent_;
    s.bytes_received = received_total_;
    s.queued_tensors = static_cast<int64_t>(queue_.size());
    s.credit_bytes = credit_;
    s.credit_granted = credit_granted_;
    s.peak_in_flight = peak_in_flight_;
    s.credit_stalls = credit_stalls_;
    s.blocked_on_credit = blocked_on_credit_;
    s.writing = write_in_flight_;
    s.closed = closed_;
    return s;
  }

  // Asks for the stream to end with `status` (server) once no operation is underway; `cancel`
  // also cancels the call first (client).
  void RequestEndLocked(const grpc::Status& status, bool cancel)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (end_requested_) return;
    end_requested_ = true;
    end_status_ = status;
    if (cancel && client_side_) cancel_requested_ = true;
  }

  // Records the link's first failure, schedules its report and ends the stream.
  void FailLocked(const absl::Status& status, bool cancel, Pending* pending)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    queue_.clear();
    RequestEndLocked(wire::ToGrpcStatus(status), cancel);
    if (!failure_.ok() || shutdown_) return;
    failure_ = status;
    pending->report = status;
    pending->report_to = callbacks_;
    if (callbacks_ != nullptr && callbacks_->on_error) ++callbacks_running_;
  }

  // Whether to return consumed credit now. Grants are batched to half a window, so credit frames
  // stay rare, except when the peer may be short of credit: with less than one maximal fragment
  // of credit outstanding the peer could be stalled, so whatever was consumed is granted at once.
  // This keeps the protocol deadlock-free whatever fragment size (<= kMaxFragmentBytes) the peer
  // uses.
  bool GrantDueLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (pending_grant_ <= 0) return false;
    return pending_grant_ >= options_.window_bytes / 2 ||
           granted_total_ - received_total_ < wire::kMaxFragmentBytes;
  }

  // Fills write_buf_ with the next frame if one may be written now: a pending credit grant
  // first, else the next fragment if the peer's credit covers it.
  bool PrepareWriteLocked(Pending* pending) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (GrantDueLocked()) {
      absl::Status encoded = wire::EncodeCredit(pending_grant_, &write_buf_);
      if (!encoded.ok()) {
        FailLocked(encoded, /*cancel=*/true, pending);
        return false;
      }
      granted_total_ += pending_grant_;
      pending_grant_ = 0;
      return true;
    }
    if (queue_.empty()) {
      blocked_on_credit_ = false;
      return false;
    }
    Outgoing& out = queue_.front();
    const int64_t length = std::min(options_.fragment_bytes, out.end - out.offset);
    if (credit_ < length) {
      if (!blocked_on_credit_) ++credit_stalls_;
      blocked_on_credit_ = true;
      return false;
    }
    blocked_on_credit_ = false;
    absl::Status encoded =
        wire::EncodeFragment(send_identity_, out.key, out.tensor, out.offset, length, &write_buf_);
    if (!encoded.ok()) {
      FailLocked(encoded, /*cancel=*/true, pending);
      return false;
    }
    credit_ -= length;
    bytes_sent_ += length;
    peak_in_flight_ = std::max(peak_in_flight_, initial_credit_ - credit_);
    out.offset += length;
    if (out.offset == out.end) {
      written_ = LinkTransfer{
          LinkTransfer::Direction::kSend, out.key, out.end - out.begin, out.queued, {}};
      if (out.whole) ++tensors_sent_;
      queue_.pop_front();
    }
    return true;
  }

  // Decides which stream operations to start now (see the class comment for the protocol).
  void CollectLocked(Pending* pending) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (ops_ == nullptr || ended_) return;
    if (cancel_requested_ && !cancel_issued_) {
      cancel_issued_ = true;
      pending->cancel = ops_;
      ++ops_busy_;
    }
    if (!end_requested_ && !broken_) {
      if (!read_in_flight_) {
        read_in_flight_ = true;
        pending->read = ops_;
        ++ops_busy_;
      }
      if (!write_in_flight_ && PrepareWriteLocked(pending)) {
        write_in_flight_ = true;
        pending->write = ops_;
        ++ops_busy_;
      }
    }
    if (end_requested_ && ops_busy_ == 0 && !write_in_flight_) {
      ended_ = true;
      pending->end = ops_;
      pending->end_status = end_status_;
      ops_ = nullptr;
    }
  }

  // Carries out `pending` without the lock, then whatever became possible meanwhile.
  void Execute(Pending pending) ABSL_LOCKS_EXCLUDED(mu_) {
    for (;;) {
      if (!pending.report.ok() && pending.report_to != nullptr && pending.report_to->on_error) {
        tls_callback_link = this;
        pending.report_to->on_error(pending.report);
        tls_callback_link = nullptr;
        absl::MutexLock lock(&mu_);
        --callbacks_running_;
      }
      if (pending.transfer.has_value()) {
        tls_callback_link = this;
        pending.transfer_to->on_transfer(*pending.transfer);
        tls_callback_link = nullptr;
        pending.transfer.reset();
        absl::MutexLock lock(&mu_);
        --callbacks_running_;
      }
      if (pending.cancel != nullptr) pending.cancel->CancelOp();
      if (pending.read != nullptr) pending.read->StartReadOp(&read_buf_);
      if (pending.write != nullptr) pending.write->StartWriteOp(&write_buf_);
      if (pending.end != nullptr) pending.end->EndOp(pending.end_status);
      const int busy = pending.busy();
      if (busy == 0) return;
      pending = Pending();
      absl::MutexLock lock(&mu_);
      ops_busy_ -= busy;
      CollectLocked(&pending);
    }
  }

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
