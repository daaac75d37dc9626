#include "common/math/transformer_block.h"

#include <algorithm>
#include <cmath>
#include <limits>
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
using testing::LayerRun;
using testing::MaxAbs;
using testing::RandomMatrix;
using testing::RunLayer;

// Parameters large enough that attention is far from uniform and LN's affine part matters
// (Init's LN 1/0 and 0.02-scale weights would hide missing terms).
std::vector<Tensor> RandomParams(const TransformerBlock& block, uint64_t seed) {
  std::vector<Tensor> p;
  block.Init(seed, 0, &p);
  const std::vector<ParamSpec> specs = block.params();
  for (size_t i = 0; i < p.size(); ++i) {
    const std::string& name = specs[i].name;
    const int64_t n = static_cast<int64_t>(p[i].data.size());
    Matrix m;
    if (name == "ln1.weight" || name == "ln2.weight") {
      m = RandomMatrix(1, n, seed + i, 0.5f, 1.5f);
    } else if (name.find("bias") != std::string::npos) {
      m = RandomMatrix(1, n, seed + i, -0.3f, 0.3f);
    } else {
      const float bound = 1.5f / std::sqrt(static_cast<float>(specs[i].shape[1]));
      m = RandomMatrix(1, n, seed + i, -bound, bound);
    }
    p[i].data.assign(m.data(), m.data() + n);
  }
  return p;
}

// Straightforward double-precision forward pass of the documented block, for comparison.
Matrix ReferenceForward(const std::vector<Tensor>& p, const Matrix& x, int64_t heads,
                        int64_t context) {
  const int64_t n = x.rows();
  const int64_t d = x.cols();
  const int64_t hid = static_cast<int64_t>(p[9].data.size());
  const int64_t hd = d / heads;
  using MatD = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  auto layer_norm = [&](const MatD& in, const Tensor& g, const Tensor& b) {
    MatD out(in.rows(), in.cols());
    for (int64_t r = 0; r < in.rows(); ++r) {
      const double mean = in.row(r).mean();
      const double var = (in.row(r).array() - mean).square().mean();
      for (int64_t j = 0; j < in.cols(); ++j) {
        out(r, j) = (in(r, j) - mean) / std::sqrt(var + 1e-5) * g.data[j] + b.data[j];
      }
    }
    return out;
  };
  auto linear = [&](const MatD& in, const Tensor& w, const Tensor& b) {
    const int64_t out_f = static_cast<int64_t>(b.data.size());
    MatD out(in.rows(), out_f);
    for (int64_t r = 0; r < in.rows(); ++r) {
      for (int64_t o = 0; o < out_f; ++o) {
        double s = b.data[o];
        for (int64_t i = 0; i < in.cols(); ++i) s += in(r, i) * w.data[o * in.cols() + i];
        out(r, o) = s;
      }
    }
    return out;
  };
  const MatD xd = x.cast<double>();
  const MatD qkv = linear(layer_norm(xd, p[0], p[1]), p[2], p[3]);
  MatD attn = MatD::Zero(n, d);
  for (int64_t s = 0; s < n / context; ++s) {
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t i = 0; i < context; ++i) {
        std::vector<double> w(static_cast<size_t>(i + 1));
        double mx = -1e300;
        for (int64_t j = 0; j <= i; ++j) {
          double dot = 0;
          for (int64_t c = 0; c < hd; ++c) {
            dot += qkv(s * context + i, h * hd + c) * qkv(s * context + j, d + h * hd + c);
          }
          w[j] = dot / std::sqrt(static_cast<double>(hd));
          mx = std::max(mx, w[j]);
        }
        double z = 0;
        for (double& v : w) z += (v = std::exp(v - mx));
        for (int64_t j = 0; j <= i; ++j) {
          for (int64_t c = 0; c < hd; ++c) {
            attn(s * context + i, h * hd + c) +=
                w[j] / z * qkv(s * context + j, 2 * d + h * hd + c);
          }
        }
      }
    }
  }
  const MatD h = xd + linear(attn, p[4], p[5]);
  MatD f = linear(layer_norm(h, p[6], p[7]), p[8], p[9]);
  for (int64_t i = 0; i < f.size(); ++i) {
    const double v = f.data()[i];
    f.data()[i] = 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
  }
  (void)hid;
  return (h + linear(f, p[10], p[11])).cast<float>();
}

TEST(TransformerBlockTest, ParamsInDocumentedOrder) {
  const TransformerBlock block(8, 2, 4, 3);
  const std::vector<ParamSpec> specs = block.params();
  const std::vector<std::pair<std::string, std::vector<int64_t>>> want = {
      {"ln1.weight", {8}},          {"ln1.bias", {8}},
      {"attn.qkv.weight", {24, 8}}, {"attn.qkv.bias", {24}},
      {"attn.proj.weight", {8, 8}}, {"attn.proj.bias", {8}},
      {"ln2.weight", {8}},          {"ln2.bias", {8}},
      {"mlp.fc.weight", {24, 8}},   {"mlp.fc.bias", {24}},
      {"mlp.proj.weight", {8, 24}}, {"mlp.proj.bias", {8}}};
  ASSERT_EQ(specs.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(specs[i].name, want[i].first);
    EXPECT_EQ(specs[i].shape, want[i].second) << want[i].first;
  }
  EXPECT_EQ(block.kind(), "transformer_block");
  EXPECT_EQ(block.row_multiple(), 4);
  EXPECT_EQ(block.in_features(), 8);
  EXPECT_EQ(block.out_features(), 8);
}

