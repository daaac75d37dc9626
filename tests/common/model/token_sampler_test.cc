#include "common/model/token_sampler.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <set>
#include <vector>

#include "common/math/det_math.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pipetrain::model {
namespace {

using ::testing::HasSubstr;

TEST(TokenSamplerTest, OptionsOutOfRangeAreRefused) {
  EXPECT_TRUE(CheckSamplingOptions({}).ok());
  EXPECT_TRUE(CheckSamplingOptions({0.0, 0, 1}).ok());
  for (const double t : {-0.5, std::nan(""), std::numeric_limits<double>::infinity()}) {
    const absl::Status s = CheckSamplingOptions({t, 0, 0});
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << t;
    EXPECT_THAT(s.message(), HasSubstr("temperature must be a finite number >= 0"));
  }
  const absl::Status s = CheckSamplingOptions({1.0, -1, 0});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("top-k must be >= 0"));
}

TEST(TokenSamplerTest, ArgMaxTakesTheLowestIdAmongEqualLogits) {
  EXPECT_EQ(ArgMax(std::vector<float>{1, 3, 2, 3}), 1);
  EXPECT_EQ(ArgMax(std::vector<float>{-1}), 0);
  EXPECT_EQ(ArgMax(std::vector<float>{-2, -1, -1}), 1);
}

// The generator is std::mt19937_64, whose output the C++ standard fixes: its 10000th number from
// the default seed 5489 is 9981545732273789042 ([rand.predef]).
TEST(TokenSamplerTest, TheDrawIsTheStandardGeneratorsOutput) {
  TokenSampler sampler({1.0, 0, 5489});
  for (int i = 0; i < 9999; ++i) sampler.Uniform();
  EXPECT_EQ(sampler.Uniform(),
            static_cast<double>(uint64_t{9981545732273789042u} >> 11) * 0x1.0p-53);
}

TEST(TokenSamplerTest, GreedyAndTopOneTakeTheArgMaxWithoutADraw) {
  const std::vector<float> logits = {0.5f, 2.0f, -1.0f, 2.0f, 1.5f};
  for (const SamplingOptions& o :
       {SamplingOptions{0.0, 0, 7}, SamplingOptions{1.0, 1, 7}, SamplingOptions{0.0, 3, 7}}) {
    TokenSampler sampler(o);
    for (int i = 0; i < 5; ++i) EXPECT_EQ(sampler.Next(logits), 1);
    // No draw was made: the next one is the generator's first.
    TokenSampler fresh({1.0, 0, 7});
    EXPECT_EQ(sampler.Uniform(), fresh.Uniform());
  }
}

// The documented procedure, step by step, for one draw.
TEST(TokenSamplerTest, FollowsTheDocumentedProcedure) {
  const std::vector<float> logits = {0.1f, 1.7f, -0.4f, 1.7f, 0.9f, 0.3f};
  const double temperature = 0.8;
  for (uint64_t seed = 0; seed < 50; ++seed) {
    std::mt19937_64 g(seed);
    const double u = static_cast<double>(g() >> 11) * 0x1.0p-53;
    // top-3 candidates, largest first, ties by id: 1, 3, 4.
    const std::vector<int64_t> candidates = {1, 3, 4};
    std::vector<double> w;
    double total = 0;
    for (const int64_t id : candidates) {
      w.push_back(math::PortableExp((logits[id] - 1.7f) / temperature));
      total += w.back();
    }
    int64_t expected = candidates.back();
    double running = 0;
    for (size_t i = 0; i < w.size(); ++i) {
      running += w[i];
      if (running > u * total) {
        expected = candidates[i];
        break;
      }
    }
    TokenSampler sampler({temperature, 3, seed});
    EXPECT_EQ(sampler.Next(logits), expected) << "seed " << seed;
  }
}

TEST(TokenSamplerTest, SameSeedSameTokensOtherSeedOtherTokens) {
  std::vector<float> logits(20);
  for (int i = 0; i < 20; ++i) logits[i] = static_cast<float>(i % 7) * 0.3f;
  auto draw = [&logits](uint64_t seed) {
    TokenSampler sampler({1.0, 0, seed});
    std::vector<int64_t> ids;
    for (int i = 0; i < 40; ++i) ids.push_back(sampler.Next(logits));
    return ids;
  };
  EXPECT_EQ(draw(3), draw(3));
  EXPECT_NE(draw(3), draw(4));
}

TEST(TokenSamplerTest, TopKDrawsOnlyAmongTheKLargest) {
  const std::vector<float> logits = {0.0f, 3.0f, 1.0f, 2.9f, -5.0f};
  TokenSampler sampler({5.0, 2, 11});
  std::set<int64_t> seen;
  for (int i = 0; i < 200; ++i) seen.insert(sampler.Next(logits));
  EXPECT_EQ(seen, (std::set<int64_t>{1, 3}));
  // k beyond the vocabulary is the whole vocabulary.
  TokenSampler all({50.0, 100, 11});
  seen.clear();
  for (int i = 0; i < 400; ++i) seen.insert(all.Next(logits));
  EXPECT_EQ(seen.size(), 5u);
}

TEST(TokenSamplerTest, FrequenciesFollowTheSoftmax) {
  const std::vector<float> logits = {std::log(0.5f), std::log(0.25f), std::log(0.125f),
                                     std::log(0.125f)};
  TokenSampler sampler({1.0, 0, 1});
  std::vector<int> counts(4);
  const int n = 8000;
  for (int i = 0; i < n; ++i) ++counts[sampler.Next(logits)];
  EXPECT_NEAR(counts[0] / static_cast<double>(n), 0.5, 0.03);
  EXPECT_NEAR(counts[1] / static_cast<double>(n), 0.25, 0.03);
  EXPECT_NEAR(counts[2] / static_cast<double>(n), 0.125, 0.03);
  EXPECT_NEAR(counts[3] / static_cast<double>(n), 0.125, 0.03);
}

}  // namespace
}  // namespace pipetrain::model
