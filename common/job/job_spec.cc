#include "common/job/job_spec.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/io/digest.h"
#include "common/io/tokenizer.h"
#include "common/math/isa.h"
#include "common/model/grad_tree.h"
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

// replicas (0 filled in as 1): a power of two whose equal shares of the step's micro-batches are
// nodes of its gradient tree.
absl::Status CheckReplicas(v1::JobSpec* spec) {
  if (spec->replicas() == 0) spec->set_replicas(1);
  const int M = spec->microbatches();
  const int R = spec->replicas();
  if (R < 1) return absl::InvalidArgumentError(absl::StrCat("replicas must be >= 1, got ", R));
  // M itself is the schedule's to check (its message names it); a tree needs M >= 1.
  if (M >= 1) {
    PT_ASSIGN_OR_RETURN(const model::GradTree tree, model::GradTree::Create(M));
    if (!tree.SupportsReplicas(R)) {
      std::vector<int64_t> supported;
      for (int64_t r = 1; r <= tree.leaves(); r *= 2) supported.push_back(r);
      return absl::InvalidArgumentError(absl::StrCat(
          "replicas ", R, " does not divide microbatches ", M,
          " into a node of the gradient tree; supported: ", absl::StrJoin(supported, ", "),
          " (powers of two dividing ", M, ", docs/scaling.md \"Replicas\")"));
    }
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

// The schedule's parameters of `spec` (replicas filled in): each replica's plan runs M / R
// micro-batches.
absl::StatusOr<schedule::ScheduleParams> ReplicaScheduleParams(const v1::JobSpec& spec) {
  PT_ASSIGN_OR_RETURN(schedule::ScheduleKind kind, schedule::ParseScheduleKind(spec.schedule()));
  schedule::ScheduleParams params;
  params.kind = kind;
  params.stages = spec.stages();
  params.microbatches = MicrobatchesPerReplica(spec);
  params.virtual_stages = spec.virtual_stages();
  return params;
}

// CheckScheduleParams, its message saying that a replica runs M / R micro-batches when R > 1.
absl::Status CheckReplicaSchedule(const v1::JobSpec& spec, const schedule::ScheduleParams& params) {
  absl::Status status = schedule::CheckScheduleParams(params);
  if (status.ok() || ReplicasOf(spec) == 1) return status;
  return wire::Annotate(
      status, absl::StrCat("with ", ReplicasOf(spec),
                           " replicas each runs microbatches / replicas = ", params.microbatches,
                           " micro-batches, which the schedule checks"));
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

// OK if spec.layer_costs is empty or holds one cost per layer of `net`, each in
// [0, partition::kMaxLayerCost], with a positive sum; INVALID_ARGUMENT naming the layer otherwise.
absl::Status CheckLayerCosts(const v1::JobSpec& spec, const model::Model& net) {
  if (spec.layer_costs().empty()) return absl::OkStatus();
  if (spec.layer_costs_size() != net.num_layers()) {
    return absl::InvalidArgumentError(absl::StrCat("layer_costs has ", spec.layer_costs_size(),
                                                   " costs; the model has ", net.num_layers(),
                                                   " layers (one cost per layer, or none)"));
  }
  double sum = 0;
  for (int l = 0; l < spec.layer_costs_size(); ++l) {
    const double c = spec.layer_costs(l);
    if (!(c >= 0 && c <= partition::kMaxLayerCost)) {
      return absl::InvalidArgumentError(absl::StrCat("layer_costs[", l, "] must be in [0, ",
                                                     partition::kMaxLayerCost, "], got ", c));
    }
    sum += c;
  }
  if (!(sum > 0)) return absl::InvalidArgumentError("layer_costs are all 0");
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

int ReplicasOf(const v1::JobSpec& spec) { return std::max(spec.replicas(), 1); }

int MicrobatchesPerReplica(const v1::JobSpec& spec) {
  return spec.microbatches() / ReplicasOf(spec);
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
  PT_RETURN_IF_ERROR(CheckReplicas(spec));
  PT_RETURN_IF_ERROR(CheckGrowthBounds(*spec));
  PT_ASSIGN_OR_RETURN(const schedule::ScheduleParams params, ReplicaScheduleParams(*spec));
  PT_RETURN_IF_ERROR(CheckReplicaSchedule(*spec, params));
  PT_RETURN_IF_ERROR(schedule::CheckExecutable(kind));
  PT_RETURN_IF_ERROR(model::OptimizerFromProto(spec->optimizer()).status());
  PT_RETURN_IF_ERROR(CheckJobIsa(*spec));
  // The model as its author wrote it: sizes left 0 come from the client's data shape.
  CheckedJobSpec checked;
  PT_ASSIGN_OR_RETURN(checked.model, BuildModel(limits, spec));
  PT_RETURN_IF_ERROR(CheckTokenizer(*spec, *checked.model));
  PT_RETURN_IF_ERROR(CheckLayerCosts(*spec, *checked.model));
  PT_ASSIGN_OR_RETURN(checked.plan, PlanFor(*spec, *checked.model));
  return checked;
}

absl::StatusOr<schedule::Plan> PlanFor(const v1::JobSpec& spec, const model::Model& net) {
  PT_ASSIGN_OR_RETURN(const schedule::ScheduleParams params, ReplicaScheduleParams(spec));
  PT_RETURN_IF_ERROR(CheckReplicaSchedule(spec, params));
  PT_RETURN_IF_ERROR(schedule::CheckExecutable(params.kind));
  // The bidirectional placement holds two copies of S stages: the layers are cut S ways.
  const bool two_copies =
      schedule::PlacementKindFor(params.kind) == schedule::PlacementKind::kBidirectional;
  if (two_copies && ReplicasOf(spec) > 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "replicas ", ReplicasOf(spec),
        " with schedule dualpipe: dualpipe's two copies of the stages already split each step "
        "like two replicas; use replicas 1 with dualpipe, or another schedule with replicas"));
  }
  PT_RETURN_IF_ERROR(partition::CheckLayersCoverChunks(net.num_layers(), spec.stages(),
                                                       two_copies ? 1 : spec.virtual_stages()));
  if (two_copies) {
    PT_ASSIGN_OR_RETURN(const model::GradTree tree, model::GradTree::Create(spec.microbatches()));
    if (!tree.SupportsReplicas(2)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "dualpipe runs micro-batches [0, M/2) down and [M/2, M) up, and each half must be a node "
          "of the step's gradient tree (docs/numerics.md); it is not for M = ",
          spec.microbatches()));
    }
  }
  PT_ASSIGN_OR_RETURN(schedule::Plan plan, schedule::GenerateSchedule(params));
  PT_RETURN_IF_ERROR(schedule::ValidatePlan(plan));
  return plan;
}

