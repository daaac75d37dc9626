#include "common/model/checkpoint.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <functional>
#include <set>
#include <string>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "common/io/confined_path.h"
#include "common/io/digest.h"
#include "common/io/dir_util.h"
#include "common/io/file_util.h"
#include "common/io/safetensors.h"
#include "common/io/tokenizer.h"
#include "common/model/model.h"
#include "common/util/status_macros.h"
#include "google/protobuf/text_format.h"
#include "nlohmann/json.hpp"

namespace pipetrain::model {
namespace {

using json = nlohmann::json;

// The manifest format before per-shard checksums.
constexpr char kUnverifiableFormat[] = "pipetrain.checkpoint.v1";
// A manifest is a few kilobytes plus the model spec text.
constexpr int64_t kMaxManifestBytes = int64_t{64} << 20;

absl::Status ManifestError(const std::string& path, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", what));
}

// Reads integer field `prefix + key`; INVALID_ARGUMENT naming it when missing or mistyped.
absl::StatusOr<int64_t> GetInt(const json& j, const char* key, const std::string& prefix,
                               const std::string& path) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_number_integer()) {
    return ManifestError(path, absl::StrCat("field '", prefix, key, "' missing or not an integer"));
  }
  if (it->is_number_unsigned() && it->get<uint64_t>() > uint64_t{INT64_MAX}) {
    return ManifestError(path, absl::StrCat("field '", prefix, key, "' = ", it->get<uint64_t>(),
                                            " does not fit in 64 bits"));
  }
  return it->get<int64_t>();
}

// Reads a counter field: an integer in [0, kMaxManifestCount).
absl::StatusOr<int64_t> GetCount(const json& j, const char* key, const std::string& prefix,
                                 const std::string& path) {
  PT_ASSIGN_OR_RETURN(int64_t v, GetInt(j, key, prefix, path));
  if (v < 0 || v >= kMaxManifestCount) {
    return ManifestError(
        path, absl::StrCat("field '", prefix, key, "' = ", v,
                           " is out of range [0, 2^53) (counters are converted to double, which "
                           "is exact only below 2^53)"));
  }
  return v;
}

absl::StatusOr<std::string> GetString(const json& j, const char* key, const std::string& prefix,
                                      const std::string& path) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_string()) {
    return ManifestError(path, absl::StrCat("field '", prefix, key, "' missing or not a string"));
  }
  return it->get<std::string>();
}

// A shard file name must stay inside the checkpoint directory.
bool IsPlainFileName(const std::string& name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos &&
         name.find('\0') == std::string::npos;
}

absl::Status CheckPlainFileName(const std::string& name) {
  if (IsPlainFileName(name)) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("shard file name '", name, "' is not a plain file name"));
}

// "layer-NNNNN.safetensors" as LayerShardFile writes it (five or more digits).
bool IsLayerShardFile(absl::string_view name) {
  if (!absl::ConsumePrefix(&name, "layer-") || !absl::ConsumeSuffix(&name, ".safetensors")) {
    return false;
  }
  if (name.size() < 5) return false;
  for (char c : name) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

}  // namespace

std::string IsaNoteAfterResume(const CheckpointManifest& resumed, absl::string_view isa) {
  if (resumed.isa == isa) return resumed.isa_note;
  const std::string before = resumed.isa.empty() ? "an unrecorded instruction set" : resumed.isa;
  return absl::StrCat(resumed.isa_note, resumed.isa_note.empty() ? "" : " ", "Steps up to ",
                      resumed.step, " ran at ", before, ", later ones at ", isa,
                      ": the bits differ from a run that stayed on one instruction set.");
}

