#include "common/math/optimizer.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pipetrain::math {
namespace {

using ::testing::HasSubstr;

std::vector<std::vector<float>> ZeroState(const OptimizerConfig& c, size_t n) {
  return std::vector<std::vector<float>>(OptimizerStateNames(c).size(), std::vector<float>(n, 0));
}

TEST(OptimizerTest, SgdMomentumMatchesHandComputedSteps) {
  OptimizerConfig c;
  c.kind = OptimizerKind::kSgd;
  c.lr = 0.5f;
  c.momentum = 0.5f;
  std::vector<float> p = {1.0f, -2.0f};
  const std::vector<float> g = {0.25f, 1.0f};
  auto state = ZeroState(c, p.size());
  ASSERT_EQ(state.size(), 1u);
  OptimizerStep(c, 1, 1.0f, g, absl::MakeSpan(p), absl::MakeSpan(state));
  // buf = g; p -= lr * buf. All values are exact binary fractions.
  EXPECT_EQ(p[0], 0.875f);
  EXPECT_EQ(p[1], -2.5f);
  OptimizerStep(c, 2, 1.0f, g, absl::MakeSpan(p), absl::MakeSpan(state));
  // buf = 0.5 * g + g = 1.5 g; p -= 0.5 * 1.5 g.
  EXPECT_EQ(state[0][0], 0.375f);
  EXPECT_EQ(p[0], 0.875f - 0.1875f);
  EXPECT_EQ(p[1], -2.5f - 0.75f);
}

TEST(OptimizerTest, SgdNesterovAndWeightDecay) {
  OptimizerConfig c;
  c.kind = OptimizerKind::kSgd;
  c.lr = 0.5f;
  c.momentum = 0.5f;
  c.nesterov = true;
  c.weight_decay = 0.5f;
  std::vector<float> p = {2.0f};
  const std::vector<float> g = {1.0f};
  auto state = ZeroState(c, 1);
  OptimizerStep(c, 1, 1.0f, g, absl::MakeSpan(p), absl::MakeSpan(state));
  // g' = 1 + 0.5*2 = 2; buf = 2; nesterov: g'' = 2 + 0.5*2 = 3; p = 2 - 1.5.
  EXPECT_EQ(state[0][0], 2.0f);
  EXPECT_EQ(p[0], 0.5f);
}

TEST(OptimizerTest, GradScaleMultipliesGradient) {
  OptimizerConfig c;
  c.kind = OptimizerKind::kSgd;
  c.lr = 1.0f;
  std::vector<float> p = {1.0f};
  const std::vector<float> g = {1.0f};
  std::vector<std::vector<float>> state;
  OptimizerStep(c, 1, 0.25f, g, absl::MakeSpan(p), absl::MakeSpan(state));
  EXPECT_EQ(p[0], 0.75f);
}

TEST(OptimizerTest, AdamWFollowsTheDecoupledUpdate) {
  OptimizerConfig c;
  c.kind = OptimizerKind::kAdamW;
  c.lr = 0.1f;
  c.weight_decay = 0.1f;
  std::vector<float> p = {1.0f, 0.5f};
  const std::vector<float> g1 = {0.5f, -2.0f};
  const std::vector<float> g2 = {-0.25f, 1.0f};
  auto state = ZeroState(c, p.size());
  ASSERT_EQ(state.size(), 2u);
  // Independent double-precision evaluation of the AdamW formulas.
  std::vector<double> pd = {1.0, 0.5}, m = {0, 0}, v = {0, 0};
  for (int t = 1; t <= 2; ++t) {
    const auto& g = t == 1 ? g1 : g2;
    OptimizerStep(c, t, 1.0f, g, absl::MakeSpan(p), absl::MakeSpan(state));
    for (int i = 0; i < 2; ++i) {
      pd[i] *= 1.0 - 0.1 * 0.1;
      m[i] = 0.9 * m[i] + 0.1 * g[i];
      v[i] = 0.999 * v[i] + 0.001 * g[i] * g[i];
      const double mhat = m[i] / (1 - std::pow(0.9, t));
      const double vhat = v[i] / (1 - std::pow(0.999, t));
      pd[i] -= 0.1 * mhat / (std::sqrt(vhat) + 1e-8);
      EXPECT_NEAR(p[i], pd[i], 1e-6) << "step " << t << " element " << i;
      EXPECT_NEAR(state[0][i], m[i], 1e-7);
      EXPECT_NEAR(state[1][i], v[i], 1e-7);
    }
  }
  // First AdamW step moves each parameter by ~lr against the gradient sign (after decay).
  EXPECT_LT(p[0], 0.99f * 1.0f);
}

TEST(OptimizerTest, StepsAreBitwiseReproducible) {
  OptimizerConfig c;
  c.weight_decay = 0.01f;
  std::vector<float> g(1000), p1(1000), p2(1000);
  for (int i = 0; i < 1000; ++i) {
    g[i] = std::sin(0.37f * i);
    p1[i] = p2[i] = std::cos(0.11f * i);
  }
  auto s1 = ZeroState(c, g.size()), s2 = ZeroState(c, g.size());
  for (int t = 1; t <= 3; ++t) {
    OptimizerStep(c, t, 0.7f, g, absl::MakeSpan(p1), absl::MakeSpan(s1));
    OptimizerStep(c, t, 0.7f, g, absl::MakeSpan(p2), absl::MakeSpan(s2));
  }
  EXPECT_EQ(0, std::memcmp(p1.data(), p2.data(), p1.size() * sizeof(float)));
}

// The documented formulas, one element at a time, as plainly as they read.
void ScalarStep(const OptimizerConfig& c, int64_t step, float scale, const std::vector<float>& grad,
                std::vector<float>* param, std::vector<std::vector<float>>* state) {
  const float lr = LearningRateAt(c.schedule, c.lr, step);
  for (size_t i = 0; i < param->size(); ++i) {
    float& p = (*param)[i];
    if (c.kind == OptimizerKind::kSgd) {
      float g = grad[i] * scale + c.weight_decay * p;
      if (!state->empty()) {
        float& b = (*state)[0][i];
        b = c.momentum * b + g;
        g = c.nesterov ? g + c.momentum * b : b;
      }
      p -= lr * g;
    } else {
      const float g = grad[i] * scale;
      const float bias1 = static_cast<float>(1.0 - std::pow(static_cast<double>(c.beta1), step));
      const float bias2 = static_cast<float>(1.0 - std::pow(static_cast<double>(c.beta2), step));
      float& m = (*state)[0][i];
      float& v = (*state)[1][i];
      p *= 1.0f - lr * c.weight_decay;
      m = c.beta1 * m + (1.0f - c.beta1) * g;
      v = c.beta2 * v + (1.0f - c.beta2) * g * g;
      p -= (lr / bias1) * m / (std::sqrt(v) / std::sqrt(bias2) + c.eps);
    }
  }
}

// The update runs as vector code; every element must still get the scalar formula's bits, for
// lengths that are and are not multiples of the vector width.
TEST(OptimizerTest, EveryKindEqualsTheElementwiseFormulaBitForBit) {
  std::vector<OptimizerConfig> configs;
  for (const char* text :
       {"sgd:lr=0.05", "sgd:lr=0.05,weight_decay=0.01", "sgd:lr=0.05,momentum=0.9",
        "sgd:lr=0.05,momentum=0.9,nesterov=true,"
        "weight_decay=0.001",
        "adamw:lr=0.01", "adamw:lr=0.01,weight_decay=0.1,eps=1e-6"}) {
    absl::StatusOr<OptimizerConfig> c = ParseOptimizerConfig(text);
    ASSERT_TRUE(c.ok()) << c.status();
    configs.push_back(*c);
  }
  for (const OptimizerConfig& c : configs) {
    for (size_t n : {1, 7, 8, 9, 31, 1000, 4099}) {
      std::vector<float> p1(n), g(n);
      for (size_t i = 0; i < n; ++i) {
        // Mixed magnitudes and signs, and exact zeros, so that any reordering would show.
        p1[i] = (i % 5 == 0) ? 0.0f : static_cast<float>(std::cos(0.11 * i) * (i % 3 ? 1e-3 : 10));
      }
      std::vector<float> p2 = p1;
      auto s1 = ZeroState(c, n), s2 = ZeroState(c, n);
      for (int t = 1; t <= 4; ++t) {
        for (size_t i = 0; i < n; ++i) {
          g[i] = static_cast<float>(std::sin(0.37 * i + t) * (i % 7 ? 1e-2 : 1e3));
        }
        OptimizerStep(c, t, 0.7f, g, absl::MakeSpan(p1), absl::MakeSpan(s1));
        ScalarStep(c, t, 0.7f, g, &p2, &s2);
        ASSERT_EQ(0, std::memcmp(p1.data(), p2.data(), n * sizeof(float)))
            << FormatOptimizerConfig(c) << " n=" << n << " step " << t;
        for (size_t k = 0; k < s1.size(); ++k) {
          ASSERT_EQ(0, std::memcmp(s1[k].data(), s2[k].data(), n * sizeof(float)))
              << FormatOptimizerConfig(c) << " state " << k << " n=" << n << " step " << t;
        }
      }
    }
  }
}

TEST(OptimizerTest, ParseAndFormatRoundTrip) {
  auto c = ParseOptimizerConfig("sgd:lr=0.05,momentum=0.9,nesterov=true,clip_norm=1.5");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->kind, OptimizerKind::kSgd);
  EXPECT_EQ(c->lr, 0.05f);
  EXPECT_EQ(c->momentum, 0.9f);
  EXPECT_TRUE(c->nesterov);
  EXPECT_EQ(c->clip_norm, 1.5f);
  auto again = ParseOptimizerConfig(FormatOptimizerConfig(*c));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->lr, c->lr);
  EXPECT_EQ(again->momentum, c->momentum);
  EXPECT_EQ(again->nesterov, c->nesterov);
  EXPECT_EQ(again->clip_norm, c->clip_norm);

  auto a = ParseOptimizerConfig("adamw");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->kind, OptimizerKind::kAdamW);
  EXPECT_EQ(a->lr, 1e-3f);
  auto a2 = ParseOptimizerConfig(FormatOptimizerConfig(*a));
  ASSERT_TRUE(a2.ok());
  EXPECT_EQ(a2->beta2, a->beta2);
  EXPECT_EQ(a2->eps, a->eps);
}

