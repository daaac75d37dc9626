#include "client/cli/reference_command.h"

#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/cli/training_setup.h"
#include "common/io/dataset.h"
#include "common/math/optimizer.h"
#include "common/model/checkpoint.h"
#include "common/model/model.h"
#include "common/model/reference_trainer.h"
#include "common/util/status_macros.h"

namespace pipetrain::cli {

void PrintEvaluation(const model::EvalResult& eval, bool classification, bool json, int64_t step,
                     std::ostream& out) {
  if (json) {
    const std::string label = step > 0 ? absl::StrFormat("\"eval_step\": %d, ", step) : "";
    if (classification) {
      out << absl::StrFormat("{%s\"eval_loss\": %.9g, \"eval_accuracy\": %.9g}\n", label, eval.loss,
                             eval.accuracy());
    } else {
      out << absl::StrFormat("{%s\"eval_loss\": %.9g}\n", label, eval.loss);
    }
    out.flush();
    return;
  }
  if (step > 0) out << absl::StrFormat("step %6d  ", step);
  out << absl::StrFormat("held-out: %d samples, loss %.6f", eval.samples, eval.loss);
  if (classification) out << absl::StrFormat(", accuracy %.4f", eval.accuracy());
  out << "\n";
  out.flush();
}

absl::Status RunReferenceCommand(const TrainingOptions& o, std::ostream& out) {
  PT_RETURN_IF_ERROR(CheckTrainingOptions(o));
  PT_ASSIGN_OR_RETURN(math::OptimizerConfig optimizer, OptimizerConfigFor(o));
  PT_RETURN_IF_ERROR(CheckSaveDirectory(o));
  PT_ASSIGN_OR_RETURN(const math::Isa isa, ReferenceIsaFor(o));
  PT_ASSIGN_OR_RETURN(std::shared_ptr<const io::Tokenizer> tokenizer,
                      TokenizerForTraining(o, /*remote=*/false));
  PT_ASSIGN_OR_RETURN(TrainingSetup setup, SetUpTrainingFromFile(o.model_path, o.data, o.data_dir,
                                                                 o.seed, isa, tokenizer));
  const v1::ModelSpec& spec = setup.spec;
  const std::unique_ptr<io::Dataset>& data = setup.data;
  const std::unique_ptr<model::Model>& net = setup.model;
  const io::DatasetInfo& info = data->info();
  model::TrainerOptions topts;
  topts.microbatches = o.microbatches;
  topts.threads = o.threads;
  topts.seed = o.seed;
  topts.optimizer = optimizer;
  PT_ASSIGN_OR_RETURN(std::unique_ptr<model::ReferenceTrainer> trainer,
                      model::ReferenceTrainer::Create(net.get(), topts));

  io::DataCursor cursor;
  std::string isa_note;  // the checkpoints' note when earlier steps ran at another level.
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
    // The optimizer kind decides the state tensors: it must be the checkpoint's.
    PT_RETURN_IF_ERROR(model::CheckOptimizerResumes(o.resume_dir, m, optimizer));
    // Mid-schedule, the rate of every later update must be the one the first run would have used.
    PT_ASSIGN_OR_RETURN(math::OptimizerConfig saved, math::ParseOptimizerConfig(m.optimizer));
    if (saved.schedule != optimizer.schedule) {
      return absl::FailedPreconditionError(absl::StrCat(
          o.resume_dir, ": checkpoint was trained with learning-rate schedule ",
          math::DescribeLrSchedule(saved.schedule), ", this run asks for ",
          math::DescribeLrSchedule(optimizer.schedule),
          "; resume with the same --lr-schedule, --warmup-steps, --lr-decay-steps and --lr-min"));
    }
    PT_RETURN_IF_ERROR(trainer->ImportState(ckpt.tensors, m.step));
    cursor = m.data_cursor;
    isa_note = model::IsaNoteAfterResume(m, math::IsaName(isa));
    if (m.isa != math::IsaName(isa) && !o.json) {
      out << "note: " << o.resume_dir << " was written at instruction set "
          << (m.isa.empty() ? "(unrecorded)" : m.isa) << ", this run uses " << math::IsaName(isa)
          << ": its bits will differ from a run that stayed on one level\n";
      out.flush();
    }
  }
  PT_ASSIGN_OR_RETURN(io::BatchSampler sampler,
                      io::BatchSampler::Create(data.get(), o.batch, o.seed, cursor));

