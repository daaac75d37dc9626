#include "common/model/model.h"

#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/model/test_models.h"

namespace pipetrain::model {
namespace {

using ::testing::HasSubstr;

absl::Status BuildStatus(const std::string& text) {
  auto spec = ParseModelSpecText(text, "spec.textproto");
  if (!spec.ok()) return spec.status();
  return Model::Build(*spec).status();
}

TEST(ModelTest, BuildsMlpWithInferredShapes) {
  auto m = testing::BuildOrDie(testing::kMlpSpec);
  ASSERT_EQ(m->num_layers(), 6);
  EXPECT_EQ(m->input_features(), 6);
  EXPECT_EQ(m->output_features(), 4);
  EXPECT_EQ(m->tokens_per_sample(), 1);
  EXPECT_EQ(m->layer(2).in_features(), 8);
  EXPECT_EQ(m->NumParameters(), (6 * 8 + 8) + (8 + 8) + (8 * 8 + 8) + (8 * 4 + 4));
  const std::vector<double> flops = m->LayerFlops(2);
  ASSERT_EQ(flops.size(), 6u);
  // Linear 6->8 on 2 rows: F = 2*2*6*8 (+ bias), B-input and B-weight of the same order.
  EXPECT_GE(flops[0], 3 * 2.0 * 2 * 6 * 8 - 2.0 * 2 * 6 * 8);
}

TEST(ModelTest, BuildsGptWithContext) {
  auto m = testing::BuildOrDie(testing::kGptSpec);
  EXPECT_EQ(m->tokens_per_sample(), 4);
  EXPECT_EQ(m->output_features(), 11);
  EXPECT_EQ(m->layer(1).row_multiple(), 4);
}

TEST(ModelTest, BuildsLlamaWithDefaults) {
  auto spec = ParseModelSpecText(
      R"pb(input_features: 1
           layers { embedding { vocab_size: 11 dim: 64 context: 4 positions: NONE } }
           layers { llama_block { heads: 4 kv_heads: 2 } }
           layers { llama_block { heads: 8 hidden: 96 } }
           layers { llama_block { heads: 2 multiple_of: 32 } }
           layers { rms_norm {} }
           layers { linear { out_features: 11 no_bias: true } }
           loss { softmax_cross_entropy {} })pb",
      "llama");
  ASSERT_TRUE(spec.ok()) << spec.status();
  auto m = Model::Build(*spec);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ((*m)->tokens_per_sample(), 4);
  ASSERT_EQ((*m)->layer(0).params().size(), 1u);  // token.weight only
  // Shapes of a block's parameter by name.
  auto shape = [&](int64_t l, const std::string& name) {
    for (const math::ParamSpec& p : (*m)->layer(l).params()) {
      if (p.name == name) return p.shape;
    }
    return std::vector<int64_t>{};
  };
  EXPECT_EQ((*m)->layer(1).kind(), "llama_block");
  // LLaMA's hidden width: 256 * ceil(floor(8 * 64 / 3) / 256) = 256; with multiple_of 32: 192.
  EXPECT_EQ(shape(1, "mlp.gate.weight"), (std::vector<int64_t>{256, 64}));
  EXPECT_EQ(shape(1, "attn.k.weight"), (std::vector<int64_t>{32, 64}));  // 2 kv heads of 16
  EXPECT_EQ((*m)->layer(1).row_multiple(), 4);
  EXPECT_EQ(shape(2, "mlp.up.weight"), (std::vector<int64_t>{96, 64}));
  EXPECT_EQ(shape(2, "attn.v.weight"), (std::vector<int64_t>{64, 64}));  // kv_heads = heads
  EXPECT_EQ(shape(3, "mlp.down.weight"), (std::vector<int64_t>{64, 192}));
  EXPECT_EQ((*m)->layer(4).kind(), "rms_norm");
  EXPECT_EQ((*m)->layer(4).params().size(), 1u);
}

TEST(ModelTest, RejectsBadLlamaSpecsWithReasons) {
  const std::string emb =
      "input_features: 1 layers { embedding { vocab_size: 5 dim: 12 context: 2 } } ";
  auto llama = [&](const std::string& fields) {
    return BuildStatus(emb + "layers { llama_block { " + fields + " } } loss { mse {} }");
  };
  EXPECT_THAT(llama("heads: 5").message(),
              HasSubstr("layer 1 (llama_block): heads 5 must divide dim 12"));
  EXPECT_THAT(llama("heads: 4").message(), HasSubstr("head width dim / heads = 3 must be even"));
  EXPECT_THAT(llama("heads: 6 kv_heads: 4").message(), HasSubstr("kv_heads 4 must divide heads 6"));
  EXPECT_THAT(llama("heads: 2 kv_heads: -1").message(),
              HasSubstr("kv_heads -1 must be in [1, 16777216]"));
  EXPECT_THAT(llama("heads: 2 rope_theta: 1").message(),
              HasSubstr("rope_theta 1 must be finite and > 1"));
  EXPECT_THAT(llama("heads: 2 norm_eps: -1").message(),
              HasSubstr("norm_eps -1 must be finite and >= 0"));
  EXPECT_THAT(llama("heads: 2 hidden: -3").message(), HasSubstr("hidden -3 must be in"));
  EXPECT_THAT(llama("heads: 2 multiple_of: -3").message(), HasSubstr("multiple_of -3 must be in"));
  EXPECT_THAT(llama("heads: 2 context: 3").message(),
              HasSubstr("context 3 != embedding context 2"));
  EXPECT_THAT(llama("heads: 2 dim: 8").message(), HasSubstr("dim 8 != 12 (output of layer 0)"));
  EXPECT_THAT(BuildStatus("input_features: 8 layers { llama_block { heads: 2 } } "
                          "loss { mse {} }")
                  .message(),
              HasSubstr("layer 0 (llama_block): needs a context"));
  EXPECT_THAT(BuildStatus("input_features: 8 layers { rms_norm { features: 4 } } "
                          "loss { mse {} }")
                  .message(),
              HasSubstr("layer 0 (rms_norm): features 4 != 8 (model input_features)"));
  EXPECT_THAT(
      BuildStatus("input_features: 8 layers { rms_norm { eps: -1 } } loss { mse {} }").message(),
      HasSubstr("eps -1 must be finite and >= 0"));
  EXPECT_THAT(BuildStatus("input_features: 1 layers { embedding { vocab_size: 5 dim: 4 "
                          "context: 2 positions: 7 } } loss { mse {} }")
                  .message(),
              HasSubstr("positions 7 is not LEARNED (0) or NONE (1)"));
  ModelLimits small;
  small.max_activation_bytes = 1000;
  auto spec = ParseModelSpecText(
      "input_features: 8 layers { llama_block { heads: 2 context: 64 } } loss { mse {} }", "s");
  ASSERT_TRUE(spec.ok());
  EXPECT_THAT(Model::Build(*spec, small).status().message(),
              HasSubstr("layer 0 (llama_block): the attention scores of one sample (heads 2 x "
                        "context 64^2 floats)"));
}

TEST(ModelTest, ShapeMismatchNamesLayerAndBothSizes) {
  EXPECT_THAT(BuildStatus(R"pb(input_features: 4
                               layers { linear { out_features: 256 } }
                               layers { relu {} }
                               layers { linear { in_features: 128 out_features: 3 } }
                               loss { mse {} })pb")
                  .message(),
              HasSubstr("layer 2 (linear): in_features 128 != 256 (output of layer 1)"));
  EXPECT_THAT(BuildStatus(R"pb(input_features: 4
                               layers { layer_norm { features: 5 } }
                               loss { mse {} })pb")
                  .message(),
              HasSubstr("layer 0 (layer_norm): features 5 != 4 (model input_features)"));
}

TEST(ModelTest, RejectsBadSpecsWithReasons) {
  EXPECT_THAT(BuildStatus("input_features: 4 loss { mse {} }").message(), HasSubstr("no layers"));
  EXPECT_THAT(BuildStatus("input_features: 4 layers { linear { out_features: 3 } }").message(),
              HasSubstr("no loss"));
  EXPECT_THAT(BuildStatus("layers { relu {} } loss { mse {} }").message(),
              HasSubstr("input_features 0"));
  EXPECT_THAT(BuildStatus("input_features: 4 layers { linear { } } loss { mse {} }").message(),
              HasSubstr("layer 0 (linear): out_features 0"));
  EXPECT_THAT(BuildStatus("input_features: 4 layers { } loss { mse {} }").message(),
              HasSubstr("layer 0 (unset): no layer kind set"));
  EXPECT_THAT(BuildStatus("input_features: 3 layers { embedding { vocab_size: 5 dim: 4 "
                          "context: 2 } } loss { mse {} }")
                  .message(),
              HasSubstr("takes one token id per row"));
  EXPECT_THAT(BuildStatus("input_features: 1 layers { embedding { vocab_size: 5 dim: 6 "
                          "context: 2 } } layers { transformer_block { heads: 4 } } "
                          "loss { mse {} }")
                  .message(),
              HasSubstr("heads 4 must divide dim 6"));
  EXPECT_THAT(BuildStatus("input_features: 8 layers { transformer_block { heads: 2 } } "
                          "loss { mse {} }")
                  .message(),
              HasSubstr("needs a context"));
  EXPECT_THAT(BuildStatus("input_features: 8 layers { linear { out_features: 1 } } "
                          "loss { softmax_cross_entropy {} }")
                  .message(),
              HasSubstr("at least 2 classes"));
  EXPECT_THAT(BuildStatus("input_features: 8 layers { linear { out_features: 100000000 } } "
                          "loss { mse {} }")
                  .message(),
              HasSubstr("out_features 100000000 must be in [1, 16777216]"));
}

// ----- Limits: an oversized spec is refused before anything is allocated -------------------

absl::StatusOr<std::unique_ptr<Model>> BuildWith(const std::string& text,
                                                 const ModelLimits& limits) {
  auto spec = ParseModelSpecText(text, "spec.textproto");
  if (!spec.ok()) return spec.status();
  return Model::Build(*spec, limits);
}

// Expects RESOURCE_EXHAUSTED with `message` in it.
void ExpectExhausted(const absl::Status& s, const std::string& message) {
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_THAT(s.message(), HasSubstr(message));
}

// The fault campaign's model: a layer of 2^30 weights (and its 2^10 biases).
constexpr char kGiantLinearSpec[] = R"pb(input_features: 64
                                         layers { linear { out_features: 1024 } }
                                         layers { relu {} }
                                         layers { linear { out_features: 1048576 } }
                                         loss { mse {} })pb";

