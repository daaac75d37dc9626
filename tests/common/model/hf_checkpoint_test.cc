#include "common/model/hf_checkpoint.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "common/io/file_util.h"
#include "common/io/safetensors.h"
#include "common/model/checkpoint.h"
#include "common/model/hf_gpt2.h"
#include "common/model/hf_llama.h"
#include "common/model/reference_trainer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/common/model/test_models.h"

namespace pipetrain::model {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using json = nlohmann::json;
namespace fs = std::filesystem;

// testing::kGptSpec with GPT-2's head (no bias).
constexpr char kGpt2Spec[] = R"pb(
  name: "gpt"
  input_features: 1
  layers { embedding { vocab_size: 11 dim: 8 context: 4 } }
  layers { transformer_block { heads: 2 } }
  layers { transformer_block { heads: 2 } }
  layers { layer_norm {} }
  layers { linear { out_features: 11 no_bias: true } }
  loss { softmax_cross_entropy {} }
)pb";

// A LLaMA: rotary positions (no position table), 4 query heads sharing 2 kv heads, SwiGLU,
// RMSNorm, a bias-free head.
constexpr char kLlamaSpec[] = R"pb(
  name: "llama"
  input_features: 1
  layers { embedding { vocab_size: 11 dim: 16 context: 4 positions: NONE } }
  layers { llama_block { heads: 4 kv_heads: 2 hidden: 24 } }
  layers { llama_block { heads: 4 kv_heads: 2 hidden: 24 } }
  layers { rms_norm {} }
  layers { linear { out_features: 11 no_bias: true } }
  loss { softmax_cross_entropy {} }
)pb";

