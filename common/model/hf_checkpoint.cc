#include "common/model/hf_checkpoint.h"

#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/io/dir_util.h"
#include "common/io/file_util.h"
#include "common/io/safetensors.h"
#include "common/math/optimizer.h"
#include "common/model/hf_gpt2.h"
#include "common/model/hf_llama.h"
#include "common/model/stage.h"
#include "common/util/status_macros.h"
#include "nlohmann/json.hpp"

namespace pipetrain::model {
namespace {

// Largest config.json or sidecar manifest an import reads.
constexpr int64_t kMaxJsonBytes = int64_t{64} << 20;
// model.safetensors's metadata: transformers refuses a file without {"format": "pt"}.
const std::map<std::string, std::string>& WeightsMetadata() {
  static const auto* const metadata = new std::map<std::string, std::string>{{"format", "pt"}};
  return *metadata;
}
constexpr char kOptimizerFormat[] = "pipetrain.optimizer.v1";

std::string ShapeText(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

math::Tensor Transposed(const math::Tensor& t) {
  const int64_t rows = t.shape[0], cols = t.shape[1];
  math::Tensor out;
  out.shape = {cols, rows};
  out.data.resize(t.data.size());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) out.data[c * rows + r] = t.data[r * cols + c];
  }
  return out;
}

// The shape of every parameter of `model` by checkpoint name (a tied head's weight is the
// embedding's token table, stored under that name only).
std::map<std::string, std::vector<int64_t>> ParamShapes(const Model& model) {
  std::map<std::string, std::vector<int64_t>> shapes;
  for (int64_t l = 0; l < model.num_layers(); ++l) {
    const std::vector<math::ParamSpec> params = model.layer(l).params();
    for (size_t p = 0; p < params.size(); ++p) {
      if (model.tie().has_value() && l == model.tie()->head_layer && p == TiedEmbedding::kParam) {
        continue;
      }
      shapes[absl::StrCat("layers.", l, ".", params[p].name)] = params[p].shape;
    }
  }
  return shapes;
}

// The architecture's names for `model`, checked to cover every parameter exactly once.
absl::StatusOr<std::vector<HfTensorName>> TensorNames(const HfArchitecture& arch,
                                                      const Model& model) {
  const std::vector<HfTensorName> names = arch.tensor_names(model);
  std::map<std::string, std::vector<int64_t>> shapes = ParamShapes(model);
  for (const HfTensorName& n : names) {
    if (shapes.erase(n.pipetrain) != 1) {
      return absl::InternalError(absl::StrCat("the ", arch.model_type, " table names ", n.pipetrain,
                                              ", which the model does not have (or twice)"));
    }
  }
  if (!shapes.empty()) {
    return absl::InternalError(
        absl::StrCat("the ", arch.model_type, " table has no name for ", shapes.begin()->first));
  }
  return names;
}

// INVALID_ARGUMENT naming the first NaN or Inf of `t`.
absl::Status CheckFinite(const math::Tensor& t, const std::string& source,
                         const std::string& name) {
  for (size_t i = 0; i < t.data.size(); ++i) {
    if (!std::isfinite(t.data[i])) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": tensor '", name, "' element ", i, " is ", t.data[i]));
    }
  }
  return absl::OkStatus();
}

}  // namespace

const std::vector<const HfArchitecture*>& HfArchitectures() {
  static const auto* const all =
      new std::vector<const HfArchitecture*>{&Gpt2Architecture(), &LlamaArchitecture()};
  return *all;
}

absl::StatusOr<const HfArchitecture*> HfArchitectureOf(const Model& model) {
  std::vector<std::string> reasons;
  for (const HfArchitecture* arch : HfArchitectures()) {
    const absl::Status s = arch->check(model);
    if (s.ok()) return arch;
    reasons.push_back(absl::StrCat(arch->model_type, ": ", s.message()));
  }
  return absl::InvalidArgumentError(absl::StrCat("model '", model.spec().name(),
                                                 "' has no Hugging Face equivalent pipetrain ",
                                                 "exports: ", absl::StrJoin(reasons, "; ")));
}

