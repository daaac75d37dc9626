#include "server/coordinator/job_shape.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace pipetrain::coordinator {

JobShape ShapeOf(const v1::JobSpec& spec) {
  return JobShape{std::max(1, spec.stages()), std::max(1, spec.replicas())};
}

std::string ShapeText(const JobShape& shape) {
  const std::string stages = absl::StrCat(shape.stages, shape.stages == 1 ? " stage" : " stages");
  if (shape.replicas == 1) return stages;
  return absl::StrCat(shape.replicas, " replicas x ", stages);
}

std::optional<JobShape> NextShape(const v1::JobSpec& spec, int idle) {
  const JobShape now = ShapeOf(spec);
  if (idle <= 0 || spec.max_stages() <= now.stages) return std::nullopt;
  // Every replica gets the same stage count: a stage more takes R workers.
  const int stages = std::min(spec.max_stages(), now.stages + idle / now.replicas);
  if (stages <= now.stages) return std::nullopt;
  return JobShape{stages, now.replicas};
}

}  // namespace pipetrain::coordinator
