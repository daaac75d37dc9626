// The project's central test: `pipetrain local` (a coordinator and S stage_worker processes on
// 127.0.0.1) reproduces `pipetrain reference` bit for bit — per-step losses (the --json lines,
// compared as text) and the final weights and optimizer state (the --save layer files, compared
// byte for byte) — for the digits MLP and a char GPT, S = 2 and 4, and every schedule kind, for the
// LLaMA and deep GPT examples on S = 4, and for the tied LLaMA example on S = 2 and 4.
// Also: Ctrl-C stops `pipetrain local` and leaves no daemon behind, and `local` runs each worker
// on a CPU of its own.
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/util/cpu_set.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/integration/run_command.h"

namespace pipetrain {
namespace {

using testing::Example;
using testing::ReadFile;
using testing::TempDir;

using CliRun = testing::CommandRun;  // out: stdout only.

// Runs `pipetrain ARGS` through the shell, stdout captured, stderr discarded unless it fails.
CliRun Pipetrain(const std::string& args, const std::string& stderr_file) {
  return testing::RunCommand(absl::StrCat(PIPETRAIN_BINARY, " ", args, " 2>",
                                          stderr_file.empty() ? "/dev/null" : stderr_file));
}

// The {"step": N, "loss": X lines of --json output, cut after the loss (the remaining fields are
// timings).
std::vector<std::string> LossLines(const std::string& out) {
  std::vector<std::string> lines;
  for (absl::string_view line : absl::StrSplit(out, '\n', absl::SkipEmpty())) {
    if (!absl::StartsWith(line, "{\"step\"")) continue;
    const size_t loss = line.find("\"loss\": ");
    const size_t end = line.find_first_of(",}", loss);
    lines.emplace_back(line.substr(0, end));
  }
  return lines;
}

std::vector<std::string> LayerFiles(const std::string& dir) {
  std::vector<std::string> files;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return files;
  while (dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (absl::StartsWith(name, "layer-")) files.push_back(name);
  }
  closedir(d);
  std::sort(files.begin(), files.end());
  return files;
}

// Deeper versions of the examples: S = 4 with V = 2 needs at least 8 layers.
constexpr char kDeepMlp[] = R"pb(
  name: "mlp_digits_deep"
  input_features: 64
  layers { linear { out_features: 64 } }
  layers { relu {} }
  layers { linear { out_features: 64 } }
  layers { relu {} }
  layers { linear { out_features: 64 } }
  layers { relu {} }
  layers { linear { out_features: 64 } }
  layers { relu {} }
  layers { linear { out_features: 10 } }
  loss { softmax_cross_entropy {} }
)pb";

constexpr char kDeepGpt[] = R"pb(
  name: "gpt_char_deep"
  input_features: 1
  layers { embedding { vocab_size: 0 dim: 32 context: 16 } }
  layers { transformer_block { heads: 2 } }
  layers { transformer_block { heads: 2 } }
  layers { transformer_block { heads: 2 } }
  layers { transformer_block { heads: 2 } }
  layers { transformer_block { heads: 2 } }
  layers { transformer_block { heads: 2 } }
  layers { layer_norm {} }
  layers { linear { out_features: 0 } }
  loss { softmax_cross_entropy {} }
)pb";

class DistributedTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(TempDir("pipetrain_dist_"));
    ASSERT_FALSE(dir_->empty());
    std::ofstream(*dir_ + "/mlp_deep.textproto") << kDeepMlp;
    std::ofstream(*dir_ + "/gpt_deep.textproto") << kDeepGpt;
  }
  static void TearDownTestSuite() {
    std::system(absl::StrCat("rm -rf '", *dir_, "'").c_str());
    delete dir_;
  }
  static std::string* dir_;
};
std::string* DistributedTest::dir_ = nullptr;

struct Case {
  std::string model;  // file
  std::string data;
  std::string label;
};

// The reference and the local runs share these options: M = 8 is legal for every schedule with
// S = 2 and 4 (interleaved needs M % S == 0, dualpipe-v M >= 2S - 1).
constexpr char kCommon[] = "--batch 16 --microbatches 8 --steps 3 --seed 7 --threads 1 --json";

// Every schedule kind `pipetrain local --schedule` takes.
const std::vector<std::string> kAllSchedules = {
    "gpipe", "1f1b",       "interleaved",  "zb-h1",
    "zb-v",  "dualpipe-v", "1f1b-overlap", "interleaved-overlap"};

