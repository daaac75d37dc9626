// ReplicaReducer: the reduction of a step's weight gradients over data-parallel replicas
// (Assign.replicas; docs/numerics.md, "Accumulation order"), on a thread of its own so that it
// overlaps the rest of the action list: the executor hands it each chunk's gradients as soon as
// the chunk's last W ran, and collects the sums before it reports the step.
//
// A chunk's gradients travel as one flat vector (model::Stage::CopyGradsTo), cut into segments
// of at most kReplicaSegmentFloats floats; each segment is summed with worker::AllReduceSum, the
// replica being the peer index, so every element is the binary tree of the replicas' partial
// gradients, lower replica first at every node -- on every replica the same bits, those of the
// step's gradient tree over all M x R micro-batches (each replica's share is a node of it).
// Messages are frames of kind replica_gradient (wire::TensorKind::kReplicaGradient) keyed
// (step, segment * rounds + round, chunk): the Sender routes each to the round's partner
// replica (AllReducePartner), whose link delivers it to its Mailbox.
//
// Errors end the step with a status: the transport's (a lost peer: the link's, UNAVAILABLE; an
// aborted mailbox: its status), CANCELLED after Cancel().
#ifndef PIPETRAIN_SERVER_WORKER_REPLICA_REDUCER_H_
#define PIPETRAIN_SERVER_WORKER_REPLICA_REDUCER_H_

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/worker/mailbox.h"

namespace pipetrain::worker {

class Sender;  // executor.h

// Most floats of one segment (16 MiB): each is reduced on its own, so a message stays a
// [1, <= 2^22] row vector whatever the chunk's size (frames allow 2^24 per dimension).
inline constexpr int64_t kReplicaSegmentFloats = int64_t{1} << 22;

// What the reductions of one step cost this worker.
struct ReplicaReduceStats {
  int64_t bytes_sent = 0;  // payload bytes of the replica_gradient messages it sent.
  absl::Duration busy;     // from the first reduction's start to the last one's end.
  absl::Duration wait;     // of which waiting for the partners' messages.
};

// Thread-safe: Start, Submit and Finish come from one thread (the compute thread), Cancel from
// any; the reductions run on the reducer's own thread.
class ReplicaReducer {
 public:
  // This worker is replica `replica` of `replicas` (a power of two >= 2). `sender` and `mailbox`
  // must outlive the reducer; Sender::Send must be callable from the reducer's thread. A message
  // not received within `timeout` fails the step with DEADLINE_EXCEEDED naming its key.
  // INVALID_ARGUMENT for a bad replica count or index, null pointers or a timeout <= 0.
  static absl::StatusOr<std::unique_ptr<ReplicaReducer>> Create(int replica, int replicas,
                                                                Sender* sender, Mailbox* mailbox,
                                                                absl::Duration timeout);
  ~ReplicaReducer();  // cancels the running reduction and joins the thread.
  ReplicaReducer(const ReplicaReducer&) = delete;
  ReplicaReducer& operator=(const ReplicaReducer&) = delete;

  int replica() const { return replica_; }
  int replicas() const { return replicas_; }
  // 2 log2(replicas): the rounds of each segment's AllReduceSum.
  int rounds() const { return rounds_; }

  // Begins step `step`: forgets the last step's sums, errors and cancellation. Call when no
  // reduction is queued or running (after Finish).
  void Start(int64_t step);
  // Queues the reduction of `chunk`'s flat gradients; reductions run in the order submitted,
  // which must be the same on every replica (the same action list gives it).
  void Submit(int chunk, std::vector<float> grads);
  // Waits until every submitted reduction ended; returns the sums by chunk, or the first error
  // (the reductions queued after a failed one are skipped).
  absl::StatusOr<std::map<int, std::vector<float>>> Finish();
  // Ends the running reduction and the queued ones with CANCELLED (a step that failed here),
  // within one wait slice (50 ms); Finish then returns that error. Any thread.
  void Cancel();
  // The cost of the reductions since Start (complete once Finish returned).
  ReplicaReduceStats stats() const;

 private:
  ReplicaReducer(int replica, int replicas, Sender* sender, Mailbox* mailbox,
                 absl::Duration timeout);

  struct Job {
    int chunk = 0;
    std::vector<float> grads;
  };

  // The reducer's thread: runs the queued jobs in order until destruction.
  void Loop();
  // Sums `job` over the replicas in place, segment by segment.
  absl::Status Reduce(int64_t step, Job* job);
  // Waits for `key` in slices, so that Cancel is noticed; counts the time waited.
  absl::StatusOr<math::Matrix> TakeCancellable(const wire::TensorKey& key);

  // Constant after construction.
  const int replica_;
  const int replicas_;
  const int rounds_;
  Sender* const sender_;
  Mailbox* const mailbox_;
  const absl::Duration timeout_;

  // Protects the queue, the step's results and the flags. The thread waits on it for work,
  // Finish for the queue to drain.
  mutable absl::Mutex mu_;
  int64_t step_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<Job> queue_ ABSL_GUARDED_BY(mu_);
  bool running_ ABSL_GUARDED_BY(mu_) = false;  // the thread holds a job.
  std::map<int, std::vector<float>> sums_ ABSL_GUARDED_BY(mu_);
  absl::Status status_ ABSL_GUARDED_BY(mu_);  // the step's first error.
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  ReplicaReduceStats stats_ ABSL_GUARDED_BY(mu_);
  absl::Time first_start_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();

  std::thread thread_;
};

}  // namespace pipetrain::worker

#endif  // PIPETRAIN_SERVER_WORKER_REPLICA_REDUCER_H_
