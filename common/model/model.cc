#include "common/model/model.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/io/input_file.h"
#include "common/util/checked_math.h"
#include "common/util/status_macros.h"
#include "google/protobuf/io/tokenizer.h"
#include "google/protobuf/text_format.h"

namespace pipetrain::model {
namespace {

// Largest feature count / context / vocabulary a spec may ask for; larger values are rejected
// before any allocation is attempted.
constexpr int64_t kMaxDim = int64_t{1} << 24;
// Bytes a Stage keeps per parameter with the hungriest optimizer (AdamW): the float32 weight, its
// gradient and two moments.
constexpr int64_t kMaxTrainingBytesPerParameter = 4 * static_cast<int64_t>(sizeof(float));
// DefaultMemoryBudget's upper bound.
constexpr int64_t kMaxDefaultMemoryBudget = int64_t{16} << 30;

class CollectingErrors : public google::protobuf::io::ErrorCollector {
 public:
  explicit CollectingErrors(absl::string_view source) : source_(source) {}
  void AddError(int line, int column, const std::string& message) override {
    if (first_.empty())
      first_ = absl::StrCat(source_, ":", line + 1, ":", column + 1, ": ", message);
  }
  void AddWarning(int, int, const std::string&) override {}
  const std::string& first() const { return first_; }

 private:
  std::string source_;
  std::string first_;
};

absl::Status LayerError(int64_t index, const v1::LayerSpec& spec, absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat("layer ", index, " (", LayerKindName(spec), "): ", what));
}

absl::Status CheckDim(int64_t index, const v1::LayerSpec& spec, absl::string_view name,
                      int64_t value) {
  if (value <= 0 || value > kMaxDim) {
    return LayerError(index, spec,
                      absl::StrCat(name, " ", value, " must be in [1, ", kMaxDim, "]"));
  }
  return absl::OkStatus();
}

// Where `features` comes from, for messages.
std::string Origin(int64_t index) {
  return index == 0 ? std::string("model input_features")
                    : absl::StrCat("output of layer ", index - 1);
}

// Checks that layer `index`'s parameters fit a Stage under `limits` with any optimizer.
// INVALID_ARGUMENT if their count overflows int64; RESOURCE_EXHAUSTED naming the numbers.
absl::Status CheckLayerParameters(int64_t index, const v1::LayerSpec& spec,
                                  const math::Layer& layer, const ModelLimits& limits) {
  const std::vector<math::ParamSpec> params = layer.params();
  if (params.empty()) return absl::OkStatus();
  std::optional<int64_t> count = 0;
  const math::ParamSpec* largest = nullptr;
  int64_t largest_count = 0;
  for (const math::ParamSpec& p : params) {
    std::optional<int64_t> n = 1;
    for (int64_t d : p.shape) n = n.has_value() ? util::CheckedMul(*n, d) : n;
    if (!n.has_value()) {
      return LayerError(
          index, spec,
          absl::StrCat("parameter ", p.name, " of shape [", absl::StrJoin(p.shape, ", "),
                       "] has more than 2^63 elements"));
    }
    count = count.has_value() ? util::CheckedAdd(*count, *n) : count;
    if (largest == nullptr || *n > largest_count) {
      largest = &p;
      largest_count = *n;
    }
  }
  const std::optional<int64_t> bytes =
      count.has_value() ? util::CheckedMul(*count, kMaxTrainingBytesPerParameter) : count;
  if (!bytes.has_value() || *bytes > limits.max_parameter_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "layer ", index, " (", LayerKindName(spec), "): ", util::CheckedToString(count),
        " parameters (largest: ", largest->name, " [", absl::StrJoin(largest->shape, ", "),
        "]) need ", util::CheckedToString(bytes), " bytes to train (",
        kMaxTrainingBytesPerParameter,
        " per parameter: weight, gradient and two AdamW moments), more than the limit of ",
        limits.max_parameter_bytes, " bytes (ModelLimits::max_parameter_bytes)"));
  }
  return absl::OkStatus();
}

