// The model-and-data set-up shared by every command that trains or evaluates (reference, train,
// local, evaluate), so that all of them see the same data and build the same model.
#ifndef PIPETRAIN_CLIENT_CLI_TRAINING_SETUP_H_
#define PIPETRAIN_CLIENT_CLI_TRAINING_SETUP_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/io/dataset.h"
#include "common/model/model.h"
#include "pipetrain/v1/model.pb.h"

namespace pipetrain::cli {

struct TrainingSetup {
  v1::ModelSpec spec;  // resolved against the data set.
  std::unique_ptr<io::Dataset> data;
  std::unique_ptr<model::Model> model;  // built from `spec`.
};

// Opens the data set `data` (digits | text[:PATH] | csv:PATH | synthetic[:ROWS]) with the options
// `raw_spec` implies (the text context, the synthetic task's shape), fills the sizes the spec
// leaves to the data, builds the model and checks its loss fits the data's targets. `data_dir`
// empty: the bundled data. Errors name what does not fit (INVALID_ARGUMENT) or is missing.
absl::StatusOr<TrainingSetup> SetUpTraining(const v1::ModelSpec& raw_spec, const std::string& data,
                                            const std::string& data_dir, uint64_t seed);

// The same, reading the spec from the file `model_path` first.
absl::StatusOr<TrainingSetup> SetUpTrainingFromFile(const std::string& model_path,
                                                    const std::string& data,
                                                    const std::string& data_dir, uint64_t seed);

// The checks every training command makes on its loop flags: --steps >= 1, --batch >= 1,
// --microbatches >= 1 dividing --batch, --log-every >= 1. INVALID_ARGUMENT naming the flag.
absl::Status CheckTrainingLoopOptions(int64_t steps, int64_t batch, int64_t microbatches,
                                      int64_t log_every);

}  // namespace pipetrain::cli

#endif  // PIPETRAIN_CLIENT_CLI_TRAINING_SETUP_H_
