// JobEventLog: a job's recent history for WatchJob — the last `capacity` events (steps committed,
// recoveries, checkpoints, the end), numbered 1, 2, … — and the watches reading it, each at its
// own position. A watch holds no queue: it reads the log through its position, and a watch that
// falls behind by more than the log keeps gets one `skipped` marker for what was dropped, so a
// slow watcher costs the coordinator no memory. The core keeps one per Job, under its lock.
#ifndef PIPETRAIN_SERVER_COORDINATOR_JOB_EVENT_LOG_H_
#define PIPETRAIN_SERVER_COORDINATOR_JOB_EVENT_LOG_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "pipetrain/v1/coordinator.pb.h"

namespace pipetrain::coordinator {

// An open watch of a job's events, as the core sees it (the gRPC shell's WatchReactor). Both
// calls come with the core's lock held: they must hand over and return — never block, never call
// into the core.
class JobWatcher {
 public:
  virtual ~JobWatcher() = default;
  // The next event for a watch that had read every event (JobEventLog::Next returned none).
  virtual void OnJobEvent(v1::JobEvent event) = 0;
  // The watch is over before it read the job's end: the job was pruned, or the coordinator shuts
  // down (`why` says which). No call follows.
  virtual void OnWatchClosed(const absl::Status& why) = 0;
};

// Not thread-safe: the core's lock guards it (a Job field).
class JobEventLog {
 public:
  // Keeps the last `capacity` (>= 1) events.
  explicit JobEventLog(size_t capacity) : capacity_(capacity < 1 ? 1 : capacity) {}
  JobEventLog(const JobEventLog&) = delete;
  JobEventLog& operator=(const JobEventLog&) = delete;

  size_t capacity() const { return capacity_; }
  size_t size() const { return events_.size(); }
  // The number of the last event appended (0: none yet).
  int64_t last_sequence() const { return last_; }
  size_t watches() const { return watches_.size(); }

  // Appends `event` with the next number and time `now` (dropping the oldest when full), then
  // hands each waiting watch its next event (JobWatcher::OnJobEvent). Returns the number.
  int64_t Append(v1::JobEvent event, absl::Time now);

  // Adds a watch of `watcher` (which must stay valid until RemoveWatch or CloseWatches) that reads
  // the events after number `after`: clamped to the last one, and to the one before the `ended`
  // event of an ended job, so that a watch of an ended job always reads its end. The watch does not
  // wait: its reader calls Next. RESOURCE_EXHAUSTED if `max_watches` are open already.
  absl::StatusOr<int64_t> AddWatch(JobWatcher* watcher, int64_t after, size_t max_watches);
  // The next event of watch `id`, which then counts as read: a `skipped` marker standing for the
  // events after its position that were dropped, else the next event kept. None when it has read
  // every event: the watch then waits, and its watcher gets the next event when it is appended.
  // NOT_FOUND for a watch that was removed or closed.
  absl::StatusOr<std::optional<v1::JobEvent>> Next(int64_t id);
  // Forgets watch `id` (no-op if unknown); its watcher hears nothing more.
  void RemoveWatch(int64_t id);
  // Tells every watch's watcher OnWatchClosed(`why`) and forgets the watches.
  void CloseWatches(const absl::Status& why);

 private:
  struct Watch {
    JobWatcher* watcher = nullptr;
    int64_t position = 0;  // the number of the last event it read.
    bool waiting = false;  // it read every event; the next goes to OnJobEvent.
  };
  // The event a watch at `position` reads next (a marker for dropped ones), or none.
  std::optional<v1::JobEvent> After(int64_t position) const;

  const size_t capacity_;
  std::deque<v1::JobEvent> events_;  // numbers last_ - size() + 1 .. last_, in order.
  int64_t last_ = 0;
  std::map<int64_t, Watch> watches_;
  int64_t next_watch_ = 1;
};

}  // namespace pipetrain::coordinator

#endif  // PIPETRAIN_SERVER_COORDINATOR_JOB_EVENT_LOG_H_
