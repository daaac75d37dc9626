#include "common/math/rope.h"

#include <cmath>
#include <vector>

#include "gtest/gtest.h"
#include "tests/common/math/grad_check.h"

namespace pipetrain::math {
namespace {

using testing::BitwiseEqual;
using testing::RandomMatrix;

TEST(RopeTest, TableMatchesLibmToFloatPrecision) {
  const int64_t hd = 16, t = 300;
  const double theta = 10000.0;
  const RopeTable rope(hd, t, theta);
  for (int64_t p = 0; p < t; ++p) {
    for (int64_t i = 0; i < hd / 2; ++i) {
      const double angle = static_cast<double>(p) * std::pow(theta, -2.0 * i / hd);
      // The table is the double value rounded once to float: within half a float ulp of libm's,
      // plus libm's and det_math's few double ulps.
      EXPECT_NEAR(rope.Cos(p, i), std::cos(angle), 6e-8) << p << " " << i;
      EXPECT_NEAR(rope.Sin(p, i), std::sin(angle), 6e-8) << p << " " << i;
    }
  }
}

TEST(RopeTest, RotatesFeatureIWithFeatureIPlusHalf) {
  // head_dim 4: pairs (0, 2) and (1, 3). Row 1 is position 1 (context 2); two heads.
  const RopeTable rope(4, 2, 100.0);
  Matrix x = RandomMatrix(2, 8, 1);
  const Matrix before = x;
  rope.Apply(AsMap(x));
  EXPECT_TRUE(BitwiseEqual(AsConstMap(Matrix(x.row(0))), AsConstMap(Matrix(before.row(0)))))
      << "position 0 is the identity";
  for (int64_t h = 0; h < 2; ++h) {
    for (int64_t i = 0; i < 2; ++i) {
      const float c = rope.Cos(1, i), s = rope.Sin(1, i);
      const float a = before(1, h * 4 + i), b = before(1, h * 4 + i + 2);
      EXPECT_EQ(x(1, h * 4 + i), a * c - b * s);
      EXPECT_EQ(x(1, h * 4 + i + 2), b * c + a * s);
    }
  }
  EXPECT_NEAR(rope.Cos(1, 1), std::cos(0.1), 1e-7);  // 100^(-2/4) = 0.1
}

TEST(RopeTest, TransposeUndoesApply) {
  const RopeTable rope(8, 5, 10000.0);
  Matrix x = RandomMatrix(10, 24, 2);
  const Matrix before = x;
  rope.Apply(AsMap(x));
  EXPECT_GT((x - before).cwiseAbs().maxCoeff(), 0.1f);
  rope.ApplyTranspose(AsMap(x));
  EXPECT_LT((x - before).cwiseAbs().maxCoeff(), 1e-6f);
}

// The point of RoPE: q_p . k_p' depends only on p - p'.
TEST(RopeTest, DotProductsDependOnRelativePosition) {
  const int64_t hd = 8, t = 12;
  const RopeTable rope(hd, t, 10000.0);
  const Matrix q = RandomMatrix(1, hd, 3);
  const Matrix k = RandomMatrix(1, hd, 4);
  Matrix qs(t, hd), ks(t, hd);
  for (int64_t p = 0; p < t; ++p) {
    qs.row(p) = q;
    ks.row(p) = k;
  }
  rope.Apply(AsMap(qs));
  rope.Apply(AsMap(ks));
  for (int64_t shift = 1; shift < 5; ++shift) {
    EXPECT_NEAR(qs.row(5).dot(ks.row(2)), qs.row(5 + shift).dot(ks.row(2 + shift)), 1e-5);
  }
  EXPECT_GT(std::fabs(qs.row(5).dot(ks.row(2)) - qs.row(5).dot(ks.row(3))), 1e-3);
}

}  // namespace
}  // namespace pipetrain::math
