// The model-and-data set-up shared by every command that trains or evaluates (reference, train,
// local, evaluate), so that all of them see the same data and build the same model.
#ifndef PIPETRAIN_CLIENT_CLI_TRAINING_SETUP_H_
#define PIPETRAIN_CLIENT_CLI_TRAINING_SETUP_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "client/cli/training_options.h"
#include "common/io/dataset.h"
#include "common/io/tokenizer.h"
#include "common/math/optimizer.h"
#include "common/model/checkpoint.h"
#include "common/model/model.h"
#include "pipetrain/v1/model.pb.h"

namespace pipetrain::cli {

struct TrainingSetup {
  v1::ModelSpec spec;  // resolved against the data set.
  std::unique_ptr<io::Dataset> data;
  std::unique_ptr<model::Model> model;  // built from `spec`.
  // The tokenizer the text data set was encoded with; null for byte-level text and other data.
  std::shared_ptr<const io::Tokenizer> tokenizer;
};

// The tokenizer of a run given --tokenizer `flag` (a path, or empty) and the tokenizer of the
// checkpoint it continues or evaluates (`checkpoint_dir`): `checkpoint_tokenizer` holds that
// checkpoint's tokenizer bytes ("" if it has none; nullopt if unknown here, e.g. a checkpoint on
// a remote coordinator's host). Returns the flag's tokenizer, else the checkpoint's, else null.
// Errors: io::Tokenizer::Load's for the flag (prefixed "--tokenizer"); FAILED_PRECONDITION when
// the flag's tokenizer is not the checkpoint's (their SHA-256s differ, or the checkpoint has
// none), naming both.
absl::StatusOr<std::shared_ptr<const io::Tokenizer>> TokenizerForRun(
    const std::string& flag, const std::string& checkpoint_dir,
    const std::optional<std::string>& checkpoint_tokenizer);

// TokenizerForRun for a training run with `options` (--tokenizer, --resume). With `remote` (the
// checkpoint lives on the coordinator's host) a --resume directory that cannot be read here
// counts as unknown; otherwise its errors are returned (model::ReadCheckpointTokenizer).
absl::StatusOr<std::shared_ptr<const io::Tokenizer>> TokenizerForTraining(
    const TrainingOptions& options, bool remote);

// The --data a model implies when none is given: "text" for a model whose first layer is an
// embedding; "digits" for one that fits it (input_features 0 or 64, a class-label loss, 0 or >= 10
// classes). Otherwise INVALID_ARGUMENT saying why nothing fits and which --data to pass.
absl::StatusOr<std::string> DefaultDataFor(const v1::ModelSpec& spec);

// Opens the data set `data` (digits | text[:PATH] | csv:PATH | npy:... | tokens:PATH |
// synthetic[:ROWS]; empty: DefaultDataFor(raw_spec)) with the options
// `raw_spec` implies (the text context, the synthetic task's shape), fills the sizes the spec
// leaves to the data, builds the model and checks its loss fits the data's targets: with a
// class-label loss, every label of the data must be below the model's output width
// (io::Dataset::CheckLabelsForModel, naming FILE:LINE:COLUMN of the first row beyond it).
// An mse loss makes csv: and npy: read regression targets, one per output of the last layer.
// `data_dir` empty: the bundled data. Errors name what does not fit (INVALID_ARGUMENT) and say
// which --data to pass when the kind of data (token ids or rows of features) or the features per
// row do not fit the model, or what is missing.
// The model's math runs at instruction-set level `isa` (Model::Build). A `tokenizer` encodes
// text data sets (then the model's vocab_size 0 is its vocabulary size); it is kept in the
// result. Any other data set with a tokenizer is INVALID_ARGUMENT.
absl::StatusOr<TrainingSetup> SetUpTraining(
    const v1::ModelSpec& raw_spec, const std::string& data, const std::string& data_dir,
    uint64_t seed, math::Isa isa = math::DefaultIsa(),
    std::shared_ptr<const io::Tokenizer> tokenizer = nullptr);

// The same, reading the spec from the file `model_path` first.
absl::StatusOr<TrainingSetup> SetUpTrainingFromFile(
    const std::string& model_path, const std::string& data, const std::string& data_dir,
    uint64_t seed, math::Isa isa = math::DefaultIsa(),
    std::shared_ptr<const io::Tokenizer> tokenizer = nullptr);

// The manifest of a checkpoint of `setup`'s model after `step` steps of a run with `options` and
// `optimizer`, its next batch at `cursor`, with the model's instruction-set level and no isa_note:
// what `reference --save` writes, and what `train --save` rewrites the coordinator's manifest to
// (so that both are byte-identical).
model::CheckpointManifest CheckpointManifestFor(const TrainingOptions& options,
                                                const TrainingSetup& setup,
                                                const math::OptimizerConfig& optimizer,
                                                int64_t step, const io::DataCursor& cursor);

}  // namespace pipetrain::cli

#endif  // PIPETRAIN_CLIENT_CLI_TRAINING_SETUP_H_
