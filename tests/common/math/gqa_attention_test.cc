#include "common/math/gqa_attention.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "tests/common/math/grad_check.h"

namespace pipetrain::math {
namespace {

using testing::BitwiseEqual;
using testing::RandomMatrix;

// k [r, kv*hd] with each kv head's columns repeated heads/kv times: the multi-head layout that
// grouped-query attention stands for.
Matrix Replicate(const Matrix& k, int64_t kv_heads, int64_t heads, int64_t hd) {
  Matrix out(k.rows(), heads * hd);
  const int64_t group = heads / kv_heads;
  for (int64_t h = 0; h < heads; ++h) out.middleCols(h * hd, hd) = k.middleCols(h / group * hd, hd);
  return out;
}

struct Grads {
  Matrix out, dq, dk, dv;
};

Grads RunAttention(const GqaShape& shape, const Matrix& q, const Matrix& k, const Matrix& v,
                   const Matrix& dout) {
  std::vector<float> probs(static_cast<size_t>(GqaProbabilityFloats(shape, q.rows())));
  std::vector<float> scratch(static_cast<size_t>(shape.context * shape.context));
  Grads g{Matrix(q.rows(), q.cols()), Matrix(q.rows(), q.cols()), Matrix(k.rows(), k.cols()),
          Matrix(v.rows(), v.cols())};
  GqaAttentionForward(shape, AsConstMap(q), AsConstMap(k), AsConstMap(v), probs.data(),
                      AsMap(g.out));
  GqaAttentionBackward(shape, AsConstMap(q), AsConstMap(k), AsConstMap(v), probs.data(),
                       AsConstMap(dout), scratch.data(), AsMap(g.dq), AsMap(g.dk), AsMap(g.dv));
  return g;
}

// GQA with K kv heads equals multi-head attention on the replicated k and v; its dk and dv are
// the sums of the multi-head dk and dv over each group.
TEST(GqaAttentionTest, EqualsMultiHeadAttentionOnReplicatedKeysAndValues) {
  const int64_t heads = 4, hd = 6, t = 5, rows = 2 * t;
  for (int64_t kv : {1, 2, 4}) {
    SCOPED_TRACE(kv);
    const GqaShape gqa{heads, kv, hd, t};
    const GqaShape mha{heads, heads, hd, t};
    const Matrix q = RandomMatrix(rows, heads * hd, 1, -2, 2);
    const Matrix k = RandomMatrix(rows, kv * hd, 2, -2, 2);
    const Matrix v = RandomMatrix(rows, kv * hd, 3);
    const Matrix dout = RandomMatrix(rows, heads * hd, 4);
    const Grads g = RunAttention(gqa, q, k, v, dout);
    const Grads m =
        RunAttention(mha, q, Replicate(k, kv, heads, hd), Replicate(v, kv, heads, hd), dout);
    EXPECT_TRUE(BitwiseEqual(AsConstMap(g.out), AsConstMap(m.out)));
    EXPECT_TRUE(BitwiseEqual(AsConstMap(g.dq), AsConstMap(m.dq)));
    const int64_t group = heads / kv;
    for (int64_t j = 0; j < kv; ++j) {
      Matrix dk = Matrix::Zero(rows, hd), dv = Matrix::Zero(rows, hd);
      for (int64_t h = j * group; h < (j + 1) * group; ++h) {
        dk += m.dk.middleCols(h * hd, hd);
        dv += m.dv.middleCols(h * hd, hd);
      }
      EXPECT_LT((g.dk.middleCols(j * hd, hd) - dk).cwiseAbs().maxCoeff(), 1e-6f);
      EXPECT_LT((g.dv.middleCols(j * hd, hd) - dv).cwiseAbs().maxCoeff(), 1e-6f);
    }
  }
}

using MatrixD = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// Causal attention of one head in double: out = P v, and its gradients for dout.
struct HeadReference {
  MatrixD out, dq, dk, dv;
};

HeadReference ReferenceHead(const MatrixD& q, const MatrixD& k, const MatrixD& v,
                            const MatrixD& dout) {
  const int64_t t = q.rows();
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.cols()));
  MatrixD p = MatrixD::Zero(t, t);
  for (int64_t i = 0; i < t; ++i) {
    double z = 0;
    for (int64_t c = 0; c <= i; ++c) z += (p(i, c) = std::exp(scale * q.row(i).dot(k.row(c))));
    p.row(i) /= z;
  }
  const MatrixD dp = dout * v.transpose();
  MatrixD ds = MatrixD::Zero(t, t);
  for (int64_t i = 0; i < t; ++i) {
    const double dot = p.row(i).dot(dp.row(i));
    for (int64_t c = 0; c <= i; ++c) ds(i, c) = scale * p(i, c) * (dp(i, c) - dot);
  }
  return {p * v, ds * k, ds.transpose() * q, p.transpose() * dout};
}

