// `pipetrain train`: trains on a running coordinator through the client SDK.
#ifndef PIPETRAIN_CLIENT_CLI_TRAIN_COMMAND_H_
#define PIPETRAIN_CLIENT_CLI_TRAIN_COMMAND_H_

#include <cstdint>
#include <functional>
#include <ostream>
#include <string>

#include "absl/status/status.h"

namespace pipetrain::cli {

// --data, --data-dir, --seed, --threads, --optimizer, --batch and --microbatches mean exactly what
// they mean for `pipetrain reference` (same data loading, model resolution and BatchSampler), so
// that a run reproduces the reference's losses and weights bit for bit.
struct TrainCommandOptions {
  std::string coordinator;          // --coordinator: HOST:PORT. Required by `train`.
  std::string model_path;           // --model: ModelSpec text file. Required.
  std::string data = "digits";      // --data: digits | text[:PATH] | csv:PATH | synthetic[:ROWS].
  std::string data_dir;             // --data-dir: bundled data directory; empty: the built-in one.
  int stages = 1;                   // --stages: S, >= 1.
  std::string schedule = "1f1b";    // --schedule: gpipe|1f1b|interleaved|zb-h1|zb-v|dualpipe-v.
  int virtual_stages = 0;           // --virtual: V; 0: the schedule's default.
  int64_t steps = 100;              // --steps: optimizer steps, >= 1.
  int64_t batch = 64;               // --batch: samples per step, >= 1.
  int64_t microbatches = 1;         // --microbatches: M, divides batch.
  uint64_t seed = 0;                // --seed: initialisation and shuffling seed.
  int threads = 1;                  // --threads: compute threads per worker.
  std::string optimizer = "adamw";  // --optimizer: KIND[:key=value,...].
  bool json = false;                // --json: one JSON object per step.
  std::string trace_path;           // --trace: Chrome trace JSON of the last step's timeline.
  std::string save_dir;             // --save: checkpoint directory at the end (empty: none).
  int64_t log_every = 10;           // --log-every: progress line interval without --json.
};

// OK if the options are usable (everything but the coordinator address, which `local` fills in);
// INVALID_ARGUMENT naming the flag otherwise.
absl::Status CheckTrainCommandOptions(const TrainCommandOptions& options);

// Returns true when the run should stop early (e.g. Ctrl-C); checked between steps.
using InterruptFn = std::function<bool()>;

// Trains as `options` says on the coordinator at `options.coordinator`, writing progress to `out`
// (JSON lines `{"step", "loss", "step_ms", "bubble_fraction", "predicted_bubble_fraction"}` with
// --json, loss with 9 significant digits). Returns the first error (bad options, data, model,
// the coordinator's statuses); CANCELLED if `interrupted` returned true.
absl::Status RunTrainCommand(const TrainCommandOptions& options, std::ostream& out,
                             const InterruptFn& interrupted = nullptr);

}  // namespace pipetrain::cli

#endif  // PIPETRAIN_CLIENT_CLI_TRAIN_COMMAND_H_
