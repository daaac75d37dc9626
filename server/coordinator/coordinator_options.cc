#include "server/coordinator/coordinator_options.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace pipetrain::coordinator {

absl::Status CoordinatorOptions::Check() const {
  if (assign_timeout <= absl::ZeroDuration() || step_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("assign_timeout and step_timeout must be > 0");
  }
  if (step_deadline_floor <= absl::ZeroDuration() || !(step_deadline_factor >= 1) ||
      !std::isfinite(step_deadline_factor)) {
    return absl::InvalidArgumentError(
        absl::StrCat("the step deadline needs a floor > 0 and a factor >= 1, got ",
                     absl::FormatDuration(step_deadline_floor), " and ", step_deadline_factor));
  }
  if (wait_report_interval <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("wait_report_interval must be > 0");
  }
  if (client_lease <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("client_lease must be > 0, got ", absl::FormatDuration(client_lease)));
  }
  if (job_retention < absl::ZeroDuration() || max_ended_jobs < 0) {
    return absl::InvalidArgumentError("job_retention and max_ended_jobs must be >= 0");
  }
  if (housekeeping_interval <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("housekeeping_interval must be > 0");
  }
  if (job_events < 1 || max_watches_per_job < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--job-events and max_watches_per_job must be >= 1, got ", job_events, " and ",
                     max_watches_per_job));
  }
  if (job_limits.max_layers < 1 || job_limits.max_microbatches < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max-layers and --max-microbatches must be >= 1, got ",
                     job_limits.max_layers, " and ", job_limits.max_microbatches));
  }
  return absl::OkStatus();
}

}  // namespace pipetrain::coordinator
