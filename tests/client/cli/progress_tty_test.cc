// `pipetrain reference` with a pseudo-terminal as its standard output, as a user at a terminal
// sees it: one live progress line redrawn in place ("\r", erase to end of line), evaluation lines
// printed on lines of their own, the final state ended by a newline; --json is unchanged on a
// terminal. (Plain lines when stdout is not a terminal: cli_test, distributed_test.)
#include <pty.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/run_command.h"

namespace pipetrain {
namespace {

using testing::Example;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kErase[] = "\r\x1b[K";

// Runs `pipetrain ARGS...` on a new 200-column pseudo-terminal (stdout and stderr) with
// TERM=xterm; returns what it wrote (the terminal turns "\n" into "\r\n") and sets `*status` to
// its wait status (-1 if it did not end within 120 s: it is then killed).
std::string RunOnTerminal(const std::vector<std::string>& args, int* status) {
  std::vector<std::string> argv = {PIPETRAIN_BINARY};
  argv.insert(argv.end(), args.begin(), args.end());
  winsize size{};
  size.ws_row = 50;
  size.ws_col = 200;
  int master = -1;
  const pid_t pid = forkpty(&master, nullptr, nullptr, &size);
  if (pid == 0) {
    setenv("TERM", "xterm", 1);
    std::vector<char*> c_args;
    for (const std::string& a : argv) c_args.push_back(const_cast<char*>(a.c_str()));
    c_args.push_back(nullptr);
    execv(c_args[0], c_args.data());
    _exit(127);
  }
  std::string out;
  if (pid < 0) {
    *status = -1;
    return out;
  }
  testing::PipedChild child{pid, master};
  *status = testing::DrainAndWait(child, &out, 120'000);
  return out;
}

TEST(ProgressTtyTest, LiveLineIsRedrawnInPlaceAndEvaluationsGetLinesOfTheirOwn) {
  int status = 0;
  const std::string out =
      RunOnTerminal({"reference", "--model", Example("mlp_digits.textproto"), "--steps", "40",
                     "--batch", "64", "--seed", "1", "--optimizer", "adamw:lr=1e-2", "--eval-every",
                     "20", "--eval-samples", "100"},
                    &status);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status << "\n" << out;
  // The first step is drawn at once, in place, with the total and the time left.
  EXPECT_THAT(out, HasSubstr(absl::StrCat(kErase, "step 1/40  loss ")));
  EXPECT_THAT(out, HasSubstr(" samples/s  ETA "));
  // No plain progress lines on a terminal.
  EXPECT_THAT(out, Not(HasSubstr("step      1  loss")));
  // The evaluation of step 20 erases the live line and takes a line of its own.
  EXPECT_THAT(out, HasSubstr(absl::StrCat(kErase, "step     20  held-out: 100 samples, loss ")));
  // The final line: the last step and the time taken, ended by a newline, then the final
  // evaluation on its own line.
  const size_t final_line = out.rfind(absl::StrCat(kErase, "step 40/40  loss "));
  ASSERT_NE(final_line, std::string::npos) << out;
  const size_t end_of_line = out.find("\r\n", final_line);
  ASSERT_NE(end_of_line, std::string::npos) << out;
  const std::string last = out.substr(final_line + 4, end_of_line - final_line - 4);
  EXPECT_THAT(last, HasSubstr("  in 0:")) << last;
  EXPECT_THAT(last, Not(HasSubstr("\r")));
  EXPECT_THAT(out.substr(end_of_line + 2), ::testing::StartsWith("held-out: 100 samples, loss "));
  // Nothing but the live line is written without a newline: every "\r\n"-separated line either
  // is a whole line of its own or consists of live-line draws.
  for (absl::string_view line : absl::StrSplit(out, "\r\n", absl::SkipEmpty())) {
    if (line.find('\r') == absl::string_view::npos) continue;
    for (absl::string_view draw : absl::StrSplit(line, kErase, absl::SkipEmpty())) {
      EXPECT_TRUE(absl::StartsWith(draw, "step ")) << "garbled: " << line;
    }
  }
}

TEST(ProgressTtyTest, JsonIsUnchangedOnATerminal) {
  int status = 0;
  const std::string out =
      RunOnTerminal({"reference", "--model", Example("mlp_digits.textproto"), "--steps", "3",
                     "--batch", "64", "--seed", "1", "--json", "--eval-samples", "10"},
                    &status);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status << "\n" << out;
  EXPECT_THAT(out, Not(HasSubstr("\x1b[")));
  const std::vector<std::string> lines = absl::StrSplit(out, "\r\n", absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 4u) << out;
  for (int i = 0; i < 3; ++i) EXPECT_THAT(lines[i], HasSubstr(absl::StrCat("{\"step\": ", i + 1)));
  EXPECT_THAT(lines[3], ::testing::StartsWith("{\"eval_loss\": "));
}

}  // namespace
}  // namespace pipetrain
