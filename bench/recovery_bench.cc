// Recovery time: what a SIGKILLed worker costs a `pipetrain train` run that recovers in place
// (JobSpec.recover: a spare worker takes the lost rank, every rank restores the last checkpoint,
// the SDK replays the batches since), beside a full restart from the same checkpoint (kill every
// process, start fresh daemons, `pipetrain train --resume`), both against the same run with no
// fault measured in the same invocation.
//
// Deep benchmark MLP (examples/deep_mlp.textproto, synthetic data, B=64, M=8, SGD), S=4 stages,
// 1F1B, on 127.0.0.1. Per round:
//   A  fault-free: coordinator + 5 workers (warmed up by a 2-step job), then
//      `pipetrain train --json --checkpoint-every N --save`.
//   B  recovery: the same run on the same daemons; after the client printed step K (not a
//      checkpoint step) the worker holding --kill-rank is SIGKILLed by its PID. Measured:
//      detection = kill -> the coordinator's "was lost" log line; restore = -> its "recovered"
//      line (the job READY again); replay = -> the client has the answer of the step the fault
//      interrupted; extra wall = the run's wall time minus A's.
//   C  full restart: the run on fresh daemons (coordinator + 4 workers); after step K every
//      process (client, coordinator, workers) is SIGKILLed, fresh daemons are started and
//      `pipetrain train --resume` continues from the last checkpoint up to the same step.
// Also checked: every loss of B and C bitwise equals A's, and the final checkpoint files are
// byte-identical. Every process is signalled by its PID, every wait is bounded, and the temporary
// directory is removed on every way out (Ctrl-C included).
//
// Usage: recovery_bench [--steps 60] [--checkpoint-every 20] [--kill-after 30] [--kill-rank 1]
//                       [--rounds 3] [--run-timeout 300s] [--keep-dir]
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/util/command_line.h"
#include "common/util/status_macros.h"
#include "nlohmann/json.hpp"
#include "tests/integration/daemons.h"
#include "tests/integration/run_command.h"

ABSL_FLAG(int64_t, steps, 60, "steps of every run");
ABSL_FLAG(int64_t, checkpoint_every, 20, "a checkpoint after every step that is a multiple of N");
ABSL_FLAG(int64_t, kill_after, 30,
          "SIGKILL once the client printed this step (not a multiple of --checkpoint-every)");
ABSL_FLAG(int32_t, kill_rank, 1, "the rank whose worker is killed in the recovery run (0-3)");
ABSL_FLAG(int32_t, rounds, 3, "rounds of the three runs; the table shows each and their median");
ABSL_FLAG(bool, keep_dir, false,
          "keep the temporary directory (daemon logs, checkpoints) and print its path");
ABSL_FLAG(absl::Duration, run_timeout, absl::Seconds(300), "the longest any one run may take");

namespace pipetrain {
namespace {

namespace fs = std::filesystem;
using testing::Daemons;
using testing::PipedChild;

constexpr int kStages = 4;
constexpr int kBatch = 64;
constexpr int kMicrobatches = 8;

// What main() parsed, checked by Check().
struct BenchOptions {
  int64_t steps = 60;             // steps of every run.
  int64_t checkpoint_every = 20;  // --checkpoint-every of every run.
  int64_t kill_after = 30;        // the fault comes once the client printed this step.
  int kill_rank = 1;              // the rank whose worker run B kills.
  int rounds = 3;                 // repetitions of A, B, C.
  absl::Duration run_timeout = absl::Seconds(300);  // bound of every run (and of every wait in it).
  bool keep_dir = false;  // leave the temporary directory behind for inspection.

  // INVALID_ARGUMENT naming the flag unless the options describe a fault after a checkpoint and
  // before the end of the run.
  absl::Status Check() const {
    if (checkpoint_every < 1) return absl::InvalidArgumentError("--checkpoint-every must be >= 1");
    if (kill_after <= checkpoint_every || kill_after % checkpoint_every == 0 ||
        kill_after >= steps) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--kill-after ", kill_after, " must lie after the first checkpoint (step ",
          checkpoint_every, "), off a checkpoint step and before the last step (", steps, ")"));
    }
    if (kill_rank < 0 || kill_rank >= kStages) {
      return absl::InvalidArgumentError(
          absl::StrCat("--kill-rank must be in [0, ", kStages, "), got ", kill_rank));
    }
    if (rounds < 1 || rounds > 20) {
      return absl::InvalidArgumentError(absl::StrCat("--rounds must be in [1, 20], got ", rounds));
    }
    if (run_timeout <= absl::ZeroDuration()) {
      return absl::InvalidArgumentError("--run-timeout must be > 0");
    }
    return absl::OkStatus();
  }
};

