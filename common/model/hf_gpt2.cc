#include "common/model/hf_gpt2.h"

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/model/hf_config.h"
#include "common/util/status_macros.h"
#include "nlohmann/json.hpp"

namespace pipetrain::model {
namespace {

using json = nlohmann::json;

// The transformer block's LayerNorm eps (fixed, docs/numerics.md): GPT-2 has one for every norm.
constexpr float kLayerNormEps = 1e-5f;

// One parameter of a pipetrain layer and its name under the layer's Hugging Face prefix.
struct ParamRule {
  const char* param;
  const char* hf;
  bool transpose;  // Conv1D ([in, out]) where pipetrain has [out, in].
};

// The table: pipetrain parameter -> GPT-2 name, per layer role.
constexpr ParamRule kEmbeddingRules[] = {{"token.weight", "wte.weight", false},
                                         {"position.weight", "wpe.weight", false}};
constexpr ParamRule kBlockRules[] = {
    {"ln1.weight", "ln_1.weight", false},
    {"ln1.bias", "ln_1.bias", false},
    {"attn.qkv.weight", "attn.c_attn.weight", true},
    {"attn.qkv.bias", "attn.c_attn.bias", false},
    {"attn.proj.weight", "attn.c_proj.weight", true},
    {"attn.proj.bias", "attn.c_proj.bias", false},
    {"ln2.weight", "ln_2.weight", false},
    {"ln2.bias", "ln_2.bias", false},
    {"mlp.fc.weight", "mlp.c_fc.weight", true},
    {"mlp.fc.bias", "mlp.c_fc.bias", false},
    {"mlp.proj.weight", "mlp.c_proj.weight", true},
    {"mlp.proj.bias", "mlp.c_proj.bias", false},
};
constexpr ParamRule kFinalNormRules[] = {{"weight", "ln_f.weight", false},
                                         {"bias", "ln_f.bias", false}};
constexpr ParamRule kHeadRules[] = {{"weight", "lm_head.weight", false}};

constexpr char kLayout[] =
    "GPT-2's layers are an embedding, n_layer transformer_blocks, a layer_norm and a linear head "
    "with no_bias, trained with softmax_cross_entropy";

struct Gpt2Shape {
  int64_t vocab = 0, positions = 0, embd = 0, layers = 0, heads = 0, inner = 0;
};

absl::Status Refuse(const Model& model, int64_t l, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(
      "layer ", l, " (", LayerKindName(model.spec().layers(l)), "): ", what, " (", kLayout, ")"));
}

// The shape of parameter `name` of layer `l`; empty if it has none of that name.
std::vector<int64_t> ParamShape(const Model& model, int64_t l, absl::string_view name) {
  for (const math::ParamSpec& p : model.layer(l).params()) {
    if (p.name == name) return p.shape;
  }
  return {};
}

// Checks the transformer blocks 1 .. n-3 and fills their sizes into `s`.
absl::Status CheckBlocks(const Model& model, Gpt2Shape* s) {
  const int64_t n = model.num_layers();
  for (int64_t l = 1; l < n - 2; ++l) {
    const v1::LayerSpec& ls = model.spec().layers(l);
    if (!ls.has_transformer_block()) {
      return Refuse(model, l, "GPT-2 has only transformer blocks between embedding and layer_norm");
    }
    const int64_t heads = ls.transformer_block().heads();
    const int64_t inner = ParamShape(model, l, "mlp.fc.weight").at(0);
    if (l == 1) {
      s->heads = heads;
      s->inner = inner;
    } else if (heads != s->heads || inner != s->inner) {
      return Refuse(model, l,
                    absl::StrCat("heads ", heads, " and MLP width ", inner,
                                 " differ from layer 1's ", s->heads, " and ", s->inner,
                                 ": GPT-2 has one n_head and n_inner for every block"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<Gpt2Shape> ShapeOf(const Model& model) {
  const v1::ModelSpec& spec = model.spec();
  const int64_t n = model.num_layers();
  if (!spec.loss().has_softmax_cross_entropy()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the model's loss is not softmax_cross_entropy (", kLayout, ")"));
  }
  if (n < 4) {
    return absl::InvalidArgumentError(absl::StrCat("the model has ", n, " layers (", kLayout, ")"));
  }
  if (!spec.layers(0).has_embedding()) return Refuse(model, 0, "GPT-2 starts with an embedding");
  Gpt2Shape s;
  const std::vector<int64_t> token = ParamShape(model, 0, "token.weight");
  s.vocab = token.at(0);
  s.embd = token.at(1);
  const std::vector<int64_t> position = ParamShape(model, 0, "position.weight");
  if (position.empty()) {
    return Refuse(model, 0, "has no position table (positions: NONE), but GPT-2 learns one (wpe)");
  }
  s.positions = position.at(0);
  s.layers = n - 3;
  const v1::LayerSpec& head = spec.layers(n - 1);
  if (!head.has_linear())
    return Refuse(model, n - 1, "GPT-2's last layer is the lm_head, a linear");
  if (!head.linear().no_bias()) {
    return Refuse(model, n - 1,
                  "has a bias, but GPT-2's lm_head has none: give the head `no_bias: true` (as "
                  "examples/gpt_char.textproto does) and train again");
  }
  if (const int64_t out = ParamShape(model, n - 1, "weight").at(0); out != s.vocab) {
    return Refuse(model, n - 1,
                  absl::StrCat("outputs ", out, " classes, but GPT-2's lm_head outputs the ",
                               "embedding's vocab_size ", s.vocab));
  }
  const v1::LayerSpec& norm = spec.layers(n - 2);
  if (!norm.has_layer_norm()) return Refuse(model, n - 2, "GPT-2 ends with a layer_norm (ln_f)");
  const float eps = norm.layer_norm().eps() == 0 ? kLayerNormEps : norm.layer_norm().eps();
  if (eps != kLayerNormEps) {
    return Refuse(model, n - 2,
                  absl::StrCat("eps ", eps,
                               " differs from the transformer blocks' 1e-05: GPT-2 has one "
                               "layer_norm_epsilon for every norm"));
  }
  PT_RETURN_IF_ERROR(CheckBlocks(model, &s));
  return s;
}

absl::Status Check(const Model& model) { return ShapeOf(model).status(); }

absl::StatusOr<std::string> Describe(const Model& model) {
  PT_ASSIGN_OR_RETURN(const Gpt2Shape s, ShapeOf(model));
  return absl::StrCat("vocab_size ", s.vocab, ", n_positions ", s.positions, ", n_embd ", s.embd,
                      ", n_layer ", s.layers, ", n_head ", s.heads, ", n_inner ", s.inner);
}

absl::StatusOr<std::string> Config(const Model& model) {
  PT_ASSIGN_OR_RETURN(const Gpt2Shape s, ShapeOf(model));
  json j;
  j["architectures"] = {"GPT2LMHeadModel"};
  j["model_type"] = "gpt2";
  j["vocab_size"] = s.vocab;
  j["n_positions"] = s.positions;
  j["n_ctx"] = s.positions;
  j["n_embd"] = s.embd;
  j["n_layer"] = s.layers;
  j["n_head"] = s.heads;
  j["n_inner"] = s.inner;
  j["activation_function"] = "gelu_new";  // GELU, tanh approximation
  j["layer_norm_epsilon"] = 1e-5;         // kLayerNormEps, written as the decimal a reader expects
  // pipetrain has no dropout.
  j["resid_pdrop"] = 0.0;
  j["embd_pdrop"] = 0.0;
  j["attn_pdrop"] = 0.0;
  j["scale_attn_weights"] = true;
  j["scale_attn_by_inverse_layer_idx"] = false;
  j["reorder_and_upcast_attn"] = false;
  SetHfCommonKeys(model, &j);
  return j.dump(2) + "\n";
}

// The numerics the config sets, each as pipetrain computes them.
absl::Status CheckNumerics(const json& j, const std::string& path) {
  const std::string act = j.value("activation_function", std::string("gelu_new"));
  if (act != "gelu_new" && act != "gelu_pytorch_tanh") {
    return HfConfigError(path, absl::StrCat("'activation_function' is '", act,
                                            "'; pipetrain's GELU is the tanh approximation "
                                            "(gelu_new, gelu_pytorch_tanh)"));
  }
  const json eps = j.contains("layer_norm_epsilon") ? j["layer_norm_epsilon"] : json(1e-5);
  if (!eps.is_number() || static_cast<float>(eps.get<double>()) != kLayerNormEps) {
    return HfConfigError(path, absl::StrCat("'layer_norm_epsilon' is ", eps.dump(),
                                            "; pipetrain's transformer blocks use 1e-05"));
  }
  PT_RETURN_IF_ERROR(HfExpect(j, "scale_attn_weights", true, true, path,
                              "attention scores are scaled by 1/sqrt(head dim)"));
  PT_RETURN_IF_ERROR(HfExpect(j, "scale_attn_by_inverse_layer_idx", false, false, path,
                              "no per-layer attention scaling"));
  return HfCheckTieFlag(j, path);
}

absl::StatusOr<HfConfig> ParseConfig(absl::string_view text, const std::string& path) {
  const json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return HfConfigError(path, "not a JSON object");
  PT_RETURN_IF_ERROR(HfExpect(j, "model_type", nullptr, "gpt2", path, "a GPT-2"));
  PT_RETURN_IF_ERROR(CheckNumerics(j, path));
  PT_ASSIGN_OR_RETURN(const int64_t vocab, HfPositiveInt(j, "vocab_size", path));
  PT_ASSIGN_OR_RETURN(const int64_t positions, HfPositiveInt(j, "n_positions", path));
  PT_ASSIGN_OR_RETURN(const int64_t embd, HfPositiveInt(j, "n_embd", path));
  PT_ASSIGN_OR_RETURN(const int64_t layers, HfPositiveInt(j, "n_layer", path));
  PT_ASSIGN_OR_RETURN(const int64_t heads, HfPositiveInt(j, "n_head", path));
  PT_ASSIGN_OR_RETURN(const int64_t inner, HfPositiveInt(j, "n_inner", path, 4 * embd));
  if (inner % embd != 0) {
    return HfConfigError(path, absl::StrCat("'n_inner' ", inner, " is not a multiple of 'n_embd' ",
                                            embd, " (pipetrain's MLP width is mlp_ratio x dim)"));
  }
  HfConfig c;
  c.spec.set_name("gpt2");
  c.spec.set_input_features(1);
  v1::EmbeddingSpec* e = c.spec.add_layers()->mutable_embedding();
  e->set_vocab_size(vocab);
  e->set_dim(embd);
  e->set_context(positions);
  for (int64_t i = 0; i < layers; ++i) {
    v1::TransformerBlockSpec* b = c.spec.add_layers()->mutable_transformer_block();
    b->set_heads(heads);
    b->set_mlp_ratio(inner / embd);
  }
  c.spec.add_layers()->mutable_layer_norm();
  v1::LinearSpec* head = c.spec.add_layers()->mutable_linear();
  head->set_out_features(vocab);
  head->set_no_bias(true);
  c.spec.mutable_loss()->mutable_softmax_cross_entropy();
  if (j.value("tie_word_embeddings", true)) c.aliases["lm_head.weight"] = "transformer.wte.weight";
  return c;
}

void AddRules(const std::string& prefix, int64_t l, const ParamRule* begin, const ParamRule* end,
              std::vector<HfTensorName>* out) {
  for (const ParamRule* r = begin; r != end; ++r) {
    out->push_back({absl::StrCat("layers.", l, ".", r->param), prefix + r->hf, r->transpose});
  }
}

std::vector<HfTensorName> TensorNames(const Model& model) {
  const int64_t n = model.num_layers();
  std::vector<HfTensorName> out;
  AddRules("transformer.", 0, std::begin(kEmbeddingRules), std::end(kEmbeddingRules), &out);
  for (int64_t l = 1; l < n - 2; ++l) {
    AddRules(absl::StrCat("transformer.h.", l - 1, "."), l, std::begin(kBlockRules),
             std::end(kBlockRules), &out);
  }
  AddRules("transformer.", n - 2, std::begin(kFinalNormRules), std::end(kFinalNormRules), &out);
  if (!model.tie().has_value()) {
    AddRules("", n - 1, std::begin(kHeadRules), std::end(kHeadRules), &out);
  }
  return out;
}

// The causal-mask buffers older transformers versions saved with every block.
bool Ignored(absl::string_view name) {
  return absl::StartsWith(name, "transformer.h.") &&
         (absl::EndsWith(name, ".attn.bias") || absl::EndsWith(name, ".attn.masked_bias"));
}

}  // namespace

const HfArchitecture& Gpt2Architecture() {
  static const HfArchitecture gpt2{"gpt2",       &Check,       &Config, &Describe,
                                   &ParseConfig, &TensorNames, &Ignored};
  return gpt2;
}

}  // namespace pipetrain::model
