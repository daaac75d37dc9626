// Shared by the integration tests that drive the real binaries: running a shell command line and
// capturing its standard output, reading a whole file, a fresh temporary directory, and the path
// of a bundled example.
#ifndef PIPETRAIN_TESTS_INTEGRATION_RUN_COMMAND_H_
#define PIPETRAIN_TESTS_INTEGRATION_RUN_COMMAND_H_

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace pipetrain::testing {

struct CommandRun {
  int exit_code = -1;  // -1 if the command could not be started or did not exit normally.
  std::string out;     // what the command wrote to standard output.
};

// Runs `command` through /bin/sh (redirections included) and waits for it.
inline CommandRun RunCommand(const std::string& command) {
  CommandRun run;
  FILE* p = popen(command.c_str(), "r");
  if (p == nullptr) return run;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) run.out.append(buf, n);
  const int status = pclose(p);
  run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return run;
}

// A child process whose standard output the test reads through a pipe.
struct PipedChild {
  pid_t pid = -1;  // -1 if it could not be started.
  int out = -1;    // read end of its stdout.
};

// Starts `argv` (argv[0] a path) with stdout into a pipe and stderr into `stderr_path`. The pipe is
// close-on-exec, so that processes started later do not hold it open. `pipe_bytes` > 0 sets the
// pipe's capacity before the child starts (4096, one page: the child blocks in its writes a few
// dozen lines ahead of the reader); -1 pid if it cannot.
inline PipedChild SpawnPiped(const std::vector<std::string>& argv, const std::string& stderr_path,
                             int pipe_bytes = 0) {
  PipedChild child;
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return child;
  if (pipe_bytes > 0 && fcntl(fds[0], F_SETPIPE_SZ, pipe_bytes) < 0) {
    close(fds[0]);
    close(fds[1]);
    return child;
  }
  child.pid = fork();
  if (child.pid == 0) {
    dup2(fds[1], STDOUT_FILENO);
    const int err = open(stderr_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (err >= 0) dup2(err, STDERR_FILENO);
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  close(fds[1]);
  child.out = fds[0];
  return child;
}

// How ReadWhile stopped.
enum class ReadEnd { kDone, kEndOfPipe, kTimeout };

// Appends what `child` writes to its stdout to `*out` until `done(*out)`, the pipe ends (or fails),
// or `timeout_ms` milliseconds pass (-1: no limit).
template <typename Done>
ReadEnd ReadWhile(const PipedChild& child, int timeout_ms, std::string* out, Done done) {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point end = Clock::now() + std::chrono::milliseconds(timeout_ms);
  char c;
  while (!done(*out)) {
    int wait = -1;
    if (timeout_ms >= 0) {
      wait = static_cast<int>(std::max<int64_t>(
          0, std::chrono::duration_cast<std::chrono::milliseconds>(end - Clock::now()).count()));
    }
    pollfd ready{child.out, POLLIN, 0};
    const int r = poll(&ready, 1, wait);
    if (r < 0 && errno == EINTR) continue;
    if (r == 0) return ReadEnd::kTimeout;
    if (r < 0 || read(child.out, &c, 1) != 1) return ReadEnd::kEndOfPipe;
    out->push_back(c);
  }
  return ReadEnd::kDone;
}

// Reads `child`'s stdout into `*out` until `*out` contains `marker`, the pipe ends or `timeout_ms`
// milliseconds pass (-1: no limit); true if it does.
inline bool ReadUntil(const PipedChild& child, const std::string& marker, std::string* out,
                      int timeout_ms = -1) {
  return ReadWhile(child, timeout_ms, out, [&marker](const std::string& s) {
           return s.find(marker) != std::string::npos;
         }) == ReadEnd::kDone;
}

// Reads the rest of `child`'s stdout into `*out` (so it never blocks on a full pipe), closes it
// and reaps the child; returns its wait status. -1 if waitpid failed, or if the pipe did not end
// within `timeout_ms` milliseconds (-1: no limit): the child is then killed (SIGKILL) and reaped.
inline int DrainAndWait(PipedChild& child, std::string* out, int timeout_ms = -1) {
  const bool ended = ReadWhile(child, timeout_ms, out, [](const std::string&) { return false; }) ==
                     ReadEnd::kEndOfPipe;
  close(child.out);
  child.out = -1;
  if (!ended) kill(child.pid, SIGKILL);
  int status = 0;
  return waitpid(child.pid, &status, 0) == child.pid && ended ? status : -1;
}

// The whole contents of `path` ("" if it cannot be read).
inline std::string ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// A new directory "<$TEST_TMPDIR or /tmp>/<prefix>XXXXXX" ("" on failure).
inline std::string TempDir(const std::string& prefix) {
  const char* base = std::getenv("TEST_TMPDIR");
  std::string tmpl = std::string(base != nullptr ? base : "/tmp") + "/" + prefix + "XXXXXX";
  char* made = mkdtemp(tmpl.data());
  return made == nullptr ? "" : std::string(made);
}

#ifdef PIPETRAIN_SOURCE_DIR
// The path of examples/`name` in the source tree.
inline std::string Example(const std::string& name) {
  return std::string(PIPETRAIN_SOURCE_DIR) + "/examples/" + name;
}
#endif

}  // namespace pipetrain::testing

#endif  // PIPETRAIN_TESTS_INTEGRATION_RUN_COMMAND_H_