// Returns the activation bytes of one sample of `tokens` rows (Model::SampleActivationBytes) of
// `layers`, whose output has `out_features` features. RESOURCE_EXHAUSTED if more than
// limits.max_activation_bytes. Layers' StashBytes must not overflow for `tokens` rows (the
// transformer's attention is checked when it is built).
absl::StatusOr<int64_t> CheckSampleActivations(
    const std::vector<std::unique_ptr<math::Layer>>& layers, int64_t out_features, int64_t tokens,
    const ModelLimits& limits) {
  constexpr int64_t kFloat = sizeof(float);
  // Each layer's input and its gradient, and its stash; then the output and its gradient.
  std::optional<int64_t> total = util::CheckedProduct({2, out_features, tokens, kFloat});
  size_t largest = 0;
  int64_t largest_bytes = 0;
  for (size_t l = 0; l < layers.size(); ++l) {
    const std::optional<int64_t> io =
        util::CheckedProduct({2, layers[l]->in_features(), tokens, kFloat});
    // A layer's bytes that overflow count as the largest possible.
    const int64_t bytes = io.has_value() ? util::CheckedAdd(*io, layers[l]->StashBytes(tokens))
                                               .value_or(std::numeric_limits<int64_t>::max())
                                         : std::numeric_limits<int64_t>::max();
    if (bytes > largest_bytes) {
      largest = l;
      largest_bytes = bytes;
    }
    total = total.has_value() ? util::CheckedAdd(*total, bytes) : std::nullopt;
  }
  if (!total.has_value() || *total > limits.max_activation_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "one sample (", tokens, tokens == 1 ? " row" : " rows", ") needs ",
        util::CheckedToString(total), " bytes of activations (largest: layer ", largest, " (",
        layers[largest]->kind(), "), ", largest_bytes, " bytes), more than the limit of ",
        limits.max_activation_bytes, " bytes (ModelLimits::max_activation_bytes)"));
  }
  return *total;
}

// The context of a token layer (transformer_block, llama_block) whose spec says `spec_context`
// (0: the embedding's), given the context so far (`context`, 0 before an embedding).
absl::StatusOr<int64_t> ResolveContext(int64_t index, const v1::LayerSpec& spec,
                                       int64_t spec_context, int64_t context) {
  const int64_t ctx = spec_context == 0 ? context : spec_context;
  if (ctx == 0) {
    return LayerError(index, spec, "needs a context: set context or put an embedding before it");
  }
  if (context != 0 && ctx != context) {
    return LayerError(index, spec,
                      absl::StrCat("context ", ctx, " != embedding context ", context));
  }
  PT_RETURN_IF_ERROR(CheckDim(index, spec, "context", ctx));
  return ctx;
}

// RESOURCE_EXHAUSTED unless the attention scores of one sample (heads x context^2 floats) fit
// limits.max_activation_bytes: the only activation that grows faster than linearly, checked
// before anything multiplies it further.
absl::Status CheckAttentionScores(int64_t index, const v1::LayerSpec& spec, int64_t heads,
                                  int64_t ctx, const ModelLimits& limits) {
  const std::optional<int64_t> attention =
      util::CheckedProduct({heads, ctx, ctx, static_cast<int64_t>(sizeof(float))});
  if (attention.has_value() && *attention <= limits.max_activation_bytes) {
    return absl::OkStatus();
  }
  return absl::ResourceExhaustedError(absl::StrCat(
      "layer ", index, " (", LayerKindName(spec), "): the attention scores of one sample (heads ",
      heads, " x context ", ctx, "^2 floats) take ", util::CheckedToString(attention),
      " bytes, more than the limit of ", limits.max_activation_bytes,
      " bytes (ModelLimits::max_activation_bytes)"));
}

absl::StatusOr<std::unique_ptr<math::Layer>> BuildRmsNorm(int64_t index, const v1::LayerSpec& ls,
                                                          int64_t features,
                                                          const math::Kernels& kernels) {
  const v1::RmsNormSpec& s = ls.rms_norm();
  if (s.features() != 0 && s.features() != features) {
    return LayerError(
        index, ls,
        absl::StrCat("features ", s.features(), " != ", features, " (", Origin(index), ")"));
  }
  if (!(s.eps() >= 0) || !std::isfinite(s.eps())) {
    return LayerError(index, ls, absl::StrCat("eps ", s.eps(), " must be finite and >= 0"));
  }
  return kernels.MakeRmsNorm(features, s.eps() == 0 ? 1e-5f : s.eps());
}