TEST(OptimizerTest, ParseRejectsBadInputWithReasons) {
  EXPECT_THAT(ParseOptimizerConfig("rmsprop").status().message(), HasSubstr("unknown kind"));
  EXPECT_THAT(ParseOptimizerConfig("sgd:foo=1").status().message(), HasSubstr("unknown key 'foo'"));
  EXPECT_THAT(ParseOptimizerConfig("sgd:lr=abc").status().message(),
              HasSubstr("lr must be a decimal number"));
  EXPECT_THAT(ParseOptimizerConfig("sgd:lr").status().message(), HasSubstr("key=value"));
  EXPECT_THAT(ParseOptimizerConfig("sgd:lr=-1").status().message(), HasSubstr("lr = -1"));
  EXPECT_THAT(ParseOptimizerConfig("sgd:momentum=1").status().message(),
              HasSubstr("momentum = 1 is out of range"));
  EXPECT_THAT(ParseOptimizerConfig("sgd:nesterov=1").status().message(),
              HasSubstr("nesterov needs momentum"));
  EXPECT_THAT(ParseOptimizerConfig("adamw:beta2=1.5").status().message(), HasSubstr("beta2"));
  EXPECT_THAT(ParseOptimizerConfig("adamw:eps=0").status().message(), HasSubstr("eps"));
  EXPECT_EQ(ParseOptimizerConfig("adamw:lr=nan").status().code(),
            absl::StatusCode::kInvalidArgument);
}