namespace {

json ManifestToJson(const CheckpointManifest& manifest) {
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
  j["isa"] = manifest.isa;
  if (!manifest.isa_note.empty()) j["isa_note"] = manifest.isa_note;
  if (manifest.tokenizer.has_value()) {
    j["tokenizer"] = {{"file", manifest.tokenizer->file},
                      {"sha256", manifest.tokenizer->sha256},
                      {"bytes", manifest.tokenizer->bytes}};
  }
  j["shards"] = json::array();
  for (const CheckpointShard& s : manifest.shards) {
    j["shards"].push_back({{"file", s.file},
                           {"first_layer", s.first_layer},
                           {"last_layer", s.last_layer},
                           {"sha256", s.sha256},
                           {"bytes", s.bytes}});
  }
  return j;
}

// The manifest's optional "tokenizer" object: {"file": kCheckpointTokenizerFile, "sha256",
// "bytes"}.
absl::StatusOr<std::optional<CheckpointFile>> TokenizerFromJson(const json& j,
                                                                const std::string& path) {
  auto t = j.find("tokenizer");
  if (t == j.end()) return std::nullopt;
  if (!t->is_object()) return ManifestError(path, "field 'tokenizer' is not an object");
  CheckpointFile file;
  PT_ASSIGN_OR_RETURN(file.file, GetString(*t, "file", "tokenizer.", path));
  if (file.file != kCheckpointTokenizerFile) {
    return ManifestError(path, absl::StrCat("field 'tokenizer.file' = '", file.file, "' is not ",
                                            kCheckpointTokenizerFile));
  }
  PT_ASSIGN_OR_RETURN(file.sha256, GetString(*t, "sha256", "tokenizer.", path));
  if (!io::IsSha256Hex(file.sha256)) {
    return ManifestError(path, absl::StrCat("field 'tokenizer.sha256' = '", file.sha256,
                                            "' is not 64 lowercase hex digits"));
  }
  PT_ASSIGN_OR_RETURN(file.bytes, GetCount(*t, "bytes", "tokenizer.", path));
  if (file.bytes > io::kMaxTokenizerBytes) {
    return ManifestError(path, absl::StrCat("field 'tokenizer.bytes' = ", file.bytes,
                                            " is above the limit of ", io::kMaxTokenizerBytes));
  }
  return file;
}

// Reads the tokenizer file `entry` names, confined to `dir`, and checks its size and SHA-256.
absl::StatusOr<std::string> ReadVerifiedTokenizer(const std::string& dir,
                                                  const CheckpointFile& entry) {
  const std::string path = io::JoinPath(dir, entry.file);
  PT_ASSIGN_OR_RETURN(std::string bytes,
                      io::ReadConfinedFile(dir, entry.file, io::kMaxTokenizerBytes));
  if (static_cast<int64_t>(bytes.size()) != entry.bytes) {
    return absl::DataLossError(absl::StrCat(path, ": ", bytes.size(),
                                            " bytes, but the manifest says ", entry.bytes,
                                            " (truncated or overwritten?)"));
  }
  PT_ASSIGN_OR_RETURN(io::FileDigest digest, io::DigestBytes(bytes));
  if (digest.sha256 != entry.sha256) {
    return absl::DataLossError(absl::StrCat(path, ": SHA-256 ", digest.sha256,
                                            " differs from the manifest's ", entry.sha256));
  }
  return bytes;
}

// Validates a manifest's JSON field by field; errors start with `path`.
absl::StatusOr<CheckpointManifest> ManifestFromJson(const json& j, const std::string& path) {
  if (!j.is_object()) return absl::DataLossError(absl::StrCat(path, ": not a JSON object"));
  PT_ASSIGN_OR_RETURN(std::string format, GetString(j, "format", "", path));
  if (format == kUnverifiableFormat) {
    return ManifestError(
        path, absl::StrCat("the checkpoint's format ", format,
                           " predates per-shard checksums, so its files cannot be verified; "
                           "this pipetrain reads ",
                           kCheckpointFormat, " (docs/checkpoints.md says how to upgrade one)"));
  }
  if (format != kCheckpointFormat) {
    return ManifestError(path, absl::StrCat("format '", format, "' is not ", kCheckpointFormat));
  }
  CheckpointManifest m;
  PT_ASSIGN_OR_RETURN(m.step, GetCount(j, "step", "", path));
  PT_ASSIGN_OR_RETURN(std::string spec_text, GetString(j, "model_spec", "", path));
  PT_ASSIGN_OR_RETURN(m.model_spec,
                      ParseModelSpecText(spec_text, absl::StrCat(path, ":model_spec")));
  PT_ASSIGN_OR_RETURN(m.optimizer, GetString(j, "optimizer", "", path));
  auto seed = j.find("seed");
  if (seed == j.end() || !seed->is_number_integer()) {
    return ManifestError(path, "field 'seed' missing or not an integer");
  }
  m.seed = seed->get<uint64_t>();
  PT_ASSIGN_OR_RETURN(m.data, GetString(j, "data", "", path));
  PT_ASSIGN_OR_RETURN(m.batch_size, GetCount(j, "batch_size", "", path));
  PT_ASSIGN_OR_RETURN(m.microbatches, GetCount(j, "microbatches", "", path));
  auto cursor = j.find("data_cursor");
  if (cursor == j.end() || !cursor->is_object()) {
    return ManifestError(path, "field 'data_cursor' missing or not an object");
  }
  PT_ASSIGN_OR_RETURN(m.data_cursor.epoch, GetCount(*cursor, "epoch", "data_cursor.", path));
  PT_ASSIGN_OR_RETURN(m.data_cursor.batch, GetCount(*cursor, "batch", "data_cursor.", path));
  // Optional (manifests before the field have neither).
  for (auto [key, field] : {std::pair<const char*, std::string*>{"isa", &m.isa},
                            std::pair<const char*, std::string*>{"isa_note", &m.isa_note}}) {
    if (j.contains(key)) {
      PT_ASSIGN_OR_RETURN(*field, GetString(j, key, "", path));
    }
  }
  PT_ASSIGN_OR_RETURN(m.tokenizer, TokenizerFromJson(j, path));
  auto shards = j.find("shards");
  if (shards == j.end() || !shards->is_array() || shards->empty()) {
    return ManifestError(path, "field 'shards' missing, not an array, or empty");
  }
  const int64_t num_layers = m.model_spec.layers_size();
  std::set<std::string> files;
  for (size_t i = 0; i < shards->size(); ++i) {
    const json& s = (*shards)[i];
    const std::string prefix = absl::StrCat("shards[", i, "].");
    if (!s.is_object())
      return ManifestError(path, absl::StrCat("field 'shards[", i, "]' is not an object"));
    CheckpointShard shard;
    PT_ASSIGN_OR_RETURN(shard.file, GetString(s, "file", prefix, path));
    if (!IsPlainFileName(shard.file)) {
      return ManifestError(path, absl::StrCat("field '", prefix, "file' = '", shard.file,
                                              "' is not a plain file name"));
    }
    if (!files.insert(shard.file).second) {
      return ManifestError(path, absl::StrCat("shard file '", shard.file, "' is listed twice"));
    }
    PT_ASSIGN_OR_RETURN(shard.first_layer, GetInt(s, "first_layer", prefix, path));
    PT_ASSIGN_OR_RETURN(shard.last_layer, GetInt(s, "last_layer", prefix, path));
    if (shard.first_layer < 0 || shard.first_layer >= shard.last_layer ||
        shard.last_layer > num_layers) {
      return ManifestError(
          path,
          absl::StrCat("fields '", prefix, "first_layer', '", prefix, "last_layer' of ", shard.file,
                       ": layer range [", shard.first_layer, ", ", shard.last_layer,
                       ") is not a non-empty range within the model's ", num_layers, " layers"));
    }
    PT_ASSIGN_OR_RETURN(shard.sha256, GetString(s, "sha256", prefix, path));
    if (!io::IsSha256Hex(shard.sha256)) {
      return ManifestError(path, absl::StrCat("field '", prefix, "sha256' = '", shard.sha256,
                                              "' is not 64 lowercase hex digits"));
    }
    PT_ASSIGN_OR_RETURN(shard.bytes, GetCount(s, "bytes", prefix, path));
    m.shards.push_back(std::move(shard));
  }
  return m;
}

// Reads one shard file, confined to `dir` (a symbolic link may not lead out), and checks it
// against the manifest (ParseCheckpointShard).
absl::StatusOr<io::SafetensorsFile> ReadVerifiedShard(const std::string& dir,
                                                      const CheckpointShard& shard, int64_t step) {
  const std::string path = io::JoinPath(dir, shard.file);
  PT_ASSIGN_OR_RETURN(std::string bytes, io::ReadConfinedFile(dir, shard.file));
  return ParseCheckpointShard(path, shard, bytes, step);
}

// LoadCheckpoint; with `keep_tensors` false the tensors are checked and dropped.
absl::StatusOr<LoadedCheckpoint> ReadCheckpoint(const std::string& dir, bool keep_tensors) {
  PT_RETURN_IF_ERROR(io::CheckNoNulByte(dir));
  LoadedCheckpoint out;
  PT_ASSIGN_OR_RETURN(out.manifest, ReadCheckpointManifest(dir));
  std::set<std::string> names;
  for (const CheckpointShard& shard : out.manifest.shards) {
    PT_ASSIGN_OR_RETURN(io::SafetensorsFile file, ReadVerifiedShard(dir, shard, out.manifest.step));
    for (auto& [name, tensor] : file.tensors) {
      if (!names.insert(name).second) {
        return absl::InvalidArgumentError(absl::StrCat(io::JoinPath(dir, shard.file), ": tensor ",
                                                       name, " also appears in an earlier shard"));
      }
      if (keep_tensors) out.tensors.emplace(name, std::move(tensor));
    }
  }
  if (out.manifest.tokenizer.has_value()) {
    PT_ASSIGN_OR_RETURN(out.tokenizer, ReadVerifiedTokenizer(dir, *out.manifest.tokenizer));
  }
  return out;
}

// NOT_FOUND unless `dir` is an existing directory: checkpoint files are only written into one
// made by BeginCheckpointStaging (or a published checkpoint), never into one created on the fly.
absl::Status CheckDirectoryExists(const std::string& dir) {
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return absl::NotFoundError(absl::StrCat("checkpoint directory '", dir, "' does not exist"));
  }
  return absl::OkStatus();
}