// `pipetrain local` with each of `stages` and `schedules` gives the reference's losses, final
// layer files and manifest, bit for bit.
void ExpectLocalEqualsReference(const Case& c, const std::string& dir,
                                const std::vector<int>& stage_counts = {2, 4},
                                const std::vector<std::string>& schedules = kAllSchedules) {
  const std::string ref_dir = absl::StrCat(dir, "/ref-", c.label);
  const CliRun ref = Pipetrain(absl::StrCat("reference --model ", c.model, " --data ", c.data, " ",
                                            kCommon, " --eval-samples 1 --save ", ref_dir),
                               "");
  ASSERT_EQ(ref.exit_code, 0) << ref.out;
  const std::vector<std::string> ref_losses = LossLines(ref.out);
  ASSERT_EQ(ref_losses.size(), 3u) << ref.out;
  const std::vector<std::string> ref_files = LayerFiles(ref_dir);
  ASSERT_FALSE(ref_files.empty());

  for (int stages : stage_counts) {
    for (const std::string& kind : schedules) {
      SCOPED_TRACE(absl::StrCat(c.label, " S=", stages, " ", kind));
      const std::string out_dir = absl::StrCat(dir, "/local-", c.label, "-", stages, "-", kind);
      const std::string err = out_dir + ".stderr";
      const CliRun local =
          Pipetrain(absl::StrCat("local --stages ", stages, " --schedule ", kind, " --model ",
                                 c.model, " --data ", c.data, " ", kCommon, " --save ", out_dir),
                    err);
      ASSERT_EQ(local.exit_code, 0) << local.out << ReadFile(err);
      EXPECT_EQ(LossLines(local.out), ref_losses);
      EXPECT_EQ(LayerFiles(out_dir), ref_files);
      for (const std::string& f : ref_files) {
        EXPECT_TRUE(ReadFile(out_dir + "/" + f) == ReadFile(ref_dir + "/" + f)) << f << " differs";
      }
      EXPECT_EQ(ReadFile(out_dir + "/manifest.json"), ReadFile(ref_dir + "/manifest.json"));
    }
  }
}

TEST_F(DistributedTest, DigitsMlpMatchesReference) {
  ExpectLocalEqualsReference({*dir_ + "/mlp_deep.textproto", "digits", "mlp"}, *dir_);
}

TEST_F(DistributedTest, CharGptMatchesReference) {
  ExpectLocalEqualsReference({*dir_ + "/gpt_deep.textproto", "text", "gpt"}, *dir_);
}

// The LLaMA example (RMSNorm, RoPE, grouped-query attention, SwiGLU) on 4 stages, every schedule
// (its 9 layers give the V = 2 schedules their 8 chunks).
TEST_F(DistributedTest, ExampleLlamaCharMatchesReferenceOnFourStages) {
  ExpectLocalEqualsReference({Example("llama_char.textproto"), "text", "llama"}, *dir_, {4});
}

// The tied LLaMA example (ModelSpec.tie_embeddings): where the embedding and the head are on two
// ranks (1F1B, interleaved) they exchange their parts of the table's gradient every step; where
// one rank holds both (the V-shaped zb-v and dualpipe-v) it sums them itself. Either way the
// table is stored once (no layer file for the head) and equals the reference's bit for bit.
TEST_F(DistributedTest, ExampleTiedLlamaMatchesReference) {
  ExpectLocalEqualsReference({Example("llama_char_tied.textproto"), "text", "llama-tied"}, *dir_,
                             {2, 4}, {"1f1b", "interleaved", "zb-v", "dualpipe-v"});
  EXPECT_FALSE(
      absl::StrContains(absl::StrJoin(LayerFiles(*dir_ + "/ref-llama-tied"), " "), "layer-00008"))
      << "the tied head has a layer file";
}

// The deep GPT example runs the schedules that place two chunks per stage on 4 stages (the
// 2-block gpt_char has too few layers for them).
TEST_F(DistributedTest, ExampleGptDeepRunsTwoChunkSchedulesOnFourStages) {
  ExpectLocalEqualsReference({Example("gpt_deep.textproto"), "text", "gpt-deep"}, *dir_, {4},
                             {"interleaved", "zb-v", "dualpipe-v"});
}

// Bidirectional DualPipe on two copies of the stages (S = 2 and 4; M = 8 is even and >= 2S - 2):
// the copies' gradients are summed before each update, and each layer is saved once.
TEST_F(DistributedTest, DualPipeMatchesReference) {
  ExpectLocalEqualsReference({*dir_ + "/mlp_deep.textproto", "digits", "mlp-dualpipe"}, *dir_,
                             {2, 4}, {"dualpipe"});
  ExpectLocalEqualsReference({*dir_ + "/gpt_deep.textproto", "text", "gpt-dualpipe"}, *dir_, {2, 4},
                             {"dualpipe"});
}

