// The first hour of a new user (issue 33), through the real binaries: help as a command, help
// texts whose shown default is the one the command uses, required flags named with what they are,
// the spellings the commands share, and --version.
#include <regex>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/daemons.h"
#include "tests/integration/run_command.h"

namespace pipetrain {
namespace {

using testing::CommandRun;
using ::testing::HasSubstr;
using ::testing::Not;

CommandRun RunBinary(const std::string& binary, const std::string& args) {
  return testing::RunCommand(binary + " " + args + " 2>&1");
}
CommandRun Pipetrain(const std::string& args) { return RunBinary(PIPETRAIN_BINARY, args); }

const std::vector<std::string> kCommands = {
    "reference", "schedule", "partition", "plan",      "train",  "local",
    "evaluate",  "generate", "predict",   "tokenizer", "export", "import",
    "jobs",      "workers",  "status",    "watch",     "cancel", "checkpoint"};

// One flag of a help text: "  --name (default: X)" or "  --name (required)", and its meaning
// (the indented lines below it, joined).
struct FlagEntry {
  std::string name;     // "--stages"
  std::string shown;    // "default: 1", "required"
  std::string meaning;  // "pipeline stages (S), >= 1"
};

std::vector<FlagEntry> FlagEntries(const std::string& help) {
  std::vector<FlagEntry> out;
  const std::regex head(R"(^  (--[a-z][a-z0-9-]*) \((.*)\)$)");
  for (absl::string_view line : absl::StrSplit(help, '\n')) {
    std::smatch m;
    const std::string text(line);
    if (std::regex_match(text, m, head)) {
      out.push_back({m[1], m[2], ""});
    } else if (!out.empty() && absl::StartsWith(line, "      ")) {
      out.back().meaning += " " + std::string(absl::StripAsciiWhitespace(line));
    }
  }
  return out;
}

// The shown default of `flag` in `help` ("" if the flag is not listed).
std::string Shown(const std::string& help, const std::string& flag) {
  for (const FlagEntry& e : FlagEntries(help)) {
    if (e.name == flag) return e.shown;
  }
  return "";
}

// `pipetrain help COMMAND` is `pipetrain COMMAND --help`; `pipetrain help` is `pipetrain --help`.
TEST(HelpCommandTest, HelpCommandPrintsTheCommandsHelp) {
  for (const std::string& command : kCommands) {
    SCOPED_TRACE(command);
    const CommandRun help = Pipetrain("help " + command);
    EXPECT_EQ(help.exit_code, 0) << help.out;
    EXPECT_THAT(help.out, HasSubstr("usage: pipetrain " + command));
    EXPECT_EQ(help.out, Pipetrain(command + " --help").out);
  }
  const CommandRun help = Pipetrain("help");
  EXPECT_EQ(help.exit_code, 0) << help.out;
  EXPECT_EQ(help.out, Pipetrain("--help").out);
  EXPECT_THAT(help.out, HasSubstr("`pipetrain help COMMAND` (or `pipetrain COMMAND --help`)"));
  // An unknown command is named, with the list of commands, whichever way help was asked for.
  for (const std::string args : {"help trian", "trian --help"}) {
    SCOPED_TRACE(args);
    const CommandRun r = Pipetrain(args);
    EXPECT_EQ(r.exit_code, 2) << r.out;
    EXPECT_THAT(r.out, HasSubstr("unknown command 'trian'"));
    EXPECT_THAT(r.out, HasSubstr("commands:"));
  }
}

// The audit of issue 33: a shown default is what happens, not a placeholder the meaning then has
// to explain — no "(default: 0)" whose text says "0: every CPU", no "(default: none)" (an empty
// string) whose text says "empty: ...". Where 0 or "" stands for something, the help shows that.
TEST(HelpDefaultsTest, NoShownDefaultIsAPlaceholderTheMeaningExplains) {
  std::vector<std::pair<std::string, std::string>> helps;  // (what, help text)
  for (const std::string& command : kCommands) {
    helps.emplace_back("pipetrain " + command, Pipetrain(command + " --help").out);
  }
  helps.emplace_back("coordinator", RunBinary(PIPETRAIN_COORDINATOR_BINARY, "--help").out);
  helps.emplace_back("stage_worker", RunBinary(PIPETRAIN_STAGE_WORKER_BINARY, "--help").out);
  const std::regex explains_zero(R"((^|[ (;,])0: )");
  const std::regex explains_empty(R"((^|[ (;,])(empty|"")[:,] )", std::regex::icase);
  for (const auto& [what, help] : helps) {
    SCOPED_TRACE(what);
    EXPECT_THAT(help, Not(HasSubstr("(default: \"\")")));
    for (const FlagEntry& e : FlagEntries(help)) {
      if (e.shown == "default: 0") {
        EXPECT_FALSE(std::regex_search(" " + e.meaning, explains_zero)) << e.name << e.meaning;
      }
      if (e.shown == "default: none") {
        EXPECT_FALSE(std::regex_search(" " + e.meaning, explains_empty)) << e.name << e.meaning;
      }
    }
  }
  EXPECT_EQ(Shown(Pipetrain("train --help").out, "--lr-decay-steps"), "default: --steps");
  EXPECT_EQ(Shown(Pipetrain("train --help").out, "--checkpoint-every"), "default: only at the end");
  EXPECT_EQ(Shown(Pipetrain("train --help").out, "--trace-steps"), "default: the last step");
  EXPECT_EQ(Shown(RunBinary(PIPETRAIN_STAGE_WORKER_BINARY, "--help").out, "--threads-max"),
            "default: every CPU this worker may run on");
  EXPECT_EQ(Shown(RunBinary(PIPETRAIN_COORDINATOR_BINARY, "--help").out, "--state-dir"),
            "default: none: jobs do not survive a restart");
}

// Each flag's default is stated once, in "(default: X)", and is what the command does when the
// flag is not given: no meaning text adds "1 if not given" or "default ..." of its own.
TEST(HelpDefaultsTest, NoMeaningContradictsTheShownDefault) {
  std::vector<std::pair<std::string, std::string>> helps;  // (what, help text)
  for (const std::string& command : kCommands) {
    helps.emplace_back("pipetrain " + command, Pipetrain(command + " --help").out);
  }
  helps.emplace_back("coordinator", RunBinary(PIPETRAIN_COORDINATOR_BINARY, "--help").out);
  helps.emplace_back("stage_worker", RunBinary(PIPETRAIN_STAGE_WORKER_BINARY, "--help").out);
  const std::regex states_a_default(R"(default|if not given|required)", std::regex::icase);
  for (const auto& [what, help] : helps) {
    SCOPED_TRACE(what);
    const std::vector<FlagEntry> entries = FlagEntries(help);
    EXPECT_GE(entries.size(), 3u) << help;  // the help was parsed (import has 3).
    for (const FlagEntry& e : entries) {
      EXPECT_FALSE(std::regex_search(e.meaning, states_a_default))
          << e.name << " (" << e.shown << "):" << e.meaning;
    }
  }
  // --stages: 1 for the training commands, required where there is nothing to default to.
  EXPECT_EQ(Shown(Pipetrain("train --help").out, "--model"), "required");
  EXPECT_EQ(Shown(Pipetrain("train --help").out, "--stages"), "default: 1");
  EXPECT_EQ(Shown(Pipetrain("local --help").out, "--stages"), "default: 1");
  EXPECT_EQ(Shown(Pipetrain("schedule --help").out, "--stages"), "required");
  EXPECT_EQ(Shown(Pipetrain("partition --help").out, "--stages"), "required");
  // --eval-samples: 1000 where an evaluation always runs; none where it runs only when asked.
  EXPECT_EQ(Shown(Pipetrain("reference --help").out, "--eval-samples"), "default: 1000");
  EXPECT_EQ(Shown(Pipetrain("evaluate --help").out, "--eval-samples"), "default: 1000");
  EXPECT_EQ(Shown(Pipetrain("train --help").out, "--eval-samples"), "default: none");
  // What an empty flag stands for.
  EXPECT_EQ(Shown(Pipetrain("jobs --help").out, "--coordinator"),
            "default: $PIPETRAIN_COORDINATOR");
  EXPECT_EQ(Shown(Pipetrain("schedule --help").out, "--format"), "default: ascii");
  EXPECT_EQ(Shown(Pipetrain("partition --help").out, "--format"), "default: text");
  EXPECT_EQ(Shown(RunBinary(PIPETRAIN_STAGE_WORKER_BINARY, "--help").out, "--cpus"),
            "default: all the process may use");
  EXPECT_EQ(Shown(RunBinary(PIPETRAIN_STAGE_WORKER_BINARY, "--help").out, "--coordinator"),
            "required");
  // A flag whose own default is what happens keeps it.
  EXPECT_EQ(Shown(Pipetrain("reference --help").out, "--batch"), "default: 64");
}

// The shown default is the one in force: `local` without --stages runs one stage, while the
// flag's own value (0) given is refused.
TEST(HelpDefaultsTest, StagesNotGivenIsOneStage) {
  const std::string model = std::string(PIPETRAIN_SOURCE_DIR) + "/examples/mlp_digits.textproto";
  const CommandRun zero = Pipetrain("local --model " + model + " --stages 0 --steps 1");
  EXPECT_EQ(zero.exit_code, 1) << zero.out;
  EXPECT_THAT(zero.out, HasSubstr("--stages must be >= 1"));
  const CommandRun one = Pipetrain("local --model " + model + " --steps 1 --batch 8");
  EXPECT_EQ(one.exit_code, 0) << one.out;
  EXPECT_THAT(one.out, HasSubstr(": 1 stages, schedule 1f1b"));
}

// A required flag that is missing is named with what it is, not reported as a malformed value.
TEST(RequiredFlagsTest, MissingRequiredFlagsSayWhatTheyAre) {
  const CommandRun worker = RunBinary(PIPETRAIN_STAGE_WORKER_BINARY, "");
  EXPECT_EQ(worker.exit_code, 2) << worker.out;
  EXPECT_THAT(worker.out,
              HasSubstr("stage_worker: --coordinator HOST:PORT is required: the address "
                        "the coordinator this worker joins listens on (its --listen"));
  EXPECT_THAT(worker.out, Not(HasSubstr("got ''")));
  // A malformed address is still reported as one.
  const CommandRun bad = RunBinary(PIPETRAIN_STAGE_WORKER_BINARY, "--coordinator nowhere");
  EXPECT_EQ(bad.exit_code, 2) << bad.out;
  EXPECT_THAT(bad.out, HasSubstr("must be host:port, got 'nowhere'"));

  const std::string model = std::string(PIPETRAIN_SOURCE_DIR) + "/examples/mlp_digits.textproto";
  const CommandRun train =
      testing::RunCommand(std::string("env -u PIPETRAIN_COORDINATOR ") + PIPETRAIN_BINARY +
                          " train --model " + model + " 2>&1");
  EXPECT_EQ(train.exit_code, 1) << train.out;
  EXPECT_THAT(train.out, HasSubstr("--coordinator HOST:PORT is required (or the environment "
                                   "variable PIPETRAIN_COORDINATOR): the address a running "
                                   "coordinator listens on (its --listen); `pipetrain local`"));
  for (const std::string command : {"reference", "train", "local"}) {
    SCOPED_TRACE(command);
    const CommandRun r = Pipetrain(command);
    EXPECT_EQ(r.exit_code, 1) << r.out;
    EXPECT_THAT(r.out, HasSubstr("--model FILE is required: the model to train, a ModelSpec in "
                                 "protobuf text format (e.g. examples/mlp_digits.textproto)"));
  }
  const CommandRun partition = Pipetrain("partition --costs 1,2");
  EXPECT_EQ(partition.exit_code, 1) << partition.out;
  EXPECT_THAT(partition.out, HasSubstr("--stages is required: how many pipeline stages"));
}

// --schedule names the schedule in every command; schedule and partition still take --kind, its
// former name, with the same result.
TEST(SpellingsTest, ScheduleIsSpeltScheduleEverywhereAndKindStillWorks) {
  const std::string shape = " --stages 2 --microbatches 4 --format json";
  const CommandRun schedule = Pipetrain("schedule --schedule zb-h1" + shape);
  ASSERT_EQ(schedule.exit_code, 0) << schedule.out;
  EXPECT_THAT(schedule.out, HasSubstr("\"actions\""));
  EXPECT_EQ(Pipetrain("schedule --kind zb-h1" + shape).out, schedule.out);
  EXPECT_NE(Pipetrain("schedule --schedule 1f1b" + shape).out, schedule.out);
  const CommandRun both = Pipetrain("schedule --schedule zb-h1 --kind zb-h1" + shape);
  EXPECT_EQ(both.exit_code, 1) << both.out;
  EXPECT_THAT(both.out, HasSubstr("--kind is the former name of --schedule: give one of them"));
  const CommandRun none = Pipetrain("schedule" + shape);
  EXPECT_EQ(none.exit_code, 1) << none.out;
  EXPECT_THAT(none.out, HasSubstr("--schedule is required: gpipe, 1f1b,"));
  EXPECT_EQ(Shown(Pipetrain("schedule --help").out, "--schedule"), "required");

  // partition: the schedule picks the placement (interleaved: 2 chunks per stage, looped).
  const std::string costs = "partition --costs 1,1,1,1,1,1,1,1 --stages 2 --format json";
  const CommandRun interleaved = Pipetrain(costs + " --schedule interleaved");
  ASSERT_EQ(interleaved.exit_code, 0) << interleaved.out;
  EXPECT_EQ(Pipetrain(costs + " --kind interleaved").out, interleaved.out);
  EXPECT_NE(Pipetrain(costs).out, interleaved.out);
  EXPECT_EQ(Shown(Pipetrain("partition --help").out, "--schedule"),
            "default: none: one chunk per stage");
}

// evaluate reads its checkpoint with --resume DIR, as the training commands do (--save writes
// one); --checkpoint DIR, its former name, still works. Without --data it evaluates on the data
// set the checkpoint was trained on, as its help says.
TEST(SpellingsTest, EvaluateTakesResumeAndTheCheckpointsData) {
  const std::string dir = testing::TempDir("first_hour_evaluate_");
  ASSERT_FALSE(dir.empty());
  const std::string model = std::string(PIPETRAIN_SOURCE_DIR) + "/examples/mlp_digits.textproto";
  const CommandRun trained = Pipetrain("reference --model " + model +
                                       " --data synthetic:256 --steps 3 --batch 16 --seed 3 "
                                       "--eval-samples 1 --save " +
                                       dir + "/ckpt");
  ASSERT_EQ(trained.exit_code, 0) << trained.out;
  const CommandRun resume = Pipetrain("evaluate --resume " + dir + "/ckpt --eval-samples 64");
  ASSERT_EQ(resume.exit_code, 0) << resume.out;
  EXPECT_THAT(resume.out, HasSubstr(": step 3, model mlp_digits, data synthetic"));
  EXPECT_EQ(Pipetrain("evaluate --checkpoint " + dir + "/ckpt --eval-samples 64").out, resume.out);
  const CommandRun digits =
      Pipetrain("evaluate --resume " + dir + "/ckpt --eval-samples 64 --data digits");
  ASSERT_EQ(digits.exit_code, 0) << digits.out;
  EXPECT_THAT(digits.out, HasSubstr(", data digits"));
  const CommandRun none = Pipetrain("evaluate");
  EXPECT_EQ(none.exit_code, 1) << none.out;
  EXPECT_THAT(none.out, HasSubstr("--resume DIR is required: the checkpoint directory to "
                                  "evaluate (what --save wrote)"));
  const std::string help = Pipetrain("evaluate --help").out;
  EXPECT_EQ(Shown(help, "--data"), "default: the checkpoint's");
  EXPECT_EQ(Shown(help, "--resume"), "required");
  EXPECT_EQ(Shown(Pipetrain("reference --help").out, "--data"),
            "default: what --model implies: text for an embedding model, digits if it fits");
  testing::RunCommand("rm -rf '" + dir + "'");
}

// The "VERSION (commit X)" or "VERSION" after the name in a --version line; "" if the line is
// not "NAME VERSION[ (commit 12 hex digits)]\n".
std::string VersionOf(const std::string& name, const std::string& out) {
  const std::regex line("^" + name + R"( ([0-9]+\.[0-9]+\.[0-9]+( \(commit [0-9a-f]{12}\))?)\n$)");
  std::smatch m;
  return std::regex_match(out, m, line) ? m[1].str() : "";
}

// `--version` on all three binaries: the CMake project version and, when the build read it from
// a git checkout, the commit, which is one of this repository's; the same for all three. Given
// with a command or other flags, --version still only prints the version.
TEST(VersionTest, EveryBinaryPrintsTheProjectVersionAndCommit) {
  const CommandRun pipetrain = Pipetrain("--version");
  EXPECT_EQ(pipetrain.exit_code, 0) << pipetrain.out;
  const std::string version = VersionOf("pipetrain", pipetrain.out);
  ASSERT_FALSE(version.empty()) << pipetrain.out;
  EXPECT_TRUE(absl::StartsWith(version, PIPETRAIN_PROJECT_VERSION)) << version;
  for (const auto& [name, binary] : std::vector<std::pair<std::string, std::string>>{
           {"coordinator", PIPETRAIN_COORDINATOR_BINARY},
           {"stage_worker", PIPETRAIN_STAGE_WORKER_BINARY}}) {
    SCOPED_TRACE(name);
    const CommandRun r = RunBinary(binary, "--version");
    EXPECT_EQ(r.exit_code, 0) << r.out;
    EXPECT_EQ(VersionOf(name, r.out), version) << r.out;
  }
  EXPECT_EQ(Pipetrain("train --version --stages 3").out, pipetrain.out);
  EXPECT_EQ(Pipetrain("help --version").out, pipetrain.out);
  const size_t at = version.find("(commit ");
  const CommandRun git = testing::RunCommand(std::string("git -C '") + PIPETRAIN_SOURCE_DIR +
                                             "' rev-parse --git-dir >/dev/null 2>&1");
  if (at != std::string::npos && git.exit_code == 0) {
    const std::string commit = version.substr(at + 8, 12);
    const CommandRun known = testing::RunCommand(std::string("git -C '") + PIPETRAIN_SOURCE_DIR +
                                                 "' cat-file -e " + commit + "^{commit} 2>&1");
    EXPECT_EQ(known.exit_code, 0) << commit << " is no commit of " << PIPETRAIN_SOURCE_DIR;
  }
}

// The address after "serving /metrics on " in the log `path`, waiting up to 10 s for it.
std::string MetricsAddress(const std::string& path) {
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (absl::Now() < deadline) {
    for (absl::string_view line : absl::StrSplit(testing::ReadFile(path), '\n')) {
      const size_t at = line.find("serving /metrics on ");
      if (at == absl::string_view::npos) continue;
      absl::string_view rest = line.substr(at + 20);
      return std::string(rest.substr(0, rest.find_first_of("\" \t}")));
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  return "";
}

// Both daemons' /metrics carry pipetrain_build_info{daemon, version, commit} 1, with the version
// and commit their --version prints.
TEST(VersionTest, BothDaemonsExportTheirBuildInfo) {
  if (testing::RunCommand("command -v curl >/dev/null").exit_code != 0) {
    GTEST_SKIP() << "curl is not installed (apt-get install curl)";
  }
  std::string version = VersionOf("pipetrain", Pipetrain("--version").out);
  ASSERT_FALSE(version.empty());
  std::string commit = "unknown";
  if (const size_t at = version.find(" (commit "); at != std::string::npos) {
    commit = version.substr(at + 9, 12);
    version = version.substr(0, at);
  }
  const std::string dir = testing::TempDir("first_hour_metrics_");
  ASSERT_FALSE(dir.empty());
  testing::Daemons daemons;
  ASSERT_EQ(daemons.Start(dir, 1, {"--metrics-listen", "127.0.0.1:0"},
                          {"--metrics-listen", "127.0.0.1:0"}),
            "");
  for (const auto& [daemon, log] : std::vector<std::pair<std::string, std::string>>{
           {"coordinator", "coordinator.log"}, {"stage_worker", "worker-0.log"}}) {
    SCOPED_TRACE(daemon);
    const std::string address = MetricsAddress(dir + "/" + log);
    ASSERT_FALSE(address.empty()) << testing::ReadFile(dir + "/" + log);
    const CommandRun scrape =
        testing::RunCommand("curl -sf --max-time 10 http://" + address + "/metrics");
    ASSERT_EQ(scrape.exit_code, 0) << scrape.out;
    EXPECT_THAT(scrape.out, HasSubstr("pipetrain_build_info{commit=\"" + commit + "\",daemon=\"" +
                                      daemon + "\",version=\"" + version + "\"} 1"));
  }
  EXPECT_EQ(daemons.Stop(), "");
  testing::RunCommand("rm -rf '" + dir + "'");
}

}  // namespace
}  // namespace pipetrain
