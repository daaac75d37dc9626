#include "common/math/embedding.h"

#include <vector>

#include "absl/types/span.h"
#include "gtest/gtest.h"
#include "tests/common/math/grad_check.h"

namespace pipetrain::math {
namespace {

using testing::ExpectBitwiseStableUnderRealignment;
using testing::ExpectLayerGradientsMatch;
using testing::RandomMatrix;
using testing::RunLayer;

Matrix Tokens(std::vector<float> ids) {
  Matrix x(static_cast<int64_t>(ids.size()), 1);
  for (size_t i = 0; i < ids.size(); ++i) x(static_cast<int64_t>(i), 0) = ids[i];
  return x;
}

std::vector<Tensor> InitParams(const Embedding& layer) {
  std::vector<Tensor> p;
  layer.Init(11, 0, &p);
  return p;
}

TEST(EmbeddingTest, Shape) {
  const Embedding layer(10, 4, 3);
  EXPECT_EQ(layer.kind(), "embedding");
  EXPECT_EQ(layer.in_features(), 1);
  EXPECT_EQ(layer.out_features(), 4);
  EXPECT_EQ(layer.row_multiple(), 3);
  ASSERT_EQ(layer.params().size(), 2u);
  EXPECT_EQ(layer.params()[0].name, "token.weight");
  EXPECT_EQ(layer.params()[0].shape, (std::vector<int64_t>{10, 4}));
  EXPECT_EQ(layer.params()[1].name, "position.weight");
  EXPECT_EQ(layer.params()[1].shape, (std::vector<int64_t>{3, 4}));
}

TEST(EmbeddingTest, ForwardAddsTokenAndPositionRows) {
  const Embedding layer(10, 4, 3);
  const std::vector<Tensor> p = InitParams(layer);
  const Matrix x = Tokens({7, 0, 7, 9, 9, 2});
  const testing::LayerRun run = RunLayer(layer, p, x, RandomMatrix(6, 4, 1));
  for (int r = 0; r < 6; ++r) {
    const int id = static_cast<int>(x(r, 0));
    for (int j = 0; j < 4; ++j) {
      EXPECT_EQ(run.y(r, j), p[0].data[id * 4 + j] + p[1].data[(r % 3) * 4 + j]);
    }
  }
  // Token ids have no gradient.
  EXPECT_EQ(run.dx, Matrix::Zero(6, 1));
  EXPECT_TRUE(run.stash.data.empty());
}

TEST(EmbeddingTest, WithoutPositionTableOnlyTokenRows) {
  const Embedding layer(10, 4, 3, /*position_table=*/false);
  EXPECT_FALSE(layer.position_table());
  ASSERT_EQ(layer.params().size(), 1u);
  EXPECT_EQ(layer.params()[0].name, "token.weight");
  const std::vector<Tensor> p = InitParams(layer);
  // The token table is the one a model with a position table gets (same stream, same bits).
  EXPECT_EQ(p[0].data, InitParams(Embedding(10, 4, 3)).at(0).data);
  const Matrix x = Tokens({7, 0, 7, 9, 9, 2});
  const Matrix dy = RandomMatrix(6, 4, 1);
  const testing::LayerRun run = RunLayer(layer, p, x, dy);
  for (int r = 0; r < 6; ++r) {
    const int id = static_cast<int>(x(r, 0));
    for (int j = 0; j < 4; ++j) EXPECT_EQ(run.y(r, j), p[0].data[id * 4 + j]);
  }
  // Token 9's gradient row is dy row 3 + dy row 4; unused tokens get 0.
  for (int j = 0; j < 4; ++j) {
    EXPECT_EQ(run.grads[0].data[9 * 4 + j], dy(3, j) + dy(4, j));
    EXPECT_EQ(run.grads[0].data[1 * 4 + j], 0.0f);
  }
  EXPECT_DOUBLE_EQ(layer.Flops(6).backward_weight, 6 * 4);
}

TEST(EmbeddingTest, GradientsMatchFiniteDifferences) {
  const Embedding layer(5, 3, 4);
  // Repeated tokens (1 and 3) must accumulate; token 4 is unused and gets zero gradient.
  ExpectLayerGradientsMatch(layer, InitParams(layer), Tokens({1, 3, 1, 0, 3, 3, 2, 1}),
                            RandomMatrix(8, 3, 2), /*check_input=*/false);
}

TEST(EmbeddingTest, BackwardWeightScattersAndAccumulates) {
  const Embedding layer(4, 2, 2);
  const std::vector<Tensor> p = InitParams(layer);
  const Matrix x = Tokens({3, 3, 1, 3});
  Matrix dy(4, 2);
  dy << 1, 2, 10, 20, 100, 200, 1000, 2000;
  testing::LayerRun run = RunLayer(layer, p, x, dy, /*want_dx=*/false);
  EXPECT_EQ(run.grads[0].data, (std::vector<float>{0, 0, 100, 200, 0, 0, 1011, 2022}));
  EXPECT_EQ(run.grads[1].data, (std::vector<float>{101, 202, 1010, 2020}));
  layer.BackwardWeight(p, AsConstMap(x), AsConstMap(dy), run.stash, absl::MakeSpan(run.grads));
  EXPECT_EQ(run.grads[0].data, (std::vector<float>{0, 0, 200, 400, 0, 0, 2022, 4044}));
  EXPECT_EQ(run.grads[1].data, (std::vector<float>{202, 404, 2020, 4040}));
}

TEST(EmbeddingTest, FlopsAndStash) {
  const Embedding layer(10, 4, 3);
  EXPECT_EQ(layer.Flops(6).forward, 24);
  EXPECT_EQ(layer.Flops(6).backward_input, 0);
  EXPECT_EQ(layer.Flops(6).backward_weight, 48);
  EXPECT_EQ(layer.StashBytes(6), 0);
}

TEST(EmbeddingTest, BitsDoNotDependOnBufferAlignment) {
  const Embedding layer(10, 5, 3);
  ExpectBitwiseStableUnderRealignment(layer, InitParams(layer), Tokens({1, 2, 3, 9, 0, 9}),
                                      RandomMatrix(6, 5, 1));
}

}  // namespace
}  // namespace pipetrain::math
