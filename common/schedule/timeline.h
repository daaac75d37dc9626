// A timed execution of a plan: when each action ran on each rank, simulated or measured.
//
// The simulator produces a Timeline; the runtime will build the same struct from measured
// timestamps, so the renderers (timeline_render.h) and the statistics below serve both.
// Plain values, thread-compatible.
#ifndef PIPETRAIN_COMMON_SCHEDULE_TIMELINE_H_
#define PIPETRAIN_COMMON_SCHEDULE_TIMELINE_H_

#include <vector>

#include "absl/status/statusor.h"
#include "common/schedule/ir.h"

namespace pipetrain::schedule {

// One action and the interval it occupied its rank: [start, end), in time units chosen by the
// producer (the simulator uses the cost model's units; the runtime seconds).
struct TimedAction {
  Action action;
  double start = 0;
  double end = 0;
};

// Every rank's actions in execution order with their intervals. Time 0 is the step's start.
struct Timeline {
  Placement placement;                            // For chunk labels in the pictures.
  std::vector<std::vector<TimedAction>> workers;  // [rank][position].

  // Latest end over all actions (0 if there are none).
  double Makespan() const;
};

// Per-rank figures of a timeline.
struct WorkerStats {
  double busy = 0;             // Sum of action durations.
  double bubble_fraction = 0;  // 1 - busy / makespan (0 if the makespan is 0).
  // Most (micro-batch, chunk) activations stashed at once. An activation is stashed from the start
  // of its F until the end of its B, or of its W when the backward is split (W needs the layer
  // inputs); this depends only on the order of the rank's actions.
  int peak_activations = 0;
  // The same peak weighted by the per-chunk activation bytes (0 if none were given).
  double peak_activation_bytes = 0;
};

// Figures of a whole timeline.
struct TimelineStats {
  double makespan = 0;
  double bubble_fraction = 0;  // 1 - sum(busy) / (S * makespan).
  std::vector<WorkerStats> workers;
};

// Computes the figures above. `activation_bytes` is empty or has one entry per chunk (bytes
// stashed per micro-batch). INVALID_ARGUMENT if its size is wrong, an action names a chunk out of
// range, or an interval has end < start.
absl::StatusOr<TimelineStats> SummarizeTimeline(const Timeline& timeline,
                                                const std::vector<double>& activation_bytes);

}  // namespace pipetrain::schedule

#endif  // PIPETRAIN_COMMON_SCHEDULE_TIMELINE_H_
