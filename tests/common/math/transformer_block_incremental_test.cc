// The transformer block's incremental (KV-cache) forward against its full Forward, at every
// position (docs/inference.md, "Numerics").
#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "common/math/gqa_attention.h"
#include "common/math/isa.h"
#include "common/math/kernels.h"
#include "common/math/transformer_block.h"
#include "gtest/gtest.h"
#include "tests/common/math/grad_check.h"

namespace pipetrain::math {
namespace {

using testing::BitwiseEqual;
using testing::FullForward;
using testing::IncrementalForward;
using testing::MaxRelativeError;
using testing::RandomMatrix;

constexpr int64_t kDim = 32;
constexpr int64_t kHeads = 4;
constexpr int64_t kContext = 12;
constexpr int64_t kRatio = 4;

// Parameters far from Init's (LN 1/0, 0.02-scale weights) so every term matters.
std::vector<Tensor> RandomParams(const Layer& block, uint64_t seed) {
  std::vector<Tensor> p;
  block.Init(seed, 0, &p);
  const std::vector<ParamSpec> specs = block.params();
  for (size_t i = 0; i < p.size(); ++i) {
    const int64_t n = static_cast<int64_t>(p[i].data.size());
    const float bound =
        specs[i].shape.size() == 2 ? 1.5f / std::sqrt(static_cast<float>(specs[i].shape[1])) : 0.5f;
    const Matrix m = RandomMatrix(1, n, seed + i, -bound, bound);
    p[i].data.assign(m.data(), m.data() + n);
  }
  return p;
}

TEST(TransformerBlockIncrementalTest, AWholeSampleAtOnceIsBitwiseForward) {
  const TransformerBlock block(kDim, kHeads, kContext, kRatio);
  const std::vector<Tensor> p = RandomParams(block, 11);
  const Matrix x = RandomMatrix(kContext, kDim, 3);
  const std::unique_ptr<IncrementalState> state = block.NewIncrementalState();
  ASSERT_NE(state, nullptr);
  EXPECT_EQ(state->bytes(), 2 * kContext * kDim * 4);
  const Matrix y = IncrementalForward(block, p, x, {kContext}, state.get());
  EXPECT_TRUE(BitwiseEqual(AsConstMap(y), AsConstMap(FullForward(block, p, x))));
}

// With several causal query blocks (gqa_attention.h) the cached forward of a whole sample still
// runs Forward's products, and uneven chunks stay within rounding.
TEST(TransformerBlockIncrementalTest, SeveralQueryBlocksAtOnceAreBitwiseForward) {
  const int64_t context = 2 * kCausalBlock + 6;
  const TransformerBlock block(kDim, kHeads, context, kRatio);
  const std::vector<Tensor> p = RandomParams(block, 21);
  const Matrix x = RandomMatrix(context, kDim, 22);
  const Matrix full = FullForward(block, p, x);
  const std::unique_ptr<IncrementalState> whole = block.NewIncrementalState();
  EXPECT_TRUE(BitwiseEqual(AsConstMap(IncrementalForward(block, p, x, {context}, whole.get())),
                           AsConstMap(full)));
  const std::unique_ptr<IncrementalState> chunked = block.NewIncrementalState();
  const Matrix y = IncrementalForward(block, p, x, {5, 40, 1, context - 46}, chunked.get());
  for (int64_t r = 0; r < context; ++r) {
    EXPECT_LE(MaxRelativeError(y.row(r), full.row(r)), 2e-6) << "position " << r;
  }
}

// One position per call (what generation does) and uneven chunks: the products have other shapes
// than Forward's, so Eigen sums them in another order (GEMV instead of GEMM kernels, other
// blockings); every other operation is Forward's own code. The bound is a few float ulps of
// values of order 1, far below anything that changes a sampled token but for exact ties.
TEST(TransformerBlockIncrementalTest, EveryPositionMatchesForwardToRounding) {
  const TransformerBlock block(kDim, kHeads, kContext, kRatio);
  const std::vector<Tensor> p = RandomParams(block, 5);
  const Matrix x = RandomMatrix(kContext, kDim, 8);
  const Matrix full = FullForward(block, p, x);
  for (const std::vector<int64_t>& chunks :
       {std::vector<int64_t>(kContext, 1), std::vector<int64_t>{3, 1, 5, 2, 1},
        std::vector<int64_t>{1, kContext - 1}}) {
    const std::unique_ptr<IncrementalState> state = block.NewIncrementalState();
    const Matrix y = IncrementalForward(block, p, x, chunks, state.get());
    for (int64_t r = 0; r < kContext; ++r) {
      SCOPED_TRACE(::testing::Message() << "position " << r << ", first chunk " << chunks[0]);
      EXPECT_LE(MaxRelativeError(y.row(r), full.row(r)), 2e-6);
    }
  }
}

// A row's output depends only on the positions up to it: the first k rows of Forward on a
// sample are those of Forward on any other sample with the same first k rows (the causal mask),
// so generation may pad a short window; the incremental forward of k rows agrees with both.
TEST(TransformerBlockIncrementalTest, PrefixOfAPaddedSampleMatches) {
  const TransformerBlock block(kDim, kHeads, kContext, kRatio);
  const std::vector<Tensor> p = RandomParams(block, 21);
  Matrix x = RandomMatrix(kContext, kDim, 4);
  Matrix padded = x;
  padded.bottomRows(kContext - 5).setConstant(0.25f);
  const Matrix a = FullForward(block, p, x);
  const Matrix b = FullForward(block, p, padded);
  EXPECT_TRUE(BitwiseEqual(ConstMatrixMap(a.data(), 5, kDim), ConstMatrixMap(b.data(), 5, kDim)));
  const std::unique_ptr<IncrementalState> state = block.NewIncrementalState();
  const Matrix first = x.topRows(5);
  const Matrix y = IncrementalForward(block, p, first, {5}, state.get());
  EXPECT_LE(MaxRelativeError(y, a.topRows(5)), 2e-6);
}

TEST(TransformerBlockIncrementalTest, ClearStartsOverWithTheSameBits) {
  const TransformerBlock block(kDim, kHeads, kContext, kRatio);
  const std::vector<Tensor> p = RandomParams(block, 2);
  const Matrix x = RandomMatrix(kContext, kDim, 6);
  const std::unique_ptr<IncrementalState> state = block.NewIncrementalState();
  const Matrix first =
      IncrementalForward(block, p, x, std::vector<int64_t>(kContext, 1), state.get());
  state->Clear();
  EXPECT_EQ(state->positions(), 0);
  const Matrix again =
      IncrementalForward(block, p, x, std::vector<int64_t>(kContext, 1), state.get());
  EXPECT_TRUE(BitwiseEqual(AsConstMap(first), AsConstMap(again)));
}

// The blocks a Model runs are each instruction-set level's copies, reached through the Layer
// interface: theirs are incremental too, and a whole sample at once is that level's Forward.
TEST(TransformerBlockIncrementalTest, EveryLevelsBlockIsIncremental) {
  for (const Isa isa : SupportedIsas()) {
    SCOPED_TRACE(IsaName(isa));
    const Kernels& k = KernelsFor(isa);
    k.ConfigureEigen(1);
    const std::unique_ptr<Layer> block = k.MakeTransformerBlock(kDim, kHeads, kContext, kRatio);
    ASSERT_TRUE(block->SupportsIncremental());
    const std::vector<Tensor> p = RandomParams(*block, 9);
    const Matrix x = RandomMatrix(kContext, kDim, 10);
    const std::unique_ptr<IncrementalState> state = block->NewIncrementalState();
    const Matrix y = IncrementalForward(*block, p, x, {kContext}, state.get());
    EXPECT_TRUE(BitwiseEqual(AsConstMap(y), AsConstMap(FullForward(*block, p, x))));
    state->Clear();
    const Matrix steps =
        IncrementalForward(*block, p, x, std::vector<int64_t>(kContext, 1), state.get());
    EXPECT_LE(MaxRelativeError(steps, y), 2e-6);
  }
}

// The other layers of a GPT: the embedding places row i at position `position` + i; row-wise
// layers (layer norm, linear, GELU) are Forward on the new rows, with no state.
TEST(TransformerBlockIncrementalTest, EmbeddingAndRowWiseLayers) {
  const Kernels& k = KernelsFor(DefaultIsa());
  const std::unique_ptr<Layer> emb = k.MakeEmbedding(7, 8, 4, /*position_table=*/true);
  ASSERT_TRUE(emb->SupportsIncremental());
  EXPECT_EQ(emb->NewIncrementalState(), nullptr);
  std::vector<Tensor> p;
  emb->Init(1, 0, &p);
  Matrix ids(4, 1);
  ids << 3, 0, 6, 3;
  const Matrix full = FullForward(*emb, p, ids);
  Stash scratch;
  Matrix row(1, 8);
  for (int64_t pos = 0; pos < 4; ++pos) {
    emb->ForwardIncremental(p, pos, ConstMatrixMap(ids.data() + pos, 1, 1), nullptr, &scratch,
                            AsMap(row));
    EXPECT_TRUE(BitwiseEqual(AsConstMap(row), ConstMatrixMap(full.data() + pos * 8, 1, 8)));
  }
  std::vector<std::unique_ptr<Layer>> row_wise;
  row_wise.push_back(k.MakeLayerNorm(8, 1e-5f));
  row_wise.push_back(k.MakeLinear(8, 5, true));
  row_wise.push_back(k.MakeGelu(8));
  row_wise.push_back(k.MakeRelu(8));
  for (const std::unique_ptr<Layer>& layer : row_wise) {
    EXPECT_TRUE(layer->SupportsIncremental()) << layer->kind();
    EXPECT_EQ(layer->NewIncrementalState(), nullptr) << layer->kind();
  }
}

}  // namespace
}  // namespace pipetrain::math
