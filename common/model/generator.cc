#include "common/model/generator.h"

#include <algorithm>
#include <cassert>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/math/isa.h"
#include "common/util/status_macros.h"

namespace pipetrain::model {
namespace {

// What `spec` is, for the refusal of a model that is not a language model.
absl::Status CheckLanguageModel(const v1::ModelSpec& spec, const Model& model) {
  const std::string what =
      absl::StrCat("model '", spec.name(), "' (", LayerKindName(spec.layers(0)), " first, loss ",
                   spec.loss().has_softmax_cross_entropy() ? "softmax cross-entropy" : "MSE", ")");
  if (!spec.layers(0).has_embedding()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "generation needs a language model (an embedding first, a softmax cross-entropy loss "
        "over its vocabulary); ",
        what, " is not one: use `pipetrain predict` for a classifier or regressor"));
  }
  if (!spec.loss().has_softmax_cross_entropy() ||
      model.output_features() != spec.layers(0).embedding().vocab_size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "generation needs a language model whose last layer outputs one logit per vocabulary "
        "entry (",
        spec.layers(0).embedding().vocab_size(), ") under a softmax cross-entropy loss; ", what,
        " outputs ", model.output_features()));
  }
  for (int64_t l = 0; l < model.num_layers(); ++l) {
    if (!model.layer(l).SupportsIncremental()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "layer ", l, " (", model.layer(l).kind(), ") has no incremental forward for generation"));
    }
  }
  return absl::OkStatus();
}

