#include "common/math/lr_schedule.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "common/math/det_math.h"

namespace pipetrain::math {

absl::string_view LrScheduleKindName(LrScheduleKind kind) {
  switch (kind) {
    case LrScheduleKind::kConstant:
      return "constant";
    case LrScheduleKind::kWarmupCosine:
      return "warmup-cosine";
    case LrScheduleKind::kWarmupLinear:
      return "warmup-linear";
  }
  return "constant";
}

absl::StatusOr<LrScheduleKind> ParseLrScheduleKind(absl::string_view name) {
  const std::string dashed = absl::StrReplaceAll(name, {{"_", "-"}});
  for (LrScheduleKind k :
       {LrScheduleKind::kConstant, LrScheduleKind::kWarmupCosine, LrScheduleKind::kWarmupLinear}) {
    if (dashed == LrScheduleKindName(k)) return k;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown learning-rate schedule '", name,
                                                 "' (expected constant, warmup-cosine or "
                                                 "warmup-linear)"));
}

absl::Status ValidateLrSchedule(const LrSchedule& s, float lr) {
  if (s.warmup_steps < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("learning-rate schedule: warmup_steps must be >= 0, got ", s.warmup_steps));
  }
  if (s.kind == LrScheduleKind::kConstant) return absl::OkStatus();
  if (s.decay_steps <= s.warmup_steps) {
    return absl::InvalidArgumentError(
        absl::StrCat("learning-rate schedule ", LrScheduleKindName(s.kind), ": decay_steps (",
                     s.decay_steps, ") must be greater than warmup_steps (", s.warmup_steps, ")"));
  }
  if (!std::isfinite(s.min_lr) || s.min_lr < 0 || s.min_lr > lr) {
    return absl::InvalidArgumentError(absl::StrCat("learning-rate schedule: min_lr = ", s.min_lr,
                                                   " must be in [0, lr = ", lr, "]"));
  }
  return absl::OkStatus();
}

float LearningRateAt(const LrSchedule& s, float lr, int64_t step) {
  if (s.warmup_steps > 0 && step <= s.warmup_steps) {
    return static_cast<float>(static_cast<double>(lr) * static_cast<double>(step) /
                              static_cast<double>(s.warmup_steps));
  }
  if (s.kind == LrScheduleKind::kConstant) return lr;
  const double span = static_cast<double>(s.decay_steps - s.warmup_steps);
  const double p = std::min(1.0, static_cast<double>(step - s.warmup_steps) / span);
  double factor = 1.0 - p;
  if (s.kind == LrScheduleKind::kWarmupCosine) {
    double sine = 0, cosine = 0;
    PortableSinCos2Pi(p / 2, &sine, &cosine);  // cos(pi p)
    factor = 0.5 * (1.0 + cosine);
  }
  const double low = s.min_lr;
  return static_cast<float>(low + (static_cast<double>(lr) - low) * factor);
}

std::string DescribeLrSchedule(const LrSchedule& s) {
  std::string out(LrScheduleKindName(s.kind));
  if (s.warmup_steps > 0) absl::StrAppend(&out, " (warm-up ", s.warmup_steps);
  if (s.kind != LrScheduleKind::kConstant) {
    absl::StrAppend(&out, s.warmup_steps > 0 ? ", " : " (",
                    absl::StrFormat("decay to %g at update %d", s.min_lr, s.decay_steps));
  }
  if (s.warmup_steps > 0 || s.kind != LrScheduleKind::kConstant) out += ")";
  return out;
}

}  // namespace pipetrain::math
