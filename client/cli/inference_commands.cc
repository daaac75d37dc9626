#include "client/cli/inference_commands.h"

#include <algorithm>
#include <map>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/cli/token_text.h"
#include "client/cli/training_setup.h"
#include "common/io/byte_vocabulary.h"
#include "common/io/dataset.h"
#include "common/io/file_util.h"
#include "common/io/tokenizer.h"
#include "common/math/det_math.h"
#include "common/math/isa.h"
#include "common/math/optimizer.h"
#include "common/model/checkpoint.h"
#include "common/model/generator.h"
#include "common/model/reference_trainer.h"
#include "common/util/status_macros.h"

namespace pipetrain::cli {
namespace {

// Samples per forward pass of predict: ReferenceTrainer::Evaluate's default chunk, so that the
// outputs are bitwise those evaluate scores.
constexpr int64_t kPredictChunk = 256;

// A checkpoint and the model and data set it was trained with.
struct CheckpointSetup {
  model::CheckpointManifest manifest;
  std::map<std::string, math::Tensor> tensors;
  TrainingSetup setup;
};

// Loads `dir` and sets up its model and data set (`data`, else the checkpoint's; text through the
// checkpoint's tokenizer when it has one) as `pipetrain evaluate` does, at the instruction-set
// level it was trained at when this CPU runs it.
absl::StatusOr<CheckpointSetup> LoadCheckpointSetup(const std::string& dir, const std::string& data,
                                                    const std::string& data_dir) {
  if (dir.empty()) {
    return absl::InvalidArgumentError(
        "--resume DIR is required: the checkpoint directory to read (what --save wrote)");
  }
  PT_ASSIGN_OR_RETURN(model::LoadedCheckpoint ckpt, model::LoadCheckpoint(dir));
  CheckpointSetup c;
  c.manifest = std::move(ckpt.manifest);
  c.tensors = std::move(ckpt.tensors);
  math::Isa isa = math::DefaultIsa();
  if (absl::StatusOr<math::Isa> saved = math::ParseIsa(c.manifest.isa);
      saved.ok() && math::CpuSupportsIsa(*saved)) {
    isa = *saved;
  }
  PT_ASSIGN_OR_RETURN(std::shared_ptr<const io::Tokenizer> tokenizer,
                      TokenizerForRun("", dir, ckpt.tokenizer));
  PT_ASSIGN_OR_RETURN(
      c.setup, SetUpTraining(c.manifest.model_spec, data.empty() ? c.manifest.data : data, data_dir,
                             c.manifest.seed, isa, std::move(tokenizer)));
  return c;
}

// The checks of generate's options that need no checkpoint.
absl::Status CheckGenerateOptions(const GenerateCommandOptions& o) {
  if (o.prompt.empty()) {
    return absl::InvalidArgumentError("--prompt TEXT is required: the text to continue");
  }
  if (o.max_tokens < 1 || o.max_tokens > model::kMaxGenerateTokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max-tokens must be in [1, ", model::kMaxGenerateTokens, "], got ", o.max_tokens));
  }
  if (absl::Status s = model::CheckSamplingOptions(o.sampling); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--", s.message()));
  }
  return absl::OkStatus();
}

// Softmax of `logits` in double (PortableExp), the largest logit subtracted first.
void Softmax(const float* logits, int64_t n, std::vector<double>* p) {
  const float mx = *std::max_element(logits, logits + n);
  double sum = 0;
  p->resize(static_cast<size_t>(n));
  for (int64_t j = 0; j < n; ++j) sum += (*p)[j] = math::PortableExp(logits[j] - mx);
  for (double& v : *p) v /= sum;
}

// The CSV header of predict for a model with `outputs` outputs and `targets` target features.
std::string PredictHeader(bool classification, int64_t outputs, int64_t targets) {
  std::string h = "row";
  if (classification) {
    absl::StrAppend(&h, ",target,class");
    for (int64_t j = 0; j < outputs; ++j) absl::StrAppend(&h, ",p_", j);
  } else {
    for (int64_t j = 0; j < targets; ++j) absl::StrAppend(&h, ",target_", j);
    for (int64_t j = 0; j < outputs; ++j) absl::StrAppend(&h, ",value_", j);
  }
  return h + "\n";
}

// Appends one CSV line of predict (PredictHeader's columns) for output row `y` and target row
// `target` to `csv`; returns whether a classifier's class equals the label. `p`: scratch.
bool AppendPredictionRow(int64_t row, Eigen::Ref<const math::RowVector> y,
                         Eigen::Ref<const math::RowVector> target, bool classification,
                         std::vector<double>* p, std::string* csv) {
  absl::StrAppend(csv, row);
  bool correct = false;
  if (classification) {
    const int64_t label = static_cast<int64_t>(target(0));
    const int64_t cls = model::ArgMax(absl::MakeConstSpan(y.data(), y.size()));
    correct = cls == label;
    Softmax(y.data(), y.size(), p);
    absl::StrAppend(csv, ",", label, ",", cls);
    for (const double v : *p) absl::StrAppend(csv, absl::StrFormat(",%.9g", v));
  } else {
    for (int64_t j = 0; j < target.size(); ++j) {
      absl::StrAppend(csv, absl::StrFormat(",%.9g", target(j)));
    }
    for (int64_t j = 0; j < y.size(); ++j) absl::StrAppend(csv, absl::StrFormat(",%.9g", y(j)));
  }
  *csv += "\n";
  return correct;
}

}  // namespace

absl::Status RunGenerateCommand(const GenerateCommandOptions& o, std::ostream& out) {
  PT_RETURN_IF_ERROR(CheckGenerateOptions(o));
  PT_ASSIGN_OR_RETURN(CheckpointSetup c, LoadCheckpointSetup(o.checkpoint_dir, o.data, o.data_dir));
  const model::Model& net = *c.setup.model;
  PT_ASSIGN_OR_RETURN(const model::ModelParams params, model::TakeModelParams(net, &c.tensors));
  PT_ASSIGN_OR_RETURN(std::unique_ptr<model::Generator> generator,
                      model::Generator::Create(&net, &params));
  PT_ASSIGN_OR_RETURN(
      TokenText text,
      TokenText::For(c.setup.tokenizer, c.setup.data->info(), generator->vocab_size(),
                     "give --data the text the checkpoint was trained on"));
  absl::StatusOr<std::vector<int64_t>> prompt = text.Encode(o.prompt);
  if (!prompt.ok())
    return absl::InvalidArgumentError(absl::StrCat("--prompt: ", prompt.status().message()));
  out << o.prompt;
  out.flush();
  model::GenerateOptions g;
  g.max_tokens = o.max_tokens;
  g.sampling = o.sampling;
  PT_RETURN_IF_ERROR(generator
                         ->Generate(*prompt, g,
                                    [&](int64_t token) {
                                      out << text.Next(token);
                                      out.flush();
                                    })
                         .status());
  out << "\n";
  return absl::OkStatus();
}

absl::Status RunPredictCommand(const PredictCommandOptions& o, std::ostream& out) {
  if (o.samples < 0) return absl::InvalidArgumentError("--eval-samples must be >= 0");
  if (o.out.empty()) return absl::InvalidArgumentError("--out must be a file name or - (stdout)");
  PT_ASSIGN_OR_RETURN(CheckpointSetup c, LoadCheckpointSetup(o.checkpoint_dir, o.data, o.data_dir));
  const model::Model& net = *c.setup.model;
  const io::Dataset& data = *c.setup.data;
  PT_ASSIGN_OR_RETURN(math::OptimizerConfig optimizer,
                      math::ParseOptimizerConfig(c.manifest.optimizer));
  model::TrainerOptions topts;
  topts.seed = c.manifest.seed;
  topts.optimizer = optimizer;
  PT_ASSIGN_OR_RETURN(std::unique_ptr<model::ReferenceTrainer> trainer,
                      model::ReferenceTrainer::Create(&net, topts));
  PT_RETURN_IF_ERROR(trainer->ImportState(c.tensors, c.manifest.step));
  int64_t n = data.size(io::Split::kEval);
  if (o.samples > 0) n = std::min(n, o.samples);
  // Evaluate's chunks (ReferenceTrainer::Evaluate): the same products, the same bits.
  PT_RETURN_IF_ERROR(net.CheckMicrobatchActivations(1));
  const int64_t chunk = std::min(
      kPredictChunk, std::max<int64_t>(1, net.limits().max_activation_bytes /
                                              std::max<int64_t>(1, net.SampleActivationBytes())));
  const bool classification = c.setup.spec.loss().has_softmax_cross_entropy();
  std::string csv = PredictHeader(classification, net.output_features(), net.target_features());
  model::MicrobatchState mb;
  std::vector<double> p;
  int64_t rows = 0, correct = 0;
  try {  // the CSV is built in memory: a data set too large for it is an error, not an abort.
    for (int64_t begin = 0; begin < n; begin += chunk) {
      io::Batch b = io::MakeEvalBatch(data, begin, std::min(chunk, n - begin));
      PT_RETURN_IF_ERROR(
          net.ValidateBatch(math::AsConstMap(b.inputs), math::AsConstMap(b.targets), b.samples));
      const math::Matrix& pred = trainer->stage().Forward(math::AsConstMap(b.inputs), &mb);
      for (int64_t r = 0; r < pred.rows(); ++r, ++rows) {
        correct +=
            AppendPredictionRow(rows, pred.row(r), b.targets.row(r), classification, &p, &csv);
      }
    }
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(absl::StrCat("out of memory for the predictions after ",
                                                     rows, " rows: ask for fewer --eval-samples"));
  }
  if (o.out == "-") {
    out << csv;
    return absl::OkStatus();
  }
  PT_RETURN_IF_ERROR(io::WriteFileAtomically(o.out, csv));
  out << absl::StrFormat("%d rows of %d held-out samples written to %s", rows, n, o.out);
  if (classification && rows > 0) {
    out << absl::StrFormat(", accuracy %.4f", static_cast<double>(correct) / rows);
  }
  out << "\n";
  return absl::OkStatus();
}

}  // namespace pipetrain::cli
