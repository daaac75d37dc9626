// `pipetrain watch JOB`: follows a job that another client trains — its steps, recoveries (and
// the new layout after a re-partition), checkpoints and end — until it ends, as `kubectl logs -f`
// follows a pod, through the coordinator's WatchJob stream (client/sdk/job_watch.h).
#ifndef PIPETRAIN_CLIENT_CLI_WATCH_COMMAND_H_
#define PIPETRAIN_CLIENT_CLI_WATCH_COMMAND_H_

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>

#include "absl/status/status.h"
#include "client/sdk/client.h"
#include "pipetrain/v1/coordinator.pb.h"

namespace pipetrain::cli {

struct WatchCommandOptions {
  std::string coordinator;  // --coordinator HOST:PORT. Required.
  std::string job;          // the JOB argument. Required.
  // --json: one JSON object per event; a step's is the line `pipetrain train --json` prints for
  // it. Default false.
  bool json = false;
  // --log-every N (>= 1): without --json, a step line on the first step seen, every N-th step
  // number and the last, as `pipetrain train` prints them to a file. Default 10.
  int64_t log_every = 10;
  // Keepalive and deadlines of the connection to the coordinator (the SDK's defaults).
  client::ClientOptions client;
};

// Prints the events of one watch as `pipetrain watch` does, to `out`: what `pipetrain train`
// prints for the same events where there is such a line (step lines, the recovery and checkpoint
// lines), and a line for the job, its waits for a recovery, re-layouts, skipped events and its end.
// Steps a recovery makes the job apply again (the client replays them) are not printed twice.
// Thread-compatible.
class WatchPrinter {
 public:
  WatchPrinter(const WatchCommandOptions& options, std::ostream& out)
      : options_(options), out_(out) {}

  // Prints `event` (the first is the job's `status`).
  void Print(const v1::JobEvent& event);
  // The job's end, once its `ended` event was printed.
  const std::optional<v1::JobEnded>& ended() const { return ended_; }

 private:
  void PrintStatus(const v1::JobStatus& job);
  void PrintStep(const v1::StepCommitted& step, int64_t unix_ms);
  // The text line of the steps since the last one printed, ending at `step`.
  void PrintStepLine(const v1::StepCommitted& step, int64_t unix_ms);
  void PrintRecovering(const v1::RecoveryEvent& r);
  void PrintRecovered(const v1::JobRecovered& r);
  void PrintCheckpoint(const v1::CheckpointWritten& c);
  // A change of shape (or a failed growth): ShapeChangeLine.
  void PrintShapeChanged(const v1::ShapeChange& c);
  void PrintEnded(const v1::JobEnded& e);
  void PrintSkipped(const v1::EventsSkipped& s);
  // Prints a pending last step line (text), if any.
  void FlushStep();

  const WatchCommandOptions options_;
  std::ostream& out_;
  std::string job_;
  int64_t target_step_ = 0;  // 0: unknown.
  int64_t last_step_ = 0;    // the highest step seen: lower ones are replays.
  // Text: the last step seen if its line was not printed yet, and the window of the steps since
  // the last line printed (samples, bubbles, the commit time it starts at).
  std::optional<std::pair<v1::StepCommitted, int64_t>> unprinted_;
  int64_t window_samples_ = 0;
  double window_bubble_ = 0;
  double window_predicted_ = 0;
  int64_t window_steps_ = 0;
  int64_t window_start_ms_ = -1;  // -1: no line printed yet.
  std::optional<v1::JobEnded> ended_;
};

// `watch JOB`: connects, prints the job's status, the events its coordinator still keeps, then
// each event as it happens, until the job ended. OK when it ended DONE; FAILED_PRECONDITION naming
// its state and reason when it FAILED or was CANCELLED; the stream's error otherwise (NOT_FOUND for
// an unknown job or one of another owner). SIGINT/SIGTERM inside an InterruptScope end the watch:
// CANCELLED "interrupted: ...". Watching never changes the job nor keeps it alive.
absl::Status RunWatchCommand(const WatchCommandOptions& options, std::ostream& out);

}  // namespace pipetrain::cli

#endif  // PIPETRAIN_CLIENT_CLI_WATCH_COMMAND_H_
