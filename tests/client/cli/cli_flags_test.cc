// The command line of the three binaries as a user meets it (issue 12): `pipetrain COMMAND
// --help` lists that command's flags and exits 0, a flag the command does not use is refused even
// at its default value, unknown flags get a "did you mean", and flag names are accepted with
// dashes or underscores by `pipetrain`, `coordinator` and `stage_worker`, on the command line and
// in a --flagfile.
#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/util/cpu_set.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/daemons.h"
#include "tests/integration/run_command.h"

namespace pipetrain {
namespace {

using testing::CommandRun;
using testing::Example;
using ::testing::HasSubstr;
using ::testing::Not;

CommandRun RunBinary(const std::string& binary, const std::string& args) {
  return testing::RunCommand(binary + " " + args + " 2>&1");
}
CommandRun Pipetrain(const std::string& args) { return RunBinary(PIPETRAIN_BINARY, args); }

// Writes `text` to a new file in a fresh directory; returns its path.
std::string WriteFlagfile(const std::string& text) {
  const std::string path = testing::TempDir("cli_flags_") + "/flags";
  std::ofstream(path) << text;
  return path;
}

// Every command's flags, as docs/cli.md lists them.
const std::map<std::string, std::vector<std::string>>& CommandFlags() {
  static const auto* const flags = [] {
    // clang-format off
    const std::vector<std::string> training = {
        "--model", "--data", "--data-dir", "--tokenizer", "--steps", "--batch", "--microbatches", "--seed",
        "--threads", "--optimizer", "--lr-schedule", "--warmup-steps", "--lr-decay-steps",
        "--lr-min", "--json", "--eval-samples", "--eval-every", "--log-every", "--save",
        "--checkpoint-every", "--keep-checkpoints", "--resume", "--isa"};
    // clang-format on
    auto with = [](std::vector<std::string> a, const std::vector<std::string>& b) {
      a.insert(a.end(), b.begin(), b.end());
      return a;
    };
    const std::vector<std::string> pipeline = {"--stages",          "--schedule",    "--virtual",
                                               "--trace",           "--trace-steps", "--min-stages",
                                               "--replace-timeout", "--plan",        "--replicas",
                                               "--max-stages",      "--max-replicas"};
    const std::vector<std::string> security = {"--tls-cert", "--tls-key", "--tls-ca",
                                               "--token-file"};
    return new std::map<std::string, std::vector<std::string>>{
        {"reference", with(training, {"--max-isa"})},
        {"schedule",
         {"--schedule", "--kind", "--stages", "--microbatches", "--virtual", "--costs",
          "--format"}},
        {"partition",
         {"--costs", "--model", "--data", "--data-dir", "--tokenizer", "--batch", "--microbatches",
          "--stages", "--speeds", "--memory-cap", "--schedule", "--kind", "--virtual", "--format"}},
        {"plan", with({"--model", "--data", "--data-dir", "--tokenizer", "--batch", "--seed",
                       "--threads", "--optimizer", "--isa", "--local", "--coordinator",
                       "--memory-cap", "--link-latency", "--link-bandwidth", "--message-cpu",
                       "--step-overhead", "--top", "--json", "--partition-by"},
                      security)},
        {"train",
         with(with(with({"--coordinator", "--reconnect-timeout"}, security), training), pipeline)},
        {"local", with(with(training, pipeline), {"--max-isa", "--pin-workers"})},
        {"evaluate",
         {"--resume", "--checkpoint", "--data", "--data-dir", "--tokenizer", "--eval-samples",
          "--json"}},
        {"tokenizer",
         {"--input", "--out", "--vocab-size", "--model-type", "--character-coverage", "--tokenizer",
          "--json"}},
        {"generate",
         {"--resume", "--checkpoint", "--prompt", "--max-tokens", "--temperature", "--top-k",
          "--seed", "--data", "--data-dir", "--tokenizer", "--job", "--coordinator", "--tls-cert",
          "--tls-key", "--tls-ca", "--token-file"}},
        {"predict",
         {"--resume", "--checkpoint", "--data", "--data-dir", "--eval-samples", "--out"}},
        {"jobs", with({"--coordinator", "--json"}, security)},
        {"workers", with({"--coordinator", "--json"}, security)},
        {"status", with({"--coordinator", "--json"}, security)},
        {"watch", with({"--coordinator", "--json", "--log-every"}, security)},
        {"cancel", with({"--coordinator", "--json", "--reason"}, security)},
        {"checkpoint",
         with(with({"--coordinator", "--json"}, security), {"--save", "--keep-checkpoints"})},
    };
  }();
  return *flags;
}

// The --flag names a help text lists at the start of a line ("  --name (default: ...)").
std::set<std::string> ListedFlags(const std::string& help) {
  std::set<std::string> out;
  const std::regex line(R"(\n  (--[a-z][a-z0-9-]*) \()");
  for (auto it = std::sregex_iterator(help.begin(), help.end(), line); it != std::sregex_iterator();
       ++it) {
    out.insert((*it)[1]);
  }
  return out;
}

TEST(CliHelpTest, EachCommandsHelpListsItsFlagsWithDefaultsAndExitsZero) {
  for (const auto& [command, flags] : CommandFlags()) {
    SCOPED_TRACE(command);
    const CommandRun r = Pipetrain(command + " --help");
    EXPECT_EQ(r.exit_code, 0) << r.out;
    EXPECT_THAT(r.out, HasSubstr("usage: pipetrain " + command));
    std::set<std::string> expected(flags.begin(), flags.end());
    EXPECT_EQ(ListedFlags(r.out), expected) << r.out;
    EXPECT_THAT(r.out, Not(HasSubstr("No flags matched")));
  }
  // Defaults and meanings are shown, names with dashes.
  const CommandRun r = Pipetrain("reference --help");
  EXPECT_THAT(r.out, HasSubstr("--batch (default: 64)\n      samples per training step (B)"));
  EXPECT_THAT(r.out, HasSubstr("--data-dir (default: $PIPETRAIN_DATA_DIR, else "));
  EXPECT_THAT(r.out, Not(HasSubstr("data_dir")));
  // Also -h, and --help before the command.
  EXPECT_EQ(Pipetrain("train -h").out, Pipetrain("--help train").out);
}

// The headings of `COMMAND --help`, in order (the unindented lines ending with ':'), and the flags
// listed under each.
std::vector<std::pair<std::string, std::vector<std::string>>> Topics(const std::string& help) {
  std::vector<std::pair<std::string, std::vector<std::string>>> topics;
  const std::regex heading(R"(^([a-z][^:]*):$)");
  const std::regex flag(R"(^  (--[a-z][a-z0-9-]*)( \(|$| FILE))");
  std::istringstream lines(help);
  std::smatch m;
  for (std::string line; std::getline(lines, line);) {
    if (std::regex_match(line, m, heading)) {
      topics.push_back({m[1], {}});
    } else if (std::regex_search(line, m, flag) && !topics.empty()) {
      topics.back().second.push_back(m[1]);
    }
  }
  return topics;
}

// Flags are listed under topic headings, each under one, in the same order for every command;
// no command has flags without a topic ("other"); flag files come last.
TEST(CliHelpTest, FlagsAreGroupedUnderTopicHeadings) {
  const std::vector<std::string> order = {
      "flags (--name=VALUE or --name VALUE; dashes or underscores)",
      "model and data",
      "schedule",
      "optimizer",
      "checkpoints",
      "compute",
      "service",
      "output",
      "generation",
      "flag files"};
  for (const auto& [command, flags] : CommandFlags()) {
    SCOPED_TRACE(command);
    const auto topics = Topics(Pipetrain("help " + command).out);
    size_t at = 0;
    std::set<std::string> seen;
    for (const auto& [heading, names] : topics) {
      const auto it = std::find(order.begin() + at, order.end(), heading);
      ASSERT_NE(it, order.end()) << "heading '" << heading << "' out of order or unknown";
      at = static_cast<size_t>(it - order.begin()) + 1;
      EXPECT_TRUE(heading == order[0] || !names.empty()) << heading << " is empty";
      for (const std::string& name : names) EXPECT_TRUE(seen.insert(name).second) << name;
    }
    ASSERT_FALSE(topics.empty());
    EXPECT_EQ(topics.back().first, "flag files");
    EXPECT_EQ(topics.back().second, std::vector<std::string>{"--flagfile"});
  }
  // Where some flags are: under the topic a user looks for them.
  const auto train = Topics(Pipetrain("train --help").out);
  auto under = [&train](const std::string& heading) {
    for (const auto& [h, names] : train) {
      if (h == heading) return names;
    }
    return std::vector<std::string>{};
  };
  EXPECT_THAT(under("model and data"), ::testing::IsSupersetOf({"--model", "--data", "--batch"}));
  EXPECT_THAT(under("schedule"), ::testing::IsSupersetOf({"--schedule", "--stages", "--virtual"}));
  EXPECT_THAT(under("optimizer"), ::testing::IsSupersetOf({"--optimizer", "--lr-schedule"}));
  EXPECT_THAT(under("checkpoints"), ::testing::IsSupersetOf({"--save", "--resume"}));
  EXPECT_THAT(under("service"), ::testing::IsSupersetOf({"--coordinator", "--token-file"}));
  EXPECT_THAT(under("output"), ::testing::IsSupersetOf({"--json", "--log-every", "--trace"}));
  // `pipetrain help` lists the commands by topic too.
  const std::string help = Pipetrain("help").out;
  EXPECT_THAT(help, HasSubstr("training commands:\n  reference "));
  EXPECT_THAT(help, HasSubstr("planning commands (no coordinator needed):\n  schedule "));
  EXPECT_THAT(help, ::testing::ContainsRegex(
                        "commands for a coordinator's jobs and workers:\n  jobs +list a "
                        "coordinator's jobs\n  status JOB .*\n  watch JOB +follow a job's"
                        ".*\n  cancel JOB .*\n  workers +list a coordinator's stage workers"));
}

TEST(CliHelpTest, ProgramHelpListsTheCommandsAndHelpfullEveryFlag) {
  const CommandRun help = Pipetrain("--help");
  EXPECT_EQ(help.exit_code, 0) << help.out;
  for (const auto& [command, flags] : CommandFlags()) EXPECT_THAT(help.out, HasSubstr(command));
  EXPECT_THAT(help.out, HasSubstr("PIPETRAIN_COORDINATOR"));
  EXPECT_THAT(help.out, HasSubstr("--flagfile"));
  const CommandRun full = Pipetrain("--helpfull");
  EXPECT_EQ(full.exit_code, 0) << full.out;
  // Every flag main.cc defines is some command's: none is defined but unreachable.
  std::ifstream source(std::string(PIPETRAIN_SOURCE_DIR) + "/client/cli/main.cc");
  const std::string text((std::istreambuf_iterator<char>(source)), {});
  const std::regex defined(R"(ABSL_FLAG\([^,]+,\s*([a-z0-9_]+),)");
  int count = 0;
  const std::set<std::string> listed = ListedFlags(full.out);
  for (auto it = std::sregex_iterator(text.begin(), text.end(), defined);
       it != std::sregex_iterator(); ++it, ++count) {
    std::string name = "--" + (*it)[1].str();
    std::replace(name.begin(), name.end(), '_', '-');
    EXPECT_EQ(listed.count(name), 1u) << name << " is used by no command";
  }
  EXPECT_GT(count, 20);
}

// A flag the command does not take is an error even when its value is the default: what was
// given counts, not what it was set to.
TEST(CliFlagsTest, UnusedFlagIsRefusedEvenAtItsDefaultValue) {
  const std::string model = " --model " + Example("mlp_digits.textproto");
  const std::map<std::string, std::string> cases = {
      {"reference" + model + " --stages 0", "--stages not used by `pipetrain reference`"},
      {"schedule --kind 1f1b --stages 2 --microbatches 4 --steps 100",
       "--steps not used by `pipetrain schedule`"},
      {"partition --costs 1,2 --stages 2 --seed 0", "--seed not used by `pipetrain partition`"},
      {"plan --local 2" + model + " --steps 100", "--steps not used by `pipetrain plan`"},
      {"train --coordinator 127.0.0.1:1" + model + " --kind zb-v",
       "--kind not used by `pipetrain train`"},
      {"local" + model + " --kind ''", "--kind not used by `pipetrain local`"},
      {"local" + model + " --costs 1,2", "--costs not used by `pipetrain local`"},
      {"local" + model + " --speeds 1,1", "--speeds not used by `pipetrain local`"},
      {"local" + model + " --memory-cap 1G", "--memory-cap not used by `pipetrain local`"},
      {"evaluate --checkpoint /nonexistent --steps 100",
       "--steps not used by `pipetrain evaluate`"},
      {"generate --resume /nonexistent --prompt a --steps 100",
       "--steps not used by `pipetrain generate`"},
      {"predict --resume /nonexistent --temperature 1",
       "--temperature not used by `pipetrain predict`"},
      {"jobs --coordinator 127.0.0.1:1 --batch 64", "--batch not used by `pipetrain jobs`"},
      {"workers --coordinator 127.0.0.1:1 --reason ''", "--reason not used by `pipetrain workers`"},
      {"status job-1 --coordinator 127.0.0.1:1 --reason ''",
       "--reason not used by `pipetrain status`"},
      {"watch job-1 --coordinator 127.0.0.1:1 --reason ''",
       "--reason not used by `pipetrain watch`"},
      {"cancel job-1 --coordinator 127.0.0.1:1 --model ''",
       "--model not used by `pipetrain cancel`"},
      {"checkpoint job-1 --coordinator 127.0.0.1:1 --save /tmp/x --steps 100",
       "--steps not used by `pipetrain checkpoint`"},
      {"tokenizer train --input x --out /tmp/x --vocab-size 100 --steps 100",
       "--steps not used by `pipetrain tokenizer`"},
  };
  std::set<std::string> covered;
  for (const auto& [args, message] : cases) {
    SCOPED_TRACE(args);
    const CommandRun r = Pipetrain(args);
    EXPECT_EQ(r.exit_code, 1) << r.out;
    EXPECT_THAT(r.out, HasSubstr(message));
    EXPECT_THAT(r.out, HasSubstr("--help` lists its flags"));
    covered.insert(args.substr(0, args.find(' ')));
  }
  EXPECT_EQ(covered.size(), CommandFlags().size());  // every command
}

TEST(CliFlagsTest, UnknownFlagsAndCommandsGetADidYouMean) {
  CommandRun r = Pipetrain("reference --stpes 3");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.out, HasSubstr("unknown flag --stpes (did you mean --steps?)"));
  r = Pipetrain("evaluate --checkpoint /x --eval-sample 3");
  EXPECT_THAT(r.out, HasSubstr("unknown flag --eval-sample (did you mean --eval-samples?)"));
  // A flag of another command: named as not used here, with the close one this command has.
  r = Pipetrain("local --checkpoint /x");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.out, HasSubstr("--checkpoint not used by `pipetrain local` (did you mean "
                               "--checkpoint-every?)"));
  r = Pipetrain("--frobnicate");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.out, HasSubstr("unknown flag --frobnicate"));
  r = Pipetrain("trian --steps 1");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.out, HasSubstr("unknown command 'trian'"));
}

