// Export of a pipetrain checkpoint to the Hugging Face layout (transformers' `save_pretrained`
// directory: model.safetensors with the transformers tensor names and a config.json), and import
// of such a directory back into a pipetrain checkpoint. docs/checkpoints.md, "Export and import".
//
// What maps is decided per architecture (HfArchitecture): which ModelSpecs it accepts, its
// config.json, and one table giving each pipetrain parameter its Hugging Face name and layout.
// GPT-2 is the one architecture today (common/model/hf_gpt2.h); another is one more table and an
// entry in HfArchitectures().
//
// An export directory holds:
//   model.safetensors                the weights under the transformers names (F32)
//   config.json                      the architecture's configuration (e.g. a GPT2Config)
//   vocab.json                       the character -> token id map, when the caller gives one
//   pipetrain_manifest.json          the checkpoint's manifest.json, byte for byte
//   pipetrain_optimizer.safetensors  the optimizer state (optim.* tensors), if there is any
// The two pipetrain_* files (the "sidecar") hold what Hugging Face has no place for -- the step,
// optimizer and its state, seed, data set, data cursor, the ModelSpec text -- so that importing
// the export gives back the checkpoint byte for byte. Without them an import starts a fresh run
// from the weights: step 0, the default optimizer with zero state, seed 0, no data set.
//
// All functions are thread-safe (they share no state).
#ifndef PIPETRAIN_COMMON_MODEL_HF_CHECKPOINT_H_
#define PIPETRAIN_COMMON_MODEL_HF_CHECKPOINT_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/math/tensor.h"
#include "common/model/checkpoint.h"
#include "common/model/model.h"
#include "pipetrain/v1/model.pb.h"

