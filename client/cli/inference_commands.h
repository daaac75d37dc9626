// `pipetrain generate` and `pipetrain predict`: use a trained checkpoint in this process
// (docs/inference.md).
#ifndef PIPETRAIN_CLIENT_CLI_INFERENCE_COMMANDS_H_
#define PIPETRAIN_CLIENT_CLI_INFERENCE_COMMANDS_H_

#include <cstdint>
#include <ostream>
#include <string>

#include "absl/status/status.h"
#include "common/model/token_sampler.h"

namespace pipetrain::cli {

struct GenerateCommandOptions {
  std::string checkpoint_dir;       // --resume (or --checkpoint): what --save wrote. Required.
  std::string data;                 // --data: the text data set whose vocabulary maps the prompt;
                                    // empty: the one the checkpoint was trained on.
  std::string data_dir;             // --data-dir: bundled data directory; empty: the built-in one.
  std::string prompt;               // --prompt: the text to continue, at least one byte.
  int64_t max_tokens = 200;         // --max-tokens: tokens (bytes) to generate.
  model::SamplingOptions sampling;  // --temperature, --top-k, --seed.
};

// Loads the checkpoint, maps the prompt to token ids with the vocabulary of its text data set,
// and writes the prompt followed by the generated text (streamed, a token at a time) and a
// newline to `out`. INVALID_ARGUMENT for a missing option or one out of range, a model that is not
// a language model, or a prompt byte outside the vocabulary (naming it and its offset); the
// checkpoint's and the data set's errors otherwise. Nothing is written before the checks pass.
absl::Status RunGenerateCommand(const GenerateCommandOptions& options, std::ostream& out);

struct PredictCommandOptions {
  std::string checkpoint_dir;  // --resume (or --checkpoint). Required.
  std::string data;            // --data: default the data set the checkpoint was trained on.
  std::string data_dir;        // --data-dir.
  std::string out = "-";       // --out: the CSV file (written atomically); "-": `out`.
  int64_t samples = 0;         // --eval-samples: the first N held-out samples; 0: all.
};

// Writes the model's outputs for every row of the first `samples` held-out samples of the data
// set as CSV with a header (docs/inference.md, "predict"):
//   classifier (softmax cross-entropy): row,target,class,p_0,...,p_{C-1}
//   regressor (MSE):                     row,target_0,...,value_0,...
// computed exactly as `pipetrain evaluate` computes them (the same chunks, the same bits). With
// --out FILE a summary line (rows, and accuracy for a classifier) goes to `out`. Errors: as
// RunGenerateCommand's for the checkpoint and data; an unwritable --out (its path named).
absl::Status RunPredictCommand(const PredictCommandOptions& options, std::ostream& out);

}  // namespace pipetrain::cli

#endif  // PIPETRAIN_CLIENT_CLI_INFERENCE_COMMANDS_H_