// Set by SIGINT/SIGTERM/SIGHUP: every wait below gives up within kPollSlice and the run unwinds,
// stopping its processes and removing the temporary directory.
volatile std::sig_atomic_t g_interrupted = 0;
constexpr int kPollSliceMs = 200;

extern "C" void OnSignal(int) { g_interrupted = 1; }

absl::Status Interrupted() { return absl::CancelledError("interrupted"); }

// The temporary directory of the whole invocation, removed with everything in it on destruction.
// With `keep`, it is left in place and its path printed to stderr instead.
class ScopedTempDir {
 public:
  ScopedTempDir(std::string path, bool keep) : path_(std::move(path)), keep_(keep) {}
  ~ScopedTempDir() {
    if (path_.empty()) return;
    if (keep_) {
      std::fprintf(stderr, "recovery_bench: logs and checkpoints kept in %s\n", path_.c_str());
      return;
    }
    std::error_code ignored;
    fs::remove_all(path_, ignored);
  }
  ScopedTempDir(const ScopedTempDir&) = delete;
  ScopedTempDir& operator=(const ScopedTempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  bool keep_;
};

// One line of the client's standard output and when it arrived.
struct Line {
  absl::Time at;
  std::string text;
};

// A `pipetrain train --json` process whose output lines are timestamped as they arrive. Killed
// (SIGKILL, by PID) and reaped on destruction if still running. Not thread-safe.
class TrainProcess {
 public:
  // Starts `pipetrain train` with `args`, stderr into `stderr_path`.
  static absl::StatusOr<std::unique_ptr<TrainProcess>> Start(const std::vector<std::string>& args,
                                                             const std::string& stderr_path) {
    std::vector<std::string> argv = {PIPETRAIN_BINARY, "train"};
    argv.insert(argv.end(), args.begin(), args.end());
    std::unique_ptr<TrainProcess> p(new TrainProcess(stderr_path));
    p->start_ = absl::Now();
    p->child_ = testing::SpawnPiped(argv, stderr_path);
    if (p->child_.pid <= 0) return absl::InternalError("cannot start pipetrain train");
    return p;
  }
  ~TrainProcess() {
    Kill();
    if (child_.out >= 0) close(child_.out);
  }
  TrainProcess(const TrainProcess&) = delete;
  TrainProcess& operator=(const TrainProcess&) = delete;

  absl::Time start() const { return start_; }
  pid_t pid() const { return child_.pid; }

  // The next line, timestamped when its newline arrived; nullopt at the end of the output.
  // DEADLINE_EXCEEDED if none arrives by `deadline`, CANCELLED on an interrupt.
  absl::StatusOr<std::optional<Line>> Next(absl::Time deadline) {
    for (;;) {
      const size_t newline = buffer_.find('\n');
      if (newline != std::string::npos) {
        Line line{absl::Now(), buffer_.substr(0, newline)};
        buffer_.erase(0, newline + 1);
        return line;
      }
      if (ended_) return std::nullopt;
      if (g_interrupted) return Interrupted();
      if (absl::Now() >= deadline) {
        return absl::DeadlineExceededError(
            absl::StrCat("pipetrain train printed nothing more in time; its stderr: ",
                         testing::ReadFile(stderr_path_)));
      }
      const testing::ReadEnd end = testing::ReadWhile(
          child_, kPollSliceMs, &buffer_,
          [](const std::string& s) { return s.find('\n') != std::string::npos; });
      if (end == testing::ReadEnd::kEndOfPipe) ended_ = true;
    }
  }

  // Reads the output to its end and reaps the process by `deadline`. OK only if it exited 0;
  // UNKNOWN with its stderr otherwise.
  absl::StatusOr<std::vector<Line>> Finish(absl::Time deadline) {
    std::vector<Line> rest;
    for (;;) {
      PT_ASSIGN_OR_RETURN(std::optional<Line> line, Next(deadline));
      if (!line.has_value()) break;
      rest.push_back(*std::move(line));
    }
    const int status = Reap();
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      return absl::UnknownError(absl::StrCat("pipetrain train failed (wait status ", status,
                                             "): ", testing::ReadFile(stderr_path_)));
    }
    return rest;
  }