// The line of `--json` output that starts with `prefix`, or "" if none.
std::string JsonLine(const std::string& out, absl::string_view prefix) {
  for (absl::string_view line : absl::StrSplit(out, '\n')) {
    if (absl::StartsWith(line, prefix)) return std::string(line);
  }
  return "";
}

// A dualpipe job evaluates through the down copy of its stages: the evaluation after training
// is the reference's, bit for bit.
TEST_F(DistributedTest, DualPipeEvaluatesLikeTheReference) {
  const std::string flags =
      absl::StrCat(" --model ", Example("mlp_digits.textproto"), " ", kCommon, " --eval-samples 8");
  const CliRun ref = Pipetrain("reference" + flags, "");
  ASSERT_EQ(ref.exit_code, 0) << ref.out;
  const CliRun local = Pipetrain("local --stages 2 --schedule dualpipe" + flags, "");
  ASSERT_EQ(local.exit_code, 0) << local.out;
  const std::string want = JsonLine(ref.out, "{\"eval_loss\"");
  ASSERT_FALSE(want.empty()) << ref.out;
  EXPECT_EQ(JsonLine(local.out, "{\"eval_loss\""), want) << local.out;
}

// The tied LLaMA under dualpipe: after the copies' sum, each rank holding an end of the tie
// holds both (rank 0: the embedding down and the head up) and sums them itself.
TEST_F(DistributedTest, ExampleTiedLlamaRunsDualPipe) {
  ExpectLocalEqualsReference({Example("llama_char_tied.textproto"), "text", "llama-tied-dp"}, *dir_,
                             {2, 4}, {"dualpipe"});
}

// The example files themselves, where their depth allows (S = 2, every V = 1 schedule).
TEST_F(DistributedTest, ExampleDigitsMlpMatchesReference) {
  const std::string ref_dir = *dir_ + "/ref-example";
  const CliRun ref = Pipetrain(absl::StrCat("reference --model ", Example("mlp_digits.textproto"),
                                            " ", kCommon, " --eval-samples 1 --save ", ref_dir),
                               "");
  ASSERT_EQ(ref.exit_code, 0);
  for (const char* kind : {"1f1b", "zb-h1", "interleaved"}) {
    SCOPED_TRACE(kind);
    const std::string out_dir = absl::StrCat(*dir_, "/local-example-", kind);
    const CliRun local =
        Pipetrain(absl::StrCat("local --stages 2 --schedule ", kind, " --model ",
                               Example("mlp_digits.textproto"), " ", kCommon, " --save ", out_dir),
                  "");
    ASSERT_EQ(local.exit_code, 0) << local.out;
    EXPECT_EQ(LossLines(local.out), LossLines(ref.out));
    for (const std::string& f : LayerFiles(ref_dir)) {
      EXPECT_TRUE(ReadFile(out_dir + "/" + f) == ReadFile(ref_dir + "/" + f)) << f;
    }
  }
}

