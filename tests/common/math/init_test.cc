#include "common/math/init.h"

#include <cmath>
#include <cstring>
#include <memory>
#include <set>
#include <vector>

#include "common/math/activations.h"
#include "common/math/embedding.h"
#include "common/math/layer_norm.h"
#include "common/math/linear.h"
#include "common/math/transformer_block.h"
#include "gtest/gtest.h"

namespace pipetrain::math {
namespace {

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

std::vector<std::unique_ptr<Layer>> AllLayers() {
  std::vector<std::unique_ptr<Layer>> layers;
  layers.push_back(std::make_unique<Linear>(8, 5, true));
  layers.push_back(std::make_unique<LayerNorm>(6, 1e-5f));
  layers.push_back(std::make_unique<Embedding>(11, 4, 3));
  layers.push_back(std::make_unique<TransformerBlock>(8, 2, 4, 4));
  return layers;
}

bool SameBits(const std::vector<Tensor>& a, const std::vector<Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].shape != b[i].shape || a[i].data.size() != b[i].data.size()) return false;
    if (std::memcmp(a[i].data.data(), b[i].data.data(), a[i].data.size() * sizeof(float)) != 0) {
      return false;
    }
  }
  return true;
}

TEST(InitTest, ParamSeedSeparatesSeedLayerAndParam) {
  std::set<uint64_t> seen;
  for (uint64_t seed : {0ull, 1ull, 2ull}) {
    for (int64_t l = 0; l < 20; ++l) {
      for (int64_t p = 0; p < 12; ++p) seen.insert(ParamSeed(seed, l, p));
    }
  }
  EXPECT_EQ(seen.size(), 3u * 20 * 12);
}

TEST(InitTest, SameSeedAndLayerGiveIdenticalBits) {
  for (const auto& layer : AllLayers()) {
    SCOPED_TRACE(layer->kind());
    std::vector<Tensor> a, b, other_layer, other_seed;
    layer->Init(42, 3, &a);
    // Unrelated initialisation in between must not matter (no hidden generator state).
    layer->Init(42, 7, &other_layer);
    layer->Init(42, 3, &b);
    layer->Init(43, 3, &other_seed);
    ASSERT_EQ(a.size(), layer->params().size());
    for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i].shape, layer->params()[i].shape);
    EXPECT_TRUE(SameBits(a, b));
    if (layer->kind() != "layer_norm") {  // LayerNorm's init is constant.
      EXPECT_FALSE(SameBits(a, other_layer));
      EXPECT_FALSE(SameBits(a, other_seed));
    }
  }
}

TEST(InitTest, ResizesParamsItself) {
  const Linear layer(3, 2, true);
  std::vector<Tensor> p(7);
  p[0].data.assign(100, 5.0f);
  layer.Init(1, 0, &p);
  ASSERT_EQ(p.size(), 2u);
  EXPECT_EQ(p[0].data.size(), 6u);
  EXPECT_EQ(p[1].data.size(), 2u);
}

// Pinned bits (cross-checked against an independent Python implementation of mt19937_64,
// SplitMix64 and Box-Muller with libm). mt19937_64 is specified by the standard and the transforms
// use only IEEE basic operations, so these hold on every conforming platform. A change here changes
// every model's initial weights: update only deliberately.
TEST(InitTest, GoldenValues) {
  Tensor u{{4}, std::vector<float>(4)};
  FillUniform(1, 0, 0, -1.0, 1.0, &u);
  Tensor n{{5}, std::vector<float>(5)};
  FillNormal(1, 2, 3, 0.0, 1.0, &n);
  std::vector<uint32_t> got;
  for (float v : u.data) got.push_back(Bits(v));
  for (float v : n.data) got.push_back(Bits(v));
  const std::vector<uint32_t> want = {0x3eedf08e, 0xbe48c75c, 0xbf196c48, 0xbf3196c5, 0x3f8045fc,
                                      0xbdf39d23, 0x3fc69663, 0x3f3306bb, 0xbd9a17e8};
  EXPECT_EQ(got, want);
  EXPECT_EQ(ParamSeed(1, 2, 3), 15020427595393229491ull);
  // The standard's conformance check for mt19937_64: the 10000th output of the default seed.
  std::mt19937_64 engine;
  engine.discard(9999);
  EXPECT_EQ(engine(), 9981545732273789042ull);
}