// `partition --memory-cap`: dashes, underscores, mixed, `=`, and a flag file per command.
TEST(CliFlagsTest, PipetrainAcceptsDashesAndUnderscoresAlsoInAFlagfile) {
  const std::string base =
      "partition --model " + Example("deep_mlp.textproto") + " --speeds 1,1 --format json ";
  const CommandRun dashed = Pipetrain(base + "--memory-cap 45M,32M --stages 2");
  ASSERT_EQ(dashed.exit_code, 0) << dashed.out;
  // The caps move the cut from layer 16 (no caps) to 17: the flag was applied, not ignored.
  EXPECT_THAT(dashed.out, HasSubstr("\"boundaries\":[0,17,33]"));
  EXPECT_THAT(Pipetrain(base + "--stages 2").out, HasSubstr("\"boundaries\":[0,16,33]"));
  EXPECT_EQ(Pipetrain(base + "--memory_cap 45M,32M --stages 2").out, dashed.out);
  EXPECT_EQ(Pipetrain(base + "--memory_cap=45M,32M --stages=2").out, dashed.out);
  const std::string file = WriteFlagfile(
      "# partition settings\n--memory-cap 45M,32M\n\n  --stages=2  \n"
      "--speeds_is_not_here_it_is_below\n");
  CommandRun r = Pipetrain(base + "--flagfile " + file);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.out,
              HasSubstr("unknown flag --speeds-is-not-here-it-is-below (in " + file + ":5)"));
  const std::string good =
      WriteFlagfile("# partition settings\n--memory_cap 45M,32M\n  --stages=2  \n");
  r = Pipetrain(base + "--flagfile=" + good);
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(r.out, dashed.out);
  // A flag file obeys the command's flags like the command line does.
  const std::string foreign = WriteFlagfile("--steps=100\n");
  r = Pipetrain(base + "--stages 2 --flagfile " + foreign);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.out, HasSubstr("--steps (in " + foreign + ":1) not used by `pipetrain partition`"));
  r = Pipetrain(base + "--flagfile /nonexistent/flags");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.out, HasSubstr("--flagfile /nonexistent/flags: cannot read it"));
}