// Checkpoints move between the reference and the service in both directions and onto any stage
// count: 3 reference steps then 3 `local --resume` steps (S=2, zb-v), and 3 `local` steps (S=3)
// then 3 `reference --resume` steps, both give the losses of steps 4-6 and the final files of 6
// uninterrupted reference steps, bit for bit.
TEST_F(DistributedTest, ResumeThroughTheServiceEqualsAnUninterruptedRun) {
  const std::string flags = absl::StrCat(" --model ", Example("mlp_digits.textproto"),
                                         " --data digits --batch 16 --microbatches 4 --seed 5 "
                                         "--optimizer adamw:lr=1e-2 --json --eval-samples 1");
  const std::string d = *dir_ + "/resume";
  const CliRun full =
      Pipetrain(absl::StrCat("reference", flags, " --steps 6 --save ", d, "/full"), "");
  ASSERT_EQ(full.exit_code, 0) << full.out;
  std::vector<std::string> last3 = LossLines(full.out);
  ASSERT_EQ(last3.size(), 6u);
  last3.erase(last3.begin(), last3.begin() + 3);

  const std::string train_flags = absl::StrReplaceAll(flags, {{" --eval-samples 1", ""}});
  ASSERT_EQ(
      Pipetrain(absl::StrCat("reference", flags, " --steps 3 --save ", d, "/ref3"), "").exit_code,
      0);
  const CliRun resumed =
      Pipetrain(absl::StrCat("local --stages 2 --schedule zb-v", train_flags,
                             " --steps 3 --resume ", d, "/ref3 --save ", d, "/local6"),
                d + "-local6.err");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.out << ReadFile(d + "-local6.err");
  EXPECT_EQ(LossLines(resumed.out), last3);

  ASSERT_EQ(Pipetrain(absl::StrCat("local --stages 3 --schedule 1f1b", train_flags,
                                   " --steps 3 --save ", d, "/local3"),
                      "")
                .exit_code,
            0);
  const CliRun back = Pipetrain(
      absl::StrCat("reference", flags, " --steps 3 --resume ", d, "/local3 --save ", d, "/ref6"),
      "");
  ASSERT_EQ(back.exit_code, 0) << back.out;
  EXPECT_EQ(LossLines(back.out), last3);
  const std::vector<std::string> files = LayerFiles(d + "/full");
  ASSERT_FALSE(files.empty());
  for (const std::string& f : files) {
    EXPECT_TRUE(ReadFile(d + "/local6/" + f) == ReadFile(d + "/full/" + f)) << f;
    EXPECT_TRUE(ReadFile(d + "/ref6/" + f) == ReadFile(d + "/full/" + f)) << f;
  }

  // A checkpoint of another model is refused before any worker hears of it.
  const CliRun other = Pipetrain(
      absl::StrCat("local --stages 2 --model ", Example("gpt_char.textproto"),
                   " --data text --batch 8 --microbatches 2 --steps 1 --resume ", d, "/ref3"),
      d + "-other.err");
  EXPECT_EQ(other.exit_code, 1);
  EXPECT_THAT(ReadFile(d + "-other.err"), ::testing::HasSubstr("another model spec"));
}

// Events of one category ("compute", "wait", "send", "recv", "step") in a --trace file.
std::vector<nlohmann::json> TraceEvents(const nlohmann::json& trace, const std::string& cat) {
  std::vector<nlohmann::json> events;
  for (const auto& e : trace["traceEvents"]) {
    if (e.value("ph", "") == "X" && e.value("cat", "") == cat) events.push_back(e);
  }
  return events;
}

// --trace writes the last step's measured timeline as Chrome trace JSON: one compute event per
// action (2 workers x 8 micro-batches x F and B), all of step 3.
// `local` keeps two batches in flight but not across a checkpoint: the checkpoint of step 3 of
// a 6-step run holds step 3's weights and the data cursor after batch 3, so a run resumed from it
// trains batches 4..6 exactly as the straight run did.
TEST_F(DistributedTest, MidRunCheckpointResumesBitwise) {
  const std::string flags = absl::StrCat(" --model ", Example("mlp_digits.textproto"),
                                         " --data digits --batch 16 --microbatches 4 --seed 9 "
                                         "--optimizer adamw:lr=1e-2 --json");
  const std::string d = *dir_ + "/midrun";
  const CliRun full = Pipetrain(absl::StrCat("reference", flags, " --steps 6"), "");
  ASSERT_EQ(full.exit_code, 0) << full.out;
  std::vector<std::string> last3 = LossLines(full.out);
  ASSERT_EQ(last3.size(), 6u);
  last3.erase(last3.begin(), last3.begin() + 3);
  const CliRun six = Pipetrain(
      absl::StrCat("local --stages 2", flags, " --steps 6 --checkpoint-every 3 --save ", d, "/six"),
      d + "-six.err");
  ASSERT_EQ(six.exit_code, 0) << six.out << ReadFile(d + "-six.err");
  const std::string step3 = d + "/six.step-000000000003";
  ASSERT_THAT(ReadFile(step3 + "/manifest.json"), ::testing::HasSubstr("\"step\": 3"));
  const CliRun resumed = Pipetrain(
      absl::StrCat("local --stages 2", flags, " --steps 3 --resume ", step3), d + "-res.err");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.out << ReadFile(d + "-res.err");
  EXPECT_EQ(LossLines(resumed.out), last3);
}

TEST_F(DistributedTest, TraceHasEveryActionOfTheLastStep) {
  const std::string trace = *dir_ + "/trace.json";
  const CliRun local =
      Pipetrain(absl::StrCat("local --stages 2 --schedule 1f1b --model ",
                             Example("mlp_digits.textproto"), " ", kCommon, " --trace ", trace),
                "");
  ASSERT_EQ(local.exit_code, 0) << local.out;
  const nlohmann::json j = nlohmann::json::parse(ReadFile(trace), nullptr, false);
  ASSERT_FALSE(j.is_discarded());
  ASSERT_TRUE(j.contains("traceEvents"));
  const std::vector<nlohmann::json> compute = TraceEvents(j, "compute");
  EXPECT_EQ(compute.size(), 2u * 8 * 2);
  for (const auto& e : compute) EXPECT_EQ(e["args"]["step"], 3);
}

