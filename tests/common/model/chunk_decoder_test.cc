#include "common/model/chunk_decoder.h"

#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "common/model/decode_window.h"
#include "common/model/generator.h"
#include "common/model/token_sampler.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/model/test_models.h"

namespace pipetrain::model {
namespace {

using ::testing::HasSubstr;

// A small GPT with a context of 8, cut into three chunks as a pipeline would hold it.
constexpr char kSpec[] =
    "name: 'tiny_gpt' input_features: 1 "
    "layers { embedding { vocab_size: 11 dim: 16 context: 8 } } "
    "layers { transformer_block { heads: 2 } } layers { transformer_block { heads: 4 } } "
    "layers { layer_norm {} } layers { linear { out_features: 11 } } "
    "loss { softmax_cross_entropy {} }";
constexpr int64_t kCuts[] = {0, 2, 3, 5};

bool SameBits(absl::Span<const float> a, absl::Span<const float> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

class ChunkDecoderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = testing::BuildOrDie(kSpec);
    params_ = testing::RandomLmParams(*model_, 17);
  }

  // One decoder per chunk of kCuts for `sequences` sequences.
  std::vector<std::unique_ptr<ChunkDecoder>> Chunks(int64_t sequences) {
    std::vector<std::unique_ptr<ChunkDecoder>> chunks;
    for (size_t c = 0; c + 1 < std::size(kCuts); ++c) {
      auto d = ChunkDecoder::Create(model_.get(), kCuts[c], kCuts[c + 1], sequences);
      EXPECT_TRUE(d.ok()) << d.status();
      if (d.ok()) chunks.push_back(std::move(d).value());
    }
    return chunks;
  }

  // Runs `run` of sequence `seq` through `chunks`, each chunk's output copied into a fresh matrix
  // as a pipeline hands it to the next worker; the last row's logits.
  std::vector<float> RunChunks(std::vector<std::unique_ptr<ChunkDecoder>>& chunks, int64_t seq,
                               const DecodeWindow& window, const DecodeRun& run) {
    const absl::Span<const int64_t> tokens = window.RunTokens(run);
    math::Matrix x(static_cast<int64_t>(tokens.size()), 1);
    for (size_t i = 0; i < tokens.size(); ++i) x(static_cast<int64_t>(i), 0) = tokens[i];
    for (auto& chunk : chunks) {
      if (run.restart) chunk->Clear(seq);
      const absl::Span<const std::vector<math::Tensor>> all(params_);
      auto y = chunk->Forward(
          all.subspan(chunk->first_layer(), chunk->last_layer() - chunk->first_layer()), seq,
          run.position, math::AsConstMap(x));
      EXPECT_TRUE(y.ok()) << y.status();
      if (!y.ok()) return {};
      x = *y;
    }
    const int64_t last = x.rows() - 1;
    return std::vector<float>(x.row(last).data(), x.row(last).data() + x.cols());
  }