  // SIGKILL and reap (no-op once reaped); the lines still in the pipe stay readable with Next().
  void Kill() {
    if (child_.pid <= 0) return;
    kill(child_.pid, SIGKILL);
    Reap();
  }

 private:
  explicit TrainProcess(std::string stderr_path) : stderr_path_(std::move(stderr_path)) {}

  int Reap() {
    int status = -1;
    if (child_.pid > 0) {
      while (waitpid(child_.pid, &status, 0) < 0 && errno == EINTR) {
      }
      child_.pid = -1;
    }
    return status;
  }

  const std::string stderr_path_;
  PipedChild child_;
  absl::Time start_;
  std::string buffer_;  // read, not yet returned as lines.
  bool ended_ = false;  // the pipe reached its end.
};

// What the bench takes from the client's --json lines.
struct TrainOutput {
  std::map<int64_t, double> losses;        // by step; a step printed twice must repeat its loss.
  std::map<int64_t, absl::Time> at;        // by step: when it was first printed.
  std::optional<nlohmann::json> recovery;  // the run's {"recovery": {...}} record, if any.

  // Records one output line. INVALID_ARGUMENT for a line that is not a JSON object or a bad
  // recovery record, DATA_LOSS for a step printed again with another loss.
  absl::Status Add(const Line& line) {
    const nlohmann::json j = nlohmann::json::parse(line.text, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) {
      return absl::InvalidArgumentError(absl::StrCat("not a JSON line: '", line.text, "'"));
    }
    if (j.contains("recovery")) {
      const nlohmann::json& r = j["recovery"];
      if (!r.is_object() || !r.contains("steps_done") || !r["steps_done"].is_number_integer() ||
          !r.contains("restored_step") || !r["restored_step"].is_number_integer()) {
        return absl::InvalidArgumentError(absl::StrCat("bad recovery record: '", line.text, "'"));
      }
      recovery = r;
    } else if (j.contains("step") && j["step"].is_number_integer() && j.contains("loss") &&
               j["loss"].is_number()) {
      const int64_t step = j["step"].get<int64_t>();
      const double loss = j["loss"].get<double>();
      at.emplace(step, line.at);
      auto [it, inserted] = losses.emplace(step, loss);
      if (!inserted && it->second != loss) {
        return absl::DataLossError(
            absl::StrCat("step ", step, " printed twice with losses ", it->second, " and ", loss));
      }
    }
    return absl::OkStatus();
  }
};

// The step number of a --json step line, or -1.
int64_t StepOf(const Line& line) {
  const nlohmann::json j = nlohmann::json::parse(line.text, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("step") || !j["step"].is_number_integer()) {
    return -1;
  }
  return j["step"].get<int64_t>();
}

// The `pipetrain train` flags of the benchmark run (the deep MLP of bench/local_throughput.sh).
std::vector<std::string> TrainArgs(const BenchOptions& o, const std::string& coordinator,
                                   int64_t steps, const std::string& save) {
  return {"--coordinator",
          coordinator,
          "--stages",
          absl::StrCat(kStages),
          "--schedule",
          "1f1b",
          "--model",
          testing::Example("deep_mlp.textproto"),
          "--data",
          "synthetic",
          "--batch",
          absl::StrCat(kBatch),
          "--microbatches",
          absl::StrCat(kMicrobatches),
          "--seed",
          "1",
          "--optimizer",
          "sgd:lr=0.01",
          "--json",
          "--steps",
          absl::StrCat(steps),
          "--checkpoint-every",
          absl::StrCat(o.checkpoint_every),
          "--save",
          save};
}

// Starts `daemons` (coordinator with --checkpoint-root `root`, `workers` workers) with logs in
// `dir`.
absl::Status StartDaemons(Daemons& daemons, const std::string& dir, const std::string& root,
                          int workers) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", dir, ": ", ec.message()));
  const std::string error = daemons.Start(dir, workers, {"--checkpoint-root", root});
  if (!error.empty()) return absl::UnavailableError(absl::StrCat("daemons in ", dir, ": ", error));
  return absl::OkStatus();
}