// --trace-steps 2:3 of a 4-step run: for each step in the range and each rank, compute, wait,
// send and receive spans, with non-negative durations, inside their step's span; nothing of
// steps 1 and 4. The tensors between the stages appear on both sides: every activation rank 0
// sends is received by rank 1, every gradient rank 1 sends is received by rank 0.
TEST_F(DistributedTest, TraceStepsHaveComputeWaitSendAndReceiveSpansOfEveryRank) {
  const std::string trace = *dir_ + "/trace-steps.json";
  const CliRun local = Pipetrain(
      absl::StrCat("local --stages 2 --schedule 1f1b --model ", Example("mlp_digits.textproto"),
                   " --batch 16 --microbatches 4 --steps 4 --seed 7 --trace ", trace,
                   " --trace-steps 2:3"),
      "");
  ASSERT_EQ(local.exit_code, 0) << local.out;
  EXPECT_THAT(local.out, ::testing::HasSubstr("trace of steps 2 to 3 written to " + trace));
  const nlohmann::json j = nlohmann::json::parse(ReadFile(trace), nullptr, false);
  ASSERT_FALSE(j.is_discarded());
  // The steps' spans: [ts, ts + dur) per step.
  std::map<int, std::pair<double, double>> step_span;
  for (const auto& e : TraceEvents(j, "step")) {
    const int step = e["args"]["step"];
    step_span[step] = {e["ts"].get<double>(), e["ts"].get<double>() + e["dur"].get<double>()};
    // Every rank's spans fall between its RunStep and its StepDone, inside the coordinator's
    // step time: none stretched the step's span beyond step_ms.
    EXPECT_NEAR(e["dur"].get<double>(), e["args"]["step_ms"].get<double>() * 1000, 1e-3);
    EXPECT_GE(e["args"]["bubble_fraction"].get<double>(), 0.0);
    EXPECT_GE(e["args"]["predicted_bubble_fraction"].get<double>(), 0.0);
    EXPECT_GT(e["args"]["link_latency_ms"].get<double>(), 0.0);
  }
  ASSERT_EQ(step_span.size(), 2u);
  ASSERT_EQ(step_span.begin()->first, 2);
  ASSERT_EQ(step_span.rbegin()->first, 3);
  EXPECT_DOUBLE_EQ(step_span[3].first, step_span[2].second) << "steps laid end to end";
  for (const char* cat : {"compute", "wait", "send", "recv"}) {
    SCOPED_TRACE(cat);
    std::map<std::pair<int, int>, int> per_step_rank;  // (step, rank) -> events.
    for (const auto& e : TraceEvents(j, cat)) {
      const int step = e["args"]["step"];
      const int rank = e["pid"];
      ASSERT_TRUE(step_span.count(step)) << e.dump();
      ++per_step_rank[{step, rank}];
      const double ts = e["ts"], dur = e["dur"];
      EXPECT_GE(dur, 0.0) << e.dump();
      EXPECT_GE(ts, step_span[step].first) << e.dump();
      EXPECT_LE(ts + dur, step_span[step].second + 1e-6) << e.dump();
    }
    for (int step : {2, 3}) {
      for (int rank : {0, 1}) {
        EXPECT_GT((per_step_rank[{step, rank}]), 0) << "step " << step << " rank " << rank;
      }
    }
  }
  // Per step: rank 0 sends 4 activations that rank 1 receives, rank 1 sends 4 gradients that
  // rank 0 receives; each rank also receives the coordinator's inputs (rank 0) or targets.
  std::map<std::string, int> tensors;  // "step/rank/cat/kind/peer" -> count
  for (const char* cat : {"send", "recv"}) {
    for (const auto& e : TraceEvents(j, cat)) {
      tensors[absl::StrCat(e["args"]["step"].get<int>(), "/", e["pid"].get<int>(), "/", cat, "/",
                           e["args"]["kind"].get<std::string>(), "/",
                           e["args"]["peer"].get<std::string>())]++;
    }
  }
  for (int step : {2, 3}) {
    EXPECT_EQ(tensors[absl::StrCat(step, "/0/send/activation/stage/1")], 4);
    EXPECT_EQ(tensors[absl::StrCat(step, "/1/recv/activation/stage/0")], 4);
    EXPECT_EQ(tensors[absl::StrCat(step, "/1/send/gradient/stage/0")], 4);
    EXPECT_EQ(tensors[absl::StrCat(step, "/0/recv/gradient/stage/1")], 4);
    EXPECT_EQ(tensors[absl::StrCat(step, "/0/recv/input/coordinator")], 4);
    EXPECT_EQ(tensors[absl::StrCat(step, "/1/recv/target/coordinator")], 4);
  }

  // A range the run does not reach is refused before training; --trace-steps needs --trace.
  const CliRun outside = Pipetrain(
      absl::StrCat("local --stages 2 --model ", Example("mlp_digits.textproto"),
                   " --batch 16 --microbatches 4 --steps 4 --trace ", trace, " --trace-steps 5:9"),
      "/dev/stdout");
  EXPECT_EQ(outside.exit_code, 1);
  EXPECT_THAT(outside.out, ::testing::HasSubstr("selects none of this run's steps 1:4"));
  const CliRun alone =
      Pipetrain(absl::StrCat("local --stages 2 --model ", Example("mlp_digits.textproto"),
                             " --steps 4 --trace-steps 2:3"),
                "/dev/stdout");
  EXPECT_EQ(alone.exit_code, 1);
  EXPECT_THAT(alone.out, ::testing::HasSubstr("--trace-steps needs --trace"));
}

