#include "common/model/model.h"

#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/io/file_util.h"
#include "common/math/activations.h"
#include "common/math/embedding.h"
#include "common/math/layer_norm.h"
#include "common/math/linear.h"
#include "common/math/transformer_block.h"
#include "common/util/status_macros.h"
#include "google/protobuf/io/tokenizer.h"
#include "google/protobuf/text_format.h"

namespace pipetrain::model {
namespace {

// Largest feature count / context / vocabulary a spec may ask for; larger values are rejected
// before any allocation is attempted.
constexpr int64_t kMaxDim = int64_t{1} << 24;
// Largest number of elements of one parameter tensor (4 GiB of float32).
constexpr int64_t kMaxParamElements = int64_t{1} << 30;

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
  PT_ASSIGN_OR_RETURN(std::string text, io::ReadFile(path));
  return ParseModelSpecText(text, path);
}

absl::StatusOr<v1::ModelSpec> ResolveModelSpec(const v1::ModelSpec& spec, const DataShape& data) {
  v1::ModelSpec out = spec;
  if (out.layers_size() == 0) return absl::InvalidArgumentError("model has no layers");
  if (out.input_features() == 0) out.set_input_features(data.input_features);
  if (data.input_features > 0 && out.input_features() != data.input_features) {
    return absl::InvalidArgumentError(absl::StrCat("model input_features ", out.input_features(),
                                                   " != data set's ", data.input_features));
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
  return out;
}

absl::StatusOr<std::unique_ptr<Model>> Model::Build(const v1::ModelSpec& spec) {
  auto model = std::unique_ptr<Model>(new Model());
  model->spec_ = spec;
  if (spec.layers_size() == 0) return absl::InvalidArgumentError("model has no layers");
  if (spec.input_features() <= 0 || spec.input_features() > kMaxDim) {
    return absl::InvalidArgumentError(absl::StrCat("model input_features ", spec.input_features(),
                                                   " must be in [1, ", kMaxDim, "]"));
  }
  int64_t features = spec.input_features();
  int64_t context = 0;  // set by an embedding; 0 until then.
  for (int64_t i = 0; i < spec.layers_size(); ++i) {
    const v1::LayerSpec& ls = spec.layers(i);
    std::unique_ptr<math::Layer> layer;
    switch (ls.kind_case()) {
      case v1::LayerSpec::kLinear: {
        const v1::LinearSpec& s = ls.linear();
        const int64_t in = s.in_features() == 0 ? features : s.in_features();
        if (in != features) {
          return LayerError(
              i, ls, absl::StrCat("in_features ", in, " != ", features, " (", Origin(i), ")"));
        }
        PT_RETURN_IF_ERROR(CheckDim(i, ls, "out_features", s.out_features()));
        if (in * s.out_features() > kMaxParamElements) {
          return LayerError(i, ls,
                            absl::StrCat("weight of ", in, " x ", s.out_features(),
                                         " elements exceeds the limit of ", kMaxParamElements));
        }
        layer = std::make_unique<math::Linear>(in, s.out_features(), !s.no_bias());
        break;
      }
      case v1::LayerSpec::kRelu:
        layer = std::make_unique<math::Relu>(features);
        break;
      case v1::LayerSpec::kGelu:
        layer = std::make_unique<math::Gelu>(features);
        break;
      case v1::LayerSpec::kLayerNorm: {
        const v1::LayerNormSpec& s = ls.layer_norm();
        if (s.features() != 0 && s.features() != features) {
          return LayerError(
              i, ls,
              absl::StrCat("features ", s.features(), " != ", features, " (", Origin(i), ")"));
        }
        if (!(s.eps() >= 0))
          return LayerError(i, ls, absl::StrCat("eps ", s.eps(), " must be >= 0"));
        layer = std::make_unique<math::LayerNorm>(features, s.eps() == 0 ? 1e-5f : s.eps());
        break;
      }
      case v1::LayerSpec::kEmbedding: {
        const v1::EmbeddingSpec& s = ls.embedding();
        if (features != 1) {
          return LayerError(i, ls,
                            absl::StrCat("takes one token id per row, but its input has ", features,
                                         " features (", Origin(i), ")"));
        }
        if (context != 0) return LayerError(i, ls, "a model may have only one embedding");
        PT_RETURN_IF_ERROR(CheckDim(i, ls, "vocab_size", s.vocab_size()));
        PT_RETURN_IF_ERROR(CheckDim(i, ls, "dim", s.dim()));
        PT_RETURN_IF_ERROR(CheckDim(i, ls, "context", s.context()));
        if (s.vocab_size() * s.dim() > kMaxParamElements) {
          return LayerError(i, ls, "token table exceeds the parameter size limit");
        }
        context = s.context();
        layer = std::make_unique<math::Embedding>(s.vocab_size(), s.dim(), s.context());
        break;
      }
      case v1::LayerSpec::kTransformerBlock: {
        const v1::TransformerBlockSpec& s = ls.transformer_block();
        const int64_t dim = s.dim() == 0 ? features : s.dim();
        if (dim != features) {
          return LayerError(i, ls,
                            absl::StrCat("dim ", dim, " != ", features, " (", Origin(i), ")"));
        }
        PT_RETURN_IF_ERROR(CheckDim(i, ls, "heads", s.heads()));
        if (dim % s.heads() != 0) {
          return LayerError(i, ls, absl::StrCat("heads ", s.heads(), " must divide dim ", dim));
        }
        const int64_t ctx = s.context() == 0 ? context : s.context();
        if (ctx == 0) {
          return LayerError(i, ls, "needs a context: set context or put an embedding before it");
        }
        if (context != 0 && ctx != context) {
          return LayerError(i, ls,
                            absl::StrCat("context ", ctx, " != embedding context ", context));
        }
        PT_RETURN_IF_ERROR(CheckDim(i, ls, "context", ctx));
        context = ctx;
        const int64_t ratio = s.mlp_ratio() == 0 ? 4 : s.mlp_ratio();
        if (ratio < 0 || ratio > 64) {
          return LayerError(i, ls, absl::StrCat("mlp_ratio ", ratio, " must be in [1, 64]"));
        }
        if (dim * dim * ratio > kMaxParamElements) {
          return LayerError(i, ls, "MLP weights exceed the parameter size limit");
        }
        layer = std::make_unique<math::TransformerBlock>(dim, s.heads(), ctx, ratio);
        break;
      }
      case v1::LayerSpec::KIND_NOT_SET:
        return LayerError(i, ls,
                          "no layer kind set (expected one of linear, relu, gelu, "
                          "layer_norm, embedding, transformer_block)");
    }
    features = layer->out_features();
    model->layers_.push_back(std::move(layer));
  }
  model->tokens_per_sample_ = context == 0 ? 1 : context;

  switch (spec.loss().kind_case()) {
    case v1::LossSpec::kSoftmaxCrossEntropy:
      if (features < 2) {
        return absl::InvalidArgumentError(absl::StrCat(
            "softmax_cross_entropy needs at least 2 classes, but the last layer outputs ",
            features));
      }
      model->loss_ = math::MakeSoftmaxCrossEntropy();
      break;
    case v1::LossSpec::kMse:
      model->loss_ = math::MakeMse();
      break;
    case v1::LossSpec::KIND_NOT_SET:
      return absl::InvalidArgumentError(
          "model has no loss (set loss { softmax_cross_entropy {} } or loss { mse {} })");
  }
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

int64_t Model::NumParameters() const {
  int64_t n = 0;
  for (int64_t b : LayerParamBytes()) n += b / static_cast<int64_t>(sizeof(float));
  return n;
}

}  // namespace pipetrain::model
