// The window of one decoded sequence (docs/inference.md, "Sliding window"): which tokens a
// language model's layers hold keys and values for, and which positions the next forward runs.
// Shared by the one-process Generator and the service's Generate (the coordinator keeps one per
// prompt and sends the runs through the pipeline), so that both decode the same positions.
#ifndef PIPETRAIN_COMMON_MODEL_DECODE_WINDOW_H_
#define PIPETRAIN_COMMON_MODEL_DECODE_WINDOW_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace pipetrain::model {

// One forward through the layers: window()[position ..] run as positions position .. end - 1,
// after the layers forget every position they hold when `restart` (then position is 0).
struct DecodeRun {
  int64_t position = 0;
  bool restart = false;
};

// The window holds positions 0 .. n-1 (n at most the context T); the next token's logits are
// the last layer's output at position n-1. Appending a token to a full window (n == T) slides
// it: the window becomes its last ceil(T/2) - 1 tokens and the new one, which run from position 0
// again. A prompt longer than T keeps its last T tokens. Thread-compatible.
class DecodeWindow {
 public:
  // A window of at most `context` (>= 1) tokens over ids in [0, `vocab`).
  DecodeWindow(int64_t context, int64_t vocab) : context_(context), vocab_(vocab) {}

  // Starts a sequence with `prompt` (at least one token, each in [0, vocab)): the run of its
  // (last `context`) tokens from position 0, restarting. INVALID_ARGUMENT naming the offending
  // token; the window is unchanged then.
  absl::StatusOr<DecodeRun> Start(absl::Span<const int64_t> prompt);
  // Appends `token` (in [0, vocab)): the run of the new token, or of the slid window.
  // FAILED_PRECONDITION before Start; INVALID_ARGUMENT for a token outside the vocabulary.
  absl::StatusOr<DecodeRun> Append(int64_t token);

  // The tokens `run` feeds: window()[run.position ..].
  absl::Span<const int64_t> RunTokens(const DecodeRun& run) const {
    return absl::MakeConstSpan(window_).subspan(static_cast<size_t>(run.position));
  }
  // The tokens the logits condition on, position 0 first.
  const std::vector<int64_t>& window() const { return window_; }
  bool started() const { return started_; }
  // How many times the window slid since Start.
  int64_t slides() const { return slides_; }
  int64_t context() const { return context_; }

 private:
  const int64_t context_;
  const int64_t vocab_;
  std::vector<int64_t> window_;
  bool started_ = false;
  int64_t slides_ = 0;
};

}  // namespace pipetrain::model

#endif  // PIPETRAIN_COMMON_MODEL_DECODE_WINDOW_H_
