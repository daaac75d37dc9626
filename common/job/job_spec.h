// Validation of a JobSpec: the proto -> domain conversion of the schedule, optimizer and model, and
// the caps on them, before anything is allocated. One implementation for every side that can
// check a job: the coordinator's CreateJob (and its re-plans in a recovery), and the CLI's `train`
// and `local`, which check the job they are about to ask for before they start any daemon or call
// CreateJob (docs/cli.md, "Refusals before anything starts").
#ifndef PIPETRAIN_COMMON_JOB_JOB_SPEC_H_
#define PIPETRAIN_COMMON_JOB_JOB_SPEC_H_

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/checkpoint.h"
#include "common/model/model.h"
#include "common/schedule/ir.h"
#include "pipetrain/v1/coordinator.pb.h"

namespace pipetrain::job {

// Largest serialized ModelSpec a job may have (a real one is a few hundred bytes; 4096 layers take
// under 100 kB). It travels in every worker's Assign, whose receive limit is the worker's
// --max-message-size (at least 2 MiB).
inline constexpr int64_t kMaxModelSpecBytes = int64_t{1} << 20;

// Caps on what one job may ask for (docs/limits.md). Each is a coordinator flag; the defaults are
// its flags' defaults (so `pipetrain local`, which starts a coordinator with them, checks exactly
// what its coordinator will).
struct JobLimits {
  // Most layers in the job's model (--max-layers). Default 4096.
  int32_t max_layers = 4096;
  // Most micro-batches per step (--max-microbatches). Default 1024.
  int32_t max_microbatches = 1024;
  // Memory limits of Model::Build (parameters, one sample's activations).
  model::ModelLimits model;

  // No cap but the fixed ones (kMaxModelSpecBytes, the schedule's and the model's own ranges): for
  // a client that checks a job before it sends it to a coordinator whose flags it does not know.
  static JobLimits Unlimited();
};

// A checked JobSpec: the plan its schedule makes and the model it builds.
struct CheckedJobSpec {
  schedule::Plan plan;
  std::shared_ptr<const model::Model> model;
};

// The plan of `spec`'s schedule at its stage count for one replica's M / R micro-batches
// (spec->virtual_stages filled in; every replica runs the same plan): the schedule's
// parameters checked (INVALID_ARGUMENT) and at least as many layers in `net` as chunks. Used at
// creation and when a recovery re-plans a job onto fewer stages. Thread-safe (pure).
absl::StatusOr<schedule::Plan> PlanFor(const v1::JobSpec& spec, const model::Model& net);

// The chunks of `plan` over `net`'s layers, partitioned (common/partition) by spec.layer_costs
// when it is set (one per layer, as CheckJobSpec checked), else by each layer's F+B+W FLOPs of one
// sample, for workers of `speeds` (GFLOP/s, by rank; one per stage), and the partition's
// max/mean imbalance. Under the bidirectional placement (dualpipe) the layers are cut into S
// stages, stage k for the slower of its two ranks k and S-1-k, and chunk S + k repeats chunk k's
// layers. Errors: the partitioner's (INVALID_ARGUMENT for costs of the wrong size). Thread-safe
// (pure).
absl::StatusOr<std::pair<std::vector<v1::ChunkSpec>, double>> PartitionChunks(
    const v1::JobSpec& spec, const model::Model& net, const schedule::Plan& plan,
    const std::vector<double>& speeds);

// The job's data-parallel replicas R (JobSpec.replicas; 0 means 1). Pure.
int ReplicasOf(const v1::JobSpec& spec);
// The micro-batches of one replica's share of a step: M / R (JobSpec.microbatches / R). Pure.
int MicrobatchesPerReplica(const v1::JobSpec& spec);

// OK if `spec.isa` is empty or names an instruction-set level (INVALID_ARGUMENT naming it
// otherwise). Pure.
absl::Status CheckJobIsa(const v1::JobSpec& spec);

// OK if a job with tokenizer bytes `tokenizer` ("" for none) may resume the checkpoint
// `manifest` (read from `dir`): both have no tokenizer, or the same one (equal SHA-256s).
// FAILED_PRECONDITION naming `dir` and both tokenizers otherwise. Thread-safe (pure).
absl::Status CheckResumeTokenizer(const std::string& dir, const model::CheckpointManifest& manifest,
                                  const std::string& tokenizer);

// Fills the defaults of `*spec` (virtual_stages 0: the schedule's default; threads 0: 1), resolves
// the model's sizes left 0 from spec->data_shape (model::ResolveModelSpec) and checks it: schedule
// name and parameters (for M / R micro-batches: one replica's share), replicas (0 filled in as 1;
// a power of two whose shares are nodes of the step's gradient tree, model::GradTree; the message
// lists the supported counts), max_replicas and max_stages (0 or at least replicas and stages),
// layer_costs (none, or one per layer in [0, 1e30] with a positive sum), min_stages in
// [0, stages], replace_timeout_ms >= 0, planned_steps in [0, 2^53), keep_checkpoints >= 0,
// optimizer, model (and its target features against the data shape), the tokenizer (a
// SentencePiece model whose vocabulary fits the model's embedding), and that there are at least
// as many layers as chunks. Errors: INVALID_ARGUMENT naming the field and value;
// RESOURCE_EXHAUSTED naming the cap and its flag when the model has more than limits.max_layers
// layers or the step more than limits.max_microbatches micro-batches (counted before the model is
// built), when the model's serialization exceeds kMaxModelSpecBytes or the tokenizer
// io::kMaxTokenizerBytes, or when the model exceeds limits.model. Allocates no parameters. The
// directories (save_to, resume_from) are the coordinator's to check, on its file system.
// Thread-safe (pure).
absl::StatusOr<CheckedJobSpec> CheckJobSpec(const JobLimits& limits, v1::JobSpec* spec);

}  // namespace pipetrain::job

#endif  // PIPETRAIN_COMMON_JOB_JOB_SPEC_H_
