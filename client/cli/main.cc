// The `pipetrain` command-line client. Flags are parsed here only, into each command's options.
//
//   pipetrain reference --model FILE --data SPEC --steps N --batch B --microbatches M ...
//   pipetrain schedule  --kind KIND --stages S --microbatches M [--virtual V] --format FMT
//   pipetrain partition --costs c0,c1,... | --model FILE --stages S [--speeds ...] ...
//   pipetrain train     --coordinator HOST:PORT --model FILE --stages S --schedule KIND ...
//   pipetrain local     --stages S --model FILE --schedule KIND ...
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <iostream>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "client/cli/interrupt.h"
#include "client/cli/job_commands.h"
#include "client/cli/local_command.h"
#include "client/cli/partition_command.h"
#include "client/cli/reference_command.h"
#include "client/cli/schedule_command.h"
#include "client/cli/train_command.h"
#include "client/cli/training_options.h"
#include "client/cli/training_setup.h"
#include "common/model/model.h"
#include "common/net/token_auth.h"
#include "common/util/flag_names.h"
#include "common/util/status_macros.h"

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
ABSL_FLAG(std::string, save, "",
          "checkpoint directory (created if missing, checked writable before the first step): a "
          "checkpoint at the end, and every --checkpoint-every steps");
ABSL_FLAG(std::string, resume, "",
          "continue training from this checkpoint directory (train/local: on the coordinator's "
          "host)");
ABSL_FLAG(std::string, checkpoint, "", "evaluate: the checkpoint directory");
ABSL_FLAG(bool, json, false, "print one JSON object per line");
ABSL_FLAG(std::optional<int64_t>, eval_samples, std::nullopt,
          "held-out samples to evaluate at the end (0: all); default 1000 for reference and "
          "evaluate, none for train/local (which evaluate the final --save checkpoint)");
ABSL_FLAG(int64_t, log_every, 10, "steps between progress lines (without --json)");
ABSL_FLAG(int64_t, checkpoint_every, 0,
          "with --save: also checkpoint after every step whose number is a multiple of N "
          "(0: only at the end)");
ABSL_FLAG(int32_t, keep_checkpoints, 2,
          "checkpoints to keep (>= 1); a single --save directory holds only the newest for now");
// train / local
ABSL_FLAG(std::string, coordinator, "", "train: the coordinator's HOST:PORT");
ABSL_FLAG(std::string, tls_cert, "",
          "train/jobs/status/cancel: this client's PEM certificate (mTLS to the coordinator)");
ABSL_FLAG(std::string, tls_key, "", "train/jobs/status/cancel: the private key of --tls-cert");
ABSL_FLAG(std::string, tls_ca, "",
          "train/jobs/status/cancel: PEM CA certificate that signs the coordinator's (TLS on)");
ABSL_FLAG(std::string, token_file, "",
          "train/jobs/status/cancel: send the first token of this file to the coordinator "
          "(default: $PIPETRAIN_TOKEN, with TLS)");
ABSL_FLAG(std::string, schedule, "1f1b",
          "train/local: pipeline schedule gpipe|1f1b|interleaved|zb-h1|zb-v|dualpipe-v");
ABSL_FLAG(std::string, trace, "", "train/local: write the last step's timeline (Chrome trace)");
// jobs / status / cancel
ABSL_FLAG(std::string, reason, "", "cancel: why the job is cancelled (recorded with the job)");
// schedule / partition
ABSL_FLAG(std::string, kind, "", "schedule kind: gpipe|1f1b|interleaved|zb-h1|zb-v|dualpipe-v");
ABSL_FLAG(std::string, virtual, "", "model chunks per worker (V); default per schedule kind");
ABSL_FLAG(std::string, costs, "",
          "schedule: F,B,I,W times of one worker's share; partition: per-layer costs c0,c1,...");
