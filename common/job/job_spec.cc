#include "common/job/job_spec.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/io/digest.h"
#include "common/io/tokenizer.h"
#include "common/math/isa.h"
#include "common/model/optimizer_proto.h"
#include "common/partition/partitioner.h"
#include "common/schedule/generator.h"
#include "common/schedule/validator.h"
#include "common/util/status_macros.h"
#include "common/wire/grpc_status.h"

namespace pipetrain::job {

namespace {

// The caps of a spec, first: counting is cheap, building a model of a million layers is not.
absl::Status CheckCaps(const JobLimits& limits, const v1::JobSpec& spec) {
  if (spec.model().layers_size() > limits.max_layers) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the model has ", spec.model().layers_size(), " layers, more than the limit of ",
        limits.max_layers, " (coordinator flag --max-layers)"));
  }
  if (const size_t bytes = spec.model().ByteSizeLong();
      bytes > static_cast<size_t>(kMaxModelSpecBytes)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the model spec has ", bytes, " bytes, more than the limit of ", kMaxModelSpecBytes));
  }
  if (static_cast<int64_t>(spec.tokenizer().size()) > io::kMaxTokenizerBytes) {
    return absl::ResourceExhaustedError(absl::StrCat("tokenizer of ", spec.tokenizer().size(),
                                                     " bytes is more than the limit of ",
                                                     io::kMaxTokenizerBytes));
  }
  if (spec.microbatches() > limits.max_microbatches) {
    return absl::ResourceExhaustedError(
        absl::StrCat("microbatches ", spec.microbatches(), " is more than the limit of ",
                     limits.max_microbatches, " (coordinator flag --max-microbatches)"));
  }
  return absl::OkStatus();
}

// The spec's counts that need nothing else: min_stages, replace_timeout_ms, planned_steps and
// keep_checkpoints.
absl::Status CheckCounts(const v1::JobSpec& spec) {
  if (spec.min_stages() < 0 || spec.min_stages() > spec.stages()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "min_stages must be in [0, stages = ", spec.stages(), "], got ", spec.min_stages()));
  }
  if (spec.replace_timeout_ms() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("replace_timeout_ms must be >= 0, got ", spec.replace_timeout_ms()));
  }
  // Step counts stay below 2^53, as in checkpoints (whose counters are JSON numbers).
  if (spec.planned_steps() < 0 || spec.planned_steps() >= (int64_t{1} << 53)) {
    return absl::InvalidArgumentError(
        absl::StrCat("planned_steps must be in [0, 2^53), got ", spec.planned_steps()));
  }
  if (spec.keep_checkpoints() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("keep_checkpoints must be >= 0, got ", spec.keep_checkpoints()));
  }
  return absl::OkStatus();
}

// The growth bounds (docs/scaling.md, "Jobs that change shape"): max_stages 0 or in [stages,
// 4096], max_replicas 0 or in [replicas (0: 1), 4096].
absl::Status CheckGrowthBounds(const v1::JobSpec& spec) {
  constexpr int32_t kMostWorkers = 4096;
  if (spec.max_stages() != 0 &&
      (spec.max_stages() < spec.stages() || spec.max_stages() > kMostWorkers)) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_stages must be 0 or in [stages = ", spec.stages(), ", ", kMostWorkers,
                     "], got ", spec.max_stages()));
  }
  const int32_t replicas = std::max(1, spec.replicas());
  if (spec.max_replicas() != 0 &&
      (spec.max_replicas() < replicas || spec.max_replicas() > kMostWorkers)) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_replicas must be 0 or in [replicas = ", replicas, ", ", kMostWorkers,
                     "], got ", spec.max_replicas()));
  }
  return absl::OkStatus();
}

// The model the spec describes, its sizes left 0 filled from its data shape.
absl::StatusOr<std::unique_ptr<model::Model>> BuildModel(const JobLimits& limits,
                                                         v1::JobSpec* spec) {
  const v1::DataShape& data = spec->data_shape();
  PT_ASSIGN_OR_RETURN(
      *spec->mutable_model(),
      model::ResolveModelSpec(spec->model(),
                              model::DataShape{data.input_features(), data.target_features(),
                                               data.num_classes(), data.tokens_per_sample()}));
  absl::StatusOr<std::unique_ptr<model::Model>> built =
      model::Model::Build(spec->model(), limits.model);
  if (!built.ok()) {
    if (!spec->has_data_shape()) {
      return wire::Annotate(built.status(),
                            "model (sizes left 0 are filled from JobSpec.data_shape, which is "
                            "not set)");
    }
    return built.status();
  }
  if (data.target_features() > 0 && (*built)->target_features() != data.target_features()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the model's loss needs ", (*built)->target_features(),
                     " target features per row, the data shape has ", data.target_features()));
  }
  return built;
}

// OK without a tokenizer, or for one that parses and whose vocabulary fits the model's first
// embedding.
absl::Status CheckTokenizer(const v1::JobSpec& spec, const model::Model& net) {
  if (spec.tokenizer().empty()) return absl::OkStatus();
  PT_ASSIGN_OR_RETURN(std::shared_ptr<const io::Tokenizer> tokenizer,
                      io::Tokenizer::FromModel(spec.tokenizer(), "tokenizer"));
  for (const v1::LayerSpec& layer : net.spec().layers()) {
    if (!layer.has_embedding()) continue;
    if (layer.embedding().vocab_size() < tokenizer->vocab_size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tokenizer has ", tokenizer->vocab_size(), " pieces, more than the model's embedding ",
          "vocab_size ", layer.embedding().vocab_size()));
    }
    break;
  }
  return absl::OkStatus();
}

}  // namespace

