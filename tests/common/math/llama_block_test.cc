#include "common/math/llama_block.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "common/math/gqa_attention.h"
#include "gtest/gtest.h"
#include "tests/common/math/grad_check.h"

namespace pipetrain::math {
namespace {

using testing::BitwiseEqual;
using testing::ExpectBitwiseRepeatableForEachThreadCount;
using testing::ExpectBitwiseStableUnderRealignment;
using testing::ExpectLayerGradientsMatch;
using testing::ExpectNanStashGivesTheBitsOfAnEmptyOne;
using testing::GradCheckOptions;
using testing::LayerRun;
using testing::MaxAbs;
using testing::RandomMatrix;
using testing::RunLayer;

using MatD = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

LlamaBlockConfig Config(int64_t dim, int64_t heads, int64_t kv_heads, int64_t context,
                        int64_t hidden) {
  return {dim, heads, kv_heads, context, hidden, 10000.0, 1e-5f};
}

// Parameters large enough that attention is far from uniform and the norms' scales matter
// (Init's 1 and 0.02-scale weights would hide missing terms).
std::vector<Tensor> RandomParams(const LlamaBlock& block, uint64_t seed) {
  std::vector<Tensor> p;
  block.Init(seed, 0, &p);
  const std::vector<ParamSpec> specs = block.params();
  for (size_t i = 0; i < p.size(); ++i) {
    const int64_t n = static_cast<int64_t>(p[i].data.size());
    Matrix m;
    if (specs[i].shape.size() == 1) {
      m = RandomMatrix(1, n, seed + i, 0.5f, 1.5f);
    } else {
      const float bound = 1.5f / std::sqrt(static_cast<float>(specs[i].shape[1]));
      m = RandomMatrix(1, n, seed + i, -bound, bound);
    }
    p[i].data.assign(m.data(), m.data() + n);
  }
  return p;
}

MatD RmsNormD(const MatD& x, const Tensor& g, double eps) {
  MatD out(x.rows(), x.cols());
  for (int64_t r = 0; r < x.rows(); ++r) {
    const double rstd = 1.0 / std::sqrt(x.row(r).squaredNorm() / x.cols() + eps);
    for (int64_t j = 0; j < x.cols(); ++j) out(r, j) = x(r, j) * rstd * g.data[j];
  }
  return out;
}

MatD LinearD(const MatD& x, const Tensor& w) {
  const int64_t out_f = w.shape[0];
  const Eigen::Map<const Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>> wm(
      w.data.data(), out_f, x.cols());
  return x * wm.cast<double>().transpose();
}

// RoPE with libm in double, "rotate half" pairs, position = row % t.
void RopeD(MatD& x, int64_t hd, int64_t t, double theta) {
  for (int64_t r = 0; r < x.rows(); ++r) {
    for (int64_t h = 0; h < x.cols() / hd; ++h) {
      for (int64_t i = 0; i < hd / 2; ++i) {
        const double angle = static_cast<double>(r % t) * std::pow(theta, -2.0 * i / hd);
        const double a = x(r, h * hd + i), b = x(r, h * hd + i + hd / 2);
        x(r, h * hd + i) = a * std::cos(angle) - b * std::sin(angle);
        x(r, h * hd + i + hd / 2) = b * std::cos(angle) + a * std::sin(angle);
      }
    }
  }
}

// Straightforward double-precision forward pass of the documented block, for comparison.
Matrix ReferenceForward(const LlamaBlockConfig& c, const std::vector<Tensor>& p, const Matrix& x) {
  const int64_t n = x.rows(), d = c.dim, t = c.context, hd = d / c.heads;
  const MatD xd = x.cast<double>();
  const MatD a = RmsNormD(xd, p[0], c.norm_eps);
  MatD q = LinearD(a, p[1]), k = LinearD(a, p[2]);
  const MatD v = LinearD(a, p[3]);
  RopeD(q, hd, t, c.rope_theta);
  RopeD(k, hd, t, c.rope_theta);
  MatD o = MatD::Zero(n, d);
  for (int64_t s = 0; s < n / t; ++s) {
    for (int64_t h = 0; h < c.heads; ++h) {
      const int64_t j = h / (c.heads / c.kv_heads);
      for (int64_t i = 0; i < t; ++i) {
        std::vector<double> w(static_cast<size_t>(i + 1));
        double z = 0;
        for (int64_t m = 0; m <= i; ++m) {
          const double dot = q.block(s * t + i, h * hd, 1, hd)
                                 .cwiseProduct(k.block(s * t + m, j * hd, 1, hd))
                                 .sum();
          z += (w[m] = std::exp(dot / std::sqrt(static_cast<double>(hd))));
        }
        for (int64_t m = 0; m <= i; ++m) {
          o.block(s * t + i, h * hd, 1, hd) += w[m] / z * v.block(s * t + m, j * hd, 1, hd);
        }
      }
    }
  }
  const MatD h = xd + LinearD(o, p[4]);
  const MatD b = RmsNormD(h, p[5], c.norm_eps);
  const MatD g = LinearD(b, p[6]);
  const MatD u = LinearD(b, p[7]);
  MatD mm(n, c.hidden);
  for (int64_t i = 0; i < mm.size(); ++i) {
    mm.data()[i] = g.data()[i] / (1.0 + std::exp(-g.data()[i])) * u.data()[i];
  }
  return (h + LinearD(mm, p[8])).cast<float>();
}

TEST(LlamaBlockTest, ParamsInDocumentedOrder) {
  const LlamaBlock block(Config(8, 4, 2, 4, 12));  // head width 2, kv width 4
  const std::vector<ParamSpec> specs = block.params();
  const std::vector<std::pair<std::string, std::vector<int64_t>>> want = {
      {"attn_norm.weight", {8}},    {"attn.q.weight", {8, 8}},  {"attn.k.weight", {4, 8}},
      {"attn.v.weight", {4, 8}},    {"attn.o.weight", {8, 8}},  {"mlp_norm.weight", {8}},
      {"mlp.gate.weight", {12, 8}}, {"mlp.up.weight", {12, 8}}, {"mlp.down.weight", {8, 12}}};
  ASSERT_EQ(specs.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(specs[i].name, want[i].first);
    EXPECT_EQ(specs[i].shape, want[i].second) << want[i].first;
  }
  EXPECT_EQ(block.kind(), "llama_block");
  EXPECT_EQ(block.row_multiple(), 4);
  EXPECT_EQ(block.in_features(), 8);
  EXPECT_EQ(block.out_features(), 8);
  std::vector<Tensor> p;
  block.Init(5, 3, &p);
  EXPECT_EQ(p[0].data, std::vector<float>(8, 1.0f));
  EXPECT_EQ(p[5].data, std::vector<float>(8, 1.0f));
  double sq = 0;
  for (float w : p[6].data) sq += static_cast<double>(w) * w;
  EXPECT_NEAR(std::sqrt(sq / p[6].data.size()), 0.02, 0.006);  // N(0, 0.02), 96 draws
}

TEST(LlamaBlockTest, ForwardMatchesDoubleReferenceForEveryKvHeadCount) {
  for (int64_t kv : {1, 2, 4}) {
    SCOPED_TRACE(kv);
    const LlamaBlockConfig c = Config(16, 4, kv, 5, 24);
    const LlamaBlock block(c);
    const std::vector<Tensor> p = RandomParams(block, 1);
    const Matrix x = RandomMatrix(10, 16, 2, -2.0f, 2.0f);
    Matrix y(10, 16);
    Stash stash;
    block.Forward(p, AsConstMap(x), AsMap(y), &stash);
    EXPECT_EQ(static_cast<int64_t>(stash.data.size() * sizeof(float)), block.StashBytes(10));
    const Matrix want = ReferenceForward(c, p, x);
    EXPECT_LT((y - want).cwiseAbs().maxCoeff(), 2e-5) << y << "\n\n" << want;
  }
}

TEST(LlamaBlockTest, GradientsMatchFiniteDifferencesForEveryKvHeadCount) {
  // Two samples of context 4, four heads of width 2 (kv 1: multi-query; 2: grouped; 4: MHA).
  // attn.q.weight's gradients are ~100x smaller than the others' here, so the float objective's
  // rounding noise divided by the default step reaches 1% of them: a larger step (Richardson
  // extrapolation keeps the truncation error O(h^4)) keeps the check at 1%.
  GradCheckOptions options;
  options.step = 4e-2;
  for (int64_t kv : {1, 2, 4}) {
    SCOPED_TRACE(kv);
    const LlamaBlock block(Config(8, 4, kv, 4, 12));
    ExpectLayerGradientsMatch(block, RandomParams(block, 3), RandomMatrix(8, 8, 4, -1.5f, 1.5f),
                              RandomMatrix(8, 8, 5), /*check_input=*/true, options);
  }
}

TEST(LlamaBlockTest, AttentionIsCausalAndSamplesAreIndependent) {
  const int64_t t = 6;
  const LlamaBlock block(Config(8, 2, 1, t, 16));
  const std::vector<Tensor> p = RandomParams(block, 7);
  const Matrix x = RandomMatrix(3 * t, 8, 8);
  const LayerRun base = RunLayer(block, p, x, RandomMatrix(3 * t, 8, 9));
  Matrix x2 = x;
  for (int64_t j = 0; j < 8; ++j) x2(t + 3, j) += 0.1f * static_cast<float>(j);
  Matrix y2(3 * t, 8);
  Stash stash;
  block.Forward(p, AsConstMap(x2), AsMap(y2), &stash);
  for (int64_t r = 0; r < 3 * t; ++r) {
    const bool affected = r >= t + 3 && r < 2 * t;
    EXPECT_EQ(base.y.row(r) == y2.row(r), !affected) << "row " << r;
  }
}

TEST(LlamaBlockTest, BackwardWeightAccumulatesAndZeroRowDxKeepsGradients) {
  const LlamaBlock block(Config(8, 4, 2, 4, 12));
  const std::vector<Tensor> p = RandomParams(block, 3);
  const Matrix x = RandomMatrix(8, 8, 4);
  const Matrix dy = RandomMatrix(8, 8, 5);
  LayerRun run = RunLayer(block, p, x, dy);
  const LayerRun without = RunLayer(block, p, x, dy, /*want_dx=*/false);
  EXPECT_EQ(without.dx.rows(), 0);
  const std::vector<Tensor> once = run.grads;
  block.BackwardWeight(p, AsConstMap(x), AsConstMap(dy), run.stash, absl::MakeSpan(run.grads));
  for (size_t i = 0; i < p.size(); ++i) {
    EXPECT_TRUE(BitwiseEqual(once[i].data, without.grads[i].data)) << block.params()[i].name;
    for (size_t k = 0; k < once[i].data.size(); ++k) {
      EXPECT_NEAR(run.grads[i].data[k], 2 * once[i].data[k], 1e-5 * MaxAbs(once[i].data))
          << block.params()[i].name;
    }
  }
}

// F / I / W consistency: zero-bubble order F1 F2 I1 I2 W1 W2 gives the bits of F I W per
// micro-batch (all state lives in the per-micro-batch stash), and I followed by W equals the
// whole backward (the finite-difference test checks its values).
TEST(LlamaBlockTest, SplitBackwardOrderDoesNotMatter) {
  const LlamaBlock block(Config(8, 4, 2, 4, 12));
  const std::vector<Tensor> p = RandomParams(block, 3);
  const Matrix x[2] = {RandomMatrix(8, 8, 4), RandomMatrix(8, 8, 14)};
  const Matrix dy[2] = {RandomMatrix(8, 8, 5), RandomMatrix(8, 8, 15)};
  auto zero_grads = [&] {
    std::vector<Tensor> g = p;
    for (Tensor& t : g) t.data.assign(t.data.size(), 0.0f);
    return g;
  };
  std::vector<Tensor> seq = zero_grads();
  std::vector<Tensor> split = zero_grads();
  Matrix y(8, 8), dx[2] = {Matrix(8, 8), Matrix(8, 8)}, dx_seq[2] = {Matrix(8, 8), Matrix(8, 8)};
  Stash s[2];
  for (int m = 0; m < 2; ++m) {
    Stash st;
    block.Forward(p, AsConstMap(x[m]), AsMap(y), &st);
    block.BackwardInput(p, AsConstMap(x[m]), AsConstMap(dy[m]), &st, AsMap(dx_seq[m]));
    block.BackwardWeight(p, AsConstMap(x[m]), AsConstMap(dy[m]), st, absl::MakeSpan(seq));
  }
  for (int m = 0; m < 2; ++m) block.Forward(p, AsConstMap(x[m]), AsMap(y), &s[m]);
  for (int m = 0; m < 2; ++m) {
    block.BackwardInput(p, AsConstMap(x[m]), AsConstMap(dy[m]), &s[m], AsMap(dx[m]));
  }
  for (int m = 0; m < 2; ++m) {
    block.BackwardWeight(p, AsConstMap(x[m]), AsConstMap(dy[m]), s[m], absl::MakeSpan(split));
  }
  for (int m = 0; m < 2; ++m) EXPECT_TRUE(BitwiseEqual(AsConstMap(dx[m]), AsConstMap(dx_seq[m])));
  for (size_t i = 0; i < p.size(); ++i) {
    EXPECT_TRUE(BitwiseEqual(seq[i].data, split[i].data)) << block.params()[i].name;
  }
}

// Every stash element is written before it is read (a Stash leaves the elements a resize adds
// uninitialised, layer.h): F, I and W on a stash of the right size filled with NaN give the bits
// of F, I and W on an empty one.
TEST(LlamaBlockTest, StashFilledWithNanGivesTheBitsOfAnEmptyOne) {
  const LlamaBlock block(Config(8, 4, 2, 12, 12));
  ExpectNanStashGivesTheBitsOfAnEmptyOne(block, RandomParams(block, 3), RandomMatrix(24, 8, 4),
                                         RandomMatrix(24, 8, 5));
}

TEST(LlamaBlockTest, StashIsReusedWhenSizeMatches) {
  const LlamaBlock block(Config(8, 2, 2, 4, 12));
  const std::vector<Tensor> p = RandomParams(block, 3);
  const Matrix x = RandomMatrix(8, 8, 4);
  Matrix y(8, 8);
  Stash stash;
  block.Forward(p, AsConstMap(x), AsMap(y), &stash);
  const float* first = stash.data.data();
  block.Forward(p, AsConstMap(x), AsMap(y), &stash);
  EXPECT_EQ(stash.data.data(), first);
}

TEST(LlamaBlockTest, FlopsFollowDocumentedFormula) {
  const int64_t d = 16, heads = 4, kv = 2, t = 20, hid = 40, rows = 3 * t;
  const LlamaBlock block(Config(d, heads, kv, t, hid));
  const FlopCount f = block.Flops(rows);
  const double n = rows, kvd = kv * (d / heads);
  const double weight_gemm = 2 * n * (2 * d * d + 2 * d * kvd + 3 * d * hid);
  // Keys per query row the causal tiles compute (gqa_attention.h).
  const double keys = CausalScoreEntries(t) / t;
  const double attn_gemm = 2 * n * keys * d;  // one product over the computed scores
  const double scores = n * heads * keys;
  const double rope = 3 * n * (d + kvd);
  EXPECT_DOUBLE_EQ(f.forward, weight_gemm + 2 * attn_gemm + 8 * n * d + 8 * scores + rope +
                                  8 * n * hid + 2 * n * d);
  EXPECT_DOUBLE_EQ(f.backward_input,
                   weight_gemm + 4 * attn_gemm + 16 * n * d + 5 * scores + rope + 12 * n * hid);
  EXPECT_DOUBLE_EQ(f.backward_weight, weight_gemm + 6 * n * d);
}

TEST(LlamaBlockTest, RepeatsBitsForEachThreadCount) {
  const LlamaBlock block(Config(64, 4, 2, 32, 172));
  const std::vector<Tensor> p = RandomParams(block, 2);
  const Matrix x = RandomMatrix(4 * 32, 64, 3);
  const Matrix dy = RandomMatrix(4 * 32, 64, 4);
  ExpectBitwiseRepeatableForEachThreadCount(block, p, x, dy);
}

TEST(LlamaBlockTest, BitsDoNotDependOnBufferAlignment) {
  const LlamaBlock block(Config(12, 3, 1, 5, 20));
  ExpectBitwiseStableUnderRealignment(block, RandomParams(block, 1), RandomMatrix(10, 12, 2),
                                      RandomMatrix(10, 12, 3));
}

}  // namespace
}  // namespace pipetrain::math
