#include "server/coordinator/watch_reactor.h"

#include <optional>
#include <utility>

#include "common/wire/grpc_status.h"

namespace pipetrain::coordinator {

WatchReactor::WatchReactor(CoordinatorCore* core, const v1::WatchJobRequest& request,
                           const std::string& caller)
    : core_(core), job_(request.job()) {
  // No JobWatcher call comes before the first NextWatchEvent, which follows the first write.
  absl::StatusOr<CoordinatorCore::WatchStart> start =
      core_->OpenWatch(request.job(), caller, request.after_sequence(), this);
  absl::MutexLock lock(&mu_);
  if (!start.ok()) {
    FinishLocked(start.status());
    return;
  }
  watch_ = start->watch;
  v1::JobEvent status;
  status.set_unix_ms(absl::ToUnixMillis(absl::Now()));
  *status.mutable_status() = std::move(start->status);
  WriteLocked(std::move(status));
}

void WatchReactor::OnWriteDone(bool ok) {
  {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    if (!ok) {
      FinishLocked(absl::CancelledError("the watcher went away"));
    } else if (out_.has_ended()) {
      FinishLocked(absl::OkStatus());  // the job's last event: the stream ends OK.
    } else if (finishing_) {
      FinishLocked(end_);  // closed or cancelled while the write was in flight.
    }
    if (finishing_) return;
  }
  // Without mu_: the core's lock comes first.
  absl::StatusOr<std::optional<v1::JobEvent>> next = core_->NextWatchEvent(job_, watch_);
  absl::MutexLock lock(&mu_);
  if (!next.ok()) {
    FinishLocked(next.status());
  } else if (next->has_value()) {
    WriteLocked(**std::move(next));
  }
  // None: the watch waits; OnJobEvent writes the next event.
}

void WatchReactor::OnCancel() {
  absl::MutexLock lock(&mu_);
  FinishLocked(absl::CancelledError("the watcher cancelled the stream"));
}

void WatchReactor::OnDone() {
  // After this no JobWatcher call comes (they run under the core's lock, as CloseWatch does).
  if (watch_ >= 0) core_->CloseWatch(job_, watch_);
  delete this;
}

void WatchReactor::OnJobEvent(v1::JobEvent event) {
  absl::MutexLock lock(&mu_);
  WriteLocked(std::move(event));
}

void WatchReactor::OnWatchClosed(const absl::Status& why) {
  absl::MutexLock lock(&mu_);
  FinishLocked(why);
}

void WatchReactor::WriteLocked(v1::JobEvent event) {
  if (finishing_) return;
  out_ = std::move(event);
  writing_ = true;
  StartWrite(&out_);
}

void WatchReactor::FinishLocked(const absl::Status& status) {
  if (!finishing_) {
    finishing_ = true;
    end_ = status;
  }
  if (writing_ || finished_) return;
  finished_ = true;
  Finish(wire::ToGrpcStatus(end_));
}

}  // namespace pipetrain::coordinator