// --coordinator, else $PIPETRAIN_COORDINATOR: `jobs` reaches a real coordinator either way, and
// the flag wins over the variable (which names a port nothing listens on).
TEST(CliFlagsTest, CoordinatorComesFromTheEnvironmentUnlessGiven) {
  CommandRun r = testing::RunCommand(std::string("env -u PIPETRAIN_COORDINATOR ") +
                                     PIPETRAIN_BINARY + " jobs 2>&1");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.out, HasSubstr("--coordinator HOST:PORT is required (or the environment variable "
                               "PIPETRAIN_COORDINATOR)"));
  testing::Daemons daemons;
  ASSERT_EQ(daemons.Start(testing::TempDir("cli_env_"), 0), "");
  r = testing::RunCommand("PIPETRAIN_COORDINATOR=" + daemons.address() + " " + PIPETRAIN_BINARY +
                          " jobs --json 2>&1");
  EXPECT_EQ(r.exit_code, 0) << r.out;
  r = testing::RunCommand(std::string("PIPETRAIN_COORDINATOR=127.0.0.1:1 ") + PIPETRAIN_BINARY +
                          " jobs --json --coordinator " + daemons.address() + " 2>&1");
  EXPECT_EQ(r.exit_code, 0) << r.out;
}

TEST(DaemonFlagsTest, HelpListsTheirFlagsAndUnknownOnesAreRefused) {
  for (const std::string& binary :
       {std::string(PIPETRAIN_COORDINATOR_BINARY), std::string(PIPETRAIN_STAGE_WORKER_BINARY)}) {
    SCOPED_TRACE(binary);
    const CommandRun help = RunBinary(binary, "--help");
    EXPECT_EQ(help.exit_code, 0) << help.out;
    EXPECT_THAT(help.out, HasSubstr("--listen (default: "));
    EXPECT_THAT(help.out, Not(HasSubstr("--flagfile (default")));  // absl's own are not listed
    const CommandRun bad = RunBinary(binary, "--lsten 127.0.0.1:0");
    EXPECT_EQ(bad.exit_code, 2) << bad.out;
    EXPECT_THAT(bad.out, HasSubstr("unknown flag --lsten (did you mean --listen?)"));
  }
  EXPECT_THAT(RunBinary(PIPETRAIN_COORDINATOR_BINARY, "--help").out,
              HasSubstr("--port-file (default: none)"));
  EXPECT_THAT(RunBinary(PIPETRAIN_STAGE_WORKER_BINARY, "--help").out,
              HasSubstr("--threads-max (default: every CPU this worker may run on)"));
}