  std::unique_ptr<Model> model_;
  ModelParams params_;
};

// Three prompts decoded in turns (one run each per round, as the service's micro-batches), through
// three chunks and past two slides of the window: every logit is bitwise the one-process
// generator's for the same prompt, and the sampled tokens are the same.
TEST_F(ChunkDecoderTest, ChunkedInterleavedDecodingIsBitwiseTheGenerator) {
  const std::vector<std::vector<int64_t>> prompts = {{1, 2, 3}, {7}, {4, 4, 9, 10, 0, 5, 6, 2, 8}};
  const SamplingOptions sampling{0.8, 5, 42};
  constexpr int64_t kTokens = 20;
  auto chunks = Chunks(static_cast<int64_t>(prompts.size()));
  ASSERT_EQ(chunks.size(), 3u);
  std::vector<DecodeWindow> windows(prompts.size(), DecodeWindow(8, 11));
  std::vector<TokenSampler> samplers(prompts.size(), TokenSampler(sampling));
  std::vector<std::unique_ptr<Generator>> generators;
  std::vector<DecodeRun> runs;
  for (size_t s = 0; s < prompts.size(); ++s) {
    auto g = Generator::Create(model_.get(), &params_);
    ASSERT_TRUE(g.ok()) << g.status();
    generators.push_back(std::move(g).value());
    ASSERT_TRUE(generators[s]->Start(prompts[s]).ok());
    auto run = windows[s].Start(prompts[s]);
    ASSERT_TRUE(run.ok()) << run.status();
    runs.push_back(*run);
  }
  TokenSampler reference(sampling);
  for (int64_t i = 0; i < kTokens; ++i) {
    for (size_t s = 0; s < prompts.size(); ++s) {
      const std::vector<float> logits =
          RunChunks(chunks, static_cast<int64_t>(s), windows[s], runs[s]);
      ASSERT_TRUE(SameBits(logits, generators[s]->logits())) << "prompt " << s << " token " << i;
      const int64_t token = samplers[s].Next(logits);
      ASSERT_TRUE(generators[s]->Append(token).ok());
      auto run = windows[s].Append(token);
      ASSERT_TRUE(run.ok()) << run.status();
      runs[s] = *run;
    }
  }
  EXPECT_GE(windows[0].slides(), 2);
  EXPECT_EQ(windows[2].window(), generators[2]->window());
  EXPECT_GT(chunks[1]->StateBytes(), 0);
}

// Clear forgets a sequence's positions only: the other sequences keep theirs.
TEST_F(ChunkDecoderTest, ClearForgetsOneSequence) {
  auto chunks = Chunks(2);
  const math::Matrix x = math::Matrix::Constant(3, 1, 2.0f);
  const absl::Span<const std::vector<math::Tensor>> all(params_);
  for (int64_t seq : {0, 1}) {
    ASSERT_TRUE(chunks[0]->Forward(all.subspan(0, 2), seq, 0, math::AsConstMap(x)).ok());
  }
  chunks[0]->Clear(1);
  EXPECT_EQ(chunks[0]->positions(0), 3);
  EXPECT_EQ(chunks[0]->positions(1), 0);
}

TEST_F(ChunkDecoderTest, BadCallsAreRefusedWithoutRunning) {
  EXPECT_THAT(ChunkDecoder::Create(model_.get(), 2, 2, 1).status().message(),
              HasSubstr("layers [2, 2) of a model of 5"));
  EXPECT_THAT(ChunkDecoder::Create(model_.get(), 0, 5, 0).status().message(),
              HasSubstr("0 sequences, outside [1, 256]"));
  auto chunks = Chunks(1);
  const absl::Span<const std::vector<math::Tensor>> all(params_);
  const math::Matrix x = math::Matrix::Constant(3, 1, 2.0f);
  auto wrong_position = chunks[0]->Forward(all.subspan(0, 2), 0, 1, math::AsConstMap(x));
  EXPECT_EQ(wrong_position.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(wrong_position.status().message(), HasSubstr("holds 0 positions, not 1"));
  const math::Matrix long_x = math::Matrix::Constant(9, 1, 2.0f);
  EXPECT_THAT(
      chunks[0]->Forward(all.subspan(0, 2), 0, 0, math::AsConstMap(long_x)).status().message(),
      HasSubstr("positions [0, 9) of sequence 0 outside the context of 8"));
  EXPECT_THAT(chunks[0]->Forward(all.subspan(0, 2), 1, 0, math::AsConstMap(x)).status().message(),
              HasSubstr("sequence 1 outside [0, 1)"));
  EXPECT_THAT(chunks[1]->Forward(all.subspan(2, 1), 0, 0, math::AsConstMap(x)).status().message(),
              HasSubstr("input of 1 columns, layer 2 takes 16"));
  EXPECT_THAT(chunks[0]->Forward(all.subspan(0, 1), 0, 0, math::AsConstMap(x)).status().message(),
              HasSubstr("parameters of 1 layers for 2"));
  EXPECT_EQ(chunks[0]->positions(0), 0);
}

}  // namespace
}  // namespace pipetrain::model
