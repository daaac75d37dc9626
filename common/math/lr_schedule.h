// Learning-rate schedules: the learning rate of each optimizer update as a pure function of the
// update's number, computed here only (math::OptimizerStep calls it), so `reference`, the stage
// workers of `train`/`local` and a resumed run apply the same rate to the same update, bit for
// bit.
//
// For update s (1-based, as OptimizerStep counts) and base rate lr:
//   warm-up   s <= warmup_steps:  lr * s / warmup_steps   (linear from lr/warmup_steps up to lr)
//   constant  afterwards:         lr
//   decay     afterwards, p = min(1, (s - warmup_steps) / (decay_steps - warmup_steps)):
//     warmup-cosine:  min_lr + (lr - min_lr) * (1 + cos(pi p)) / 2
//     warmup-linear:  min_lr + (lr - min_lr) * (1 - p)
// so the rate reaches min_lr at update decay_steps and stays there. The arithmetic is in double
// with the portable cosine of det_math.h (no libm), rounded once to float.
#ifndef PIPETRAIN_COMMON_MATH_LR_SCHEDULE_H_
#define PIPETRAIN_COMMON_MATH_LR_SCHEDULE_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pipetrain::math {

enum class LrScheduleKind { kConstant, kWarmupCosine, kWarmupLinear };

struct LrSchedule {
  LrScheduleKind kind = LrScheduleKind::kConstant;
  int64_t warmup_steps = 0;  // >= 0; updates of linear warm-up (0: none).
  // Decaying kinds: the update at which the rate reaches min_lr, > warmup_steps. Ignored by
  // kConstant.
  int64_t decay_steps = 0;
  float min_lr = 0.0f;  // decaying kinds: the final rate, in [0, lr].

  bool operator==(const LrSchedule& o) const {
    return kind == o.kind && warmup_steps == o.warmup_steps && decay_steps == o.decay_steps &&
           min_lr == o.min_lr;
  }
  bool operator!=(const LrSchedule& o) const { return !(*this == o); }
};

// "constant", "warmup-cosine", "warmup-linear".
absl::string_view LrScheduleKindName(LrScheduleKind kind);

// The kind named `name` (as LrScheduleKindName writes it; underscores accepted for dashes).
// INVALID_ARGUMENT naming the known kinds otherwise.
absl::StatusOr<LrScheduleKind> ParseLrScheduleKind(absl::string_view name);

// OK if `schedule` is usable with base rate `lr`; INVALID_ARGUMENT naming the field otherwise.
absl::Status ValidateLrSchedule(const LrSchedule& schedule, float lr);

// The learning rate of update `step` (>= 1) for base rate `lr`. Pure and thread-safe; for
// kConstant without warm-up it is exactly `lr`.
float LearningRateAt(const LrSchedule& schedule, float lr, int64_t step);

// A one-line description: "warmup-cosine (warm-up 10, decay to 0.0001 at update 300)".
std::string DescribeLrSchedule(const LrSchedule& schedule);

}  // namespace pipetrain::math

#endif  // PIPETRAIN_COMMON_MATH_LR_SCHEDULE_H_