// Whitespace around the kind, keys and values is ignored; an item that is not exactly one
// key=value and a key of the other kind are refused (the Python client reads the text the same
// way: tests/client/conformance/optimizer_texts.json).
TEST(OptimizerTest, ParseIgnoresSpacesAndRefusesWhatWouldBeIgnored) {
  absl::StatusOr<OptimizerConfig> spaced = ParseOptimizerConfig(" sgd : lr = 0.5 , momentum=0.9 ");
  ASSERT_TRUE(spaced.ok()) << spaced.status();
  EXPECT_EQ(spaced->kind, OptimizerKind::kSgd);
  EXPECT_EQ(spaced->lr, 0.5f);
  EXPECT_EQ(spaced->momentum, 0.9f);
  EXPECT_THAT(ParseOptimizerConfig("sgd:lr=1=2").status().message(),
              HasSubstr("expected key=value, got 'lr=1=2'"));
  EXPECT_THAT(ParseOptimizerConfig("sgd:lr=1,").status().message(),
              HasSubstr("expected key=value, got ''"));
  EXPECT_THAT(ParseOptimizerConfig("adamw:momentum=0.9").status().message(),
              HasSubstr("momentum is not a key of adamw"));
  EXPECT_THAT(ParseOptimizerConfig("sgd:beta1=0.9").status().message(),
              HasSubstr("beta1 is not a key of sgd"));
  EXPECT_THAT(ParseOptimizerConfig("adamw:nesterov=0").status().message(),
              HasSubstr("nesterov is not a key of adamw"));
  // Numbers are decimal: absl::SimpleAtof alone would read "0x10" as 16.
  EXPECT_THAT(ParseOptimizerConfig("adamw:lr=0x10").status().message(),
              HasSubstr("lr must be a decimal number, got '0x10'"));
  EXPECT_THAT(ParseOptimizerConfig("adamw:warmup_steps=0x10").status().message(),
              HasSubstr("warmup_steps must be an integer"));
  absl::StatusOr<OptimizerConfig> signs = ParseOptimizerConfig("adamw:lr=+.5E-1,warmup_steps=+2");
  ASSERT_TRUE(signs.ok()) << signs.status();
  EXPECT_EQ(signs->lr, 0.05f);
  EXPECT_EQ(signs->schedule.warmup_steps, 2);
}

