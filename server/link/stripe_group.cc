#include "server/link/stripe_group.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"

namespace pipetrain::link::internal {

int64_t MinStripeBlockBytes(const LinkOptions& options) {
  return std::max<int64_t>(sizeof(float),
                           std::min<int64_t>(wire::kMinFragmentBytes, options.stripe_min_bytes));
}

int64_t MaxOpenTensors(const LinkOptions& options, int stripes) {
  return kMaxOpenStripedTensors +
         int64_t{stripes} * (options.window_bytes / wire::kMinFragmentBytes + 2);
}

std::shared_ptr<StripeGroup> StripeGroup::Create(bool client_side, std::string peer,
                                                 const LinkOptions& options, int stripes) {
  std::vector<std::shared_ptr<LinkCore>> cores;
  for (int i = 0; i < std::max(stripes, 1); ++i) {
    cores.push_back(std::make_shared<LinkCore>(client_side, peer, options));
  }
  return std::shared_ptr<StripeGroup>(new StripeGroup(std::move(cores), options));
}

StripeGroup::StripeGroup(std::vector<std::shared_ptr<LinkCore>> cores, const LinkOptions& options)
    : cores_(std::move(cores)), options_(options) {}

void StripeGroup::Configure(LinkSettings settings, const wire::StreamIdentity& send_identity) {
  if (stripes() == 1) {
    // One stream: the link is its core, exactly as an unstriped link.
    cores_[0]->Configure(std::move(settings), send_identity);
    return;
  }
  callbacks_ = std::make_shared<const LinkCallbacks>(std::move(settings.callbacks));
  auto reassembler = std::make_shared<wire::TensorReassembler>(MaxOpenTensors(options_, stripes()));
  const std::weak_ptr<StripeGroup> weak = weak_from_this();
  LinkCallbacks stripe_callbacks;
  stripe_callbacks.on_tensor = callbacks_->on_tensor;
  stripe_callbacks.on_error = [weak](const absl::Status& status) {
    if (std::shared_ptr<StripeGroup> group = weak.lock()) group->OnStripeError(status);
  };
  stripe_callbacks.on_transfer = [weak](const LinkTransfer& transfer) {
    if (std::shared_ptr<StripeGroup> group = weak.lock()) group->OnStripeTransfer(transfer);
  };
  for (const std::shared_ptr<LinkCore>& core : cores_) {
    core->Configure(LinkSettings{settings.validation, stripe_callbacks}, send_identity,
                    reassembler);
  }
}

void StripeGroup::Abandon(const absl::Status& status) {
  for (const std::shared_ptr<LinkCore>& core : cores_) core->Abandon(status);
}

absl::Status StripeGroup::Send(const wire::TensorKey& key,
                               std::shared_ptr<const math::Matrix> tensor) {
  if (tensor == nullptr || BlocksFor(static_cast<int64_t>(tensor->size())) < 2) {
    int stripe = 0;
    if (options_.round_robin_whole && stripes() > 1) {
      absl::MutexLock lock(&mu_);
      stripe = next_whole_;
      next_whole_ = (next_whole_ + 1) % stripes();
    }
    return cores_[stripe]->Send(key, std::move(tensor));
  }
  if (!ValidKey(key)) {
    return absl::InvalidArgumentError(
        absl::StrCat("Send: invalid tensor key ", key.ToString(), " to '", peer(), "'"));
  }
  {
    absl::MutexLock lock(&mu_);
    if (shutdown_) {
      return absl::FailedPreconditionError(
          absl::StrCat("Send ", key.ToString(), ": the link to '", peer(), "' is shut down"));
    }
    if (!failure_.ok()) return failure_;
    if (!waiting_.empty() || static_cast<int>(in_progress_.size()) >= kMaxOpenStripedTensors) {
      waiting_.push_back(Waiting{key, std::move(tensor)});
      return absl::OkStatus();
    }
    StartLocked(key, *tensor);
  }
  return SendBlocks(key, tensor);
}

void StripeGroup::StartLocked(const wire::TensorKey& key, const math::Matrix& tensor) {
  const int64_t n = static_cast<int64_t>(tensor.size());
  in_progress_.emplace(key, Progress{BlocksFor(n), n * static_cast<int64_t>(sizeof(float)),
                                     std::chrono::steady_clock::now()});
}

int StripeGroup::BlocksFor(int64_t elements) const {
  const int64_t bytes = elements * static_cast<int64_t>(sizeof(float));
  if (stripes() == 1 || bytes < options_.stripe_min_bytes) return 1;
  return static_cast<int>(
      std::min<int64_t>(stripes(), std::max<int64_t>(1, bytes / MinStripeBlockBytes(options_))));
}

absl::Status StripeGroup::SendBlocks(const wire::TensorKey& key,
                                     const std::shared_ptr<const math::Matrix>& tensor) {
  // Contiguous blocks of whole floats: block j is elements [j*n/k, (j+1)*n/k).
  const int64_t n = static_cast<int64_t>(tensor->size());
  const int k = BlocksFor(n);
  constexpr int64_t kFloat = sizeof(float);
  for (int j = 0; j < k; ++j) {
    const int64_t begin = j * n / k * kFloat;
    const int64_t end = (j + 1) * n / k * kFloat;
    if (absl::Status sent = cores_[j]->Send(key, tensor, begin, end); !sent.ok()) return sent;
  }
  return absl::OkStatus();
}

void StripeGroup::OnStripeTransfer(const LinkTransfer& transfer) {
  LinkTransfer report = transfer;
  std::vector<Waiting> start;
  bool forward = true;
  if (transfer.direction == LinkTransfer::Direction::kSend) {
    absl::MutexLock lock(&mu_);
    auto it = in_progress_.find(transfer.key);
    if (it != in_progress_.end()) {
      Progress& p = it->second;
      if (--p.remaining > 0) {
        forward = false;
      } else {
        report.bytes = p.bytes;
        report.start = p.start;
        in_progress_.erase(it);
        ++striped_sent_;
        while (!shutdown_ && failure_.ok() && !waiting_.empty() &&
               static_cast<int>(in_progress_.size()) < kMaxOpenStripedTensors) {
          StartLocked(waiting_.front().key, *waiting_.front().tensor);
          start.push_back(std::move(waiting_.front()));
          waiting_.pop_front();
        }
      }
    }
  }
  if (forward && callbacks_->on_transfer) callbacks_->on_transfer(report);
  for (Waiting& w : start) {
    if (absl::Status sent = SendBlocks(w.key, w.tensor); !sent.ok()) {
      OnStripeError(sent);
      return;
    }
  }
}

void StripeGroup::OnStripeError(const absl::Status& status) {
  {
    absl::MutexLock lock(&mu_);
    if (shutdown_ || !failure_.ok()) return;
    failure_ = status;
    waiting_.clear();
  }
  // Inside a stripe's callback: the other stripes' Shutdown does not wait for it.
  for (const std::shared_ptr<LinkCore>& core : cores_) core->Shutdown();
  if (callbacks_->on_error) callbacks_->on_error(status);
}

void StripeGroup::Shutdown() {
  {
    absl::MutexLock lock(&mu_);
    shutdown_ = true;
    waiting_.clear();
  }
  for (const std::shared_ptr<LinkCore>& core : cores_) core->Shutdown();
}

LinkStats StripeGroup::stats() const {
  LinkStats sum = cores_[0]->stats();
  for (int i = 1; i < stripes(); ++i) {
    const LinkStats s = cores_[i]->stats();
    sum.tensors_sent += s.tensors_sent;
    sum.tensors_received += s.tensors_received;
    sum.bytes_sent += s.bytes_sent;
    sum.bytes_received += s.bytes_received;
    sum.queued_tensors += s.queued_tensors;
    sum.credit_bytes += s.credit_bytes;
    sum.credit_granted += s.credit_granted;
    sum.peak_in_flight = std::max(sum.peak_in_flight, s.peak_in_flight);
    sum.credit_stalls += s.credit_stalls;
    sum.blocked_on_credit = sum.blocked_on_credit || s.blocked_on_credit;
    sum.writing = sum.writing || s.writing;
    sum.closed = sum.closed && s.closed;
  }
  if (stripes() > 1) {
    absl::MutexLock lock(&mu_);
    sum.tensors_sent += striped_sent_;
    sum.striped_sent = striped_sent_;
    sum.queued_tensors += static_cast<int64_t>(waiting_.size());
  }
  return sum;
}

bool StripeGroup::WaitFor(const std::function<bool(const LinkStats&)>& condition,
                          absl::Duration timeout) const {
  if (stripes() == 1) return cores_[0]->WaitFor(condition, timeout);
  // Several cores, several locks: poll the summed counters (waits are for tests and shutdown).
  const absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    if (condition(stats())) return true;
    if (absl::Now() >= deadline) return false;
    absl::SleepFor(absl::Milliseconds(1));
  }
}

absl::Status StripeGroup::status() const {
  if (stripes() == 1) return cores_[0]->status();
  absl::MutexLock lock(&mu_);
  return failure_;
}

}  // namespace pipetrain::link::internal
