#include "common/math/linear.h"

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

std::vector<Tensor> InitParams(const Layer& layer, uint64_t seed = 7, int64_t index = 3) {
  std::vector<Tensor> params;
  layer.Init(seed, index, &params);
  return params;
}

TEST(LinearTest, ParamsFollowPyTorchLayout) {
  const Linear with(5, 3, true);
  ASSERT_EQ(with.params().size(), 2u);
  EXPECT_EQ(with.params()[0].name, "weight");
  EXPECT_EQ(with.params()[0].shape, (std::vector<int64_t>{3, 5}));
  EXPECT_EQ(with.params()[1].name, "bias");
  EXPECT_EQ(with.params()[1].shape, (std::vector<int64_t>{3}));
  EXPECT_EQ(Linear(5, 3, false).params().size(), 1u);
  EXPECT_EQ(with.kind(), "linear");
  EXPECT_EQ(with.in_features(), 5);
  EXPECT_EQ(with.out_features(), 3);
  EXPECT_EQ(with.row_multiple(), 1);
}

TEST(LinearTest, ForwardMatchesNaiveDouble) {
  const Linear layer(7, 4, true);
  const std::vector<Tensor> p = InitParams(layer);
  const Matrix x = RandomMatrix(5, 7, 1);
  Matrix y(5, 4);
  Stash stash;
  layer.Forward(p, AsConstMap(x), AsMap(y), &stash);
  for (int r = 0; r < 5; ++r) {
    for (int o = 0; o < 4; ++o) {
      double want = p[1].data[o];
      for (int i = 0; i < 7; ++i) want += double{x(r, i)} * p[0].data[o * 7 + i];
      EXPECT_NEAR(y(r, o), want, 1e-6);
    }
  }
  EXPECT_TRUE(stash.data.empty());
  EXPECT_EQ(layer.StashBytes(5), 0);
}

TEST(LinearTest, InitIsUniformWithinPyTorchBound) {
  const Linear layer(64, 32, true);
  const std::vector<Tensor> p = InitParams(layer);
  const float bound = 1.0f / 8.0f;
  double sum = 0;
  for (const Tensor& t : p) {
    for (float v : t.data) {
      EXPECT_LE(std::fabs(v), bound);
    }
  }
  for (float v : p[0].data) sum += v;
  EXPECT_NEAR(sum / p[0].data.size(), 0.0, 0.01);
  // Variance of U(-b, b) is b^2 / 3.
  double sq = 0;
  for (float v : p[0].data) sq += double{v} * v;
  EXPECT_NEAR(sq / p[0].data.size(), bound * bound / 3.0, 0.1 * bound * bound / 3.0);
}

TEST(LinearTest, GradientsMatchFiniteDifferences) {
  for (bool bias : {true, false}) {
    SCOPED_TRACE(bias ? "with bias" : "without bias");
    const Linear layer(6, 4, bias);
    ExpectLayerGradientsMatch(layer, InitParams(layer), RandomMatrix(5, 6, 2),
                              RandomMatrix(5, 4, 3), /*check_input=*/true);
  }
}

TEST(LinearTest, BackwardWeightAccumulates) {
  const Linear layer(6, 4, true);
  const std::vector<Tensor> p = InitParams(layer);
  const Matrix x = RandomMatrix(5, 6, 2);
  const Matrix dy = RandomMatrix(5, 4, 3);
  testing::LayerRun run = RunLayer(layer, p, x, dy);
  const std::vector<Tensor> once = run.grads;
  layer.BackwardWeight(p, AsConstMap(x), AsConstMap(dy), run.stash, absl::MakeSpan(run.grads));
  for (size_t i = 0; i < p.size(); ++i) {
    for (size_t k = 0; k < once[i].data.size(); ++k) {
      EXPECT_NEAR(run.grads[i].data[k], 2 * once[i].data[k], 1e-5 * MaxAbs(once[i].data));
    }
  }
}

TEST(LinearTest, ZeroRowDxSkipsInputGradientOnly) {
  const Linear layer(6, 4, true);
  const std::vector<Tensor> p = InitParams(layer);
  const Matrix x = RandomMatrix(5, 6, 2);
  const Matrix dy = RandomMatrix(5, 4, 3);
  const testing::LayerRun with = RunLayer(layer, p, x, dy, true);
  const testing::LayerRun without = RunLayer(layer, p, x, dy, false);
  EXPECT_EQ(without.dx.rows(), 0);
  for (size_t i = 0; i < p.size(); ++i) {
    EXPECT_TRUE(BitwiseEqual(with.grads[i].data, without.grads[i].data));
  }
}

TEST(LinearTest, FlopsAreExact) {
  const FlopCount f = Linear(6, 4, true).Flops(10);
  EXPECT_EQ(f.forward, 2.0 * 10 * 6 * 4 + 10 * 4);
  EXPECT_EQ(f.backward_input, 2.0 * 10 * 6 * 4);
  EXPECT_EQ(f.backward_weight, 2.0 * 10 * 6 * 4 + 10 * 4);
  const FlopCount g = Linear(6, 4, false).Flops(10);
  EXPECT_EQ(g.forward, 2.0 * 10 * 6 * 4);
  EXPECT_EQ(g.backward_weight, 2.0 * 10 * 6 * 4);
  EXPECT_EQ(g.total(), 3 * 2.0 * 10 * 6 * 4);
}

// Shapes cover Eigen's coefficient-based small products, GEMV (one row) and blocked GEMM
// (depth beyond one cache block).
TEST(LinearTest, BitsDoNotDependOnBufferAlignment) {
  struct Shape {
    int64_t rows, in, out;
  };
  for (const Shape s : {Shape{3, 5, 4}, Shape{1, 37, 19}, Shape{33, 65, 17}, Shape{64, 700, 48},
                        Shape{700, 64, 48}}) {
    SCOPED_TRACE(::testing::Message() << s.rows << "x" << s.in << "->" << s.out);
    const Linear layer(s.in, s.out, true);
    ExpectBitwiseStableUnderRealignment(layer, InitParams(layer), RandomMatrix(s.rows, s.in, 4),
                                        RandomMatrix(s.rows, s.out, 5));
  }
}

}  // namespace
}  // namespace pipetrain::math
