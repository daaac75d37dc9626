#include "client/cli/training_setup.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/io/digest.h"
#include "common/util/status_macros.h"

namespace pipetrain::cli {
namespace {

// Dataset options that depend on the (unresolved) model.
io::DatasetOptions DatasetOptionsFor(const v1::ModelSpec& spec, const std::string& data_dir,
                                     uint64_t seed) {
  io::DatasetOptions d;
  if (!data_dir.empty()) d.data_dir = data_dir;
  d.seed = seed;
  d.input_features = spec.input_features();
  for (const v1::LayerSpec& l : spec.layers()) {
    if (l.has_embedding()) {
      d.context = l.embedding().context();
      d.vocab_size = l.embedding().vocab_size();
    }
  }
  if (spec.layers_size() > 0 && spec.layers(spec.layers_size() - 1).has_linear()) {
    d.num_classes = spec.layers(spec.layers_size() - 1).linear().out_features();
  }
  // An mse loss takes regression targets, one per output (1 when the width is left to the data).
  if (spec.loss().has_mse()) d.regression_targets = d.num_classes > 0 ? d.num_classes : 1;
  return d;
}

bool StartsWithEmbedding(const v1::ModelSpec& spec) {
  return spec.layers_size() > 0 && spec.layers(0).has_embedding();
}

// The data sets for a model that starts with an embedding, and for one that does not.
constexpr char kTokenData[] = "--data text, text:PATH or tokens:PATH[:uint16|:uint32]";
constexpr char kRowData[] =
    "--data digits, csv:PATH, npy:FEATURES.npy,TARGETS.npy, npy:DIR or synthetic[:ROWS]";

// OK if the kind of data set `data` names (token ids or rows of features) is the kind the model's
// first layer takes; else INVALID_ARGUMENT saying which --data to pass.
absl::Status CheckDataKind(const v1::ModelSpec& spec, const std::string& data) {
  const std::string kind = data.substr(0, data.find(':'));
  const bool tokens = kind == "text" || kind == "tokens";
  const bool rows = kind == "digits" || kind == "csv" || kind == "npy" || kind == "synthetic";
  if (StartsWithEmbedding(spec) && rows) {
    return absl::InvalidArgumentError(
        absl::StrCat("data set '", data, "' holds rows of features, but the model starts with an ",
                     "embedding layer, which takes token ids: pass ", kTokenData));
  }
  if (!StartsWithEmbedding(spec) && tokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data set '", data, "' holds token ids, for a model that starts with an embedding layer; ",
        "this model does not: pass ", kRowData));
  }
  return absl::OkStatus();
}

// INVALID_ARGUMENT if the model (not an embedding model, with input_features set) takes a
// different number of features per row than `info` has, saying both fixes: the model's
// input_features, or which data to pass.
absl::Status CheckInputFeatures(const v1::ModelSpec& spec, const io::DatasetInfo& info) {
  if (StartsWithEmbedding(spec) || spec.input_features() <= 0 ||
      spec.input_features() == info.input_features) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "model input_features ", spec.input_features(), " != data set's ", info.input_features, " (",
      info.name, "): set the model's input_features to ", info.input_features,
      " (or to 0 to take the data set's), or pass a data set with ", spec.input_features(),
      " features per row (--data csv:PATH, npy:FEATURES.npy,TARGETS.npy or synthetic)"));
}

}  // namespace

absl::StatusOr<std::shared_ptr<const io::Tokenizer>> TokenizerForRun(
    const std::string& flag, const std::string& checkpoint_dir,
    const std::optional<std::string>& checkpoint_tokenizer) {
  std::shared_ptr<const io::Tokenizer> given;
  if (!flag.empty()) {
    absl::StatusOr<std::shared_ptr<const io::Tokenizer>> loaded = io::Tokenizer::Load(flag);
    if (!loaded.ok()) {
      return absl::Status(loaded.status().code(),
                          absl::StrCat("--tokenizer: ", loaded.status().message()));
    }
    given = *std::move(loaded);
  }
  if (!checkpoint_tokenizer.has_value()) return given;
  if (given == nullptr) {
    if (checkpoint_tokenizer->empty()) return given;
    return io::Tokenizer::FromModel(*checkpoint_tokenizer,
                                    absl::StrCat("the tokenizer of checkpoint ", checkpoint_dir));
  }
  if (checkpoint_tokenizer->empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("--tokenizer ", flag, ": checkpoint ", checkpoint_dir,
                     " was trained without a tokenizer (byte-level text); leave out --tokenizer"));
  }
  PT_ASSIGN_OR_RETURN(io::FileDigest saved, io::DigestBytes(*checkpoint_tokenizer));
  if (saved.sha256 != given->sha256()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--tokenizer ", flag, " (SHA-256 ", given->sha256().substr(0, 12),
        "...) is not the tokenizer checkpoint ", checkpoint_dir, " was trained with (SHA-256 ",
        saved.sha256.substr(0, 12), "...); leave out --tokenizer to use the checkpoint's"));
  }
  return given;
}

