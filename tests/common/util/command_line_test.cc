// ParseCommandLine, help and suggestions against flags defined here. ParseCommandLine sets values
// through absl::ParseCommandLine, meant to run once per process: one test parses successfully;
// the others stop at an error or a help request, before any value is set.
#include "common/util/command_line.h"

#include <fstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "common/util/build_info.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

ABSL_FLAG(int64_t, test_steps, 100, "optimizer steps");
ABSL_FLAG(std::string, test_data_dir, "", "where the data is");
ABSL_FLAG(bool, test_json, false, "JSON lines");
ABSL_FLAG(std::string, test_kind, "", "schedule kind");

namespace pipetrain {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

const ProgramSpec& Program() {
  static const ProgramSpec* const program =
      new ProgramSpec{"prog",
                      "a test program",
                      {{"run", "", "runs", {"test_steps", "test_data_dir", "test_json"}},
                       {"plan", "", "plans", {"test_kind"}}},
                      {},
                      "footer text\n"};
  return *program;
}

absl::StatusOr<CommandLine> Parse(std::vector<std::string> args) {
  args.insert(args.begin(), "prog");
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  return ParseCommandLine(Program(), static_cast<int>(argv.size()), argv.data());
}

std::string TempFile(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + "/" + name;
  std::ofstream(path) << text;
  return path;
}

TEST(ClosestNameTest, SuggestsTyposAndPrefixesOnly) {
  const std::vector<std::string> names = {"steps", "stages", "data_dir", "checkpoint_every"};
  EXPECT_EQ(ClosestName("stpes", names), "steps");
  EXPECT_EQ(ClosestName("data-dri", names), "data_dir");
  EXPECT_EQ(ClosestName("checkpoint", names), "checkpoint_every");
  EXPECT_EQ(ClosestName("frobnicate", names), "");
  EXPECT_EQ(ClosestName("x", {}), "");
}

TEST(CommandLineTest, CommandHelpListsItsFlagsOnlyWithDefaults) {
  const CommandSpec& run = Program().commands[0];
  const std::string help = CommandHelp(Program(), run);
  EXPECT_THAT(help, HasSubstr("usage: prog run [flags]"));
  EXPECT_THAT(help, HasSubstr("  --test-steps (default: 100)\n      optimizer steps\n"));
  EXPECT_THAT(help, HasSubstr("  --test-data-dir (default: none)"));
  EXPECT_THAT(help, HasSubstr("  --test-json (default: false)"));
  EXPECT_THAT(help, ::testing::Not(HasSubstr("test-kind")));
  const std::string all = ProgramHelp(Program(), /*full=*/true);
  EXPECT_THAT(all, HasSubstr("  run   runs\n  plan  plans\n"));
  EXPECT_THAT(all, HasSubstr("--test-kind (default: none)"));
  EXPECT_THAT(all, HasSubstr("footer text"));
}

TEST(CommandLineTest, HelpIsAnsweredBeforeAnythingIsChecked) {
  absl::StatusOr<CommandLine> line = Parse({"run", "--help", "--bogus"});
  ASSERT_TRUE(line.ok()) << line.status();
  EXPECT_EQ(line->help, CommandHelp(Program(), Program().commands[0]));
  line = Parse({"-h"});
  ASSERT_TRUE(line.ok());
  EXPECT_EQ(line->help, ProgramHelp(Program(), false));
  line = Parse({"run", "--helpfull"});
  ASSERT_TRUE(line.ok());
  EXPECT_EQ(line->help, ProgramHelp(Program(), true));
}

// `prog help COMMAND` is `prog COMMAND --help`; `prog help` is `prog --help`; help on an unknown
// command is that unknown command, for the caller to name.
TEST(CommandLineTest, HelpCommandIsTheCommandsHelp) {
  absl::StatusOr<CommandLine> line = Parse({"help", "run"});
  ASSERT_TRUE(line.ok()) << line.status();
  EXPECT_EQ(line->help, CommandHelp(Program(), Program().commands[0]));
  line = Parse({"help", "plan", "--test-steps=3"});
  ASSERT_TRUE(line.ok()) << line.status();
  EXPECT_EQ(line->help, CommandHelp(Program(), Program().commands[1]));
  line = Parse({"help"});
  ASSERT_TRUE(line.ok()) << line.status();
  EXPECT_EQ(line->help, ProgramHelp(Program(), false));
  EXPECT_THAT(line->help, HasSubstr("`prog help COMMAND` (or `prog COMMAND --help`)"));
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"help", "bogus"}, std::vector<std::string>{"bogus", "--help"}}) {
    line = Parse(args);
    ASSERT_TRUE(line.ok()) << line.status();
    EXPECT_TRUE(line->help.empty());
    EXPECT_EQ(line->command, nullptr);
    EXPECT_EQ(line->command_name, "bogus");
  }
}

