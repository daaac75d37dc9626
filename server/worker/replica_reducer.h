// ReplicaReducer: the reductions of a step's weight gradients between workers that hold parts of
// the same gradients -- the data-parallel replicas of a chunk (Assign.replicas) and the two copies
// of a stage under bidirectional DualPipe (docs/numerics.md, "Accumulation order") -- on a thread
// of its own, so that they overlap the rest of the action list: the executor hands it each
// chunk's gradients as soon as the chunk's last W ran, and collects the sums before it reports
// the step.
//
// A reduction is described by its ReductionGroup: the peers (a power of two >= 2; this worker is
// peer `me`), the chunk each peer holds, and the frame kind of its messages. A chunk's gradients
// travel as one flat vector (model::Stage::CopyGradsTo), cut into segments of at most
// kReplicaSegmentFloats floats; each segment is summed with AllReduceState (AllReduceSum's
// rounds), so every element is the binary tree of the peers' partial gradients, lower peer first
// at every node -- on every peer the same bits, those of the step's gradient tree (each peer's
// share is a node of it; two copies: the down copy's half, then the up copy's). A message is a
// frame of the group's kind keyed (step, segment * rounds + round, chunk held by the receiving
// peer): the Sender routes it to that peer, whose link delivers it to its Mailbox.
//
// Speed: the segments are pipelined. Up to kReductionWindow segments of each reduction are in
// flight at once, and every reduction of the step runs at the same time: while one segment's
// message crosses the link, the thread adds another's, and rounds of different segments overlap.
// The thread waits for whichever awaited message comes first (Mailbox::TakeAny). Each reduction
// is deadlock-free on its own (its segments start in the same order on every peer), so the peers
// need not submit their reductions in the same order.
//
// Errors end the step with a status: the transport's (a lost peer: the link's, UNAVAILABLE; an
// aborted mailbox: its status), DEADLINE_EXCEEDED when no awaited message arrives within the
// timeout, INVALID_ARGUMENT for a message of another length, CANCELLED after Cancel().
#ifndef PIPETRAIN_SERVER_WORKER_REPLICA_REDUCER_H_
#define PIPETRAIN_SERVER_WORKER_REPLICA_REDUCER_H_

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/wire/tensor_key.h"
#include "server/worker/gradient_exchange.h"
#include "server/worker/mailbox.h"

namespace pipetrain::worker {

class Sender;  // executor.h

// Most floats of one segment (4 MiB): a message stays a [1, <= 2^20] row vector whatever the
// chunk's size (frames allow 2^24 per dimension), and segments are small enough to pipeline.
inline constexpr int64_t kReplicaSegmentFloats = int64_t{1} << 20;
// Most segments of one reduction in flight at once; bounds the bytes a peer's mailbox holds for
// it to kReductionWindow segments.
inline constexpr int kReductionWindow = 4;

// The peers of one reduction and how its messages are keyed.
struct ReductionGroup {
  int chunk = 0;  // the chunk whose gradients this worker contributes (Finish's key).
  int me = 0;     // this worker's index among the peers.
  // The chunk each peer holds, by peer index: a message for peer i names peer_chunks[i]. The
  // peer count is its size (a power of two >= 2); peer_chunks[me] == chunk.
  std::vector<int> peer_chunks;
  wire::TensorKind kind = wire::TensorKind::kReplicaGradient;
  // Names the reduction in error messages, e.g. "replica reduction of chunk 3 (replica 1 of 4)".
  std::string what;

  // Replica `replica` of `replicas` reducing `chunk` with the other replicas' `chunk`
  // (kReplicaGradient).
  static ReductionGroup Replicas(int chunk, int replica, int replicas);
  // Copy `chunk` of stage `stage` with the other copy `other` (kCopyGradient); the down copy,
  // whose half of the micro-batches comes first in the gradient tree, is peer 0.
  static ReductionGroup Copies(int stage, int chunk, int other, bool down);
  int peers() const { return static_cast<int>(peer_chunks.size()); }
  // OK, or INVALID_ARGUMENT naming what is wrong (peer count, index, chunk, kind).
  absl::Status Check() const;
};

// What the reductions of one step cost this worker.
struct ReplicaReduceStats {
  int64_t bytes_sent = 0;  // payload bytes of the messages it sent.
  absl::Duration busy;     // from the first reduction's start to the last one's end.
  absl::Duration wait;     // of which waiting with nothing to add.
};

// Thread-safe: Start, Submit and Finish come from one thread (the compute thread), Cancel from
// any; the reductions run on the reducer's own thread.
class ReplicaReducer {
 public:
  // `sender` and `mailbox` must outlive the reducer; Sender::Send must be callable from the
  // reducer's thread. When no awaited message arrives within `timeout` the step fails with
  // DEADLINE_EXCEEDED naming a key. INVALID_ARGUMENT for null pointers or a timeout <= 0.
  static absl::StatusOr<std::unique_ptr<ReplicaReducer>> Create(Sender* sender, Mailbox* mailbox,
                                                                absl::Duration timeout);
  ~ReplicaReducer();  // cancels the running reductions and joins the thread.
  ReplicaReducer(const ReplicaReducer&) = delete;
  ReplicaReducer& operator=(const ReplicaReducer&) = delete;

