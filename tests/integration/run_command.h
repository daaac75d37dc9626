// Runs a shell command line and captures its standard output: shared by the integration tests
// that drive the real `pipetrain` binary.
#ifndef PIPETRAIN_TESTS_INTEGRATION_RUN_COMMAND_H_
#define PIPETRAIN_TESTS_INTEGRATION_RUN_COMMAND_H_

#include <sys/wait.h>

#include <cstdio>
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

}  // namespace pipetrain::testing

#endif  // PIPETRAIN_TESTS_INTEGRATION_RUN_COMMAND_H_