JobLimits JobLimits::Unlimited() {
  JobLimits limits;
  limits.max_layers = std::numeric_limits<int32_t>::max();
  limits.max_microbatches = std::numeric_limits<int32_t>::max();
  limits.model.max_parameter_bytes = std::numeric_limits<int64_t>::max();
  limits.model.max_activation_bytes = std::numeric_limits<int64_t>::max();
  return limits;
}

absl::Status CheckJobIsa(const v1::JobSpec& spec) {
  if (spec.isa().empty() || math::IsaFromName(spec.isa()).has_value()) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("isa '", spec.isa(),
                   "' is not an instruction-set level (x86-64-v3, x86-64-v4, "
                   "generic)"));
}

absl::Status CheckResumeTokenizer(const std::string& dir, const model::CheckpointManifest& manifest,
                                  const std::string& tokenizer) {
  std::string job_sha256;
  if (!tokenizer.empty()) {
    PT_ASSIGN_OR_RETURN(io::FileDigest digest, io::DigestBytes(tokenizer));
    job_sha256 = digest.sha256;
  }
  const std::string saved = manifest.tokenizer.has_value() ? manifest.tokenizer->sha256 : "";
  if (saved == job_sha256) return absl::OkStatus();
  const auto describe = [](const std::string& sha256) {
    return sha256.empty() ? std::string("no tokenizer (byte-level text)")
                          : absl::StrCat("tokenizer SHA-256 ", sha256.substr(0, 12), "...");
  };
  return absl::FailedPreconditionError(
      absl::StrCat("resume_from ", dir, ": the checkpoint was trained with ", describe(saved),
                   ", the job has ", describe(job_sha256),
                   " (pipetrain: pass the checkpoint's tokenizer, or none, as --tokenizer)"));
}

absl::StatusOr<CheckedJobSpec> CheckJobSpec(const JobLimits& limits, v1::JobSpec* spec) {
  PT_RETURN_IF_ERROR(CheckCaps(limits, *spec));
  PT_ASSIGN_OR_RETURN(schedule::ScheduleKind kind, schedule::ParseScheduleKind(spec->schedule()));
  if (spec->virtual_stages() == 0) {
    spec->set_virtual_stages(schedule::DefaultVirtualStages(kind));
  }
  if (spec->threads() == 0) spec->set_threads(1);
  if (spec->threads() < 1) {
    return absl::InvalidArgumentError(absl::StrCat("threads must be >= 1, got ", spec->threads()));
  }
  PT_RETURN_IF_ERROR(CheckCounts(*spec));
  PT_RETURN_IF_ERROR(CheckGrowthBounds(*spec));
  schedule::ScheduleParams params;
  params.kind = kind;
  params.stages = spec->stages();
  params.microbatches = spec->microbatches();
  params.virtual_stages = spec->virtual_stages();
  PT_RETURN_IF_ERROR(schedule::CheckScheduleParams(params));
  PT_RETURN_IF_ERROR(schedule::CheckExecutable(kind));
  PT_RETURN_IF_ERROR(model::OptimizerFromProto(spec->optimizer()).status());
  PT_RETURN_IF_ERROR(CheckJobIsa(*spec));
  // The model as its author wrote it: sizes left 0 come from the client's data shape.
  CheckedJobSpec checked;
  PT_ASSIGN_OR_RETURN(checked.model, BuildModel(limits, spec));
  PT_RETURN_IF_ERROR(CheckTokenizer(*spec, *checked.model));
  PT_ASSIGN_OR_RETURN(checked.plan, PlanFor(*spec, *checked.model));
  return checked;
}

absl::StatusOr<schedule::Plan> PlanFor(const v1::JobSpec& spec, const model::Model& net) {
  PT_ASSIGN_OR_RETURN(schedule::ScheduleKind kind, schedule::ParseScheduleKind(spec.schedule()));
  schedule::ScheduleParams params;
  params.kind = kind;
  params.stages = spec.stages();
  params.microbatches = spec.microbatches();
  params.virtual_stages = spec.virtual_stages();
  PT_RETURN_IF_ERROR(schedule::CheckScheduleParams(params));
  PT_RETURN_IF_ERROR(schedule::CheckExecutable(kind));
  PT_RETURN_IF_ERROR(
      partition::CheckLayersCoverChunks(net.num_layers(), spec.stages(), spec.virtual_stages()));
  PT_ASSIGN_OR_RETURN(schedule::Plan plan, schedule::GenerateSchedule(params));
  PT_RETURN_IF_ERROR(schedule::ValidatePlan(plan));
  return plan;
}

absl::StatusOr<std::pair<std::vector<v1::ChunkSpec>, double>> PartitionChunks(
    const v1::JobSpec& spec, const model::Model& net, const schedule::Plan& plan,
    const std::vector<double>& speeds) {
  partition::PartitionOptions popts;
  popts.stages = static_cast<int>(speeds.size());
  popts.placement = plan.placement.kind;
  popts.virtual_stages = spec.virtual_stages();
  popts.speeds = speeds;
  PT_ASSIGN_OR_RETURN(partition::Partition cut,
                      partition::PartitionLayers(net.LayerFlops(1), popts));
  std::vector<v1::ChunkSpec> chunks;
  for (int c = 0; c < plan.num_chunks(); ++c) {
    v1::ChunkSpec chunk;
    chunk.set_chunk(c);
    chunk.set_rank(plan.placement.OwnerOf(c));
    chunk.set_first_layer(cut.boundaries[c]);
    chunk.set_last_layer(cut.boundaries[c + 1]);
    chunks.push_back(chunk);
  }
  return std::make_pair(std::move(chunks), cut.imbalance);
}

}  // namespace pipetrain::job
