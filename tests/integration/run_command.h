// Shared by the integration tests that drive the real binaries: running a shell command line and
// capturing its standard output, reading a whole file, a fresh temporary directory, and the path
// of a bundled example.
#ifndef PIPETRAIN_TESTS_INTEGRATION_RUN_COMMAND_H_
#define PIPETRAIN_TESTS_INTEGRATION_RUN_COMMAND_H_

#include <stdlib.h>
#include <sys/wait.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

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
