#include "common/model/reference_trainer.h"

#include <algorithm>
#include <new>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/util/status_macros.h"

namespace pipetrain::model {

double SumLayerNormSq(const std::vector<double>& per_layer) {
  double sum = 0;
  for (double v : per_layer) sum += v;
  return sum;
}

int64_t EvalChunkSamples(const Model& model, int64_t chunk) {
  return std::min(chunk,
                  std::max<int64_t>(1, model.limits().max_activation_bytes /
                                           std::max<int64_t>(1, model.SampleActivationBytes())));
}

absl::StatusOr<std::unique_ptr<ReferenceTrainer>> ReferenceTrainer::Create(
    const Model* model, const TrainerOptions& options) {
  if (options.microbatches < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("microbatches must be >= 1, got ", options.microbatches));
  }
  if (options.threads < 1 || options.threads > 256) {
    return absl::InvalidArgumentError(
        absl::StrCat("threads must be in [1, 256], got ", options.threads));
  }
  PT_RETURN_IF_ERROR(math::ValidateOptimizerConfig(options.optimizer));
  model->kernels().ConfigureEigen(options.threads);
  PT_ASSIGN_OR_RETURN(
      Stage stage, Stage::Create(model, 0, model->num_layers(), options.seed, options.optimizer));
  // Every step adds its micro-batches' gradients in the canonical tree order, as the workers do.
  PT_ASSIGN_OR_RETURN(const GradTree tree, GradTree::Create(options.microbatches));
  PT_RETURN_IF_ERROR(stage.SetGradTree(tree));
  return std::unique_ptr<ReferenceTrainer>(new ReferenceTrainer(model, options, std::move(stage)));
}

absl::StatusOr<StepResult> ReferenceTrainer::Step(const io::Batch& batch) {
  const int64_t m = options_.microbatches;
  if (batch.samples % m != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "batch of ", batch.samples, " samples does not split into ", m, " equal micro-batches"));
  }
  PT_RETURN_IF_ERROR(model_->ValidateBatch(math::AsConstMap(batch.inputs),
                                           math::AsConstMap(batch.targets), batch.samples));
  PT_RETURN_IF_ERROR(model_->CheckMicrobatchActivations(batch.samples / m));
  // The check above bounds the activations; this catches a machine with less memory than that.
  // Nothing has changed when it throws: gradients are zeroed at the start of every step and the
  // optimizer, which allocates nothing, runs last.
  try {
    return StepUnguarded(batch);
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(absl::StrCat("step ", steps_done_ + 1,
                                                     ": out of memory for a micro-batch of ",
                                                     batch.samples / m, " samples"));
  }
}

StepResult ReferenceTrainer::StepUnguarded(const io::Batch& batch) {
  const int64_t m = options_.microbatches;
  const int64_t rows = batch.inputs.rows();
  const int64_t mb_rows = rows / m;
  const double scale = 1.0 / static_cast<double>(rows);
  StepResult result;
  result.microbatch_losses.reserve(m);
  stage_.ZeroGrads();
  math::Matrix dpred;
  for (int64_t i = 0; i < m; ++i) {
    const int64_t r0 = i * mb_rows;
    math::ConstMatrixMap x(batch.inputs.data() + r0 * batch.inputs.cols(), mb_rows,
                           batch.inputs.cols());
    math::ConstMatrixMap t(batch.targets.data() + r0 * batch.targets.cols(), mb_rows,
                           batch.targets.cols());
    const math::Matrix& pred = stage_.Forward(x, &mb_);
    dpred.resize(pred.rows(), pred.cols());
    const double mb_loss =
        model_->loss().LossAndGrad(math::AsConstMap(pred), t, scale, math::AsMap(dpred));
    result.microbatch_losses.push_back(static_cast<float>(mb_loss));
    result.loss += static_cast<float>(mb_loss);
    stage_.BackwardInput(math::AsConstMap(dpred), /*need_input_grad=*/false, &mb_);
    stage_.BackwardWeight(&mb_);
  }
  // A tied table's two parts become one gradient before the norm and the update
  // (docs/numerics.md, "Tied embedding").
  stage_.CombineTiedGrads();
  result.grad_norm_sq = SumLayerNormSq(stage_.GradNormSqPerLayer());
  result.clip_scale = math::ClipScale(result.grad_norm_sq, options_.optimizer.clip_norm);
  ++steps_done_;
  stage_.ApplyOptimizer(steps_done_, result.clip_scale);
  result.step = steps_done_;
  return result;
}

absl::StatusOr<EvalResult> ReferenceTrainer::Evaluate(const io::Dataset& data, int64_t max_samples,
                                                      int64_t chunk) const {
  int64_t n = data.size(io::Split::kEval);
  if (max_samples > 0 && max_samples < n) n = max_samples;
  if (chunk < 1) return absl::InvalidArgumentError("evaluation chunk must be >= 1");
  // Forward alone keeps less than a training micro-batch: chunks of the samples that fit the
  // activation limit for training fit it here.
  PT_RETURN_IF_ERROR(model_->CheckMicrobatchActivations(1));
  chunk = EvalChunkSamples(*model_, chunk);
  try {
    return EvaluateUnguarded(data, n, chunk);
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(
        absl::StrCat("evaluation: out of memory for a chunk of ", chunk, " samples"));
  }
}

absl::StatusOr<EvalResult> ReferenceTrainer::EvaluateUnguarded(const io::Dataset& data, int64_t n,
                                                               int64_t chunk) const {
  EvalResult result;
  MicrobatchState mb;
  math::Matrix dpred;
  double loss_sum = 0;
  for (int64_t begin = 0; begin < n; begin += chunk) {
    const int64_t count = std::min(chunk, n - begin);
    io::Batch b = io::MakeEvalBatch(data, begin, count);
    PT_RETURN_IF_ERROR(
        model_->ValidateBatch(math::AsConstMap(b.inputs), math::AsConstMap(b.targets), b.samples));
    const math::Matrix& pred = stage_.Forward(math::AsConstMap(b.inputs), &mb);
    dpred.resize(pred.rows(), pred.cols());
    loss_sum += model_->loss().LossAndGrad(math::AsConstMap(pred), math::AsConstMap(b.targets), 1.0,
                                           math::AsMap(dpred));
    result.correct +=
        model_->loss().CountCorrect(math::AsConstMap(pred), math::AsConstMap(b.targets));
    result.rows += pred.rows();
    result.samples += count;
  }
  result.loss = result.rows == 0 ? 0.0 : loss_sum / static_cast<double>(result.rows);
  return result;
}

absl::Status ReferenceTrainer::ImportState(const std::map<std::string, math::Tensor>& tensors,
                                           int64_t steps_done) {
  if (steps_done < 0) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint step ", steps_done, " < 0"));
  }
  PT_RETURN_IF_ERROR(stage_.ImportState(tensors));
  steps_done_ = steps_done;
  return absl::OkStatus();
}

}  // namespace pipetrain::model
