#include "common/model/hf_config.h"

#include "absl/strings/str_cat.h"

namespace pipetrain::model {

using json = nlohmann::json;

absl::Status HfConfigError(const std::string& path, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", what));
}

absl::StatusOr<int64_t> HfPositiveInt(const json& j, const char* key, const std::string& path,
                                      int64_t fallback) {
  auto it = j.find(key);
  if ((it == j.end() || it->is_null()) && fallback >= 0) return fallback;
  if (it == j.end() || !it->is_number_integer() || it->get<int64_t>() <= 0) {
    return HfConfigError(path, absl::StrCat("'", key, "' missing or not a positive integer"));
  }
  return it->get<int64_t>();
}

absl::Status HfExpect(const json& j, const char* key, const json& fallback, const json& want,
                      const std::string& path, absl::string_view why) {
  const json value = j.contains(key) ? j[key] : fallback;
  if (value == want) return absl::OkStatus();
  return HfConfigError(path, absl::StrCat("'", key, "' is ", value.dump(), "; pipetrain needs ",
                                          want.dump(), " (", why, ")"));
}

absl::Status HfCheckTieFlag(const json& j, const std::string& path) {
  auto it = j.find("tie_word_embeddings");
  if (it != j.end() && !it->is_boolean()) {
    return HfConfigError(path, "'tie_word_embeddings' is not a boolean");
  }
  return absl::OkStatus();
}

void SetHfCommonKeys(const Model& model, json* j) {
  (*j)["tie_word_embeddings"] = model.tie().has_value();
  (*j)["initializer_range"] = 0.02;
  (*j)["bos_token_id"] = nullptr;
  (*j)["eos_token_id"] = nullptr;
  (*j)["torch_dtype"] = "float32";
  (*j)["use_cache"] = true;
}

}  // namespace pipetrain::model
