// Shared by the integration tests that drive the real binaries: running a shell command line and
// capturing its standard output, reading a whole file, a fresh temporary directory, and the path
// of a bundled example.
#ifndef PIPETRAIN_TESTS_INTEGRATION_RUN_COMMAND_H_
#define PIPETRAIN_TESTS_INTEGRATION_RUN_COMMAND_H_

#include <fcntl.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

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

// Starts `argv` (argv[0] a path) with stdout into a pipe and stderr into `stderr_path`.
inline PipedChild SpawnPiped(const std::vector<std::string>& argv, const std::string& stderr_path) {
  PipedChild child;
  int fds[2];
  if (pipe(fds) != 0) return child;
  child.pid = fork();
  if (child.pid == 0) {
    dup2(fds[1], STDOUT_FILENO);
    close(fds[0]);
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

// Reads `child`'s stdout into `*out` until `*out` contains `marker` or the pipe ends; true if it
// does.
inline bool ReadUntil(const PipedChild& child, const std::string& marker, std::string* out) {
  char c;
  while (out->find(marker) == std::string::npos && read(child.out, &c, 1) == 1) out->push_back(c);
  return out->find(marker) != std::string::npos;
}

// Reads the rest of `child`'s stdout into `*out` (so it never blocks on a full pipe), closes it
// and reaps the child; returns its wait status (-1 if waitpid failed).
inline int DrainAndWait(PipedChild& child, std::string* out) {
  char c;
  while (read(child.out, &c, 1) == 1) out->push_back(c);
  close(child.out);
  child.out = -1;
  int status = 0;
  return waitpid(child.pid, &status, 0) == child.pid ? status : -1;
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
