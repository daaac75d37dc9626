// The packed weight products give bitwise what Eigen's own product expressions on the same maps
// (what math::Linear ran before) give, for every shape (blocked and unblocked depths, tiny and
// vector-shaped products Eigen runs differently), reuse their packing while the weight is unchanged
// and repack after Invalidate().
#include "common/math/packed_gemm.h"

#include <cstdint>
#include <utility>
#include <vector>

#include "common/math/det_math.h"
#include "common/math/tree_sum.h"
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

// Eigen's own product expressions y = x W^T and dx = dy W: the bits the packed products must give.
struct EigenProducts {
  Matrix y, dx;
};
EigenProducts EigensProducts(const Matrix& x, const Matrix& dy, const Matrix& w) {
  EigenProducts out{Matrix(x.rows(), w.rows()), Matrix(dy.rows(), w.cols())};
  AsMap(out.y).noalias() = AsConstMap(x) * AsConstMap(w).transpose();
  AsMap(out.dx).noalias() = AsConstMap(dy) * AsConstMap(w);
  return out;
}

// Both products of one shape, twice (the second reuses the packing), against Eigen's expressions.
void ExpectBothProductsEqualEigen(int64_t rows, int64_t in, int64_t out, uint64_t seed) {
  SCOPED_TRACE(::testing::Message() << "rows " << rows << " in " << in << " out " << out);
  const Matrix x = RandomMatrix(rows, in, seed);
  const Matrix w = RandomMatrix(out, in, seed + 1);
  const Matrix dy = RandomMatrix(rows, out, seed + 2);
  const auto [y_eigen, dx_eigen] = EigensProducts(x, dy, w);
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
  const auto [y_eigen, dx_eigen] = EigensProducts(x, dy, w);
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

TEST_F(PackedGemmTest, RepackPacksTheChangedWeightAtOnceForTheLastRowCount) {
  Matrix w = RandomMatrix(512, 384, 20);
  const Matrix x = RandomMatrix(32, 384, 21);
  const Matrix dy = RandomMatrix(32, 512, 22);
  PackedWeight forward, backward_input, unused;
  RepackXWt(AsConstMap(w), &unused);  // never used: nothing to repack.
  EXPECT_EQ(unused.bytes(), 0);
  Matrix y(32, 512), dx(32, 384);
  ProductXWt(AsConstMap(x), AsConstMap(w), AsMap(y), &forward);
  ProductDyW(AsConstMap(dy), AsConstMap(w), AsMap(dx), &backward_input);

  // An update: invalidate and repack at once. Then change the weight again without telling the
  // packings: the products must show the weight as it was at the repack, which proves that the
  // repack happened then and that the products reuse it.
  const Matrix w_at_repack = RandomMatrix(512, 384, 23);
  w = w_at_repack;  // in place, as an optimizer step (same buffer).
  forward.Invalidate();
  backward_input.Invalidate();
  RepackXWt(AsConstMap(w), &forward);
  RepackDyW(AsConstMap(w), &backward_input);
  const Matrix w_later = RandomMatrix(512, 384, 24);
  w = w_later;
  ProductXWt(AsConstMap(x), AsConstMap(w), AsMap(y), &forward);
  ProductDyW(AsConstMap(dy), AsConstMap(w), AsMap(dx), &backward_input);
  const auto [y_eigen, dx_eigen] = EigensProducts(x, dy, w_at_repack);
  EXPECT_TRUE(BitwiseEqual(AsConstMap(y), AsConstMap(y_eigen)));
  EXPECT_TRUE(BitwiseEqual(AsConstMap(dx), AsConstMap(dx_eigen)));

  // Another row count next: that product packs for itself and gives the current weight's bits.
  forward.Invalidate();
  RepackXWt(AsConstMap(w), &forward);
  const Matrix x300 = RandomMatrix(300, 384, 25);
  Matrix y300(300, 512), y300_eigen(300, 512);
  ProductXWt(AsConstMap(x300), AsConstMap(w), AsMap(y300), &forward);
  AsMap(y300_eigen).noalias() = AsConstMap(x300) * AsConstMap(w).transpose();
  EXPECT_TRUE(BitwiseEqual(AsConstMap(y300), AsConstMap(y300_eigen)));
}

// gw += dy_t^T x_t over `terms` micro-batches of `rows` rows (the last one `last_rows`), against
// Eigen's expression term after term, from a gradient that is not zero.
// Returns whether AccumulateDyTx ran its blocked loop.
bool ExpectAccumulateEqualsEigen(int64_t terms, int64_t rows, int64_t last_rows, int64_t in,
                                 int64_t out, uint64_t seed) {
  SCOPED_TRACE(::testing::Message() << terms << " terms, rows " << rows << " (last " << last_rows
                                    << ") in " << in << " out " << out);
  std::vector<Matrix> xs, dys;
  for (int64_t t = 0; t < terms; ++t) {
    const int64_t r = t + 1 == terms ? last_rows : rows;
    xs.push_back(RandomMatrix(r, in, seed + 2 * t));
    dys.push_back(RandomMatrix(r, out, seed + 2 * t + 1));
  }
  const Matrix start = RandomMatrix(out, in, seed + 1000);
  Matrix eigen = start;
  std::vector<DyTxTerm> list;
  for (int64_t t = 0; t < terms; ++t) {
    AsMap(eigen).noalias() += AsConstMap(dys[t]).transpose() * AsConstMap(xs[t]);
    list.push_back({AsConstMap(dys[t]), AsConstMap(xs[t])});
  }
  Matrix gw = start;
  const bool blocked = AccumulateDyTx(list, AsMap(gw));
  EXPECT_TRUE(BitwiseEqual(AsConstMap(gw), AsConstMap(eigen)));
  return blocked;
}

TEST_F(PackedGemmTest, AccumulatingSeveralMicrobatchesGivesEigensBitsTermAfterTerm) {
  uint64_t seed = 5000;
  int blocked = 0;
  for (int64_t terms : {1, 2, 3, 8}) {
    for (int64_t rows : {1, 2, 7, 32, 64, 300}) {
      for (int64_t in : {1, 3, 16, 150, 512, 700}) {
        for (int64_t out : {1, 2, 5, 16, 129, 512, 1100}) {
          blocked += ExpectAccumulateEqualsEigen(terms, rows, rows, in, out, seed += 97);
        }
      }
    }
  }
  // Most multi-term shapes ran the blocked loop (the rest are vector shapes or deep products).
  EXPECT_GT(blocked, 200);
  // The deep MLP's: 8 micro-batches of 32 rows through a 512x512 layer, blocked.
  EXPECT_TRUE(ExpectAccumulateEqualsEigen(8, 32, 32, 512, 512, 1));
  EXPECT_FALSE(ExpectAccumulateEqualsEigen(1, 32, 32, 512, 512, 2));  // one term: Eigen's.
}

TEST_F(PackedGemmTest, AccumulatingMicrobatchesOfDifferentRowsGivesEigensBits) {
  // B not a multiple of M leaves a shorter last micro-batch: the terms run one by one.
  EXPECT_FALSE(ExpectAccumulateEqualsEigen(4, 32, 17, 512, 512, 9000));
  EXPECT_FALSE(ExpectAccumulateEqualsEigen(3, 5, 64, 96, 33, 9100));
  EXPECT_FALSE(ExpectAccumulateEqualsEigen(0, 8, 8, 64, 64, 9200));  // no terms: nothing changes.
}

TEST_F(PackedGemmTest, AccumulatingWithSeveralEigenThreadsGivesEigensBits) {
  Eigen::setNbThreads(2);
  EXPECT_FALSE(ExpectAccumulateEqualsEigen(8, 32, 32, 512, 512, 9300));
  Eigen::setNbThreads(1);
}

// The canonical tree's node over terms [lo, hi) by its definition: a leaf is Eigen's product of
// its first term with each later one accumulated, an inner node lower + upper element by element.
Matrix TreeNodeByDefinition(const std::vector<Matrix>& xs, const std::vector<Matrix>& dys,
                            int64_t lo, int64_t hi, int64_t leaf_size) {
  if (hi - lo == leaf_size) {
    Matrix leaf(dys[lo].cols(), xs[lo].cols());
    AsMap(leaf).noalias() = AsConstMap(dys[lo]).transpose() * AsConstMap(xs[lo]);
    for (int64_t t = lo + 1; t < hi; ++t) {
      AsMap(leaf).noalias() += AsConstMap(dys[t]).transpose() * AsConstMap(xs[t]);
    }
    return leaf;
  }
  const int64_t mid = lo + (hi - lo) / 2;
  Matrix lower = TreeNodeByDefinition(xs, dys, lo, mid, leaf_size);
  const Matrix upper = TreeNodeByDefinition(xs, dys, mid, hi, leaf_size);
  for (int64_t i = 0; i < lower.size(); ++i) lower.data()[i] = lower.data()[i] + upper.data()[i];
  return lower;
}

// gw + node over `terms` micro-batches (leaves of `leaf_size`) from AccumulateDyTxNode against the
// definition, from a zero and from a non-zero gradient. Returns whether AccumulateDyTxNode ran
// (else it must have left gw unchanged).
bool ExpectNodeEqualsDefinition(int64_t terms, int64_t leaf_size, int64_t rows, int64_t in,
                                int64_t out, uint64_t seed) {
  SCOPED_TRACE(::testing::Message() << terms << " terms in leaves of " << leaf_size << ", rows "
                                    << rows << " in " << in << " out " << out);
  std::vector<Matrix> xs, dys;
  std::vector<DyTxTerm> list;
  for (int64_t t = 0; t < terms; ++t) {
    xs.push_back(RandomMatrix(rows, in, seed + 2 * t));
    dys.push_back(RandomMatrix(rows, out, seed + 2 * t + 1));
  }
  for (int64_t t = 0; t < terms; ++t) list.push_back({AsConstMap(dys[t]), AsConstMap(xs[t])});
  // Only 2^u leaves have a tree; for other counts the node is never used.
  const bool tree = terms % leaf_size == 0 && Log2OfPowerOfTwo(terms / leaf_size) >= 0;
  const Matrix node =
      tree ? TreeNodeByDefinition(xs, dys, 0, terms, leaf_size) : Matrix(Matrix::Zero(out, in));
  bool ran = false;
  for (const Matrix& start : {Matrix(Matrix::Zero(out, in)), RandomMatrix(out, in, seed + 999)}) {
    Matrix expected = start;
    for (int64_t i = 0; i < expected.size(); ++i) {
      expected.data()[i] = expected.data()[i] + node.data()[i];
    }
    Matrix gw = start;
    ran = AccumulateDyTxNode(list, leaf_size, AsMap(gw));
    EXPECT_TRUE(BitwiseEqual(AsConstMap(gw), AsConstMap(ran ? expected : start)));
  }
  return ran;
}

// The node's bits whatever the shape: the blocked tree (with a one-term right leaf added by the
// kernel to its left sibling) and the one-term node `gw += dy^T x` equal the definition's
// `gw + (0 + dy^T x)` trees; where Eigen would not run one depth block it declines.
TEST_F(PackedGemmTest, TheTreeNodeOfMicrobatchesGivesTheBitsOfItsDefinition) {
  uint64_t seed = 20000;
  int ran = 0, shapes = 0;
  for (auto [terms, leaf] : std::vector<std::pair<int64_t, int64_t>>{
           {1, 1}, {2, 1}, {4, 1}, {8, 1}, {3, 3}, {6, 3}, {12, 3}, {10, 5}, {2, 2}}) {
    for (int64_t rows : {1, 2, 7, 32, 64, 300}) {
      for (int64_t in : {1, 3, 16, 150, 512}) {
        for (int64_t out : {1, 2, 5, 16, 129, 512}) {
          ran += ExpectNodeEqualsDefinition(terms, leaf, rows, in, out, seed += 101);
          ++shapes;
        }
      }
    }
  }
  EXPECT_GT(ran, shapes / 2);
  // The deep MLP's: 8 micro-batches of 32 rows through a 512x512 layer, and one alone.
  EXPECT_TRUE(ExpectNodeEqualsDefinition(8, 1, 32, 512, 512, 1));
  EXPECT_TRUE(ExpectNodeEqualsDefinition(1, 1, 32, 512, 512, 2));
  // Counts that are not 2^u leaves, and several Eigen threads: declined, gw unchanged.
  EXPECT_FALSE(ExpectNodeEqualsDefinition(3, 1, 32, 64, 64, 3));
  EXPECT_FALSE(ExpectNodeEqualsDefinition(6, 4, 32, 64, 64, 4));
  Eigen::setNbThreads(2);
  EXPECT_FALSE(ExpectNodeEqualsDefinition(4, 1, 32, 512, 512, 5));
  Eigen::setNbThreads(1);
}

}  // namespace
}  // namespace pipetrain::math
