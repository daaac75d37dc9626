// ProgressLine: the per-step progress of the training commands (`reference`, `train`, `local`)
// without --json.
//
// On a terminal it is one live line, rewritten in place ("\r", clear to end of line) at most every
// `min_redraw_interval`: step/total, loss, samples/s, the measured and predicted bubble (pipeline
// commands) and the time left. Other output (evaluations, checkpoints, recoveries) goes on its own
// line: Clear() before it, Redraw() after. Finish() (or the destructor) draws the final state and
// ends the line, so an error printed afterwards starts on a fresh line.
//
// Otherwise (a file, a pipe) it prints the plain lines the commands always printed, on the first
// step, every --log-every-th step and the last:
//   step     10  loss 0.123456  4567 samples/s
//   step     10  loss 0.123456  4567 samples/s  bubble 12.3% (predicted 10.1%)
// with the loss of the step named, and samples/s and the bubbles over the steps since the
// previous line (the bubbles: the mean of those steps' measured and predicted fractions; one
// step's alone moves by tens of points with a single late message when steps last a
// millisecond). The live line shows the same since its previous draw.
#ifndef PIPETRAIN_CLIENT_CLI_PROGRESS_H_
#define PIPETRAIN_CLIENT_CLI_PROGRESS_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <ostream>
#include <string>
#include <utility>

#include "absl/time/time.h"

namespace pipetrain::cli {

struct ProgressOptions {
  // Whether the output is a terminal (main.cc: isatty(stdout)): a live line instead of plain
  // lines. Default false.
  bool terminal = false;
  // The terminal's width in columns; the live line is cut to columns - 1 characters so that it
  // never wraps (a wrapped line cannot be rewritten with "\r"). 0: unknown, no cut.
  int columns = 0;
  // Steps this run makes (>= 1): the total shown as step/total and the base of the time left.
  int64_t steps = 1;
  // Plain lines: one every `log_every`-th step number (>= 1), besides the first and last step.
  int64_t log_every = 10;
  // Show the measured and predicted bubble (train, local). Default false (reference).
  bool pipeline = false;
  // Terminal: the least time between two redraws (the first and the final draw are never held
  // back). Default 100 ms: at most 10 redraws a second.
  absl::Duration min_redraw_interval = absl::Milliseconds(100);
  // The clock (tests inject one). Default absl::Now.
  std::function<absl::Time()> now;
};

// One finished step.
struct ProgressStep {
  int64_t step = 0;                      // its global number (1-based; resumed runs go on).
  float loss = 0;                        // the batch's mean loss.
  int64_t samples = 0;                   // samples in the batch.
  double bubble_fraction = 0;            // measured, in [0, 1] (pipeline).
  double predicted_bubble_fraction = 0;  // the simulator's (pipeline).
};

// "m:ss", or "h:mm:ss" from an hour on (negative durations as 0:00): the live line's ETA and
// time taken, and the ETA of `pipetrain jobs` and `status`.
std::string FormatClock(absl::Duration d);

// A plain progress line, without its newline: "step     10  loss 0.123456  4567 samples/s", and
// with `bubbles` (the measured and predicted fraction) "  bubble 12.3% (predicted 10.1%)". What
// ProgressLine prints, and `pipetrain watch` for the same steps.
std::string PlainStepLine(int64_t step, float loss, double samples_per_second,
                          std::optional<std::pair<double, double>> bubbles);

// Thread-compatible: one thread makes every call (the commands' training loop and the SDK
// callbacks it runs). Writes only to `out`, which must outlive it.
class ProgressLine {
 public:
  // Starts the clock of the first samples/s and time-left estimates.
  ProgressLine(std::ostream& out, ProgressOptions options);
  // Finish().
  ~ProgressLine();
  ProgressLine(const ProgressLine&) = delete;
  ProgressLine& operator=(const ProgressLine&) = delete;

  // Records step `s` (the `count`-th of this run, counting from 1, is implied by the calls).
  // Plain: prints its line if due. Terminal: redraws the live line if the last draw is at least
  // min_redraw_interval old, if nothing is drawn (first step, after Clear) or on the last step.
  void Step(const ProgressStep& s);
  // Terminal: erases the live line (the cursor returns to its start) so that the caller can print
  // a line of its own; no-op otherwise or when nothing is drawn.
  void Clear();
  // Terminal: draws the live line again after Clear (no-op before the first step, after
  // Finish, or when plain).
  void Redraw();
  // Terminal: draws the final state (time taken instead of time left) and ends the line with
  // "\n". No-op when plain or before the first step. Idempotent.
  void Finish();

  // The escape sequence that returns to the start of the line and erases it.
  static constexpr char kEraseLine[] = "\r\x1b[K";

 private:
  absl::Time Now() const;
  // The live line of the last step: time left, or with `final` the time taken.
  std::string LiveText(bool final) const;
  void Draw();
  // Starts the samples/s and bubble window at `now`.
  void StartWindow(absl::Time now);

  std::ostream& out_;
  const ProgressOptions options_;
  const absl::Time start_;
  std::optional<ProgressStep> last_;  // the last step recorded.
  int64_t count_ = 0;                 // steps recorded.
  bool drawn_ = false;                // a live line is on the screen.
  bool finished_ = false;
  absl::Time last_draw_;  // terminal: when the line was last drawn.
  // Samples/s window: since the previous plain line (plain) or draw (terminal).
  absl::Time window_start_;
  int64_t window_samples_ = 0;
  // Bubble window, the same steps: sums of the measured and predicted fractions, and how many.
  double window_bubble_ = 0;
  double window_predicted_ = 0;
  int64_t window_steps_ = 0;
  double rate_ = 0;    // terminal: samples/s over the last window.
  double bubble_ = 0;  // terminal: the bubbles' means over the last window.
  double predicted_ = 0;
  int64_t total_samples_ = 0;  // this run's samples.
};

}  // namespace pipetrain::cli

#endif  // PIPETRAIN_CLIENT_CLI_PROGRESS_H_