// With topics, a command's flags are listed under the first topic naming them, in the topic's
// order, the rest under "other"; flag files last. Commands likewise in the program's help.
TEST(CommandLineTest, HelpGroupsFlagsAndCommandsUnderTopics) {
  ProgramSpec program{
      "prog",
      "a test program",
      {{"run", "", "runs", {"test_json", "test_steps", "test_kind", "test_data_dir"}},
       {"plan", "", "plans", {"test_kind"}}},
      {},
      ""};
  program.flag_topics = {{"data", {"test_data_dir", "test_steps"}},
                         {"output", {"test_json", "test_steps"}},
                         {"unused", {"test_nothing"}}};
  program.command_topics = {{"doing", {"run"}}};
  const std::string run = CommandHelp(program, program.commands[0]);
  EXPECT_THAT(run,
              HasSubstr("dashes or underscores):\n\ndata:\n  --test-data-dir (default: none)\n"));
  EXPECT_THAT(run, ::testing::ContainsRegex("\ndata:\n  --test-data-dir .*\n.*\n  --test-steps "));
  EXPECT_THAT(run, ::testing::ContainsRegex("\noutput:\n  --test-json .*\n.*\n\nother:\n"
                                            "  --test-kind "));
  EXPECT_THAT(run, HasSubstr("\nflag files:\n  --flagfile FILE\n"));
  EXPECT_THAT(run, Not(HasSubstr("unused")));
  const std::string plan = CommandHelp(program, program.commands[1]);
  EXPECT_THAT(plan, Not(HasSubstr("data:")));
  EXPECT_THAT(plan, HasSubstr("\nother:\n  --test-kind"));
  const std::string all = ProgramHelp(program, /*full=*/false);
  EXPECT_THAT(all, HasSubstr("\ndoing:\n  run   runs\n\nother commands:\n  plan  plans\n"));
}

// The default --help shows: the command's, else the program's, else the flag's own; "required".
TEST(CommandLineTest, HelpShowsTheDefaultTheCommandUses) {
  const ProgramSpec program{"prog",
                            "a test program",
                            {{"run",
                              "",
                              "runs",
                              {"test_steps", "test_data_dir", "test_kind"},
                              {{"test_kind", kRequired}, {"test_steps", "the data's"}}},
                             {"plan", "", "plans", {"test_steps", "test_data_dir"}}},
                            {},
                            "",
                            {{"test_data_dir", "$TEST_DATA_DIR"}, {"test_steps", "never shown"}}};
  const std::string run = CommandHelp(program, program.commands[0]);
  EXPECT_THAT(run, HasSubstr("  --test-steps (default: the data's)\n      optimizer steps\n"));
  EXPECT_THAT(run, HasSubstr("  --test-data-dir (default: $TEST_DATA_DIR)\n"));
  EXPECT_THAT(run, HasSubstr("  --test-kind (required)\n      schedule kind\n"));
  const std::string plan = CommandHelp(program, program.commands[1]);
  EXPECT_THAT(plan, HasSubstr("  --test-steps (default: never shown)\n"));
  EXPECT_THAT(plan, HasSubstr("  --test-data-dir (default: $TEST_DATA_DIR)\n"));
  // A daemon's (no commands): the program's.
  const ProgramSpec daemon{
      "d", "a daemon", {}, {"test_data_dir", "test_json"}, "", {{"test_data_dir", kRequired}}};
  const std::string help = ProgramHelp(daemon, false);
  EXPECT_THAT(help, HasSubstr("  --test-data-dir (required)\n"));
  EXPECT_THAT(help, HasSubstr("  --test-json (default: false)\n"));
}

