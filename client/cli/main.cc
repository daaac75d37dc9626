// The `pipetrain` command-line client. Flags are parsed here only, into each command's options.
//
//   pipetrain reference --model FILE --data SPEC --steps N --batch B --microbatches M ...
//   pipetrain schedule  --kind KIND --stages S --microbatches M [--virtual V] --format FMT
//   pipetrain partition --costs c0,c1,... | --model FILE --stages S [--speeds ...] ...
#include <algorithm>
#include <cstdint>
#include <iostream>
#include <set>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/cli/reference_command.h"

// Shared by several commands.
ABSL_FLAG(std::string, model, "", "ModelSpec file (protobuf text format)");
ABSL_FLAG(int64_t, microbatches, 1, "micro-batches per batch (M)");
ABSL_FLAG(int64_t, batch, 64, "samples per training step (B)");
ABSL_FLAG(std::string, format, "",
          "output format (schedule: ascii|json|chrome|svg; "
          "partition: text|json)");
ABSL_FLAG(int64_t, stages, 0, "pipeline stages (S)");
// reference
ABSL_FLAG(std::string, data, "digits",
          "data set: digits | text[:PATH] | csv:PATH | synthetic[:ROWS]");
ABSL_FLAG(std::string, data_dir, "",
          "directory of the bundled data (default: the source tree's data/)");
ABSL_FLAG(int64_t, steps, 100, "optimizer steps");
ABSL_FLAG(uint64_t, seed, 0, "seed for initialisation and shuffling");
ABSL_FLAG(int32_t, threads, 1, "compute threads");
ABSL_FLAG(std::string, optimizer, "adamw",
          "KIND[:key=value,...], KIND sgd|adamw; keys lr, weight_decay, momentum, nesterov, "
          "beta1, beta2, eps, clip_norm");
ABSL_FLAG(std::string, save, "", "write a checkpoint to this directory at the end");
ABSL_FLAG(std::string, resume, "", "continue training from this checkpoint directory");
ABSL_FLAG(bool, json, false, "print one JSON object per line");
ABSL_FLAG(int64_t, eval_samples, 1000, "held-out samples to evaluate at the end (0: all)");
ABSL_FLAG(int64_t, log_every, 10, "steps between progress lines (without --json)");

namespace pipetrain::cli {
namespace {

constexpr char kUsage[] =
    "pipetrain COMMAND [flags]\n"
    "commands:\n"
    "  reference   train in one process with the reference trainer\n"
    "run `pipetrain COMMAND --help` for the flags.";

// Every flag defined above; the per-command allow-lists are subsets.
const std::set<std::string> kCommandFlags = {
    "model", "microbatches", "batch",     "format", "stages", "data", "data_dir",     "steps",
    "seed",  "threads",      "optimizer", "save",   "resume", "json", "eval_samples", "log_every"};

// Flags of this file that `command` does not use but whose value was changed: an error, so that
// a misspelt or misplaced option never silently does nothing.
absl::Status CheckOnlyFlags(absl::string_view command, const std::set<std::string>& allowed) {
  std::vector<std::string> foreign;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (kCommandFlags.count(std::string(name)) == 0) continue;  // absl's own (--help, ...)
    if (allowed.count(std::string(name)) != 0) continue;
    if (flag->CurrentValue() != flag->DefaultValue()) foreign.push_back(absl::StrCat("--", name));
  }
  if (foreign.empty()) return absl::OkStatus();
  std::sort(foreign.begin(), foreign.end());
  return absl::InvalidArgumentError(
      absl::StrCat(absl::StrJoin(foreign, ", "), " not used by `pipetrain ", command, "`"));
}

absl::Status RunReference() {
  if (auto s = CheckOnlyFlags("reference", {"model", "data", "data_dir", "steps", "batch",
                                            "microbatches", "seed", "threads", "optimizer", "save",
                                            "resume", "json", "eval_samples", "log_every"});
      !s.ok()) {
    return s;
  }
  ReferenceCommandOptions o;
  o.model_path = absl::GetFlag(FLAGS_model);
  o.data = absl::GetFlag(FLAGS_data);
  o.data_dir = absl::GetFlag(FLAGS_data_dir);
  o.steps = absl::GetFlag(FLAGS_steps);
  o.batch = absl::GetFlag(FLAGS_batch);
  o.microbatches = absl::GetFlag(FLAGS_microbatches);
  o.seed = absl::GetFlag(FLAGS_seed);
  o.threads = absl::GetFlag(FLAGS_threads);
  o.optimizer = absl::GetFlag(FLAGS_optimizer);
  o.save_dir = absl::GetFlag(FLAGS_save);
  o.resume_dir = absl::GetFlag(FLAGS_resume);
  o.json = absl::GetFlag(FLAGS_json);
  o.eval_samples = absl::GetFlag(FLAGS_eval_samples);
  o.log_every = absl::GetFlag(FLAGS_log_every);
  return RunReferenceCommand(o, std::cout);
}

// Flag names are spelt with dashes on the command line (--data-dir) and with underscores in
// code (absl requires identifiers): rewrites the name part of every --flag[=value] argument.
std::vector<std::string> NormaliseFlagNames(int argc, char** argv) {
  std::vector<std::string> out(argv, argv + argc);
  for (size_t i = 1; i < out.size(); ++i) {
    std::string& a = out[i];
    if (a == "--") break;
    if (a.size() < 3 || a[0] != '-') continue;
    const size_t name_begin = a[1] == '-' ? 2 : 1;
    const size_t name_end = std::min(a.find('='), a.size());
    std::replace(a.begin() + name_begin, a.begin() + name_end, '-', '_');
  }
  return out;
}

int Main(int argc, char** argv) {
  absl::SetProgramUsageMessage(kUsage);
  std::vector<std::string> normalised = NormaliseFlagNames(argc, argv);
  std::vector<char*> normalised_argv;
  for (std::string& a : normalised) normalised_argv.push_back(a.data());
  std::vector<char*> args =
      absl::ParseCommandLine(static_cast<int>(normalised_argv.size()), normalised_argv.data());
  if (args.size() != 2) {
    std::cerr << (args.size() < 2
                      ? "pipetrain: missing command\n"
                      : absl::StrCat("pipetrain: unexpected argument '", args[2], "'\n"))
              << kUsage << "\n";
    return 2;
  }
  const std::string command = args[1];
  absl::Status status;
  if (command == "reference") {
    status = RunReference();
  } else {
    std::cerr << "pipetrain: unknown command '" << command << "'\n" << kUsage << "\n";
    return 2;
  }
  std::cout.flush();
  if (!status.ok()) {
    std::cerr << "pipetrain " << command << ": " << status.message() << " ["
              << absl::StatusCodeToString(status.code()) << "]\n";
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace pipetrain::cli

int main(int argc, char** argv) { return pipetrain::cli::Main(argc, argv); }
