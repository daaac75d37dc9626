// The `pipetrain` command-line client. Flags are parsed here only, into each command's options.
//
//   pipetrain reference --model FILE --data SPEC --steps N --batch B --microbatches M ...
//   pipetrain schedule  --schedule KIND --stages S --microbatches M [--virtual V] --format FMT
//   pipetrain partition --costs c0,c1,... | --model FILE --stages S [--speeds ...] ...
//   pipetrain train     --coordinator HOST:PORT --model FILE --stages S --schedule KIND ...
//   pipetrain local     --stages S --model FILE --schedule KIND ...
//   pipetrain tokenizer train --input FILE --vocab-size N --out DIR ...
//   pipetrain tokenizer encode --input FILE --tokenizer DIR
//   pipetrain export --format hf --resume CHECKPOINT DIR | import --format hf HF_DIR --save DIR
//   pipetrain generate  --resume DIR --prompt TEXT [--max-tokens N --temperature T --top-k K]
//   pipetrain predict   --resume DIR [--data SPEC --out FILE]
//   pipetrain jobs | workers | status JOB | watch JOB | cancel JOB | checkpoint JOB --save DIR
//     [--coordinator HOST:PORT]
#include <sys/ioctl.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <iostream>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "client/cli/export_command.h"
#include "client/cli/inference_commands.h"
#include "client/cli/interrupt.h"
#include "client/cli/job_commands.h"
#include "client/cli/local_command.h"
#include "client/cli/partition_command.h"
#include "client/cli/plan_command.h"
#include "client/cli/reference_command.h"
#include "client/cli/remote_generate.h"
#include "client/cli/schedule_command.h"
#include "client/cli/tokenizer_command.h"
#include "client/cli/train_command.h"
#include "client/cli/training_options.h"
#include "client/cli/training_setup.h"
#include "client/cli/watch_command.h"
#include "common/model/model.h"
#include "common/net/token_auth.h"
#include "common/util/command_line.h"
#include "common/util/cpu_set.h"
#include "common/util/heap_tuning.h"
#include "common/util/lock_checks.h"
#include "common/util/status_macros.h"

// Shared by several commands.
ABSL_FLAG(std::string, model, "", "ModelSpec file (protobuf text format)");
ABSL_FLAG(int64_t, microbatches, 1, "micro-batches per batch (M)");
ABSL_FLAG(int64_t, batch, 64, "samples per training step (B)");
ABSL_FLAG(std::string, format, "",
          "output format (schedule: ascii|json|chrome|svg; "
          "partition: text|json; export/import: hf)");
ABSL_FLAG(int64_t, stages, 0, "pipeline stages (S), >= 1");
// reference
ABSL_FLAG(std::string, data, "",
          "data set: digits | text[:PATH] | csv:PATH | npy:X.npy,Y.npy | npy:DIR | "
          "tokens:PATH[:uint16|:uint32] | synthetic[:ROWS] (docs/data.md)");
ABSL_FLAG(std::string, data_dir, "", "directory of the bundled data sets (digits, text)");
ABSL_FLAG(std::string, tokenizer, "",
          "SentencePiece tokenizer (a directory `pipetrain tokenizer train` wrote, or a .model "
          "file) that turns --data text[:PATH] into token ids; with --resume it must be the "
          "checkpoint's");
// tokenizer train / encode
ABSL_FLAG(std::string, input, "",
          "tokenizer: the text file to train on (train) or encode (encode)");
ABSL_FLAG(std::string, out, "",
          "tokenizer train: the tokenizer directory to write; predict: the CSV file to write "
          "(-: stdout)");
ABSL_FLAG(int64_t, vocab_size, 0, "tokenizer train: pieces in the vocabulary");
ABSL_FLAG(std::string, model_type, "bpe", "tokenizer train: bpe | unigram");
ABSL_FLAG(double, character_coverage, 1.0,
          "tokenizer train: fraction of the text's characters the vocabulary covers, in (0, 1]; "
          "the rarest others become the unknown piece");
ABSL_FLAG(int64_t, steps, 100, "optimizer steps to run (after the checkpoint's, with --resume)");
ABSL_FLAG(uint64_t, seed, 0, "seed for initialisation and shuffling (generate: for sampling)");
ABSL_FLAG(int32_t, threads, 1, "compute threads (per worker for train/local)");
ABSL_FLAG(std::string, optimizer, "adamw",
          "KIND[:key=value,...], KIND sgd|adamw; keys lr, weight_decay, momentum, nesterov, "
          "beta1, beta2, eps, clip_norm");
ABSL_FLAG(std::string, lr_schedule, "constant",
          "learning-rate schedule: constant | warmup-cosine | warmup-linear (linear warm-up over "
          "--warmup-steps updates, then constant or a decay to --lr-min at --lr-decay-steps)");
ABSL_FLAG(int64_t, warmup_steps, 0, "updates of linear learning-rate warm-up");
ABSL_FLAG(int64_t, lr_decay_steps, 0,
          "warmup-cosine/-linear: the update at which the rate reaches --lr-min (give it to stop "
          "and resume mid-schedule)");
ABSL_FLAG(double, lr_min, 0, "warmup-cosine/-linear: the final learning rate, in [0, lr]");
ABSL_FLAG(std::string, save, "",
          "checkpoint directory: a checkpoint at the end, and every --checkpoint-every steps "
          "(train/local: on the coordinator's host, checked when the job is created; checkpoint: "
          "where the job's weights go; import: where the checkpoint goes)");
ABSL_FLAG(std::string, resume, "",
          "the checkpoint directory to read (what --save wrote): training continues from it "
          "(train/local: a directory on the coordinator's host); evaluate/generate/predict use it, "
          "export converts it");
ABSL_FLAG(std::string, checkpoint, "",
          "evaluate/generate/predict: the former name of --resume, still accepted");
ABSL_FLAG(std::string, isa, "",
          "instruction set of the math, x86-64-v3 or x86-64-v4 (train/local: the job's, which "
          "every worker must run)");