// --version anywhere prints "NAME VERSION[ (commit X)]" and nothing else is checked or parsed.
TEST(CommandLineTest, VersionIsAnsweredBeforeAnythingIsChecked) {
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"--version"}, std::vector<std::string>{"run", "--version"},
        std::vector<std::string>{"bogus", "--bogus", "--version", "--help"}}) {
    absl::StatusOr<CommandLine> line = Parse(args);
    ASSERT_TRUE(line.ok()) << line.status();
    EXPECT_EQ(line->help, util::VersionLine("prog") + "\n");
  }
  EXPECT_THAT(
      util::VersionLine("prog"),
      ::testing::MatchesRegex("prog [0-9]+\\.[0-9]+\\.[0-9]+( \\(commit [0-9a-f]{12}\\))?"));
  EXPECT_EQ(util::VersionLine("prog"), util::GitCommit().empty()
                                           ? absl::StrCat("prog ", util::ProjectVersion())
                                           : absl::StrCat("prog ", util::ProjectVersion(),
                                                          " (commit ", util::GitCommit(), ")"));
}

TEST(CommandLineTest, UnknownAndForeignFlagsAreRefusedWithASuggestion) {
  absl::StatusOr<CommandLine> line = Parse({"run", "--test-stpes=3"});
  EXPECT_EQ(line.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(line.status().message(),
              HasSubstr("unknown flag --test-stpes (did you mean --test-steps?); `prog run --help` "
                        "lists its flags"));
  // Given at its default value, still refused: what counts is that it was given.
  line = Parse({"plan", "--test_steps", "100"});
  EXPECT_EQ(line.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(line.status().message(), HasSubstr("--test-steps not used by `prog plan`"));
  line = Parse({"run", "--notest-json", "--test-kind="});
  EXPECT_THAT(line.status().message(), HasSubstr("--test-kind not used by `prog run`"));
  line = Parse({"run", "--test-steps"});
  EXPECT_THAT(line.status().message(), HasSubstr("--test-steps needs a value"));
}

TEST(CommandLineTest, FlagfileErrorsNameTheFileAndLine) {
  absl::StatusOr<CommandLine> line = Parse({"run", "--flagfile", "/nonexistent/flags"});
  EXPECT_EQ(line.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(line.status().message(), HasSubstr("--flagfile /nonexistent/flags: cannot read it"));
  const std::string bad = TempFile("bad_flags", "# comment\n--test-steps=3\nsteps 3\n");
  line = Parse({"run", "--flagfile=" + bad});
  EXPECT_EQ(line.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(line.status().message(), HasSubstr(bad + ":3: expected --flag=value, got 'steps 3'"));
  const std::string loop = ::testing::TempDir() + "/loop_flags";
  TempFile("loop_flags", "--flagfile=" + loop + "\n");
  line = Parse({"run", "--flagfile=" + loop});
  EXPECT_THAT(line.status().message(), HasSubstr("nested more than 10 deep"));
  const std::string lone = TempFile("lone_flags", "--test-steps\n");
  line = Parse({"run", "--flagfile", lone, "7"});
  EXPECT_THAT(line.status().message(), HasSubstr("--test-steps needs a value (in " + lone + ":1)"));
}

// The one successful parse of this process: dashes, a flag file, a value after "--".
TEST(CommandLineTest, ParsesDashesFlagfilesAndArguments) {
  const std::string file =
      TempFile("good_flags", "  --test-data-dir  /data dir \n#x\n\n--test_json\n");
  absl::StatusOr<CommandLine> line =
      Parse({"--test-steps", "-5", "run", "--flagfile", file, "arg", "--", "--test-kind"});
  ASSERT_TRUE(line.ok()) << line.status();
  EXPECT_TRUE(line->help.empty());
  ASSERT_NE(line->command, nullptr);
  EXPECT_EQ(line->command->name, "run");
  EXPECT_EQ(line->args, (std::vector<std::string>{"arg", "--test-kind"}));
  EXPECT_TRUE(line->Given("test_steps"));
  EXPECT_TRUE(line->Given("test_data_dir"));
  EXPECT_TRUE(line->Given("test_json"));
  EXPECT_FALSE(line->Given("test_kind"));
  EXPECT_EQ(absl::GetFlag(FLAGS_test_steps), -5);
  EXPECT_EQ(absl::GetFlag(FLAGS_test_data_dir), "/data dir");
  EXPECT_TRUE(absl::GetFlag(FLAGS_test_json));
}

}  // namespace
}  // namespace pipetrain
