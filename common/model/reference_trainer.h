// The single-process reference trainer: the oracle every pipeline run is compared against.
//
// A step splits a batch of B samples into M consecutive micro-batches (B % M != 0 is an error),
// runs F, I and W of every micro-batch in increasing micro-batch order (every parameter's gradient
// added in the gradient tree's order of M, GradTree, as every pipeline stage adds it), scales each
// micro-batch's gradient by 1/(B·rows per sample) through the loss, sums the micro-batch losses in
// increasing order, sums a tied embedding's two gradient parts (Stage::CombineTiedGrads), computes
// the global gradient norm over layers in increasing order, and applies the optimizer.
#ifndef PIPETRAIN_COMMON_MODEL_REFERENCE_TRAINER_H_
#define PIPETRAIN_COMMON_MODEL_REFERENCE_TRAINER_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/io/dataset.h"
#include "common/math/optimizer.h"
#include "common/model/model.h"
#include "common/model/stage.h"

namespace pipetrain::model {

struct TrainerOptions {
  int64_t microbatches = 1;  // M, >= 1; every batch's sample count must be a multiple.
  int threads = 1;           // Eigen compute threads, fixed for the process (>= 1).
  uint64_t seed = 0;         // initialisation seed.
  math::OptimizerConfig optimizer;
};

struct StepResult {
  int64_t step = 0;                      // 1-based number of the step just applied.
  float loss = 0;                        // sum of microbatch_losses in increasing order.
  std::vector<float> microbatch_losses;  // each already divided by the batch's row count.
  double grad_norm_sq = 0;               // before clipping.
  float clip_scale = 1;
};

struct EvalResult {
  double loss = 0;  // mean loss per row over the evaluated samples.
  int64_t samples = 0;
  int64_t correct = 0;  // rows whose argmax equals the label (classification only).
  int64_t rows = 0;
  double accuracy() const { return rows == 0 ? 0.0 : static_cast<double>(correct) / rows; }
};

// Samples per evaluation chunk for a requested `chunk` (>= 1): `chunk`, or fewer so that one
// chunk's activations fit model.limits().max_activation_bytes (at least 1). ReferenceTrainer::
// Evaluate and the service's Evaluate chunk the held-out samples with it, so they compute the
// same products on the same rows.
int64_t EvalChunkSamples(const Model& model, int64_t chunk);

// Sum of per-layer squared norms in increasing layer order (how every process combines them).
double SumLayerNormSq(const std::vector<double>& per_layer);

class ReferenceTrainer {
 public:
  // Pins the GEMM blocking of the model's instruction-set level and sets that level's Eigen thread
  // count to options.threads (math::Kernels::ConfigureEigen), both process-wide. `model` must
  // outlive the trainer. FAILED_PRECONDITION if this CPU cannot run model->isa() (Stage::Create).
  static absl::StatusOr<std::unique_ptr<ReferenceTrainer>> Create(const Model* model,
                                                                  const TrainerOptions& options);

  // Validates `batch` (Model::ValidateBatch, divisibility by M) and applies one training step.
  // RESOURCE_EXHAUSTED if a micro-batch's activations would exceed the model's
  // limits().max_activation_bytes, or if memory runs out. On error nothing changes.
  absl::StatusOr<StepResult> Step(const io::Batch& batch);

  // Mean loss and accuracy over the first `max_samples` (all if <= 0) samples of the held-out
  // split, in chunks of `chunk` samples (fewer if `chunk` samples' activations would exceed the
  // model's limits().max_activation_bytes). RESOURCE_EXHAUSTED if memory runs out. No state
  // changes.
  absl::StatusOr<EvalResult> Evaluate(const io::Dataset& data, int64_t max_samples,
                                      int64_t chunk = 256) const;

  int64_t steps_done() const { return steps_done_; }
  const Stage& stage() const { return stage_; }
  // Checkpoint state: every tensor by global name, and the number of steps applied.
  std::map<std::string, math::Tensor> ExportState() const { return stage_.ExportState(); }
  absl::Status ImportState(const std::map<std::string, math::Tensor>& tensors, int64_t steps_done);

 private:
  ReferenceTrainer(const Model* model, const TrainerOptions& options, Stage stage)
      : model_(model), options_(options), stage_(std::move(stage)) {}

  // Step after its checks; Evaluate of `n` samples in chunks of `chunk`. Both may throw
  // std::bad_alloc, which their callers turn into RESOURCE_EXHAUSTED.
  StepResult StepUnguarded(const io::Batch& batch);
  absl::StatusOr<EvalResult> EvaluateUnguarded(const io::Dataset& data, int64_t n,
                                               int64_t chunk) const;

  const Model* model_;
  TrainerOptions options_;
  Stage stage_;
  MicrobatchState mb_;
  int64_t steps_done_ = 0;
};

}  // namespace pipetrain::model

#endif  // PIPETRAIN_COMMON_MODEL_REFERENCE_TRAINER_H_
