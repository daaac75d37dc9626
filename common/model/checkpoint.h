// Checkpoints: one safetensors file per layer that has parameters ("layer-00003.safetensors")
// plus a JSON manifest. Tensor names are global ("layers.3.weight", "optim.3.weight.exp_avg").
// The layout does not depend on the partition: the same training state gives byte-identical files
// whether one process or any number of stages wrote it, and loads onto any number of stages.
// (The manifest format allows any contiguous layer range per file; pipetrain writes single
// layers.)
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
#include "common/model/model.h"
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

// "layer-00003.safetensors" for layer 3.
std::string LayerShardFile(int64_t layer);

// The per-layer shards of layers [first, last) of `model` that have parameters, in layer order.
std::vector<CheckpointShard> LayerShards(const Model& model, int64_t first, int64_t last);

// Writes the tensors of `shards` (each a single layer or range) taken from `tensors` (global
// names, e.g. Stage::ExportState) into `dir` (created if missing), one atomic file each, with
// `step` in the file metadata. A tensor of a shard's layers missing from `tensors` is NOT_FOUND.
absl::Status WriteCheckpointShards(const std::string& dir,
                                   const std::vector<CheckpointShard>& shards,
                                   const std::map<std::string, math::Tensor>& tensors,
                                   int64_t step);

// Writes `manifest` into `dir` atomically. Call after every shard is written.
absl::Status WriteCheckpointManifest(const std::string& dir, const CheckpointManifest& manifest);

// WriteCheckpointShards for manifest.shards, then WriteCheckpointManifest.
absl::Status SaveCheckpoint(const std::string& dir, const CheckpointManifest& manifest,
                            const std::map<std::string, math::Tensor>& tensors);

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
