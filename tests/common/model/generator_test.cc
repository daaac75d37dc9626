#include "common/model/generator.h"

#include <cmath>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/model/test_models.h"

namespace pipetrain::model {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kVocab = 11;
constexpr int64_t kContext = 8;

std::unique_ptr<Model> BuildModel(const std::string& text) {
  absl::StatusOr<v1::ModelSpec> spec = ParseModelSpecText(text, "test");
  EXPECT_TRUE(spec.ok()) << spec.status();
  absl::StatusOr<std::unique_ptr<Model>> model = Model::Build(*spec);
  EXPECT_TRUE(model.ok()) << model.status();
  return std::move(model).value();
}

// A small GPT: embedding, two blocks, layer norm, linear head.
std::unique_ptr<Model> BuildGpt() {
  return BuildModel(
      "name: 'tiny_gpt' input_features: 1 "
      "layers { embedding { vocab_size: 11 dim: 16 context: 8 } } "
      "layers { transformer_block { heads: 2 } } layers { transformer_block { heads: 4 } } "
      "layers { layer_norm {} } layers { linear { out_features: 11 } } "
      "loss { softmax_cross_entropy {} }");
}

ModelParams RandomParams(const Model& model, uint64_t seed) {
  return testing::RandomLmParams(model, seed);
}

// The model's full Forward over `window` padded to the context with token 0 (the causal mask
// keeps the padding out of the window's rows): the logits at the window's last position.
std::vector<float> FullForwardLogits(const Model& model, const ModelParams& params,
                                     const std::vector<int64_t>& window) {
  const int64_t t = model.tokens_per_sample();
  math::Matrix x = math::Matrix::Zero(t, 1);
  for (size_t i = 0; i < window.size(); ++i) x(static_cast<int64_t>(i), 0) = window[i];
  for (int64_t l = 0; l < model.num_layers(); ++l) {
    math::Matrix y(t, model.layer(l).out_features());
    math::Stash stash;
    model.layer(l).Forward(params[l], math::AsConstMap(x), math::AsMap(y), &stash);
    x = std::move(y);
  }
  const int64_t row = static_cast<int64_t>(window.size()) - 1;
  return std::vector<float>(x.row(row).data(), x.row(row).data() + x.cols());
}

class GeneratorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = BuildGpt();
    params_ = RandomParams(*model_, 17);
    absl::StatusOr<std::unique_ptr<Generator>> g = Generator::Create(model_.get(), &params_);
    ASSERT_TRUE(g.ok()) << g.status();
    generator_ = std::move(g).value();
  }

  std::vector<int64_t> Generate(const std::vector<int64_t>& prompt, SamplingOptions sampling,
                                int64_t max_tokens = 40) {
    absl::StatusOr<std::vector<int64_t>> out =
        generator_->Generate(prompt, GenerateOptions{max_tokens, sampling});
    EXPECT_TRUE(out.ok()) << out.status();
    return out.ok() ? *out : std::vector<int64_t>();
  }

  std::unique_ptr<Model> model_;
  ModelParams params_;
  std::unique_ptr<Generator> generator_;
};

// At every step, through the first slides of the window: the cached logits are the full
// forward's to rounding (transformer_block_incremental_test bounds it), the greedy token is the
// full forward's argmax, and Generate at temperature 0 picks the same tokens.
TEST_F(GeneratorTest, GreedyIsTheArgMaxOfTheFullForwardAtEveryStep) {
  EXPECT_EQ(generator_->vocab_size(), kVocab);
  EXPECT_EQ(generator_->context(), kContext);
  ASSERT_TRUE(generator_->Start({1, 2, 3}).ok());
  std::vector<int64_t> tokens;
  for (int step = 0; step < 30; ++step) {
    SCOPED_TRACE(::testing::Message() << "step " << step);
    const std::vector<float> full = FullForwardLogits(*model_, params_, generator_->window());
    const absl::Span<const float> cached = generator_->logits();
    ASSERT_EQ(cached.size(), full.size());
    for (size_t i = 0; i < full.size(); ++i) {
      EXPECT_NEAR(cached[i], full[i], 1e-5 * (std::abs(full[i]) + 1)) << "logit " << i;
    }
    const int64_t token = ArgMax(cached);
    EXPECT_EQ(token, ArgMax(full));
    tokens.push_back(token);
    ASSERT_TRUE(generator_->Append(token).ok());
  }
  EXPECT_GE(generator_->slides(), 2);
  EXPECT_EQ(Generate({1, 2, 3}, {0.0, 0, 99}, 30), tokens);
}