// A key given twice, a value with a second '=', and numbers that are not decimal (hexadecimal
// floats, which strtof-style parsers accept) are refused, not silently resolved. Before,
// "adamw:lr=1,lr=2" trained with lr 2 and "sgd:lr=0x1p-3" with lr 0.125.
TEST(OptimizerTest, ParseRefusesRepeatedKeysAndNonDecimalNumbers) {
  auto error = [](const char* text) {
    absl::StatusOr<OptimizerConfig> c = ParseOptimizerConfig(text);
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << text;
    return std::string(c.status().message());
  };
  EXPECT_EQ(error("adamw:lr=1,lr=2"), "optimizer: key 'lr' is given twice ('lr=1' and 'lr=2')");
  EXPECT_EQ(error("sgd:momentum=0.9,lr=0.1,momentum=0.5"),
            "optimizer: key 'momentum' is given twice ('momentum=0.9' and 'momentum=0.5')");
  EXPECT_EQ(error("sgd:warmup_steps=5,lr_schedule=warmup-cosine,decay_steps=9,warmup_steps=5"),
            "optimizer: key 'warmup_steps' is given twice ('warmup_steps=5' and "
            "'warmup_steps=5')");
  EXPECT_EQ(error("sgd:lr=1=2"), "optimizer: expected key=value, got 'lr=1=2'");
  EXPECT_EQ(error("sgd:lr=0x10"), "optimizer: lr must be a decimal number, got '0x10'");
  EXPECT_EQ(error("sgd:lr=0x1p-3"), "optimizer: lr must be a decimal number, got '0x1p-3'");
  EXPECT_EQ(error("sgd:lr_min=0x1p-9,lr_schedule=warmup-cosine,decay_steps=9"),
            "optimizer: lr_min must be a decimal number, got '0x1p-9'");
  EXPECT_EQ(error("adamw:eps=infinity"), "optimizer: eps must be a decimal number, got 'infinity'");
  // Decimal forms stay accepted.
  absl::StatusOr<OptimizerConfig> c = ParseOptimizerConfig("sgd:lr=+1.5e-1,momentum=.5");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->lr, 0.15f);
  EXPECT_EQ(c->momentum, 0.5f);
}

TEST(OptimizerTest, ClipScale) {
  EXPECT_EQ(ClipScale(100.0, 0.0f), 1.0f);  // off
  EXPECT_EQ(ClipScale(0.25, 1.0f), 1.0f);   // norm 0.5 < 1: unchanged
  EXPECT_NEAR(ClipScale(16.0, 2.0f), 0.5f, 1e-6f);
  EXPECT_EQ(SumOfSquares(std::vector<float>{3.0f, 4.0f}), 25.0);
}

// The documented order: element i into partial sum i mod 8, combined pairwise.
TEST(SumOfSquaresTest, FollowsTheDocumentedOrderBitForBit) {
  for (size_t n : {0, 1, 7, 8, 9, 1000, 4099}) {
    std::vector<float> v(n);
    for (size_t i = 0; i < n; ++i) {
      // Magnitudes from 1e-4 to 1e4, so that the order of the additions changes the rounding.
      v[i] =
          static_cast<float>((i % 3 == 0 ? 1e4 : 1e-4) * std::sin(0.37 * static_cast<double>(i)));
    }
    double s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (size_t i = 0; i < n; ++i) s[i % 8] += static_cast<double>(v[i]) * v[i];
    const double want = ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]));
    const double got = SumOfSquares(v);
    uint64_t got_bits, want_bits;
    std::memcpy(&got_bits, &got, sizeof got);
    std::memcpy(&want_bits, &want, sizeof want);
    EXPECT_EQ(got_bits, want_bits) << "n=" << n;
  }
}

TEST(SumOfSquaresTest, DiffersFromOneChainOnlyByRounding) {
  std::vector<float> v(10007);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(std::cos(1.1 * i));
  long double exact = 0;
  for (float x : v) exact += static_cast<long double>(x) * x;
  EXPECT_NEAR(SumOfSquares(v), static_cast<double>(exact), 1e-12 * static_cast<double>(exact));
}

}  // namespace
}  // namespace pipetrain::math