TEST(ModelLimitsTest, DefaultBudgetIsAtMost16GiB) {
  EXPECT_GT(DefaultMemoryBudget(), 0);
  EXPECT_LE(DefaultMemoryBudget(), int64_t{16} << 30);
  EXPECT_EQ(ModelLimits().max_parameter_bytes, DefaultMemoryBudget());
  EXPECT_EQ(ModelLimits().max_activation_bytes, DefaultMemoryBudget());
}

TEST(ModelLimitsTest, LayerOf2To30WeightsIsRefusedByDefault) {
  // (2^30 + 2^20) parameters x 16 bytes > 16 GiB >= the default budget on any machine.
  const absl::Status s = BuildStatus(kGiantLinearSpec);
  ExpectExhausted(s,
                  "layer 2 (linear): 1074790400 parameters (largest: weight [1048576, 1024]) "
                  "need 17196646400 bytes to train");
  ExpectExhausted(s, "ModelLimits::max_parameter_bytes");
}

TEST(ModelLimitsTest, LayerParametersAreCheckedWithTheLimitGiven) {
  ModelLimits limits;
  limits.max_parameter_bytes = 1000;
  // kMlpSpec: layer 0 has 6*8+8 = 56 parameters (896 bytes), layer 3 has 8*8+8 = 72 (1152).
  auto m = BuildWith(testing::kMlpSpec, limits);
  ExpectExhausted(m.status(),
                  "layer 3 (linear): 72 parameters (largest: weight [8, 8]) need 1152 bytes to "
                  "train (16 per parameter: weight, gradient and two AdamW moments), more than "
                  "the limit of 1000 bytes");
  limits.max_parameter_bytes = 1152;
  m = BuildWith(testing::kMlpSpec, limits);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ((*m)->limits().max_parameter_bytes, 1152);
}