std::string ReadAll(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

void WriteAll(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

class HfCheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) /
           absl::StrCat("hf_", ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  std::string Dir(const std::string& sub) const { return (dir_ / sub).string(); }

  // A checkpoint of 3 AdamW steps of `spec` saved into Dir("ckpt"), loaded back.
  LoadedCheckpoint Trained(const char* spec, const std::string& optimizer = "adamw") {
    auto model = testing::BuildOrDie(spec);
    TrainerOptions o;
    o.microbatches = 2;
    o.seed = 5;
    o.optimizer = math::ParseOptimizerConfig(optimizer).value();
    auto trainer = ReferenceTrainer::Create(model.get(), o);
    EXPECT_TRUE(trainer.ok()) << trainer.status();
    for (int s = 0; s < 3; ++s) {
      EXPECT_TRUE((*trainer)->Step(testing::MakeBatch(*model, 4, s)).ok());
    }
    CheckpointManifest m;
    m.step = 3;
    m.model_spec = model->spec();
    m.optimizer = math::FormatOptimizerConfig(o.optimizer);
    m.seed = 5;
    m.data = "synthetic";
    m.batch_size = 4;
    m.microbatches = 2;
    m.data_cursor = {1, 3};
    m.isa = "x86-64-v3";
    m.shards = LayerShards(*model, 0, model->num_layers());
    EXPECT_TRUE(SaveCheckpoint(Dir("ckpt"), m, (*trainer)->ExportState()).ok());
    auto loaded = LoadCheckpoint(Dir("ckpt"));
    EXPECT_TRUE(loaded.ok()) << loaded.status();
    return *std::move(loaded);
  }

  // Expects every file of Dir("ckpt") byte-identical in Dir(sub); how many there are.
  int SameFilesAsCheckpoint(const std::string& sub) const {
    int files = 0;
    for (const auto& e : fs::directory_iterator(dir_ / "ckpt")) {
      ++files;
      const std::string name = e.path().filename();
      EXPECT_EQ(ReadAll(Dir(sub + "/" + name)), ReadAll(e.path().string())) << name;
    }
    return files;
  }

  // Exports Trained(kGpt2Spec) into Dir("hf").
  void ExportGpt2() {
    const absl::Status s = ExportHfCheckpoint(Trained(kGpt2Spec), "abcdefghijk", Dir("hf"));
    ASSERT_TRUE(s.ok()) << s;
  }

  // Rewrites Dir("hf")/model.safetensors with `edit` applied to its tensors.
  void EditWeights(const std::function<void(std::map<std::string, math::Tensor>*)>& edit) {
    const std::string path = Dir("hf/model.safetensors");
    auto file = io::ReadSafetensors(path);
    ASSERT_TRUE(file.ok()) << file.status();
    edit(&file->tensors);
    ASSERT_TRUE(io::WriteSafetensors(path, file->tensors, file->metadata).ok());
  }

  void EditConfig(const std::function<void(json*)>& edit) {
    json j = json::parse(ReadAll(Dir("hf/config.json")));
    edit(&j);
    WriteAll(Dir("hf/config.json"), j.dump(2));
  }

  fs::path dir_;
};

TEST_F(HfCheckpointTest, TensorsGetGpt2NamesAndConv1DWeightsAreTransposed) {
  const LoadedCheckpoint ckpt = Trained(kGpt2Spec);
  auto model = testing::BuildOrDie(kGpt2Spec);
  auto hf = ToHfTensors(*model, ckpt.tensors);
  ASSERT_TRUE(hf.ok()) << hf.status();
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const auto& [name, t] : *hf) shapes[name] = t.shape;
  std::map<std::string, std::vector<int64_t>> want = {{"transformer.wte.weight", {11, 8}},
                                                      {"transformer.wpe.weight", {4, 8}},
                                                      {"transformer.ln_f.weight", {8}},
                                                      {"transformer.ln_f.bias", {8}},
                                                      {"lm_head.weight", {11, 8}}};
  for (int i = 0; i < 2; ++i) {
    const std::string h = absl::StrCat("transformer.h.", i, ".");
    want[h + "ln_1.weight"] = {8};
    want[h + "ln_1.bias"] = {8};
    want[h + "attn.c_attn.weight"] = {8, 24};
    want[h + "attn.c_attn.bias"] = {24};
    want[h + "attn.c_proj.weight"] = {8, 8};
    want[h + "attn.c_proj.bias"] = {8};
    want[h + "ln_2.weight"] = {8};
    want[h + "ln_2.bias"] = {8};
    want[h + "mlp.c_fc.weight"] = {8, 32};
    want[h + "mlp.c_fc.bias"] = {32};
    want[h + "mlp.c_proj.weight"] = {32, 8};
    want[h + "mlp.c_proj.bias"] = {8};
  }
  EXPECT_EQ(shapes, want);
  // Conv1D [in, out] = pipetrain's [out, in] transposed; lm_head (nn.Linear) and the rest as-is.
  const math::Tensor& qkv = ckpt.tensors.at("layers.2.attn.qkv.weight");
  const math::Tensor& c_attn = hf->at("transformer.h.1.attn.c_attn.weight");
  for (int out = 0; out < 24; ++out) {
    for (int in = 0; in < 8; ++in) ASSERT_EQ(c_attn.data[in * 24 + out], qkv.data[out * 8 + in]);
  }
  const math::Tensor& fc2 = ckpt.tensors.at("layers.1.mlp.proj.weight");     // [8, 32]
  const math::Tensor& c_proj = hf->at("transformer.h.0.mlp.c_proj.weight");  // [32, 8]
  EXPECT_EQ(c_proj.data[5 * 8 + 3], fc2.data[3 * 32 + 5]);
  EXPECT_EQ(hf->at("lm_head.weight").data, ckpt.tensors.at("layers.4.weight").data);
  EXPECT_EQ(hf->at("transformer.wte.weight").data, ckpt.tensors.at("layers.0.token.weight").data);
  EXPECT_EQ(hf->at("transformer.ln_f.bias").data, ckpt.tensors.at("layers.3.bias").data);
}

TEST_F(HfCheckpointTest, TheExportHoldsAGpt2ConfigAVocabularyAndTheSidecar) {
  ExportGpt2();
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(dir_ / "hf")) files.push_back(e.path().filename());
  std::sort(files.begin(), files.end());
  EXPECT_THAT(files, ElementsAre("config.json", "model.safetensors", "pipetrain_manifest.json",
                                 "pipetrain_optimizer.safetensors", "vocab.json"));
  const json c = json::parse(ReadAll(Dir("hf/config.json")));
  EXPECT_EQ(c["model_type"], "gpt2");
  EXPECT_EQ(c["architectures"], json::array({"GPT2LMHeadModel"}));
  EXPECT_EQ(c["vocab_size"], 11);
  EXPECT_EQ(c["n_positions"], 4);
  EXPECT_EQ(c["n_embd"], 8);
  EXPECT_EQ(c["n_layer"], 2);
  EXPECT_EQ(c["n_head"], 2);
  EXPECT_EQ(c["n_inner"], 32);
  EXPECT_EQ(c["activation_function"], "gelu_new");
  EXPECT_EQ(c["layer_norm_epsilon"].get<double>(), 1e-5);
  EXPECT_EQ(c["tie_word_embeddings"], false);
  EXPECT_EQ(c["resid_pdrop"], 0.0);
  const json v = json::parse(ReadAll(Dir("hf/vocab.json")));
  EXPECT_EQ(v.size(), 11u);
  EXPECT_EQ(v["a"], 0);
  EXPECT_EQ(v["k"], 10);
  // transformers refuses a safetensors file without {"format": "pt"}.
  auto weights = io::ReadSafetensors(Dir("hf/model.safetensors"));
  ASSERT_TRUE(weights.ok()) << weights.status();
  EXPECT_EQ(weights->metadata.at("format"), "pt");
  // The sidecar manifest is the checkpoint's manifest.json byte for byte.
  EXPECT_EQ(ReadAll(Dir("hf/pipetrain_manifest.json")), ReadAll(Dir("ckpt/manifest.json")));
}

