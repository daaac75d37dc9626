// TrainReactor: the coordinator's end of a client's Train stream. Reads one batch ahead: while a
// step runs on the job's thread the next batch is already read and queued behind it, so a client
// that sends batch k+1 before it reads result k finds the coordinator running step k+1 as soon
// as step k committed. At most kStepsInFlight steps are queued or running; results are written
// in order, one write in flight. After a failed step the steps queued behind it are skipped
// (applied nowhere), the results written before it are still delivered, then the stream ends
// with the failure. Deletes itself in OnDone, which gRPC calls only after Finish — and Finish
// waits until no posted step still refers to the reactor.
#ifndef PIPETRAIN_SERVER_COORDINATOR_TRAIN_REACTOR_H_
#define PIPETRAIN_SERVER_COORDINATOR_TRAIN_REACTOR_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <deque>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "pipetrain/v1/coordinator.pb.h"
#include "server/coordinator/coordinator_core.h"

namespace pipetrain::coordinator {

class TrainReactor final : public grpc::ServerBidiReactor<v1::TrainRequest, v1::StepResult> {
 public:
  // The running step and one read ahead.
  static constexpr int kStepsInFlight = 2;

  // `caller`: the principal the stream acts as (it may train only jobs it may see).
  TrainReactor(CoordinatorCore* core, std::string caller);

  void OnReadDone(bool ok) override;
  void OnWriteDone(bool ok) override;
  // The client cancelled (or its connection broke): the queued step is skipped and the job
  // released at once; a running step completes on the job's thread.
  void OnCancel() override;
  void OnDone() override;

 private:
  // The batch just read: claims the job on the first, then queues the step on its thread.
  void QueueStepLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // One step, on the job's thread: skipped once the stream failed.
  void RunStep(const v1::TrainRequest& request) ABSL_LOCKS_EXCLUDED(mu_);
  void StartReadLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends the stream with `status` (the first failure wins) once nothing refers to it. Releases
  // the job at once, before the client can see the status, so that a new Train stream opened
  // after this one ended is never refused because of it.
  void FailLocked(const absl::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Finishes the stream once no step is queued or running and every result is written: with
  // error_ after a failure, OK once the client closed its side.
  void MaybeFinishLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  CoordinatorCore* const core_;
  const std::string caller_;
  // Protects everything below. Taken before the core's lock (ClaimJob, PostToJob, ReleaseJob);
  // never held while a step runs.
  absl::Mutex mu_;
  v1::TrainRequest incoming_ ABSL_GUARDED_BY(mu_);           // the read in flight writes here.
  std::deque<v1::StepResult> results_ ABSL_GUARDED_BY(mu_);  // front: the write in flight.
  std::string job_ ABSL_GUARDED_BY(mu_);
  absl::Status error_ ABSL_GUARDED_BY(mu_);  // the stream's first failure.
  // Queued or running steps: changed under mu_, also read without it (the step's next_queued).
  std::atomic<int> steps_in_flight_{0};
  bool reading_ ABSL_GUARDED_BY(mu_) = false;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool reads_done_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace pipetrain::coordinator

#endif  // PIPETRAIN_SERVER_COORDINATOR_TRAIN_REACTOR_H_