ABSL_FLAG(std::string, speeds, "", "partition: relative speed of each worker s0,s1,...");
ABSL_FLAG(std::string, memory_cap, "",
          "partition: memory cap per worker (one value or one per worker; K/M/G/KiB/MiB/GiB)");

namespace pipetrain::cli {
namespace {

constexpr char kUsage[] =
    "pipetrain COMMAND [flags]\n"
    "commands:\n"
    "  reference   train in one process with the reference trainer\n"
    "  schedule    generate, validate, simulate and draw a pipeline schedule\n"
    "  partition   split a model's layers across stages (exact min-max)\n"
    "  train       train on a running coordinator and its stage workers\n"
    "  local       start a coordinator and --stages workers here, then train on them\n"
    "  evaluate    held-out loss and accuracy of a checkpoint\n"
    "  jobs        list a coordinator's jobs\n"
    "  status JOB  one job's state, steps and stages\n"
    "  cancel JOB  cancel a job and free its workers\n"
    "run `pipetrain COMMAND --help` for the flags.";

// `base` and `more`.
std::set<std::string> With(std::set<std::string> base, std::initializer_list<const char*> more) {
  base.insert(more.begin(), more.end());
  return base;
}

// The TrainingOptions flags that `reference`, `train` and `local` all take.
// clang-format off
const std::set<std::string> kTrainingFlags = {
    "model", "data", "data_dir",                                      // what to train on
    "steps", "batch", "microbatches", "seed", "threads", "optimizer",  // the loop
    "json", "eval_samples", "log_every",                              // output
    "save", "checkpoint_every", "keep_checkpoints"};                  // checkpoints
// clang-format on

// How a command reaches a coordinator: its address, TLS and token.
const std::set<std::string> kCoordinatorFlags = {"coordinator", "tls_cert", "tls_key", "tls_ca",
                                                 "token_file"};

// Every training and pipeline flag defined above; the per-command allow-lists are subsets.
const std::set<std::string> kCommandFlags = [] {
  std::set<std::string> all = With(kTrainingFlags, {"checkpoint", "format", "stages", "resume",
                                                    "schedule", "trace", "virtual", "reason"});
  all.insert(kCoordinatorFlags.begin(), kCoordinatorFlags.end());
  return all;
}();

// The TLS files and token of a command that talks to a coordinator (docs/security.md). The token
// is --token-file's, else $PIPETRAIN_TOKEN's when TLS is on (never sent in clear).
absl::Status ClientSecurityFromFlags(client::ClientOptions* o) {
  o->tls.cert_file = absl::GetFlag(FLAGS_tls_cert);
  o->tls.key_file = absl::GetFlag(FLAGS_tls_key);
  o->tls.ca_file = absl::GetFlag(FLAGS_tls_ca);
  const char* env = std::getenv(net::kTokenEnvironmentVariable);
  PT_ASSIGN_OR_RETURN(o->token,
                      net::ResolveClientToken(absl::GetFlag(FLAGS_token_file),
                                              env != nullptr && o->tls.enabled() ? env : ""));
  return absl::OkStatus();
}

// Flags of this file that `command` does not use but whose value was changed: an error, so that
// a misspelt or misplaced option never silently does nothing.
absl::Status CheckOnlyFlags(absl::string_view command, const std::set<std::string>& allowed) {
  std::vector<std::string> foreign;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (kCommandFlags.count(std::string(name)) == 0) continue;  // absl's own (--help, ...)
    if (allowed.count(std::string(name)) != 0) continue;
    if (flag->CurrentValue() != flag->DefaultValue()) {
      // Spelt as on the command line: --data-dir, not --data_dir.
      foreign.push_back(absl::StrCat("--", absl::StrReplaceAll(name, {{"_", "-"}})));
    }
  }
  if (foreign.empty()) return absl::OkStatus();
  std::sort(foreign.begin(), foreign.end());
  return absl::InvalidArgumentError(
      absl::StrCat(absl::StrJoin(foreign, ", "), " not used by `pipetrain ", command, "`"));
}

// The options of every training command, from the flags: one place for reference, train, local.
TrainingOptions TrainingOptionsFromFlags() {
  TrainingOptions o;
  o.model_path = absl::GetFlag(FLAGS_model);
  o.data = absl::GetFlag(FLAGS_data);
  o.data_dir = absl::GetFlag(FLAGS_data_dir);
  o.steps = absl::GetFlag(FLAGS_steps);
  o.batch = absl::GetFlag(FLAGS_batch);
  o.microbatches = absl::GetFlag(FLAGS_microbatches);
  o.seed = absl::GetFlag(FLAGS_seed);
  o.threads = absl::GetFlag(FLAGS_threads);
  o.optimizer = absl::GetFlag(FLAGS_optimizer);
  o.json = absl::GetFlag(FLAGS_json);
  o.save_dir = absl::GetFlag(FLAGS_save);
  o.resume_dir = absl::GetFlag(FLAGS_resume);
  o.eval_samples = absl::GetFlag(FLAGS_eval_samples);
  o.log_every = absl::GetFlag(FLAGS_log_every);
  o.checkpoint_every = absl::GetFlag(FLAGS_checkpoint_every);
  o.keep_checkpoints = absl::GetFlag(FLAGS_keep_checkpoints);
  return o;
}

absl::Status RunReference() {
  PT_RETURN_IF_ERROR(CheckOnlyFlags("reference", With(kTrainingFlags, {"resume"})));
  return RunReferenceCommand(TrainingOptionsFromFlags(), std::cout);
}

// The options of `train` and `local`.
absl::StatusOr<TrainCommandOptions> TrainOptionsFromFlags() {
  TrainCommandOptions o;
  o.training = TrainingOptionsFromFlags();
  o.coordinator = absl::GetFlag(FLAGS_coordinator);
  const int64_t stages = absl::GetFlag(FLAGS_stages);
  o.stages = stages == 0 ? 1 : static_cast<int>(stages);
  o.schedule = absl::GetFlag(FLAGS_schedule);
  const std::string v = absl::GetFlag(FLAGS_virtual);
  if (!v.empty() && !absl::SimpleAtoi(v, &o.virtual_stages)) {
    return absl::InvalidArgumentError(absl::StrCat("--virtual must be an integer, got '", v, "'"));
  }
  o.trace_path = absl::GetFlag(FLAGS_trace);
  return o;
}

const std::set<std::string> kLocalFlags =
    With(kTrainingFlags, {"stages", "schedule", "virtual", "trace", "resume"});

absl::Status RunEvaluate() {
  PT_RETURN_IF_ERROR(
      CheckOnlyFlags("evaluate", {"checkpoint", "data", "data_dir", "eval_samples", "json"}));
  EvaluateCommandOptions o;
  o.checkpoint_dir = absl::GetFlag(FLAGS_checkpoint);
  // --data only when given: by default the data set the checkpoint was trained on.
  const absl::CommandLineFlag& data = absl::GetFlagReflectionHandle(FLAGS_data);
  if (data.CurrentValue() != data.DefaultValue()) o.data = absl::GetFlag(FLAGS_data);
  o.data_dir = absl::GetFlag(FLAGS_data_dir);
  o.eval_samples = absl::GetFlag(FLAGS_eval_samples).value_or(kDefaultEvalSamples);
  o.json = absl::GetFlag(FLAGS_json);
  return RunEvaluateCommand(o, std::cout);
}

absl::Status RunTrain() {
  std::set<std::string> allowed = kLocalFlags;
  allowed.insert(kCoordinatorFlags.begin(), kCoordinatorFlags.end());
  PT_RETURN_IF_ERROR(CheckOnlyFlags("train", allowed));
  PT_ASSIGN_OR_RETURN(TrainCommandOptions o, TrainOptionsFromFlags());
  PT_RETURN_IF_ERROR(ClientSecurityFromFlags(&o.client));
  InterruptScope interrupts;  // Ctrl-C cancels the job between steps instead of killing us.
  return RunTrainCommand(o, std::cout, [] { return InterruptScope::Interrupted(); });
}

// `jobs`, `status JOB`, `cancel JOB`: `job` is the JOB argument ("" for jobs).
absl::Status RunJobCommand(const std::string& command, const std::string& job) {
  std::set<std::string> allowed = kCoordinatorFlags;
  allowed.insert("json");
  if (command == "cancel") allowed.insert("reason");
  PT_RETURN_IF_ERROR(CheckOnlyFlags(command, allowed));
  JobCommandOptions o;
  PT_RETURN_IF_ERROR(ClientSecurityFromFlags(&o.client));
  o.coordinator = absl::GetFlag(FLAGS_coordinator);
  o.job = job;
  o.reason = absl::GetFlag(FLAGS_reason);
  o.json = absl::GetFlag(FLAGS_json);
  if (command == "jobs") return RunJobsCommand(o, std::cout);
  if (command == "status") return RunStatusCommand(o, std::cout);
  return RunCancelCommand(o, std::cout);
}

absl::Status RunLocal() {
  PT_RETURN_IF_ERROR(CheckOnlyFlags("local", kLocalFlags));
  LocalCommandOptions o;
  PT_ASSIGN_OR_RETURN(o.train, TrainOptionsFromFlags());
  return RunLocalCommand(o, std::cout);
}

// "" for a flag left at 0 (not given), else its decimal value.
std::string GivenInt(int64_t v) { return v == 0 ? std::string() : absl::StrCat(v); }

absl::Status RunSchedule() {
  if (auto s = CheckOnlyFlags("schedule",
                              {"kind", "stages", "microbatches", "virtual", "costs", "format"});
      !s.ok()) {
    return s;
  }
  PT_ASSIGN_OR_RETURN(
      ScheduleCommandOptions o,
      ParseScheduleCommandOptions(absl::GetFlag(FLAGS_kind), GivenInt(absl::GetFlag(FLAGS_stages)),
                                  absl::StrCat(absl::GetFlag(FLAGS_microbatches)),
                                  absl::GetFlag(FLAGS_virtual), absl::GetFlag(FLAGS_costs),
                                  absl::GetFlag(FLAGS_format)));
  PT_ASSIGN_OR_RETURN(std::string text, RunScheduleCommand(o));
  std::cout << text;
  return absl::OkStatus();
}

// Per-layer partition costs of a model file: F+B+W FLOPs of one micro-batch of
// batch/microbatches samples, and memory = 4 x parameter bytes (weights, gradients, two AdamW
// moments) + microbatches x (input + stash bytes of one micro-batch), GPipe's worst case.
// Sizes the spec leaves to the data set are resolved against --data.
absl::StatusOr<ModelLayers> ModelLayersFromFile(const std::string& path) {
  PT_ASSIGN_OR_RETURN(v1::ModelSpec spec, model::LoadModelSpecFile(path));
  std::unique_ptr<model::Model> net;
  if (auto built = model::Model::Build(spec); built.ok()) {
    net = std::move(built).value();
  } else {
    // Sizes left to the data set: resolve them exactly as the training commands do.
    PT_ASSIGN_OR_RETURN(TrainingSetup setup,
                        SetUpTraining(spec, absl::GetFlag(FLAGS_data),
                                      absl::GetFlag(FLAGS_data_dir), absl::GetFlag(FLAGS_seed)));
    net = std::move(setup.model);
  }
  const model::Model& m = *net;
  const int64_t batch = absl::GetFlag(FLAGS_batch), mbs = absl::GetFlag(FLAGS_microbatches);
  if (batch < 1 || mbs < 1 || batch % mbs != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--batch (", batch, ") must be a positive multiple of --microbatches (", mbs, ")"));
  }
  const int64_t samples = batch / mbs;
  const int64_t rows = samples * m.tokens_per_sample();
  ModelLayers layers;
  layers.costs = m.LayerFlops(samples);
  const std::vector<int64_t> param_bytes = m.LayerParamBytes();
  for (int64_t l = 0; l < m.num_layers(); ++l) {
    const double activation = static_cast<double>(rows) * m.layer(l).in_features() * 4 +
                              static_cast<double>(m.layer(l).StashBytes(rows));
    layers.memory_bytes.push_back(4.0 * param_bytes[l] + mbs * activation);
  }
  return layers;
}

absl::Status RunPartition() {
  if (auto s = CheckOnlyFlags(
          "partition", {"costs", "model", "data", "data_dir", "batch", "microbatches", "stages",
                        "speeds", "memory_cap", "kind", "virtual", "format"});
      !s.ok()) {
    return s;
  }
  const std::string model_path = absl::GetFlag(FLAGS_model);
  ModelLayers layers;
  if (!model_path.empty()) {
    PT_ASSIGN_OR_RETURN(layers, ModelLayersFromFile(model_path));
  }
  PT_ASSIGN_OR_RETURN(PartitionCommandOptions o,
                      ParsePartitionCommandOptions(
                          absl::GetFlag(FLAGS_costs), absl::GetFlag(FLAGS_speeds),
                          absl::GetFlag(FLAGS_memory_cap), GivenInt(absl::GetFlag(FLAGS_stages)),
                          absl::GetFlag(FLAGS_format), model_path.empty() ? nullptr : &layers,
                          absl::GetFlag(FLAGS_kind), absl::GetFlag(FLAGS_virtual)));
  PT_ASSIGN_OR_RETURN(std::string text, RunPartitionCommand(o));
  std::cout << text;
  return absl::OkStatus();
}

int Main(int argc, char** argv) {
  absl::SetProgramUsageMessage(kUsage);
  std::vector<std::string> normalised = NormaliseFlagNames(argc, argv);
  std::vector<char*> normalised_argv = ArgvOf(normalised);
  std::vector<char*> args =
      absl::ParseCommandLine(static_cast<int>(normalised_argv.size()), normalised_argv.data());
  const std::string command = args.size() >= 2 ? args[1] : "";
  // `status` and `cancel` take the job as their one argument; every other command takes none.
  const size_t arity = command == "status" || command == "cancel" ? 3 : 2;
  if (args.size() > arity || (args.size() < 2)) {
    std::cerr << (args.size() < 2
                      ? "pipetrain: missing command\n"
                      : absl::StrCat("pipetrain: unexpected argument '", args[arity], "'\n"))
              << kUsage << "\n";
    return 2;
  }
  absl::Status status;
  if (command == "reference") {
    status = RunReference();
  } else if (command == "schedule") {
    status = RunSchedule();
  } else if (command == "partition") {
    status = RunPartition();
  } else if (command == "evaluate") {
    status = RunEvaluate();
  } else if (command == "train") {
    status = RunTrain();
  } else if (command == "local") {
    status = RunLocal();
  } else if (command == "jobs" || command == "status" || command == "cancel") {
    status = RunJobCommand(command, args.size() == 3 ? args[2] : "");
  } else {
    std::cerr << "pipetrain: unknown command '" << command << "'\n" << kUsage << "\n";
    return 2;
  }
  std::cout.flush();
  if (!status.ok()) {
    std::cerr << "pipetrain " << command << ": " << status.message() << " ["
              << absl::StatusCodeToString(status.code()) << "]\n";
    return absl::IsCancelled(status) && InterruptScope::Interrupted() ? kInterruptedExitCode : 1;
  }
  return 0;
}

}  // namespace
}  // namespace pipetrain::cli

int main(int argc, char** argv) { return pipetrain::cli::Main(argc, argv); }
