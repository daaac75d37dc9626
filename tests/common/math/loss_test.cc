#include "common/math/loss.h"

#include <cmath>
#include <limits>
#include <memory>

#include "gtest/gtest.h"
#include "tests/common/math/grad_check.h"

namespace pipetrain::math {
namespace {

using testing::BitwiseEqual;
using testing::CheckGradient;
using testing::GradCheckResult;
using testing::RandomMatrix;

Matrix Labels(std::vector<float> v) {
  Matrix t(static_cast<int64_t>(v.size()), 1);
  for (size_t i = 0; i < v.size(); ++i) t(static_cast<int64_t>(i), 0) = v[i];
  return t;
}

Matrix NoGrad(int64_t cols) { return Matrix(0, cols); }

double NaiveCrossEntropy(const Matrix& pred, const Matrix& t) {
  double total = 0;
  for (int64_t r = 0; r < pred.rows(); ++r) {
    double z = 0;
    for (int64_t j = 0; j < pred.cols(); ++j) z += std::exp(double{pred(r, j)});
    total += std::log(z) - pred(r, static_cast<int64_t>(t(r, 0)));
  }
  return total;
}

TEST(SoftmaxCrossEntropyTest, Basics) {
  const auto loss = MakeSoftmaxCrossEntropy();
  EXPECT_EQ(loss->kind(), "softmax_cross_entropy");
  EXPECT_EQ(loss->target_features(10), 1);
  const Matrix pred = RandomMatrix(6, 4, 1, -3.0f, 3.0f);
  const Matrix t = Labels({0, 3, 2, 2, 1, 0});
  ASSERT_TRUE(loss->CheckTargets(AsConstMap(t), 4).ok());
  Matrix g(6, 4);
  const double v = loss->LossAndGrad(AsConstMap(pred), AsConstMap(t), 0.5, AsMap(g));
  EXPECT_NEAR(v, 0.5 * NaiveCrossEntropy(pred, t), 1e-12);
  // Each gradient row sums to zero (softmax minus one-hot) and is scaled.
  for (int64_t r = 0; r < 6; ++r) EXPECT_NEAR(g.row(r).sum(), 0.0f, 1e-7);
  // Uniform logits give ln(C) per row.
  Matrix zero = Matrix::Zero(3, 5);
  Matrix no = NoGrad(5);
  EXPECT_NEAR(loss->LossAndGrad(AsConstMap(zero), AsConstMap(Labels({0, 1, 4})), 1.0, AsMap(no)),
              3 * std::log(5.0), 1e-13);
}

TEST(SoftmaxCrossEntropyTest, StableForHugeLogits) {
  const auto loss = MakeSoftmaxCrossEntropy();
  Matrix pred(2, 3);
  pred << 1000.0f, -1000.0f, 0.0f, -5000.0f, -5001.0f, -5000.0f;
  const Matrix t = Labels({1, 1});
  Matrix g(2, 3);
  const double v = loss->LossAndGrad(AsConstMap(pred), AsConstMap(t), 1.0, AsMap(g));
  EXPECT_TRUE(std::isfinite(v));
  EXPECT_NEAR(v, 2000.0 + (1.0 + std::log(2.0 + std::exp(-1.0))), 1e-9);
  EXPECT_TRUE(g.allFinite());
  EXPECT_NEAR(g(0, 0), 1.0f, 1e-7);
  EXPECT_NEAR(g(0, 1), -1.0f, 1e-7);
}

TEST(SoftmaxCrossEntropyTest, GradientMatchesFiniteDifferences) {
  const auto loss = MakeSoftmaxCrossEntropy();
  Matrix pred = RandomMatrix(5, 7, 2, -2.0f, 2.0f);
  const Matrix t = Labels({6, 0, 3, 3, 1});
  const double scale = 1.0 / 8;
  Matrix g(5, 7);
  loss->LossAndGrad(AsConstMap(pred), AsConstMap(t), scale, AsMap(g));
  Matrix no = NoGrad(7);
  const GradCheckResult r = CheckGradient(
      [&] { return loss->LossAndGrad(AsConstMap(pred), AsConstMap(t), scale, AsMap(no)); },
      pred.data(), pred.size(), g.data());
  EXPECT_TRUE(r.ok) << r.ToString();
  EXPECT_LT(r.max_error, 1e-3) << r.ToString();
}

TEST(SoftmaxCrossEntropyTest, CheckTargetsNamesTheRow) {
  const auto loss = MakeSoftmaxCrossEntropy();
  struct Case {
    float bad;
    const char* what;
  };
  for (const Case c :
       {Case{std::numeric_limits<float>::quiet_NaN(), "not finite"},
        Case{std::numeric_limits<float>::infinity(), "not finite"}, Case{1.5f, "not an integer"},
        Case{-1.0f, "out of range"}, Case{4.0f, "out of range"}}) {
    const Matrix t = Labels({0, 1, 2, c.bad});
    const absl::Status s = loss->CheckTargets(AsConstMap(t), 4);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("row 3"), std::string::npos) << s;
    EXPECT_NE(s.message().find(c.what), std::string::npos) << s;
  }
  const Matrix wide = Matrix::Zero(2, 2);
  EXPECT_EQ(loss->CheckTargets(AsConstMap(wide), 4).code(), absl::StatusCode::kInvalidArgument);
}

TEST(SoftmaxCrossEntropyTest, CountCorrectUsesFirstMaximum) {
  const auto loss = MakeSoftmaxCrossEntropy();
  Matrix pred(4, 3);
  pred << 0.1f, 0.9f, 0.0f,  //
      2.0f, 2.0f, 1.0f,      // tie: the first maximum (0) counts
      -1.0f, -2.0f, -0.5f,   //
      0.0f, 0.0f, 0.0f;
  EXPECT_EQ(loss->CountCorrect(AsConstMap(pred), AsConstMap(Labels({1, 0, 2, 1}))), 3);
}

// With scale 1/B, the micro-batch gradients are the rows of the full-batch gradient, bit for bit,
// and the micro-batch losses add up to the batch mean.
TEST(SoftmaxCrossEntropyTest, MicrobatchScalingComposes) {
  const auto loss = MakeSoftmaxCrossEntropy();
  const Matrix pred = RandomMatrix(8, 5, 3, -2.0f, 2.0f);
  const Matrix t = Labels({0, 1, 2, 3, 4, 0, 1, 2});
  Matrix g_full(8, 5);
  const double full = loss->LossAndGrad(AsConstMap(pred), AsConstMap(t), 1.0 / 8, AsMap(g_full));
  double sum = 0;
  for (int m = 0; m < 4; ++m) {
    ConstMatrixMap p(pred.data() + m * 2 * 5, 2, 5);
    ConstMatrixMap tm(t.data() + m * 2, 2, 1);
    Matrix g(2, 5);
    sum += loss->LossAndGrad(p, tm, 1.0 / 8, AsMap(g));
    EXPECT_TRUE(BitwiseEqual(AsConstMap(g), ConstMatrixMap(g_full.data() + m * 2 * 5, 2, 5)));
  }
  EXPECT_NEAR(sum, full, 1e-15);
  EXPECT_NEAR(full, NaiveCrossEntropy(pred, t) / 8, 1e-12);
}

TEST(SoftmaxCrossEntropyTest, SkippingTheGradientGivesTheSameLoss) {
  const auto loss = MakeSoftmaxCrossEntropy();
  const Matrix pred = RandomMatrix(4, 3, 3);
  const Matrix t = Labels({0, 1, 2, 1});
  Matrix g(4, 3);
  Matrix no = NoGrad(3);
  EXPECT_EQ(loss->LossAndGrad(AsConstMap(pred), AsConstMap(t), 0.25, AsMap(g)),
            loss->LossAndGrad(AsConstMap(pred), AsConstMap(t), 0.25, AsMap(no)));
}

TEST(MseTest, Basics) {
  const auto loss = MakeMse();
  EXPECT_EQ(loss->kind(), "mse");
  EXPECT_EQ(loss->target_features(3), 3);
  Matrix pred(2, 2);
  pred << 1, 2, 3, 4;
  Matrix t(2, 2);
  t << 0, 2, 5, 3;
  Matrix g(2, 2);
  // Rows: (1 + 0) / 2 = 0.5, (4 + 1) / 2 = 2.5; scale 1/2 -> 1.5, the mean over all elements.
  EXPECT_DOUBLE_EQ(loss->LossAndGrad(AsConstMap(pred), AsConstMap(t), 0.5, AsMap(g)), 1.5);
  Matrix want(2, 2);
  want << 0.5f, 0.0f, -1.0f, 0.5f;  // 2 (p - t) / F * scale
  EXPECT_EQ(g, want);
  EXPECT_EQ(loss->CountCorrect(AsConstMap(pred), AsConstMap(t)), 0);
}

TEST(MseTest, GradientMatchesFiniteDifferences) {
  const auto loss = MakeMse();
  Matrix pred = RandomMatrix(4, 6, 5);
  const Matrix t = RandomMatrix(4, 6, 6);
  Matrix g(4, 6);
  loss->LossAndGrad(AsConstMap(pred), AsConstMap(t), 0.25, AsMap(g));
  Matrix no = NoGrad(6);
  const GradCheckResult r = CheckGradient(
      [&] { return loss->LossAndGrad(AsConstMap(pred), AsConstMap(t), 0.25, AsMap(no)); },
      pred.data(), pred.size(), g.data());
  EXPECT_TRUE(r.ok) << r.ToString();
  EXPECT_LT(r.max_error, 1e-3) << r.ToString();
}

TEST(MseTest, CheckTargets) {
  const auto loss = MakeMse();
  Matrix t = Matrix::Zero(3, 2);
  EXPECT_TRUE(loss->CheckTargets(AsConstMap(t), 2).ok());
  EXPECT_EQ(loss->CheckTargets(AsConstMap(t), 3).code(), absl::StatusCode::kInvalidArgument);
  t(2, 1) = std::numeric_limits<float>::infinity();
  const absl::Status s = loss->CheckTargets(AsConstMap(t), 2);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("row 2"), std::string::npos) << s;
}