// How often `needle` occurs in `text`.
int Count(const std::string& text, const std::string& needle) {
  int n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

// A dualpipe step reports its measured bubble and the simulator's prediction for it, as every
// schedule does, and its trace shows the compute of all four chunks (two per rank).
TEST_F(DistributedTest, DualPipeReportsMeasuredAndPredictedBubble) {
  const std::string trace = *dir_ + "/trace-dualpipe.json";
  const CliRun local =
      Pipetrain(absl::StrCat("local --stages 2 --schedule dualpipe --model ",
                             Example("mlp_digits.textproto"), " ", kCommon, " --trace ", trace),
                "");
  ASSERT_EQ(local.exit_code, 0) << local.out;
  const nlohmann::json j = nlohmann::json::parse(ReadFile(trace), nullptr, false);
  ASSERT_FALSE(j.is_discarded());
  const std::vector<nlohmann::json> steps = TraceEvents(j, "step");
  ASSERT_EQ(steps.size(), 1u);
  for (const char* field : {"bubble_fraction", "predicted_bubble_fraction"}) {
    EXPECT_GE(steps[0]["args"][field].get<double>(), 0.0) << field;
    EXPECT_LT(steps[0]["args"][field].get<double>(), 1.0) << field;
  }
  std::set<int> chunks;
  for (const auto& e : TraceEvents(j, "compute")) chunks.insert(e["args"]["chunk"].get<int>());
  EXPECT_EQ(chunks, (std::set<int>{0, 1, 2, 3}));
}

// --trace FILE.svg and FILE.txt draw the measured timeline as pictures, titled with the schedule,
// S, M, V, the steps and their bubbles: the SVG has one rectangle per action of the traced steps
// (2 ranks x 4 micro-batches x F and B x 2 steps), a mark where each step starts and a legend of
// F and B only; the ASCII picture one row per rank and one summary line per step.
TEST_F(DistributedTest, TracePicturesBySuffix) {
  const std::string svg_path = *dir_ + "/trace.svg";
  const std::string flags =
      absl::StrCat("local --stages 2 --schedule 1f1b --model ", Example("mlp_digits.textproto"),
                   " --batch 16 --microbatches 4 --steps 3 --seed 7 --trace-steps 2:3 --trace ");
  const CliRun svg_run = Pipetrain(flags + svg_path, "");
  ASSERT_EQ(svg_run.exit_code, 0) << svg_run.out;
  EXPECT_THAT(svg_run.out, ::testing::HasSubstr("trace of steps 2 to 3 written to " + svg_path));
  const std::string svg = ReadFile(svg_path);
  ASSERT_THAT(svg, ::testing::StartsWith("<?xml"));
  EXPECT_THAT(
      svg, ::testing::HasSubstr("<title>1f1b: S=2 M=4 V=1, steps 2 to 3 measured: mean bubble "));
  EXPECT_THAT(svg, ::testing::HasSubstr(" ms</text>"));  // "; makespan X ms" on the first line.
  EXPECT_EQ(Count(svg, " ms</title></rect>"), 2 * 4 * 2 * 2);
  for (int mb = 0; mb < 4; ++mb) {
    EXPECT_EQ(Count(svg, absl::StrCat("<title>F", mb, " chunk ")), 2 * 2) << mb;
    EXPECT_EQ(Count(svg, absl::StrCat("<title>B", mb, " chunk ")), 2 * 2) << mb;
  }
  EXPECT_EQ(Count(svg, ">step 2</text>"), 1);
  EXPECT_EQ(Count(svg, ">step 3</text>"), 1);
  const std::string legend = svg.substr(svg.find("<g id=\"legend\">"));
  EXPECT_THAT(legend, ::testing::HasSubstr(">F forward</text>"));
  EXPECT_THAT(legend, ::testing::HasSubstr(">B backward</text>"));
  EXPECT_THAT(legend, ::testing::Not(::testing::HasSubstr("grad</text>")));

  const std::string txt_path = *dir_ + "/trace.txt";
  const CliRun txt_run = Pipetrain(flags + txt_path, "");
  ASSERT_EQ(txt_run.exit_code, 0) << txt_run.out;
  const std::vector<std::string> lines =
      absl::StrSplit(ReadFile(txt_path), '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 1u + 1 + 2 + 1 + 2)
      << ReadFile(txt_path);  // title, ruler, rows, scale, steps
  EXPECT_THAT(lines[0], ::testing::StartsWith("1f1b: S=2 M=4 V=1, steps 2 to 3 measured: mean "
                                              "bubble "));
  EXPECT_THAT(lines[1], ::testing::StartsWith("time |0"));
  for (int rank : {0, 1}) {
    EXPECT_THAT(lines[2 + rank], ::testing::StartsWith(absl::StrCat("r", rank, "   |")));
    // Each row draws its rank's actions; an action shorter than a cell may show no label (how
    // long each takes is the machine's), so a row shows at least one labelled action.
    EXPECT_THAT(lines[2 + rank], ::testing::ContainsRegex("[FB][0-3]"));
  }
  EXPECT_THAT(lines[4], ::testing::StartsWith("1 cell = "));
  EXPECT_THAT(lines[4], ::testing::HasSubstr(" ms; makespan "));
  EXPECT_THAT(lines[5], ::testing::MatchesRegex("step 2: [0-9.]+ ms, loss .*, bubble [0-9.]+ "
                                                "\\(predicted [0-9.]+\\)"));
  EXPECT_THAT(lines[6], ::testing::StartsWith("step 3: "));
}

TEST_F(DistributedTest, TrainWithoutReachableCoordinatorIsUnavailable) {
  const CliRun run = Pipetrain(absl::StrCat("train --coordinator 127.0.0.1:1 --model ",
                                            Example("mlp_digits.textproto"), " --steps 1"),
                               "/dev/stdout");
  EXPECT_EQ(run.exit_code, 1);
  EXPECT_NE(run.out.find("UNAVAILABLE"), std::string::npos) << run.out;
}

// The char GPT example itself: 5 layers, enough for S = 2 with V = 1 and V = 2.
TEST_F(DistributedTest, ExampleCharGptMatchesReference) {
  const std::string model = Example("gpt_char.textproto");
  const std::string ref_dir = *dir_ + "/ref-example-gpt";
  const CliRun ref = Pipetrain(absl::StrCat("reference --model ", model, " --data text ", kCommon,
                                            " --eval-samples 1 --save ", ref_dir),
                               "");
  ASSERT_EQ(ref.exit_code, 0);
  for (const char* kind : {"1f1b", "zb-v"}) {
    SCOPED_TRACE(kind);
    const std::string out_dir = absl::StrCat(*dir_, "/local-example-gpt-", kind);
    const CliRun local =
        Pipetrain(absl::StrCat("local --stages 2 --schedule ", kind, " --model ", model,
                               " --data text ", kCommon, " --save ", out_dir),
                  "");
    ASSERT_EQ(local.exit_code, 0) << local.out;
    EXPECT_EQ(LossLines(local.out), LossLines(ref.out));
    for (const std::string& f : LayerFiles(ref_dir)) {
      EXPECT_TRUE(ReadFile(out_dir + "/" + f) == ReadFile(ref_dir + "/" + f)) << f;
    }
  }
}

// Children of `pid` according to /proc.
std::vector<pid_t> ChildrenOf(pid_t pid) {
  std::vector<pid_t> children;
  DIR* d = opendir("/proc");
  if (d == nullptr) return children;
  while (dirent* e = readdir(d)) {
    const pid_t p = static_cast<pid_t>(std::atoi(e->d_name));
    if (p <= 0) continue;
    const std::string stat = ReadFile(absl::StrCat("/proc/", p, "/stat"));
    const size_t paren = stat.rfind(')');
    if (paren == std::string::npos) continue;
    std::vector<std::string> fields = absl::StrSplit(stat.substr(paren + 2), ' ');
    if (fields.size() > 1 && std::atoi(fields[1].c_str()) == pid) children.push_back(p);
  }
  closedir(d);
  return children;
}

// SIGINT (Ctrl-C) or SIGTERM to `pipetrain local` mid-training stops it with CANCELLED and leaves
// none of its daemons running.
void ExpectSignalStopsEverything(int signal) {
  testing::PipedChild local =
      testing::SpawnPiped({PIPETRAIN_BINARY, "local", "--stages", "2", "--schedule", "1f1b",
                           "--model", Example("mlp_digits.textproto"), "--batch", "16",
                           "--microbatches", "4", "--steps", "1000000", "--json"},
                          "/dev/null");
  ASSERT_GT(local.pid, 0);
  // Wait for the first step line: by then the coordinator and both workers are up.
  std::string out;
  ASSERT_TRUE(testing::ReadUntil(local, "{\"step\"", &out)) << out;
  const std::vector<pid_t> daemons = ChildrenOf(local.pid);
  EXPECT_EQ(daemons.size(), 3u);  // coordinator + 2 workers.
  ASSERT_EQ(kill(local.pid, signal), 0);
  const int status = testing::DrainAndWait(local, &out);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 130);  // CANCELLED "interrupted", as 128 + SIGINT.
  for (pid_t d : daemons) {
    EXPECT_NE(kill(d, 0), 0) << "daemon " << d << " is still running";
  }
}

TEST_F(DistributedTest, CtrlCStopsEverything) { ExpectSignalStopsEverything(SIGINT); }

TEST_F(DistributedTest, SigtermStopsEverything) { ExpectSignalStopsEverything(SIGTERM); }

// The Cpus_allowed_list of every thread of process `pid`, one entry per distinct list.
std::set<std::string> ThreadCpuLists(pid_t pid) {
  std::set<std::string> lists;
  const std::string dir = absl::StrCat("/proc/", pid, "/task");
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return lists;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    for (absl::string_view line :
         absl::StrSplit(ReadFile(absl::StrCat(dir, "/", e->d_name, "/status")), '\n')) {
      if (absl::ConsumePrefix(&line, "Cpus_allowed_list:")) {
        lists.insert(std::string(absl::StripAsciiWhitespace(line)));
      }
    }
  }
  closedir(d);
  return lists;
}

