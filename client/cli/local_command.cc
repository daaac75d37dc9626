#include "client/cli/local_command.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "client/cli/interrupt.h"
#include "client/sdk/client.h"
#include "common/io/data_dir.h"
#include "common/util/cpu_set.h"
#include "common/util/status_macros.h"

namespace pipetrain::cli {
namespace {

bool IsExecutable(const std::string& path) {
  struct stat st;
  return !path.empty() && stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
         access(path.c_str(), X_OK) == 0;
}

// The daemon `name`: `given` if set, else next to this binary, else in the build tree, else the
// build-time path. `env`: the environment variable that sets `given` (main.cc), for the message.
absl::StatusOr<std::string> FindBinary(const std::string& given, const std::string& env,
                                       const std::string& name, const std::string& build_subdir,
                                       const std::string& configured) {
  if (!given.empty()) {
    if (IsExecutable(given)) return given;
    return absl::FailedPreconditionError(absl::StrCat("the ", name, " binary ", given, " (from $",
                                                      env, ") is not an executable file"));
  }
  const std::string self = io::ExecutableDirectory();
  std::vector<std::string> candidates = {self + "/" + name,
                                         self + "/../" + build_subdir + "/" + name, configured};
  for (const std::string& c : candidates) {
    if (IsExecutable(c)) return c;
  }
  return absl::FailedPreconditionError(
      absl::StrCat("cannot find the ", name, " binary (looked next to pipetrain, in ",
                   self + "/../" + build_subdir, " and at ", configured, ")"));
}

// A child process started by this command; killed and reaped by StopAll.
struct Child {
  std::string name;
  pid_t pid = -1;
};

// Starts `argv` (argv[0] is the binary's path) with stdout and stderr redirected to `stdout_fd`
// and `stderr_fd` if >= 0, and `close_fd` closed if >= 0.
// The child gets SIGTERM if this process dies (PR_SET_PDEATHSIG), so even a SIGKILL of pipetrain
// leaves no daemon behind.
absl::StatusOr<pid_t> Spawn(const std::vector<std::string>& argv, int stdout_fd, int close_fd,
                            int stderr_fd) {
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) return absl::ResourceExhaustedError(absl::StrCat("fork: ", strerror(errno)));
  if (pid == 0) {
    // Child: only async-signal-safe calls until exec.
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(127);
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    if (stdout_fd >= 0) dup2(stdout_fd, STDOUT_FILENO);
    if (stderr_fd >= 0) dup2(stderr_fd, STDERR_FILENO);
    if (close_fd >= 0) close(close_fd);
    execv(args[0], args.data());
    _exit(127);
  }
  return pid;
}

bool Exited(Child& child) {
  if (child.pid < 0) return true;
  int status = 0;
  const pid_t r = waitpid(child.pid, &status, WNOHANG);
  if (r == child.pid || (r < 0 && errno == ECHILD)) {
    child.pid = -1;
    return true;
  }
  return false;
}

// SIGTERM to every child (workers first, then the coordinator), then waits up to 10 s for all of
// them, SIGKILLing what is left; every child is reaped.
void StopAll(std::vector<Child>& children) {
  for (auto it = children.rbegin(); it != children.rend(); ++it) {
    if (it->pid > 0) kill(it->pid, SIGTERM);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (Child& c : children) {
    while (!Exited(c) && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (c.pid > 0) {
      kill(c.pid, SIGKILL);
      waitpid(c.pid, nullptr, 0);
      c.pid = -1;
    }
  }
}

// A dead child, if any, as an UNAVAILABLE status.
absl::Status CheckChildren(std::vector<Child>& children) {
  for (Child& c : children) {
    if (c.pid > 0 && Exited(c)) {
      return absl::UnavailableError(absl::StrCat(c.name, " exited unexpectedly"));
    }
  }
  return absl::OkStatus();
}

// Reads the coordinator's "coordinator listening on HOST:PORT" line from `fd`.
absl::StatusOr<std::string> ReadCoordinatorAddress(int fd) {
  std::string line;
  char c;
  for (;;) {
    const ssize_t n = read(fd, &c, 1);
    if (n == 1) {
      if (c == '\n') break;
      line.push_back(c);
      if (line.size() > 512) break;
      continue;
    }
    if (n < 0 && errno == EINTR) {
      if (InterruptScope::Interrupted()) return absl::CancelledError("interrupted");
      continue;
    }
    return absl::UnavailableError("the coordinator exited before it served");
  }
  absl::string_view rest = line;
  if (!absl::ConsumePrefix(&rest, "coordinator listening on ")) {
    return absl::UnavailableError(absl::StrCat("unexpected coordinator output: ", line));
  }
  return std::string(rest);
}

// A log file for one daemon's stderr in `dir` (close-on-exec; the child's dup2 copy is not), or
// -1 if it cannot be created (the daemon then inherits our stderr).
int OpenLog(const std::string& dir, const std::string& name) {
  return open((dir + "/" + name + ".log").c_str(), O_CREAT | O_WRONLY | O_TRUNC | O_CLOEXEC, 0644);
}

// Starts the coordinator (on 127.0.0.1, any port) and returns its address once it serves.
absl::StatusOr<std::string> StartCoordinator(const std::string& binary, const std::string& log_dir,
                                             std::vector<Child>& children) {
  int fds[2];
  if (pipe(fds) != 0) return absl::ResourceExhaustedError("pipe failed");
  const int coordinator_log = OpenLog(log_dir, "coordinator");
  absl::StatusOr<pid_t> pid =
      // The local cluster is the user's own: their --save and --resume may be anywhere.
      Spawn({binary, "--listen=127.0.0.1:0", "--checkpoint-root=/"}, fds[1], fds[0],
            coordinator_log);
  close(fds[1]);
  if (coordinator_log >= 0) close(coordinator_log);
  if (!pid.ok()) {
    close(fds[0]);
    return pid.status();
  }
  children.push_back({"coordinator", *pid});
  absl::StatusOr<std::string> address = ReadCoordinatorAddress(fds[0]);
  close(fds[0]);  // the coordinator writes nothing else to stdout.
  return address;
}

// The stage workers `local` starts: one per stage of every replica (R x S).
int LocalWorkerCount(const LocalCommandOptions& o) { return o.train.stages * o.train.replicas; }

// Starts the R x S stage workers, each on `cpus[w]` when given, joining the coordinator at
// `address`.
absl::Status StartWorkers(const LocalCommandOptions& o, const std::string& binary,
                          const std::string& address, const std::vector<std::vector<int>>& cpus,
                          const std::string& log_dir, std::vector<Child>& children) {
  for (int w = 0; w < LocalWorkerCount(o); ++w) {
    const std::string name = absl::StrCat("local-", getpid(), "-", w);
    const int log = OpenLog(log_dir, absl::StrCat("stage_worker-", w));
    std::vector<std::string> argv = {binary, "--coordinator=" + address, "--listen=127.0.0.1:0",
                                     "--name=" + name};
    if (!o.train.training.max_isa.empty()) {
      argv.push_back("--max-isa=" + o.train.training.max_isa);
    }
    if (!cpus.empty()) argv.push_back("--cpus=" + util::FormatCpuList(cpus[w]));
    absl::StatusOr<pid_t> wpid = Spawn(argv, -1, -1, log);
    if (log >= 0) close(log);
    if (!wpid.ok()) return wpid.status();
    children.push_back({absl::StrCat("stage_worker ", w), *wpid});
  }
  return absl::OkStatus();
}

// Waits until every worker (R x S) has registered with the coordinator at `address` (at most
// 60 s).
absl::Status WaitForWorkers(const LocalCommandOptions& o, const std::string& address,
                            std::vector<Child>& children) {
  const int S = LocalWorkerCount(o);
  PT_ASSIGN_OR_RETURN(std::unique_ptr<client::Client> client,
                      client::Client::Connect(address, o.train.client));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  for (;;) {
    if (InterruptScope::Interrupted()) return absl::CancelledError("interrupted");
    PT_RETURN_IF_ERROR(CheckChildren(children));
    PT_ASSIGN_OR_RETURN(std::vector<v1::WorkerInfo> workers, client->ListWorkers());
    if (static_cast<int>(workers.size()) >= S) return absl::OkStatus();
    if (std::chrono::steady_clock::now() > deadline) {
      return absl::UnavailableError(
          absl::StrCat("only ", workers.size(), " of ", S, " workers registered within 60 s"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

// Without --json: where the cluster runs and how its workers are pinned.
void PrintCluster(const LocalCommandOptions& o, const std::string& address,
                  const std::string& log_dir, const std::vector<std::vector<int>>& cpus,
                  size_t allowed_cpus, std::ostream& out) {
  if (o.train.training.json) return;
  const int S = LocalWorkerCount(o);
  out << "local cluster: coordinator on " << address << ", " << S << " stage workers (logs in "
      << log_dir << ")\n";
  if (!cpus.empty()) {
    out << "  worker CPUs:";
    for (int w = 0; w < S; ++w) out << (w == 0 ? " " : " | ") << util::FormatCpuList(cpus[w]);
    out << "\n";
  } else if (o.pin_workers) {
    out << "  workers not pinned: " << S << " x " << o.train.training.threads
        << " compute threads > the " << allowed_cpus << " CPUs here\n";
  }
  out.flush();
}

// Starts the daemons, then trains `prepared` on them.
absl::Status RunCluster(const LocalCommandOptions& o, const LocalDaemons& daemons,
                        PreparedTrain& prepared, const std::string& log_dir,
                        std::vector<Child>& children, std::ostream& out) {
  PT_ASSIGN_OR_RETURN(const std::string address,
                      StartCoordinator(daemons.coordinator, log_dir, children));
  const std::vector<int> allowed = util::AllowedCpus();
  const std::vector<std::vector<int>> cpus =
      o.pin_workers ? util::CpuGroups(allowed, LocalWorkerCount(o), o.train.training.threads)
                    : std::vector<std::vector<int>>();
  PT_RETURN_IF_ERROR(StartWorkers(o, daemons.worker, address, cpus, log_dir, children));
  PT_RETURN_IF_ERROR(WaitForWorkers(o, address, children));
  PrintCluster(o, address, log_dir, cpus, allowed.size(), out);
  TrainCommandOptions train = o.train;
  train.coordinator = address;
  train.own_coordinator = true;  // it stops with this run.
  absl::Status status =
      RunPreparedTrainCommand(train, prepared, out, [] { return InterruptScope::Interrupted(); });
  if (!status.ok()) {
    // A daemon that died explains the failure better than the RPC error it caused.
    absl::Status died = CheckChildren(children);
    if (!died.ok() && !InterruptScope::Interrupted()) {
      return absl::UnavailableError(absl::StrCat(died.message(), " (", status.message(), ")"));
    }
  }
  return status;
}

// The daemons' log directory: `given`, created, or a fresh temporary one.
absl::StatusOr<std::string> MakeLogDir(const std::string& given) {
  if (!given.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(given, ec);
    return given;
  }
  const char* tmp = std::getenv("TMPDIR");
  std::string tmpl =
      absl::StrCat(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp", "/pipetrain-local-XXXXXX");
  if (mkdtemp(tmpl.data()) == nullptr) {
    return absl::UnavailableError(absl::StrCat("cannot create ", tmpl, ": ", strerror(errno)));
  }
  return tmpl;
}

}  // namespace

absl::StatusOr<PreparedTrain> PrepareLocalCommand(const LocalCommandOptions& o,
                                                  LocalDaemons* daemons) {
  // The workers run here, at most at --max-isa: the job's level must be one this CPU runs.
  PT_RETURN_IF_ERROR(ReferenceIsaFor(o.train.training).status());
  // The daemons run here and share this file system (--save, --resume), and the coordinator has
  // its flags' default caps.
  PT_ASSIGN_OR_RETURN(PreparedTrain prepared,
                      PrepareTrainCommand(o.train, job::JobLimits(), /*shares_files=*/true));
  // A bad --save fails before the daemons start (created, and proved writable, only once the job
  // is known to be one that can run).
  PT_RETURN_IF_ERROR(CheckSaveDirectory(o.train.training));
  PT_ASSIGN_OR_RETURN(daemons->coordinator,
                      FindBinary(o.coordinator_binary, kCoordinatorBinaryEnv, "coordinator",
                                 "server/coordinator", PIPETRAIN_COORDINATOR_BINARY));
  PT_ASSIGN_OR_RETURN(daemons->worker,
                      FindBinary(o.worker_binary, kStageWorkerBinaryEnv, "stage_worker",
                                 "server/worker", PIPETRAIN_STAGE_WORKER_BINARY));
  return prepared;
}

absl::Status RunLocalCommand(const LocalCommandOptions& o, std::ostream& out) {
  LocalDaemons daemons;
  PT_ASSIGN_OR_RETURN(PreparedTrain prepared, PrepareLocalCommand(o, &daemons));
  PT_ASSIGN_OR_RETURN(const std::string log_dir, MakeLogDir(o.log_dir));
  InterruptScope interrupts;
  std::vector<Child> children;
  absl::Status status = RunCluster(o, daemons, prepared, log_dir, children, out);
  StopAll(children);
  if (InterruptScope::Interrupted() && !status.ok() && !absl::IsCancelled(status)) {
    status = absl::CancelledError("interrupted");
  }
  if (status.ok() || absl::IsCancelled(status)) {
    if (o.log_dir.empty()) {
      std::error_code ec;
      std::filesystem::remove_all(log_dir, ec);
    }
    return status;
  }
  return absl::Status(status.code(),
                      absl::StrCat(status.message(), " (daemon logs in ", log_dir, ")"));
}

}  // namespace pipetrain::cli
