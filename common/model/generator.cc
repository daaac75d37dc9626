#include "common/model/generator.h"

#include <algorithm>
#include <cassert>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/math/isa.h"
#include "common/util/status_macros.h"

namespace pipetrain::model {

absl::Status CheckLanguageModel(const Model& model) {
  const v1::ModelSpec& spec = model.spec();
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

namespace {

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

Generator::Generator(const ModelParams* params, std::unique_ptr<ChunkDecoder> decoder,
                     int64_t vocab, int64_t context)
    : params_(params),
      vocab_(vocab),
      context_(context),
      decoder_(std::move(decoder)),
      window_(context, vocab) {
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
  PT_RETURN_IF_ERROR(CheckLanguageModel(*model));
  PT_RETURN_IF_ERROR(CheckParams(*model, *params));
  if (!math::CpuSupportsIsa(model->isa())) {
    return absl::FailedPreconditionError(absl::StrCat(
        "this CPU cannot run the model's instruction set ", math::IsaName(model->isa())));
  }
  PT_ASSIGN_OR_RETURN(std::unique_ptr<ChunkDecoder> decoder,
                      ChunkDecoder::Create(model, 0, model->num_layers(), 1));
  model->kernels().ConfigureEigen(threads);
  return std::unique_ptr<Generator>(new Generator(params, std::move(decoder),
                                                  model->spec().layers(0).embedding().vocab_size(),
                                                  model->tokens_per_sample()));
}

absl::Status Generator::Run(const DecodeRun& run) {
  if (run.restart) decoder_->Clear(0);
  const absl::Span<const int64_t> tokens = window_.RunTokens(run);
  const int64_t n = static_cast<int64_t>(tokens.size());
  assert(n >= 1 && n <= context_);
  for (int64_t i = 0; i < n; ++i) input_(i, 0) = static_cast<float>(tokens[i]);
  PT_ASSIGN_OR_RETURN(
      math::ConstMatrixMap y,
      decoder_->Forward(*params_, 0, run.position, math::ConstMatrixMap(input_.data(), n, 1)));
  std::copy(y.data() + (n - 1) * vocab_, y.data() + n * vocab_, logits_.begin());
  positions_computed_ += n;
  return absl::OkStatus();
}

absl::Status Generator::Start(absl::Span<const int64_t> prompt) {
  PT_ASSIGN_OR_RETURN(const DecodeRun run, window_.Start(prompt));
  positions_computed_ = 0;
  return Run(run);
}

absl::Status Generator::Append(int64_t token) {
  PT_ASSIGN_OR_RETURN(const DecodeRun run, window_.Append(token));
  return Run(run);
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
