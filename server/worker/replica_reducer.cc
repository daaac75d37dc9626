#include "server/worker/replica_reducer.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/util/status_macros.h"
#include "server/worker/executor.h"

namespace pipetrain::worker {
namespace {

using wire::TensorKey;
using wire::TensorKind;

// How long one wait for a message lasts before the thread looks at its flags again (Cancel and
// Submit also wake it at once through Mailbox::Notify).
constexpr absl::Duration kWaitSlice = absl::Milliseconds(50);

}  // namespace

ReductionGroup ReductionGroup::Replicas(int chunk, int replica, int replicas) {
  ReductionGroup g;
  g.chunk = chunk;
  g.me = replica;
  g.peer_chunks.assign(static_cast<size_t>(std::max(replicas, 0)), chunk);
  g.kind = TensorKind::kReplicaGradient;
  g.what = absl::StrCat("replica reduction of chunk ", chunk, " (replica ", replica, " of ",
                        replicas, ")");
  return g;
}

ReductionGroup ReductionGroup::Copies(int stage, int chunk, int other, bool down) {
  ReductionGroup g;
  g.chunk = chunk;
  g.me = down ? 0 : 1;
  g.peer_chunks = down ? std::vector<int>{chunk, other} : std::vector<int>{other, chunk};
  g.kind = TensorKind::kCopyGradient;
  g.what = absl::StrCat("gradients of stage ", stage, " (chunk ", chunk, ") with its copy ", other);
  return g;
}

absl::Status ReductionGroup::Check() const {
  const int n = peers();
  if (n < 2 || AllReduceRounds(n) < 0 || me < 0 || me >= n || peer_chunks[me] != chunk) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": peer ", me, " of ", n,
        " (a power of two >= 2 is needed, the peer in [0, peers) holding chunk ", chunk, ")"));
  }
  if (kind != TensorKind::kReplicaGradient && kind != TensorKind::kCopyGradient) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": messages of kind ", wire::TensorKindName(kind), " are not a reduction's"));
  }
  for (int c : peer_chunks) {
    if (c < 0) return absl::InvalidArgumentError(absl::StrCat(what, ": negative chunk ", c));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<ReplicaReducer>> ReplicaReducer::Create(Sender* sender,
                                                                       Mailbox* mailbox,
                                                                       absl::Duration timeout) {
  if (sender == nullptr || mailbox == nullptr) {
    return absl::InvalidArgumentError("gradient reduction needs a sender and a mailbox");
  }
  if (timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("gradient reduction: timeout ", absl::FormatDuration(timeout), " is not > 0"));
  }
  return std::unique_ptr<ReplicaReducer>(new ReplicaReducer(sender, mailbox, timeout));
}

ReplicaReducer::ReplicaReducer(Sender* sender, Mailbox* mailbox, absl::Duration timeout)
    : sender_(sender), mailbox_(mailbox), timeout_(timeout) {
  thread_ = std::thread([this] { Loop(); });
}

ReplicaReducer::~ReplicaReducer() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    cancelled_ = true;
  }
  mailbox_->Notify();
  thread_.join();
}

void ReplicaReducer::Start(int64_t step) {
  absl::MutexLock lock(&mu_);
  step_ = step;
  queue_.clear();
  pending_ = 0;
  submitted_.clear();
  sums_.clear();
  status_ = absl::OkStatus();
  cancelled_ = false;
  stats_ = ReplicaReduceStats();
  first_start_ = absl::InfiniteFuture();
}