TEST_F(HfCheckpointTest, ImportOfTheExportIsByteIdenticalToTheCheckpoint) {
  for (const std::string optimizer : {"adamw", "sgd:lr=0.1,momentum=0.9", "sgd:lr=0.1"}) {
    SCOPED_TRACE(optimizer);
    fs::remove_all(dir_);
    ASSERT_TRUE(ExportHfCheckpoint(Trained(kGpt2Spec, optimizer), "", Dir("hf")).ok());
    EXPECT_EQ(fs::exists(Dir("hf/pipetrain_optimizer.safetensors")), optimizer != "sgd:lr=0.1");
    EXPECT_FALSE(fs::exists(Dir("hf/vocab.json")));
    auto imported = ImportHfCheckpoint(Dir("hf"));
    ASSERT_TRUE(imported.ok()) << imported.status();
    EXPECT_TRUE(imported->exact);
    ASSERT_TRUE(SaveCheckpoint(Dir("back"), imported->manifest, imported->tensors).ok());
    std::vector<std::string> files;
    for (const auto& e : fs::directory_iterator(dir_ / "ckpt")) {
      files.push_back(e.path().filename());
      EXPECT_EQ(ReadAll(Dir("back/" + files.back())), ReadAll(e.path().string())) << files.back();
    }
    EXPECT_EQ(files.size(), 6u);  // the manifest and five layer files
    EXPECT_EQ(std::distance(fs::directory_iterator(dir_ / "back"), fs::directory_iterator()), 6);
  }
}

TEST_F(HfCheckpointTest, ModelsWithoutAGpt2EquivalentAreRefusedNamingWhy) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {testing::kGptSpec, "layer 4 (linear): has a bias, but GPT-2's lm_head has none"},
      {absl::StrReplaceAll(kGpt2Spec, {{"out_features: 11", "out_features: 5"}}),
       "layer 4 (linear): outputs 5 classes, but GPT-2's lm_head outputs the embedding's "
       "vocab_size 11"},
      {absl::StrReplaceAll(kGpt2Spec,
                           {{"layers { transformer_block { heads: 2 } }\n  layers { layer_norm",
                             "layers { transformer_block { heads: 4 } }\n  layers { layer_norm"}}),
       "layer 2 (transformer_block): heads 4 and MLP width 32 differ from layer 1's 2 and 32"},
      {absl::StrReplaceAll(kGpt2Spec,
                           {{"layers { transformer_block { heads: 2 } }\n  layers { layer_norm",
                             "layers { transformer_block { heads: 2 mlp_ratio: 2 } }\n  layers { "
                             "layer_norm"}}),
       "one n_head and n_inner for every block"},
      {absl::StrReplaceAll(kGpt2Spec, {{"layer_norm {}", "layer_norm { eps: 1e-6 }"}}),
       "layer 3 (layer_norm): eps 1e-06 differs from the transformer blocks' 1e-05"},
      {absl::StrReplaceAll(kGpt2Spec, {{"layers { transformer_block { heads: 2 } }\n  layers { "
                                        "layer_norm",
                                        "layers { gelu {} }\n  layers { layer_norm"}}),
       "layer 2 (gelu): GPT-2 has only transformer blocks between embedding and layer_norm"},
      {absl::StrReplaceAll(kGpt2Spec, {{"layers { layer_norm {} }", "layers { gelu {} }"}}),
       "layer 3 (gelu): GPT-2 ends with a layer_norm (ln_f)"},
      {absl::StrReplaceAll(kGpt2Spec, {{"linear { out_features: 11 no_bias: true }",
                                        "linear { out_features: 11 no_bias: true } }\n  layers { "
                                        "relu {}"}}),
       "layer 5 (relu): GPT-2's last layer is the lm_head, a linear"},
      {absl::StrReplaceAll(kGpt2Spec, {{"softmax_cross_entropy", "mse"}}),
       "the model's loss is not softmax_cross_entropy"},
      {testing::kMlpSpec, "layer 0 (linear): GPT-2 starts with an embedding"},
  };
  for (const auto& [spec, message] : cases) {
    SCOPED_TRACE(spec);
    auto model = testing::BuildOrDie(spec.c_str());
    auto arch = HfArchitectureOf(*model);
    ASSERT_FALSE(arch.ok());
    EXPECT_EQ(arch.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(arch.status().message(), HasSubstr(message));
    EXPECT_THAT(arch.status().message(), HasSubstr("GPT-2's layers are an embedding"));
    // Export says the same, writing nothing.
    LoadedCheckpoint ckpt;
    ckpt.manifest.model_spec = model->spec();
    const absl::Status s = ExportHfCheckpoint(ckpt, "", Dir("refused"));
    EXPECT_THAT(s.message(), HasSubstr(message));
    EXPECT_FALSE(fs::exists(Dir("refused")));
  }
}