ABSL_FLAG(std::string, max_isa, "",
          "reference/local: the highest instruction set to use (local: each worker's --max-isa)");
ABSL_FLAG(bool, json, false, "print one JSON object per line");
ABSL_FLAG(std::optional<int64_t>, eval_samples, std::nullopt,
          "held-out samples to evaluate at the end (0: all; train/local: the job's final weights "
          "through the coordinator, and only when given)");
ABSL_FLAG(int64_t, eval_every, 0,
          "held-out evaluation (of --eval-samples samples) after every N-th step (train/local: "
          "the job's weights, through the coordinator)");
ABSL_FLAG(int64_t, log_every, 10,
          "steps between progress lines (without --json; watch: step numbers between them)");
ABSL_FLAG(int64_t, checkpoint_every, 0,
          "with --save: also checkpoint after every step whose number is a multiple of N");
ABSL_FLAG(int32_t, keep_checkpoints, 2,
          "checkpoints to keep (>= 1): the newest in --save DIR, the K-1 before it beside it as "
          "DIR.step-<12 digits>");
// generate / predict
ABSL_FLAG(std::string, prompt, "", "generate: the text to continue");
ABSL_FLAG(int64_t, max_tokens, 200, "generate: tokens (characters) to generate");
ABSL_FLAG(double, temperature, 1.0, "generate: logits are divided by it; 0: greedy");
ABSL_FLAG(int64_t, top_k, 0, "generate: sample among the K most likely tokens (0: all of them)");
ABSL_FLAG(std::string, job, "",
          "generate: the id of a running job to generate from through the service (with "
          "--coordinator and --data), instead of a checkpoint");
// train / local
ABSL_FLAG(std::string, coordinator, "", "the coordinator's HOST:PORT (its --listen)");
ABSL_FLAG(std::string, tls_cert, "", "this client's PEM certificate (mTLS to the coordinator)");
ABSL_FLAG(std::string, tls_key, "", "the private key of --tls-cert");
ABSL_FLAG(std::string, tls_ca, "", "PEM CA certificate that signs the coordinator's (TLS on)");
ABSL_FLAG(std::string, token_file, "", "send the first token of this file to the coordinator");
ABSL_FLAG(std::string, schedule, "1f1b",
          "pipeline schedule gpipe|1f1b|interleaved|zb-h1|zb-v|dualpipe-v|1f1b-overlap|"
          "interleaved-overlap|dualpipe (dualpipe: two copies of the stages, S and M even)");
ABSL_FLAG(std::string, trace, "",
          "train/local: write the measured timeline of the last step (or of --trace-steps) to "
          "FILE: FILE.svg an SVG picture, FILE.txt an ASCII picture, any other name a Chrome "
          "trace for Perfetto (compute, wait, send and receive spans per rank)");
ABSL_FLAG(std::string, trace_steps, "", "train/local: with --trace, the steps A:B (or A) to trace");
ABSL_FLAG(absl::Duration, replace_timeout, absl::Seconds(30),
          "train/local: how long a job that lost a worker waits for an idle one to take its place");
ABSL_FLAG(int32_t, replicas, 1,
          "train/local: data-parallel replicas R: R copies of the --stages pipeline on R x S "
          "workers, each running M / R of a step's micro-batches (a power of two dividing "
          "--microbatches; bitwise the same result; docs/scaling.md, \"Replicas\")");
ABSL_FLAG(int32_t, min_stages, 0,
          "train/local: with no replacement in time, re-partition onto the surviving workers with "
          "fewer stages, down to this many");
ABSL_FLAG(int32_t, max_stages, 0,
          "train/local: grow the job onto idle workers at a step boundary, after a checkpoint it "
          "takes for it, up to this many stages (docs/scaling.md, \"Jobs that change shape\")");
ABSL_FLAG(int32_t, max_replicas, 0,
          "train/local: grow the job up to this many data-parallel replicas (JobSpec.max_replicas; "
          "docs/scaling.md, \"Jobs that change shape\")");
ABSL_FLAG(bool, pin_workers, true,
          "local: run each stage worker on CPUs of its own (--threads each) when they fit the "
          "CPUs here (faster transfers; docs/performance.md, \"One core per worker\"); false: "
          "let the scheduler place them");
ABSL_FLAG(absl::Duration, reconnect_timeout, absl::Minutes(1),
          "train: how long to wait for a coordinator that went away (restarting with --state-dir) "
          "to answer again before giving up");
// jobs / status / watch / cancel
ABSL_FLAG(std::string, reason, "", "cancel: why the job is cancelled (recorded with the job)");
// schedule / partition
ABSL_FLAG(std::string, kind, "",
          "schedule/partition: the former name of --schedule, still accepted");
ABSL_FLAG(std::string, virtual, "", "virtual stages (V): chunks per rank");
ABSL_FLAG(std::string, costs, "",
          "schedule: F,B,I,W times of one worker's share; partition: per-layer costs c0,c1,...");
ABSL_FLAG(std::string, speeds, "", "partition: relative speed of each rank s0,s1,...");
ABSL_FLAG(std::string, memory_cap, "",
          "partition/plan: memory cap per rank (one value or one per rank; K/M/G/KiB/MiB/GiB)");
// plan (and train/local --plan auto)
ABSL_FLAG(std::string, plan, "",
          "train/local: auto = run the best plan of `pipetrain plan` (stages, schedule, virtual "
          "stages, micro-batches) instead of --stages/--schedule/--virtual/--microbatches");
ABSL_FLAG(int32_t, local, 0, "plan: plan for N workers on this host (instead of --coordinator)");
// Unset: measured (the plan command's shown defaults say how).
ABSL_FLAG(std::optional<double>, link_latency, std::nullopt,
          "plan: seconds a message between two workers takes besides its bytes");
ABSL_FLAG(std::optional<double>, link_bandwidth, std::nullopt,
          "plan: bytes per second between two workers (0: infinite)");
