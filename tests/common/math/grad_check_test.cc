// Proves the finite-difference checker itself: it accepts a correct gradient and rejects a
// negated one, one off by 5%, and one missing a term.
#include "tests/common/math/grad_check.h"

#include <vector>

#include "common/math/layer_norm.h"
#include "gtest/gtest.h"

namespace pipetrain::math::testing {
namespace {

// f(v) = sum_i c_i v_i^3 + v_0 v_1: gradient 3 c_i v_i^2 + [i == 0] v_1 + [i == 1] v_0.
struct Cubic {
  std::vector<float> v{0.3f, -0.7f, 1.1f, 0.05f, -1.4f};
  std::vector<float> c{1.0f, 2.0f, -0.5f, 3.0f, 0.25f};
  double Value() const {
    double s = double{v[0]} * v[1];
    for (size_t i = 0; i < v.size(); ++i) s += c[i] * double{v[i]} * v[i] * v[i];
    return s;
  }
  std::vector<float> Grad(bool with_cross_term) const {
    std::vector<float> g(v.size());
    for (size_t i = 0; i < v.size(); ++i) g[i] = static_cast<float>(3.0 * c[i] * v[i] * v[i]);
    if (with_cross_term) {
      g[0] += v[1];
      g[1] += v[0];
    }
    return g;
  }
};

TEST(GradCheckTest, AcceptsCorrectGradient) {
  Cubic f;
  const std::vector<float> g = f.Grad(true);
  const GradCheckResult r = CheckGradient([&] { return f.Value(); }, f.v.data(), 5, g.data());
  EXPECT_TRUE(r.ok) << r.ToString();
  EXPECT_LT(r.max_error, 1e-3);
}

TEST(GradCheckTest, RejectsNegatedGradient) {
  Cubic f;
  std::vector<float> g = f.Grad(true);
  for (float& v : g) v = -v;
  const GradCheckResult r = CheckGradient([&] { return f.Value(); }, f.v.data(), 5, g.data());
  EXPECT_FALSE(r.ok);
  EXPECT_GT(r.max_error, 1.0);
}

TEST(GradCheckTest, RejectsGradientOffByFivePercent) {
  Cubic f;
  std::vector<float> g = f.Grad(true);
  g[2] *= 1.05f;
  const GradCheckResult r = CheckGradient([&] { return f.Value(); }, f.v.data(), 5, g.data());
  EXPECT_FALSE(r.ok) << r.ToString();
  EXPECT_EQ(r.worst, 2);
}

TEST(GradCheckTest, RejectsMissingTerm) {
  Cubic f;
  const std::vector<float> g = f.Grad(false);
  const GradCheckResult r = CheckGradient([&] { return f.Value(); }, f.v.data(), 5, g.data());
  EXPECT_FALSE(r.ok) << r.ToString();
}

TEST(GradCheckTest, RestoresValuesBitExactly) {
  Cubic f;
  const std::vector<float> before = f.v;
  const std::vector<float> g = f.Grad(true);
  CheckGradient([&] { return f.Value(); }, f.v.data(), 5, g.data());
  EXPECT_TRUE(BitwiseEqual(before, f.v));
}

// A realistic missing term: LayerNorm's input gradient without the "- mean(g)" part.
TEST(GradCheckTest, RejectsLayerNormGradientMissingMeanTerm) {
  const int64_t rows = 3;
  const int64_t f = 6;
  Matrix x = RandomMatrix(rows, f, 1);
  const Matrix up = RandomMatrix(rows, f, 2);
  std::vector<float> gamma(f), beta(f);
  for (int64_t j = 0; j < f; ++j) {
    gamma[j] = 0.5f + 0.1f * static_cast<float>(j);
    beta[j] = 0.1f * static_cast<float>(j);
  }
  Matrix y(rows, f), dx(rows, f);
  std::vector<float> mean(rows), rstd(rows);
  LayerNormForward(AsConstMap(x), gamma.data(), beta.data(), 1e-5f, AsMap(y), mean.data(),
                   rstd.data());
  LayerNormBackwardInput(AsConstMap(x), AsConstMap(up), gamma.data(), mean.data(), rstd.data(),
                         false, AsMap(dx));
  auto objective = [&] {
    LayerNormForward(AsConstMap(x), gamma.data(), beta.data(), 1e-5f, AsMap(y), mean.data(),
                     rstd.data());
    return Dot(AsConstMap(y), AsConstMap(up));
  };
  EXPECT_TRUE(CheckGradient(objective, x.data(), x.size(), dx.data()).ok);
  Matrix wrong = dx;
  for (int64_t r = 0; r < rows; ++r) {
    double mean_g = 0;
    for (int64_t j = 0; j < f; ++j) mean_g += double{up(r, j)} * gamma[j] / f;
    for (int64_t j = 0; j < f; ++j) wrong(r, j) += static_cast<float>(rstd[r] * mean_g);
  }
  const GradCheckResult r = CheckGradient(objective, x.data(), x.size(), wrong.data());
  EXPECT_FALSE(r.ok) << r.ToString();
}

}  // namespace
}  // namespace pipetrain::math::testing
