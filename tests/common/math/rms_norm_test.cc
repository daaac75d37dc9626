#include "common/math/rms_norm.h"

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

// RMSNorm with a non-trivial gamma (Init gives 1, which would hide a missing gamma).
std::vector<Tensor> RandomParams(const RmsNorm& layer, uint64_t seed) {
  std::vector<Tensor> p;
  layer.Init(seed, 0, &p);
  const int64_t f = layer.in_features();
  const Matrix g = RandomMatrix(1, f, seed, 0.5f, 1.5f);
  p[0].data.assign(g.data(), g.data() + f);
  return p;
}

TEST(RmsNormTest, ParamsAndInit) {
  const RmsNorm layer(4, 1e-5f);
  EXPECT_EQ(layer.kind(), "rms_norm");
  ASSERT_EQ(layer.params().size(), 1u);
  EXPECT_EQ(layer.params()[0].name, "weight");
  EXPECT_EQ(layer.params()[0].shape, (std::vector<int64_t>{4}));
  std::vector<Tensor> p;
  layer.Init(3, 9, &p);
  EXPECT_EQ(p[0].data, std::vector<float>(4, 1.0f));
}

TEST(RmsNormTest, ForwardMatchesNaiveDouble) {
  const float eps = 1e-3f;  // large enough to matter for the small rows below.
  const RmsNorm layer(9, eps);
  const std::vector<Tensor> p = RandomParams(layer, 1);
  Matrix x = RandomMatrix(4, 9, 2, -3.0f, 5.0f);
  x.row(3) *= 0.01f;
  Matrix y(4, 9);
  Stash stash;
  layer.Forward(p, AsConstMap(x), AsMap(y), &stash);
  EXPECT_EQ(static_cast<int64_t>(stash.data.size() * sizeof(float)), layer.StashBytes(4));
  for (int r = 0; r < 4; ++r) {
    double ms = 0;
    for (int j = 0; j < 9; ++j) ms += static_cast<double>(x(r, j)) * x(r, j) / 9.0;
    for (int j = 0; j < 9; ++j) {
      const double want = x(r, j) / std::sqrt(ms + eps) * p[0].data[j];
      EXPECT_NEAR(y(r, j), want, 2e-6 * std::max(1.0, std::fabs(want))) << r << " " << j;
    }
  }
}

TEST(RmsNormTest, GradientsMatchFiniteDifferences) {
  const RmsNorm layer(7, 1e-5f);
  ExpectLayerGradientsMatch(layer, RandomParams(layer, 3), RandomMatrix(5, 7, 4, -2.0f, 2.0f),
                            RandomMatrix(5, 7, 5), /*check_input=*/true);
}

TEST(RmsNormTest, BackwardWeightAccumulatesAndZeroRowDxKeepsGradients) {
  const RmsNorm layer(7, 1e-5f);
  const std::vector<Tensor> p = RandomParams(layer, 3);
  const Matrix x = RandomMatrix(5, 7, 4);
  const Matrix dy = RandomMatrix(5, 7, 5);
  testing::LayerRun run = RunLayer(layer, p, x, dy);
  const testing::LayerRun no_dx = RunLayer(layer, p, x, dy, /*want_dx=*/false);
  EXPECT_EQ(no_dx.dx.rows(), 0);
  const std::vector<Tensor> once = run.grads;
  EXPECT_TRUE(BitwiseEqual(once[0].data, no_dx.grads[0].data));
  layer.BackwardWeight(p, AsConstMap(x), AsConstMap(dy), run.stash, absl::MakeSpan(run.grads));
  for (size_t k = 0; k < once[0].data.size(); ++k) {
    EXPECT_NEAR(run.grads[0].data[k], 2 * once[0].data[k], 1e-6 * MaxAbs(once[0].data));
  }
}

// The helper's accumulate mode adds exactly the value it would write.
TEST(RmsNormTest, AccumulateAddsTheOverwrittenValue) {
  const RmsNorm layer(6, 1e-5f);
  const std::vector<Tensor> p = RandomParams(layer, 8);
  const Matrix x = RandomMatrix(3, 6, 9);
  const Matrix dy = RandomMatrix(3, 6, 10);
  const testing::LayerRun run = RunLayer(layer, p, x, dy);
  const Matrix base = RandomMatrix(3, 6, 11);
  Matrix acc = base;
  RmsNormBackwardInput(AsConstMap(x), AsConstMap(dy), p[0].data.data(), run.stash.data.data(),
                       /*accumulate=*/true, AsMap(acc));
  const Matrix want = base + run.dx;
  EXPECT_TRUE(BitwiseEqual(AsConstMap(acc), AsConstMap(want)));
}

TEST(RmsNormTest, FlopsFollowDocumentedFormula) {
  const RmsNorm layer(10, 1e-5f);
  const FlopCount f = layer.Flops(3);
  EXPECT_DOUBLE_EQ(f.forward, 4 * 30);
  EXPECT_DOUBLE_EQ(f.backward_input, 7 * 30);
  EXPECT_DOUBLE_EQ(f.backward_weight, 3 * 30);
}

TEST(RmsNormTest, BitsDoNotDependOnBufferAlignment) {
  const RmsNorm layer(37, 1e-5f);
  ExpectBitwiseStableUnderRealignment(layer, RandomParams(layer, 1), RandomMatrix(6, 37, 2),
                                      RandomMatrix(6, 37, 3));
}

}  // namespace
}  // namespace pipetrain::math
