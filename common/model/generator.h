// Text generation from a trained language model in one process: the incremental (KV-cache)
// forward of the model's layers, a sliding window beyond the model's context, and the token
// sampler (docs/inference.md). Works on any model whose layers implement
// math::Layer::ForwardIncremental (embedding, transformer blocks, layer norm, linear head, ...),
// so that the CLI, the service and Python share it.
#ifndef PIPETRAIN_COMMON_MODEL_GENERATOR_H_
#define PIPETRAIN_COMMON_MODEL_GENERATOR_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/math/layer.h"
#include "common/math/tensor.h"
#include "common/model/chunk_decoder.h"
#include "common/model/decode_window.h"
#include "common/model/model.h"
#include "common/model/token_sampler.h"

namespace pipetrain::model {

// The parameters of every layer of a model: params[l] holds layer l's tensors in
// Layer::params() order.
using ModelParams = std::vector<std::vector<math::Tensor>>;

// Moves the parameters of every layer of `model` out of `tensors` (a checkpoint's, keyed
// "layers.<l>.<name>" as Stage::ExportState writes them; other entries, e.g. the optimizer's, are
// ignored). A tied head (Model::tie) gets a copy of the embedding's token table. NOT_FOUND naming
// a missing tensor; INVALID_ARGUMENT naming a tensor whose shape is not the layer's.
absl::StatusOr<ModelParams> TakeModelParams(const Model& model,
                                            std::map<std::string, math::Tensor>* tensors);

// OK if `model` is a language model every layer of which has an incremental forward (what
// generation needs), else INVALID_ARGUMENT saying what the model is instead.
absl::Status CheckLanguageModel(const Model& model);

// Most tokens one Generate call produces.
inline constexpr int64_t kMaxGenerateTokens = int64_t{1} << 20;

struct GenerateOptions {
  int64_t max_tokens = 0;  // tokens to generate, in [1, kMaxGenerateTokens].
  SamplingOptions sampling;
};

// Decodes one sequence at a time from a language model: a model whose first layer is an
// embedding, whose loss is softmax cross-entropy over the embedding's vocabulary and whose layers
// all support the incremental forward.
//
// The window (DecodeWindow): the tokens whose keys and values the layers hold, at positions
// 0 .. n-1 (n at most the model's context T). The next token's logits are the last layer's output
// at position n-1. Appending a token to a full window (n == T) slides it: the window becomes its
// last ceil(T/2) - 1 tokens and the new one, which run through the layers again from position 0
// (one forward of ceil(T/2) positions every T - ceil(T/2) + 1 tokens, instead of T positions per
// token). A prompt longer than T keeps its last T tokens. The layers run in one ChunkDecoder over
// all of them, as the service's pipeline runs one per chunk.
//
// Thread-compatible: one thread at a time (the layers' states and scratch are the generator's).
class Generator {
 public:
  // A generator over `model` and `params` (TakeModelParams'), which must outlive it. Pins the
  // GEMM blocking of the model's instruction-set level and sets its Eigen thread count to
  // `threads` (math::Kernels::ConfigureEigen; process-wide). INVALID_ARGUMENT when `model` is not
  // a language model (saying what it is instead), a layer has no incremental forward, or `params`
  // do not fit the layers; FAILED_PRECONDITION if this CPU cannot run model->isa().
  static absl::StatusOr<std::unique_ptr<Generator>> Create(const Model* model,
                                                           const ModelParams* params,
                                                           int threads = 1);

  Generator(const Generator&) = delete;
  Generator& operator=(const Generator&) = delete;

  int64_t vocab_size() const { return vocab_; }
  int64_t context() const { return context_; }

  // Starts a new sequence with `prompt` (token ids, at least one, each in [0, vocab_size()))
  // and computes the logits of the token after it. INVALID_ARGUMENT naming the offending id.
  absl::Status Start(absl::Span<const int64_t> prompt);
  // Appends `token` (in [0, vocab_size())) to the sequence and computes the next logits, sliding
  // the window when it is full. FAILED_PRECONDITION before Start.
  absl::Status Append(int64_t token);

  // The logits of the next token (vocab_size() floats), valid until the next Start or Append.
  absl::Span<const float> logits() const { return logits_; }
  // The tokens the logits condition on, position 0 first.
  const std::vector<int64_t>& window() const { return window_.window(); }
  // How many times the window slid since Start.
  int64_t slides() const { return window_.slides(); }
  // Positions run through the layers since Start (prompt included): the cost of decoding.
  int64_t positions_computed() const { return positions_computed_; }

  // Start(prompt), then options.max_tokens times: pick a token from logits() with a TokenSampler
  // seeded with options.sampling.seed, hand it to `on_token` (when given, e.g. to print it at
  // once), then Append it (not after the last). Returns the tokens generated, without the
  // prompt. INVALID_ARGUMENT for options out of range (max_tokens outside
  // [1, kMaxGenerateTokens], CheckSamplingOptions) or a bad prompt.
  absl::StatusOr<std::vector<int64_t>> Generate(
      absl::Span<const int64_t> prompt, const GenerateOptions& options,
      const std::function<void(int64_t token)>& on_token = nullptr);

 private:
  Generator(const ModelParams* params, std::unique_ptr<ChunkDecoder> decoder, int64_t vocab,
            int64_t context);

  // Runs `run`'s tokens through every layer (forgetting every position first when it restarts)
  // and sets logits_ to the last row's output.
  absl::Status Run(const DecodeRun& run);

  const ModelParams* const params_;
  const int64_t vocab_;
  const int64_t context_;
  std::unique_ptr<ChunkDecoder> decoder_;  // every layer, one sequence.
  math::Matrix input_;                     // [context, 1]: token ids as floats.
  std::vector<float> logits_;
  DecodeWindow window_;
  int64_t positions_computed_ = 0;
};

}  // namespace pipetrain::model

#endif  // PIPETRAIN_COMMON_MODEL_GENERATOR_H_