// The SwiGLU hidden width of `s` (LLaMA's rule when s.hidden() is 0), checked.
absl::StatusOr<int64_t> LlamaHidden(int64_t index, const v1::LayerSpec& ls, int64_t dim) {
  const v1::LlamaBlockSpec& s = ls.llama_block();
  if (s.hidden() != 0) {
    PT_RETURN_IF_ERROR(CheckDim(index, ls, "hidden", s.hidden()));
    return s.hidden();
  }
  const int64_t multiple_of = s.multiple_of() == 0 ? 256 : s.multiple_of();
  PT_RETURN_IF_ERROR(CheckDim(index, ls, "multiple_of", multiple_of));
  const int64_t base = 8 * dim / 3;  // dim <= 2^24: no overflow.
  const int64_t hidden = multiple_of * ((base + multiple_of - 1) / multiple_of);
  PT_RETURN_IF_ERROR(CheckDim(index, ls, "hidden (from dim and multiple_of)", hidden));
  return hidden;
}

// The block's heads, kv_heads, rope_theta and norm_eps with defaults applied, checked.
absl::Status ResolveLlamaHeadsAndScalars(int64_t index, const v1::LayerSpec& ls,
                                         math::LlamaBlockConfig* c) {
  const v1::LlamaBlockSpec& s = ls.llama_block();
  PT_RETURN_IF_ERROR(CheckDim(index, ls, "heads", s.heads()));
  if (c->dim % s.heads() != 0) {
    return LayerError(index, ls, absl::StrCat("heads ", s.heads(), " must divide dim ", c->dim));
  }
  if ((c->dim / s.heads()) % 2 != 0) {
    return LayerError(index, ls,
                      absl::StrCat("head width dim / heads = ", c->dim / s.heads(),
                                   " must be even (rotary embeddings rotate feature pairs)"));
  }
  const int64_t kv_heads = s.kv_heads() == 0 ? s.heads() : s.kv_heads();
  PT_RETURN_IF_ERROR(CheckDim(index, ls, "kv_heads", kv_heads));
  if (s.heads() % kv_heads != 0) {
    return LayerError(index, ls,
                      absl::StrCat("kv_heads ", kv_heads, " must divide heads ", s.heads()));
  }
  const double theta = s.rope_theta() == 0 ? 10000.0 : s.rope_theta();
  if (!(theta > 1) || !std::isfinite(theta)) {
    return LayerError(index, ls, absl::StrCat("rope_theta ", theta, " must be finite and > 1"));
  }
  if (!(s.norm_eps() >= 0) || !std::isfinite(s.norm_eps())) {
    return LayerError(index, ls,
                      absl::StrCat("norm_eps ", s.norm_eps(), " must be finite and >= 0"));
  }
  c->heads = s.heads();
  c->kv_heads = kv_heads;
  c->rope_theta = theta;
  c->norm_eps = s.norm_eps() == 0 ? 1e-5f : s.norm_eps();
  return absl::OkStatus();
}

// Builds a llama_block from `ls`; `*context` is the model's context so far and becomes the
// block's.
absl::StatusOr<std::unique_ptr<math::Layer>> BuildLlamaBlock(int64_t index, const v1::LayerSpec& ls,
                                                             int64_t features, int64_t* context,
                                                             const ModelLimits& limits,
                                                             const math::Kernels& kernels) {
  const v1::LlamaBlockSpec& s = ls.llama_block();
  math::LlamaBlockConfig c;
  c.dim = s.dim() == 0 ? features : s.dim();
  if (c.dim != features) {
    return LayerError(index, ls,
                      absl::StrCat("dim ", c.dim, " != ", features, " (", Origin(index), ")"));
  }
  PT_RETURN_IF_ERROR(ResolveLlamaHeadsAndScalars(index, ls, &c));
  PT_ASSIGN_OR_RETURN(c.context, ResolveContext(index, ls, s.context(), *context));
  PT_ASSIGN_OR_RETURN(c.hidden, LlamaHidden(index, ls, c.dim));
  PT_RETURN_IF_ERROR(CheckAttentionScores(index, ls, c.heads, c.context, limits));
  *context = c.context;
  return kernels.MakeLlamaBlock(c);
}