// Contexts of one, two and three query blocks (the last one short) against the double reference,
// gradients included; kv heads summed over their groups.
TEST(GqaAttentionTest, MatchesDoubleReferenceForOneAndSeveralQueryBlocks) {
  for (int64_t t : {int64_t{6}, kCausalBlock, int64_t{2 * kCausalBlock + 6}}) {
    SCOPED_TRACE(t);
    const int64_t heads = 4, kv = 2, hd = 4, rows = 2 * t, group = heads / kv;
    const GqaShape shape{heads, kv, hd, t};
    const Matrix q = RandomMatrix(rows, heads * hd, 5, -2, 2);
    const Matrix k = RandomMatrix(rows, kv * hd, 6, -2, 2);
    const Matrix v = RandomMatrix(rows, kv * hd, 7);
    const Matrix dout = RandomMatrix(rows, heads * hd, 8);
    const Grads g = RunAttention(shape, q, k, v, dout);
    for (int64_t s = 0; s < 2; ++s) {
      for (int64_t j = 0; j < kv; ++j) {
        MatrixD dk = MatrixD::Zero(t, hd), dv = MatrixD::Zero(t, hd);
        for (int64_t h = j * group; h < (j + 1) * group; ++h) {
          const HeadReference want = ReferenceHead(q.block(s * t, h * hd, t, hd).cast<double>(),
                                                   k.block(s * t, j * hd, t, hd).cast<double>(),
                                                   v.block(s * t, j * hd, t, hd).cast<double>(),
                                                   dout.block(s * t, h * hd, t, hd).cast<double>());
          EXPECT_LT(
              (g.out.block(s * t, h * hd, t, hd).cast<double>() - want.out).cwiseAbs().maxCoeff(),
              2e-6);
          EXPECT_LT(
              (g.dq.block(s * t, h * hd, t, hd).cast<double>() - want.dq).cwiseAbs().maxCoeff(),
              1e-5);
          dk += want.dk;
          dv += want.dv;
        }
        EXPECT_LT((g.dk.block(s * t, j * hd, t, hd).cast<double>() - dk).cwiseAbs().maxCoeff(),
                  1e-5);
        EXPECT_LT((g.dv.block(s * t, j * hd, t, hd).cast<double>() - dv).cwiseAbs().maxCoeff(),
                  1e-5);
      }
    }
  }
}

