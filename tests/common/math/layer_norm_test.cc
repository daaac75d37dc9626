#include "common/math/layer_norm.h"

#include <cmath>
#include <vector>

#include "absl/types/span.h"
#include "gtest/gtest.h"
#include "tests/common/math/grad_check.h"

namespace pipetrain::math {
namespace {

using testing::BitwiseEqual;
using testing::ExpectBitwiseStableUnderRealignment;
using testing::ExpectLayerGradientsMatch;
using testing::MaxAbs;
using testing::RandomMatrix;
using testing::RunLayer;

// LayerNorm with non-trivial gamma/beta (Init gives 1/0, which would hide a missing gamma).
std::vector<Tensor> RandomParams(const LayerNorm& layer, uint64_t seed) {
  std::vector<Tensor> p;
  layer.Init(seed, 0, &p);
  const int64_t f = layer.in_features();
  const Matrix g = RandomMatrix(1, f, seed, 0.5f, 1.5f);
  const Matrix b = RandomMatrix(1, f, seed + 1, -0.5f, 0.5f);
  p[0].data.assign(g.data(), g.data() + f);
  p[1].data.assign(b.data(), b.data() + f);
  return p;
}

TEST(LayerNormTest, ParamsAndInit) {
  const LayerNorm layer(4, 1e-5f);
  ASSERT_EQ(layer.params().size(), 2u);
  EXPECT_EQ(layer.params()[0].name, "weight");
  EXPECT_EQ(layer.params()[1].name, "bias");
  EXPECT_EQ(layer.params()[0].shape, (std::vector<int64_t>{4}));
  std::vector<Tensor> p;
  layer.Init(3, 9, &p);
  EXPECT_EQ(p[0].data, std::vector<float>(4, 1.0f));
  EXPECT_EQ(p[1].data, std::vector<float>(4, 0.0f));
}

TEST(LayerNormTest, ForwardMatchesNaiveDouble) {
  const LayerNorm layer(9, 1e-5f);
  const std::vector<Tensor> p = RandomParams(layer, 1);
  const Matrix x = RandomMatrix(4, 9, 2, -3.0f, 5.0f);
  Matrix y(4, 9);
  Stash stash;
  layer.Forward(p, AsConstMap(x), AsMap(y), &stash);
  EXPECT_EQ(static_cast<int64_t>(stash.data.size() * sizeof(float)), layer.StashBytes(4));
  for (int r = 0; r < 4; ++r) {
    double mean = 0;
    for (int j = 0; j < 9; ++j) mean += x(r, j) / 9.0;
    double var = 0;
    for (int j = 0; j < 9; ++j) var += (x(r, j) - mean) * (x(r, j) - mean) / 9.0;
    for (int j = 0; j < 9; ++j) {
      const double want = (x(r, j) - mean) / std::sqrt(var + 1e-5) * p[0].data[j] + p[1].data[j];
      EXPECT_NEAR(y(r, j), want, 1e-5);
    }
  }
}

TEST(LayerNormTest, GradientsMatchFiniteDifferences) {
  const LayerNorm layer(7, 1e-5f);
  ExpectLayerGradientsMatch(layer, RandomParams(layer, 3), RandomMatrix(5, 7, 4, -2.0f, 2.0f),
                            RandomMatrix(5, 7, 5), /*check_input=*/true);
}

TEST(LayerNormTest, BackwardWeightAccumulatesAndZeroRowDxKeepsGradients) {
  const LayerNorm layer(7, 1e-5f);
  const std::vector<Tensor> p = RandomParams(layer, 3);
  const Matrix x = RandomMatrix(5, 7, 4);
  const Matrix dy = RandomMatrix(5, 7, 5);
  testing::LayerRun run = RunLayer(layer, p, x, dy);
  const testing::LayerRun no_dx = RunLayer(layer, p, x, dy, /*want_dx=*/false);
  const std::vector<Tensor> once = run.grads;
  layer.BackwardWeight(p, AsConstMap(x), AsConstMap(dy), run.stash, absl::MakeSpan(run.grads));
  for (size_t i = 0; i < p.size(); ++i) {
    EXPECT_TRUE(BitwiseEqual(once[i].data, no_dx.grads[i].data));
    for (size_t k = 0; k < once[i].data.size(); ++k) {
      EXPECT_NEAR(run.grads[i].data[k], 2 * once[i].data[k], 1e-5 * MaxAbs(once[i].data));
    }
  }
}

TEST(LayerNormTest, AccumulateAddsToExistingDx) {
  const Matrix x = RandomMatrix(3, 5, 1);
  const Matrix dy = RandomMatrix(3, 5, 2);
  const std::vector<float> gamma(5, 1.5f), beta(5, 0.25f);
  std::vector<float> mean(3), rstd(3);
  Matrix y(3, 5);
  LayerNormForward(AsConstMap(x), gamma.data(), beta.data(), 1e-5f, AsMap(y), mean.data(),
                   rstd.data());
  Matrix plain(3, 5);
  LayerNormBackwardInput(AsConstMap(x), AsConstMap(dy), gamma.data(), mean.data(), rstd.data(),
                         false, AsMap(plain));
  Matrix acc = Matrix::Constant(3, 5, 2.0f);
  LayerNormBackwardInput(AsConstMap(x), AsConstMap(dy), gamma.data(), mean.data(), rstd.data(),
                         true, AsMap(acc));
  for (int64_t i = 0; i < acc.size(); ++i) EXPECT_EQ(acc.data()[i], 2.0f + plain.data()[i]);
}

TEST(LayerNormTest, ConstantRowIsFinite) {
  const LayerNorm layer(4, 1e-5f);
  std::vector<Tensor> p;
  layer.Init(1, 0, &p);
  const Matrix x = Matrix::Constant(2, 4, 3.0f);
  const testing::LayerRun run = RunLayer(layer, p, x, RandomMatrix(2, 4, 1));
  EXPECT_TRUE(run.y.allFinite());
  EXPECT_TRUE(run.dx.allFinite());
  EXPECT_EQ(run.y, Matrix::Zero(2, 4));
}

TEST(LayerNormTest, FlopsAndStash) {
  const LayerNorm layer(8, 1e-5f);
  EXPECT_EQ(layer.StashBytes(10), 2 * 10 * 4);
  EXPECT_EQ(layer.Flops(10).forward, 7.0 * 80);
  EXPECT_EQ(layer.Flops(10).backward_input, 10.0 * 80);
  EXPECT_EQ(layer.Flops(10).backward_weight, 5.0 * 80);
}

TEST(LayerNormTest, BitsDoNotDependOnBufferAlignment) {
  const LayerNorm layer(13, 1e-5f);
  ExpectBitwiseStableUnderRealignment(layer, RandomParams(layer, 1), RandomMatrix(6, 13, 2),
                                      RandomMatrix(6, 13, 3));
}

}  // namespace
}  // namespace pipetrain::math