// The refusal of a model whose input width is not the data's (`spec` as its author wrote it),
// saying what would fit: a token model (first layer an embedding) wants text, text wants a token
// model, else the width.
absl::Status InputMismatch(const v1::ModelSpec& spec, const DataShape& data) {
  if (spec.layers(0).has_embedding()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the model takes token ids (its first layer is an embedding) and the data set has ",
        data.input_features, " features per row: train it on text, or use a model of ",
        data.input_features, " input features (e.g. examples/mlp_digits.textproto)"));
  }
  std::string message = absl::StrCat("model input_features ", spec.input_features(),
                                     " != data set's ", data.input_features, ": ");
  if (data.input_features == 1 && data.tokens_per_sample > 1) {
    absl::StrAppend(&message, "the data is text, token ids (", data.tokens_per_sample,
                    " per sample), which need a model whose first layer is an embedding (e.g. "
                    "examples/gpt_char.textproto)");
  } else {
    absl::StrAppend(&message, "set the model's input_features to ", data.input_features,
                    ", or to 0 to take the data set's");
  }
  return absl::InvalidArgumentError(message);
}

using LayerOrStatus = absl::StatusOr<std::unique_ptr<math::Layer>>;

LayerOrStatus BuildLinear(int64_t i, const v1::LayerSpec& ls, int64_t features,
                          const math::Kernels& kernels) {
  const v1::LinearSpec& s = ls.linear();
  const int64_t in = s.in_features() == 0 ? features : s.in_features();
  if (in != features) {
    return LayerError(i, ls,
                      absl::StrCat("in_features ", in, " != ", features, " (", Origin(i), ")"));
  }
  PT_RETURN_IF_ERROR(CheckDim(i, ls, "out_features", s.out_features()));
  return kernels.MakeLinear(in, s.out_features(), !s.no_bias());
}

LayerOrStatus BuildLayerNorm(int64_t i, const v1::LayerSpec& ls, int64_t features,
                             const math::Kernels& kernels) {
  const v1::LayerNormSpec& s = ls.layer_norm();
  if (s.features() != 0 && s.features() != features) {
    return LayerError(
        i, ls, absl::StrCat("features ", s.features(), " != ", features, " (", Origin(i), ")"));
  }
  if (!(s.eps() >= 0)) return LayerError(i, ls, absl::StrCat("eps ", s.eps(), " must be >= 0"));
  return kernels.MakeLayerNorm(features, s.eps() == 0 ? 1e-5f : s.eps());
}

// An embedding; sets *context to its context (a model has one embedding at most).
LayerOrStatus BuildEmbedding(int64_t i, const v1::LayerSpec& ls, int64_t features, int64_t* context,
                             const math::Kernels& kernels) {
  const v1::EmbeddingSpec& s = ls.embedding();
  if (features != 1) {
    return LayerError(i, ls,
                      absl::StrCat("takes one token id per row, but its input has ", features,
                                   " features (", Origin(i), ")"));
  }
  if (*context != 0) return LayerError(i, ls, "a model may have only one embedding");
  PT_RETURN_IF_ERROR(CheckDim(i, ls, "vocab_size", s.vocab_size()));
  PT_RETURN_IF_ERROR(CheckDim(i, ls, "dim", s.dim()));
  PT_RETURN_IF_ERROR(CheckDim(i, ls, "context", s.context()));
  if (!v1::EmbeddingSpec::Positions_IsValid(s.positions())) {
    return LayerError(i, ls,
                      absl::StrCat("positions ", s.positions(), " is not LEARNED (0) or NONE (1)"));
  }
  *context = s.context();
  return kernels.MakeEmbedding(s.vocab_size(), s.dim(), s.context(),
                               s.positions() == v1::EmbeddingSpec::LEARNED);
}

