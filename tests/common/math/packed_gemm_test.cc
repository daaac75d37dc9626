// The packed weight products give bitwise what Eigen's own product expressions on the same maps
// (what math::Linear ran before) give, for every shape (blocked and unblocked depths, tiny and
// vector-shaped products Eigen runs differently), reuse their packing while the weight is unchanged
// and repack after Invalidate().
#include "common/math/packed_gemm.h"

#include <cstdint>
#include <vector>

#include "common/math/det_math.h"
#include "gtest/gtest.h"
#include "tests/common/math/grad_check.h"

namespace pipetrain::math {
namespace {

using testing::BitwiseEqual;
using testing::RandomMatrix;

class PackedGemmTest : public ::testing::Test {
 protected:
  void SetUp() override {
    PinEigenBlockingForReproducibility();
    Eigen::setNbThreads(1);
  }
};

// Both products of one shape, twice (the second reuses the packing), against Eigen's expressions.
void ExpectBothProductsEqualEigen(int64_t rows, int64_t in, int64_t out, uint64_t seed) {
  SCOPED_TRACE(::testing::Message() << "rows " << rows << " in " << in << " out " << out);
  const Matrix x = RandomMatrix(rows, in, seed);
  const Matrix w = RandomMatrix(out, in, seed + 1);
  const Matrix dy = RandomMatrix(rows, out, seed + 2);
  Matrix y_eigen(rows, out), dx_eigen(rows, in);
  AsMap(y_eigen).noalias() = AsConstMap(x) * AsConstMap(w).transpose();
  AsMap(dx_eigen).noalias() = AsConstMap(dy) * AsConstMap(w);
  PackedWeight forward, backward_input;
  for (int call = 0; call < 2; ++call) {
    Matrix y = Matrix::Constant(rows, out, 7.0f);  // stale values must not leak into the result.
    Matrix dx = Matrix::Constant(rows, in, 7.0f);
    ProductXWt(AsConstMap(x), AsConstMap(w), AsMap(y), &forward);
    ProductDyW(AsConstMap(dy), AsConstMap(w), AsMap(dx), &backward_input);
    EXPECT_TRUE(BitwiseEqual(AsConstMap(y), AsConstMap(y_eigen))) << "forward, call " << call;
    EXPECT_TRUE(BitwiseEqual(AsConstMap(dx), AsConstMap(dx_eigen))) << "input grad, call " << call;
  }
  // Without a PackedWeight: Eigen's expression.
  Matrix y(rows, out), dx(rows, in);
  ProductXWt(AsConstMap(x), AsConstMap(w), AsMap(y), nullptr);
  ProductDyW(AsConstMap(dy), AsConstMap(w), AsMap(dx), nullptr);
  EXPECT_TRUE(BitwiseEqual(AsConstMap(y), AsConstMap(y_eigen))) << "forward, no packing";
  EXPECT_TRUE(BitwiseEqual(AsConstMap(dx), AsConstMap(dx_eigen))) << "input grad, no packing";
}

TEST_F(PackedGemmTest, EveryShapeGivesEigensBits) {
  uint64_t seed = 1;
  for (int64_t rows : {1, 2, 3, 7, 32, 100, 300}) {
    for (int64_t in : {1, 3, 16, 150, 512, 700}) {
      for (int64_t out : {1, 2, 16, 129, 512, 1100}) {
        ExpectBothProductsEqualEigen(rows, in, out, seed += 3);
      }
    }
  }
}

TEST_F(PackedGemmTest, TheLargeProductsKeepTheirPackingAndSmallOnesNeedNone) {
  const Matrix w = RandomMatrix(512, 512, 1);
  const Matrix x = RandomMatrix(32, 512, 2);
  Matrix y(32, 512);
  PackedWeight packed;
  EXPECT_EQ(packed.bytes(), 0);
  ProductXWt(AsConstMap(x), AsConstMap(w), AsMap(y), &packed);
  // The packing holds at least the weight.
  EXPECT_GE(packed.bytes(), static_cast<int64_t>(w.size() * sizeof(float)));

  // A GEMV-shaped product (one row) is Eigen's own and packs nothing.
  const Matrix x1 = RandomMatrix(1, 512, 3);
  Matrix y1(1, 512);
  PackedWeight unused;
  ProductXWt(AsConstMap(x1), AsConstMap(w), AsMap(y1), &unused);
  EXPECT_EQ(unused.bytes(), 0);
}

TEST_F(PackedGemmTest, ANewWeightIsPackedAfterInvalidate) {
  Matrix w = RandomMatrix(256, 384, 4);
  const Matrix x = RandomMatrix(32, 384, 5);
  const Matrix dy = RandomMatrix(32, 256, 6);
  PackedWeight forward, backward_input;
  Matrix y(32, 256), dx(32, 384);
  ProductXWt(AsConstMap(x), AsConstMap(w), AsMap(y), &forward);
  ProductDyW(AsConstMap(dy), AsConstMap(w), AsMap(dx), &backward_input);

  // The weight changes in place (an optimizer step): the caller invalidates.
  w = RandomMatrix(256, 384, 7);
  forward.Invalidate();
  backward_input.Invalidate();
  ProductXWt(AsConstMap(x), AsConstMap(w), AsMap(y), &forward);
  ProductDyW(AsConstMap(dy), AsConstMap(w), AsMap(dx), &backward_input);
  Matrix y_eigen(32, 256), dx_eigen(32, 384);
  AsMap(y_eigen).noalias() = AsConstMap(x) * AsConstMap(w).transpose();
  AsMap(dx_eigen).noalias() = AsConstMap(dy) * AsConstMap(w);
  EXPECT_TRUE(BitwiseEqual(AsConstMap(y), AsConstMap(y_eigen)));
  EXPECT_TRUE(BitwiseEqual(AsConstMap(dx), AsConstMap(dx_eigen)));
}

TEST_F(PackedGemmTest, AnotherRowCountOrAnotherWeightBufferRepacks) {
  const Matrix w1 = RandomMatrix(96, 64, 8);
  const Matrix w2 = RandomMatrix(96, 64, 9);
  PackedWeight packed;
  for (int64_t rows : {32, 5, 200, 32}) {
    for (const Matrix* w : {&w1, &w2}) {
      const Matrix x = RandomMatrix(rows, 64, 10 + rows);
      Matrix y(rows, 96), y_eigen(rows, 96);
      ProductXWt(AsConstMap(x), AsConstMap(*w), AsMap(y), &packed);
      AsMap(y_eigen).noalias() = AsConstMap(x) * AsConstMap(*w).transpose();
      EXPECT_TRUE(BitwiseEqual(AsConstMap(y), AsConstMap(y_eigen))) << "rows " << rows;
    }
  }
}

TEST_F(PackedGemmTest, SeveralEigenThreadsRunEigensOwnProduct) {
  Eigen::setNbThreads(2);
  const Matrix w = RandomMatrix(512, 512, 11);
  const Matrix x = RandomMatrix(64, 512, 12);
  Matrix y(64, 512), y_eigen(64, 512);
  PackedWeight packed;
  ProductXWt(AsConstMap(x), AsConstMap(w), AsMap(y), &packed);
  AsMap(y_eigen).noalias() = AsConstMap(x) * AsConstMap(w).transpose();
  EXPECT_TRUE(BitwiseEqual(AsConstMap(y), AsConstMap(y_eigen)));
  EXPECT_EQ(packed.bytes(), 0);
  Eigen::setNbThreads(1);
}

}  // namespace
}  // namespace pipetrain::math