TEST(ModelLimitsTest, EmbeddingPositionTableCounts) {
  // A 5 x 2^20 token table, but a 2^20 x 2^20 position table.
  ExpectExhausted(
      BuildStatus(R"pb(input_features: 1
                       layers { embedding { vocab_size: 5 dim: 1048576 context: 1048576 } }
                       loss { mse {} })pb"),
      "layer 0 (embedding): 1099516870656 parameters (largest: position.weight "
      "[1048576, 1048576])");
}

TEST(ModelLimitsTest, AttentionOfOneSampleIsChecked) {
  // 16 heads x (2^16)^2 scores x 4 bytes = 256 GiB for one sample.
  ExpectExhausted(BuildStatus(R"pb(input_features: 16
                                   layers { transformer_block { heads: 16 context: 65536 } }
                                   loss { mse {} })pb"),
                  "layer 0 (transformer_block): the attention scores of one sample (heads 16 x "
                  "context 65536^2 floats) take 274877906944 bytes");
  // heads x context^2 x 4 overflows int64: still a clean error.
  ExpectExhausted(
      BuildStatus(R"pb(input_features: 16777216
                       layers { transformer_block { heads: 16777216 context: 16777216 } }
                       loss { mse {} })pb"),
      "take more than 2^63 bytes");
}