absl::StatusOr<std::map<std::string, math::Tensor>> ToHfTensors(
    const Model& model, const std::map<std::string, math::Tensor>& tensors) {
  PT_ASSIGN_OR_RETURN(const HfArchitecture* arch, HfArchitectureOf(model));
  PT_ASSIGN_OR_RETURN(const std::vector<HfTensorName> names, TensorNames(*arch, model));
  const std::map<std::string, std::vector<int64_t>> shapes = ParamShapes(model);
  std::map<std::string, math::Tensor> out;
  for (const HfTensorName& n : names) {
    auto it = tensors.find(n.pipetrain);
    if (it == tensors.end()) {
      return absl::NotFoundError(absl::StrCat("tensor ", n.pipetrain, " is missing"));
    }
    const std::vector<int64_t>& want = shapes.at(n.pipetrain);
    if (it->second.shape != want) {
      return absl::InvalidArgumentError(absl::StrCat("tensor ", n.pipetrain, " has shape ",
                                                     ShapeText(it->second.shape), ", the model's ",
                                                     ShapeText(want)));
    }
    out[n.hf] = n.transpose ? Transposed(it->second) : it->second;
  }
  return out;
}

absl::StatusOr<std::map<std::string, math::Tensor>> FromHfTensors(
    const Model& model, const std::map<std::string, math::Tensor>& hf, const std::string& source,
    const std::map<std::string, std::string>& aliases) {
  PT_ASSIGN_OR_RETURN(const HfArchitecture* arch, HfArchitectureOf(model));
  PT_ASSIGN_OR_RETURN(const std::vector<HfTensorName> names, TensorNames(*arch, model));
  const std::map<std::string, std::vector<int64_t>> shapes = ParamShapes(model);
  std::map<std::string, math::Tensor> out;
  std::set<std::string> used;
  for (const HfTensorName& n : names) {
    std::string name = n.hf;
    if (hf.count(name) == 0 && aliases.count(name) != 0) name = aliases.at(name);
    auto it = hf.find(name);
    if (it == hf.end()) {
      return absl::NotFoundError(absl::StrCat(source, ": tensor '", n.hf, "' is missing (",
                                              arch->model_type, "'s for pipetrain's ", n.pipetrain,
                                              ")"));
    }
    std::vector<int64_t> want = shapes.at(n.pipetrain);
    if (n.transpose) want = {want[1], want[0]};
    if (it->second.shape != want) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": tensor '", name, "' has shape ", ShapeText(it->second.shape),
                       "; the model config.json describes needs ", ShapeText(want)));
    }
    PT_RETURN_IF_ERROR(CheckFinite(it->second, source, name));
    out[n.pipetrain] = n.transpose ? Transposed(it->second) : it->second;
    used.insert(name);
  }
  for (const auto& [name, tensor] : hf) {
    if (used.count(name) == 0 && !arch->ignored(name)) {
      return absl::InvalidArgumentError(absl::StrCat(source, ": tensor '", name, "' is not a ",
                                                     "parameter of the ", arch->model_type,
                                                     " model config.json describes"));
    }
  }
  return out;
}

namespace {

// The names an export writes into its directory.
const std::set<std::string>& ExportFiles() {
  static const auto* const files = new std::set<std::string>{
      kHfWeightsFile, kHfConfigFile, kHfVocabFile, kHfSidecarManifestFile, kHfSidecarOptimizerFile};
  return *files;
}

// OK if `dir` is missing, or a directory holding only files an export writes (it is replaced as a
// whole).
absl::Status CheckExportDestination(const std::string& dir) {
  if (dir.empty()) return absl::InvalidArgumentError("empty export directory path");
  absl::StatusOr<std::vector<std::string>> entries = io::ListDirectory(dir);
  if (absl::IsNotFound(entries.status())) return absl::OkStatus();
  PT_RETURN_IF_ERROR(entries.status());
  for (const std::string& e : *entries) {
    if (ExportFiles().count(e) == 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "'", dir, "' holds '", e, "', which an export does not write; an export replaces its ",
          "directory as a whole: name a new or empty directory"));
    }
  }
  return absl::OkStatus();
}