// The shard file names the manifest in `dir` lists, read leniently (any format version), so that
// a checkpoint this version cannot load can still be replaced.
std::set<std::string> ListedShardFiles(const std::string& dir) {
  std::set<std::string> out;
  absl::StatusOr<std::string> text = io::ReadConfinedFile(dir, kManifestName, kMaxManifestBytes);
  if (!text.ok()) return out;
  const json j = json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("shards") || !j["shards"].is_array()) return out;
  for (const json& s : j["shards"]) {
    if (s.is_object() && s.contains("file") && s["file"].is_string()) {
      out.insert(s["file"].get<std::string>());
    }
  }
  return out;
}

// OK if `dir` does not exist or is a directory a checkpoint save may replace: every entry is a
// regular file that a save writes (or a temporary of one).
absl::Status CheckReplaceable(const std::string& dir) {
  struct stat st;
  if (::lstat(dir.c_str(), &st) != 0) {
    if (errno == ENOENT) return absl::OkStatus();
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot stat '", dir, "'"));
  }
  if (S_ISLNK(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat("'", dir,
                     "' is a symbolic link; a save replaces the directory itself, so name the "
                     "directory it points to"));
  }
  if (!S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat("'", dir, "' exists and is not a directory"));
  }
  PT_ASSIGN_OR_RETURN(std::vector<std::string> entries, io::ListDirectory(dir));
  const std::set<std::string> listed = ListedShardFiles(dir);
  for (const std::string& entry : entries) {
    // WriteFileAtomically's temporaries are "NAME.tmp.PID.RANDOM.N".
    const std::string name = entry.substr(0, entry.find(".tmp."));
    struct stat est;
    const bool regular =
        ::lstat(io::JoinPath(dir, entry).c_str(), &est) == 0 && S_ISREG(est.st_mode);
    if (!regular || (name != kManifestName && name != kCheckpointTokenizerFile &&
                     !IsLayerShardFile(name) && listed.count(name) == 0)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "'", dir, "' holds '", entry,
          "', which a checkpoint does not; refusing to replace it (save into a new or empty "
          "directory, or a checkpoint directory)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<io::SafetensorsFile> ParseCheckpointShard(const std::string& path,
                                                         const CheckpointShard& shard,
                                                         absl::string_view bytes, int64_t step) {
  if (static_cast<int64_t>(bytes.size()) != shard.bytes) {
    return absl::DataLossError(absl::StrCat(path, ": ", bytes.size(),
                                            " bytes, but the manifest says ", shard.bytes,
                                            " (truncated or overwritten?)"));
  }
  PT_ASSIGN_OR_RETURN(io::FileDigest digest, io::DigestBytes(bytes));
  if (digest.sha256 != shard.sha256) {
    return absl::DataLossError(absl::StrCat(path, ": SHA-256 ", digest.sha256,
                                            " differs from the manifest's ", shard.sha256,
                                            " (file corrupted)"));
  }
  PT_ASSIGN_OR_RETURN(io::SafetensorsFile file, io::ParseSafetensors(bytes, path));
  auto meta = file.metadata.find("step");
  int64_t file_step = 0;
  if (meta == file.metadata.end() || !absl::SimpleAtoi(meta->second, &file_step)) {
    return absl::DataLossError(
        absl::StrCat(path, ": no integer 'step' in the safetensors metadata"));
  }
  if (file_step != step) {
    return absl::DataLossError(
        absl::StrCat(path, ": written at step ", file_step, " but the manifest's step is ", step));
  }
  for (const auto& [name, tensor] : file.tensors) {
    for (size_t i = 0; i < tensor.data.size(); ++i) {
      if (!std::isfinite(tensor.data[i])) {
        return absl::DataLossError(absl::StrCat(path, ": tensor ", name, " holds ",
                                                std::isnan(tensor.data[i]) ? "NaN" : "Inf",
                                                " at element ", i));
      }
    }
  }
  return file;
}

std::string LayerShardFile(int64_t layer) {
  return absl::StrFormat("layer-%05d.safetensors", layer);
}

std::vector<CheckpointShard> LayerShards(const Model& model, int64_t first, int64_t last) {
  std::vector<CheckpointShard> out;
  for (int64_t l = first; l < last; ++l) {
    size_t stored = model.layer(l).params().size();
    // A tied head's weight is stored as the embedding's token table (Stage::ExportState).
    if (model.tie().has_value() && l == model.tie()->head_layer) --stored;
    if (stored == 0) continue;
    CheckpointShard shard;
    shard.file = LayerShardFile(l);
    shard.first_layer = l;
    shard.last_layer = l + 1;
    out.push_back(std::move(shard));
  }
  return out;
}

absl::StatusOr<std::string> BeginCheckpointStaging(const std::string& dir) {
  PT_RETURN_IF_ERROR(io::CheckNoNulByte(dir));
  PT_RETURN_IF_ERROR(CheckCheckpointDestination(dir));
  return io::CreateStagingDirectory(dir);
}

absl::StatusOr<std::string> SerializeCheckpointShard(
    CheckpointShard* shard, const std::map<std::string, math::Tensor>& tensors, int64_t step) {
  PT_RETURN_IF_ERROR(CheckPlainFileName(shard->file));
  // Every tensor whose global layer index is in [first_layer, last_layer).
  std::map<std::string, math::Tensor> part;
  for (int64_t l = shard->first_layer; l < shard->last_layer; ++l) {
    for (const std::string& prefix :
         {absl::StrCat("layers.", l, "."), absl::StrCat("optim.", l, ".")}) {
      for (auto it = tensors.lower_bound(prefix);
           it != tensors.end() && absl::StartsWith(it->first, prefix); ++it) {
        part.insert(*it);
      }
    }
  }
  if (part.empty()) {
    return absl::NotFoundError(absl::StrCat("no tensors for shard ", shard->file, " (layers ",
                                            shard->first_layer, "..", shard->last_layer - 1, ")"));
  }
  PT_ASSIGN_OR_RETURN(
      std::string bytes,
      io::SerializeSafetensors(part, {{"format", kShardFormat}, {"step", absl::StrCat(step)}}));
  PT_ASSIGN_OR_RETURN(io::FileDigest digest, io::DigestBytes(bytes));
  shard->sha256 = std::move(digest.sha256);
  shard->bytes = digest.bytes;
  return bytes;
}

absl::StatusOr<std::vector<CheckpointShard>> WriteCheckpointShards(
    const std::string& dir, const std::vector<CheckpointShard>& shards,
    const std::map<std::string, math::Tensor>& tensors, int64_t step) {
  PT_RETURN_IF_ERROR(io::CheckNoNulByte(dir));
  PT_RETURN_IF_ERROR(CheckDirectoryExists(dir));
  std::vector<CheckpointShard> out = shards;
  for (CheckpointShard& s : out) {
    PT_ASSIGN_OR_RETURN(std::string bytes, SerializeCheckpointShard(&s, tensors, step));
    PT_RETURN_IF_ERROR(io::WriteFileAtomically(io::JoinPath(dir, s.file), bytes));
  }
  return out;
}

absl::StatusOr<std::vector<CheckpointShard>> DigestCheckpointShards(
    const std::string& dir, std::vector<CheckpointShard> shards) {
  PT_RETURN_IF_ERROR(io::CheckNoNulByte(dir));
  for (CheckpointShard& s : shards) {
    PT_RETURN_IF_ERROR(CheckPlainFileName(s.file));
    PT_ASSIGN_OR_RETURN(std::string bytes, io::ReadConfinedFile(dir, s.file));
    PT_ASSIGN_OR_RETURN(io::FileDigest digest, io::DigestBytes(bytes));
    s.sha256 = std::move(digest.sha256);
    s.bytes = digest.bytes;
  }
  return shards;
}

absl::Status WriteCheckpointManifest(const std::string& dir, const CheckpointManifest& manifest) {
  PT_RETURN_IF_ERROR(io::CheckNoNulByte(dir));
  PT_RETURN_IF_ERROR(CheckDirectoryExists(dir));
  const std::string path = io::JoinPath(dir, kManifestName);
  const json j = ManifestToJson(manifest);
  // Write only what would load back.
  PT_RETURN_IF_ERROR(ManifestFromJson(j, path).status());
  return io::WriteFileAtomically(path, j.dump(2) + "\n");
}

std::string FormatCheckpointManifest(const CheckpointManifest& manifest) {
  return ManifestToJson(manifest).dump(2) + "\n";
}

std::string CheckpointHistoryPath(const std::string& dir, int64_t step) {
  std::string base = dir;
  while (base.size() > 1 && base.back() == '/') base.pop_back();
  return absl::StrFormat("%s.step-%012d", base, step);
}

absl::StatusOr<std::vector<std::pair<int64_t, std::string>>> CheckpointHistory(
    const std::string& dir) {
  PT_RETURN_IF_ERROR(io::CheckNoNulByte(dir));
  std::string base = dir;
  while (base.size() > 1 && base.back() == '/') base.pop_back();
  const std::string parent = io::DirName(base);
  const std::string prefix = absl::StrCat(base.substr(base.rfind('/') + 1), ".step-");
  PT_ASSIGN_OR_RETURN(std::vector<std::string> names, io::ListDirectory(parent));
  std::vector<std::pair<int64_t, std::string>> history;
  for (const std::string& name : names) {
    absl::string_view digits = name;
    if (!absl::ConsumePrefix(&digits, prefix) || digits.size() < 12 || digits.size() > 18) {
      continue;
    }
    int64_t step = 0;
    if (!std::all_of(digits.begin(), digits.end(), absl::ascii_isdigit) ||
        !absl::SimpleAtoi(digits, &step)) {
      continue;
    }
    history.emplace_back(step, io::JoinPath(parent, name));
  }
  std::sort(history.begin(), history.end(), std::greater<>());
  return history;
}

absl::Status PublishCheckpoint(const std::string& staging, const std::string& dir,
                               const CheckpointManifest& manifest, int keep) {
  // A staging path with a NUL byte cannot be named to remove it either.
  PT_RETURN_IF_ERROR(io::CheckNoNulByte(staging));
  absl::Status status = io::CheckNoNulByte(dir);
  if (status.ok() && keep < 1) {
    status =
        absl::InvalidArgumentError(absl::StrCat("checkpoints to keep must be >= 1, got ", keep));
  }
  if (status.ok()) status = WriteCheckpointManifest(staging, manifest);
  if (status.ok()) status = VerifyCheckpoint(staging).status();
  if (status.ok()) status = CheckReplaceable(dir);
  std::string keep_old_as;
  if (status.ok() && keep > 1) {
    absl::StatusOr<CheckpointManifest> old = ReadCheckpointManifest(dir);
    if (old.ok() && old->step != manifest.step) keep_old_as = CheckpointHistoryPath(dir, old->step);
  }
  if (status.ok()) status = io::PublishDirectory(staging, dir, keep_old_as);
  // After a successful publish `staging` holds nothing (or the old contents PublishDirectory
  // could not remove); after a failed one, the abandoned new checkpoint.
  DiscardCheckpointStaging(staging).IgnoreError();
  if (status.ok()) {
    // Retention: the newest keep - 1 earlier checkpoints stay.
    absl::StatusOr<std::vector<std::pair<int64_t, std::string>>> history = CheckpointHistory(dir);
    if (history.ok()) {
      for (size_t i = static_cast<size_t>(keep - 1); i < history->size(); ++i) {
        io::RemoveDirectoryAtomically((*history)[i].second).IgnoreError();
      }
    }
  }
  return status;
}

absl::Status DiscardCheckpointStaging(const std::string& staging) {
  PT_RETURN_IF_ERROR(io::CheckNoNulByte(staging));
  return io::RemoveTree(staging);
}

absl::Status SaveCheckpoint(const std::string& dir, const CheckpointManifest& manifest,
                            const std::map<std::string, math::Tensor>& tensors, int keep,
                            absl::string_view tokenizer) {
  PT_RETURN_IF_ERROR(io::CheckNoNulByte(dir));
  PT_ASSIGN_OR_RETURN(const std::string staging, BeginCheckpointStaging(dir));
  absl::StatusOr<std::vector<CheckpointShard>> shards =
      WriteCheckpointShards(staging, manifest.shards, tensors, manifest.step);
  if (!shards.ok()) {
    DiscardCheckpointStaging(staging).IgnoreError();
    return shards.status();
  }
  CheckpointManifest m = manifest;
  m.shards = *std::move(shards);
  m.tokenizer.reset();
  if (!tokenizer.empty()) {
    absl::StatusOr<CheckpointFile> written = WriteCheckpointTokenizer(staging, tokenizer);
    if (!written.ok()) {
      DiscardCheckpointStaging(staging).IgnoreError();
      return written.status();
    }
    m.tokenizer = *std::move(written);
  }
  return PublishCheckpoint(staging, dir, m, keep);
}

absl::StatusOr<CheckpointFile> WriteCheckpointTokenizer(const std::string& dir,
                                                        absl::string_view model) {
  PT_RETURN_IF_ERROR(CheckDirectoryExists(dir));
  PT_RETURN_IF_ERROR(io::WriteFileAtomically(io::JoinPath(dir, kCheckpointTokenizerFile), model));
  PT_ASSIGN_OR_RETURN(io::FileDigest digest, io::DigestBytes(model));
  return CheckpointFile{kCheckpointTokenizerFile, std::move(digest.sha256), digest.bytes};
}

absl::Status CheckCheckpointDestination(const std::string& dir) {
  PT_RETURN_IF_ERROR(io::CheckNoNulByte(dir));
  if (dir.empty()) return absl::InvalidArgumentError("empty checkpoint directory path");
  PT_RETURN_IF_ERROR(io::CheckWritableDirectory(io::DirName(dir)));
  return CheckReplaceable(dir);
}

absl::StatusOr<CheckpointManifest> ReadCheckpointManifest(const std::string& dir) {
  PT_RETURN_IF_ERROR(io::CheckNoNulByte(dir));
  const std::string path = io::JoinPath(dir, kManifestName);
  PT_ASSIGN_OR_RETURN(std::string text,
                      io::ReadConfinedFile(dir, kManifestName, kMaxManifestBytes));
  return ParseCheckpointManifest(text, path);
}

absl::StatusOr<CheckpointManifest> ParseCheckpointManifest(absl::string_view text,
                                                           const std::string& path) {
  const json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::DataLossError(absl::StrCat(path, ": not a JSON object"));
  return ManifestFromJson(j, path);
}

absl::Status CheckOptimizerResumes(const std::string& dir, const CheckpointManifest& manifest,
                                   const math::OptimizerConfig& optimizer) {
  absl::StatusOr<math::OptimizerConfig> saved = math::ParseOptimizerConfig(manifest.optimizer);
  if (!saved.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(dir, ": the manifest's optimizer '",
                                                   manifest.optimizer,
                                                   "' does not parse: ", saved.status().message()));
  }
  if (saved->kind == optimizer.kind) return absl::OkStatus();
  const absl::string_view had = math::OptimizerKindName(saved->kind);
  return absl::FailedPreconditionError(
      absl::StrCat(dir, ": the checkpoint was trained with optimizer ", had, ", this run asks for ",
                   math::OptimizerKindName(optimizer.kind), "; its state tensors are ", had,
                   "'s, so resume with --optimizer ", had,
                   "[:key=value,...] (the hyper-parameters may change, the kind may not)"));
}

absl::StatusOr<LoadedCheckpoint> LoadCheckpoint(const std::string& dir) {
  return ReadCheckpoint(dir, /*keep_tensors=*/true);
}

absl::StatusOr<std::string> ReadCheckpointTokenizer(const std::string& dir) {
  PT_RETURN_IF_ERROR(io::CheckNoNulByte(dir));
  PT_ASSIGN_OR_RETURN(CheckpointManifest manifest, ReadCheckpointManifest(dir));
  if (!manifest.tokenizer.has_value()) return std::string();
  return ReadVerifiedTokenizer(dir, *manifest.tokenizer);
}

absl::StatusOr<CheckpointManifest> VerifyCheckpoint(const std::string& dir) {
  PT_ASSIGN_OR_RETURN(LoadedCheckpoint checkpoint, ReadCheckpoint(dir, /*keep_tensors=*/false));
  return std::move(checkpoint.manifest);
}

}  // namespace pipetrain::model
