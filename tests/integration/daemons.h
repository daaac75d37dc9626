// The daemons of a multi-process integration test: one `coordinator` and N `stage_worker`
// processes on 127.0.0.1, started by the test (fork/exec) and signalled by their PIDs only, and a
// client SDK connection to the coordinator. The including test defines PIPETRAIN_COORDINATOR_BINARY
// and PIPETRAIN_STAGE_WORKER_BINARY (the binaries' paths).
#ifndef PIPETRAIN_TESTS_INTEGRATION_DAEMONS_H_
#define PIPETRAIN_TESTS_INTEGRATION_DAEMONS_H_

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/sdk/client.h"
#include "common/model/model.h"
#include "tests/integration/run_command.h"

namespace pipetrain::testing {

// Starts `argv` with stdout and stderr appended to `log`; returns its PID (-1 on failure).
inline pid_t Spawn(const std::vector<std::string>& argv, const std::string& log) {
  const pid_t pid = fork();
  if (pid != 0) return pid;
  const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  if (fd >= 0) {
    dup2(fd, STDOUT_FILENO);
    dup2(fd, STDERR_FILENO);
  }
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  execv(args[0], args.data());
  _exit(127);
}

// The {"step": ...} lines of --json output, comparable between a pipeline and the reference: a
// pipeline's up to its timings (from "step_ms" on), the reference's without the closing brace.
inline std::vector<std::string> StepLines(const std::string& out, bool pipeline) {
  std::vector<std::string> lines;
  for (absl::string_view line : absl::StrSplit(out, '\n')) {
    if (!absl::StartsWith(line, "{\"step\"")) continue;
    lines.emplace_back(pipeline ? line.substr(0, line.find(", \"step_ms"))
                                : line.substr(0, line.size() - 1));
  }
  return lines;
}

// The checkpoint layer files (layer-NNNNN.safetensors, first 16 layers) `want_dir` holds, and
// those of them that `got_dir` lacks or holds with other bytes.
struct LayerFiles {
  int compared = 0;
  std::vector<std::string> differ;
};
inline LayerFiles CompareLayerFiles(const std::string& want_dir, const std::string& got_dir) {
  LayerFiles files;
  for (int l = 0; l < 16; ++l) {
    const std::string f =
        absl::StrCat("layer-", std::string(5 - std::to_string(l).size(), '0'), l, ".safetensors");
    const std::string want = ReadFile(want_dir + "/" + f);
    if (want.empty()) continue;
    ++files.compared;
    if (ReadFile(got_dir + "/" + f) != want) files.differ.push_back(f);
  }
  return files;
}

// `pipetrain train` of the example digits MLP over 2 stages for a million steps (--json, and
// `extra` flags) against the coordinator at `address`, stdout piped, stderr into `stderr_path`: a
// run that only ends when something stops it.
inline PipedChild SpawnEndlessTrain(const std::string& address, const std::string& stderr_path,
                                    const std::vector<std::string>& extra = {}) {
  std::vector<std::string> argv = {
      PIPETRAIN_BINARY, "train",   "--coordinator",  address,
      "--stages",       "2",       "--model",        Example("mlp_digits.textproto"),
      "--batch",        "16",      "--microbatches", "2",
      "--steps",        "1000000", "--json"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return SpawnPiped(argv, stderr_path);
}

// `pipetrain reference` with `flags` (each with a leading space), one evaluation sample, its final
// checkpoint saved in `save_dir`; its output (stderr included) and exit code.
inline CommandRun RunReference(const std::string& flags, const std::string& save_dir) {
  return RunCommand(absl::StrCat(PIPETRAIN_BINARY, " reference", flags, " --eval-samples 1 --save ",
                                 save_dir, " 2>&1"));
}

// `pipetrain train --coordinator <address>`, then `train_flags`, then the words of `flags`, stderr
// into `stderr_path` and stdout into a one-page pipe (4096 bytes): while the test does not read,
// the run blocks on its output a few dozen steps later, so it cannot end before what the test does
// meanwhile (a fault, a joining worker) has landed. pid -1 if it could not be started.
inline PipedChild SpawnThrottledTrain(const std::string& address,
                                      const std::vector<std::string>& train_flags,
                                      const std::string& flags, const std::string& stderr_path) {
  std::vector<std::string> argv = {PIPETRAIN_BINARY, "train", "--coordinator", address};
  argv.insert(argv.end(), train_flags.begin(), train_flags.end());
  for (absl::string_view f : absl::StrSplit(flags, ' ', absl::SkipEmpty())) argv.emplace_back(f);
  return SpawnPiped(argv, stderr_path, /*pipe_bytes=*/4096);
}

// The spec of a job training the example digits MLP over `stages` stages: 1F1B, 2 micro-batches,
// SGD lr 0.1, one thread, seed 0 (callers adjust what they need).
inline absl::StatusOr<v1::JobSpec> DigitsJobSpec(int stages) {
  absl::StatusOr<v1::ModelSpec> model =
      model::ParseModelSpecText(ReadFile(Example("mlp_digits.textproto")), "mlp");
  if (!model.ok()) return model.status();
  v1::JobSpec job;
  *job.mutable_model() = *model;
  job.mutable_optimizer()->mutable_sgd()->set_lr(0.1f);
  job.set_schedule("1f1b");
  job.set_stages(stages);
  job.set_microbatches(2);
  job.set_threads(1);
  return job;
}

// A coordinator and its workers, stopped when destroyed. Not thread-safe.
class Daemons {
 public:
  Daemons() = default;
  ~Daemons() { Stop(); }  // a test checks Stop() itself.
  Daemons(const Daemons&) = delete;
  Daemons& operator=(const Daemons&) = delete;

  // Starts the coordinator (--listen 127.0.0.1:0 and `coordinator_flags`) and `workers` workers
  // named `name_prefix` + N (w0, w1, … by default; --coordinator, --listen 127.0.0.1:0, --name and
  // `worker_flags`, in which "{w}" stands for N, e.g. a certificate per worker) with their logs in
  // `dir` (coordinator.log, worker-N.log), connects client() and waits (at most 30 s) until every
  // worker has registered. `client_options` are the client()'s (e.g. its TLS and token). Returns
  // "" on success, else what failed and the log that says why.
  std::string Start(const std::string& dir, int workers,
                    const std::vector<std::string>& coordinator_flags = {},
                    const std::vector<std::string>& worker_flags = {},
                    const client::ClientOptions& client_options = {},
                    const std::string& name_prefix = "w") {
    dir_ = dir;
    coordinator_flags_ = coordinator_flags;
    if (std::string error = StartCoordinator("127.0.0.1:0"); !error.empty()) return error;
    for (int w = 0; w < workers; ++w) {
      std::vector<std::string> worker = {PIPETRAIN_STAGE_WORKER_BINARY,
                                         "--coordinator",
                                         address_,
                                         "--listen",
                                         "127.0.0.1:0",
                                         "--name",
                                         absl::StrCat(name_prefix, w)};
      for (const std::string& flag : worker_flags) {
        worker.push_back(absl::StrReplaceAll(flag, {{"{w}", absl::StrCat(w)}}));
      }
      const pid_t pid = Spawn(worker, absl::StrCat(dir, "/worker-", w, ".log"));
      if (pid <= 0) return "cannot start a worker";
      workers_.push_back(pid);
    }
    absl::StatusOr<std::unique_ptr<client::Client>> c =
        client::Client::Connect(address_, client_options);
    if (!c.ok()) return c.status().ToString();
    client_ = *std::move(c);
    // Each worker measures its GFLOP/s before it registers.
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    while (absl::Now() < deadline) {
      absl::StatusOr<std::vector<v1::WorkerInfo>> listed = client_->ListWorkers();
      if (!listed.ok()) return listed.status().ToString();
      if (static_cast<int>(listed->size()) == workers) return "";
      absl::SleepFor(absl::Milliseconds(10));
    }
    return absl::StrCat("the workers did not register: ", ReadFile(dir + "/worker-0.log"));
  }

  // SIGTERM (and SIGCONT, for a stopped one) to every daemon still running, then waits for them.
  // The client is closed first. Returns "" if each one ended by exiting, by that SIGTERM or by a
  // test's SIGKILL, else which died of another signal on the way out (a crash in shutdown, or a
  // sanitizer's report at exit, e.g. LeakSanitizer's), with its log.
  std::string Stop() {
    client_.reset();
    std::vector<std::pair<pid_t, std::string>> all;
    for (size_t w = 0; w < workers_.size(); ++w) {
      all.emplace_back(workers_[w], absl::StrCat(dir_, "/worker-", w, ".log"));
    }
    all.emplace_back(coordinator_, dir_ + "/coordinator.log");
    for (const auto& [pid, log] : all) {
      if (pid <= 0) continue;
      kill(pid, SIGTERM);
      kill(pid, SIGCONT);
    }
    std::string problems;
    for (const auto& [pid, log] : all) {
      if (pid <= 0) continue;
      int status = 0;
      if (waitpid(pid, &status, 0) == pid && WIFSIGNALED(status) && WTERMSIG(status) != SIGTERM &&
          WTERMSIG(status) != SIGKILL) {
        absl::StrAppend(&problems, "daemon ", pid, " died of signal ", WTERMSIG(status),
                        " when stopped; its log ", log, ":\n", ReadFile(log));
      }
    }
    workers_.clear();
    coordinator_ = -1;
    return problems;
  }

  // SIGKILLs the coordinator and waits for it.
  void KillCoordinator() {
    if (coordinator_ <= 0) return;
    kill(coordinator_, SIGKILL);
    waitpid(coordinator_, nullptr, 0);
    coordinator_ = -1;
  }

  // Starts the coordinator again with Start's flags on the port it had (its log appended to);
  // "" on success, else why it did not start. The client reconnects by itself.
  std::string RestartCoordinator() { return StartCoordinator(address_); }

  // Waits for worker `w` (killed by the caller) and forgets it, so Stop signals no stale PID.
  void Reap(size_t w) {
    if (w >= workers_.size() || workers_[w] <= 0) return;
    waitpid(workers_[w], nullptr, 0);
    workers_[w] = -1;
  }

  // SIGKILLs the worker Start named `name` ("w" + N: the name the coordinator reports, e.g. a
  // stage's worker) and waits for it (Reap). Returns "" on success, else why not: a name Start
  // did not give, a worker already reaped, or kill failing.
  std::string KillWorker(const std::string& name) {
    absl::string_view digits = name;
    size_t w = 0;
    if (!absl::ConsumePrefix(&digits, "w") || !absl::SimpleAtoi(digits, &w) ||
        w >= workers_.size()) {
      return absl::StrCat("no worker '", name, "' of ", workers_.size(), " started");
    }
    if (workers_[w] <= 0) return absl::StrCat("worker '", name, "' is already gone");
    if (kill(workers_[w], SIGKILL) != 0) {
      return absl::StrCat("kill(", workers_[w], ", SIGKILL) of worker '", name, "' failed");
    }
    Reap(w);
    return "";
  }

  // The coordinator's HOST:PORT.
  const std::string& address() const { return address_; }
  pid_t coordinator() const { return coordinator_; }
  const std::vector<pid_t>& workers() const { return workers_; }
  // Connected to the coordinator by Start().
  client::Client& client() { return *client_; }

 private:
  // Starts the coordinator on `listen` and learns its address; "" or what failed.
  std::string StartCoordinator(const std::string& listen) {
    std::vector<std::string> argv = {PIPETRAIN_COORDINATOR_BINARY, "--listen", listen};
    argv.insert(argv.end(), coordinator_flags_.begin(), coordinator_flags_.end());
    const std::string coordinator_log = dir_ + "/coordinator.log";
    PipedChild coordinator = SpawnPiped(argv, coordinator_log);
    if (coordinator.pid <= 0) return "cannot start the coordinator";
    coordinator_ = coordinator.pid;
    // It prints "coordinator listening on HOST:PORT" once it serves, and nothing else.
    std::string line;
    const bool listening = ReadUntil(coordinator, "\n", &line, 30000);
    close(coordinator.out);
    absl::string_view rest = absl::StripAsciiWhitespace(line);
    if (!listening || !absl::ConsumePrefix(&rest, "coordinator listening on ")) {
      return absl::StrCat("the coordinator did not start: '", line, "' ",
                          ReadFile(coordinator_log));
    }
    address_ = std::string(rest);
    return "";
  }

  std::string dir_;
  std::vector<std::string> coordinator_flags_;
  std::string address_;
  pid_t coordinator_ = -1;
  std::vector<pid_t> workers_;
  std::unique_ptr<client::Client> client_;
};

}  // namespace pipetrain::testing

#endif  // PIPETRAIN_TESTS_INTEGRATION_DAEMONS_H_