// The time stamp of the first line of the coordinator log `log` containing every one of `parts`
// (log lines begin with an RFC 3339 time, millisecond resolution).
absl::StatusOr<absl::Time> LogTime(const std::string& log, const std::vector<std::string>& parts) {
  std::ifstream in(log);
  std::string line;
  while (std::getline(in, line)) {
    bool all = true;
    for (const std::string& p : parts) all = all && absl::StrContains(line, p);
    if (!all) continue;
    const std::string stamp = line.substr(0, line.find(' '));
    absl::Time t;
    std::string err;
    if (!absl::ParseTime(absl::RFC3339_full, stamp, &t, &err)) {
      return absl::InvalidArgumentError(absl::StrCat(log, ": bad time '", stamp, "': ", err));
    }
    return t;
  }
  return absl::NotFoundError(
      absl::StrCat(log, " has no line with '", absl::StrJoin(parts, "', '"), "'"));
}

// Checks that every loss in `run` equals the fault-free run's bit for bit.
absl::Status SameLosses(const TrainOutput& reference, const TrainOutput& run,
                        absl::string_view what) {
  for (const auto& [step, loss] : run.losses) {
    auto it = reference.losses.find(step);
    if (it == reference.losses.end() || it->second != loss) {
      return absl::DataLossError(absl::StrCat(what, ": the loss of step ", step, " differs from ",
                                              "the fault-free run's"));
    }
  }
  if (run.losses.size() != reference.losses.size()) {
    return absl::DataLossError(absl::StrCat(what, ": ", run.losses.size(), " steps printed, ",
                                            reference.losses.size(), " without a fault"));
  }
  return absl::OkStatus();
}

// Checks that directories `a` and `b` hold the same file names with the same bytes.
absl::Status SameFiles(const std::string& a, const std::string& b) {
  std::map<std::string, std::string> files;
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(a, ec)) {
    files[e.path().filename().string()] = testing::ReadFile(e.path().string());
  }
  if (ec || files.empty()) return absl::NotFoundError(absl::StrCat("no checkpoint in ", a));
  size_t seen = 0;
  for (const fs::directory_entry& e : fs::directory_iterator(b, ec)) {
    auto it = files.find(e.path().filename().string());
    if (it == files.end() || it->second != testing::ReadFile(e.path().string())) {
      return absl::DataLossError(
          absl::StrCat(e.path().string(), " differs from ", a, "/", e.path().filename().string()));
    }
    ++seen;
  }
  if (ec || seen != files.size()) {
    return absl::DataLossError(absl::StrCat(b, " does not hold the files of ", a));
  }
  return absl::OkStatus();
}

// The figures of one round, in seconds.
struct Round {
  double fault_free = 0;             // A: wall time of the run.
  double detection = 0;              // B: kill -> the coordinator logged the loss.
  double restore = 0;                // B: -> the coordinator logged the job READY again.
  double replay = 0;                 // B: -> the client answered the interrupted step.
  double replay_excess = 0;          // B: replay minus the fault-free time of the same steps.
  double recovery = 0;               // B: kill -> the interrupted step answered.
  double recovery_extra = 0;         // B: wall time minus A's.
  double recovery_delay = 0;         // B: step K -> interrupted step answered, minus the same in A.
  int64_t replayed = 0;              // B: steps replayed (failed - restored).
  double restart_daemons = 0;        // C: kill -> fresh daemons registered.
  double restart_resume = 0;         // C: -> the resumed client's first step answered.
  double restart_replay = 0;         // C: -> the interrupted step answered.
  double restart_replay_excess = 0;  // C: restart_replay minus the fault-free time of its steps.
  double restart = 0;                // C: kill -> the interrupted step answered.
  double restart_extra = 0;          // C: wall time (both halves and the restart) minus A's.
  double restart_delay = 0;          // C: step K -> interrupted step answered, minus the same in A.
};

// Seconds from `run` printing step `from` to its printing step `to`.
absl::StatusOr<double> Between(const TrainOutput& run, int64_t from, int64_t to) {
  auto f = run.at.find(from);
  auto t = run.at.find(to);
  if (f == run.at.end() || t == run.at.end()) {
    return absl::NotFoundError(absl::StrCat("steps ", from, " and ", to, " were not printed"));
  }
  return absl::ToDoubleSeconds(t->second - f->second);
}

