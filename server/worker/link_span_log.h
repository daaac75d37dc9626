// LinkSpanLog: when a worker's tensors crossed its data links, step by step, for traces
// (`pipetrain train --trace`, StepDone.links). A send runs from the executor handing the tensor
// over (WorkerJob::Send) to gRPC completing the write of its last fragment; a receive from the
// arrival of its first fragment to its reassembly, just before the mailbox gets it
// (link::LinkTransfer). Both are recorded before the step can end for want of them: a send is
// queued before the link gets the tensor, a receive reported before the mailbox does.
#ifndef PIPETRAIN_SERVER_WORKER_LINK_SPAN_LOG_H_
#define PIPETRAIN_SERVER_WORKER_LINK_SPAN_LOG_H_

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/wire/tensor_key.h"
#include "server/link/peer_link.h"

namespace pipetrain::worker {

// One tensor's passage, relative to the start of its step (the domain form of v1::LinkSpan).
struct LinkSpanTiming {
  bool send = true;  // false: received.
  std::string peer;  // "stage/<rank>" or "coordinator".
  wire::TensorKey key;
  int64_t bytes = 0;
  absl::Duration start;  // >= 0.
  absl::Duration end;    // >= start.
  bool complete = true;  // false: a send still being written when the step was taken.
};

// Thread-safe: SendQueued runs on the compute thread, Record on gRPC threads, TakeStep and Clear
// on the compute thread.
class LinkSpanLog {
 public:
  using Clock = std::chrono::steady_clock;
  // Entries kept at most (older steps are dropped by TakeStep; beyond this, new ones are not
  // recorded, so a run of failing steps cannot grow the log without bound).
  static constexpr size_t kMaxEntries = size_t{1} << 16;

  // `bytes` of tensor `key` were handed to the link to `peer` at `at`.
  void SendQueued(const std::string& peer, const wire::TensorKey& key, int64_t bytes,
                  Clock::time_point at);
  // A link's report: a send (completes the oldest open send of the same peer and key queued by
  // SendQueued; ignored if there is none) or a receive (recorded).
  void Record(const std::string& peer, const link::LinkTransfer& transfer);
  // Removes and returns the spans of step `step`, dropping every older step's, in order of start
  // (ties: sends first, then by peer and key). Times are relative to `t0` (the step's start) and
  // clipped at 0; a send not yet complete ends at `now` with complete = false, and its
  // completion is ignored afterwards.
  std::vector<LinkSpanTiming> TakeStep(int64_t step, Clock::time_point t0, Clock::time_point now);
  // Forgets everything (the mailbox was reset: the spans recorded belong to no step to report).
  void Clear();

 private:
  struct Entry {
    bool send = true;
    std::string peer;
    wire::TensorKey key;
    int64_t bytes = 0;
    Clock::time_point start;
    std::optional<Clock::time_point> end;
  };

  // Protects the entries.
  absl::Mutex mu_;
  std::vector<Entry> entries_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pipetrain::worker

#endif  // PIPETRAIN_SERVER_WORKER_LINK_SPAN_LOG_H_