absl::StatusOr<std::pair<std::vector<v1::ChunkSpec>, double>> PartitionChunks(
    const v1::JobSpec& spec, const model::Model& net, const schedule::Plan& plan,
    const std::vector<double>& speeds) {
  const bool two_copies = plan.placement.kind == schedule::PlacementKind::kBidirectional;
  partition::PartitionOptions popts;
  popts.stages = static_cast<int>(speeds.size());
  popts.placement = two_copies ? schedule::PlacementKind::kLinear : plan.placement.kind;
  popts.virtual_stages = two_copies ? 1 : spec.virtual_stages();
  popts.speeds = speeds;
  if (two_copies) {
    // Two copies of S stages (bidirectional DualPipe): stage k runs on ranks k and S-1-k, each
    // for half of the micro-batches; it is cut for the slower of the two.
    for (size_t k = 0; k < speeds.size(); ++k) {
      popts.speeds[k] = std::min(speeds[k], speeds[speeds.size() - 1 - k]);
    }
  }
  // The client's measured costs when it sent them (CheckJobSpec checked them), else FLOPs.
  std::vector<double> costs(spec.layer_costs().begin(), spec.layer_costs().end());
  if (costs.empty()) costs = net.LayerFlops(1);
  PT_ASSIGN_OR_RETURN(partition::Partition cut, partition::PartitionLayers(costs, popts));
  std::vector<v1::ChunkSpec> chunks;
  for (int c = 0; c < plan.num_chunks(); ++c) {
    // With two copies chunk S + k is stage k of the up copy: chunk k's layers.
    const int stage = two_copies ? c % popts.stages : c;
    v1::ChunkSpec chunk;
    chunk.set_chunk(c);
    chunk.set_rank(plan.placement.OwnerOf(c));
    chunk.set_first_layer(cut.boundaries[stage]);
    chunk.set_last_layer(cut.boundaries[stage + 1]);
    chunks.push_back(chunk);
  }
  return std::make_pair(std::move(chunks), cut.imbalance);
}

}  // namespace pipetrain::job
