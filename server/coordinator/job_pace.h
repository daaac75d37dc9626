// JobPace: a job's training pace as the coordinator measures it at each committed step — the last
// step's figures, samples/s over a window of recent steps, and from that the time to a target
// step (JobStatus.progress). Not thread-safe: the core's lock guards it (a Job field).
#ifndef PIPETRAIN_SERVER_COORDINATOR_JOB_PACE_H_
#define PIPETRAIN_SERVER_COORDINATOR_JOB_PACE_H_

#include <cstddef>
#include <cstdint>
#include <deque>

#include "absl/time/time.h"
#include "pipetrain/v1/coordinator.pb.h"

namespace pipetrain::coordinator {

class JobPace {
 public:
  // The steps whose commits the pace is measured over.
  static constexpr size_t kWindow = 20;

  // Records `step`, committed at `now`.
  void OnCommitted(const v1::StepCommitted& step, absl::Time now);
  // A new generation starts (a recovery restarted every rank from a checkpoint): the pace is
  // measured afresh from its first step, so that the outage does not count as training time. The
  // last step's figures stay.
  void Restart() { window_.clear(); }

  // The progress of a job that has done `steps_done` steps toward `target_step` (0: unknown).
  // `live`: the job has not ended (an ended job has no ETA).
  v1::JobProgress Progress(int64_t steps_done, int64_t target_step, bool live) const;

 private:
  struct Commit {
    absl::Time at;
    int64_t samples = 0;
  };
  // Seconds per step and samples/s over the window (0 when nothing was committed).
  double SecondsPerStep() const;
  double SamplesPerSecond() const;

  std::deque<Commit> window_;  // the last kWindow commits, oldest first.
  v1::StepCommitted last_;     // the last step committed (step 0: none yet).
  absl::Time last_at_;
};

}  // namespace pipetrain::coordinator

#endif  // PIPETRAIN_SERVER_COORDINATOR_JOB_PACE_H_