// A GPT block; its context is the embedding's (*context) or its own, which becomes *context.
LayerOrStatus BuildTransformerBlock(int64_t i, const v1::LayerSpec& ls, int64_t features,
                                    int64_t* context, const ModelLimits& limits,
                                    const math::Kernels& kernels) {
  const v1::TransformerBlockSpec& s = ls.transformer_block();
  const int64_t dim = s.dim() == 0 ? features : s.dim();
  if (dim != features) {
    return LayerError(i, ls, absl::StrCat("dim ", dim, " != ", features, " (", Origin(i), ")"));
  }
  PT_RETURN_IF_ERROR(CheckDim(i, ls, "heads", s.heads()));
  if (dim % s.heads() != 0) {
    return LayerError(i, ls, absl::StrCat("heads ", s.heads(), " must divide dim ", dim));
  }
  PT_ASSIGN_OR_RETURN(const int64_t ctx, ResolveContext(i, ls, s.context(), *context));
  const int64_t ratio = s.mlp_ratio() == 0 ? 4 : s.mlp_ratio();
  if (ratio < 0 || ratio > 64) {
    return LayerError(i, ls, absl::StrCat("mlp_ratio ", ratio, " must be in [1, 64]"));
  }
  PT_RETURN_IF_ERROR(CheckAttentionScores(i, ls, s.heads(), ctx, limits));
  *context = ctx;
  return kernels.MakeTransformerBlock(dim, s.heads(), ctx, ratio);
}

// Layer `i` of a model whose layers before it output `features` per row; *context is the
// tokens per sample set so far (0: none), updated by an embedding or a block.
LayerOrStatus BuildLayer(int64_t i, const v1::LayerSpec& ls, int64_t features, int64_t* context,
                         const ModelLimits& limits, const math::Kernels& kernels) {
  switch (ls.kind_case()) {
    case v1::LayerSpec::kLinear:
      return BuildLinear(i, ls, features, kernels);
    case v1::LayerSpec::kRelu:
      return kernels.MakeRelu(features);
    case v1::LayerSpec::kGelu:
      return kernels.MakeGelu(features);
    case v1::LayerSpec::kLayerNorm:
      return BuildLayerNorm(i, ls, features, kernels);
    case v1::LayerSpec::kEmbedding:
      return BuildEmbedding(i, ls, features, context, kernels);
    case v1::LayerSpec::kTransformerBlock:
      return BuildTransformerBlock(i, ls, features, context, limits, kernels);
    case v1::LayerSpec::kRmsNorm:
      return BuildRmsNorm(i, ls, features, kernels);
    case v1::LayerSpec::kLlamaBlock:
      return BuildLlamaBlock(i, ls, features, context, limits, kernels);
    case v1::LayerSpec::KIND_NOT_SET:
      break;
  }
  return LayerError(i, ls,
                    "no layer kind set (expected one of linear, relu, gelu, layer_norm, rms_norm, "
                    "embedding, transformer_block, llama_block)");
}

// The loss of a model whose last layer outputs `features` per row.
absl::StatusOr<std::unique_ptr<math::Loss>> BuildLoss(const v1::ModelSpec& spec, int64_t features,
                                                      const math::Kernels& kernels) {
  switch (spec.loss().kind_case()) {
    case v1::LossSpec::kSoftmaxCrossEntropy:
      if (features < 2) {
        return absl::InvalidArgumentError(absl::StrCat(
            "softmax_cross_entropy needs at least 2 classes, but the last layer outputs ",
            features));
      }
      return kernels.MakeSoftmaxCrossEntropy();
    case v1::LossSpec::kMse:
      return kernels.MakeMse();
    case v1::LossSpec::KIND_NOT_SET:
      break;
  }
  return absl::InvalidArgumentError(
      "model has no loss (set loss { softmax_cross_entropy {} } or loss { mse {} })");
}

}  // namespace

std::string LayerKindName(const v1::LayerSpec& spec) {
  switch (spec.kind_case()) {
    case v1::LayerSpec::kLinear:
      return "linear";
    case v1::LayerSpec::kRelu:
      return "relu";
    case v1::LayerSpec::kGelu:
      return "gelu";
    case v1::LayerSpec::kLayerNorm:
      return "layer_norm";
    case v1::LayerSpec::kEmbedding:
      return "embedding";
    case v1::LayerSpec::kTransformerBlock:
      return "transformer_block";
    case v1::LayerSpec::kRmsNorm:
      return "rms_norm";
    case v1::LayerSpec::kLlamaBlock:
      return "llama_block";
    case v1::LayerSpec::KIND_NOT_SET:
      break;
  }
  return "unset";
}