TEST(LossTest, BitsDoNotDependOnBufferAlignment) {
  for (const auto& loss : {MakeSoftmaxCrossEntropy(), MakeMse()}) {
    const Matrix pred = RandomMatrix(5, 7, 1);
    const Matrix t = loss->kind() == "mse" ? RandomMatrix(5, 7, 2) : Labels({0, 6, 2, 3, 3});
    Matrix g(5, 7);
    const double v = loss->LossAndGrad(AsConstMap(pred), AsConstMap(t), 0.2, AsMap(g));
    std::vector<float> buf(pred.size() + t.size() + g.size() + 3);
    float* p = buf.data() + 1;
    float* tt = p + pred.size() + 1;
    float* gg = tt + t.size() + 1;
    std::copy(pred.data(), pred.data() + pred.size(), p);
    std::copy(t.data(), t.data() + t.size(), tt);
    const double v2 = loss->LossAndGrad(
        ConstMatrixMap(p, 5, 7), ConstMatrixMap(tt, t.rows(), t.cols()), 0.2, MatrixMap(gg, 5, 7));
    EXPECT_EQ(v, v2) << loss->kind();
    EXPECT_TRUE(BitwiseEqual(AsConstMap(g), ConstMatrixMap(gg, 5, 7))) << loss->kind();
  }
}

}  // namespace
}  // namespace pipetrain::math
