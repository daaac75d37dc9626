#include "server/worker/mailbox.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace pipetrain::worker {

Mailbox::Mailbox(const MailboxOptions& options)
    : max_bytes_(options.max_bytes), observer_(options.observer) {}

absl::Status Mailbox::Put(const wire::TensorKey& key, math::Matrix tensor) {
  const int64_t bytes = Bytes(tensor);
  absl::MutexLock lock(&mu_);
  if (!abort_status_.ok()) {
    return absl::Status(abort_status_.code(), absl::StrCat("mailbox rejects ", key.ToString(), ": ",
                                                           abort_status_.message()));
  }
  if (entries_.contains(key)) {
    return absl::FailedPreconditionError(
        absl::StrCat("duplicate tensor ", key.ToString(), ": already in the mailbox"));
  }
  if (max_bytes_ > 0 && stored_bytes_ + bytes > max_bytes_) {
    return absl::ResourceExhaustedError(
        absl::StrCat("mailbox full: storing ", key.ToString(), " (", bytes, " bytes) on top of ",
                     stored_bytes_, " bytes would exceed the bound of ", max_bytes_, " bytes"));
  }
  stored_bytes_ += bytes;
  entries_.emplace(key, std::move(tensor));
  if (blocked_.erase(key) > 0 && observer_ != nullptr) observer_->OnWaitEnd(key);
  if (takers_.contains(key)) arrived_.SignalAll();
  return absl::OkStatus();
}

absl::StatusOr<math::Matrix> Mailbox::Take(const wire::TensorKey& key, absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  if (takers_.contains(key)) {
    return absl::FailedPreconditionError(
        absl::StrCat("another Take already waits for ", key.ToString()));
  }
  takers_.insert(key);
  auto it = entries_.find(key);
  bool timed_out = false;
  while (it == entries_.end() && abort_status_.ok() && !timed_out) {
    if (blocked_.insert(key).second && observer_ != nullptr) observer_->OnWaitStart(key);
    timed_out = arrived_.WaitWithDeadline(&mu_, deadline);
    it = entries_.find(key);
  }
  // On arrival Put, and on abort Abort(), already reported the end of the wait.
  if (blocked_.erase(key) > 0 && observer_ != nullptr) observer_->OnWaitEnd(key);
  takers_.erase(key);
  if (!abort_status_.ok()) {
    return absl::Status(abort_status_.code(), absl::StrCat("waiting for ", key.ToString(), ": ",
                                                           abort_status_.message()));
  }
  if (it == entries_.end()) {
    return absl::DeadlineExceededError(
        absl::StrCat("deadline passed while waiting for ", key.ToString()));
  }
  math::Matrix out = std::move(it->second);
  entries_.erase(it);
  stored_bytes_ -= Bytes(out);
  return out;
}

absl::StatusOr<std::optional<Mailbox::Entry>> Mailbox::TakeAny(
    const std::vector<wire::TensorKey>& keys, absl::Time deadline, int64_t notices_seen) {
  if (keys.empty()) return absl::InvalidArgumentError("TakeAny without a key");
  absl::MutexLock lock(&mu_);
  for (size_t i = 0; i < keys.size(); ++i) {
    if (takers_.contains(keys[i])) {
      for (size_t j = 0; j < i; ++j) takers_.erase(keys[j]);
      return absl::Status(
          std::find(keys.begin(), keys.begin() + i, keys[i]) != keys.begin() + i
              ? absl::StatusCode::kInvalidArgument
              : absl::StatusCode::kFailedPrecondition,
          absl::StrCat("TakeAny: another Take already waits for ", keys[i].ToString()));
    }
    takers_.insert(keys[i]);
  }
  auto find = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (const wire::TensorKey& key : keys) {
      if (auto it = entries_.find(key); it != entries_.end()) return it;
    }
    return entries_.end();
  };
  auto it = find();
  bool timed_out = false;
  // Not reported to the observer: TakeAny serves a helper thread (the reducer's), and the
  // observer counts the compute thread's waits.
  while (it == entries_.end() && abort_status_.ok() && !timed_out && notices_ == notices_seen) {
    timed_out = arrived_.WaitWithDeadline(&mu_, deadline);
    it = find();
  }
  for (const wire::TensorKey& key : keys) takers_.erase(key);
  if (!abort_status_.ok()) {
    return absl::Status(abort_status_.code(), absl::StrCat("waiting for ", keys[0].ToString(), ": ",
                                                           abort_status_.message()));
  }
  if (it == entries_.end()) return std::optional<Entry>();
  Entry out(it->first, std::move(it->second));
  entries_.erase(it);
  stored_bytes_ -= Bytes(out.second);
  return std::optional<Entry>(std::move(out));
}

void Mailbox::Notify() {
  absl::MutexLock lock(&mu_);
  ++notices_;
  arrived_.SignalAll();
}

int64_t Mailbox::notices() const {
  absl::MutexLock lock(&mu_);
  return notices_;
}

void Mailbox::Abort(absl::Status status) {
  if (status.ok()) status = absl::AbortedError("mailbox aborted");
  absl::MutexLock lock(&mu_);
  if (abort_status_.ok()) abort_status_ = std::move(status);
  DropAllLocked();
  if (observer_ != nullptr) {
    for (const wire::TensorKey& key : blocked_) observer_->OnWaitEnd(key);
  }
  blocked_.clear();
  arrived_.SignalAll();
}

void Mailbox::ClearStep(int64_t step) {
  absl::MutexLock lock(&mu_);
  for (auto it = entries_.begin(); it != entries_.end();) {
    if (it->first.step == step) {
      stored_bytes_ -= Bytes(it->second);
      entries_.erase(it++);
    } else {
      ++it;
    }
  }
}

void Mailbox::Reset() {
  absl::MutexLock lock(&mu_);
  DropAllLocked();
  abort_status_ = absl::OkStatus();
}

void Mailbox::DropAllLocked() {
  entries_.clear();
  stored_bytes_ = 0;
}

int64_t Mailbox::size() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(entries_.size());
}

int64_t Mailbox::stored_bytes() const {
  absl::MutexLock lock(&mu_);
  return stored_bytes_;
}

absl::Status Mailbox::status() const {
  absl::MutexLock lock(&mu_);
  return abort_status_;
}

}  // namespace pipetrain::worker
