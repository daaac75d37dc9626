#include "common/math/gqa_attention.h"

#include <cmath>
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

TEST(GqaAttentionTest, ForwardMatchesDoubleReference) {
  const int64_t heads = 4, kv = 2, hd = 4, t = 6, rows = 2 * t;
  const GqaShape shape{heads, kv, hd, t};
  const Matrix q = RandomMatrix(rows, heads * hd, 5, -2, 2);
  const Matrix k = RandomMatrix(rows, kv * hd, 6, -2, 2);
  const Matrix v = RandomMatrix(rows, kv * hd, 7);
  const Grads g = RunAttention(shape, q, k, v, Matrix::Zero(rows, heads * hd));
  for (int64_t s = 0; s < 2; ++s) {
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t j = h / 2;
      for (int64_t i = 0; i < t; ++i) {
        std::vector<double> w(static_cast<size_t>(i + 1));
        double z = 0;
        for (int64_t c = 0; c <= i; ++c) {
          double dot = 0;
          for (int64_t e = 0; e < hd; ++e) {
            dot += static_cast<double>(q(s * t + i, h * hd + e)) * k(s * t + c, j * hd + e);
          }
          z += (w[c] = std::exp(dot / 2.0));  // 1/sqrt(hd) = 1/2
        }
        for (int64_t e = 0; e < hd; ++e) {
          double want = 0;
          for (int64_t c = 0; c <= i; ++c) want += w[c] / z * v(s * t + c, j * hd + e);
          EXPECT_NEAR(g.out(s * t + i, h * hd + e), want, 2e-6);
        }
      }
    }
  }
}

}  // namespace
}  // namespace pipetrain::math
