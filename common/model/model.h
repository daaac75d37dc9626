// A model: a ModelSpec turned into a validated stack of layers plus a loss.
#ifndef PIPETRAIN_COMMON_MODEL_MODEL_H_
#define PIPETRAIN_COMMON_MODEL_MODEL_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/math/isa.h"
#include "common/math/kernels.h"
#include "common/math/layer.h"
#include "common/math/loss.h"
#include "common/model/tied_embedding.h"
#include "pipetrain/v1/model.pb.h"

namespace pipetrain::model {

// What a data set tells about the shapes a model must have. 0 means unknown.
struct DataShape {
  int64_t input_features = 0;     // features per input row (1 for token ids).
  int64_t target_features = 0;    // features per target row (1 for a class index).
  int64_t num_classes = 0;        // classes (vocabulary size for text), 0 for regression.
  int64_t tokens_per_sample = 0;  // rows per sample (context length for text).
};

// Largest ModelSpec text file LoadModelSpecFile reads (a spec is a few hundred bytes).
inline constexpr int64_t kMaxModelSpecFileBytes = int64_t{16} << 20;  // 16 MiB

// Parses a ModelSpec in protobuf text format. INVALID_ARGUMENT with `source`:line:column and the
// parser's message on a syntax error.
absl::StatusOr<v1::ModelSpec> ParseModelSpecText(absl::string_view text, absl::string_view source);

// Reads and parses a ModelSpec text file. NOT_FOUND if missing; INVALID_ARGUMENT naming the path if
// it is not a regular file (a directory, /dev/zero, a FIFO); RESOURCE_EXHAUSTED naming the path
// and its size if larger than kMaxModelSpecFileBytes (checked before reading).
absl::StatusOr<v1::ModelSpec> LoadModelSpecFile(const std::string& path);

// The default memory budget of ModelLimits: min(16 GiB, half of this machine's physical memory,
// half of the process's RLIMIT_AS and RLIMIT_DATA), each term only when known; computed once.
// Thread-safe.
int64_t DefaultMemoryBudget();

// Memory limits checked before anything is allocated, so that an oversized model is an error, not
// an out-of-memory abort. docs/numerics.md, "Limits".
struct ModelLimits {
  // Most bytes one Stage may hold for its parameters: weights, gradients and optimizer state, 4
  // bytes each. Model::Build refuses a layer whose parameters would need more with the most any
  // optimizer keeps (AdamW: weight, gradient and two moments, 16 bytes per parameter), since a
  // layer cannot be split between stages; Stage::Create refuses a layer range that needs more with
  // its optimizer. Default: DefaultMemoryBudget().
  int64_t max_parameter_bytes = DefaultMemoryBudget();
  // Most bytes of activations one micro-batch may keep in a Stage over all layers from F to the
  // end of W (Model::SampleActivationBytes per sample). Model::Build refuses a model where a
  // single sample needs more; ReferenceTrainer::Step refuses a micro-batch that would.
  // Default: DefaultMemoryBudget().
  int64_t max_activation_bytes = DefaultMemoryBudget();
};

// Returns `spec` with the fields its author left 0 filled from `data` (input_features, the
// embedding's vocab_size, the last linear layer's out_features: the classes for softmax
// cross-entropy, the targets per row for mse), then checks the model against
// the data: INVALID_ARGUMENT naming the mismatch (e.g. "model input_features 64 != data set's 32").
absl::StatusOr<v1::ModelSpec> ResolveModelSpec(const v1::ModelSpec& spec, const DataShape& data);

// An immutable, validated layer stack. Thread-safe for concurrent const use.
class Model {
 public:
  // Builds the layers of `spec`, inferring and checking shapes. Allocates no parameters (a Stage
  // does). INVALID_ARGUMENT naming the layer and the mismatch, e.g. "layer 3 (linear): in_features
  // 128 != 256 (output of layer 2)", or a dimension outside [1, 2^24]; RESOURCE_EXHAUSTED naming
  // the layer and the numbers when a layer's parameters, or one sample's activations, exceed
  // `limits`.
  // The layers and the loss run the math compiled for `isa` (one of math::BuiltIsas(), which
  // this CPU must run: math::CpuSupportsIsa); every process whose results must agree bit for bit
  // builds its model at the same level (docs/performance.md, "Instruction sets").
  static absl::StatusOr<std::unique_ptr<Model>> Build(const v1::ModelSpec& spec,
                                                      const ModelLimits& limits = ModelLimits(),
                                                      math::Isa isa = math::DefaultIsa());

  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  const v1::ModelSpec& spec() const { return spec_; }
  // The instruction-set level the layers and the loss run at, and that level's kernels (whose
  // ConfigureEigen whoever runs the layers calls first).
  math::Isa isa() const { return isa_; }
  const math::Kernels& kernels() const { return math::KernelsFor(isa_); }
  int64_t num_layers() const { return static_cast<int64_t>(layers_.size()); }
  const math::Layer& layer(int64_t index) const { return *layers_[index]; }
  const math::Loss& loss() const { return *loss_; }
  int64_t input_features() const { return layers_.front()->in_features(); }
  int64_t output_features() const { return layers_.back()->out_features(); }
  int64_t target_features() const { return loss_->target_features(output_features()); }
  // Rows per sample: the context length for token models, else 1.
  int64_t tokens_per_sample() const { return tokens_per_sample_; }
  // The tied input/output embedding (ModelSpec.tie_embeddings), nullopt when not tied.
  const std::optional<TiedEmbedding>& tie() const { return tie_; }

