// A worker's compute speed from many short samples instead of one long one.
//
// One long sgemm probe at start-up measures whatever share of a CPU the worker got during it: a
// worker started while the host was busy registered at a fraction of its twin's speed, and the
// partition it got was unbalanced for the rest of the job (issue 30). Contention only ever slows
// a sample down, so the speed of the idle machine is in the fast samples: ProbeSpeed takes many
// samples of one short GEMM each (well under a scheduler time slice, so most of them run
// uninterrupted even on a busy host) and reports a high quantile of them (RobustSpeed), which a
// single lucky or unlucky sample cannot move.
//
// Pure functions over injected samples (tests feed them; the worker and `pipetrain plan --local`
// feed math::Kernels::MeasureGemmGflops); thread-safe.
#ifndef PIPETRAIN_COMMON_PLAN_SPEED_PROBE_H_
#define PIPETRAIN_COMMON_PLAN_SPEED_PROBE_H_

#include <functional>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace pipetrain::plan {

// The quantile of the samples RobustSpeed reports: the 90th percentile. A speed is right as long
// as more than 10 % of the samples ran uninterrupted, and no more than 10 % of them (a timer
// glitch, a turbo burst) can lift it.
inline constexpr double kSpeedQuantile = 0.9;

struct SpeedProbeOptions {
  // Samples to take, >= 1 (default 200: about 0.15 s at 50 GFLOP/s with 256^3 products).
  int samples = 200;
  // Stop early once this much time has passed (the samples so far count), > 0. Default 2 s: a
  // host so busy that 200 short products take longer still gets a speed.
  absl::Duration budget = absl::Seconds(2);
};

// What ProbeSpeed measured.
struct SpeedProbe {
  double speed = 0;   // RobustSpeed of the samples (the sampler's unit, e.g. GFLOP/s).
  double median = 0;  // their median: far below `speed` when the host was busy.
  int samples = 0;    // how many were taken.
};

// The kSpeedQuantile quantile of `samples` (nearest rank, on a sorted copy). INVALID_ARGUMENT if
// there are none or one is not a finite number > 0, naming it.
absl::StatusOr<double> RobustSpeed(std::vector<double> samples);

// Calls `sample` (one short measurement, returns a rate > 0) up to options.samples times, or
// until options.budget has passed on `now` (after at least one sample), and returns their
// RobustSpeed and median. `now` defaults to absl::Now; tests inject a clock. INVALID_ARGUMENT for
// options out of range or a sample that is not a finite number > 0.
absl::StatusOr<SpeedProbe> ProbeSpeed(const std::function<double()>& sample,
                                      const SpeedProbeOptions& options = SpeedProbeOptions(),
                                      const std::function<absl::Time()>& now = nullptr);

}  // namespace pipetrain::plan

#endif  // PIPETRAIN_COMMON_PLAN_SPEED_PROBE_H_