// How much longer `run` took from printing step `from` to printing step `to` than the fault-free
// run `reference` (seconds): the fault's cost measured over a few steps, less exposed to the
// machine's load than the difference of whole runs.
absl::StatusOr<double> Delay(const TrainOutput& reference, const TrainOutput& run, int64_t from,
                             int64_t to) {
  PT_ASSIGN_OR_RETURN(const double faulty, Between(run, from, to));
  PT_ASSIGN_OR_RETURN(const double fault_free, Between(reference, from, to));
  return faulty - fault_free;
}

// Reads `train` to its end into `out`; returns the time of its exit.
absl::StatusOr<absl::Time> FinishRun(TrainProcess& train, TrainOutput& out, absl::Time deadline) {
  PT_ASSIGN_OR_RETURN(std::vector<Line> rest, train.Finish(deadline));
  for (const Line& l : rest) PT_RETURN_IF_ERROR(out.Add(l));
  return absl::Now();
}

// A short run (2 steps, a checkpoint after each) on `daemons`, so that the measured runs find them
// warm: the first job and the first checkpoint on fresh daemons cost up to a second more on the
// loaded 2-core machine (connections, first-touch allocations), which would otherwise be
// charged to whichever run comes first.
absl::Status WarmUp(const BenchOptions& o, Daemons& daemons, const std::string& save,
                    const std::string& stderr_path) {
  BenchOptions warm = o;
  warm.checkpoint_every = 1;
  PT_ASSIGN_OR_RETURN(
      std::unique_ptr<TrainProcess> train,
      TrainProcess::Start(TrainArgs(warm, daemons.address(), 2, save), stderr_path));
  return train->Finish(train->start() + o.run_timeout).status();
}

// Reads lines of `train` into `out` until step `step` is printed; returns that line's time.
absl::StatusOr<absl::Time> ReadUntilStep(TrainProcess& train, TrainOutput& out, int64_t step,
                                         absl::Time deadline) {
  for (;;) {
    PT_ASSIGN_OR_RETURN(std::optional<Line> line, train.Next(deadline));
    if (!line.has_value()) {
      return absl::UnknownError(absl::StrCat("pipetrain train ended before step ", step));
    }
    PT_RETURN_IF_ERROR(out.Add(*line));
    if (StepOf(*line) == step) return line->at;
  }
}

