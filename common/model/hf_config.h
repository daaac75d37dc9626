// What the Hugging Face architectures (hf_gpt2, hf_llama) share in reading and writing a
// config.json: the error form, typed field readers and the keys every export writes the same way.
#ifndef PIPETRAIN_COMMON_MODEL_HF_CONFIG_H_
#define PIPETRAIN_COMMON_MODEL_HF_CONFIG_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/model/model.h"
#include "nlohmann/json.hpp"

namespace pipetrain::model {

// INVALID_ARGUMENT "<path>: <what>", the error of every config a reader refuses.
absl::Status HfConfigError(const std::string& path, absl::string_view what);

// Field `key` of `j`, a positive integer; `fallback` (when >= 0) if the key is missing or null.
// HfConfigError naming the key otherwise.
absl::StatusOr<int64_t> HfPositiveInt(const nlohmann::json& j, const char* key,
                                      const std::string& path, int64_t fallback = -1);

// OK if `key` equals `want`, or is missing and the config class's default `fallback` does;
// HfConfigError naming the key, its value, what pipetrain needs and `why` otherwise.
absl::Status HfExpect(const nlohmann::json& j, const char* key, const nlohmann::json& fallback,
                      const nlohmann::json& want, const std::string& path, absl::string_view why);

// OK if tie_word_embeddings is missing or a boolean.
absl::Status HfCheckTieFlag(const nlohmann::json& j, const std::string& path);

// Sets the keys every export writes alike: tie_word_embeddings (whether `model` ties its head to
// its embedding: then the export has no lm_head.weight), initializer_range, bos/eos token ids
// (null: the config classes' defaults would name tokens of a character vocabulary), torch_dtype
// (float32) and use_cache.
void SetHfCommonKeys(const Model& model, nlohmann::json* j);

}  // namespace pipetrain::model

#endif  // PIPETRAIN_COMMON_MODEL_HF_CONFIG_H_
