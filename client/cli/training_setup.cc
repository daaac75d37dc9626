#include "client/cli/training_setup.h"

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
    if (l.has_embedding()) d.context = l.embedding().context();
  }
  if (spec.layers_size() > 0 && spec.layers(spec.layers_size() - 1).has_linear()) {
    d.num_classes = spec.layers(spec.layers_size() - 1).linear().out_features();
  }
  return d;
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

absl::StatusOr<TrainingSetup> SetUpTraining(const v1::ModelSpec& raw_spec, const std::string& data,
                                            const std::string& data_dir, uint64_t seed,
                                            math::Isa isa,
                                            std::shared_ptr<const io::Tokenizer> tokenizer) {
  TrainingSetup s;
  io::DatasetOptions options = DatasetOptionsFor(raw_spec, data_dir, seed);
  options.tokenizer = tokenizer;
  s.tokenizer = std::move(tokenizer);
  PT_ASSIGN_OR_RETURN(s.data, io::OpenDataset(data, options));
  const io::DatasetInfo& info = s.data->info();
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