namespace pipetrain::model {

inline constexpr char kHfWeightsFile[] = "model.safetensors";
inline constexpr char kHfConfigFile[] = "config.json";
inline constexpr char kHfVocabFile[] = "vocab.json";
inline constexpr char kHfSidecarManifestFile[] = "pipetrain_manifest.json";
inline constexpr char kHfSidecarOptimizerFile[] = "pipetrain_optimizer.safetensors";

// One parameter's name in both worlds.
struct HfTensorName {
  std::string pipetrain;   // checkpoint name, e.g. "layers.1.attn.qkv.weight".
  std::string hf;          // transformers name, e.g. "transformer.h.0.attn.c_attn.weight".
  bool transpose = false;  // a matrix stored transposed ([in, out], GPT-2's Conv1D).
};

// What a config.json says, as pipetrain understands it.
struct HfConfig {
  v1::ModelSpec spec;  // the model it describes.
  // Tensors a directory may leave out because they equal another one (tied weights): an import
  // missing the key reads the value's tensor instead (GPT-2 with tie_word_embeddings:
  // lm_head.weight
  // -> transformer.wte.weight).
  std::map<std::string, std::string> aliases;
};

// How one Hugging Face architecture maps to pipetrain models.
struct HfArchitecture {
  // config.json's "model_type", e.g. "gpt2"; also the name messages use.
  const char* model_type;
  // OK if `model` (built from its spec) has exactly this architecture's layers and numerics;
  // otherwise INVALID_ARGUMENT naming the first layer or setting that has no equivalent (e.g.
  // "layer 4 (linear): has a bias, but GPT-2's lm_head has none").
  absl::Status (*check)(const Model& model);
  // The config.json text for `model`; the check's error if it fails.
  absl::StatusOr<std::string> (*config)(const Model& model);
  // The sizes the config records, e.g. "vocab_size 65, n_positions 32, n_embd 64, n_layer 2,
  // n_head 4, n_inner 256": two models with the same description have the same config.json and
  // tensor shapes. The check's error if it fails.
  absl::StatusOr<std::string> (*describe)(const Model& model);
  // What the config.json text `config` describes. INVALID_ARGUMENT starting with `path` and naming
  // the field for a missing or mistyped field or a setting pipetrain lacks (e.g. another
  // activation function).
  absl::StatusOr<HfConfig> (*parse_config)(absl::string_view config, const std::string& path);
  // Every parameter of `model` (check passed) with its Hugging Face name, in model order.
  std::vector<HfTensorName> (*tensor_names)(const Model& model);
  // Hugging Face tensors an import may find and ignores (non-parameter buffers such as GPT-2's
  // causal mask "….attn.bias"): true if `hf_name` is one.
  bool (*ignored)(absl::string_view hf_name);
};

// Every architecture pipetrain exports and imports.
const std::vector<const HfArchitecture*>& HfArchitectures();

// The architecture `model` has: the first of HfArchitectures() whose check passes.
// INVALID_ARGUMENT otherwise, with each architecture's reason.
absl::StatusOr<const HfArchitecture*> HfArchitectureOf(const Model& model);

// The Hugging Face tensors of `tensors` (a checkpoint's, global names) for `model`: every
// parameter renamed and, where the table says so, transposed. Errors: the architecture's refusal
// (INVALID_ARGUMENT); NOT_FOUND naming a parameter missing from `tensors`; INVALID_ARGUMENT
// naming a tensor whose shape is not the model's.
absl::StatusOr<std::map<std::string, math::Tensor>> ToHfTensors(
    const Model& model, const std::map<std::string, math::Tensor>& tensors);

// The inverse: the checkpoint's "layers.*" tensors of `model` from Hugging Face tensors, a missing
// one read from its alias if `aliases` names one (HfConfig::aliases).
// `source` names them in messages (a file). Errors: NOT_FOUND naming a missing tensor;
// INVALID_ARGUMENT naming a tensor of the wrong shape (both shapes), one holding NaN or Inf, or
// one the architecture does not know (and does not ignore).
absl::StatusOr<std::map<std::string, math::Tensor>> FromHfTensors(
    const Model& model, const std::map<std::string, math::Tensor>& hf, const std::string& source,
    const std::map<std::string, std::string>& aliases = {});

// Writes the export of `checkpoint` into `dir` (layout above), replacing it as a whole
// (io::PublishDirectory: a crash leaves the old or the new export). `vocabulary`: the token of
// each id (the i-th byte is token i, io::DatasetInfo::vocabulary), written as vocab.json; empty:
// no vocab.json. Errors: ToHfTensors's; INVALID_ARGUMENT if `vocabulary` has more tokens than the
// model's vocabulary; FAILED_PRECONDITION if `dir` exists and holds anything but the files an
// export writes (so that a mistyped DIR cannot delete a directory); I/O errors naming the path.
absl::Status ExportHfCheckpoint(const LoadedCheckpoint& checkpoint, absl::string_view vocabulary,
                                const std::string& dir);

struct ImportedHfCheckpoint {
  CheckpointManifest manifest;  // shards planned (file and layers), digests not filled.
  std::map<std::string, math::Tensor> tensors;  // every tensor a checkpoint of it holds.
  bool exact = false;  // true: from an export's sidecar (the original checkpoint's state).
  const HfArchitecture* architecture = nullptr;
};

// Reads the Hugging Face directory `dir` (config.json, model.safetensors and, if present, the
// sidecar) into the state of a checkpoint; SaveCheckpoint(dest, result.manifest, result.tensors)
// then writes it (byte-identical to the exported checkpoint when the sidecar is there and the
// weights are unchanged). Errors, each naming the file: NOT_FOUND for a missing config.json or
// model.safetensors or a missing tensor; INVALID_ARGUMENT for an unknown model_type, a config
// setting pipetrain lacks, a tensor of the wrong shape, dtype (the safetensors reader converts
// F16/BF16/F64 and refuses the others) or values, an unknown tensor, or a sidecar whose model is
// not the one config.json describes (both described); the sidecar's own errors (its manifest as
// ReadCheckpointManifest; a missing or extra optimizer tensor).
absl::StatusOr<ImportedHfCheckpoint> ImportHfCheckpoint(const std::string& dir);

}  // namespace pipetrain::model

#endif  // PIPETRAIN_COMMON_MODEL_HF_CHECKPOINT_H_