// stage_worker --cpus: a bad list or a CPU the process may not use is refused at start, naming
// the flag; a good one confines the worker, which registers the CPUs it has as its cores.
TEST(DaemonFlagsTest, WorkerCpusAreCheckedAndBecomeItsCores) {
  const CommandRun backwards =
      RunBinary(PIPETRAIN_STAGE_WORKER_BINARY, "--coordinator 127.0.0.1:1 --cpus 3-1");
  EXPECT_EQ(backwards.exit_code, 2) << backwards.out;
  EXPECT_THAT(backwards.out, HasSubstr("--cpus: CPU list item '3-1': the range runs backwards"));
  const std::vector<int> allowed = util::AllowedCpus();
  ASSERT_FALSE(allowed.empty());
  if (allowed.back() < util::kMaxCpus - 1) {
    const CommandRun outside =
        RunBinary(PIPETRAIN_STAGE_WORKER_BINARY,
                  absl::StrCat("--coordinator 127.0.0.1:1 --cpus ", util::kMaxCpus - 1));
    EXPECT_EQ(outside.exit_code, 2) << outside.out;
    EXPECT_THAT(outside.out, HasSubstr(absl::StrCat("--cpus: CPU ", util::kMaxCpus - 1,
                                                    " is not available to this process")));
  }
  const std::string dir = testing::TempDir("worker_cpus_");
  testing::Daemons daemons;
  ASSERT_EQ(daemons.Start(dir, 1, {}, {absl::StrCat("--cpus=", allowed.back())}), "");
  absl::StatusOr<std::vector<v1::WorkerInfo>> workers = daemons.client().ListWorkers();
  ASSERT_TRUE(workers.ok()) << workers.status();
  ASSERT_EQ(workers->size(), 1u);
  EXPECT_EQ((*workers)[0].cores(), 1);
}