  // Per-layer F+B+W FLOPs for a micro-batch of `samples` samples (the partitioner's cost).
  std::vector<double> LayerFlops(int64_t samples) const;
  // Per-layer parameter bytes (float32).
  std::vector<int64_t> LayerParamBytes() const;
  // Total parameter count (a tied table counted once).
  int64_t NumParameters() const;
  // The limits the model was built with (Stage::Create and ReferenceTrainer check against them).
  const ModelLimits& limits() const { return limits_; }
  // Bytes of activations one sample keeps in a Stage over all layers from F to the end of W: every
  // layer's input and input gradient, each layer's stash, the output and its gradient (float32).
  // An estimate: Eigen's temporaries are not counted.
  int64_t SampleActivationBytes() const { return sample_activation_bytes_; }
  // OK if the activations of a micro-batch of `samples` samples (SampleActivationBytes() each)
  // fit limits().max_activation_bytes, else RESOURCE_EXHAUSTED with the numbers. For whoever runs
  // a Stage over all layers (ReferenceTrainer); a stage over fewer layers keeps less.
  absl::Status CheckMicrobatchActivations(int64_t samples) const;

  // Checks a batch of `samples` samples before any compute: inputs are
  // [samples * tokens_per_sample(), input_features()], targets
  // [samples * tokens_per_sample(), target_features()], every input finite, token ids integral
  // and below the vocabulary size (when the first layer is an embedding), targets valid for the
  // loss. INVALID_ARGUMENT naming the offending row and value.
  absl::Status ValidateBatch(math::ConstMatrixMap inputs, math::ConstMatrixMap targets,
                             int64_t samples) const;

 private:
  Model() = default;

  v1::ModelSpec spec_;
  std::vector<std::unique_ptr<math::Layer>> layers_;
  std::unique_ptr<math::Loss> loss_;
  int64_t tokens_per_sample_ = 1;
  std::optional<TiedEmbedding> tie_;
  math::Isa isa_ = math::Isa::kGeneric;
  ModelLimits limits_;
  int64_t sample_activation_bytes_ = 0;
};

// "linear", "relu", ... for a layer spec (its oneof case), "unset" when empty.
std::string LayerKindName(const v1::LayerSpec& spec);

}  // namespace pipetrain::model

#endif  // PIPETRAIN_COMMON_MODEL_MODEL_H_