TEST(ModelLimitsTest, SampleActivationsAreCountedAndChecked) {
  auto m = testing::BuildOrDie(testing::kMlpSpec);
  // Inputs of the six layers (6 + 5 x 8 features) and the output (4), each with its gradient,
  // plus the layer norm's stash (mean and rstd): 2 x 4 x 50 + 8 bytes.
  EXPECT_EQ(m->SampleActivationBytes(), 408);
  ModelLimits limits;
  limits.max_activation_bytes = 407;
  ExpectExhausted(BuildWith(testing::kMlpSpec, limits).status(),
                  "one sample (1 row) needs 408 bytes of activations (largest: layer 2 "
                  "(layer_norm), 72 bytes), more than the limit of 407 bytes");
}

TEST(ModelLimitsTest, AbsurdDimsAreInvalid) {
  for (const char* dim : {"16777217", "2147483648", "9223372036854775807", "-1"}) {
    const absl::Status s =
        BuildStatus(absl::StrCat("input_features: 8 layers { linear { out_features: ", dim,
                                 " } } "
                                 "loss { mse {} }"));
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << dim;
    EXPECT_THAT(s.message(),
                HasSubstr(absl::StrCat("out_features ", dim, " must be in [1, 16777216]")));
  }
}

// ----- Model spec files ----------------------------------------------------------------------

std::string TempDir() {
  std::string pattern = ::testing::TempDir() + "/pipetrain_model_XXXXXX";
  EXPECT_NE(::mkdtemp(pattern.data()), nullptr);
  return pattern;
}

