#include "common/model/hf_llama.h"

#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/model/hf_config.h"
#include "common/util/status_macros.h"
#include "nlohmann/json.hpp"

namespace pipetrain::model {
// A named namespace inside the anonymous one: the demo's unity build compiles this file with
// hf_gpt2.cc, whose file-scope helpers have the same names.
namespace {
namespace hf_llama {

using json = nlohmann::json;

// pipetrain's defaults for a 0 in the specs (proto/pipetrain/v1/model.proto).
constexpr float kDefaultEps = 1e-5f;
constexpr double kDefaultRopeTheta = 10000;

// One parameter of a pipetrain layer and its name under the layer's Hugging Face prefix.
struct Rule {
  const char* param;
  const char* hf;
};

constexpr Rule kEmbeddingRules[] = {{"token.weight", "embed_tokens.weight"}};
constexpr Rule kBlockRules[] = {
    {"attn_norm.weight", "input_layernorm.weight"},
    {"attn.q.weight", "self_attn.q_proj.weight"},
    {"attn.k.weight", "self_attn.k_proj.weight"},
    {"attn.v.weight", "self_attn.v_proj.weight"},
    {"attn.o.weight", "self_attn.o_proj.weight"},
    {"mlp_norm.weight", "post_attention_layernorm.weight"},
    {"mlp.gate.weight", "mlp.gate_proj.weight"},
    {"mlp.up.weight", "mlp.up_proj.weight"},
    {"mlp.down.weight", "mlp.down_proj.weight"},
};
constexpr Rule kFinalNormRules[] = {{"weight", "norm.weight"}};
constexpr Rule kHeadRules[] = {{"weight", "lm_head.weight"}};

constexpr char kLayout[] =
    "LLaMA's layers are an embedding with positions: NONE, num_hidden_layers llama_blocks, an "
    "rms_norm and a linear head with no_bias, trained with softmax_cross_entropy";

// The sizes and settings a LlamaConfig records.
struct LlamaShape {
  int64_t vocab = 0, positions = 0, hidden = 0, layers = 0, heads = 0, kv_heads = 0,
          intermediate = 0;
  float eps = 0;
  double rope_theta = 0;
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

// Block l's settings as the model builder resolves them (its 0s replaced by the defaults).
LlamaShape BlockShape(const Model& model, int64_t l) {
  const v1::LlamaBlockSpec& b = model.spec().layers(l).llama_block();
  LlamaShape s;
  s.heads = b.heads();
  s.kv_heads = b.kv_heads() == 0 ? b.heads() : b.kv_heads();
  s.intermediate = ParamShape(model, l, "mlp.gate.weight").at(0);
  s.eps = b.norm_eps() == 0 ? kDefaultEps : b.norm_eps();
  s.rope_theta = b.rope_theta() == 0 ? kDefaultRopeTheta : b.rope_theta();
  return s;
}

// Checks the llama blocks 1 .. n-3 and fills their settings into `s`.
absl::Status CheckBlocks(const Model& model, LlamaShape* s) {
  const int64_t n = model.num_layers();
  for (int64_t l = 1; l < n - 2; ++l) {
    if (!model.spec().layers(l).has_llama_block()) {
      return Refuse(model, l, "LLaMA has only llama_blocks between embedding and rms_norm");
    }
    const LlamaShape b = BlockShape(model, l);
    if (l == 1) {
      s->heads = b.heads;
      s->kv_heads = b.kv_heads;
      s->intermediate = b.intermediate;
      s->eps = b.eps;
      s->rope_theta = b.rope_theta;
    } else if (b.heads != s->heads || b.kv_heads != s->kv_heads ||
               b.intermediate != s->intermediate || b.eps != s->eps ||
               b.rope_theta != s->rope_theta) {
      return Refuse(model, l,
                    absl::StrCat("heads ", b.heads, ", kv_heads ", b.kv_heads, ", hidden ",
                                 b.intermediate, ", norm_eps ", b.eps, " and rope_theta ",
                                 b.rope_theta, " differ from layer 1's ", s->heads, ", ",
                                 s->kv_heads, ", ", s->intermediate, ", ", s->eps, " and ",
                                 s->rope_theta, ": LLaMA has one setting of each for every layer"));
    }
  }
  return absl::OkStatus();
}

// Checks the embedding (layer 0), the head (n-1) and the final norm (n-2) against `s`'s blocks.
absl::Status CheckEnds(const Model& model, const LlamaShape& s) {
  const v1::ModelSpec& spec = model.spec();
  const int64_t n = model.num_layers();
  const v1::LayerSpec& head = spec.layers(n - 1);
  if (!head.has_linear())
    return Refuse(model, n - 1, "LLaMA's last layer is the lm_head, a linear");
  if (!head.linear().no_bias()) {
    return Refuse(model, n - 1,
                  "has a bias, but LLaMA's lm_head has none: give the head `no_bias: true` (as "
                  "examples/llama_char.textproto does) and train again");
  }
  if (const int64_t out = ParamShape(model, n - 1, "weight").at(0); out != s.vocab) {
    return Refuse(model, n - 1,
                  absl::StrCat("outputs ", out, " classes, but LLaMA's lm_head outputs the ",
                               "embedding's vocab_size ", s.vocab));
  }
  const v1::LayerSpec& norm = spec.layers(n - 2);
  if (!norm.has_rms_norm()) return Refuse(model, n - 2, "LLaMA ends with an rms_norm (norm)");
  const float eps = norm.rms_norm().eps() == 0 ? kDefaultEps : norm.rms_norm().eps();
  if (eps != s.eps) {
    return Refuse(model, n - 2,
                  absl::StrCat("eps ", eps, " differs from the llama_blocks' norm_eps ", s.eps,
                               ": LLaMA has one rms_norm_eps for every norm"));
  }
  return absl::OkStatus();
}

absl::StatusOr<LlamaShape> ShapeOf(const Model& model) {
  const v1::ModelSpec& spec = model.spec();
  const int64_t n = model.num_layers();
  if (!spec.loss().has_softmax_cross_entropy()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the model's loss is not softmax_cross_entropy (", kLayout, ")"));
  }
  if (n < 4) {
    return absl::InvalidArgumentError(absl::StrCat("the model has ", n, " layers (", kLayout, ")"));
  }
  if (!spec.layers(0).has_embedding()) return Refuse(model, 0, "LLaMA starts with an embedding");
  if (!ParamShape(model, 0, "position.weight").empty()) {
    return Refuse(model, 0,
                  "has a learned position table, but LLaMA's positions are rotary (in the "
                  "attention): give the embedding `positions: NONE`");
  }
  LlamaShape s;
  const std::vector<int64_t> token = ParamShape(model, 0, "token.weight");
  s.vocab = token.at(0);
  s.hidden = token.at(1);
  s.positions = model.tokens_per_sample();
  s.layers = n - 3;
  PT_RETURN_IF_ERROR(CheckBlocks(model, &s));
  PT_RETURN_IF_ERROR(CheckEnds(model, s));
  return s;
}

absl::Status Check(const Model& model) { return ShapeOf(model).status(); }

absl::StatusOr<std::string> Describe(const Model& model) {
  PT_ASSIGN_OR_RETURN(const LlamaShape s, ShapeOf(model));
  return absl::StrCat("vocab_size ", s.vocab, ", max_position_embeddings ", s.positions,
                      ", hidden_size ", s.hidden, ", num_hidden_layers ", s.layers,
                      ", num_attention_heads ", s.heads, ", num_key_value_heads ", s.kv_heads,
                      ", intermediate_size ", s.intermediate, ", rms_norm_eps ", s.eps,
                      ", rope_theta ", s.rope_theta);
}

// The shortest decimal that reads back as `f` (1e-05 for 1e-5f, not 9.99999974737875e-06).
double ShortestDecimal(float f) {
  for (int digits = 1; digits < 9; ++digits) {
    const double d = std::strtod(absl::StrFormat("%.*g", digits, f).c_str(), nullptr);
    if (static_cast<float>(d) == f) return d;
  }
  return static_cast<double>(f);
}

absl::StatusOr<std::string> Config(const Model& model) {
  PT_ASSIGN_OR_RETURN(const LlamaShape s, ShapeOf(model));
  json j;
  j["architectures"] = {"LlamaForCausalLM"};
  j["model_type"] = "llama";
  j["vocab_size"] = s.vocab;
  j["max_position_embeddings"] = s.positions;
  j["hidden_size"] = s.hidden;
  j["intermediate_size"] = s.intermediate;
  j["num_hidden_layers"] = s.layers;
  j["num_attention_heads"] = s.heads;
  j["num_key_value_heads"] = s.kv_heads;
  j["head_dim"] = s.hidden / s.heads;
  j["hidden_act"] = "silu";
  j["rms_norm_eps"] = ShortestDecimal(s.eps);
  j["rope_theta"] = s.rope_theta;
  j["rope_scaling"] = nullptr;
  j["attention_bias"] = false;
  j["mlp_bias"] = false;
  j["attention_dropout"] = 0.0;  // pipetrain has no dropout
  j["pretraining_tp"] = 1;
  SetHfCommonKeys(model, &j);
  return j.dump(2) + "\n";
}

// Field `key` of `j`, a number > `above`; `fallback` if missing.
absl::StatusOr<double> NumberAbove(const json& j, const char* key, double above, double fallback,
                                   const std::string& path) {
  auto it = j.find(key);
  if (it == j.end()) return fallback;
  if (!it->is_number() || !(it->get<double>() > above)) {
    return HfConfigError(path, absl::StrCat("'", key, "' is ", it->dump(),
                                            "; pipetrain needs a number above ", above));
  }
  return it->get<double>();
}

// The settings pipetrain computes one way only.
absl::Status CheckNumerics(const json& j, const std::string& path) {
  PT_RETURN_IF_ERROR(HfExpect(j, "hidden_act", "silu", "silu", path, "SwiGLU's gate is SiLU"));
  PT_RETURN_IF_ERROR(HfExpect(j, "attention_bias", false, false, path, "no biases"));
  PT_RETURN_IF_ERROR(HfExpect(j, "mlp_bias", false, false, path, "no biases"));
  PT_RETURN_IF_ERROR(
      HfExpect(j, "rope_scaling", nullptr, nullptr, path, "rotary embeddings without scaling"));
  return HfCheckTieFlag(j, path);
}

// Reads the sizes and settings of a LlamaConfig (LlamaConfig's defaults where it allows one).
absl::StatusOr<LlamaShape> ParseShape(const json& j, const std::string& path) {
  LlamaShape s;
  PT_ASSIGN_OR_RETURN(s.vocab, HfPositiveInt(j, "vocab_size", path));
  PT_ASSIGN_OR_RETURN(s.positions, HfPositiveInt(j, "max_position_embeddings", path));
  PT_ASSIGN_OR_RETURN(s.hidden, HfPositiveInt(j, "hidden_size", path));
  PT_ASSIGN_OR_RETURN(s.intermediate, HfPositiveInt(j, "intermediate_size", path));
  PT_ASSIGN_OR_RETURN(s.layers, HfPositiveInt(j, "num_hidden_layers", path));
  PT_ASSIGN_OR_RETURN(s.heads, HfPositiveInt(j, "num_attention_heads", path));
  PT_ASSIGN_OR_RETURN(s.kv_heads, HfPositiveInt(j, "num_key_value_heads", path, s.heads));
  if (s.hidden % s.heads != 0 || s.heads % s.kv_heads != 0) {
    return HfConfigError(
        path, absl::StrCat("'num_attention_heads' ", s.heads, " must divide 'hidden_size' ",
                           s.hidden, " and be a multiple of 'num_key_value_heads' ", s.kv_heads));
  }
  PT_ASSIGN_OR_RETURN(const int64_t head_dim,
                      HfPositiveInt(j, "head_dim", path, s.hidden / s.heads));
  if (head_dim != s.hidden / s.heads) {
    return HfConfigError(path, absl::StrCat("'head_dim' ", head_dim, " is not 'hidden_size' / ",
                                            "'num_attention_heads' = ", s.hidden / s.heads,
                                            " (pipetrain's head width)"));
  }
  PT_ASSIGN_OR_RETURN(const double eps, NumberAbove(j, "rms_norm_eps", 0, 1e-6, path));
  s.eps = static_cast<float>(eps);
  PT_ASSIGN_OR_RETURN(s.rope_theta, NumberAbove(j, "rope_theta", 1, 10000, path));
  return s;
}

absl::StatusOr<HfConfig> ParseConfig(absl::string_view text, const std::string& path) {
  const json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return HfConfigError(path, "not a JSON object");
  PT_RETURN_IF_ERROR(HfExpect(j, "model_type", nullptr, "llama", path, "a LLaMA"));
  PT_RETURN_IF_ERROR(CheckNumerics(j, path));
  PT_ASSIGN_OR_RETURN(const LlamaShape s, ParseShape(j, path));
  HfConfig c;
  c.spec.set_name("llama");
  c.spec.set_input_features(1);
  v1::EmbeddingSpec* e = c.spec.add_layers()->mutable_embedding();
  e->set_vocab_size(s.vocab);
  e->set_dim(s.hidden);
  e->set_context(s.positions);
  e->set_positions(v1::EmbeddingSpec::NONE);
  for (int64_t i = 0; i < s.layers; ++i) {
    v1::LlamaBlockSpec* b = c.spec.add_layers()->mutable_llama_block();
    b->set_heads(s.heads);
    b->set_kv_heads(s.kv_heads);
    b->set_hidden(s.intermediate);
    b->set_rope_theta(s.rope_theta);
    b->set_norm_eps(s.eps);
  }
  c.spec.add_layers()->mutable_rms_norm()->set_eps(s.eps);
  v1::LinearSpec* head = c.spec.add_layers()->mutable_linear();
  head->set_out_features(s.vocab);
  head->set_no_bias(true);
  c.spec.mutable_loss()->mutable_softmax_cross_entropy();
  if (j.value("tie_word_embeddings", false))
    c.aliases["lm_head.weight"] = "model.embed_tokens.weight";
  return c;
}

void AddRules(const std::string& prefix, int64_t l, const Rule* begin, const Rule* end,
              std::vector<HfTensorName>* out) {
  for (const Rule* r = begin; r != end; ++r) {
    out->push_back({absl::StrCat("layers.", l, ".", r->param), prefix + r->hf, false});
  }
}

std::vector<HfTensorName> TensorNames(const Model& model) {
  const int64_t n = model.num_layers();
  std::vector<HfTensorName> out;
  AddRules("model.", 0, std::begin(kEmbeddingRules), std::end(kEmbeddingRules), &out);
  for (int64_t l = 1; l < n - 2; ++l) {
    AddRules(absl::StrCat("model.layers.", l - 1, "."), l, std::begin(kBlockRules),
             std::end(kBlockRules), &out);
  }
  AddRules("model.", n - 2, std::begin(kFinalNormRules), std::end(kFinalNormRules), &out);
  if (!model.tie().has_value()) {
    AddRules("", n - 1, std::begin(kHeadRules), std::end(kHeadRules), &out);
  }
  return out;
}

// The rotary inverse-frequency buffers older transformers versions saved with every layer.
bool Ignored(absl::string_view name) {
  return absl::StartsWith(name, "model.layers.") &&
         absl::EndsWith(name, ".self_attn.rotary_emb.inv_freq");
}

}  // namespace hf_llama
}  // namespace

const HfArchitecture& LlamaArchitecture() {
  static const HfArchitecture llama{"llama",
                                    &hf_llama::Check,
                                    &hf_llama::Config,
                                    &hf_llama::Describe,
                                    &hf_llama::ParseConfig,
                                    &hf_llama::TensorNames,
                                    &hf_llama::Ignored};
  return llama;
}

}  // namespace pipetrain::model
