// `pipetrain reference`: single-process training with the reference trainer (the oracle).
#ifndef PIPETRAIN_CLIENT_CLI_REFERENCE_COMMAND_H_
#define PIPETRAIN_CLIENT_CLI_REFERENCE_COMMAND_H_

#include <cstdint>
#include <ostream>
#include <string>

#include "absl/status/status.h"

namespace pipetrain::cli {

struct ReferenceCommandOptions {
  std::string model_path;           // --model: ModelSpec text file. Required.
  std::string data = "digits";      // --data: digits | text[:PATH] | csv:PATH | synthetic[:ROWS].
  std::string data_dir;             // --data-dir: bundled data directory; empty: the built-in one.
  int64_t steps = 100;              // --steps: optimizer steps, >= 1.
  int64_t batch = 64;               // --batch: samples per step, >= 1.
  int64_t microbatches = 1;         // --microbatches: M, divides batch.
  uint64_t seed = 0;                // --seed: initialisation and shuffling seed.
  int threads = 1;                  // --threads: compute threads.
  std::string optimizer = "adamw";  // --optimizer: KIND[:key=value,...] (see ParseOptimizerConfig).
  std::string save_dir;             // --save: write a checkpoint here at the end (empty: none).
  std::string resume_dir;           // --resume: continue from this checkpoint (empty: fresh start).
  bool json = false;                // --json: one JSON object per line.
  int64_t eval_samples = 1000;  // --eval-samples: held-out samples evaluated at the end (0: all).
  int64_t log_every = 10;       // --log-every: progress line interval without --json.
};

// Trains as `options` says, writing progress to `out`. Returns the first error (bad options,
// data or model, I/O); nothing is printed for the failing step.
absl::Status RunReferenceCommand(const ReferenceCommandOptions& options, std::ostream& out);

struct EvaluateCommandOptions {
  std::string checkpoint_dir;   // --checkpoint: a checkpoint directory (reference or pipeline).
  std::string data;             // --data: default the data set the checkpoint was trained on.
  std::string data_dir;         // --data-dir: bundled data directory; empty: the built-in one.
  int64_t eval_samples = 1000;  // --eval-samples: held-out samples evaluated (0: all).
  bool json = false;            // --json: one JSON object {"eval_loss", "eval_accuracy"}.
};

// `pipetrain evaluate`: loads a checkpoint written by `reference --save` or `train/local --save`
// and prints the held-out loss (and accuracy for classification) exactly as `reference` does at
// the end of training.
absl::Status RunEvaluateCommand(const EvaluateCommandOptions& options, std::ostream& out);

}  // namespace pipetrain::cli

#endif  // PIPETRAIN_CLIENT_CLI_REFERENCE_COMMAND_H_
