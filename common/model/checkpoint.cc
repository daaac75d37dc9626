#include "common/model/checkpoint.h"

#include <string>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/io/file_util.h"
#include "common/io/safetensors.h"
#include "common/model/model.h"
#include "common/util/status_macros.h"
#include "google/protobuf/text_format.h"
#include "nlohmann/json.hpp"

namespace pipetrain::model {
namespace {

using json = nlohmann::json;

absl::Status ManifestError(const std::string& path, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", what));
}

// Reads an integer field; INVALID_ARGUMENT naming it when missing or mistyped.
absl::StatusOr<int64_t> GetInt(const json& j, const char* key, const std::string& path) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_number_integer()) {
    return ManifestError(path, absl::StrCat("field '", key, "' missing or not an integer"));
  }
  return it->get<int64_t>();
}

absl::StatusOr<std::string> GetString(const json& j, const char* key, const std::string& path) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_string()) {
    return ManifestError(path, absl::StrCat("field '", key, "' missing or not a string"));
  }
  return it->get<std::string>();
}

// A shard file name must stay inside the checkpoint directory.
bool IsPlainFileName(const std::string& name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos &&
         name.find('\0') == std::string::npos;
}

}  // namespace

std::string LayerShardFile(int64_t layer) {
  return absl::StrFormat("layer-%05d.safetensors", layer);
}

std::vector<CheckpointShard> LayerShards(const Model& model, int64_t first, int64_t last) {
  std::vector<CheckpointShard> out;
  for (int64_t l = first; l < last; ++l) {
    if (!model.layer(l).params().empty()) out.push_back({LayerShardFile(l), l, l + 1});
  }
  return out;
}

absl::Status WriteCheckpointShards(const std::string& dir,
                                   const std::vector<CheckpointShard>& shards,
                                   const std::map<std::string, math::Tensor>& tensors,
                                   int64_t step) {
  PT_RETURN_IF_ERROR(io::EnsureDirectory(dir));
  for (const CheckpointShard& s : shards) {
    if (!IsPlainFileName(s.file)) {
      return absl::InvalidArgumentError(
          absl::StrCat("shard file name '", s.file, "' is not a plain file name"));
    }
    // Every tensor whose global layer index is in [first_layer, last_layer).
    std::map<std::string, math::Tensor> part;
    for (int64_t l = s.first_layer; l < s.last_layer; ++l) {
      for (const std::string& prefix :
           {absl::StrCat("layers.", l, "."), absl::StrCat("optim.", l, ".")}) {
        for (auto it = tensors.lower_bound(prefix);
             it != tensors.end() && absl::StartsWith(it->first, prefix); ++it) {
          part.insert(*it);
        }
      }
    }
    if (part.empty()) {
      return absl::NotFoundError(absl::StrCat("no tensors for shard ", s.file, " (layers ",
                                              s.first_layer, "..", s.last_layer - 1, ")"));
    }
    PT_RETURN_IF_ERROR(
        io::WriteSafetensors(absl::StrCat(dir, "/", s.file), part,
                             {{"format", kCheckpointFormat}, {"step", absl::StrCat(step)}}));
  }
  return absl::OkStatus();
}

absl::Status WriteCheckpointManifest(const std::string& dir, const CheckpointManifest& manifest) {
  PT_RETURN_IF_ERROR(io::EnsureDirectory(dir));
  json j;
  j["format"] = kCheckpointFormat;
  j["step"] = manifest.step;
  std::string spec_text;
  google::protobuf::TextFormat::PrintToString(manifest.model_spec, &spec_text);
  j["model_spec"] = spec_text;
  j["optimizer"] = manifest.optimizer;
  j["seed"] = manifest.seed;
  j["data"] = manifest.data;
  j["batch_size"] = manifest.batch_size;
  j["microbatches"] = manifest.microbatches;
  j["data_cursor"] = {{"epoch", manifest.data_cursor.epoch}, {"batch", manifest.data_cursor.batch}};
  j["shards"] = json::array();
  for (const CheckpointShard& s : manifest.shards) {
    if (!IsPlainFileName(s.file)) {
      return absl::InvalidArgumentError(
          absl::StrCat("shard file name '", s.file, "' is not a plain file name"));
    }
    j["shards"].push_back(
        {{"file", s.file}, {"first_layer", s.first_layer}, {"last_layer", s.last_layer}});
  }
  return io::WriteFileAtomically(absl::StrCat(dir, "/", kManifestName), j.dump(2) + "\n");
}

