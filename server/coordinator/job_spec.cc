#include "server/coordinator/job_spec.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/model/optimizer_proto.h"
#include "common/schedule/generator.h"
#include "common/schedule/validator.h"
#include "common/util/status_macros.h"

namespace pipetrain::coordinator {

absl::StatusOr<CheckedJobSpec> CheckJobSpec(const JobLimits& limits, v1::JobSpec* spec) {
  // The caps first: counting is cheap, building a model of a million layers is not.
  if (spec->model().layers_size() > limits.max_layers) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the model has ", spec->model().layers_size(), " layers, more than the limit of ",
        limits.max_layers, " (coordinator flag --max-layers)"));
  }
  if (const size_t bytes = spec->model().ByteSizeLong();
      bytes > static_cast<size_t>(kMaxModelSpecBytes)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the model spec has ", bytes, " bytes, more than the limit of ", kMaxModelSpecBytes));
  }
  if (spec->microbatches() > limits.max_microbatches) {
    return absl::ResourceExhaustedError(
        absl::StrCat("microbatches ", spec->microbatches(), " is more than the limit of ",
                     limits.max_microbatches, " (coordinator flag --max-microbatches)"));
  }
  PT_ASSIGN_OR_RETURN(schedule::ScheduleKind kind, schedule::ParseScheduleKind(spec->schedule()));
  if (spec->virtual_stages() == 0) {
    spec->set_virtual_stages(schedule::DefaultVirtualStages(kind));
  }
  if (spec->threads() == 0) spec->set_threads(1);
  if (spec->threads() < 1) {
    return absl::InvalidArgumentError(absl::StrCat("threads must be >= 1, got ", spec->threads()));
  }
  schedule::ScheduleParams params;
  params.kind = kind;
  params.stages = spec->stages();
  params.microbatches = spec->microbatches();
  params.virtual_stages = spec->virtual_stages();
  PT_RETURN_IF_ERROR(schedule::CheckScheduleParams(params));
  PT_RETURN_IF_ERROR(model::OptimizerFromProto(spec->optimizer()).status());
  PT_ASSIGN_OR_RETURN(std::unique_ptr<model::Model> built,
                      model::Model::Build(spec->model(), limits.model));
  CheckedJobSpec checked;
  checked.model = std::move(built);
  const int64_t chunks = int64_t{spec->stages()} * spec->virtual_stages();
  if (checked.model->num_layers() < chunks) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the model has ", checked.model->num_layers(), " layers, fewer than the ", chunks,
        " chunks of ", spec->stages(), " stages x ", spec->virtual_stages(), " virtual stages"));
  }
  PT_ASSIGN_OR_RETURN(checked.plan, schedule::GenerateSchedule(params));
  PT_RETURN_IF_ERROR(schedule::ValidatePlan(checked.plan));
  return checked;
}

}  // namespace pipetrain::coordinator
