#include "common/plan/speed_probe.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"

namespace pipetrain::plan {
namespace {

// OK if every sample is a finite number > 0.
absl::Status CheckSpeedSamples(const std::vector<double>& samples) {
  if (samples.empty()) return absl::InvalidArgumentError("no speed samples");
  for (size_t i = 0; i < samples.size(); ++i) {
    if (!(std::isfinite(samples[i]) && samples[i] > 0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("speed sample ", i, " is ", samples[i], ", not a finite number > 0"));
    }
  }
  return absl::OkStatus();
}

// The value at `quantile` (0..1) of sorted, non-empty `sorted`, by nearest rank.
double QuantileOfSorted(const std::vector<double>& sorted, double quantile) {
  const size_t n = sorted.size();
  const size_t rank = static_cast<size_t>(std::ceil(quantile * static_cast<double>(n)));
  return sorted[std::min(n - 1, rank == 0 ? 0 : rank - 1)];
}

}  // namespace

absl::StatusOr<double> RobustSpeed(std::vector<double> samples) {
  if (absl::Status s = CheckSpeedSamples(samples); !s.ok()) return s;
  std::sort(samples.begin(), samples.end());
  return QuantileOfSorted(samples, kSpeedQuantile);
}

absl::StatusOr<SpeedProbe> ProbeSpeed(const std::function<double()>& sample,
                                      const SpeedProbeOptions& options,
                                      const std::function<absl::Time()>& now) {
  if (options.samples < 1 || options.samples > (1 << 20)) {
    return absl::InvalidArgumentError(
        absl::StrCat("speed probe samples must be in [1, 2^20], got ", options.samples));
  }
  if (options.budget <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("speed probe budget must be > 0, got ", absl::FormatDuration(options.budget)));
  }
  const std::function<absl::Time()> clock = now ? now : [] { return absl::Now(); };
  const absl::Time deadline = clock() + options.budget;
  std::vector<double> samples;
  samples.reserve(options.samples);
  do {
    samples.push_back(sample());
  } while (static_cast<int>(samples.size()) < options.samples && clock() < deadline);
  if (absl::Status s = CheckSpeedSamples(samples); !s.ok()) return s;
  std::sort(samples.begin(), samples.end());
  SpeedProbe probe;
  probe.speed = QuantileOfSorted(samples, kSpeedQuantile);
  probe.median = QuantileOfSorted(samples, 0.5);
  probe.samples = static_cast<int>(samples.size());
  return probe;
}

}  // namespace pipetrain::plan