TEST_F(HfCheckpointTest, ExportRefusesADirectoryHoldingOtherFilesAndATooLargeVocabulary) {
  fs::create_directories(Dir("hf"));
  WriteAll(Dir("hf/notes.txt"), "mine");
  const LoadedCheckpoint ckpt = Trained(kGpt2Spec);
  absl::Status s = ExportHfCheckpoint(ckpt, "", Dir("hf"));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("holds 'notes.txt', which an export does not write"));
  EXPECT_EQ(ReadAll(Dir("hf/notes.txt")), "mine");
  s = ExportHfCheckpoint(ckpt, "abcdefghijkl", Dir("hf2"));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("the data set has 12 tokens, more than the model's vocab_size "
                                     "11"));
  // An earlier export is replaced as a whole.
  ASSERT_TRUE(ExportHfCheckpoint(ckpt, "abc", Dir("hf3")).ok());
  ASSERT_TRUE(ExportHfCheckpoint(ckpt, "", Dir("hf3")).ok());
  EXPECT_FALSE(fs::exists(Dir("hf3/vocab.json")));
}

TEST_F(HfCheckpointTest, ImportRefusesMissingWrongAndUnknownTensors) {
  ExportGpt2();
  const std::string weights = Dir("hf/model.safetensors");
  const std::string original = ReadAll(weights);
  struct Case {
    std::function<void(std::map<std::string, math::Tensor>*)> edit;
    absl::StatusCode code;
    std::string message;
  };
  const std::vector<Case> cases = {
      {[](auto* t) { t->erase("lm_head.weight"); }, absl::StatusCode::kNotFound,
       "model.safetensors: tensor 'lm_head.weight' is missing (gpt2's for pipetrain's "
       "layers.4.weight)"},
      {[](auto* t) { t->erase("transformer.h.1.mlp.c_fc.bias"); }, absl::StatusCode::kNotFound,
       "tensor 'transformer.h.1.mlp.c_fc.bias' is missing"},
      {[](auto* t) {
         (*t)["transformer.wpe.weight"] = {{5, 8}, std::vector<float>(40)};
       },
       absl::StatusCode::kInvalidArgument,
       "tensor 'transformer.wpe.weight' has shape [5, 8]; the model config.json describes needs "
       "[4, 8]"},
      {[](auto* t) {  // pipetrain's layout instead of Conv1D's
         (*t)["transformer.h.0.attn.c_attn.weight"].shape = {24, 8};
       },
       absl::StatusCode::kInvalidArgument,
       "tensor 'transformer.h.0.attn.c_attn.weight' has shape [24, 8]; the model config.json "
       "describes needs [8, 24]"},
      {[](auto* t) {
         (*t)["transformer.ln_f.weight"].data[3] = std::numeric_limits<float>::quiet_NaN();
       },
       absl::StatusCode::kInvalidArgument, "tensor 'transformer.ln_f.weight' element 3 is nan"},
      {[](auto* t) {
         (*t)["transformer.h.0.attn.rotary"] = {{2}, {0, 0}};
       },
       absl::StatusCode::kInvalidArgument,
       "tensor 'transformer.h.0.attn.rotary' is not a parameter of the gpt2 model"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.message);
    WriteAll(weights, original);
    EditWeights(c.edit);
    auto imported = ImportHfCheckpoint(Dir("hf"));
    ASSERT_FALSE(imported.ok());
    EXPECT_EQ(imported.status().code(), c.code);
    EXPECT_THAT(imported.status().message(), HasSubstr(c.message));
  }
  // The causal-mask buffers older transformers saved are ignored.
  WriteAll(weights, original);
  EditWeights([](auto* t) {
    (*t)["transformer.h.1.attn.bias"] = {{1, 1, 4, 4}, std::vector<float>(16)};
  });
  EXPECT_TRUE(ImportHfCheckpoint(Dir("hf")).ok());
  // A dtype the reader does not convert (I32 has F32's size, so only the label changes).
  std::string bytes = original;
  bytes.replace(bytes.find("\"F32\""), 5, "\"I32\"");
  WriteAll(weights, bytes);
  auto imported = ImportHfCheckpoint(Dir("hf"));
  EXPECT_EQ(imported.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(imported.status().message(), HasSubstr("dtype I32 is not supported"));
  fs::remove(weights);
  EXPECT_EQ(ImportHfCheckpoint(Dir("hf")).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(HfCheckpointTest, ImportRefusesConfigsPipetrainCannotRun) {
  ExportGpt2();
  const std::string original = ReadAll(Dir("hf/config.json"));
  const std::vector<std::pair<std::function<void(json*)>, std::string>> cases = {
      {[](json* j) { (*j)["model_type"] = "mistral"; },
       "config.json: model_type 'mistral' is not one pipetrain imports (gpt2, llama)"},
      {[](json* j) { (*j)["activation_function"] = "relu"; },
       "'activation_function' is 'relu'; pipetrain's GELU is the tanh approximation"},
      {[](json* j) { (*j)["layer_norm_epsilon"] = 1e-6; },
       "'layer_norm_epsilon' is 1e-06; pipetrain's transformer blocks use 1e-05"},
      {[](json* j) { (*j)["scale_attn_by_inverse_layer_idx"] = true; },
       "'scale_attn_by_inverse_layer_idx' is true; pipetrain needs false"},
      {[](json* j) { (*j)["n_inner"] = 20; }, "'n_inner' 20 is not a multiple of 'n_embd' 8"},
      {[](json* j) { j->erase("n_head"); }, "'n_head' missing or not a positive integer"},
      {[](json* j) { (*j)["n_head"] = 3; }, "heads 3 must divide dim 8"},
      // The sidecar's model is not the one config.json describes.
      {[](json* j) { (*j)["n_layer"] = 3; },
       "describes vocab_size 11, n_positions 4, n_embd 8, n_layer 3, n_head 2, n_inner 32, but "
       "the model of"},
  };
  for (const auto& [edit, message] : cases) {
    SCOPED_TRACE(message);
    WriteAll(Dir("hf/config.json"), original);
    EditConfig(edit);
    auto imported = ImportHfCheckpoint(Dir("hf"));
    ASSERT_FALSE(imported.ok());
    EXPECT_EQ(imported.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(imported.status().message(), HasSubstr(message));
  }
  fs::remove(Dir("hf/config.json"));
  EXPECT_EQ(ImportHfCheckpoint(Dir("hf")).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(HfCheckpointTest, ImportRefusesASidecarWithMissingOrForeignOptimizerState) {
  ExportGpt2();
  const std::string path = Dir("hf/pipetrain_optimizer.safetensors");
  auto state = io::ReadSafetensors(path);
  ASSERT_TRUE(state.ok());
  auto missing = state->tensors;
  missing.erase("optim.1.attn.qkv.weight.exp_avg_sq");
  ASSERT_TRUE(io::WriteSafetensors(path, missing, state->metadata).ok());
  auto imported = ImportHfCheckpoint(Dir("hf"));
  EXPECT_EQ(imported.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(imported.status().message(), HasSubstr("optim.1.attn.qkv.weight.exp_avg_sq"));
  EXPECT_THAT(imported.status().message(), HasSubstr("(optimizer adamw)"));
  auto extra = state->tensors;
  extra["optim.1.attn.qkv.weight.momentum_buffer"] = extra["optim.1.attn.qkv.weight.exp_avg"];
  ASSERT_TRUE(io::WriteSafetensors(path, extra, state->metadata).ok());
  imported = ImportHfCheckpoint(Dir("hf"));
  EXPECT_EQ(imported.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(
      imported.status().message(),
      HasSubstr("'optim.1.attn.qkv.weight.momentum_buffer' is not state of optimizer adamw"));
  // State of another step (another export's).
  ASSERT_TRUE(io::WriteSafetensors(path, state->tensors, {{"step", "2"}}).ok());
  imported = ImportHfCheckpoint(Dir("hf"));
  EXPECT_EQ(imported.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(
      imported.status().message(),
      HasSubstr("the optimizer state of step '2', but pipetrain_manifest.json is of step 3"));
}

TEST_F(HfCheckpointTest, WithoutTheSidecarImportStartsAFreshRunFromTheWeights) {
  ExportGpt2();
  fs::remove(Dir("hf/pipetrain_manifest.json"));
  fs::remove(Dir("hf/pipetrain_optimizer.safetensors"));
  // As a tied GPT-2 saves it: no lm_head.weight, the head is wte.
  EditConfig([](json* j) { (*j)["tie_word_embeddings"] = true; });
  EditWeights([](auto* t) { t->erase("lm_head.weight"); });
  auto imported = ImportHfCheckpoint(Dir("hf"));
  ASSERT_TRUE(imported.ok()) << imported.status();
  EXPECT_FALSE(imported->exact);
  const CheckpointManifest& m = imported->manifest;
  EXPECT_EQ(m.step, 0);
  EXPECT_EQ(m.seed, 0u);
  EXPECT_EQ(m.data, "");
  EXPECT_EQ(m.optimizer, math::FormatOptimizerConfig(math::OptimizerConfig()));
  EXPECT_EQ(m.model_spec.layers_size(), 5);
  const LoadedCheckpoint ckpt = *LoadCheckpoint(Dir("ckpt"));
  EXPECT_EQ(imported->tensors.at("layers.4.weight").data,
            ckpt.tensors.at("layers.0.token.weight").data);
  EXPECT_EQ(imported->tensors.at("layers.2.mlp.proj.weight").data,
            ckpt.tensors.at("layers.2.mlp.proj.weight").data);
  for (float x : imported->tensors.at("optim.2.mlp.proj.weight.exp_avg").data) ASSERT_EQ(x, 0.0f);
  ASSERT_TRUE(SaveCheckpoint(Dir("fresh"), m, imported->tensors).ok());
  EXPECT_TRUE(VerifyCheckpoint(Dir("fresh")).ok());
}

TEST_F(HfCheckpointTest, LlamaTensorsGetHfNamesUntransposed) {
  const LoadedCheckpoint ckpt = Trained(kLlamaSpec);
  auto model = testing::BuildOrDie(kLlamaSpec);
  auto arch = HfArchitectureOf(*model);
  ASSERT_TRUE(arch.ok()) << arch.status();
  EXPECT_STREQ((*arch)->model_type, "llama");
  auto hf = ToHfTensors(*model, ckpt.tensors);
  ASSERT_TRUE(hf.ok()) << hf.status();
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const auto& [name, t] : *hf) shapes[name] = t.shape;
  std::map<std::string, std::vector<int64_t>> want = {{"model.embed_tokens.weight", {11, 16}},
                                                      {"model.norm.weight", {16}},
                                                      {"lm_head.weight", {11, 16}}};
  for (int i = 0; i < 2; ++i) {
    const std::string h = absl::StrCat("model.layers.", i, ".");
    want[h + "input_layernorm.weight"] = {16};
    want[h + "self_attn.q_proj.weight"] = {16, 16};
    want[h + "self_attn.k_proj.weight"] = {8, 16};  // 2 kv heads of width 4
    want[h + "self_attn.v_proj.weight"] = {8, 16};
    want[h + "self_attn.o_proj.weight"] = {16, 16};
    want[h + "post_attention_layernorm.weight"] = {16};
    want[h + "mlp.gate_proj.weight"] = {24, 16};
    want[h + "mlp.up_proj.weight"] = {24, 16};
    want[h + "mlp.down_proj.weight"] = {16, 24};
  }
  EXPECT_EQ(shapes, want);
  // nn.Linear [out, in] like pipetrain; q and k keep their rows (both use rotate-half pairs).
  EXPECT_EQ(hf->at("model.layers.1.self_attn.q_proj.weight").data,
            ckpt.tensors.at("layers.2.attn.q.weight").data);
  EXPECT_EQ(hf->at("model.layers.0.self_attn.k_proj.weight").data,
            ckpt.tensors.at("layers.1.attn.k.weight").data);
  EXPECT_EQ(hf->at("model.layers.0.mlp.down_proj.weight").data,
            ckpt.tensors.at("layers.1.mlp.down.weight").data);
  EXPECT_EQ(hf->at("model.norm.weight").data, ckpt.tensors.at("layers.3.weight").data);
  EXPECT_EQ(hf->at("lm_head.weight").data, ckpt.tensors.at("layers.4.weight").data);
}

TEST_F(HfCheckpointTest, LlamaExportHoldsALlamaConfigAndImportsBackByteForByte) {
  ASSERT_TRUE(ExportHfCheckpoint(Trained(kLlamaSpec), "abcdefghijk", Dir("hf")).ok());
  const json c = json::parse(ReadAll(Dir("hf/config.json")));
  EXPECT_EQ(c["model_type"], "llama");
  EXPECT_EQ(c["architectures"], json::array({"LlamaForCausalLM"}));
  EXPECT_EQ(c["vocab_size"], 11);
  EXPECT_EQ(c["max_position_embeddings"], 4);
  EXPECT_EQ(c["hidden_size"], 16);
  EXPECT_EQ(c["intermediate_size"], 24);
  EXPECT_EQ(c["num_hidden_layers"], 2);
  EXPECT_EQ(c["num_attention_heads"], 4);
  EXPECT_EQ(c["num_key_value_heads"], 2);
  EXPECT_EQ(c["head_dim"], 4);
  EXPECT_EQ(c["hidden_act"], "silu");
  EXPECT_EQ(c["rms_norm_eps"].get<double>(), 1e-5);  // the decimal, not float(1e-5) widened
  EXPECT_EQ(c["rope_theta"].get<double>(), 10000.0);
  EXPECT_EQ(c["tie_word_embeddings"], false);
  EXPECT_TRUE(c["rope_scaling"].is_null());
  auto imported = ImportHfCheckpoint(Dir("hf"));
  ASSERT_TRUE(imported.ok()) << imported.status();
  EXPECT_TRUE(imported->exact);
  ASSERT_TRUE(SaveCheckpoint(Dir("back"), imported->manifest, imported->tensors).ok());
  EXPECT_EQ(SameFilesAsCheckpoint("back"), 6);
  // Without the sidecar: the model config.json describes, with the same weights.
  fs::remove(Dir("hf/pipetrain_manifest.json"));
  fs::remove(Dir("hf/pipetrain_optimizer.safetensors"));
  auto fresh = ImportHfCheckpoint(Dir("hf"));
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  EXPECT_FALSE(fresh->exact);
  auto rebuilt = Model::Build(fresh->manifest.model_spec);
  ASSERT_TRUE(rebuilt.ok()) << rebuilt.status();
  auto original = testing::BuildOrDie(kLlamaSpec);
  EXPECT_EQ(*LlamaArchitecture().describe(**rebuilt), *LlamaArchitecture().describe(*original));
  const LoadedCheckpoint ckpt = *LoadCheckpoint(Dir("ckpt"));
  for (const auto& [name, t] : ckpt.tensors) {
    if (name.rfind("layers.", 0) == 0) {
      EXPECT_EQ(fresh->tensors.at(name).data, t.data) << name;
    }
  }
}

TEST_F(HfCheckpointTest, TiedLlamaExportsWithoutLmHeadAndImportsBackByteForByte) {
  // kLlamaSpec with its head tied to the embedding's token table.
  const std::string tied = absl::StrCat("tie_embeddings: true\n", kLlamaSpec);
  ASSERT_TRUE(ExportHfCheckpoint(Trained(tied.c_str()), "abcdefghijk", Dir("hf")).ok());
  const json c = json::parse(ReadAll(Dir("hf/config.json")));
  EXPECT_EQ(c["tie_word_embeddings"], true);
  auto file = io::ReadSafetensors(Dir("hf/model.safetensors"));
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->tensors.count("lm_head.weight"), 0u);
  EXPECT_EQ(file->tensors.count("model.embed_tokens.weight"), 1u);
  auto imported = ImportHfCheckpoint(Dir("hf"));
  ASSERT_TRUE(imported.ok()) << imported.status();
  EXPECT_TRUE(imported->exact);
  EXPECT_TRUE(imported->manifest.model_spec.tie_embeddings());
  ASSERT_TRUE(SaveCheckpoint(Dir("back"), imported->manifest, imported->tensors).ok());
  // The manifest and layers 0-3: the tied head has no file of its own.
  EXPECT_EQ(SameFilesAsCheckpoint("back"), 5);
}

TEST_F(HfCheckpointTest, ModelsWithoutALlamaEquivalentAreRefusedNamingWhy) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {absl::StrReplaceAll(kLlamaSpec, {{" positions: NONE", ""}}),
       "layer 0 (embedding): has a learned position table, but LLaMA's positions are rotary"},
      {absl::StrReplaceAll(kLlamaSpec, {{"heads: 4 kv_heads: 2 hidden: 24 } }\n  layers { rms",
                                         "heads: 4 kv_heads: 1 hidden: 24 } }\n  layers { rms"}}),
       "layer 2 (llama_block): heads 4, kv_heads 1, hidden 24, norm_eps 1e-05 and rope_theta "
       "10000 differ from layer 1's 4, 2, 24, 1e-05 and 10000"},
      {absl::StrReplaceAll(kLlamaSpec, {{"rms_norm {}", "rms_norm { eps: 1e-6 }"}}),
       "layer 3 (rms_norm): eps 1e-06 differs from the llama_blocks' norm_eps 1e-05"},
      {absl::StrReplaceAll(kLlamaSpec, {{"rms_norm {}", "layer_norm {}"}}),
       "layer 3 (layer_norm): LLaMA ends with an rms_norm (norm)"},
      {absl::StrReplaceAll(kLlamaSpec, {{" no_bias: true", ""}}),
       "layer 4 (linear): has a bias, but LLaMA's lm_head has none"},
      {kGpt2Spec, "layer 0 (embedding): has a learned position table"},
  };
  for (const auto& [spec, message] : cases) {
    SCOPED_TRACE(spec);
    auto model = testing::BuildOrDie(spec.c_str());
    const absl::Status s = LlamaArchitecture().check(*model);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(s.message(), HasSubstr(message));
    EXPECT_THAT(s.message(), HasSubstr("LLaMA's layers are an embedding with positions: NONE"));
  }
  // GPT-2's check refuses a LLaMA (no position table) instead of reading one.
  auto llama = testing::BuildOrDie(kLlamaSpec);
  auto arch = HfArchitectureOf(*llama);
  ASSERT_TRUE(arch.ok());
  EXPECT_THAT(Gpt2Architecture().check(*llama).message(),
              HasSubstr("has no position table (positions: NONE), but GPT-2 learns one"));
}

TEST_F(HfCheckpointTest, ImportRefusesLlamaConfigsPipetrainCannotRun) {
  ASSERT_TRUE(ExportHfCheckpoint(Trained(kLlamaSpec), "", Dir("hf")).ok());
  fs::remove(Dir("hf/pipetrain_manifest.json"));
  fs::remove(Dir("hf/pipetrain_optimizer.safetensors"));
  const std::string original = ReadAll(Dir("hf/config.json"));
  const std::vector<std::pair<std::function<void(json*)>, std::string>> cases = {
      {[](json* j) { (*j)["hidden_act"] = "gelu"; },
       "'hidden_act' is \"gelu\"; pipetrain needs \"silu\""},
      {[](json* j) { (*j)["attention_bias"] = true; }, "'attention_bias' is true"},
      {[](json* j) {
         (*j)["rope_scaling"] = json{{"type", "linear"}, {"factor", 2.0}};
       },
       "'rope_scaling' is {\"factor\":2.0,\"type\":\"linear\"}; pipetrain needs null"},
      {[](json* j) { (*j)["head_dim"] = 8; }, "'head_dim' 8 is not 'hidden_size' / "},
      {[](json* j) { (*j)["num_key_value_heads"] = 3; },
       "'num_attention_heads' 4 must divide 'hidden_size' 16 and be a multiple of "
       "'num_key_value_heads' 3"},
      {[](json* j) { (*j)["rms_norm_eps"] = -1; }, "'rms_norm_eps' is -1"},
      {[](json* j) { j->erase("intermediate_size"); },
       "'intermediate_size' missing or not a positive integer"},
  };
  for (const auto& [edit, message] : cases) {
    SCOPED_TRACE(message);
    WriteAll(Dir("hf/config.json"), original);
    EditConfig(edit);
    auto imported = ImportHfCheckpoint(Dir("hf"));
    ASSERT_FALSE(imported.ok());
    EXPECT_EQ(imported.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(imported.status().message(), HasSubstr(message));
  }
  // Tied embeddings: no lm_head.weight, the head reads embed_tokens; older files' rotary buffers
  // are ignored.
  WriteAll(Dir("hf/config.json"), original);
  EditConfig([](json* j) { (*j)["tie_word_embeddings"] = true; });
  EditWeights([](auto* t) {
    t->erase("lm_head.weight");
    (*t)["model.layers.0.self_attn.rotary_emb.inv_freq"] = math::Tensor{{2}, {1.0f, 0.01f}};
  });
  auto tied = ImportHfCheckpoint(Dir("hf"));
  ASSERT_TRUE(tied.ok()) << tied.status();
  EXPECT_EQ(tied->tensors.at("layers.4.weight").data,
            tied->tensors.at("layers.0.token.weight").data);
}

}  // namespace
}  // namespace pipetrain::model