// `pipetrain local --stages 2` runs every thread of each worker on a CPU of its own (the first two
// this test may use) and leaves the coordinator on all of them; with --pin-workers=false the
// workers may run anywhere too.
TEST_F(DistributedTest, LocalRunsEachWorkerOnACpuOfItsOwn) {
  const std::vector<int> allowed = util::AllowedCpus();
  if (allowed.size() < 2) GTEST_SKIP() << "needs 2 CPUs, this process may use " << allowed.size();
  const std::string all = util::FormatCpuList(allowed);
  for (const bool pin : {true, false}) {
    SCOPED_TRACE(pin ? "pinned" : "--pin-workers=false");
    testing::PipedChild local = testing::SpawnPiped(
        {PIPETRAIN_BINARY, "local", "--stages", "2", "--schedule", "1f1b", "--model",
         Example("mlp_digits.textproto"), "--batch", "16", "--microbatches", "4", "--steps",
         "1000000", "--json", pin ? "--pin-workers=true" : "--pin-workers=false"},
        "/dev/null");
    ASSERT_GT(local.pid, 0);
    std::string out;
    ASSERT_TRUE(testing::ReadUntil(local, "{\"step\"", &out)) << out;
    std::vector<std::set<std::string>> workers;
    std::set<std::string> coordinator;
    for (pid_t d : ChildrenOf(local.pid)) {
      const std::string cmdline = ReadFile(absl::StrCat("/proc/", d, "/cmdline"));
      const std::string argv0 = cmdline.substr(0, cmdline.find('\0'));
      if (absl::EndsWith(argv0, "/stage_worker")) {
        workers.push_back(ThreadCpuLists(d));
      } else {
        coordinator = ThreadCpuLists(d);
      }
    }
    ASSERT_EQ(kill(local.pid, SIGTERM), 0);
    testing::DrainAndWait(local, &out);
    ASSERT_EQ(workers.size(), 2u);
    EXPECT_EQ(coordinator, std::set<std::string>{all});
    if (pin) {
      const std::set<std::string> first = {absl::StrCat(allowed[0])};
      const std::set<std::string> second = {absl::StrCat(allowed[1])};
      EXPECT_THAT(workers, ::testing::UnorderedElementsAre(first, second));
    } else {
      EXPECT_THAT(workers, ::testing::Each(std::set<std::string>{all}));
    }
  }
}

}  // namespace
}  // namespace pipetrain