absl::Status SaveCheckpoint(const std::string& dir, const CheckpointManifest& manifest,
                            const std::map<std::string, math::Tensor>& tensors) {
  PT_RETURN_IF_ERROR(WriteCheckpointShards(dir, manifest.shards, tensors, manifest.step));
  return WriteCheckpointManifest(dir, manifest);
}

absl::StatusOr<CheckpointManifest> ReadCheckpointManifest(const std::string& dir) {
  const std::string path = absl::StrCat(dir, "/", kManifestName);
  PT_ASSIGN_OR_RETURN(std::string text, io::ReadFile(path));
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::DataLossError(absl::StrCat(path, ": not a JSON object"));
  }
  PT_ASSIGN_OR_RETURN(std::string format, GetString(j, "format", path));
  if (format != kCheckpointFormat) {
    return ManifestError(path, absl::StrCat("format '", format, "' is not ", kCheckpointFormat));
  }
  CheckpointManifest m;
  PT_ASSIGN_OR_RETURN(m.step, GetInt(j, "step", path));
  if (m.step < 0) return ManifestError(path, "step < 0");
  PT_ASSIGN_OR_RETURN(std::string spec_text, GetString(j, "model_spec", path));
  PT_ASSIGN_OR_RETURN(m.model_spec,
                      ParseModelSpecText(spec_text, absl::StrCat(path, ":model_spec")));
  PT_ASSIGN_OR_RETURN(m.optimizer, GetString(j, "optimizer", path));
  PT_ASSIGN_OR_RETURN(int64_t seed, GetInt(j, "seed", path));
  m.seed = static_cast<uint64_t>(seed);
  PT_ASSIGN_OR_RETURN(m.data, GetString(j, "data", path));
  PT_ASSIGN_OR_RETURN(m.batch_size, GetInt(j, "batch_size", path));
  PT_ASSIGN_OR_RETURN(m.microbatches, GetInt(j, "microbatches", path));
  auto cursor = j.find("data_cursor");
  if (cursor == j.end() || !cursor->is_object()) {
    return ManifestError(path, "field 'data_cursor' missing or not an object");
  }
  PT_ASSIGN_OR_RETURN(m.data_cursor.epoch, GetInt(*cursor, "epoch", path));
  PT_ASSIGN_OR_RETURN(m.data_cursor.batch, GetInt(*cursor, "batch", path));
  auto shards = j.find("shards");
  if (shards == j.end() || !shards->is_array() || shards->empty()) {
    return ManifestError(path, "field 'shards' missing, not an array, or empty");
  }
  for (const json& s : *shards) {
    if (!s.is_object()) return ManifestError(path, "a shard entry is not an object");
    CheckpointShard shard;
    PT_ASSIGN_OR_RETURN(shard.file, GetString(s, "file", path));
    if (!IsPlainFileName(shard.file)) {
      return ManifestError(path,
                           absl::StrCat("shard file '", shard.file, "' is not a plain file name"));
    }
    PT_ASSIGN_OR_RETURN(shard.first_layer, GetInt(s, "first_layer", path));
    PT_ASSIGN_OR_RETURN(shard.last_layer, GetInt(s, "last_layer", path));
    if (shard.first_layer < 0 || shard.first_layer >= shard.last_layer) {
      return ManifestError(
          path, absl::StrCat("shard ", shard.file, " has an empty or negative layer range"));
    }
    m.shards.push_back(std::move(shard));
  }
  return m;
}

absl::StatusOr<LoadedCheckpoint> LoadCheckpoint(const std::string& dir) {
  LoadedCheckpoint out;
  PT_ASSIGN_OR_RETURN(out.manifest, ReadCheckpointManifest(dir));
  for (const CheckpointShard& shard : out.manifest.shards) {
    const std::string path = absl::StrCat(dir, "/", shard.file);
    PT_ASSIGN_OR_RETURN(io::SafetensorsFile file, io::ReadSafetensors(path));
    for (auto& [name, tensor] : file.tensors) {
      if (out.tensors.count(name) != 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(path, ": tensor ", name, " also appears in an earlier shard"));
      }
      out.tensors.emplace(name, std::move(tensor));
    }
  }
  return out;
}

}  // namespace pipetrain::model
