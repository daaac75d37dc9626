#include "common/math/activations.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "tests/common/math/grad_check.h"

namespace pipetrain::math {
namespace {

using testing::ExpectBitwiseStableUnderRealignment;
using testing::ExpectLayerGradientsMatch;
using testing::RandomMatrix;
using testing::RandomMatrixAwayFromZero;
using testing::RunLayer;

double GeluReference(double x) {
  return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}

TEST(ReluTest, ForwardAndBackward) {
  const Relu layer(3);
  EXPECT_EQ(layer.kind(), "relu");
  EXPECT_TRUE(layer.params().empty());
  Matrix x(2, 3);
  x << -1.0f, 0.0f, 2.5f, 3.0f, -0.0f, -7.0f;
  Matrix dy(2, 3);
  dy << 1, 2, 3, 4, 5, 6;
  const testing::LayerRun run = RunLayer(layer, {}, x, dy);
  Matrix want_y(2, 3);
  want_y << 0, 0, 2.5f, 3, 0, 0;
  Matrix want_dx(2, 3);
  want_dx << 0, 0, 3, 4, 0, 0;  // subgradient 0 at x = 0
  EXPECT_EQ(run.y, want_y);
  EXPECT_EQ(run.dx, want_dx);
  EXPECT_TRUE(run.stash.data.empty());
}

TEST(ReluTest, PropagatesNaN) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  float y = 0;
  ReluForward(&nan, 1, &y);
  EXPECT_TRUE(std::isnan(y));
}

TEST(ReluTest, InputGradientMatchesFiniteDifferences) {
  // Inputs at least 0.1 from the kink, far beyond the 1e-2 perturbation.
  ExpectLayerGradientsMatch(Relu(5), {}, RandomMatrixAwayFromZero(4, 5, 1, 0.1f, 2.0f),
                            RandomMatrix(4, 5, 2), /*check_input=*/true);
}

TEST(GeluTest, MatchesGpt2TanhFormula) {
  for (float x = -8.0f; x <= 8.0f; x += 0.0137f) {
    const double want = GeluReference(x);
    EXPECT_NEAR(GeluScalar(x), want, 1e-7 + 1e-6 * std::fabs(want)) << x;
  }
  EXPECT_EQ(GeluScalar(0.0f), 0.0f);
  EXPECT_EQ(GeluScalar(20.0f), 20.0f);
  EXPECT_EQ(GeluScalar(-20.0f), -0.0f);
}

TEST(GeluTest, ScalarDerivativeMatchesDoubleFiniteDifferences) {
  for (double x = -6.0; x <= 6.0; x += 0.0731) {
    const double h = 1e-5;
    const double numeric = (GeluReference(x + h) - GeluReference(x - h)) / (2 * h);
    EXPECT_NEAR(GeluGradScalar(static_cast<float>(x)), numeric, 1e-6) << x;
  }
}

uint32_t FloatBits(float x) {
  uint32_t b;
  std::memcpy(&b, &x, sizeof b);
  return b;
}

// The array passes (exponentials a chunk at a time, vectorised) round exactly as the scalars.
TEST(GeluTest, ArrayPassesAreBitwiseTheScalars) {
  std::vector<float> x;
  for (float v = -30.0f; v <= 30.0f; v += 0.00917f) x.push_back(v);
  for (float v :
       {0.0f, -0.0f, 1e-30f, -1e-30f, 1e30f, -1e30f, std::numeric_limits<float>::infinity(),
        -std::numeric_limits<float>::infinity(), std::nanf("")}) {
    x.push_back(v);
  }
  const int64_t n = static_cast<int64_t>(x.size());  // not a multiple of the chunk or the lanes
  std::vector<float> dy(x.size()), y(x.size()), dx(x.size());
  for (size_t i = 0; i < x.size(); ++i) dy[i] = 0.5f + 0.001f * static_cast<float>(i % 977);
  GeluForward(x.data(), n, y.data());
  GeluBackward(x.data(), dy.data(), n, dx.data());
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(FloatBits(y[i]), FloatBits(GeluScalar(x[i]))) << x[i];
    ASSERT_EQ(FloatBits(dx[i]), FloatBits(dy[i] * GeluGradScalar(x[i]))) << x[i];
  }
  // In place (dx aliasing dy), as the transformer block runs it.
  std::vector<float> inplace = dy;
  GeluBackward(x.data(), inplace.data(), n, inplace.data());
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(FloatBits(inplace[i]), FloatBits(dx[i])) << x[i];
}

TEST(GeluTest, LayerGradientMatchesFiniteDifferences) {
  ExpectLayerGradientsMatch(Gelu(6), {}, RandomMatrix(4, 6, 3, -3.0f, 3.0f), RandomMatrix(4, 6, 4),
                            /*check_input=*/true);
}

TEST(ActivationsTest, ZeroRowDxAndNoParams) {
  std::vector<std::unique_ptr<Layer>> layers;
  layers.push_back(std::make_unique<Relu>(4));
  layers.push_back(std::make_unique<Gelu>(4));
  for (const auto& layer : layers) {
    std::vector<Tensor> params{Tensor{}};
    layer->Init(1, 0, &params);
    EXPECT_TRUE(params.empty());
    const testing::LayerRun run = RunLayer(*layer, {}, RandomMatrix(3, 4, 5), RandomMatrix(3, 4, 6),
                                           /*want_dx=*/false);
    EXPECT_EQ(run.dx.rows(), 0);
    EXPECT_EQ(layer->StashBytes(3), 0);
    EXPECT_EQ(layer->Flops(3).backward_weight, 0);
    EXPECT_GT(layer->Flops(3).forward, 0);
  }
}

TEST(ActivationsTest, BitsDoNotDependOnBufferAlignment) {
  ExpectBitwiseStableUnderRealignment(Relu(7), {}, RandomMatrix(5, 7, 1), RandomMatrix(5, 7, 2));
  ExpectBitwiseStableUnderRealignment(Gelu(7), {}, RandomMatrix(5, 7, 1), RandomMatrix(5, 7, 2));
}

}  // namespace
}  // namespace pipetrain::math