TEST(TransformerBlockTest, ForwardMatchesDoubleReference) {
  const TransformerBlock block(8, 2, 5, 4);
  const std::vector<Tensor> p = RandomParams(block, 1);
  const Matrix x = RandomMatrix(10, 8, 2, -2.0f, 2.0f);
  Matrix y(10, 8);
  Stash stash;
  block.Forward(p, AsConstMap(x), AsMap(y), &stash);
  EXPECT_EQ(static_cast<int64_t>(stash.data.size() * sizeof(float)), block.StashBytes(10));
  const Matrix want = ReferenceForward(p, x, 2, 5);
  EXPECT_LT((y - want).cwiseAbs().maxCoeff(), 2e-5) << y << "\n\n" << want;
}

TEST(TransformerBlockTest, GradientsMatchFiniteDifferences) {
  // Two samples of context 4, two heads of width 4, MLP ratio 2.
  const TransformerBlock block(8, 2, 4, 2);
  ExpectLayerGradientsMatch(block, RandomParams(block, 3), RandomMatrix(8, 8, 4, -1.5f, 1.5f),
                            RandomMatrix(8, 8, 5), /*check_input=*/true);
}

// A context of two causal query blocks (gqa_attention.h, kCausalBlock), the second one short.
TEST(TransformerBlockTest, GradientsMatchFiniteDifferencesOverSeveralQueryBlocks) {
  const int64_t t = kCausalBlock + 5;
  const TransformerBlock block(8, 2, t, 2);
  ExpectLayerGradientsMatch(block, RandomParams(block, 13), RandomMatrix(t, 8, 14, -1.5f, 1.5f),
                            RandomMatrix(t, 8, 15), /*check_input=*/true);
}

TEST(TransformerBlockTest, AttentionIsCausalAndSamplesAreIndependent) {
  const int64_t t = 6;
  const TransformerBlock block(8, 2, t, 2);
  const std::vector<Tensor> p = RandomParams(block, 7);
  const Matrix x = RandomMatrix(3 * t, 8, 8);
  const LayerRun base = RunLayer(block, p, x, RandomMatrix(3 * t, 8, 9));
  // Change token 3 of sample 1 (not by a constant, which LN1 would remove): sample 1's positions
  // 0..2 and samples 0 and 2 must be bitwise untouched, positions 3..5 of sample 1 must change.
  Matrix x2 = x;
  for (int64_t j = 0; j < 8; ++j) x2(t + 3, j) += 0.1f * static_cast<float>(j);
  Matrix y2(3 * t, 8);
  Stash stash;
  block.Forward(p, AsConstMap(x2), AsMap(y2), &stash);
  for (int64_t r = 0; r < 3 * t; ++r) {
    const bool affected = r >= t + 3 && r < 2 * t;
    const bool same = base.y.row(r) == y2.row(r);
    EXPECT_EQ(same, !affected) << "row " << r;
  }
}

TEST(TransformerBlockTest, BackwardWeightAccumulates) {
  const TransformerBlock block(8, 2, 4, 2);
  const std::vector<Tensor> p = RandomParams(block, 3);
  const Matrix x = RandomMatrix(8, 8, 4);
  const Matrix dy = RandomMatrix(8, 8, 5);
  LayerRun run = RunLayer(block, p, x, dy);
  const std::vector<Tensor> once = run.grads;
  block.BackwardWeight(p, AsConstMap(x), AsConstMap(dy), run.stash, absl::MakeSpan(run.grads));
  for (size_t i = 0; i < p.size(); ++i) {
    for (size_t k = 0; k < once[i].data.size(); ++k) {
      EXPECT_NEAR(run.grads[i].data[k], 2 * once[i].data[k], 1e-5 * MaxAbs(once[i].data))
          << block.params()[i].name;
    }
  }
}

TEST(TransformerBlockTest, ZeroRowDxGivesIdenticalWeightGradients) {
  const TransformerBlock block(8, 2, 4, 2);
  const std::vector<Tensor> p = RandomParams(block, 3);
  const Matrix x = RandomMatrix(8, 8, 4);
  const Matrix dy = RandomMatrix(8, 8, 5);
  const LayerRun with = RunLayer(block, p, x, dy, true);
  const LayerRun without = RunLayer(block, p, x, dy, false);
  EXPECT_EQ(without.dx.rows(), 0);
  for (size_t i = 0; i < p.size(); ++i) {
    EXPECT_TRUE(BitwiseEqual(with.grads[i].data, without.grads[i].data)) << block.params()[i].name;
  }
}