  // Begins step `step`: forgets the last step's sums, errors and cancellation. Call when no
  // reduction is queued or running (after Finish).
  void Start(int64_t step);
  // Starts the reduction of `grads` over `group` (every peer submits one with the same peers
  // and as many floats); the reductions of a step run together, each chunk once.
  // INVALID_ARGUMENT (nothing queued) for a bad group (ReductionGroup::Check), a chunk submitted
  // twice in the step, or more segments than a frame's micro-batch field can number.
  absl::Status Submit(ReductionGroup group, std::vector<float> grads);
  // Waits until every submitted reduction ended; returns the sums by chunk, or the step's first
  // error (the other reductions are then dropped).
  absl::StatusOr<std::map<int, std::vector<float>>> Finish();
  // Ends the running and queued reductions with CANCELLED (a step that failed here) at once;
  // Finish then returns that error. Any thread.
  void Cancel();
  // The cost of the reductions since Start (complete once Finish returned).
  ReplicaReduceStats stats() const;

 private:
  // One reduction in progress (reducer thread only).
  struct Job {
    ReductionGroup group;
    std::vector<float> grads;
    int64_t segments = 0;
    int64_t started = 0;   // segments begun, in order.
    int64_t finished = 0;  // segments done.
  };
  // One segment of a job in flight (reducer thread only).
  struct Segment {
    Job* job = nullptr;
    int64_t index = 0;
    AllReduceState state;
    bool sent = false;  // this round's message is sent.
    bool awaiting = false;
    wire::TensorKey key;  // when awaiting: the partner's message of this round.
  };

  ReplicaReducer(Sender* sender, Mailbox* mailbox, absl::Duration timeout);

  // The reducer's thread: runs the submitted jobs until destruction.
  void Loop();
  // Takes the queued jobs into jobs_; false when the thread must stop. Drops everything after
  // an error or Cancel.
  bool Admit(int64_t* step);
  // Begins segments of every job up to the window and publishes finished jobs.
  absl::Status Advance(int64_t step);
  // Sends `segment`'s messages until it awaits one or is done.
  absl::Status Pump(int64_t step, Segment* segment);
  // Waits for one awaited message (or a notice, or the slice's end) and applies it; a failure
  // (the mailbox's, the timeout's, the message's) goes to Fail.
  void AwaitOne(int64_t step, int64_t notices);
  // Records the step's first error, `job`'s context added, and drops every job.
  void Fail(const absl::Status& status, const Job* job);
  wire::TensorKey Key(int64_t step, const Job& job, int64_t segment, int round, int to) const;

  // Constant after construction.
  Sender* const sender_;
  Mailbox* const mailbox_;
  const absl::Duration timeout_;

  // Protects the queue, the step's results and the flags. The thread waits on it for work,
  // Finish for the step's jobs to end.
  mutable absl::Mutex mu_;
  int64_t step_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<Job> queue_ ABSL_GUARDED_BY(mu_);
  int pending_ ABSL_GUARDED_BY(mu_) = 0;             // jobs submitted this step and not ended.
  std::vector<int> submitted_ ABSL_GUARDED_BY(mu_);  // chunks submitted this step.
  std::map<int, std::vector<float>> sums_ ABSL_GUARDED_BY(mu_);
  absl::Status status_ ABSL_GUARDED_BY(mu_);  // the step's first error.
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  ReplicaReduceStats stats_ ABSL_GUARDED_BY(mu_);
  absl::Time first_start_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();

  // The reducer thread's own: the jobs in progress and their segments in flight.
  std::deque<std::unique_ptr<Job>> jobs_;
  std::deque<Segment> segments_;
  absl::Time last_message_;  // when the thread last received a message or admitted a job.

  std::thread thread_;
};

}  // namespace pipetrain::worker

#endif  // PIPETRAIN_SERVER_WORKER_REPLICA_REDUCER_H_