TEST_F(GeneratorTest, TopOneIsGreedy) {
  const std::vector<int64_t> greedy = Generate({4, 0}, {0.0, 0, 0});
  EXPECT_EQ(Generate({4, 0}, {1.0, 1, 5}), greedy);
  EXPECT_EQ(Generate({4, 0}, {0.7, 1, 6}), greedy);
}

TEST_F(GeneratorTest, SameSeedSameTokensOtherSeedOtherTokens) {
  const SamplingOptions a{1.0, 0, 1};
  const std::vector<int64_t> first = Generate({5}, a);
  EXPECT_EQ(Generate({5}, a), first);
  EXPECT_NE(Generate({5}, {1.0, 0, 2}), first);
  EXPECT_NE(Generate({5}, {1.0, 4, 1}), first);  // top-k changes the draws' outcome
  // A new generator over the same weights gives the same tokens: nothing is left from before.
  absl::StatusOr<std::unique_ptr<Generator>> other = Generator::Create(model_.get(), &params_);
  ASSERT_TRUE(other.ok());
  EXPECT_EQ(*(*other)->Generate({5}, GenerateOptions{40, a}), first);
}

// The window slides by half the context when full; each appended token otherwise costs one
// position.
TEST_F(GeneratorTest, SlidingWindowCostsAboutOnePositionPerToken) {
  const std::vector<int64_t> prompt = {1, 2, 3};
  ASSERT_TRUE(generator_->Start(prompt).ok());
  int64_t n = 3, expected_positions = 3, slides = 0;
  std::vector<int64_t> all = prompt;
  for (int i = 0; i < 25; ++i) {
    const int64_t token = (i * 5) % kVocab;
    ASSERT_TRUE(generator_->Append(token).ok());
    all.push_back(token);
    if (n < kContext) {
      ++n;
      ++expected_positions;
    } else {
      n = kContext / 2;
      expected_positions += n;
      ++slides;
    }
    ASSERT_EQ(static_cast<int64_t>(generator_->window().size()), n);
    // The window is the sequence's last n tokens.
    EXPECT_EQ(generator_->window(), std::vector<int64_t>(all.end() - n, all.end()));
  }
  EXPECT_EQ(generator_->slides(), slides);
  EXPECT_EQ(generator_->positions_computed(), expected_positions);
  EXPECT_LT(generator_->positions_computed(), 2 * 28);
}

TEST_F(GeneratorTest, ALongPromptKeepsItsLastContextTokens) {
  std::vector<int64_t> prompt;
  for (int i = 0; i < 20; ++i) prompt.push_back(i % kVocab);
  ASSERT_TRUE(generator_->Start(prompt).ok());
  EXPECT_EQ(generator_->window(), std::vector<int64_t>(prompt.end() - kContext, prompt.end()));
  EXPECT_EQ(ArgMax(generator_->logits()),
            ArgMax(FullForwardLogits(*model_, params_, generator_->window())));
}