// Zero-bubble order F1 F2 I1 I2 W1 W2 must accumulate the same bits as F1 I1 W1 F2 I2 W2: all
// state lives in the per-micro-batch stash.
TEST(TransformerBlockTest, SplitBackwardOrderDoesNotMatter) {
  const TransformerBlock block(8, 2, 4, 2);
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
  Matrix y(8, 8), dx[2] = {Matrix(8, 8), Matrix(8, 8)}, dx_seq(8, 8);
  Stash s[2];
  for (int m = 0; m < 2; ++m) {
    Stash st;
    block.Forward(p, AsConstMap(x[m]), AsMap(y), &st);
    block.BackwardInput(p, AsConstMap(x[m]), AsConstMap(dy[m]), &st, AsMap(dx_seq));
    block.BackwardWeight(p, AsConstMap(x[m]), AsConstMap(dy[m]), st, absl::MakeSpan(seq));
  }
  for (int m = 0; m < 2; ++m) block.Forward(p, AsConstMap(x[m]), AsMap(y), &s[m]);
  for (int m = 0; m < 2; ++m) {
    block.BackwardInput(p, AsConstMap(x[m]), AsConstMap(dy[m]), &s[m], AsMap(dx[m]));
  }
  for (int m = 0; m < 2; ++m) {
    block.BackwardWeight(p, AsConstMap(x[m]), AsConstMap(dy[m]), s[m], absl::MakeSpan(split));
  }
  EXPECT_TRUE(BitwiseEqual(AsConstMap(dx[1]), AsConstMap(dx_seq)));
  for (size_t i = 0; i < p.size(); ++i) {
    EXPECT_TRUE(BitwiseEqual(seq[i].data, split[i].data)) << block.params()[i].name;
  }
}

// Every stash element is written before it is read (a Stash leaves the elements a resize adds
// uninitialised, layer.h): F, I and W on a stash of the right size filled with NaN give the bits
// of F, I and W on an empty one.
TEST(TransformerBlockTest, StashFilledWithNanGivesTheBitsOfAnEmptyOne) {
  const TransformerBlock block(8, 2, 12, 2);
  ExpectNanStashGivesTheBitsOfAnEmptyOne(block, RandomParams(block, 3), RandomMatrix(24, 8, 4),
                                         RandomMatrix(24, 8, 5));
}

TEST(TransformerBlockTest, StashIsReusedWhenSizeMatches) {
  const TransformerBlock block(8, 2, 4, 2);
  const std::vector<Tensor> p = RandomParams(block, 3);
  const Matrix x = RandomMatrix(8, 8, 4);
  Matrix y(8, 8);
  Stash stash;
  block.Forward(p, AsConstMap(x), AsMap(y), &stash);
  const float* first = stash.data.data();
  block.Forward(p, AsConstMap(x), AsMap(y), &stash);
  EXPECT_EQ(stash.data.data(), first);
}

TEST(TransformerBlockTest, FlopsFollowDocumentedFormula) {
  const int64_t d = 16, heads = 4, t = 20, ratio = 4, rows = 3 * t, hid = ratio * d;
  const TransformerBlock block(d, heads, t, ratio);
  const FlopCount f = block.Flops(rows);
  const double n = rows;
  const double weight_gemm = 2 * n * (3 * d * d + d * d + d * hid + hid * d);
  // Keys per query row the causal tiles compute (gqa_attention.h).
  const double keys = CausalScoreEntries(t) / t;
  const double attn_gemm = 2 * n * keys * d;  // one product over the computed scores
  const double scores = n * heads * keys;
  const double biases = n * (3 * d + d + hid + d);
  EXPECT_DOUBLE_EQ(f.forward, weight_gemm + 2 * attn_gemm + biases + 14 * n * d + 8 * scores +
                                  10 * n * hid + 2 * n * d);
  EXPECT_DOUBLE_EQ(f.backward_input,
                   weight_gemm + 4 * attn_gemm + 22 * n * d + 5 * scores + 16 * n * hid);
  EXPECT_DOUBLE_EQ(f.backward_weight, weight_gemm + biases + 10 * n * d);
}

// Same inputs and the same thread count give the same bits, with Eigen's products run on one
// thread and parallelised on two (sizes large enough for Eigen to split the GEMMs).
TEST(TransformerBlockTest, RepeatsBitsForEachThreadCount) {
  const TransformerBlock block(64, 4, 32, 4);
  const std::vector<Tensor> p = RandomParams(block, 2);
  const Matrix x = RandomMatrix(4 * 32, 64, 3);
  const Matrix dy = RandomMatrix(4 * 32, 64, 4);
  ExpectBitwiseRepeatableForEachThreadCount(block, p, x, dy);
}

TEST(TransformerBlockTest, BitsDoNotDependOnBufferAlignment) {
  const TransformerBlock block(12, 3, 5, 2);
  ExpectBitwiseStableUnderRealignment(block, RandomParams(block, 1), RandomMatrix(10, 12, 2),
                                      RandomMatrix(10, 12, 3));
}

}  // namespace
}  // namespace pipetrain::math
