// The stage worker's data-plane rendezvous: tensors keyed by wire::TensorKey
// (step, micro-batch, chunk, kind), put by link threads and taken by the compute thread.
//
// A key is delivered at most once: Put stores it until the one Take that consumes it. Take blocks
// until its key arrives, the mailbox is aborted or an optional deadline passes. Abort is sticky:
// it wakes every waiter with the abort status and fails every later Put and Take until Reset().
// Leftovers of a finished or abandoned step are dropped with ClearStep() or Reset().
//
// Fencing stale senders is not the mailbox's job: frames of an older generation must be rejected by
// the link layer before they reach Put (otherwise a re-run of an aborted step could see a
// duplicate).
#ifndef PIPETRAIN_SERVER_WORKER_MAILBOX_H_
#define PIPETRAIN_SERVER_WORKER_MAILBOX_H_

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/math/tensor.h"
#include "common/wire/tensor_key.h"

namespace pipetrain::worker {

// Told when a Take starts waiting for an absent key and when that wait ends. Lets an observer
// (a deadlock detector in tests, a "waiting for" gauge in production) know how many compute
// threads are blocked without polling. Each OnWaitStart(key) is followed by exactly one
// OnWaitEnd(key), called by whichever call ends the wait: the Put that delivers the key (before
// that Put returns), Abort() (before it returns), or the Take itself on deadline.
// Both are called with the mailbox's lock held: they must be quick and must not call back into
// the mailbox. They may be called from any thread.
class MailboxObserver {
 public:
  virtual ~MailboxObserver() = default;
  virtual void OnWaitStart(const wire::TensorKey& key) = 0;
  virtual void OnWaitEnd(const wire::TensorKey& key) = 0;
};

struct MailboxOptions {
  // Upper bound on the bytes of tensors stored at once (rows * cols * 4 summed); 0 = unbounded.
  // A Put that would exceed it fails with RESOURCE_EXHAUSTED. The transport's credit window is
  // the flow control; this bound is the backstop against a misbehaving peer.
  int64_t max_bytes = 0;
  // Optional; must outlive the mailbox.
  MailboxObserver* observer = nullptr;
};

// Thread-safe: every method may be called concurrently from any thread.
class Mailbox {
 public:
  explicit Mailbox(const MailboxOptions& options = {});
  Mailbox(const Mailbox&) = delete;
  Mailbox& operator=(const Mailbox&) = delete;

  // Stores `tensor` (taking ownership) under `key` and wakes a Take waiting for it.
  // Errors (the tensor is then dropped): the abort status while aborted; FAILED_PRECONDITION if
  // `key` is already stored (a duplicate frame); RESOURCE_EXHAUSTED if storing it would exceed
  // options.max_bytes. Never blocks on another Put or Take beyond the internal lock.
  absl::Status Put(const wire::TensorKey& key, math::Matrix tensor);

  // Removes and returns the tensor stored under `key`, blocking until it is put, the mailbox is
  // aborted, or `deadline` passes. Errors: the abort status (same code, message prefixed with the
  // key); DEADLINE_EXCEEDED naming the key; FAILED_PRECONDITION if another Take already waits
  // for the same key (a key has one consumer).
  absl::StatusOr<math::Matrix> Take(const wire::TensorKey& key,
                                    absl::Time deadline = absl::InfiniteFuture());

  // A stored tensor and its key (TakeAny).
  using Entry = std::pair<wire::TensorKey, math::Matrix>;
  // Removes and returns one of the tensors stored under `keys` (the first of `keys` present),
  // blocking until one is put, the mailbox is aborted, `deadline` passes or Notify() is called
  // after notices() returned `notices_seen` (also before this call): std::nullopt on the last two,
  // so that one thread may wait for several reductions' messages and still be woken for new
  // work. Unlike Take's, its waits are not reported to the MailboxObserver (which counts the
  // compute thread's). Errors: the abort status (message naming the first key);
  // FAILED_PRECONDITION if another Take waits for one of the keys; INVALID_ARGUMENT for no key or
  // a key listed twice.
  absl::StatusOr<std::optional<Entry>> TakeAny(const std::vector<wire::TensorKey>& keys,
                                               absl::Time deadline, int64_t notices_seen);
  // Wakes every TakeAny waiting now, and makes the next ones given an older count return at once.
  void Notify();
  // How many times Notify() was called.
  int64_t notices() const;

  // Fails every current and future Put/Take with `status` (must not be OK; an OK status is
  // replaced by ABORTED) until Reset(). Stored tensors are dropped. The first status wins when
  // called repeatedly.
  void Abort(absl::Status status);

  // Drops every tensor stored for `step`. Does not affect the abort state or waiting Takes.
  void ClearStep(int64_t step);

  // Drops every stored tensor and clears the abort state. Takes still blocked (there should be
  // none: the compute thread has returned after Abort) keep waiting.
  void Reset();

  // Observability; snapshots that may be stale as soon as they return.
  int64_t size() const;          // stored tensors.
  int64_t stored_bytes() const;  // bytes of the stored tensors.
  absl::Status status() const;   // OK, or the abort status.

 private:
  static int64_t Bytes(const math::Matrix& m) {
    return static_cast<int64_t>(m.size()) * static_cast<int64_t>(sizeof(float));
  }
  void DropAllLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Constant after construction.
  const int64_t max_bytes_;
  MailboxObserver* const observer_;

  // Protects the stored tensors, their byte count, the wait bookkeeping and the abort state.
  // `arrived_` is signalled on every Put and on Abort.
  mutable absl::Mutex mu_;
  absl::CondVar arrived_;
  absl::flat_hash_map<wire::TensorKey, math::Matrix> entries_ ABSL_GUARDED_BY(mu_);
  int64_t stored_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  // Keys with a Take in progress (blocked or about to return).
  absl::flat_hash_set<wire::TensorKey> takers_ ABSL_GUARDED_BY(mu_);
  // Keys whose Take is blocked and whose OnWaitEnd has not been reported yet.
  absl::flat_hash_set<wire::TensorKey> blocked_ ABSL_GUARDED_BY(mu_);
  absl::Status abort_status_ ABSL_GUARDED_BY(mu_);
  int64_t notices_ ABSL_GUARDED_BY(mu_) = 0;  // Notify() calls.
};

}  // namespace pipetrain::worker

#endif  // PIPETRAIN_SERVER_WORKER_MAILBOX_H_