absl::StatusOr<v1::ModelSpec> ParseModelSpecText(absl::string_view text, absl::string_view source) {
  v1::ModelSpec spec;
  google::protobuf::TextFormat::Parser parser;
  CollectingErrors errors(source);
  parser.RecordErrorsTo(&errors);
  if (!parser.ParseFromString(std::string(text), &spec)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "invalid model spec: ", errors.first().empty() ? std::string(source) : errors.first()));
  }
  return spec;
}

absl::StatusOr<v1::ModelSpec> LoadModelSpecFile(const std::string& path) {
  PT_ASSIGN_OR_RETURN(std::string text,
                      io::ReadInputFile("model spec file", path, kMaxModelSpecFileBytes,
                                        io::InputCompression::kNone));
  return ParseModelSpecText(text, path);
}

int64_t DefaultMemoryBudget() {
  static const int64_t budget = [] {
    int64_t memory = std::numeric_limits<int64_t>::max();
    const long pages = ::sysconf(_SC_PHYS_PAGES);
    const long page_size = ::sysconf(_SC_PAGESIZE);
    if (pages > 0 && page_size > 0) {
      memory = util::CheckedMul(pages, page_size).value_or(memory);
    }
    // A process limited by `ulimit -v` / `ulimit -d` gets bad_alloc beyond it.
    for (int resource : {RLIMIT_AS, RLIMIT_DATA}) {
      struct rlimit limit;
      if (::getrlimit(resource, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY &&
          limit.rlim_cur < static_cast<rlim_t>(memory)) {
        memory = static_cast<int64_t>(limit.rlim_cur);
      }
    }
    return std::min(kMaxDefaultMemoryBudget, memory / 2);
  }();
  return budget;
}

absl::StatusOr<v1::ModelSpec> ResolveModelSpec(const v1::ModelSpec& spec, const DataShape& data) {
  v1::ModelSpec out = spec;
  if (out.layers_size() == 0) return absl::InvalidArgumentError("model has no layers");
  if (out.input_features() == 0) out.set_input_features(data.input_features);
  // A token model reads one id per row, whatever its input_features says.
  if (data.input_features > 0 && (out.input_features() != data.input_features ||
                                  (out.layers(0).has_embedding() && data.input_features != 1))) {
    return InputMismatch(spec, data);
  }
  for (v1::LayerSpec& layer : *out.mutable_layers()) {
    if (layer.has_embedding()) {
      v1::EmbeddingSpec* e = layer.mutable_embedding();
      if (e->vocab_size() == 0) e->set_vocab_size(data.num_classes);
      if (data.num_classes > 0 && e->vocab_size() < data.num_classes) {
        return absl::InvalidArgumentError(absl::StrCat("embedding vocab_size ", e->vocab_size(),
                                                       " < data set's vocabulary of ",
                                                       data.num_classes));
      }
      if (data.tokens_per_sample > 0 && e->context() != data.tokens_per_sample) {
        return absl::InvalidArgumentError(absl::StrCat("embedding context ", e->context(),
                                                       " != data set's tokens per sample ",
                                                       data.tokens_per_sample));
      }
    }
  }
  v1::LayerSpec* last = out.mutable_layers(out.layers_size() - 1);
  if (last->has_linear() && last->linear().out_features() == 0 &&
      out.loss().has_softmax_cross_entropy()) {
    last->mutable_linear()->set_out_features(data.num_classes);
  }
  // Regression: one output per target.
  if (last->has_linear() && last->linear().out_features() == 0 && out.loss().has_mse()) {
    last->mutable_linear()->set_out_features(data.target_features);
  }
  return out;
}

absl::StatusOr<std::unique_ptr<Model>> Model::Build(const v1::ModelSpec& spec,
                                                    const ModelLimits& limits, math::Isa isa) {
  auto model = std::unique_ptr<Model>(new Model());
  model->spec_ = spec;
  model->limits_ = limits;
  model->isa_ = isa;
  const math::Kernels& kernels = math::KernelsFor(isa);
  if (spec.layers_size() == 0) return absl::InvalidArgumentError("model has no layers");
  if (spec.input_features() <= 0 || spec.input_features() > kMaxDim) {
    return absl::InvalidArgumentError(absl::StrCat("model input_features ", spec.input_features(),
                                                   " must be in [1, ", kMaxDim, "]"));
  }
  int64_t features = spec.input_features();
  int64_t context = 0;  // set by an embedding; 0 until then.
  for (int64_t i = 0; i < spec.layers_size(); ++i) {
    const v1::LayerSpec& ls = spec.layers(i);
    PT_ASSIGN_OR_RETURN(std::unique_ptr<math::Layer> layer,
                        BuildLayer(i, ls, features, &context, limits, kernels));
    PT_RETURN_IF_ERROR(CheckLayerParameters(i, ls, *layer, limits));
    features = layer->out_features();
    model->layers_.push_back(std::move(layer));
  }
  model->tokens_per_sample_ = context == 0 ? 1 : context;
  PT_ASSIGN_OR_RETURN(model->tie_, ResolveTiedEmbedding(spec, model->layers_));
  PT_ASSIGN_OR_RETURN(
      model->sample_activation_bytes_,
      CheckSampleActivations(model->layers_, features, model->tokens_per_sample_, limits));
  PT_ASSIGN_OR_RETURN(model->loss_, BuildLoss(spec, features, kernels));
  return model;
}

std::vector<double> Model::LayerFlops(int64_t samples) const {
  std::vector<double> out;
  out.reserve(layers_.size());
  for (const auto& l : layers_) out.push_back(l->Flops(samples * tokens_per_sample_).total());
  return out;
}

std::vector<int64_t> Model::LayerParamBytes() const {
  std::vector<int64_t> out;
  for (const auto& l : layers_) {
    int64_t n = 0;
    for (const math::ParamSpec& p : l->params()) n += math::NumElements(p.shape);
    out.push_back(n * static_cast<int64_t>(sizeof(float)));
  }
  return out;
}

absl::Status Model::ValidateBatch(math::ConstMatrixMap inputs, math::ConstMatrixMap targets,
                                  int64_t samples) const {
  const int64_t rows = samples * tokens_per_sample_;
  if (samples <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("batch has ", samples, " samples"));
  }
  if (inputs.rows() != rows || inputs.cols() != input_features()) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch inputs are [", inputs.rows(), ", ", inputs.cols(), "], expected [",
                     rows, ", ", input_features(), "] (", samples, " samples x ",
                     tokens_per_sample_, " rows, ", input_features(), " features per row)"));
  }
  if (targets.rows() != rows || targets.cols() != target_features()) {
    return absl::InvalidArgumentError(absl::StrCat("batch targets are [", targets.rows(), ", ",
                                                   targets.cols(), "], expected [", rows, ", ",
                                                   target_features(), "]"));
  }
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < inputs.cols(); ++c) {
      if (!std::isfinite(inputs(r, c))) {
        return absl::InvalidArgumentError(absl::StrCat("batch input row ", r, " column ", c,
                                                       " is not finite (", inputs(r, c), ")"));
      }
    }
  }
  if (spec_.layers(0).has_embedding()) {
    const int64_t vocab = spec_.layers(0).embedding().vocab_size();
    for (int64_t r = 0; r < rows; ++r) {
      const float id = inputs(r, 0);
      if (id < 0 || id >= static_cast<float>(vocab) || id != std::floor(id)) {
        return absl::InvalidArgumentError(absl::StrCat("batch input row ", r, ": token id ", id,
                                                       " is not an integer in [0, ", vocab, ")"));
      }
    }
  }
  return loss_->CheckTargets(targets, output_features());
}

absl::Status Model::CheckMicrobatchActivations(int64_t samples) const {
  const std::optional<int64_t> bytes = util::CheckedMul(samples, sample_activation_bytes_);
  if (bytes.has_value() && *bytes <= limits_.max_activation_bytes) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(
      "a micro-batch of ", samples, " samples needs ", util::CheckedToString(bytes),
      " bytes of activations (", sample_activation_bytes_, " per sample), more than the limit of ",
      limits_.max_activation_bytes,
      " bytes (ModelLimits::max_activation_bytes); use more micro-batches or a smaller batch"));
}

int64_t Model::NumParameters() const {
  int64_t n = 0;
  for (int64_t b : LayerParamBytes()) n += b / static_cast<int64_t>(sizeof(float));
  if (tie_.has_value()) n -= math::NumElements(tie_->shape);
  return n;
}

}  // namespace pipetrain::model