  if (!o.json) {
    out << absl::StrFormat(
        "model %s: %d layers, %d parameters; data %s: %d train / %d held-out samples; "
        "instruction set %s\n",
        spec.name().empty() ? o.model_path : spec.name(), net->num_layers(), net->NumParameters(),
        info.name, data->size(io::Split::kTrain), data->size(io::Split::kEval), math::IsaName(isa));
    out.flush();
  }
  ProgressLine progress(out, ProgressOptionsFor(o, /*pipeline=*/false));
  for (int64_t i = 0; i < o.steps; ++i) {
    io::Batch batch = sampler.Next();
    PT_ASSIGN_OR_RETURN(model::StepResult r, trainer->Step(batch));
    if (o.json) {
      out << absl::StrFormat("{\"step\": %d, \"loss\": %.9g}\n", r.step, r.loss);
      out.flush();
    } else {
      progress.Step({r.step, r.loss, batch.samples});
    }
    if (o.eval_every > 0 && r.step % o.eval_every == 0) {
      PT_ASSIGN_OR_RETURN(model::EvalResult eval,
                          trainer->Evaluate(*data, o.eval_samples.value_or(kDefaultEvalSamples)));
      progress.Clear();
      PrintEvaluation(eval, spec.loss().has_softmax_cross_entropy(), o.json, r.step, out);
      progress.Redraw();
    }
    if (CheckpointDue(o, r.step, i + 1 == o.steps)) {
      model::CheckpointManifest manifest =
          CheckpointManifestFor(o, setup, optimizer, r.step, sampler.cursor());
      manifest.isa_note = isa_note;
      PT_RETURN_IF_ERROR(model::SaveCheckpoint(o.save_dir, manifest, trainer->ExportState(),
                                               o.keep_checkpoints,
                                               tokenizer != nullptr ? tokenizer->model() : ""));
      if (!o.json) {
        progress.Clear();
        out << "checkpoint of step " << r.step << " written to " << o.save_dir << "\n";
        out.flush();
        progress.Redraw();
      }
    }
  }
  progress.Finish();
  PT_ASSIGN_OR_RETURN(model::EvalResult eval,
                      trainer->Evaluate(*data, o.eval_samples.value_or(kDefaultEvalSamples)));
  PrintEvaluation(eval, spec.loss().has_softmax_cross_entropy(), o.json, /*step=*/0, out);
  return absl::OkStatus();
}

absl::Status RunEvaluateCommand(const EvaluateCommandOptions& o, std::ostream& out) {
  if (o.checkpoint_dir.empty()) {
    return absl::InvalidArgumentError(
        "--resume DIR is required: the checkpoint directory to evaluate (what --save wrote)");
  }
  if (o.eval_samples < 0) return absl::InvalidArgumentError("--eval-samples must be >= 0");
  PT_ASSIGN_OR_RETURN(model::LoadedCheckpoint ckpt, model::LoadCheckpoint(o.checkpoint_dir));
  const model::CheckpointManifest& m = ckpt.manifest;
  PT_ASSIGN_OR_RETURN(math::OptimizerConfig optimizer, math::ParseOptimizerConfig(m.optimizer));
  // The level the checkpoint was trained at when this CPU runs it (the same bits as that run's
  // own evaluation), else the highest this CPU runs.
  math::Isa isa = math::DefaultIsa();
  if (absl::StatusOr<math::Isa> saved = math::ParseIsa(m.isa);
      saved.ok() && math::CpuSupportsIsa(*saved)) {
    isa = *saved;
  }
  // The checkpoint's tokenizer, or --tokenizer if it is the same one.
  PT_ASSIGN_OR_RETURN(std::shared_ptr<const io::Tokenizer> tokenizer,
                      TokenizerForRun(o.tokenizer, o.checkpoint_dir, ckpt.tokenizer));
  PT_ASSIGN_OR_RETURN(TrainingSetup setup,
                      SetUpTraining(m.model_spec, o.data.empty() ? m.data : o.data, o.data_dir,
                                    m.seed, isa, tokenizer));
  model::TrainerOptions topts;
  topts.seed = m.seed;
  topts.optimizer = optimizer;
  PT_ASSIGN_OR_RETURN(std::unique_ptr<model::ReferenceTrainer> trainer,
                      model::ReferenceTrainer::Create(setup.model.get(), topts));
  PT_RETURN_IF_ERROR(trainer->ImportState(ckpt.tensors, m.step));
  PT_ASSIGN_OR_RETURN(model::EvalResult eval, trainer->Evaluate(*setup.data, o.eval_samples));
  if (!o.json && o.step == 0) {
    out << absl::StrFormat("checkpoint %s: step %d, model %s, data %s%s\n", o.checkpoint_dir,
                           m.step, setup.spec.name(), setup.data->info().name,
                           tokenizer == nullptr
                               ? ""
                               : absl::StrCat(", tokenizer of ", tokenizer->vocab_size(),
                                              " pieces (", tokenizer->origin(), ")"));
  }
  PrintEvaluation(eval, setup.spec.loss().has_softmax_cross_entropy(), o.json, o.step, out);
  return absl::OkStatus();
}

}  // namespace pipetrain::cli
