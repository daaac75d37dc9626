// WatchReactor: the coordinator's end of a WatchJob stream. It writes the job's status, then the
// events of the job's log one at a time (at most one write in flight, no queue of its own): after
// each write it reads the watch's next event from the core; when there is none, the core hands it
// the next one as it is recorded (JobWatcher::OnJobEvent). The stream ends OK after the job's
// `ended` event, with the core's error when the watch is closed (the job pruned, the coordinator
// shutting down), and CANCELLED when the client goes away. Deletes itself in OnDone, after it
// closed its watch.
#ifndef PIPETRAIN_SERVER_COORDINATOR_WATCH_REACTOR_H_
#define PIPETRAIN_SERVER_COORDINATOR_WATCH_REACTOR_H_

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "pipetrain/v1/coordinator.pb.h"
#include "server/coordinator/coordinator_core.h"
#include "server/coordinator/job_event_log.h"

namespace pipetrain::coordinator {

class WatchReactor final : public grpc::ServerWriteReactor<v1::JobEvent>, public JobWatcher {
 public:
  // Opens the watch of `request`'s job for `caller` (the principal of the call) and writes its
  // status, or finishes with the core's error (NOT_FOUND, RESOURCE_EXHAUSTED, CANCELLED).
  WatchReactor(CoordinatorCore* core, const v1::WatchJobRequest& request,
               const std::string& caller);

  void OnWriteDone(bool ok) override;
  void OnCancel() override;
  void OnDone() override;

  // JobWatcher (the core's lock is held): writes the event; finishes the stream.
  void OnJobEvent(v1::JobEvent event) override;
  void OnWatchClosed(const absl::Status& why) override;

 private:
  // Writes `event` (none may be in flight), unless the stream is finishing.
  void WriteLocked(v1::JobEvent event) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Finishes the stream with `status` once no write is in flight (the first status wins).
  void FinishLocked(const absl::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  CoordinatorCore* const core_;
  const std::string job_;
  // Set by the constructor, before any other call can come.
  int64_t watch_ = -1;  // -1: the watch did not open.

  // Protects what follows. Taken after the core's lock (the JobWatcher calls), so it is never
  // held while calling into the core.
  absl::Mutex mu_;
  v1::JobEvent out_ ABSL_GUARDED_BY(mu_);  // the write in flight.
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finishing_ ABSL_GUARDED_BY(mu_) = false;  // no more writes; Finish once writing_ is false.
  absl::Status end_ ABSL_GUARDED_BY(mu_);        // what Finish gets.
  bool finished_ ABSL_GUARDED_BY(mu_) = false;   // Finish was called.
};

}  // namespace pipetrain::coordinator

#endif  // PIPETRAIN_SERVER_COORDINATOR_WATCH_REACTOR_H_