ABSL_FLAG(std::optional<double>, message_cpu, std::nullopt,
          "plan: CPU seconds a worker spends on each tensor it sends or receives");
ABSL_FLAG(double, step_overhead, 1.2e-3,
          "plan: seconds per step outside the workers' actions (the coordinator's round trips)");
ABSL_FLAG(int32_t, top, 10, "plan: how many of the ranked plans to print");
ABSL_FLAG(
    std::string, partition_by, "measured",
    "plan: what each plan is cut by: measured (the layers' costs timed here, what --plan auto "
    "sends the coordinator) or flops (what a run without --plan auto is cut by)");

namespace pipetrain::cli {
namespace {

// Each command's flags, in the order `pipetrain COMMAND --help` lists them. A new flag is an
// ABSL_FLAG above plus its name in the lists of the commands that use it; every other command
// refuses it (tests/client/cli/cli_flags_test.cc checks that each flag has a command).
// clang-format off
const std::vector<std::string> kTrainingFlags = {
    "model", "data", "data_dir", "tokenizer",                         // what to train on
    "steps", "batch", "microbatches", "seed", "threads", "optimizer",  // the loop
    "lr_schedule", "warmup_steps", "lr_decay_steps", "lr_min",        // learning rate
    "json", "eval_samples", "eval_every", "log_every",                // output
    "save", "checkpoint_every", "keep_checkpoints", "resume",         // checkpoints
    "isa"};                                                           // instruction set
const std::vector<std::string> kPipelineFlags = {"stages",      "schedule",   "virtual",
                                                 "trace",       "trace_steps", "min_stages",
                                                 "replace_timeout", "plan",     "replicas",
                                                 "max_stages",      "max_replicas"};
// How a command reaches a coordinator securely: TLS files and a token (docs/security.md).
const std::vector<std::string> kSecurityFlags = {"tls_cert", "tls_key", "tls_ca", "token_file"};
const std::vector<std::string> kJobFlags = {"coordinator", "json",    "tls_cert",
                                            "tls_key",     "tls_ca",  "token_file"};
// clang-format on
// The defaults `train` and `local` use where the flag's own stands for "not given".
const std::map<std::string, std::string> kPipelineDefaults = {
    {"model", kRequired}, {"stages", "1"}, {"isa", "the highest all the job's workers run"}};
// The headings `pipetrain COMMAND --help` lists flags under, each flag under one.
const std::vector<HelpTopic> kFlagTopics = {
    {"model and data",
     {"model", "data", "data_dir", "tokenizer", "batch", "steps", "seed", "eval_samples",
      "eval_every", "input", "out", "vocab_size", "model_type", "character_coverage"}},
    {"schedule", {"schedule",       "kind",         "stages",        "replicas",   "microbatches",
                  "virtual",        "costs",        "speeds",        "memory_cap", "min_stages",
                  "max_stages",     "max_replicas", "plan",          "local",      "link_latency",
                  "link_bandwidth", "message_cpu",  "step_overhead", "top",        "partition_by"}},
    {"optimizer", {"optimizer", "lr_schedule", "warmup_steps", "lr_decay_steps", "lr_min"}},
    {"checkpoints", {"save", "checkpoint_every", "keep_checkpoints", "resume", "checkpoint"}},
    {"compute", {"threads", "isa", "max_isa", "pin_workers"}},
    {"service",
     {"coordinator", "reconnect_timeout", "replace_timeout", "reason", "tls_cert", "tls_key",
      "tls_ca", "token_file"}},
    {"output", {"json", "log_every", "format", "trace", "trace_steps", "out"}},
    {"generation", {"prompt", "max_tokens", "temperature", "top_k", "job"}}};
// The headings `pipetrain help` lists the commands under.
const std::vector<HelpTopic> kCommandTopics = {
    {"training commands", {"reference", "train", "local", "evaluate"}},
    {"data commands", {"tokenizer"}},
    {"checkpoints in other formats", {"export", "import"}},
    {"using a checkpoint", {"generate", "predict"}},
    {"planning commands (no coordinator needed)", {"schedule", "partition", "plan"}},
    {"commands for a coordinator's jobs and workers",
     {"jobs", "status", "watch", "cancel", "workers"}}};

// `base` followed by `more`.
std::vector<std::string> Concat(std::vector<std::string> base,
                                const std::vector<std::string>& more) {
  base.insert(base.end(), more.begin(), more.end());
  return base;
}

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

// The shown default of one of plan's link flags whose fallback is `fallback` (docs/scaling.md,
// "The cost model").
std::string MeasuredLink(const char* fallback) {
  return absl::StrCat(
      "measured: on this host's loopback (--local), the worst the coordinator's workers measured "
      "(--coordinator), else ",
      fallback);
}

// The commands, their arguments, summaries and flags.
const ProgramSpec& Program() {
  static const ProgramSpec* const program = new ProgramSpec{
      "pipetrain",
      "pipeline-parallel training: the reference trainer, schedules and partitions, and the "
      "client of a coordinator and its stage workers",
      {
          {"reference",
           "",
           "train in one process with the reference trainer (the oracle)",
           Concat(kTrainingFlags, {"max_isa"}),
           {{"model", kRequired}, {"isa", "the highest this CPU runs"}, {"eval_samples", "1000"}}},
          {"schedule",
           "",
           "generate, validate, simulate and draw a pipeline schedule",
           {"schedule", "kind", "stages", "microbatches", "virtual", "costs", "format"},
           {{"schedule", kRequired}, {"stages", kRequired}, {"format", "ascii"}}},
          {"partition",
           "",
           "split a model's layers across stages (exact min-max)",
           {"costs", "model", "data", "data_dir", "tokenizer", "batch", "microbatches", "stages",
            "speeds", "memory_cap", "schedule", "kind", "virtual", "format"},
           {{"stages", kRequired},
            {"schedule", "none: one chunk per stage"},
            {"format", "text"},
            {"virtual", "the schedule's, else 1"}}},
          {"plan",
           "",
           "rank every plan (replicas, stages, schedule, virtual stages, micro-batches) by "
           "predicted samples/s on a coordinator's workers or --local N here (docs/scaling.md)",
           Concat({"model", "data", "data_dir", "tokenizer", "batch", "seed", "threads",
                   "optimizer", "isa", "local", "coordinator", "memory_cap", "link_latency",
                   "link_bandwidth", "message_cpu", "step_overhead", "top", "json", "partition_by"},
                  kSecurityFlags),
           {{"model", kRequired},
            {"local", "none: give --coordinator"},
            {"isa", "the highest this CPU runs"},
            {"memory_cap", "each worker's memory (--local: this host's / N)"},
            {"link_latency", MeasuredLink("100e-6")},
            {"link_bandwidth", MeasuredLink("2e9")},
            {"message_cpu", MeasuredLink("30e-6")}}},
          {"train", "", "train on a running coordinator and its stage workers",
           Concat(
               Concat(Concat({"coordinator", "reconnect_timeout"}, kSecurityFlags), kTrainingFlags),
               kPipelineFlags),
           kPipelineDefaults},
          {"local", "", "start a coordinator and --stages workers here, then train on them",
           Concat(Concat(kTrainingFlags, kPipelineFlags), {"max_isa", "pin_workers"}),
           kPipelineDefaults},
          {"evaluate",
           "",
           "held-out loss and accuracy of a checkpoint",
           {"resume", "checkpoint", "data", "data_dir", "tokenizer", "eval_samples", "json"},
           {{"resume", kRequired},
            {"data", "the checkpoint's"},
            {"tokenizer", "the checkpoint's"},
            {"eval_samples", "1000"}}},
          {"tokenizer",
           "train|encode",
           "train a SentencePiece tokenizer on a text file, or print a text's token ids "
           "(docs/tokenizer.md)",
           {"input", "out", "vocab_size", "model_type", "character_coverage", "tokenizer", "json"},
           {{"input", kRequired},
            {"out", "required by train"},
            {"vocab_size", "required by train"},
            {"tokenizer", "required by encode"}}},
          {"export",
           "DIR",
           "write a checkpoint in the Hugging Face layout (safetensors, config.json) into DIR",
           {"format", "resume", "data", "data_dir"},
           {{"format", kRequired}, {"resume", kRequired}, {"data", "the checkpoint's"}}},
          {"import",
           "HF_DIR",
           "read a Hugging Face directory (what export wrote) into a checkpoint",
           {"format", "save", "keep_checkpoints"},
           {{"format", kRequired}, {"save", kRequired}}},
          {"generate",
           "",
           "continue a text with a checkpoint of a language model",
           {"resume", "checkpoint", "prompt", "max_tokens", "temperature", "top_k", "seed", "data",
            "data_dir", "tokenizer", "job", "coordinator", "tls_cert", "tls_key", "tls_ca",
            "token_file"},
           {{"resume", "required unless --job"},
            {"tokenizer", "with --job: the job's tokenizer, else --data's byte vocabulary"},
            {"prompt", kRequired},
            {"data", "the checkpoint's"},
            {"top_k", "the whole vocabulary"}}},
          {"predict",
           "",
           "write a checkpoint's outputs for the held-out rows of a data set (CSV)",
           {"resume", "checkpoint", "data", "data_dir", "eval_samples", "out"},
           {{"resume", kRequired},
            {"data", "the checkpoint's"},
            {"eval_samples", "all"},
            {"out", "standard output"}}},
          {"jobs", "", "list a coordinator's jobs", kJobFlags},
          {"status", "JOB", "one job's state, progress and stages", kJobFlags},
          {"watch", "JOB", "follow a job's steps, recoveries and checkpoints until it ends",
           Concat(kJobFlags, {"log_every"})},
          {"cancel", "JOB", "cancel a job and free its workers", Concat(kJobFlags, {"reason"})},
          {"workers", "", "list a coordinator's stage workers and the job each serves", kJobFlags},
          {"checkpoint",
           "JOB",
           "save a job's weights (e.g. after train's final save failed), then finish it",
           Concat(kJobFlags, {"save", "keep_checkpoints"}),
           {{"save", kRequired}}},
      },
      {},
      "environment:\n"
      "  PIPETRAIN_COORDINATOR  HOST:PORT used by train, jobs, workers, status, watch, cancel and\n"
      "                         checkpoint when --coordinator is not given\n"
      "  PIPETRAIN_TOKEN        the token sent to a TLS coordinator when --token-file is not "
      "given\n"
      "  PIPETRAIN_COORDINATOR_BINARY, PIPETRAIN_STAGE_WORKER_BINARY  the daemons `local` "
      "starts\n"
      "                         (default: beside this binary, else in its build tree)\n"
      "configuration files: --flagfile FILE (any command) reads flags from FILE, one per line\n"
      "  (--name=value or --name value; '#' starts a comment); see docs/cli.md.\n",
      // Defaults that the flag's own ("" or 0) stands for.
      {{"data_dir", "$PIPETRAIN_DATA_DIR, else ../share/pipetrain/data beside this binary"},
       {"data", "what --model implies: text for an embedding model, digits if it fits"},
       {"coordinator", "$PIPETRAIN_COORDINATOR"},
       {"token_file", "$PIPETRAIN_TOKEN, with TLS"},
       {"virtual", "the schedule's"},
       {"lr_decay_steps", "--steps"},
       {"eval_every", "none"},
       {"checkpoint_every", "only at the end"},
       {"min_stages", "never: the job fails instead"},
       {"max_stages", "never grow"},
       {"max_replicas", "never grow"},
       {"trace_steps", "the last step"}},
      kFlagTopics,
      kCommandTopics};
  return *program;
}

// The options of every training command, from the flags: one place for reference, train, local.
TrainingOptions TrainingOptionsFromFlags(const CommandLine& line) {
  TrainingOptions o;
  o.model_path = absl::GetFlag(FLAGS_model);
  o.data = absl::GetFlag(FLAGS_data);
  // No --data: what the model implies (a model file that cannot be read or implies nothing leaves
  // it empty, and SetUpTraining reports why).
  if (o.data.empty()) {
    absl::StatusOr<v1::ModelSpec> spec = model::LoadModelSpecFile(o.model_path);
    absl::StatusOr<std::string> implied =
        spec.ok() ? DefaultDataFor(*spec) : absl::StatusOr<std::string>(spec.status());
    if (implied.ok()) o.data = *implied;
  }
  o.data_dir = absl::GetFlag(FLAGS_data_dir);
  o.tokenizer = absl::GetFlag(FLAGS_tokenizer);
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
  o.eval_every = absl::GetFlag(FLAGS_eval_every);
  o.checkpoint_every = absl::GetFlag(FLAGS_checkpoint_every);
  o.keep_checkpoints = absl::GetFlag(FLAGS_keep_checkpoints);
  o.isa = absl::GetFlag(FLAGS_isa);
  o.max_isa = absl::GetFlag(FLAGS_max_isa);
  // The schedule flags override --optimizer's keys only when given.
  if (line.Given("lr_schedule")) o.lr_schedule = absl::GetFlag(FLAGS_lr_schedule);
  if (line.Given("warmup_steps")) o.warmup_steps = absl::GetFlag(FLAGS_warmup_steps);
  if (line.Given("lr_decay_steps") && absl::GetFlag(FLAGS_lr_decay_steps) != 0) {
    o.lr_decay_steps = absl::GetFlag(FLAGS_lr_decay_steps);
  }
  if (line.Given("lr_min")) o.lr_min = static_cast<float>(absl::GetFlag(FLAGS_lr_min));
  // A live progress line on a terminal that understands "\r" and erase-to-end-of-line.
  const char* term = std::getenv("TERM");
  o.terminal = isatty(STDOUT_FILENO) == 1 && !(term != nullptr && std::string(term) == "dumb");
  struct winsize size;
  if (o.terminal && ioctl(STDOUT_FILENO, TIOCGWINSZ, &size) == 0) o.terminal_columns = size.ws_col;
  return o;
}

absl::Status RunReference(const CommandLine& line) {
  return RunReferenceCommand(TrainingOptionsFromFlags(line), std::cout);
}

// --coordinator if given, else $PIPETRAIN_COORDINATOR, else "".
std::string CoordinatorAddress(const CommandLine& line) {
  if (line.Given("coordinator")) return absl::GetFlag(FLAGS_coordinator);
  const char* env = std::getenv("PIPETRAIN_COORDINATOR");
  return env == nullptr ? "" : env;
}

// The options of `train` and `local`.
absl::StatusOr<TrainCommandOptions> TrainOptionsFromFlags(const CommandLine& line) {
  TrainCommandOptions o;
  o.training = TrainingOptionsFromFlags(line);
  o.coordinator = CoordinatorAddress(line);
  // Not given: one stage; given, it must be >= 1 (CheckTrainCommandOptions).
  if (line.Given("stages")) {
    const int64_t stages = absl::GetFlag(FLAGS_stages);
    if (stages < 0 || stages > std::numeric_limits<int>::max()) {
      return absl::InvalidArgumentError(absl::StrCat("--stages must be >= 1, got ", stages));
    }
    o.stages = static_cast<int>(stages);
  }
  o.replicas = absl::GetFlag(FLAGS_replicas);
  o.schedule = absl::GetFlag(FLAGS_schedule);
  const std::string v = absl::GetFlag(FLAGS_virtual);
  if (!v.empty() && !absl::SimpleAtoi(v, &o.virtual_stages)) {
    return absl::InvalidArgumentError(absl::StrCat("--virtual must be an integer, got '", v, "'"));
  }
  o.trace_path = absl::GetFlag(FLAGS_trace);
  if (line.Given("trace_steps")) {
    PT_ASSIGN_OR_RETURN(o.trace_steps, ParseTraceSteps(absl::GetFlag(FLAGS_trace_steps)));
  }
  o.replace_timeout = absl::GetFlag(FLAGS_replace_timeout);
  o.min_stages = absl::GetFlag(FLAGS_min_stages);
  o.max_stages = absl::GetFlag(FLAGS_max_stages);
  o.max_replicas = absl::GetFlag(FLAGS_max_replicas);
  o.reconnect_timeout = absl::GetFlag(FLAGS_reconnect_timeout);
  return o;
}

// The value of the flag `name`, or of `alias` (its former name) when only that was given; ""
// when neither was (whatever `name`'s default). Both given: INVALID_ARGUMENT.
absl::StatusOr<std::string> FlagOrAlias(const CommandLine& line, const char* name,
                                        const std::string& value, const char* alias,
                                        const std::string& alias_value) {
  if (line.Given(name) && line.Given(alias)) {
    return absl::InvalidArgumentError(absl::StrCat(DashedFlag(alias), " is the former name of ",
                                                   DashedFlag(name), ": give one of them"));
  }
  if (line.Given(name)) return value;
  return line.Given(alias) ? alias_value : std::string();
}

// schedule/partition: --schedule, else its former name --kind; "" if neither was given (the
// flag's default, 1f1b, is train's and local's).
absl::StatusOr<std::string> ScheduleKindFromFlags(const CommandLine& line) {
  return FlagOrAlias(line, "schedule", absl::GetFlag(FLAGS_schedule), "kind",
                     absl::GetFlag(FLAGS_kind));
}

absl::Status RunEvaluate(const CommandLine& line) {
  EvaluateCommandOptions o;
  PT_ASSIGN_OR_RETURN(o.checkpoint_dir, FlagOrAlias(line, "resume", absl::GetFlag(FLAGS_resume),
                                                    "checkpoint", absl::GetFlag(FLAGS_checkpoint)));
  // --data only when given: by default the data set the checkpoint was trained on.
  if (line.Given("data")) o.data = absl::GetFlag(FLAGS_data);
  o.data_dir = absl::GetFlag(FLAGS_data_dir);
  o.tokenizer = absl::GetFlag(FLAGS_tokenizer);
  o.eval_samples = absl::GetFlag(FLAGS_eval_samples).value_or(kDefaultEvalSamples);
  o.json = absl::GetFlag(FLAGS_json);
  return RunEvaluateCommand(o, std::cout);
}

// `tokenizer ACTION` (train, encode).
absl::Status RunTokenizer(const CommandLine& line) {
  TokenizerCommandOptions o;
  o.action = line.args.empty() ? "" : line.args[0];
  o.input = absl::GetFlag(FLAGS_input);
  o.out_dir = absl::GetFlag(FLAGS_out);
  o.tokenizer = absl::GetFlag(FLAGS_tokenizer);
  o.train.vocab_size = absl::GetFlag(FLAGS_vocab_size);
  o.train.model_type = absl::GetFlag(FLAGS_model_type);
  o.train.character_coverage = absl::GetFlag(FLAGS_character_coverage);
  o.json = absl::GetFlag(FLAGS_json);
  return RunTokenizerCommand(o, std::cout);
}

// `export DIR` and `import HF_DIR`: `dir` is the argument ("" if missing).
absl::Status RunExportOrImport(const CommandLine& line, const std::string& dir) {
  if (line.command->name == "export") {
    return RunExportCommand(
        {absl::GetFlag(FLAGS_format), absl::GetFlag(FLAGS_resume), dir,
         line.Given("data") ? absl::GetFlag(FLAGS_data) : "", absl::GetFlag(FLAGS_data_dir)},
        std::cout);
  }
  return RunImportCommand({absl::GetFlag(FLAGS_format), dir, absl::GetFlag(FLAGS_save),
                           absl::GetFlag(FLAGS_keep_checkpoints)},
                          std::cout);
}

absl::Status RunGenerate(const CommandLine& line) {
  if (line.Given("job")) {  // a running job's live weights, through the service.
    RemoteGenerateOptions r;
    PT_RETURN_IF_ERROR(ClientSecurityFromFlags(&r.client));
    r.coordinator = CoordinatorAddress(line);
    r.job = absl::GetFlag(FLAGS_job);
    if (line.Given("data")) r.data = absl::GetFlag(FLAGS_data);
    r.data_dir = absl::GetFlag(FLAGS_data_dir);
    r.tokenizer = absl::GetFlag(FLAGS_tokenizer);
    r.prompt = absl::GetFlag(FLAGS_prompt);
    r.max_tokens = absl::GetFlag(FLAGS_max_tokens);
    r.sampling = {absl::GetFlag(FLAGS_temperature), absl::GetFlag(FLAGS_top_k),
                  absl::GetFlag(FLAGS_seed)};
    return RunRemoteGenerateCommand(r, std::cout);
  }
  if (line.Given("tokenizer")) {
    return absl::InvalidArgumentError(
        "--tokenizer is for --job: a checkpoint carries the tokenizer it was trained with");
  }
  GenerateCommandOptions o;
  PT_ASSIGN_OR_RETURN(o.checkpoint_dir, FlagOrAlias(line, "resume", absl::GetFlag(FLAGS_resume),
                                                    "checkpoint", absl::GetFlag(FLAGS_checkpoint)));
  if (line.Given("data")) o.data = absl::GetFlag(FLAGS_data);
  o.data_dir = absl::GetFlag(FLAGS_data_dir);
  o.prompt = absl::GetFlag(FLAGS_prompt);
  o.max_tokens = absl::GetFlag(FLAGS_max_tokens);
  o.sampling = {absl::GetFlag(FLAGS_temperature), absl::GetFlag(FLAGS_top_k),
                absl::GetFlag(FLAGS_seed)};
  return RunGenerateCommand(o, std::cout);
}

absl::Status RunPredict(const CommandLine& line) {
  PredictCommandOptions o;
  PT_ASSIGN_OR_RETURN(o.checkpoint_dir, FlagOrAlias(line, "resume", absl::GetFlag(FLAGS_resume),
                                                    "checkpoint", absl::GetFlag(FLAGS_checkpoint)));
  if (line.Given("data")) o.data = absl::GetFlag(FLAGS_data);
  o.data_dir = absl::GetFlag(FLAGS_data_dir);
  o.out = absl::GetFlag(FLAGS_out);
  if (o.out.empty()) o.out = "-";  // not given: standard output.
  o.samples = absl::GetFlag(FLAGS_eval_samples).value_or(0);
  return RunPredictCommand(o, std::cout);
}

// The options of `plan` from its flags.
absl::StatusOr<PlanCommandOptions> PlanOptionsFromFlags(const CommandLine& line) {
  PlanCommandOptions o;
  o.training = TrainingOptionsFromFlags(line);
  o.local_workers = absl::GetFlag(FLAGS_local);
  if (!line.Given("local")) o.coordinator = CoordinatorAddress(line);
  PT_RETURN_IF_ERROR(ClientSecurityFromFlags(&o.client));
  if (const std::string caps = absl::GetFlag(FLAGS_memory_cap); !caps.empty()) {
    for (absl::string_view part : absl::StrSplit(caps, ',')) {
      PT_ASSIGN_OR_RETURN(double cap, ParseMemoryBytes(part));
      o.memory_caps.push_back(cap);
    }
  }
  o.link_latency_seconds = absl::GetFlag(FLAGS_link_latency);
  o.link_bytes_per_second = absl::GetFlag(FLAGS_link_bandwidth);
  o.message_cpu_seconds = absl::GetFlag(FLAGS_message_cpu);
  o.step_overhead_seconds = absl::GetFlag(FLAGS_step_overhead);
  o.top = absl::GetFlag(FLAGS_top);
  o.json = absl::GetFlag(FLAGS_json);
  const std::string by = absl::GetFlag(FLAGS_partition_by);
  if (by != "measured" && by != "flops") {
    return absl::InvalidArgumentError(
        absl::StrCat("--partition-by must be measured or flops, got '", by, "'"));
  }
  o.partition_by_layer_costs = by == "measured";
  return o;
}

absl::Status RunPlan(const CommandLine& line) {
  PT_ASSIGN_OR_RETURN(PlanCommandOptions o, PlanOptionsFromFlags(line));
  return RunPlanCommand(o, std::cout);
}

// --plan auto: the best plan of `pipetrain plan` (for `local_workers` workers here, or 0: the
// coordinator's idle workers) replaces the stages, replicas, schedule, virtual stages,
// micro-batches and the layer costs the coordinator cuts by of `t`; says
// which on standard output (standard error with --json). No --plan: nothing.
absl::Status ApplyAutoPlan(const CommandLine& line, int local_workers, TrainCommandOptions* t) {
  const std::string mode = absl::GetFlag(FLAGS_plan);
  if (!line.Given("plan")) return absl::OkStatus();
  if (mode != "auto") {
    return absl::InvalidArgumentError(absl::StrCat("--plan must be auto, got '", mode, "'"));
  }
  for (const char* flag : {"schedule", "virtual", "microbatches", "replicas"}) {
    if (line.Given(flag)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--plan auto chooses ", DashedFlag(flag), ": give one of them, not both"));
    }
  }
  PlanCommandOptions o;
  o.training = t->training;
  o.local_workers = local_workers;
  o.coordinator = local_workers > 0 ? "" : t->coordinator;
  o.client = t->client;
  PT_ASSIGN_OR_RETURN(const PlanResult result, ComputePlans(o));
  PT_ASSIGN_OR_RETURN(const plan::PlanChoice best, BestPlan(result));
  t->stages = best.stages;
  t->replicas = best.replicas;
  t->schedule = std::string(schedule::ScheduleKindName(best.kind));
  t->virtual_stages = best.virtual_stages;
  t->training.microbatches = best.microbatches;
  t->layer_costs = best.layer_costs;
  (t->training.json ? std::cerr : std::cout) << absl::StrFormat(
      "plan auto: %s of %d plans on %d workers: predicted %.0f samples/s, step %.2f ms, bubble "
      "%.1f%%; %s\n",
      plan::PlanLabel(best), result.plans.size(), result.workers.size(), best.samples_per_second,
      best.step_seconds * 1e3, best.bubble * 100, LinkFiguresText(result.link));
  return absl::OkStatus();
}

absl::Status RunTrain(const CommandLine& line) {
  PT_ASSIGN_OR_RETURN(TrainCommandOptions o, TrainOptionsFromFlags(line));
  PT_RETURN_IF_ERROR(ClientSecurityFromFlags(&o.client));
  if (line.Given("plan") && line.Given("stages")) {
    return absl::InvalidArgumentError(
        "--plan auto chooses --stages from the coordinator's idle workers: give one of them");
  }
  PT_RETURN_IF_ERROR(ApplyAutoPlan(line, 0, &o));
  InterruptScope interrupts;  // Ctrl-C cancels the job between steps instead of killing us.
  return RunTrainCommand(o, std::cout, [] { return InterruptScope::Interrupted(); });
}

// `watch JOB`: Ctrl-C (SIGINT) or SIGTERM ends the watch, not the job.
absl::Status RunWatch(const CommandLine& line, const std::string& job) {
  WatchCommandOptions o;
  PT_RETURN_IF_ERROR(ClientSecurityFromFlags(&o.client));
  o.coordinator = CoordinatorAddress(line);
  o.job = job;
  o.json = absl::GetFlag(FLAGS_json);
  o.log_every = absl::GetFlag(FLAGS_log_every);
  if (o.log_every < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--log-every must be >= 1, got ", o.log_every));
  }
  InterruptScope interrupts;
  return RunWatchCommand(o, std::cout);
}

// `jobs`, `workers`, `status JOB`, `cancel JOB`, `checkpoint JOB`: `job` is the JOB argument (""
// for jobs and workers).
absl::Status RunJobCommand(const CommandLine& line, const std::string& job) {
  const std::string& command = line.command->name;
  JobCommandOptions o;
  PT_RETURN_IF_ERROR(ClientSecurityFromFlags(&o.client));
  o.coordinator = CoordinatorAddress(line);
  o.job = job;
  o.reason = absl::GetFlag(FLAGS_reason);
  o.json = absl::GetFlag(FLAGS_json);
  o.save_dir = absl::GetFlag(FLAGS_save);
  o.keep_checkpoints = absl::GetFlag(FLAGS_keep_checkpoints);
  if (command == "jobs") return RunJobsCommand(o, std::cout);
  if (command == "workers") return RunWorkersCommand(o, std::cout);
  if (command == "status") return RunStatusCommand(o, std::cout);
  if (command == "checkpoint") return RunCheckpointCommand(o, std::cout);
  return RunCancelCommand(o, std::cout);
}

// The value of the environment variable `name`, "" when unset.
std::string Environment(const char* name) {
  const char* value = std::getenv(name);
  return value == nullptr ? "" : value;
}

absl::Status RunLocal(const CommandLine& line) {
  LocalCommandOptions o;
  PT_ASSIGN_OR_RETURN(o.train, TrainOptionsFromFlags(line));
  // --plan auto: --stages is how many workers it may start (default: one per --threads CPUs).
  const int workers =
      line.Given("stages")
          ? o.train.stages
          : std::max(1, util::UsableCpuCount() / std::max(1, o.train.training.threads));
  PT_RETURN_IF_ERROR(ApplyAutoPlan(line, workers, &o.train));
  o.pin_workers = absl::GetFlag(FLAGS_pin_workers);
  o.coordinator_binary = Environment(kCoordinatorBinaryEnv);
  o.worker_binary = Environment(kStageWorkerBinaryEnv);
  return RunLocalCommand(o, std::cout);
}

// The flag's decimal value if it was given, else "".
std::string GivenInt(const CommandLine& line, const char* name, int64_t v) {
  return line.Given(name) ? absl::StrCat(v) : std::string();
}

absl::Status RunSchedule(const CommandLine& line) {
  PT_ASSIGN_OR_RETURN(const std::string kind, ScheduleKindFromFlags(line));
  PT_ASSIGN_OR_RETURN(
      ScheduleCommandOptions o,
      ParseScheduleCommandOptions(kind, GivenInt(line, "stages", absl::GetFlag(FLAGS_stages)),
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
// Sizes the spec leaves to the data set are resolved against --data and, with --tokenizer, the
// tokenizer's vocabulary, exactly as the training commands resolve them (a tokenizer is always
// checked against the model, as training would).
absl::StatusOr<ModelLayers> ModelLayersFromFile(const std::string& path) {
  PT_ASSIGN_OR_RETURN(v1::ModelSpec spec, model::LoadModelSpecFile(path));
  PT_ASSIGN_OR_RETURN(std::shared_ptr<const io::Tokenizer> tokenizer,
                      TokenizerForRun(absl::GetFlag(FLAGS_tokenizer), "", std::nullopt));
  std::unique_ptr<model::Model> net;
  if (auto built = model::Model::Build(spec); built.ok() && tokenizer == nullptr) {
    net = std::move(built).value();
  } else {
    // Sizes left to the data set: resolve them exactly as the training commands do.
    PT_ASSIGN_OR_RETURN(
        TrainingSetup setup,
        SetUpTraining(spec, absl::GetFlag(FLAGS_data), absl::GetFlag(FLAGS_data_dir),
                      absl::GetFlag(FLAGS_seed), math::DefaultIsa(), std::move(tokenizer)));
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

absl::Status RunPartition(const CommandLine& line) {
  PT_ASSIGN_OR_RETURN(const std::string kind, ScheduleKindFromFlags(line));
  const std::string model_path = absl::GetFlag(FLAGS_model);
  ModelLayers layers;
  if (!model_path.empty()) {
    PT_ASSIGN_OR_RETURN(layers, ModelLayersFromFile(model_path));
  }
  PT_ASSIGN_OR_RETURN(
      PartitionCommandOptions o,
      ParsePartitionCommandOptions(
          absl::GetFlag(FLAGS_costs), absl::GetFlag(FLAGS_speeds), absl::GetFlag(FLAGS_memory_cap),
          GivenInt(line, "stages", absl::GetFlag(FLAGS_stages)), absl::GetFlag(FLAGS_format),
          model_path.empty() ? nullptr : &layers, kind, absl::GetFlag(FLAGS_virtual)));
  PT_ASSIGN_OR_RETURN(std::string text, RunPartitionCommand(o));
  std::cout << text;
  return absl::OkStatus();
}

int Main(int argc, char** argv) {
  // Release builds: no lock-order bookkeeping on every Mutex acquisition (lock_checks.h).
  util::ConfigureLockChecks();
  // Eigen allocates a packing buffer per product; without this each is fresh memory whose page
  // faults cost `reference` ~40% of a step (docs/performance.md, "The oracle's speed").
  if (absl::Status s = util::KeepLargeBuffersOnHeap(); !s.ok()) {
    std::cerr << "pipetrain: " << s.message() << "; continuing with glibc's defaults\n";
  }
  const ProgramSpec& program = Program();
  absl::SetProgramUsageMessage(ProgramHelp(program, /*full=*/false));
  absl::StatusOr<CommandLine> parsed = ParseCommandLine(program, argc, argv);
  if (!parsed.ok()) {
    std::cerr << "pipetrain: " << parsed.status().message() << " ["
              << absl::StatusCodeToString(parsed.status().code()) << "]\n";
    return 1;
  }
  const CommandLine& line = *parsed;
  if (!line.help.empty()) {
    std::cout << line.help;
    return 0;
  }
  if (line.command == nullptr) {
    std::cerr << (line.command_name.empty()
                      ? std::string("pipetrain: missing command\n")
                      : absl::StrCat("pipetrain: unknown command '", line.command_name, "'\n"))
              << ProgramHelp(program, /*full=*/false);
    return 2;
  }
  const std::string& command = line.command->name;
  // `status`, `watch`, `cancel` and `checkpoint` take the job as their one argument, `tokenizer`
  // its action; the others take none.
  const size_t arity = line.command->args.empty() ? 0 : 1;
  // A missing JOB is the command's error (it names its usage); an extra argument is ours.
  if (line.args.size() > arity) {
    std::cerr << "pipetrain " << command << ": unexpected argument '" << line.args[arity] << "'\n"
              << CommandHelp(program, *line.command);
    return 2;
  }
  absl::Status status;
  if (command == "reference") {
    status = RunReference(line);
  } else if (command == "schedule") {
    status = RunSchedule(line);
  } else if (command == "partition") {
    status = RunPartition(line);
  } else if (command == "plan") {
    status = RunPlan(line);
  } else if (command == "evaluate") {
    status = RunEvaluate(line);
  } else if (command == "generate") {
    status = RunGenerate(line);
  } else if (command == "predict") {
    status = RunPredict(line);
  } else if (command == "train") {
    status = RunTrain(line);
  } else if (command == "local") {
    status = RunLocal(line);
  } else if (command == "tokenizer") {
    status = RunTokenizer(line);
  } else if (command == "export" || command == "import") {
    status = RunExportOrImport(line, line.args.empty() ? "" : line.args[0]);
  } else if (command == "watch") {
    status = RunWatch(line, line.args.empty() ? "" : line.args[0]);
  } else {  // jobs, workers, status, cancel, checkpoint
    status = RunJobCommand(line, line.args.empty() ? "" : line.args[0]);
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
