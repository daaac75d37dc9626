#include "client/cli/reference_command.h"

#include <chrono>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/io/dataset.h"
#include "common/math/optimizer.h"
#include "common/model/checkpoint.h"
#include "common/model/model.h"
#include "common/model/reference_trainer.h"
#include "common/util/status_macros.h"

namespace pipetrain::cli {
namespace {

// Dataset options that depend on the (unresolved) model: the context for text and the shape of
// the synthetic task.
io::DatasetOptions DatasetOptionsFor(const v1::ModelSpec& spec, const ReferenceCommandOptions& o) {
  io::DatasetOptions d;
  if (!o.data_dir.empty()) d.data_dir = o.data_dir;
  d.seed = o.seed;
  d.input_features = spec.input_features();
  for (const v1::LayerSpec& l : spec.layers()) {
    if (l.has_embedding()) d.context = l.embedding().context();
  }
  if (spec.layers_size() > 0 && spec.layers(spec.layers_size() - 1).has_linear()) {
    d.num_classes = spec.layers(spec.layers_size() - 1).linear().out_features();
  }
  return d;
}

absl::Status CheckOptions(const ReferenceCommandOptions& o) {
  if (o.model_path.empty()) return absl::InvalidArgumentError("--model is required");
  if (o.steps < 1)
    return absl::InvalidArgumentError(absl::StrCat("--steps must be >= 1, got ", o.steps));
  if (o.batch < 1)
    return absl::InvalidArgumentError(absl::StrCat("--batch must be >= 1, got ", o.batch));
  if (o.microbatches < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--microbatches must be >= 1, got ", o.microbatches));
  }
  if (o.batch % o.microbatches != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--batch ", o.batch, " is not divisible by --microbatches ", o.microbatches));
  }
  if (o.eval_samples < 0) return absl::InvalidArgumentError("--eval-samples must be >= 0");
  if (o.log_every < 1) return absl::InvalidArgumentError("--log-every must be >= 1");
  return absl::OkStatus();
}

}  // namespace

absl::Status RunReferenceCommand(const ReferenceCommandOptions& o, std::ostream& out) {
  PT_RETURN_IF_ERROR(CheckOptions(o));
  PT_ASSIGN_OR_RETURN(math::OptimizerConfig optimizer, math::ParseOptimizerConfig(o.optimizer));
  PT_ASSIGN_OR_RETURN(v1::ModelSpec raw_spec, model::LoadModelSpecFile(o.model_path));
  PT_ASSIGN_OR_RETURN(std::unique_ptr<io::Dataset> data,
                      io::OpenDataset(o.data, DatasetOptionsFor(raw_spec, o)));
  const io::DatasetInfo& info = data->info();
  model::DataShape shape{info.input_features, info.target_features, info.num_classes,
                         info.tokens_per_sample};
  PT_ASSIGN_OR_RETURN(v1::ModelSpec spec, model::ResolveModelSpec(raw_spec, shape));
  PT_ASSIGN_OR_RETURN(std::unique_ptr<model::Model> net, model::Model::Build(spec));
  if (net->target_features() != info.target_features) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the model's loss needs ", net->target_features(), " target features per row, data set '",
        info.name, "' has ", info.target_features));
  }
  model::TrainerOptions topts;
  topts.microbatches = o.microbatches;
  topts.threads = o.threads;
  topts.seed = o.seed;
  topts.optimizer = optimizer;
  PT_ASSIGN_OR_RETURN(std::unique_ptr<model::ReferenceTrainer> trainer,
                      model::ReferenceTrainer::Create(net.get(), topts));

  io::DataCursor cursor;
  if (!o.resume_dir.empty()) {
    PT_ASSIGN_OR_RETURN(model::LoadedCheckpoint ckpt, model::LoadCheckpoint(o.resume_dir));
    const model::CheckpointManifest& m = ckpt.manifest;
    if (m.model_spec.SerializeAsString() != spec.SerializeAsString()) {
      return absl::FailedPreconditionError(
          absl::StrCat(o.resume_dir, ": checkpoint was written for a different model spec"));
    }
    if (m.data != o.data || m.seed != o.seed || m.batch_size != o.batch) {
      return absl::FailedPreconditionError(
          absl::StrCat(o.resume_dir, ": checkpoint was written with --data ", m.data, " --seed ",
                       m.seed, " --batch ", m.batch_size, "; resume with the same values"));
    }
    PT_RETURN_IF_ERROR(trainer->ImportState(ckpt.tensors, m.step));
    cursor = m.data_cursor;
  }
  PT_ASSIGN_OR_RETURN(io::BatchSampler sampler,
                      io::BatchSampler::Create(data.get(), o.batch, o.seed, cursor));

  if (!o.json) {
    out << absl::StrFormat(
        "model %s: %d layers, %d parameters; data %s: %d train / %d held-out samples\n",
        spec.name().empty() ? o.model_path : spec.name(), net->num_layers(), net->NumParameters(),
        info.name, data->size(io::Split::kTrain), data->size(io::Split::kEval));
  }
  using Clock = std::chrono::steady_clock;
  auto window_start = Clock::now();
  int64_t window_samples = 0;
  for (int64_t i = 0; i < o.steps; ++i) {
    io::Batch batch = sampler.Next();
    PT_ASSIGN_OR_RETURN(model::StepResult r, trainer->Step(batch));
    window_samples += batch.samples;
    if (o.json) {
      out << absl::StrFormat("{\"step\": %d, \"loss\": %.9g}\n", r.step, r.loss);
    } else if (r.step % o.log_every == 0 || i == 0 || i + 1 == o.steps) {
      const double secs = std::chrono::duration<double>(Clock::now() - window_start).count();
      out << absl::StrFormat("step %6d  loss %.6f  %.0f samples/s\n", r.step, r.loss,
                             secs > 0 ? window_samples / secs : 0.0);
      window_start = Clock::now();
      window_samples = 0;
    }
  }
  PT_ASSIGN_OR_RETURN(model::EvalResult eval, trainer->Evaluate(*data, o.eval_samples));
  const bool classification = spec.loss().has_softmax_cross_entropy();
  if (o.json) {
    if (classification) {
      out << absl::StrFormat("{\"eval_loss\": %.9g, \"eval_accuracy\": %.9g}\n", eval.loss,
                             eval.accuracy());
    } else {
      out << absl::StrFormat("{\"eval_loss\": %.9g}\n", eval.loss);
    }
  } else {
    out << absl::StrFormat("held-out: %d samples, loss %.6f", eval.samples, eval.loss);
    if (classification) out << absl::StrFormat(", accuracy %.4f", eval.accuracy());
    out << "\n";
  }
  if (!o.save_dir.empty()) {
    model::CheckpointManifest m;
    m.step = trainer->steps_done();
    m.model_spec = spec;
    m.optimizer = math::FormatOptimizerConfig(optimizer);
    m.seed = o.seed;
    m.data = o.data;
    m.batch_size = o.batch;
    m.microbatches = o.microbatches;
    m.data_cursor = sampler.cursor();
    m.shards = model::LayerShards(*net, 0, net->num_layers());
    PT_RETURN_IF_ERROR(model::SaveCheckpoint(o.save_dir, m, trainer->ExportState()));
    if (!o.json) out << "checkpoint written to " << o.save_dir << "\n";
  }
  return absl::OkStatus();
}

}  // namespace pipetrain::cli