absl::Status ReplicaReducer::Submit(ReductionGroup group, std::vector<float> grads) {
  PT_RETURN_IF_ERROR(group.Check());
  const int64_t n = static_cast<int64_t>(grads.size());
  const int64_t segments = (n + kReplicaSegmentFloats - 1) / kReplicaSegmentFloats;
  if (segments * AllReduceRounds(group.peers()) > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat(group.what, ": ", n,
                     " floats need more messages than a frame's micro-batch field numbers"));
  }
  {
    absl::MutexLock lock(&mu_);
    if (std::find(submitted_.begin(), submitted_.end(), group.chunk) != submitted_.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("step ", step_, ": ", group.what, ": chunk submitted twice"));
    }
    submitted_.push_back(group.chunk);
    queue_.push_back(Job{std::move(group), std::move(grads), segments});
    ++pending_;
  }
  mailbox_->Notify();
  return absl::OkStatus();
}

absl::StatusOr<std::map<int, std::vector<float>>> ReplicaReducer::Finish() {
  absl::MutexLock lock(&mu_);
  auto drained = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return pending_ == 0; };
  mu_.Await(absl::Condition(&drained));
  if (!status_.ok()) return status_;
  return std::exchange(sums_, {});
}

void ReplicaReducer::Cancel() {
  {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
  }
  mailbox_->Notify();
}

ReplicaReduceStats ReplicaReducer::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

void ReplicaReducer::Loop() {
  int64_t step = 0;
  for (;;) {
    // Read before looking for work, so that a Submit or Cancel after this ends the wait below.
    const int64_t notices = mailbox_->notices();
    if (!Admit(&step)) return;
    if (absl::Status s = Advance(step); !s.ok()) continue;  // Advance reported it.
    if (segments_.empty()) continue;
    AwaitOne(step, notices);
  }
}

bool ReplicaReducer::Admit(int64_t* step) {
  const bool busy = !jobs_.empty();  // read here: the condition may run on another thread.
  absl::MutexLock lock(&mu_);
  auto work = [this, busy]()
                  ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || busy || !queue_.empty(); };
  mu_.Await(absl::Condition(&work));
  if (stop_) return false;
  if (cancelled_ || !status_.ok()) {
    // After a failure (or Cancel) the step is lost: its jobs are dropped, the queued ones unrun.
    if (status_.ok()) {
      status_ =
          absl::CancelledError(absl::StrCat("step ", step_, ": gradient reduction cancelled"));
    }
    queue_.clear();
    jobs_.clear();
    segments_.clear();
    pending_ = 0;  // every job of the step was queued or held here.
    return true;
  }
  *step = step_;
  if (!queue_.empty() && !busy) last_message_ = absl::Now();
  while (!queue_.empty()) {
    first_start_ = std::min(first_start_, absl::Now());
    jobs_.push_back(std::make_unique<Job>(std::move(queue_.front())));
    queue_.pop_front();
  }
  return true;
}

absl::Status ReplicaReducer::Advance(int64_t step) {
  for (auto it = jobs_.begin(); it != jobs_.end();) {
    Job* job = it->get();
    int64_t in_flight = job->started - job->finished;
    while (job->started < job->segments && in_flight < kReductionWindow) {
      const int64_t lo = job->started * kReplicaSegmentFloats;
      const int64_t len =
          std::min(kReplicaSegmentFloats, static_cast<int64_t>(job->grads.size()) - lo);
      absl::StatusOr<AllReduceState> state =
          AllReduceState::Create(job->group.me, job->group.peers(), job->grads.data() + lo, len);
      if (!state.ok()) {
        Fail(state.status(), job);
        return state.status();
      }
      segments_.push_back(Segment{job, job->started++, *std::move(state), false, false, {}});
      ++in_flight;
      if (absl::Status s = Pump(step, &segments_.back()); !s.ok()) {
        Fail(s, job);
        return s;
      }
    }
    // Segments that finished while pumping leave the window.
    for (auto seg = segments_.begin(); seg != segments_.end();) {
      seg = seg->state.done() ? (++seg->job->finished, segments_.erase(seg)) : std::next(seg);
    }
    if (job->finished < job->segments || job->started < job->segments) {
      ++it;
      continue;
    }
    absl::MutexLock lock(&mu_);
    sums_[job->group.chunk] = std::move(job->grads);
    --pending_;
    stats_.busy = absl::Now() - first_start_;
    it = jobs_.erase(it);
  }
  return absl::OkStatus();
}