// vocab.json: each token (byte b as the character U+00b, so ASCII is itself) -> its id.
absl::StatusOr<std::string> VocabJson(absl::string_view vocabulary, const Model& model) {
  const int64_t vocab = model.layer(0).params().at(0).shape.at(0);
  if (static_cast<int64_t>(vocabulary.size()) > vocab) {
    return absl::InvalidArgumentError(absl::StrCat("the data set has ", vocabulary.size(),
                                                   " tokens, more than the model's vocab_size ",
                                                   vocab));
  }
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  for (size_t id = 0; id < vocabulary.size(); ++id) {
    const unsigned char b = static_cast<unsigned char>(vocabulary[id]);
    std::string key;
    if (b < 0x80) {
      key = std::string(1, static_cast<char>(b));
    } else {
      key = {static_cast<char>(0xC0 | (b >> 6)), static_cast<char>(0x80 | (b & 0x3F))};
    }
    j[key] = id;
  }
  return j.dump(2) + "\n";
}

// Every file of the export of `checkpoint`, by name.
absl::StatusOr<std::map<std::string, std::string>> ExportFilesOf(const LoadedCheckpoint& checkpoint,
                                                                 absl::string_view vocabulary,
                                                                 const Model& model) {
  PT_ASSIGN_OR_RETURN(const HfArchitecture* arch, HfArchitectureOf(model));
  std::map<std::string, std::string> files;
  PT_ASSIGN_OR_RETURN(files[kHfConfigFile], arch->config(model));
  PT_ASSIGN_OR_RETURN(const auto hf, ToHfTensors(model, checkpoint.tensors));
  PT_ASSIGN_OR_RETURN(files[kHfWeightsFile], io::SerializeSafetensors(hf, WeightsMetadata()));
  std::map<std::string, math::Tensor> optimizer;
  const std::map<std::string, std::vector<int64_t>> shapes = ParamShapes(model);
  for (const auto& [name, tensor] : checkpoint.tensors) {
    if (absl::StartsWith(name, "optim.")) {
      optimizer.emplace(name, tensor);
    } else if (shapes.count(name) == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor ", name, " is neither a parameter of the model nor optimizer state"));
    }
  }
  if (!optimizer.empty()) {
    PT_ASSIGN_OR_RETURN(
        files[kHfSidecarOptimizerFile],
        io::SerializeSafetensors(optimizer, {{"format", kOptimizerFormat},
                                             {"step", absl::StrCat(checkpoint.manifest.step)}}));
  }
  files[kHfSidecarManifestFile] = FormatCheckpointManifest(checkpoint.manifest);
  if (!vocabulary.empty()) {
    PT_ASSIGN_OR_RETURN(files[kHfVocabFile], VocabJson(vocabulary, model));
  }
  return files;
}

}  // namespace

absl::Status ExportHfCheckpoint(const LoadedCheckpoint& checkpoint, absl::string_view vocabulary,
                                const std::string& dir) {
  PT_RETURN_IF_ERROR(io::CheckNoNulByte(dir));
  PT_ASSIGN_OR_RETURN(std::unique_ptr<Model> model, Model::Build(checkpoint.manifest.model_spec));
  PT_ASSIGN_OR_RETURN(const auto files, ExportFilesOf(checkpoint, vocabulary, *model));
  PT_RETURN_IF_ERROR(CheckExportDestination(dir));
  PT_RETURN_IF_ERROR(io::CheckWritableDirectory(io::DirName(dir)));
  PT_ASSIGN_OR_RETURN(const std::string staging, io::CreateStagingDirectory(dir));
  absl::Status status;
  for (const auto& [name, bytes] : files) {
    status = io::WriteFileAtomically(io::JoinPath(staging, name), bytes);
    if (!status.ok()) break;
  }
  if (status.ok()) status = io::PublishDirectory(staging, dir);
  if (!status.ok()) io::RemoveTree(staging).IgnoreError();
  return status;
}