// The daemons take --port-file / --threads-max in either spelling, on the command line and in a
// flag file: the coordinator writes its port, the worker registers.
TEST(DaemonFlagsTest, DashesAndUnderscoresOnTheCommandLineAndInAFlagfile) {
  struct Case {
    std::string coordinator_flag;  // how --port-file is given
    std::string worker_flag;       // how --threads-max is given
  };
  const std::string dir = testing::TempDir("daemon_flags_");
  const std::string port_file = dir + "/port";
  const std::vector<Case> cases = {
      {"--port-file=" + port_file, "--threads-max=1"},
      {"--port_file=" + port_file, "--threads_max=1"},
      {"--flagfile=" + WriteFlagfile("--port-file " + port_file + "\n--job-retention=1h\n"),
       "--flagfile=" + WriteFlagfile("--threads-max 1\n--keep_alive_is_misspelt_below\n")},
      {"--flagfile=" + WriteFlagfile("--port_file=" + port_file + "\n"),
       "--flagfile=" + WriteFlagfile("--threads_max=1\n")},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(i);
    std::remove(port_file.c_str());
    testing::Daemons daemons;
    const bool bad_worker_file = i == 2;
    const std::string started = daemons.Start(dir, bad_worker_file ? 0 : 1,
                                              {cases[i].coordinator_flag}, {cases[i].worker_flag});
    ASSERT_EQ(started, "");
    const std::string port = testing::ReadFile(port_file);
    EXPECT_FALSE(port.empty());
    EXPECT_THAT(daemons.address(), ::testing::EndsWith(":" + port.substr(0, port.find('\n'))));
    if (bad_worker_file) {
      // The worker's flag file with a misspelt flag: it refuses to start, naming the line.
      const CommandRun r =
          RunBinary(PIPETRAIN_STAGE_WORKER_BINARY,
                    "--coordinator " + daemons.address() + " " + cases[i].worker_flag);
      EXPECT_EQ(r.exit_code, 2);
      EXPECT_THAT(r.out, HasSubstr("unknown flag --keep-alive-is-misspelt-below (in "));
      EXPECT_THAT(r.out, HasSubstr(":2)"));
    }
  }
}

}  // namespace
}  // namespace pipetrain