TEST(ModelSpecFileTest, OnlyRegularFilesUnderTheSizeLimit) {
  absl::StatusOr<v1::ModelSpec> spec = LoadModelSpecFile("/dev/zero");
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(spec.status().message(),
              HasSubstr("model spec file: '/dev/zero' is a character device, not a regular file"));
  const std::string dir = TempDir();
  spec = LoadModelSpecFile(dir);
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(spec.status().message(), HasSubstr("'" + dir + "' is a directory"));
  // A sparse file one byte over the limit: refused from its size, without reading it.
  const std::string big = dir + "/big.textproto";
  FILE* f = std::fopen(big.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fclose(f);
  ASSERT_EQ(::truncate(big.c_str(), kMaxModelSpecFileBytes + 1), 0);
  ExpectExhausted(LoadModelSpecFile(big).status(),
                  absl::StrCat("'", big, "' has 16777217 bytes, more than the limit of ",
                               kMaxModelSpecFileBytes, " bytes"));
  EXPECT_EQ(LoadModelSpecFile(dir + "/missing").status().code(), absl::StatusCode::kNotFound);
}

TEST(ModelTest, TextFormatErrorsCarryLineAndColumn) {
  auto spec = ParseModelSpecText("input_features: 4\nlayers { lineer {} }\n", "m.textproto");
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(spec.status().message(), HasSubstr("m.textproto:2:"));
  EXPECT_THAT(spec.status().message(), HasSubstr("lineer"));
}

TEST(ModelTest, ResolveFillsFromDataAndChecksIt) {
  auto spec = ParseModelSpecText(R"pb(layers { embedding { dim: 8 context: 4 } }
                                      layers { linear { out_features: 0 } }
                                      loss { softmax_cross_entropy {} })pb",
                                 "t");
  ASSERT_TRUE(spec.ok());
  auto resolved = ResolveModelSpec(*spec, DataShape{1, 1, 30, 4});
  ASSERT_TRUE(resolved.ok()) << resolved.status();
  EXPECT_EQ(resolved->input_features(), 1);
  EXPECT_EQ(resolved->layers(0).embedding().vocab_size(), 30);
  EXPECT_EQ(resolved->layers(1).linear().out_features(), 30);
  EXPECT_THAT(ResolveModelSpec(*spec, DataShape{1, 1, 30, 8}).status().message(),
              HasSubstr("embedding context 4 != data set's tokens per sample 8"));
  auto mlp = ParseModelSpecText(testing::kMlpSpec, "t");
  EXPECT_EQ(ResolveModelSpec(*mlp, DataShape{64, 1, 10, 1}).status().message(),
            "model input_features 6 != data set's 64: set the model's input_features to 64, or "
            "to 0 to take the data set's");
  // A token model on rows of features, and a model of features on text: each says what fits.
  EXPECT_EQ(ResolveModelSpec(*spec, DataShape{64, 1, 10, 1}).status().message(),
            "the model takes token ids (its first layer is an embedding) and the data set has 64 "
            "features per row: train it on text, or use a model of 64 input features (e.g. "
            "examples/mlp_digits.textproto)");
  EXPECT_EQ(ResolveModelSpec(*mlp, DataShape{1, 1, 30, 4}).status().message(),
            "model input_features 6 != data set's 1: the data is text, token ids (4 per sample), "
            "which need a model whose first layer is an embedding (e.g. "
            "examples/gpt_char.textproto)");
  // mse: one output per regression target.
  auto regression = ParseModelSpecText(R"pb(layers { linear { out_features: 0 } }
                                            loss { mse {} })pb",
                                       "t");
  ASSERT_TRUE(regression.ok());
  resolved = ResolveModelSpec(*regression, DataShape{5, 3, 0, 1});
  ASSERT_TRUE(resolved.ok()) << resolved.status();
  EXPECT_EQ(resolved->layers(0).linear().out_features(), 3);
}

TEST(ModelTest, ValidateBatchNamesTheProblem) {
  auto m = testing::BuildOrDie(testing::kMlpSpec);
  io::Batch b = testing::MakeBatch(*m, 4, 0);
  EXPECT_TRUE(m->ValidateBatch(math::AsConstMap(b.inputs), math::AsConstMap(b.targets), 4).ok());
  EXPECT_THAT(
      m->ValidateBatch(math::AsConstMap(b.inputs), math::AsConstMap(b.targets), 5).message(),
      HasSubstr("expected [5, 6]"));
  b.inputs(2, 3) = std::nanf("");
  EXPECT_THAT(
      m->ValidateBatch(math::AsConstMap(b.inputs), math::AsConstMap(b.targets), 4).message(),
      HasSubstr("row 2 column 3 is not finite"));
  b = testing::MakeBatch(*m, 4, 0);
  b.targets(1, 0) = 4;  // 4 classes: 0..3
  EXPECT_EQ(m->ValidateBatch(math::AsConstMap(b.inputs), math::AsConstMap(b.targets), 4).code(),
            absl::StatusCode::kInvalidArgument);

  auto g = testing::BuildOrDie(testing::kGptSpec);
  io::Batch t = testing::MakeBatch(*g, 2, 0);
  t.inputs(5, 0) = 11;  // vocab 11: ids 0..10
  EXPECT_THAT(
      g->ValidateBatch(math::AsConstMap(t.inputs), math::AsConstMap(t.targets), 2).message(),
      HasSubstr("row 5: token id 11 is not an integer in [0, 11)"));
  t.inputs(5, 0) = 1.5f;
  EXPECT_THAT(
      g->ValidateBatch(math::AsConstMap(t.inputs), math::AsConstMap(t.targets), 2).message(),
      HasSubstr("token id 1.5"));
}

}  // namespace
}  // namespace pipetrain::model