TEST(InitTest, NormalHasRequestedMoments) {
  Tensor t{{100000}, std::vector<float>(100000)};
  FillNormal(5, 1, 0, 0.5, 0.02, &t);
  double sum = 0, sq = 0, beyond3 = 0;
  for (float v : t.data) {
    sum += v;
    sq += (v - 0.5) * (v - 0.5);
    if (std::fabs(v - 0.5) > 3 * 0.02) ++beyond3;
  }
  const double n = static_cast<double>(t.data.size());
  EXPECT_NEAR(sum / n, 0.5, 5 * 0.02 / std::sqrt(n));
  EXPECT_NEAR(std::sqrt(sq / n), 0.02, 0.02 * 0.01);
  EXPECT_NEAR(beyond3 / n, 0.0027, 0.0006);  // two-sided 3-sigma tail
}

TEST(InitTest, UniformCoversRange) {
  Tensor t{{100000}, std::vector<float>(100000)};
  FillUniform(5, 1, 0, -0.25, 0.75, &t);
  double sum = 0;
  float lo = 1, hi = -1;
  for (float v : t.data) {
    sum += v;
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  EXPECT_GE(lo, -0.25f);
  EXPECT_LE(hi, 0.75f);
  EXPECT_LT(lo, -0.249f);
  EXPECT_GT(hi, 0.749f);
  EXPECT_NEAR(sum / t.data.size(), 0.25, 0.005);
}

TEST(InitTest, ParamStreamsAreIndependentOfTensorSize) {
  // Element i depends only on (seed, layer, param, i): a longer tensor extends a shorter one.
  Tensor a{{7}, std::vector<float>(7)};
  Tensor b{{12}, std::vector<float>(12)};
  FillNormal(9, 4, 1, 0.0, 1.0, &a);
  FillNormal(9, 4, 1, 0.0, 1.0, &b);
  for (int i = 0; i < 7; ++i) EXPECT_EQ(Bits(a.data[i]), Bits(b.data[i])) << i;
}

TEST(InitTest, TransformerBlockInit) {
  const TransformerBlock block(16, 2, 4, 4);
  std::vector<Tensor> p;
  block.Init(1, 5, &p);
  const std::vector<ParamSpec> specs = block.params();
  for (size_t i = 0; i < specs.size(); ++i) {
    const std::string& name = specs[i].name;
    SCOPED_TRACE(name);
    const bool is_ln_weight = name == "ln1.weight" || name == "ln2.weight";
    const bool is_bias = name.find("bias") != std::string::npos;
    if (is_ln_weight || is_bias) {
      EXPECT_EQ(p[i].data, std::vector<float>(p[i].data.size(), is_ln_weight ? 1.0f : 0.0f));
    } else {
      double sq = 0;
      for (float v : p[i].data) sq += double{v} * v;
      EXPECT_NEAR(std::sqrt(sq / p[i].data.size()), 0.02, 0.004);
    }
  }
}

TEST(InitTest, EmbeddingInitScales) {
  const Embedding layer(500, 64, 100);
  std::vector<Tensor> p;
  layer.Init(1, 0, &p);
  for (size_t i = 0; i < 2; ++i) {
    double sq = 0;
    for (float v : p[i].data) sq += double{v} * v;
    EXPECT_NEAR(std::sqrt(sq / p[i].data.size()), i == 0 ? 0.02 : 0.01, 0.0005);
  }
}

}  // namespace
}  // namespace pipetrain::math