TEST_F(GeneratorTest, BadRequestsAreRefused) {
  auto expect_invalid = [](const absl::Status& s, const std::string& text) {
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(s.message(), HasSubstr(text));
  };
  expect_invalid(generator_->Generate({1}, {10, {-1.0, 0, 0}}).status(), "temperature");
  expect_invalid(generator_->Generate({1}, {10, {1.0, -2, 0}}).status(), "top-k");
  expect_invalid(generator_->Generate({}, {10, {}}).status(), "the prompt is empty");
  expect_invalid(generator_->Generate({1, 11}, {10, {}}).status(),
                 "prompt token 1 is 11, outside the vocabulary [0, 11)");
  expect_invalid(generator_->Generate({1}, {0, {}}).status(), "max-tokens must be in [1, ");
  expect_invalid(generator_->Generate({1}, {kMaxGenerateTokens + 1, {}}).status(), "max-tokens");
  ASSERT_TRUE(generator_->Start({1}).ok());
  expect_invalid(generator_->Append(-1), "outside the vocabulary");
  expect_invalid(generator_->Append(kVocab), "outside the vocabulary");
  absl::StatusOr<std::unique_ptr<Generator>> fresh = Generator::Create(model_.get(), &params_);
  ASSERT_TRUE(fresh.ok());
  EXPECT_EQ((*fresh)->Append(1).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(Generator::Create(model_.get(), &params_, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// A small LLaMA: a position-free embedding (rotary positions in the blocks), two blocks with
// grouped-query heads, RMSNorm, a bias-free head. Decoded through the KV cache, every step's
// logits are the full forward's to rounding (llama_block_incremental_test bounds a block's
// difference by 2e-6 relative; the products of other shapes sum in another order) and the greedy
// token is its argmax, through the window's slides (each rotates the kept tokens again from
// position 0); sampling is deterministic for a seed.
TEST(GeneratorLlamaTest, KvCacheDecodingMatchesTheFullForward) {
  const std::unique_ptr<Model> llama = BuildModel(
      "name: 'tiny_llama' input_features: 1 "
      "layers { embedding { vocab_size: 11 dim: 16 context: 8 positions: NONE } } "
      "layers { llama_block { heads: 4 kv_heads: 2 } } layers { llama_block { heads: 2 } } "
      "layers { rms_norm {} } layers { linear { out_features: 11 no_bias: true } } "
      "loss { softmax_cross_entropy {} }");
  const ModelParams params = RandomParams(*llama, 23);
  absl::StatusOr<std::unique_ptr<Generator>> g = Generator::Create(llama.get(), &params);
  ASSERT_TRUE(g.ok()) << g.status();
  Generator& gen = **g;
  ASSERT_TRUE(gen.Start({3, 1, 4, 1, 5}).ok());
  std::vector<int64_t> tokens;
  for (int step = 0; step < 24; ++step) {
    SCOPED_TRACE(::testing::Message() << "step " << step);
    const std::vector<float> full = FullForwardLogits(*llama, params, gen.window());
    const absl::Span<const float> cached = gen.logits();
    ASSERT_EQ(cached.size(), full.size());
    for (size_t i = 0; i < full.size(); ++i) {
      EXPECT_NEAR(cached[i], full[i], 1e-5 * (std::abs(full[i]) + 1)) << "logit " << i;
    }
    const int64_t token = ArgMax(cached);
    EXPECT_EQ(token, ArgMax(full));
    tokens.push_back(token);
    ASSERT_TRUE(gen.Append(token).ok());
  }
  EXPECT_GE(gen.slides(), 2);
  const SamplingOptions sampling{0.9, 0, 7};
  const absl::StatusOr<std::vector<int64_t>> a =
      gen.Generate({2, 7}, GenerateOptions{30, sampling});
  const absl::StatusOr<std::vector<int64_t>> b =
      gen.Generate({2, 7}, GenerateOptions{30, sampling});
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(*a, *b);
}

TEST(GeneratorCreateTest, AClassifierIsNotALanguageModel) {
  const std::unique_ptr<Model> mlp = BuildModel(
      "name: 'mlp' input_features: 4 layers { linear { out_features: 8 } } layers { relu {} } "
      "layers { linear { out_features: 3 } } loss { softmax_cross_entropy {} }");
  const ModelParams params = RandomParams(*mlp, 1);
  const absl::Status s = Generator::Create(mlp.get(), &params).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("generation needs a language model"));
  EXPECT_THAT(s.message(), HasSubstr("pipetrain predict"));
}

TEST(GeneratorCreateTest, ParametersMustFitTheLayers) {
  const std::unique_ptr<Model> gpt = BuildGpt();
  ModelParams params = RandomParams(*gpt, 1);
  params[1][2].shape = {16, 48};
  const absl::Status s = Generator::Create(gpt.get(), &params).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("layers.1.attn.qkv.weight"));
}

TEST(TakeModelParamsTest, TakesTheLayersTensorsByGlobalName) {
  const std::unique_ptr<Model> gpt = BuildGpt();
  const ModelParams params = RandomParams(*gpt, 3);
  std::map<std::string, math::Tensor> tensors;
  for (int64_t l = 0; l < gpt->num_layers(); ++l) {
    const std::vector<math::ParamSpec> specs = gpt->layer(l).params();
    for (size_t i = 0; i < specs.size(); ++i) {
      tensors["layers." + std::to_string(l) + "." + specs[i].name] = params[l][i];
    }
  }
  tensors["optim.1.ln1.weight.m"] = math::Tensor{{16}, std::vector<float>(16)};
  std::map<std::string, math::Tensor> copy = tensors;
  absl::StatusOr<ModelParams> taken = TakeModelParams(*gpt, &copy);
  ASSERT_TRUE(taken.ok()) << taken.status();
  for (int64_t l = 0; l < gpt->num_layers(); ++l) {
    for (size_t i = 0; i < params[l].size(); ++i) {
      EXPECT_EQ((*taken)[l][i].data, params[l][i].data);
    }
  }
  EXPECT_EQ(copy.size(), 1u);  // the optimizer's state stays.

  copy = tensors;
  copy.erase("layers.4.bias");
  EXPECT_EQ(TakeModelParams(*gpt, &copy).status().code(), absl::StatusCode::kNotFound);
  copy = tensors;
  copy["layers.0.token.weight"].shape = {16, 11};
  const absl::Status s = TakeModelParams(*gpt, &copy).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("layers.0.token.weight has shape [16, 11]"));
}

}  // namespace
}  // namespace pipetrain::model