// Runs A, B and C once under `dir`; fills `r`.
absl::Status RunRound(const BenchOptions& o, const std::string& dir, Round& r) {
  const std::string root = dir + "/checkpoints";
  std::error_code ec;
  fs::create_directories(root, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", root, ": ", ec.message()));

  // A and B share one coordinator and five workers: four for the job, one spare.
  Daemons service;
  PT_RETURN_IF_ERROR(StartDaemons(service, dir + "/service", root, kStages + 1));
  const std::string coordinator_log = dir + "/service/coordinator.log";
  PT_RETURN_IF_ERROR(WarmUp(o, service, root + "/warm-up", dir + "/warm-up.err"));

  // A: no fault.
  TrainOutput a;
  {
    PT_ASSIGN_OR_RETURN(
        std::unique_ptr<TrainProcess> train,
        TrainProcess::Start(TrainArgs(o, service.address(), o.steps, root + "/a"), dir + "/a.err"));
    const absl::Time deadline = train->start() + o.run_timeout;
    PT_ASSIGN_OR_RETURN(absl::Time end, FinishRun(*train, a, deadline));
    r.fault_free = absl::ToDoubleSeconds(end - train->start());
  }

  // B: SIGKILL the worker of --kill-rank after step K; the job recovers in place.
  TrainOutput b;
  {
    PT_ASSIGN_OR_RETURN(
        std::unique_ptr<TrainProcess> train,
        TrainProcess::Start(TrainArgs(o, service.address(), o.steps, root + "/b"), dir + "/b.err"));
    const absl::Time deadline = train->start() + o.run_timeout;
    PT_RETURN_IF_ERROR(ReadUntilStep(*train, b, 1, deadline).status());
    // The job's worker at the rank to kill: a daemon this bench started (w0..w4), by PID.
    PT_ASSIGN_OR_RETURN(std::vector<v1::JobStatus> jobs, service.client().ListJobs());
    std::string job_id;
    std::string victim;
    for (const v1::JobStatus& job : jobs) {
      if (job.state() == v1::JOB_STATE_READY || job.state() == v1::JOB_STATE_TRAINING) {
        if (o.kill_rank < job.stages_size()) {
          job_id = job.job();
          victim = job.stages(o.kill_rank).worker();
        }
      }
    }
    size_t index = 0;
    absl::string_view digits = victim;
    if (!absl::ConsumePrefix(&digits, "w") || !absl::SimpleAtoi(digits, &index) ||
        index >= service.workers().size()) {
      return absl::InternalError(
          absl::StrCat("no running job with a rank ", o.kill_rank, " worker of this bench"));
    }
    PT_RETURN_IF_ERROR(ReadUntilStep(*train, b, o.kill_after, deadline).status());
    const absl::Time kill_at = absl::Now();
    kill(service.workers()[index], SIGKILL);
    service.Reap(index);

    // The recovery record comes before the interrupted step's answer.
    while (!b.recovery.has_value()) {
      PT_ASSIGN_OR_RETURN(std::optional<Line> line, train->Next(deadline));
      if (!line.has_value()) return absl::UnknownError("the recovery run printed no recovery");
      PT_RETURN_IF_ERROR(b.Add(*line));
    }
    const int64_t failed = (*b.recovery)["steps_done"].get<int64_t>();
    const int64_t restored = (*b.recovery)["restored_step"].get<int64_t>();
    PT_ASSIGN_OR_RETURN(absl::Time back_at, ReadUntilStep(*train, b, failed + 1, deadline));
    PT_ASSIGN_OR_RETURN(absl::Time end, FinishRun(*train, b, deadline));

    PT_ASSIGN_OR_RETURN(absl::Time lost_at,
                        LogTime(coordinator_log, {job_id + ":", "was lost at step", "recovering"}));
    PT_ASSIGN_OR_RETURN(absl::Time ready_at,
                        LogTime(coordinator_log, {job_id + ":", "recovered (lost"}));
    r.detection = absl::ToDoubleSeconds(lost_at - kill_at);
    r.restore = absl::ToDoubleSeconds(ready_at - lost_at);
    r.replay = absl::ToDoubleSeconds(back_at - ready_at);
    r.recovery = absl::ToDoubleSeconds(back_at - kill_at);
    r.recovery_extra = absl::ToDoubleSeconds(end - train->start()) - r.fault_free;
    PT_ASSIGN_OR_RETURN(r.recovery_delay, Delay(a, b, o.kill_after, failed + 1));
    r.replayed = failed - restored;
    // The replay runs steps restored+1 .. failed+1; A's time per step from its steps
    // restored+2 .. failed+1 (the step after a checkpoint also waits for the checkpoint).
    PT_ASSIGN_OR_RETURN(const double a_steps, Between(a, restored + 1, failed + 1));
    r.replay_excess = r.replay - a_steps * static_cast<double>(failed - restored + 1) /
                                     static_cast<double>(failed - restored);
  }
  service.Stop();
  PT_RETURN_IF_ERROR(SameLosses(a, b, "recovery run"));
  PT_RETURN_IF_ERROR(SameFiles(root + "/a", root + "/b"));

  // C: the same run on fresh daemons; after step K every process is killed and the run resumed
  // from the last checkpoint on fresh daemons.
  TrainOutput c;
  {
    Daemons first;
    PT_RETURN_IF_ERROR(StartDaemons(first, dir + "/restart-1", root, kStages));
    // Warm like the service of A and B; the fresh daemons of the restart are cold, as in life.
    PT_RETURN_IF_ERROR(WarmUp(o, first, root + "/warm-up-c", dir + "/warm-up-c.err"));
    PT_ASSIGN_OR_RETURN(
        std::unique_ptr<TrainProcess> train,
        TrainProcess::Start(TrainArgs(o, first.address(), o.steps, root + "/c"), dir + "/c1.err"));
    const absl::Time start = train->start();
    PT_RETURN_IF_ERROR(ReadUntilStep(*train, c, o.kill_after, start + o.run_timeout).status());
    const absl::Time kill_at = absl::Now();
    train->Kill();
    kill(first.coordinator(), SIGKILL);
    for (pid_t pid : first.workers()) kill(pid, SIGKILL);
    first.Stop();                 // reaps them.
    int64_t last = o.kill_after;  // the last step the killed client printed.
    for (;;) {
      PT_ASSIGN_OR_RETURN(std::optional<Line> line, train->Next(start + o.run_timeout));
      if (!line.has_value()) break;
      PT_RETURN_IF_ERROR(c.Add(*line));
      last = std::max(last, StepOf(*line));
    }
    const int64_t restored = last / o.checkpoint_every * o.checkpoint_every;

    Daemons second;
    PT_RETURN_IF_ERROR(StartDaemons(second, dir + "/restart-2", root, kStages));
    const absl::Time up_at = absl::Now();
    std::vector<std::string> args =
        TrainArgs(o, second.address(), o.steps - restored, root + "/c2");
    args.insert(args.end(), {"--resume", root + "/c"});
    PT_ASSIGN_OR_RETURN(std::unique_ptr<TrainProcess> resumed,
                        TrainProcess::Start(args, dir + "/c2.err"));
    const absl::Time deadline = resumed->start() + o.run_timeout;
    PT_ASSIGN_OR_RETURN(std::optional<Line> first_line, resumed->Next(deadline));
    if (!first_line.has_value() || StepOf(*first_line) != restored + 1) {
      return absl::UnknownError(absl::StrCat("the resumed run did not start at step ", restored + 1,
                                             ": ", resumed->Finish(deadline).status().ToString()));
    }
    PT_RETURN_IF_ERROR(c.Add(*first_line));
    PT_ASSIGN_OR_RETURN(absl::Time back_at, ReadUntilStep(*resumed, c, last + 1, deadline));
    PT_ASSIGN_OR_RETURN(absl::Time end, FinishRun(*resumed, c, deadline));
    second.Stop();
    r.restart_daemons = absl::ToDoubleSeconds(up_at - kill_at);
    r.restart_resume = absl::ToDoubleSeconds(first_line->at - up_at);
    r.restart_replay = absl::ToDoubleSeconds(back_at - first_line->at);
    r.restart = absl::ToDoubleSeconds(back_at - kill_at);
    r.restart_extra = absl::ToDoubleSeconds(end - start) - r.fault_free;
    PT_ASSIGN_OR_RETURN(r.restart_delay, Delay(a, c, o.kill_after, last + 1));
    // Its replay phase runs steps restored+2 .. last+1, as many as A's restored+2 .. last+1.
    PT_ASSIGN_OR_RETURN(const double a_steps, Between(a, restored + 1, last + 1));
    r.restart_replay_excess = r.restart_replay - a_steps;
  }
  PT_RETURN_IF_ERROR(SameLosses(a, c, "full-restart run"));
  PT_RETURN_IF_ERROR(SameFiles(root + "/a", root + "/c2"));
  return absl::OkStatus();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

std::string LoadAverage() {
  std::ifstream in("/proc/loadavg");
  double one = 0;
  return in >> one ? absl::StrFormat("%.1f", one) : "?";
}

int Run(const BenchOptions& o) {
  ScopedTempDir tmp(testing::TempDir("recovery_bench"), o.keep_dir);
  if (tmp.path().empty()) {
    std::fprintf(stderr, "recovery_bench: cannot create a temporary directory\n");
    return 1;
  }
  std::printf(
      "deep MLP, S=%d 1F1B, B=%d, M=%d, %lld steps, checkpoint every %lld, SIGKILL of rank %d "
      "after step K=%lld; 127.0.0.1, %ld cores, load average %s at start\n",
      kStages, kBatch, kMicrobatches, static_cast<long long>(o.steps),
      static_cast<long long>(o.checkpoint_every), o.kill_rank, static_cast<long long>(o.kill_after),
      sysconf(_SC_NPROCESSORS_ONLN), LoadAverage().c_str());
  std::fflush(stdout);
  std::vector<Round> rounds;
  for (int i = 0; i < o.rounds; ++i) {
    Round r;
    const absl::Status s = RunRound(o, absl::StrCat(tmp.path(), "/round-", i), r);
    if (g_interrupted) {
      // A Ctrl-C reaches the daemons and clients too (one process group): whatever failed, the
      // cause is the interrupt.
      std::fprintf(stderr, "recovery_bench: interrupted\n");
      return 130;
    }
    if (!s.ok()) {
      std::fprintf(stderr, "recovery_bench: round %d: %s\n", i + 1, s.ToString().c_str());
      return 1;
    }
    rounds.push_back(r);
  }

  // One row per figure: each round, then the median.
  struct Row {
    const char* label;
    double Round::*field;
  };
  static constexpr Row kRows[] = {
      {"fault-free run: wall time", &Round::fault_free},
      {"recovery: detection (kill -> coordinator log)", &Round::detection},
      {"recovery: restore (-> job READY again)", &Round::restore},
      {"recovery: replay (-> interrupted step answered)", &Round::replay},
      {"recovery: replay minus the same steps without fault", &Round::replay_excess},
      {"recovery: total, kill -> interrupted step answered", &Round::recovery},
      {"recovery: extra wall time vs fault-free", &Round::recovery_extra},
      {"recovery: extra time, step K -> interrupted step", &Round::recovery_delay},
      {"full restart: fresh daemons registered", &Round::restart_daemons},
      {"full restart: resumed run's first step answered", &Round::restart_resume},
      {"full restart: replay (-> interrupted step answered)", &Round::restart_replay},
      {"full restart: replay minus the same steps without fault", &Round::restart_replay_excess},
      {"full restart: total, kill -> interrupted step answered", &Round::restart},
      {"full restart: extra wall time vs fault-free", &Round::restart_extra},
      {"full restart: extra time, step K -> interrupted step", &Round::restart_delay},
  };
  auto median = [&rounds](double Round::*field) {
    std::vector<double> values;
    for (const Round& r : rounds) values.push_back(r.*field);
    return Median(values);
  };
  std::string header = absl::StrFormat("%-56s", "seconds");
  for (size_t i = 0; i < rounds.size(); ++i) {
    absl::StrAppendFormat(&header, " %8s", absl::StrCat("run ", i + 1));
  }
  if (rounds.size() > 1) absl::StrAppendFormat(&header, " %8s", "median");
  std::printf("%s\n", header.c_str());
  for (const Row& row : kRows) {
    std::string line = absl::StrFormat("%-56s", row.label);
    for (const Round& r : rounds) absl::StrAppendFormat(&line, " %8.3f", r.*row.field);
    if (rounds.size() > 1) absl::StrAppendFormat(&line, " %8.3f", median(row.field));
    std::printf("%s\n", line.c_str());
  }
  const double fault_free = median(&Round::fault_free);
  std::printf(
      "steps replayed: %lld; losses and final checkpoint files of both bitwise equal to the "
      "fault-free run's\n",
      static_cast<long long>(rounds.front().replayed));
  std::printf("ratio recovery / full restart (kill -> interrupted step answered): %.3f\n",
              median(&Round::recovery) / median(&Round::restart));
  std::printf(
      "ratio overhead / fault-free run, by wall time (by step K -> interrupted step): recovery "
      "%.3f (%.3f), full restart %.3f (%.3f)\n",
      median(&Round::recovery_extra) / fault_free, median(&Round::recovery_delay) / fault_free,
      median(&Round::restart_extra) / fault_free, median(&Round::restart_delay) / fault_free);
  return 0;
}

}  // namespace
}  // namespace pipetrain

