// The options every training command shares (`reference`, `train`, `local`): what to train, on
// which data, for how long, and where checkpoints go. main.cc fills one TrainingOptions from the
// flags; each command takes it (train/local add their pipeline options around it).
#ifndef PIPETRAIN_CLIENT_CLI_TRAINING_OPTIONS_H_
#define PIPETRAIN_CLIENT_CLI_TRAINING_OPTIONS_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/cli/progress.h"
#include "common/math/isa.h"
#include "common/math/optimizer.h"

namespace pipetrain::cli {

// Held-out samples `reference` and `evaluate` evaluate when --eval-samples is not given.
inline constexpr int64_t kDefaultEvalSamples = 1000;

struct TrainingOptions {
  // --model FILE: the ModelSpec (protobuf text format). Required.
  std::string model_path;
  // --data SPEC: digits | text[:PATH] | csv:PATH | npy:... | tokens:PATH | synthetic[:ROWS]
  // (docs/data.md). Without --data, main.cc fills what the model implies (DefaultDataFor); empty:
  // SetUpTraining resolves it (or says why nothing fits).
  std::string data = "digits";
  // --data-dir DIR: the bundled data directory; empty: the built-in one.
  std::string data_dir;
  // --tokenizer DIR|FILE: the SentencePiece tokenizer that turns --data text[:PATH] into token
  // ids (docs/tokenizer.md). Empty: byte-level text, or with --resume the checkpoint's tokenizer.
  std::string tokenizer;
  // --steps N: optimizer steps to run, in [1, 2^53).
  int64_t steps = 100;
  // --batch B: samples per step, >= 1.
  int64_t batch = 64;
  // --microbatches M: micro-batches per step, >= 1, divides B.
  int64_t microbatches = 1;
  // --seed S: initialisation and shuffling seed.
  uint64_t seed = 0;
  // --threads T: compute threads (per worker for train/local), >= 1.
  int threads = 1;
  // --optimizer KIND[:key=value,...]: sgd | adamw (see math::ParseOptimizerConfig).
  std::string optimizer = "adamw";
  // --json: one JSON object per line instead of progress text.
  bool json = false;
  // --save DIR: checkpoint directory, created if missing and checked writable before the first
  // step; each checkpoint overwrites the previous one. Empty: no checkpoint.
  std::string save_dir;
  // --resume DIR: continue from this checkpoint (same model, data, seed and batch). Empty: a
  // fresh start. For train/local a directory on the coordinator's host (under its
  // --checkpoint-root), which the workers load through the coordinator.
  std::string resume_dir;
  // --eval-samples N: held-out samples evaluated at the end, >= 0 (0: all). Unset: `reference`
  // evaluates kDefaultEvalSamples; train/local do not evaluate. train/local evaluate the job's
  // final weights through the coordinator (the Evaluate RPC; no --save needed).
  std::optional<int64_t> eval_samples;
  // --eval-every N: >= 0. N > 0: a held-out evaluation (--eval-samples of them, default
  // kDefaultEvalSamples) after every step whose number is a multiple of N. train/local evaluate
  // the job's weights at that step through the coordinator (the Evaluate RPC: the client sends
  // its held-out samples; no file system in common with the coordinator).
  int64_t eval_every = 0;
  // --log-every N: steps between progress lines without --json and off a terminal, >= 1.
  int64_t log_every = 10;
  // --checkpoint-every N: >= 0. 0: one checkpoint at the end (with --save). N > 0: a checkpoint
  // after every step whose number is a multiple of N, and at the end; needs --save.
  int64_t checkpoint_every = 0;
  // The learning-rate schedule (common/math/lr_schedule.h); each unset field keeps what
  // --optimizer says (by default: constant, no warm-up).
  // --lr-schedule constant|warmup-cosine|warmup-linear.
  std::optional<std::string> lr_schedule;
  // --warmup-steps N: >= 0 updates of linear warm-up.
  std::optional<int64_t> warmup_steps;
  // --lr-decay-steps N: decaying schedules reach --lr-min at update N (> --warmup-steps). Unset:
  // --steps (for a run resumed mid-schedule, give the first run's value).
  std::optional<int64_t> lr_decay_steps;
  // --lr-min X: the final rate of a decaying schedule, in [0, lr].
  std::optional<float> lr_min;
  // Not flags: whether standard output is a terminal and its width in columns (0: unknown), which
  // main.cc asks the system. A terminal gets a live progress line (client/cli/progress.h) instead
  // of plain lines; --json output is the same either way. Default: not a terminal.
  bool terminal = false;
  int terminal_columns = 0;
  // --keep-checkpoints K: >= 1, checkpoints to keep: the newest in --save DIR, up to K - 1
  // earlier ones beside it as DIR.step-<12 digits> (model::PublishCheckpoint). Default 2.
  int keep_checkpoints = 2;
  // --isa LEVEL: the instruction-set level of the math (x86-64-v3, x86-64-v4; docs/performance.md,
  // "Instruction sets"). reference: the level it runs at; empty (default): the highest this CPU
  // runs, at most --max-isa. train/local: the job's level (JobSpec.isa); empty: the highest every
  // worker of the job runs.
  std::string isa;
  // --max-isa LEVEL: the highest level to use. reference: caps the default of --isa; local: each
  // stage worker's --max-isa. Empty (default): no cap.
  std::string max_isa;
};

// The level `reference` runs at with `options` (its --isa and --max-isa): INVALID_ARGUMENT for a
// name this binary does not have or an --isa above --max-isa; FAILED_PRECONDITION if this CPU
// cannot run --isa (or runs no level at or below --max-isa).
absl::StatusOr<math::Isa> ReferenceIsaFor(const TrainingOptions& options);

// OK if `options` are usable; INVALID_ARGUMENT naming the flag otherwise. Checks values only (no
// I/O: see CheckSaveDirectory); the optimizer text is parsed by the commands.
absl::Status CheckTrainingOptions(const TrainingOptions& options);

// The optimizer of a run: --optimizer's text with the --lr-schedule, --warmup-steps,
// --lr-decay-steps and --lr-min that were given applied to it. INVALID_ARGUMENT naming the flag.
// Pure.
absl::StatusOr<math::OptimizerConfig> OptimizerConfigFor(const TrainingOptions& options);

// With --save: creates `options.save_dir` if missing and proves it writable (creates and removes a
// probe file), so that a bad directory fails before the first step. FAILED_PRECONDITION naming
// the path if it cannot be created or written; OK without --save. Thread-compatible.
absl::Status CheckSaveDirectory(const TrainingOptions& options);

// The progress line of a training command: terminal, width, --steps and --log-every from
// `options`; `pipeline` for train/local (the bubble is shown). Pure.
ProgressOptions ProgressOptionsFor(const TrainingOptions& options, bool pipeline);

// True if a checkpoint is due after step number `step` (global, 1-based): with --save, at the
// `last` step of the run and, with --checkpoint-every N, at every multiple of N.
bool CheckpointDue(const TrainingOptions& options, int64_t step, bool last);

}  // namespace pipetrain::cli

#endif  // PIPETRAIN_CLIENT_CLI_TRAINING_OPTIONS_H_