// The products never read the masked half: whatever the probability and scratch buffers held
// before (NaN here), the results are bitwise those from zeroed buffers, and P is exactly 0 above
// the diagonal.
TEST(GqaAttentionTest, MaskedHalfIsNeverRead) {
  const int64_t t = 2 * kCausalBlock + 6, heads = 2, hd = 4, rows = t;
  const GqaShape shape{heads, heads, hd, t};
  const Matrix q = RandomMatrix(rows, heads * hd, 11, -2, 2);
  const Matrix k = RandomMatrix(rows, heads * hd, 12, -2, 2);
  const Matrix v = RandomMatrix(rows, heads * hd, 13);
  const Matrix dout = RandomMatrix(rows, heads * hd, 14);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<Matrix> results;
  for (float fill : {0.0f, nan}) {
    std::vector<float> probs(static_cast<size_t>(GqaProbabilityFloats(shape, rows)), fill);
    std::vector<float> scratch(static_cast<size_t>(t * t), fill);
    Matrix out(rows, heads * hd), dq(rows, heads * hd), dk(rows, heads * hd), dv(rows, heads * hd);
    GqaAttentionForward(shape, AsConstMap(q), AsConstMap(k), AsConstMap(v), probs.data(),
                        AsMap(out));
    GqaAttentionBackward(shape, AsConstMap(q), AsConstMap(k), AsConstMap(v), probs.data(),
                         AsConstMap(dout), scratch.data(), AsMap(dq), AsMap(dk), AsMap(dv));
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t i = 0; i < t; ++i) {
        for (int64_t c = i + 1; c < t; ++c)
          ASSERT_EQ(probs[(h * t + i) * t + c], 0.0f) << i << " " << c;
      }
    }
    for (const Matrix* m : {&out, &dq, &dk, &dv}) results.push_back(*m);
  }
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_TRUE(BitwiseEqual(AsConstMap(results[i]), AsConstMap(results[i + 4]))) << i;
  }
}

TEST(GqaAttentionTest, CausalScoreEntriesCountTheComputedTiles) {
  static_assert(kCausalTileRows == 8);
  EXPECT_EQ(CausalScoreEntries(1), 1.0);
  // 6 = one tile of 6 rows: the full square.
  EXPECT_EQ(CausalScoreEntries(6), 36.0);
  // 20 = tiles of 8 (8 keys), 8 (16 keys) and 4 rows (20 keys).
  EXPECT_EQ(CausalScoreEntries(20), 8.0 * 8 + 8.0 * 16 + 4.0 * 20);
  // 128 = 16 tiles of 8: 8 (8 + 16 + ... + 128) of the 16384 scores.
  EXPECT_EQ(CausalScoreEntries(128), 8704.0);
}

// One term of a documented sum (gqa_attention.h): a fused multiply-add where the library's level
// has FMA (this test is compiled at the same PIPETRAIN_ARCH, with -ffp-contract=off), a multiply
// and an add otherwise.
float Term(float a, float b, float acc) {
#if defined(__FMA__)
  return std::fma(a, b, acc);
#else
  return a * b + acc;
#endif
}