absl::Status ReplicaReducer::Pump(int64_t step, Segment* seg) {
  AllReduceState& state = seg->state;
  while (!state.done()) {
    const int to = state.partner();
    if (!seg->sent && state.send_len() > 0) {
      math::Matrix out(1, state.send_len());
      std::memcpy(out.data(), state.send_data(),
                  static_cast<size_t>(state.send_len()) * sizeof(float));
      sender_->Send(Key(step, *seg->job, seg->index, state.round(), to), std::move(out));
      absl::MutexLock lock(&mu_);
      stats_.bytes_sent += state.send_len() * static_cast<int64_t>(sizeof(float));
    }
    seg->sent = true;
    if (state.receive_len() > 0) {
      seg->awaiting = true;
      seg->key = Key(step, *seg->job, seg->index, state.round(), seg->job->group.me);
      return absl::OkStatus();
    }
    PT_RETURN_IF_ERROR(state.Receive(nullptr, 0));
    seg->sent = false;
  }
  return absl::OkStatus();
}

void ReplicaReducer::AwaitOne(int64_t step, int64_t notices) {
  std::vector<TensorKey> keys;
  const Job* first = nullptr;  // the job of keys[0], named by a wait's error.
  for (const Segment& seg : segments_) {
    if (!seg.awaiting) continue;
    keys.push_back(seg.key);
    if (first == nullptr) first = seg.job;
  }
  if (keys.empty()) return;
  const absl::Time start = absl::Now();
  const absl::Time deadline =
      timeout_ == absl::InfiniteDuration() ? absl::InfiniteFuture() : last_message_ + timeout_;
  absl::StatusOr<std::optional<Mailbox::Entry>> got =
      mailbox_->TakeAny(keys, std::min(deadline, start + kWaitSlice), notices);
  const absl::Time now = absl::Now();
  {
    absl::MutexLock lock(&mu_);
    stats_.wait += now - start;
  }
  if (!got.ok()) return Fail(got.status(), first);
  if (!got->has_value()) {
    if (now < deadline) return;  // a notice or the slice's end: look at the flags.
    return Fail(absl::DeadlineExceededError(
                    absl::StrCat("no message within ", absl::FormatDuration(timeout_),
                                 " while waiting for ", keys[0].ToString())),
                first);
  }
  last_message_ = now;
  const auto& [key, tensor] = **got;
  auto seg = std::find_if(segments_.begin(), segments_.end(),
                          [&key = key](const Segment& s) { return s.awaiting && s.key == key; });
  if (tensor.size() != seg->state.receive_len()) {
    return Fail(absl::InvalidArgumentError(
                    absl::StrCat("the partner's message ", key.ToString(), " holds ", tensor.size(),
                                 " floats, expected ", seg->state.receive_len())),
                seg->job);
  }
  absl::Status s = seg->state.Receive(tensor.data(), tensor.size());
  seg->awaiting = false;
  seg->sent = false;
  if (s.ok()) s = Pump(step, &*seg);
  if (!s.ok()) Fail(s, seg->job);
}

void ReplicaReducer::Fail(const absl::Status& status, const Job* job) {
  absl::MutexLock lock(&mu_);
  if (status_.ok()) {
    status_ = absl::Status(status.code(), job == nullptr
                                              ? absl::StrCat("step ", step_, ": ", status.message())
                                              : absl::StrCat("step ", step_, ": ", job->group.what,
                                                             ": ", status.message()));
  }
}

TensorKey ReplicaReducer::Key(int64_t step, const Job& job, int64_t segment, int round,
                              int to) const {
  const int rounds = AllReduceRounds(job.group.peers());
  return TensorKey{step, static_cast<int>(segment * rounds + round), job.group.peer_chunks[to],
                   job.group.kind};
}

}  // namespace pipetrain::worker
