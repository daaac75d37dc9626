#include "server/worker/replica_reducer.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/worker/executor.h"
#include "server/worker/gradient_exchange.h"

namespace pipetrain::worker {
namespace {

using wire::TensorKey;
using wire::TensorKind;

// How long one wait for a partner's message lasts before Cancel is checked again.
constexpr absl::Duration kWaitSlice = absl::Milliseconds(50);

// One segment's AllReduceSum transport: sends through the Sender (counting the bytes), takes
// through the reducer's cancellable wait.
class SegmentTransport final : public ExchangeTransport {
 public:
  using TakeFn = std::function<absl::StatusOr<math::Matrix>(const TensorKey&)>;
  SegmentTransport(Sender* sender, TakeFn take) : sender_(sender), take_(std::move(take)) {}
  void Send(const TensorKey& key, math::Matrix tensor) override {
    bytes_sent_ += static_cast<int64_t>(tensor.size()) * static_cast<int64_t>(sizeof(float));
    sender_->Send(key, std::move(tensor));
  }
  absl::StatusOr<math::Matrix> Take(const TensorKey& key) override { return take_(key); }
  int64_t bytes_sent() const { return bytes_sent_; }

 private:
  Sender* const sender_;
  const TakeFn take_;
  int64_t bytes_sent_ = 0;
};

}  // namespace

absl::StatusOr<std::unique_ptr<ReplicaReducer>> ReplicaReducer::Create(int replica, int replicas,
                                                                       Sender* sender,
                                                                       Mailbox* mailbox,
                                                                       absl::Duration timeout) {
  if (replicas < 2 || AllReduceRounds(replicas) < 0 || replica < 0 || replica >= replicas) {
    return absl::InvalidArgumentError(
        absl::StrCat("replica reduction: replica ", replica, " of ", replicas,
                     " (a power of two >= 2 is needed, the replica in [0, replicas))"));
  }
  if (sender == nullptr || mailbox == nullptr) {
    return absl::InvalidArgumentError("replica reduction needs a sender and a mailbox");
  }
  if (timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("replica reduction: timeout ", absl::FormatDuration(timeout), " is not > 0"));
  }
  return std::unique_ptr<ReplicaReducer>(
      new ReplicaReducer(replica, replicas, sender, mailbox, timeout));
}

ReplicaReducer::ReplicaReducer(int replica, int replicas, Sender* sender, Mailbox* mailbox,
                               absl::Duration timeout)
    : replica_(replica),
      replicas_(replicas),
      rounds_(AllReduceRounds(replicas)),
      sender_(sender),
      mailbox_(mailbox),
      timeout_(timeout) {
  thread_ = std::thread([this] { Loop(); });
}

ReplicaReducer::~ReplicaReducer() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    cancelled_ = true;
  }
  thread_.join();
}

void ReplicaReducer::Start(int64_t step) {
  absl::MutexLock lock(&mu_);
  step_ = step;
  queue_.clear();
  sums_.clear();
  status_ = absl::OkStatus();
  cancelled_ = false;
  stats_ = ReplicaReduceStats();
  first_start_ = absl::InfiniteFuture();
}

void ReplicaReducer::Submit(int chunk, std::vector<float> grads) {
  absl::MutexLock lock(&mu_);
  queue_.push_back(Job{chunk, std::move(grads)});
}

absl::StatusOr<std::map<int, std::vector<float>>> ReplicaReducer::Finish() {
  absl::MutexLock lock(&mu_);
  auto drained = [this]()
                     ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return queue_.empty() && !running_; };
  mu_.Await(absl::Condition(&drained));
  if (!status_.ok()) return status_;
  return std::exchange(sums_, {});
}

void ReplicaReducer::Cancel() {
  absl::MutexLock lock(&mu_);
  cancelled_ = true;
}

ReplicaReduceStats ReplicaReducer::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

void ReplicaReducer::Loop() {
  for (;;) {
    Job job;
    int64_t step = 0;
    {
      absl::MutexLock lock(&mu_);
      auto work = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || !queue_.empty(); };
      mu_.Await(absl::Condition(&work));
      if (stop_) return;
      job = std::move(queue_.front());
      queue_.pop_front();
      // After a failure (or Cancel) the step is lost: later jobs are dropped unrun.
      if (!status_.ok() || cancelled_) {
        if (status_.ok()) {
          status_ =
              absl::CancelledError(absl::StrCat("step ", step_, ": replica reduction cancelled"));
        }
        continue;
      }
      running_ = true;
      step = step_;
      first_start_ = std::min(first_start_, absl::Now());
    }
    const int chunk = job.chunk;
    absl::Status s = Reduce(step, &job);
    absl::MutexLock lock(&mu_);
    running_ = false;
    stats_.busy = absl::Now() - first_start_;
    if (!s.ok()) {
      if (status_.ok()) {
        status_ = absl::Status(
            s.code(), absl::StrCat("step ", step, ": replica reduction of chunk ", chunk,
                                   " (replica ", replica_, " of ", replicas_, "): ", s.message()));
      }
      continue;
    }
    sums_[chunk] = std::move(job.grads);
  }
}

absl::Status ReplicaReducer::Reduce(int64_t step, Job* job) {
  const int64_t n = static_cast<int64_t>(job->grads.size());
  absl::Status status;
  SegmentTransport transport(sender_,
                             [this](const TensorKey& key) { return TakeCancellable(key); });
  math::Tensor segment;
  for (int64_t lo = 0, index = 0; lo < n && status.ok(); lo += kReplicaSegmentFloats, ++index) {
    const int64_t len = std::min(kReplicaSegmentFloats, n - lo);
    segment.shape = {1, len};
    segment.data.assign(job->grads.begin() + lo, job->grads.begin() + lo + len);
    const int base = static_cast<int>(index) * rounds_;
    const AllReduceKeyFn key = [&](int /*from*/, int /*to*/, int round) {
      return TensorKey{step, base + round, job->chunk, TensorKind::kReplicaGradient};
    };
    status = AllReduceSum(&transport, replica_, replicas_, key, &segment);
    if (status.ok()) std::memcpy(job->grads.data() + lo, segment.data.data(), len * sizeof(float));
  }
  absl::MutexLock lock(&mu_);
  stats_.bytes_sent += transport.bytes_sent();
  return status;
}

absl::StatusOr<math::Matrix> ReplicaReducer::TakeCancellable(const TensorKey& key) {
  const absl::Time start = absl::Now();
  const absl::Time deadline =
      timeout_ == absl::InfiniteDuration() ? absl::InfiniteFuture() : start + timeout_;
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      if (cancelled_) {
        return absl::CancelledError(
            absl::StrCat("replica reduction cancelled while waiting for ", key.ToString()));
      }
    }
    const absl::Time slice = std::min(deadline, absl::Now() + kWaitSlice);
    absl::StatusOr<math::Matrix> got = mailbox_->Take(key, slice);
    if (got.ok() || got.status().code() != absl::StatusCode::kDeadlineExceeded ||
        absl::Now() >= deadline) {
      absl::MutexLock lock(&mu_);
      stats_.wait += absl::Now() - start;
      return got;
    }
  }
}

}  // namespace pipetrain::worker
