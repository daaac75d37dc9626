#include "client/cli/remote_evaluation.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/io/dataset.h"
#include "common/util/status_macros.h"

namespace pipetrain::cli {

absl::StatusOr<model::EvalResult> EvaluateThroughCoordinator(client::TrainSession& session,
                                                             const TrainingSetup& setup,
                                                             int64_t eval_samples) {
  if (eval_samples < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--eval-samples must be >= 0, got ", eval_samples));
  }
  int64_t n = setup.data->size(io::Split::kEval);
  if (eval_samples > 0 && eval_samples < n) n = eval_samples;
  if (n == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("data ", setup.data->info().name, " has no held-out sample to evaluate"));
  }
  // The chunks of ReferenceTrainer::Evaluate (its default of 256, capped the same way).
  const int64_t chunk = model::EvalChunkSamples(*setup.model, 256);
  const io::DatasetInfo& info = setup.data->info();
  const int64_t sample_bytes = info.tokens_per_sample *
                               (info.input_features + info.target_features) *
                               static_cast<int64_t>(sizeof(float));
  const int64_t chunks_per_request = std::clamp<int64_t>(
      kMaxEvaluateRequestBytes / std::max<int64_t>(1, chunk * sample_bytes), 1, 4096);
  model::EvalResult result;
  double loss_sum = 0;  // folded chunk by chunk, in order, as ReferenceTrainer::Evaluate folds.
  for (int64_t begin = 0; begin < n;) {
    const int64_t count = std::min(n - begin, chunks_per_request * chunk);
    const io::Batch batch = io::MakeEvalBatch(*setup.data, begin, count);
    PT_ASSIGN_OR_RETURN(
        v1::EvaluateResult answer,
        session.Evaluate(client::BatchView{&batch.inputs, &batch.targets, batch.samples}, chunk));
    const int64_t expected = (count + chunk - 1) / chunk;
    if (answer.chunk_samples() != chunk || answer.chunks_size() != expected) {
      return absl::InternalError(absl::StrCat(
          "the coordinator evaluated ", answer.chunks_size(), " chunks of ", answer.chunk_samples(),
          " samples; sent were ", expected, " chunks of ", chunk));
    }
    for (const v1::EvaluateChunk& c : answer.chunks()) {
      loss_sum += c.loss_sum();
      result.correct += c.correct();
      result.rows += c.rows();
      result.samples += c.samples();
    }
    begin += count;
  }
  result.loss = result.rows == 0 ? 0.0 : loss_sum / static_cast<double>(result.rows);
  return result;
}

}  // namespace pipetrain::cli
