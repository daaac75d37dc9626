// `pipetrain reference`: single-process training with the reference trainer (the oracle).
#ifndef PIPETRAIN_CLIENT_CLI_REFERENCE_COMMAND_H_
#define PIPETRAIN_CLIENT_CLI_REFERENCE_COMMAND_H_

#include <cstdint>
#include <ostream>
#include <string>

#include "absl/status/status.h"
#include "client/cli/training_options.h"
#include "common/model/reference_trainer.h"

namespace pipetrain::cli {

// Trains as `options` says with the reference trainer, writing progress to `out`: checkpoints
// into --save (every --checkpoint-every steps and at the end), a held-out evaluation every
// --eval-every steps, then the held-out evaluation
// (--eval-samples, default kDefaultEvalSamples). Returns the first error (bad options:
// INVALID_ARGUMENT; an unwritable --save: FAILED_PRECONDITION, before the first step; data, model,
// resume mismatch, I/O); nothing is printed for the failing step. Thread-compatible.
absl::Status RunReferenceCommand(const TrainingOptions& options, std::ostream& out);

struct EvaluateCommandOptions {
  std::string checkpoint_dir;  // --checkpoint: a checkpoint directory (reference or pipeline).
  std::string data;            // --data: default the data set the checkpoint was trained on.
  std::string data_dir;        // --data-dir: bundled data directory; empty: the built-in one.
  // --tokenizer: must be the checkpoint's tokenizer if given; empty: the checkpoint's (if any).
  std::string tokenizer;
  int64_t eval_samples = kDefaultEvalSamples;  // --eval-samples: held-out samples (0: all).
  bool json = false;  // --json: one JSON object {"eval_loss", "eval_accuracy"}.
  // > 0: an evaluation during training at this step (--eval-every): printed as one labelled line
  // ("eval_step" in JSON), without the checkpoint header.
  int64_t step = 0;
};

// Prints a held-out evaluation: JSON {"eval_loss", "eval_accuracy"} or a text line. `step` > 0
// labels an evaluation during training (--eval-every): JSON gains "eval_step" first, text starts
// with "step N". `classification`: the model's loss takes class labels (accuracy is printed).
void PrintEvaluation(const model::EvalResult& eval, bool classification, bool json, int64_t step,
                     std::ostream& out);

// `pipetrain evaluate`: loads a checkpoint written by `reference --save` or `train/local --save`
// and prints the held-out loss (and accuracy for classification) exactly as `reference` does at
// the end of training.
absl::Status RunEvaluateCommand(const EvaluateCommandOptions& options, std::ostream& out);

}  // namespace pipetrain::cli

#endif  // PIPETRAIN_CLIENT_CLI_REFERENCE_COMMAND_H_
