#include "server/link/link_core.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/wire/grpc_status.h"

namespace pipetrain::link::internal {
namespace {

// Channels that could not be released safely (see ~PeerLink).
absl::Mutex g_kept_channels_mu(absl::kConstInit);
std::vector<std::shared_ptr<grpc::Channel>>* g_kept_channels ABSL_GUARDED_BY(g_kept_channels_mu) =
    nullptr;

}  // namespace

thread_local const void* tls_callback_link = nullptr;

bool InLinkCallback() { return tls_callback_link != nullptr; }

void KeepForever(std::shared_ptr<grpc::Channel> channel) {
  if (channel == nullptr) return;
  absl::MutexLock lock(&g_kept_channels_mu);
  if (g_kept_channels == nullptr) g_kept_channels = new std::vector<std::shared_ptr<grpc::Channel>>;
  g_kept_channels->push_back(std::move(channel));
}

bool ValidKey(const wire::TensorKey& key) {
  const int kind = static_cast<int>(key.kind);
  return ((kind >= static_cast<int>(wire::TensorKind::kActivation) &&
           kind <= static_cast<int>(wire::TensorKind::kTiedGradient)) ||
          kind == static_cast<int>(wire::TensorKind::kReplicaGradient) ||
          kind == static_cast<int>(wire::TensorKind::kCopyGradient)) &&
         key.step >= 0 && key.microbatch >= 0 && key.chunk >= 0;
}

void LinkCore::Configure(LinkSettings settings, wire::StreamIdentity send_identity,
                         std::shared_ptr<wire::TensorReassembler> reassembler) {
  decoder_ = std::make_unique<wire::FrameDecoder>(settings.validation, std::move(reassembler));
  absl::MutexLock lock(&mu_);
  callbacks_ = std::make_shared<const LinkCallbacks>(std::move(settings.callbacks));
  send_identity_ = std::move(send_identity);
}

void LinkCore::Start(StreamOps* ops) {
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

void LinkCore::Abandon(const absl::Status& status) {
  absl::MutexLock lock(&mu_);
  if (failure_.ok()) failure_ = status;
  queue_.clear();
  closed_ = true;
}

absl::Status LinkCore::Send(const wire::TensorKey& key, std::shared_ptr<const math::Matrix> tensor,
                            int64_t begin, int64_t end) {
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

void LinkCore::Shutdown() {
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

LinkStats LinkCore::stats() const {
  absl::MutexLock lock(&mu_);
  return StatsLocked();
}

bool LinkCore::WaitFor(const std::function<bool(const LinkStats&)>& condition,
                       absl::Duration timeout) const {
  WaitArgs args{this, &condition};
  absl::MutexLock lock(&mu_);
  return mu_.AwaitWithTimeout(absl::Condition(&EvaluateWaitCondition, &args), timeout);
}

absl::Status LinkCore::status() const {
  absl::MutexLock lock(&mu_);
  return failure_;
}

void LinkCore::OnReadDone(bool ok) {
  const Clock::time_point arrived = Clock::now();
  if (!ok) {
    OnReadFailed();
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
    deliver_to = TakeFrameLocked(decoded, arrived, &received, &pending);
  }
  if (deliver_to == nullptr) {
    Execute(std::move(pending));
    return;
  }
  DeliverTensor(deliver_to, &*decoded, std::move(received));
}

void LinkCore::OnReadFailed() {
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
}

std::shared_ptr<const LinkCallbacks> LinkCore::TakeFrameLocked(
    const absl::StatusOr<wire::DecodedFrame>& decoded, Clock::time_point arrived,
    LinkTransfer* received, Pending* pending) {
  if (!decoded.ok()) {
    read_in_flight_ = false;
    FailLocked(wire::Annotate(decoded.status(), absl::StrCat("Exchange stream with '", peer_, "'")),
               /*cancel=*/true, pending);
    CollectLocked(pending);
    return nullptr;
  }
  if (decoded->type == wire::DecodedFrame::Type::kCredit) {
    read_in_flight_ = false;
    TakeCreditLocked(decoded->credit_bytes, pending);
    CollectLocked(pending);
    return nullptr;
  }
  if (decoded->payload_bytes > granted_total_ - received_total_) {
    read_in_flight_ = false;
    FailLocked(absl::ResourceExhaustedError(
                   absl::StrCat("Exchange stream with '", peer_, "': ", decoded->key.ToString(),
                                " fragment of ", decoded->payload_bytes, " bytes exceeds the ",
                                granted_total_ - received_total_, " bytes of credit granted")),
               /*cancel=*/true, pending);
    CollectLocked(pending);
    return nullptr;
  }
  return TakeFragmentLocked(*decoded, arrived, received, pending);
}

void LinkCore::TakeCreditLocked(int64_t credit_bytes, Pending* pending) {
  if (credit_bytes > kMaxCredit - credit_) {
    FailLocked(absl::InvalidArgumentError(absl::StrCat("Exchange stream with '", peer_,
                                                       "': credit grant of ", credit_bytes,
                                                       " bytes on top of ", credit_, " is absurd")),
               /*cancel=*/true, pending);
    return;
  }
  if (credit_granted_ == 0) initial_credit_ = credit_bytes;
  credit_ += credit_bytes;
  credit_granted_ += credit_bytes;
}

std::shared_ptr<const LinkCallbacks> LinkCore::TakeFragmentLocked(const wire::DecodedFrame& frame,
                                                                  Clock::time_point arrived,
                                                                  LinkTransfer* received,
                                                                  Pending* pending) {
  received_total_ += frame.payload_bytes;
  if (!receiving_since_.has_value()) receiving_since_ = arrived;
  if (frame.type == wire::DecodedFrame::Type::kPartial) {
    read_in_flight_ = false;
    pending_grant_ += frame.payload_bytes;
    CollectLocked(pending);
    return nullptr;
  }
  if (shutdown_) {
    read_in_flight_ = false;  // dropped: nobody listens any more.
    receiving_since_.reset();
    CollectLocked(pending);
    return nullptr;
  }
  ++callbacks_running_;
  // On a striped link the tensor began with its first fragment on any stripe.
  received->start = frame.first_fragment.value_or(*receiving_since_);
  receiving_since_.reset();
  return callbacks_;
}

void LinkCore::DeliverTensor(const std::shared_ptr<const LinkCallbacks>& to,
                             wire::DecodedFrame* frame, LinkTransfer received) {
  // A complete tensor: hand it over, then return its last fragment's credit.
  tls_callback_link = this;
  const wire::TensorKey key = frame->key;
  received.key = key;
  received.bytes = static_cast<int64_t>(frame->tensor.size()) * sizeof(float);
  if (to->on_transfer) {
    // Before on_tensor: whoever the tensor wakes up finds it recorded.
    received.end = Clock::now();
    to->on_transfer(received);
  }
  absl::Status delivered = to->on_tensor(key, std::move(frame->tensor));
  tls_callback_link = nullptr;
  Pending pending;
  {
    absl::MutexLock lock(&mu_);
    --callbacks_running_;
    read_in_flight_ = false;
    ++tensors_received_;
    pending_grant_ += frame->payload_bytes;
    if (!delivered.ok()) {
      FailLocked(wire::Annotate(delivered,
                                absl::StrCat("delivering ", key.ToString(), " from '", peer_, "'")),
                 /*cancel=*/true, &pending);
    }
    CollectLocked(&pending);
  }
  Execute(std::move(pending));
}

void LinkCore::OnWriteDone(bool ok) {
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

void LinkCore::OnCancel() {
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

void LinkCore::OnDone(const grpc::Status& status) {
  Pending pending;
  {
    absl::MutexLock lock(&mu_);
    ops_ = nullptr;
    queue_.clear();
    if (client_side_) {
      absl::Status failure;
      if (status.ok() || status.error_code() == grpc::StatusCode::CANCELLED) {
        failure = absl::UnavailableError(absl::StrCat("the Exchange stream to '", peer_, "' ended",
                                                      status.error_message().empty() ? "" : ": ",
                                                      status.error_message()));
      } else {
        failure = wire::FromGrpcStatus(status, absl::StrCat("Exchange stream to '", peer_, "'"));
      }
      FailLocked(failure, /*cancel=*/false, &pending);
    }
  }
  Execute(std::move(pending));
}

void LinkCore::MarkClosed() {
  absl::MutexLock lock(&mu_);
  closed_ = true;
}

void LinkCore::SetChannel(std::shared_ptr<grpc::Channel> channel) {
  absl::MutexLock lock(&mu_);
  channel_ = std::move(channel);
}

std::shared_ptr<grpc::Channel> LinkCore::TakeChannel() {
  absl::MutexLock lock(&mu_);
  return std::move(channel_);
}

LinkStats LinkCore::StatsLocked() const {
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

void LinkCore::RequestEndLocked(const grpc::Status& status, bool cancel) {
  if (end_requested_) return;
  end_requested_ = true;
  end_status_ = status;
  if (cancel && client_side_) cancel_requested_ = true;
}

void LinkCore::FailLocked(const absl::Status& status, bool cancel, Pending* pending) {
  queue_.clear();
  RequestEndLocked(wire::ToGrpcStatus(status), cancel);
  if (!failure_.ok() || shutdown_) return;
  failure_ = status;
  pending->report = status;
  pending->report_to = callbacks_;
  if (callbacks_ != nullptr && callbacks_->on_error) ++callbacks_running_;
}

bool LinkCore::GrantDueLocked() const {
  if (pending_grant_ <= 0) return false;
  return pending_grant_ >= options_.window_bytes / 2 ||
         granted_total_ - received_total_ < wire::kMaxFragmentBytes;
}

bool LinkCore::PrepareWriteLocked(Pending* pending) {
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
    written_ =
        LinkTransfer{LinkTransfer::Direction::kSend, out.key, out.end - out.begin, out.queued, {}};
    if (out.whole) ++tensors_sent_;
    queue_.pop_front();
  }
  return true;
}

void LinkCore::CollectLocked(Pending* pending) {
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

void LinkCore::Execute(Pending pending) {
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

}  // namespace pipetrain::link::internal