// The forward's and backward's bits are exactly the documented sums, element by element, for a
// context of several passes and tiles (the last ones short) and a head size of a vector and a
// half at every level.
TEST(GqaAttentionTest, ProductsAreTheDocumentedSums) {
  const int64_t t = 2 * kCausalBlock + 7, hd = 24;
  const Matrix q = RandomMatrix(t, hd, 21, -2, 2), k = RandomMatrix(t, hd, 22, -2, 2);
  const Matrix v = RandomMatrix(t, hd, 23), dout = RandomMatrix(t, hd, 24);
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd)));
  auto map = [](const Matrix& m) {
    return ConstStridedMap(m.data(), m.rows(), m.cols(), Eigen::OuterStride<>(m.cols()));
  };
  auto out_map = [](Matrix& m) {
    return StridedMap(m.data(), m.rows(), m.cols(), Eigen::OuterStride<>(m.cols()));
  };
  std::vector<float> p(static_cast<size_t>(t * t)), ds(static_cast<size_t>(t * t));
  Matrix out(t, hd), dq(t, hd), dk(t, hd), dv(t, hd);
  CausalHeadForward(map(q), map(k), map(v), 0, scale, p.data(), out_map(out));
  CausalHeadBackward(map(q), map(k), map(v), p.data(), map(dout), scale, ds.data(), false,
                     out_map(dq), out_map(dk), out_map(dv));
  // The scores, then the library's own softmax rows (tested on their own).
  std::vector<float> want_p(static_cast<size_t>(t * t)), want_ds(static_cast<size_t>(t * t));
  for (int64_t i = 0; i < t; ++i) {
    for (int64_t j = 0; j <= i; ++j) {
      float s = 0, dp = 0;
      for (int64_t d = 0; d < hd; ++d) s = Term(q(i, d), k(j, d), s);
      for (int64_t d = 0; d < hd; ++d) dp = Term(dout(i, d), v(j, d), dp);
      want_p[i * t + j] = s;
      want_ds[i * t + j] = dp;
    }
  }
  CausalSoftmaxRows(t, t, 0, scale, want_p.data());
  CausalSoftmaxBackwardRows(t, t, 0, scale, want_p.data(), want_ds.data());
  ASSERT_EQ(std::memcmp(p.data(), want_p.data(), p.size() * sizeof(float)), 0);
  for (int64_t i = 0; i < t; ++i) {
    for (int64_t c = 0; c < hd; ++c) {
      float o = 0, g = 0, gk = 0, gv = 0;
      for (int64_t j = 0; j <= i; ++j) o = Term(want_p[i * t + j], v(j, c), o);
      for (int64_t j = 0; j <= i; ++j) g = Term(want_ds[i * t + j], k(j, c), g);
      for (int64_t r = i; r < t; ++r) gv = Term(want_p[r * t + i], dout(r, c), gv);
      for (int64_t r = i; r < t; ++r) gk = Term(want_ds[r * t + i], q(r, c), gk);
      ASSERT_EQ(out(i, c), o) << i << " " << c;
      ASSERT_EQ(dq(i, c), g) << i << " " << c;
      ASSERT_EQ(dv(i, c), gv) << i << " " << c;
      ASSERT_EQ(dk(i, c), gk) << i << " " << c;
    }
  }
}

// A cached forward of any rows (first > 0, n of them) gives those rows' bits of the whole
// sample's forward: the sums do not depend on the tiling.
TEST(GqaAttentionTest, AnyRowsAloneAreBitwiseTheWholeForward) {
  const int64_t t = 2 * kCausalBlock + 7, hd = 16, cols = 3 * hd;
  // The head in the middle of wider rows, as the blocks lay heads out.
  const Matrix q = RandomMatrix(t, cols, 31, -2, 2), k = RandomMatrix(t, cols, 32, -2, 2);
  const Matrix v = RandomMatrix(t, cols, 33);
  const float scale = 0.25f;
  auto head = [&](const Matrix& m, int64_t row0, int64_t rows) {
    return ConstStridedMap(m.data() + row0 * cols + hd, rows, hd, Eigen::OuterStride<>(cols));
  };
  std::vector<float> p(static_cast<size_t>(t * t));
  Matrix out(t, hd);
  CausalHeadForward(head(q, 0, t), head(k, 0, t), head(v, 0, t), 0, scale, p.data(),
                    StridedMap(out.data(), t, hd, Eigen::OuterStride<>(hd)));
  for (const auto& [first, n] : {std::pair<int64_t, int64_t>{0, 1}, {5, 3}, {33, 1}, {30, 41}}) {
    SCOPED_TRACE(std::to_string(first) + " " + std::to_string(n));
    const int64_t len = first + n;
    std::vector<float> pr(static_cast<size_t>(n * len));
    Matrix o(n, hd);
    CausalHeadForward(head(q, first, n), head(k, 0, len), head(v, 0, len), first, scale, pr.data(),
                      StridedMap(o.data(), n, hd, Eigen::OuterStride<>(hd)));
    EXPECT_TRUE(BitwiseEqual(AsConstMap(o), ConstMatrixMap(out.data() + first * hd, n, hd)));
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(std::memcmp(pr.data() + i * len, p.data() + (first + i) * t, len * sizeof(float)),
                0)
          << i;
    }
  }
}

}  // namespace
}  // namespace pipetrain::math