absl::StatusOr<std::shared_ptr<const io::Tokenizer>> TokenizerForTraining(
    const TrainingOptions& options, bool remote) {
  std::optional<std::string> saved;
  if (!options.resume_dir.empty()) {
    absl::StatusOr<std::string> read = model::ReadCheckpointTokenizer(options.resume_dir);
    if (read.ok()) {
      saved = *std::move(read);
    } else if (!remote) {
      return read.status();
    }
  }
  return TokenizerForRun(options.tokenizer, options.resume_dir, saved);
}

absl::StatusOr<std::string> DefaultDataFor(const v1::ModelSpec& spec) {
  if (StartsWithEmbedding(spec)) return std::string("text");
  // digits: 64 features, 10 class labels.
  const v1::LayerSpec* last =
      spec.layers_size() > 0 ? &spec.layers(spec.layers_size() - 1) : nullptr;
  const int64_t classes = last != nullptr && last->has_linear() ? last->linear().out_features() : 0;
  const bool fits_digits = (spec.input_features() == 0 || spec.input_features() == 64) &&
                           !spec.loss().has_mse() && (classes == 0 || classes >= 10);
  if (fits_digits) return std::string("digits");
  std::string what;
  if (spec.loss().has_mse()) {
    what = "its loss is mse (regression targets)";
  } else if (spec.input_features() != 64 && spec.input_features() != 0) {
    what = absl::StrCat("it takes ", spec.input_features(), " input features, not 64");
  } else {
    what = absl::StrCat("it outputs ", classes, " classes, not 10");
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "no --data given, and the model fits no bundled data set (digits: 64 features, 10 classes; "
      "text: an embedding model) because ",
      what, ": pass ",
      spec.loss().has_mse()
          ? "--data csv:PATH, npy:FEATURES.npy,TARGETS.npy or npy:DIR"
          : "--data csv:PATH, npy:FEATURES.npy,TARGETS.npy, npy:DIR or synthetic[:ROWS]"));
}

absl::StatusOr<TrainingSetup> SetUpTraining(const v1::ModelSpec& raw_spec, const std::string& data,
                                            const std::string& data_dir, uint64_t seed,
                                            math::Isa isa,
                                            std::shared_ptr<const io::Tokenizer> tokenizer) {
  TrainingSetup s;
  std::string spec_text = data;
  if (spec_text.empty()) {
    PT_ASSIGN_OR_RETURN(spec_text, DefaultDataFor(raw_spec));
  }
  PT_RETURN_IF_ERROR(CheckDataKind(raw_spec, spec_text));
  io::DatasetOptions options = DatasetOptionsFor(raw_spec, data_dir, seed);
  options.tokenizer = tokenizer;
  s.tokenizer = std::move(tokenizer);
  PT_ASSIGN_OR_RETURN(s.data, io::OpenDataset(spec_text, options));
  const io::DatasetInfo& info = s.data->info();
  PT_RETURN_IF_ERROR(CheckInputFeatures(raw_spec, info));
  const model::DataShape shape{info.input_features, info.target_features, info.num_classes,
                               info.tokens_per_sample};
  PT_ASSIGN_OR_RETURN(s.spec, model::ResolveModelSpec(raw_spec, shape));
  PT_ASSIGN_OR_RETURN(s.model, model::Model::Build(s.spec, model::ModelLimits(), isa));
  if (s.model->target_features() != info.target_features) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the model's loss needs ", s.model->target_features(),
        " target features per row, data set '", info.name, "' has ", info.target_features));
  }
  // Every label must be a class the model outputs: found here, naming the file and line, rather
  // than when its batch is trained.
  if (s.spec.loss().has_softmax_cross_entropy()) {
    PT_RETURN_IF_ERROR(s.data->CheckLabelsForModel(s.model->output_features()));
  }
  return s;
}

absl::StatusOr<TrainingSetup> SetUpTrainingFromFile(
    const std::string& model_path, const std::string& data, const std::string& data_dir,
    uint64_t seed, math::Isa isa, std::shared_ptr<const io::Tokenizer> tokenizer) {
  PT_ASSIGN_OR_RETURN(v1::ModelSpec raw_spec, model::LoadModelSpecFile(model_path));
  return SetUpTraining(raw_spec, data, data_dir, seed, isa, std::move(tokenizer));
}

model::CheckpointManifest CheckpointManifestFor(const TrainingOptions& options,
                                                const TrainingSetup& setup,
                                                const math::OptimizerConfig& optimizer,
                                                int64_t step, const io::DataCursor& cursor) {
  model::CheckpointManifest m;
  m.step = step;
  m.model_spec = setup.spec;
  m.optimizer = math::FormatOptimizerConfig(optimizer);
  m.seed = options.seed;
  m.data = options.data;
  m.batch_size = options.batch;
  m.microbatches = options.microbatches;
  m.data_cursor = cursor;
  m.shards = model::LayerShards(*setup.model, 0, setup.model->num_layers());
  m.isa = std::string(math::IsaName(setup.model->isa()));
  return m;
}

}  // namespace pipetrain::cli
