// Checkpoints: one safetensors file per shard (a contiguous range of global layers) plus a JSON
// manifest. Tensor names are global ("layers.3.weight", "optim.3.weight.exp_avg"), so a
// checkpoint written by any number of stages loads onto any other number.
//
// Every file is written atomically (temp, fsync, rename, fsync dir) and the manifest is written
// last: a directory holds a complete checkpoint exactly when manifest.json exists.
#ifndef PIPETRAIN_COMMON_MODEL_CHECKPOINT_H_
#define PIPETRAIN_COMMON_MODEL_CHECKPOINT_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/io/dataset.h"
#include "common/math/tensor.h"
#include "pipetrain/v1/model.pb.h"

namespace pipetrain::model {

inline constexpr char kManifestName[] = "manifest.json";
inline constexpr char kCheckpointFormat[] = "pipetrain.checkpoint.v1";

struct CheckpointShard {
  std::string file;         // name inside the checkpoint directory, e.g. "stage-0.safetensors".
  int64_t first_layer = 0;  // global layer range [first_layer, last_layer).
  int64_t last_layer = 0;
};

struct CheckpointManifest {
  int64_t step = 0;          // optimizer steps applied.
  v1::ModelSpec model_spec;  // fully resolved spec.
  std::string optimizer;     // math::FormatOptimizerConfig text.
  uint64_t seed = 0;
  std::string data;  // data set spec, e.g. "digits".
  int64_t batch_size = 0;
  int64_t microbatches = 0;
  io::DataCursor data_cursor;  // position of the next batch.
  std::vector<CheckpointShard> shards;
};

// Writes each shard's tensors and then the manifest into `dir` (created if missing). `shards[i]`
// are the tensors of manifest.shards[i]. INVALID_ARGUMENT if the counts differ.
absl::Status SaveCheckpoint(const std::string& dir, const CheckpointManifest& manifest,
                            const std::vector<std::map<std::string, math::Tensor>>& shards);

// Reads the manifest of `dir`. NOT_FOUND without a manifest; DATA_LOSS / INVALID_ARGUMENT naming
// the field for a malformed one.
absl::StatusOr<CheckpointManifest> ReadCheckpointManifest(const std::string& dir);

struct LoadedCheckpoint {
  CheckpointManifest manifest;
  std::map<std::string, math::Tensor> tensors;  // all shards merged.
};

// Reads the manifest and every shard. Errors name the file and tensor; a tensor present in two
// shards is INVALID_ARGUMENT.
absl::StatusOr<LoadedCheckpoint> LoadCheckpoint(const std::string& dir);

}  // namespace pipetrain::model

#endif  // PIPETRAIN_COMMON_MODEL_CHECKPOINT_H_