namespace {

absl::StatusOr<std::string> ReadJsonFile(const std::string& path) {
  return io::ReadFile(path, kMaxJsonBytes);
}

bool FileExists(const std::string& path) { return ::access(path.c_str(), F_OK) == 0; }

// The config.json of `dir`: its architecture and what it describes.
absl::StatusOr<std::pair<const HfArchitecture*, HfConfig>> ReadConfig(const std::string& dir) {
  const std::string path = io::JoinPath(dir, kHfConfigFile);
  PT_ASSIGN_OR_RETURN(const std::string text, ReadJsonFile(path));
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a JSON object"));
  }
  const std::string type = j.value("model_type", std::string());
  std::vector<std::string> known;
  for (const HfArchitecture* arch : HfArchitectures()) {
    if (type == arch->model_type) {
      PT_ASSIGN_OR_RETURN(HfConfig config, arch->parse_config(text, path));
      return std::make_pair(arch, std::move(config));
    }
    known.push_back(arch->model_type);
  }
  return absl::InvalidArgumentError(absl::StrCat(path, ": model_type '", type,
                                                 "' is not one pipetrain imports (",
                                                 absl::StrJoin(known, ", "), ")"));
}

// Builds `spec` and checks it has `arch`'s shape; errors start with `source`.
absl::StatusOr<std::unique_ptr<Model>> BuildChecked(const v1::ModelSpec& spec,
                                                    const HfArchitecture& arch,
                                                    const std::string& source) {
  absl::StatusOr<std::unique_ptr<Model>> model = Model::Build(spec);
  absl::Status s = model.status();
  if (s.ok()) s = arch.check(**model);
  if (!s.ok()) return absl::Status(s.code(), absl::StrCat(source, ": ", s.message()));
  return model;
}

// The optimizer state of the sidecar, if any (tensors named "optim.*"), which must be of `step`.
absl::StatusOr<std::map<std::string, math::Tensor>> ReadSidecarOptimizer(const std::string& dir,
                                                                         int64_t step) {
  const std::string path = io::JoinPath(dir, kHfSidecarOptimizerFile);
  if (!FileExists(path)) return std::map<std::string, math::Tensor>();
  PT_ASSIGN_OR_RETURN(io::SafetensorsFile file, io::ReadSafetensors(path));
  auto saved = file.metadata.find("step");
  if (saved == file.metadata.end() || saved->second != absl::StrCat(step)) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": the optimizer state of step '",
        saved == file.metadata.end() ? "(none)" : saved->second, "', but ", kHfSidecarManifestFile,
        " is of step ", step, ": the two sidecar files come from different exports"));
  }
  for (const auto& [name, tensor] : file.tensors) {
    if (!absl::StartsWith(name, "optim.")) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": tensor '", name, "' is not optimizer state (optim.*)"));
    }
    PT_RETURN_IF_ERROR(CheckFinite(tensor, path, name));
  }
  return std::move(file.tensors);
}

// Checks that `tensors` are exactly the tensors of a checkpoint of `model` trained with
// `manifest.optimizer` (names and shapes), by loading them into a Stage. `where` names the
// optimizer state's file in messages.
absl::Status CheckCompleteState(const Model& model, const CheckpointManifest& manifest,
                                const std::map<std::string, math::Tensor>& tensors,
                                const std::string& where) {
  PT_ASSIGN_OR_RETURN(math::OptimizerConfig optimizer,
                      math::ParseOptimizerConfig(manifest.optimizer));
  PT_ASSIGN_OR_RETURN(Stage stage,
                      Stage::Create(&model, 0, model.num_layers(), manifest.seed, optimizer));
  if (absl::Status s = stage.ImportState(tensors); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat(where, ": ", s.message(), " (optimizer ",
                                               math::OptimizerKindName(optimizer.kind), ")"));
  }
  const std::map<std::string, math::Tensor> expected = stage.ExportState();
  for (const auto& [name, tensor] : tensors) {
    if (expected.count(name) == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": tensor '", name, "' is not state of optimizer ",
                       math::OptimizerKindName(optimizer.kind), " for this model"));
    }
  }
  return absl::OkStatus();
}