// OK if params[l] has the shapes of model.layer(l)'s parameters for every layer.
absl::Status CheckParams(const Model& model, const ModelParams& params) {
  if (static_cast<int64_t>(params.size()) != model.num_layers()) {
    return absl::InvalidArgumentError(absl::StrCat("parameters for ", params.size(),
                                                   " layers, the model has ", model.num_layers()));
  }
  for (int64_t l = 0; l < model.num_layers(); ++l) {
    const std::vector<math::ParamSpec> specs = model.layer(l).params();
    if (params[l].size() != specs.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "layer ", l, ": ", params[l].size(), " parameter tensors, expected ", specs.size()));
    }
    for (size_t i = 0; i < specs.size(); ++i) {
      const math::Tensor& t = params[l][i];
      if (t.shape != specs[i].shape ||
          static_cast<int64_t>(t.data.size()) != math::NumElements(t.shape)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "layers.", l, ".", specs[i].name, ": shape [", absl::StrJoin(t.shape, ", "),
            "], the layer's is [", absl::StrJoin(specs[i].shape, ", "), "]"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ModelParams> TakeModelParams(const Model& model,
                                            std::map<std::string, math::Tensor>* tensors) {
  ModelParams params(static_cast<size_t>(model.num_layers()));
  for (int64_t l = 0; l < model.num_layers(); ++l) {
    const std::vector<math::ParamSpec> specs = model.layer(l).params();
    for (size_t p = 0; p < specs.size(); ++p) {
      const math::ParamSpec& spec = specs[p];
      if (model.tie().has_value() && l == model.tie()->head_layer && p == TiedEmbedding::kParam) {
        // A tied head's weight is the embedding's token table (taken above, same shape).
        params[l].push_back(params[model.tie()->embedding_layer][TiedEmbedding::kParam]);
        continue;
      }
      const std::string name = absl::StrCat("layers.", l, ".", spec.name);
      auto it = tensors->find(name);
      if (it == tensors->end()) {
        return absl::NotFoundError(absl::StrCat("no tensor ", name, " (layer ", l, ", ",
                                                model.layer(l).kind(), ") in the checkpoint"));
      }
      if (it->second.shape != spec.shape) {
        return absl::InvalidArgumentError(
            absl::StrCat("tensor ", name, " has shape [", absl::StrJoin(it->second.shape, ", "),
                         "], the model's layer needs [", absl::StrJoin(spec.shape, ", "), "]"));
      }
      params[l].push_back(std::move(it->second));
      tensors->erase(it);
    }
  }
  return params;
}

Generator::Generator(const Model* model, const ModelParams* params, int64_t vocab, int64_t context)
    : model_(model), params_(params), vocab_(vocab), context_(context) {
  const int64_t n = model->num_layers();
  states_.resize(static_cast<size_t>(n));
  scratch_.resize(static_cast<size_t>(n));
  outputs_.resize(static_cast<size_t>(n));
  for (int64_t l = 0; l < n; ++l) {
    states_[l] = model->layer(l).NewIncrementalState();
    outputs_[l].resize(context, model->layer(l).out_features());
  }
  input_.resize(context, 1);
  logits_.resize(static_cast<size_t>(vocab));
}

absl::StatusOr<std::unique_ptr<Generator>> Generator::Create(const Model* model,
                                                             const ModelParams* params,
                                                             int threads) {
  if (model == nullptr || params == nullptr) {
    return absl::InvalidArgumentError("Generator::Create: null model or parameters");
  }
  if (threads < 1) {
    return absl::InvalidArgumentError(absl::StrCat("compute threads must be >= 1, got ", threads));
  }
  PT_RETURN_IF_ERROR(CheckLanguageModel(model->spec(), *model));
  PT_RETURN_IF_ERROR(CheckParams(*model, *params));
  if (!math::CpuSupportsIsa(model->isa())) {
    return absl::FailedPreconditionError(absl::StrCat(
        "this CPU cannot run the model's instruction set ", math::IsaName(model->isa())));
  }
  model->kernels().ConfigureEigen(threads);
  return std::unique_ptr<Generator>(new Generator(
      model, params, model->spec().layers(0).embedding().vocab_size(), model->tokens_per_sample()));
}

void Generator::ClearStates() {
  for (auto& s : states_) {
    if (s != nullptr) s->Clear();
  }
}

void Generator::Run(int64_t position) {
  const int64_t end = static_cast<int64_t>(window_.size());
  const int64_t n = end - position;
  assert(n >= 1 && end <= context_);
  for (int64_t i = 0; i < n; ++i) input_(i, 0) = static_cast<float>(window_[position + i]);
  const float* x = input_.data();  // the layer's input, [n, cols]
  int64_t cols = 1;
  for (int64_t l = 0; l < model_->num_layers(); ++l) {
    math::Matrix& out = outputs_[l];
    model_->layer(l).ForwardIncremental((*params_)[l], position, math::ConstMatrixMap(x, n, cols),
                                        states_[l].get(), &scratch_[l],
                                        math::MatrixMap(out.data(), n, out.cols()));
    x = out.data();
    cols = out.cols();
  }
  std::copy(x + (n - 1) * vocab_, x + n * vocab_, logits_.begin());
  positions_computed_ += n;
}

absl::Status Generator::Start(absl::Span<const int64_t> prompt) {
  if (prompt.empty()) {
    return absl::InvalidArgumentError("the prompt is empty: generation needs at least one token");
  }
  for (size_t i = 0; i < prompt.size(); ++i) {
    if (prompt[i] < 0 || prompt[i] >= vocab_) {
      return absl::InvalidArgumentError(absl::StrCat("prompt token ", i, " is ", prompt[i],
                                                     ", outside the vocabulary [0, ", vocab_, ")"));
    }
  }
  const size_t keep = std::min(prompt.size(), static_cast<size_t>(context_));
  window_.assign(prompt.end() - keep, prompt.end());
  ClearStates();
  slides_ = 0;
  positions_computed_ = 0;
  started_ = true;
  Run(0);
  return absl::OkStatus();
}

absl::Status Generator::Append(int64_t token) {
  if (!started_) return absl::FailedPreconditionError("Append before Start");
  if (token < 0 || token >= vocab_) {
    return absl::InvalidArgumentError(
        absl::StrCat("token ", token, " is outside the vocabulary [0, ", vocab_, ")"));
  }
  if (static_cast<int64_t>(window_.size()) < context_) {
    window_.push_back(token);
    Run(static_cast<int64_t>(window_.size()) - 1);
    return absl::OkStatus();
  }
  // Slide: keep the last ceil(T/2) - 1 tokens and the new one, from position 0 again.
  const int64_t keep = (context_ + 1) / 2;
  window_.erase(window_.begin(), window_.end() - (keep - 1));
  window_.push_back(token);
  ClearStates();
  ++slides_;
  Run(0);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int64_t>> Generator::Generate(
    absl::Span<const int64_t> prompt, const GenerateOptions& options,
    const std::function<void(int64_t token)>& on_token) {
  if (options.max_tokens < 1 || options.max_tokens > kMaxGenerateTokens) {
    return absl::InvalidArgumentError(absl::StrCat("max-tokens must be in [1, ", kMaxGenerateTokens,
                                                   "], got ", options.max_tokens));
  }
  PT_RETURN_IF_ERROR(CheckSamplingOptions(options.sampling));
  PT_RETURN_IF_ERROR(Start(prompt));
  TokenSampler sampler(options.sampling);
  std::vector<int64_t> out;
  out.reserve(static_cast<size_t>(options.max_tokens));
  for (int64_t i = 0; i < options.max_tokens; ++i) {
    out.push_back(sampler.Next(logits()));
    if (on_token) on_token(out.back());
    if (i + 1 < options.max_tokens) PT_RETURN_IF_ERROR(Append(out.back()));
  }
  return out;
}

}  // namespace pipetrain::model
