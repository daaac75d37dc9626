#include "common/model/model.h"

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
  EXPECT_THAT(ResolveModelSpec(*mlp, DataShape{64, 1, 10, 1}).status().message(),
              HasSubstr("model input_features 6 != data set's 64"));
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