// The state of a fresh run from the weights `params`: step 0, the default optimizer (AdamW) with
// zero state, seed 0, no data set, one shard per layer.
absl::StatusOr<ImportedHfCheckpoint> FreshImport(const Model& model,
                                                 std::map<std::string, math::Tensor> params) {
  ImportedHfCheckpoint out;
  CheckpointManifest& m = out.manifest;
  m.model_spec = model.spec();
  const math::OptimizerConfig optimizer;
  m.optimizer = math::FormatOptimizerConfig(optimizer);
  m.shards = LayerShards(model, 0, model.num_layers());
  PT_ASSIGN_OR_RETURN(Stage stage, Stage::Create(&model, 0, model.num_layers(), 0, optimizer));
  out.tensors = stage.ExportState();  // zero optimizer state
  for (auto& [name, tensor] : params) out.tensors[name] = std::move(tensor);
  return out;
}

}  // namespace

absl::StatusOr<ImportedHfCheckpoint> ImportHfCheckpoint(const std::string& dir) {
  PT_RETURN_IF_ERROR(io::CheckNoNulByte(dir));
  PT_ASSIGN_OR_RETURN(auto config, ReadConfig(dir));
  const HfArchitecture& arch = *config.first;
  const std::string config_path = io::JoinPath(dir, kHfConfigFile);
  PT_ASSIGN_OR_RETURN(std::unique_ptr<Model> model,
                      BuildChecked(config.second.spec, arch, config_path));
  const std::string sidecar_path = io::JoinPath(dir, kHfSidecarManifestFile);
  std::optional<CheckpointManifest> sidecar;
  if (FileExists(sidecar_path)) {
    PT_ASSIGN_OR_RETURN(const std::string text, ReadJsonFile(sidecar_path));
    PT_ASSIGN_OR_RETURN(sidecar, ParseCheckpointManifest(text, sidecar_path));
    PT_ASSIGN_OR_RETURN(std::unique_ptr<Model> exported,
                        BuildChecked(sidecar->model_spec, arch, sidecar_path));
    PT_ASSIGN_OR_RETURN(const std::string want, arch.describe(*model));
    PT_ASSIGN_OR_RETURN(const std::string got, arch.describe(*exported));
    if (want != got) {
      return absl::InvalidArgumentError(absl::StrCat(
          config_path, " describes ", want, ", but the model of ", sidecar_path, " has ", got,
          ": the two files come from different models (remove ", kHfSidecarManifestFile, " and ",
          kHfSidecarOptimizerFile, " to import the weights as a fresh run)"));
    }
    model = std::move(exported);  // the exported spec text, for a byte-identical manifest
  }
  const std::string weights_path = io::JoinPath(dir, kHfWeightsFile);
  PT_ASSIGN_OR_RETURN(io::SafetensorsFile weights, io::ReadSafetensors(weights_path));
  PT_ASSIGN_OR_RETURN(auto params,
                      FromHfTensors(*model, weights.tensors, weights_path, config.second.aliases));
  if (!sidecar.has_value()) {
    PT_ASSIGN_OR_RETURN(ImportedHfCheckpoint fresh, FreshImport(*model, std::move(params)));
    fresh.architecture = &arch;
    return fresh;
  }
  ImportedHfCheckpoint out;
  out.architecture = &arch;
  out.exact = true;
  PT_ASSIGN_OR_RETURN(out.tensors, ReadSidecarOptimizer(dir, sidecar->step));
  for (auto& [name, tensor] : params) out.tensors[name] = std::move(tensor);
  PT_RETURN_IF_ERROR(CheckCompleteState(*model, *sidecar, out.tensors,
                                        io::JoinPath(dir, kHfSidecarOptimizerFile)));
  out.manifest = *std::move(sidecar);
  for (CheckpointShard& s : out.manifest.shards) {
    s.sha256.clear();
    s.bytes = 0;
  }
  return out;
}

}  // namespace pipetrain::model