int main(int argc, char** argv) {
  const pipetrain::ProgramSpec program{
      "recovery_bench",
      "recovery time of a pipetrain job after a SIGKILLed worker vs a full restart: "
      "recovery_bench [--steps 60] [--checkpoint-every 20] [--kill-after 30] [--kill-rank 1] "
      "[--rounds 3] [--run-timeout 300s] [--keep-dir]",
      {},
      pipetrain::ProgramFlags(),
      ""};
  absl::SetProgramUsageMessage(program.summary);
  if (std::optional<int> exit_code = pipetrain::ParseDaemonCommandLine(program, argc, argv)) {
    return *exit_code;
  }
  pipetrain::BenchOptions options;
  options.steps = absl::GetFlag(FLAGS_steps);
  options.checkpoint_every = absl::GetFlag(FLAGS_checkpoint_every);
  options.kill_after = absl::GetFlag(FLAGS_kill_after);
  options.kill_rank = absl::GetFlag(FLAGS_kill_rank);
  options.rounds = absl::GetFlag(FLAGS_rounds);
  options.run_timeout = absl::GetFlag(FLAGS_run_timeout);
  options.keep_dir = absl::GetFlag(FLAGS_keep_dir);
  if (absl::Status s = options.Check(); !s.ok()) {
    std::fprintf(stderr, "recovery_bench: %s\n", s.ToString().c_str());
    return 2;
  }
  struct sigaction on_signal = {};
  on_signal.sa_handler = pipetrain::OnSignal;  // no SA_RESTART: waits wake up with EINTR.
  sigemptyset(&on_signal.sa_mask);
  for (int s : {SIGINT, SIGTERM, SIGHUP}) sigaction(s, &on_signal, nullptr);
  signal(SIGPIPE, SIG_IGN);
  return pipetrain::Run(options);
}
