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
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/wire/grpc_status.h"

namespace pipetrain::link {
namespace internal {
namespace {

// Call metadata carrying the PeerHello ("-bin": arbitrary bytes, base64 on the wire).
constexpr char kPeerKey[] = "pipetrain-peer-bin";
constexpr char kJobKey[] = "pipetrain-job-bin";
constexpr char kEpochKey[] = "pipetrain-epoch";
constexpr char kSecretKey[] = "pipetrain-link-secret-bin";  // optional

// Upper bound on the credit a peer may grant us in total outstanding (a sanity check against
// overflow; real windows are a few MiB).
constexpr int64_t kMaxCredit = int64_t{1} << 40;

// The link whose callback is running on this thread, if any (Shutdown() must not wait for
// itself).
thread_local const void* tls_callback_link = nullptr;

// Channels that could not be released safely (see ~PeerLink).
absl::Mutex g_kept_channels_mu(absl::kConstInit);
std::vector<std::shared_ptr<grpc::Channel>>* g_kept_channels ABSL_GUARDED_BY(g_kept_channels_mu) =
    nullptr;

bool ValidKey(const wire::TensorKey& key) {
  const int kind = static_cast<int>(key.kind);
  return kind >= static_cast<int>(wire::TensorKind::kActivation) &&
         kind <= static_cast<int>(wire::TensorKind::kTarget) && key.step >= 0 &&
         key.microbatch >= 0 && key.chunk >= 0;
}

}  // namespace

bool InLinkCallback() { return tls_callback_link != nullptr; }

void KeepForever(std::shared_ptr<grpc::Channel> channel) {
  if (channel == nullptr) return;
  absl::MutexLock lock(&g_kept_channels_mu);
  if (g_kept_channels == nullptr) g_kept_channels = new std::vector<std::shared_ptr<grpc::Channel>>;
  g_kept_channels->push_back(std::move(channel));
}

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
  void Configure(LinkSettings settings, wire::StreamIdentity send_identity) {
    decoder_ = std::make_unique<wire::FrameDecoder>(settings.validation);
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

  absl::Status Send(const wire::TensorKey& key, std::shared_ptr<const math::Matrix> tensor) {
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
      queue_.push_back(Outgoing{key, std::move(tensor), 0, total, Clock::now()});
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
          received.start = *receiving_since_;
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
    int64_t offset = 0;  // bytes already handed to gRPC.
    int64_t total = 0;
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
    const int64_t length = std::min(options_.fragment_bytes, out.total - out.offset);
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
    if (out.offset == out.total) {
      written_ = LinkTransfer{LinkTransfer::Direction::kSend, out.key, out.total, out.queued, {}};
      queue_.pop_front();
      ++tensors_sent_;
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

namespace {

// The dialling end of an Exchange stream.
class ClientLinkReactor final : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>,
                                public StreamOps {
 public:
  // Holds no reference to `channel` (the core does): dropping the last reference to a
  // grpc::Channel inside a callback (our OnDone) can shut down gRPC's callback completion queue
  // from one of its own threads.
  ClientLinkReactor(std::shared_ptr<LinkCore> core, const std::shared_ptr<grpc::Channel>& channel,
                    const PeerHello& hello)
      : core_(std::move(core)) {
    context_.AddMetadata(kPeerKey, hello.peer);
    context_.AddMetadata(kJobKey, hello.identity.job);
    context_.AddMetadata(kEpochKey, absl::StrCat(hello.identity.epoch));
    if (!hello.secret.empty()) context_.AddMetadata(kSecretKey, hello.secret);
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

  void Begin(const LinkOptions& options, const AcceptFn& accept) {
    absl::StatusOr<PeerHello> hello = ParseHello();
    if (!hello.ok()) {
      Finish(wire::ToGrpcStatus(hello.status()));
      return;
    }
    auto core = std::make_shared<LinkCore>(/*client_side=*/false, hello->peer, options);
    absl::StatusOr<LinkSettings> settings =
        accept ? accept(*hello, std::make_unique<PeerLink>(core))
               : absl::StatusOr<LinkSettings>(
                     absl::FailedPreconditionError("this server accepts no Exchange streams"));
    if (settings.ok() && !settings->callbacks.on_tensor) {
      settings = absl::InternalError("the accept callback returned no on_tensor callback");
    }
    if (settings.ok()) {
      if (absl::Status checked = settings->validation.Check(); !checked.ok()) settings = checked;
    }
    if (!settings.ok()) {
      core->Abandon(settings.status());
      Finish(wire::ToGrpcStatus(settings.status()));
      return;
    }
    wire::StreamIdentity identity = settings->validation.expected;
    core->Configure(*std::move(settings), std::move(identity));
    core_ = std::move(core);
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
  absl::StatusOr<PeerHello> ParseHello() const {
    const auto& metadata = context_->client_metadata();
    auto value = [&metadata](const char* key) -> std::optional<std::string> {
      auto it = metadata.find(key);
      if (it == metadata.end()) return std::nullopt;
      return std::string(it->second.data(), it->second.size());
    };
    PeerHello hello;
    std::optional<std::string> peer = value(kPeerKey);
    std::optional<std::string> job = value(kJobKey);
    std::optional<std::string> epoch = value(kEpochKey);
    if (!peer || !job || !epoch) {
      return absl::InvalidArgumentError(absl::StrCat("Exchange stream from ", context_->peer(),
                                                     " lacks the ", kPeerKey, ", ", kJobKey,
                                                     " and ", kEpochKey, " metadata"));
    }
    if (!absl::SimpleAtoi(*epoch, &hello.identity.epoch) || hello.identity.epoch < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("Exchange stream from ", context_->peer(), ": bad epoch '", *epoch, "'"));
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
    grpc::CallbackServerContext* context, const LinkOptions& options, const AcceptFn& accept) {
  auto* reactor = new ServerLinkReactor(context);
  reactor->Begin(options, accept);
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
  return absl::OkStatus();
}

PeerLink::PeerLink(std::shared_ptr<internal::LinkCore> core) : core_(std::move(core)) {}

PeerLink::~PeerLink() {
  core_->Shutdown();
  if (!core_->client_side()) return;
  // Release the channel only once the call is over, and never on a gRPC callback thread (see
  // ClientLinkReactor); where that cannot be guaranteed, keep it for the life of the process.
  const bool in_callback = internal::InLinkCallback();
  if (in_callback ||
      !core_->WaitFor([](const LinkStats& s) { return s.closed; }, absl::Seconds(30))) {
    internal::KeepForever(core_->TakeChannel());
    return;
  }
  std::shared_ptr<grpc::Channel> channel = core_->TakeChannel();
  channel.reset();
}

absl::StatusOr<std::unique_ptr<PeerLink>> PeerLink::Connect(std::shared_ptr<grpc::Channel> channel,
                                                            std::string peer,
                                                            const PeerHello& hello,
                                                            const LinkOptions& options,
                                                            LinkSettings settings) {
  if (channel == nullptr) return absl::InvalidArgumentError("Connect: no channel");
  if (absl::Status checked = options.Check(); !checked.ok()) return checked;
  if (absl::Status checked = settings.validation.Check(); !checked.ok()) return checked;
  if (!settings.callbacks.on_tensor) {
    return absl::InvalidArgumentError("Connect: LinkCallbacks::on_tensor is required");
  }
  if (hello.identity.epoch < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("Connect: negative epoch ", hello.identity.epoch));
  }
  auto core = std::make_shared<internal::LinkCore>(/*client_side=*/true, std::move(peer), options);
  core->Configure(std::move(settings), hello.identity);
  core->SetChannel(channel);
  auto* reactor = new internal::ClientLinkReactor(core, channel, hello);
  reactor->Begin();
  return std::make_unique<PeerLink>(std::move(core));
}

absl::Status PeerLink::Send(const wire::TensorKey& key,
                            std::shared_ptr<const math::Matrix> tensor) {
  return core_->Send(key, std::move(tensor));
}

void PeerLink::Shutdown() { core_->Shutdown(); }

LinkStats PeerLink::stats() const { return core_->stats(); }

bool PeerLink::WaitFor(const std::function<bool(const LinkStats&)>& condition,
                       absl::Duration timeout) const {
  return core_->WaitFor(condition, timeout);
}

absl::Status PeerLink::status() const { return core_->status(); }

const std::string& PeerLink::peer() const { return core_->peer(); }

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

}  // namespace pipetrain::link
