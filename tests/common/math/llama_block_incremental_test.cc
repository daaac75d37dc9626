// The LLaMA block's incremental (KV-cache) forward against its full Forward, at every position
// (docs/inference.md, "Numerics"): rotary positions at the rows' own positions, grouped-query
// heads caching only the key/value heads.
#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "common/math/isa.h"
#include "common/math/kernels.h"
#include "common/math/llama_block.h"
#include "common/math/rope.h"
#include "gtest/gtest.h"
#include "tests/common/math/grad_check.h"

namespace pipetrain::math {
namespace {

using testing::BitwiseEqual;
using testing::FullForward;
using testing::IncrementalForward;
using testing::MaxRelativeError;
using testing::RandomMatrix;

constexpr int64_t kContext = 12;

// d 32, 4 query heads sharing 2 kv heads (hd 8), SwiGLU hidden 48.
LlamaBlockConfig Config() {
  LlamaBlockConfig c;
  c.dim = 32;
  c.heads = 4;
  c.kv_heads = 2;
  c.context = kContext;
  c.hidden = 48;
  c.rope_theta = 10000;
  c.norm_eps = 1e-5f;
  return c;
}

// Parameters far from Init's (norms 1, 0.02-scale weights) so every term matters.
std::vector<Tensor> RandomParams(const Layer& block, uint64_t seed) {
  std::vector<Tensor> p;
  block.Init(seed, 0, &p);
  const std::vector<ParamSpec> specs = block.params();
  for (size_t i = 0; i < p.size(); ++i) {
    const int64_t n = static_cast<int64_t>(p[i].data.size());
    const bool matrix = specs[i].shape.size() == 2;
    const float bound = matrix ? 1.5f / std::sqrt(static_cast<float>(specs[i].shape[1])) : 0.5f;
    const Matrix m = RandomMatrix(1, n, seed + i, matrix ? -bound : 0.5f, matrix ? bound : 1.5f);
    p[i].data.assign(m.data(), m.data() + n);
  }
  return p;
}

TEST(LlamaBlockIncrementalTest, AWholeSampleAtOnceIsBitwiseForward) {
  const LlamaBlock block(Config());
  ASSERT_TRUE(block.SupportsIncremental());
  const std::vector<Tensor> p = RandomParams(block, 11);
  const Matrix x = RandomMatrix(kContext, 32, 3);
  const std::unique_ptr<IncrementalState> state = block.NewIncrementalState();
  ASSERT_NE(state, nullptr);
  // Keys and values of the 2 kv heads only (2 * 8 columns), not of the 4 query heads.
  EXPECT_EQ(state->bytes(), 2 * kContext * 16 * 4);
  const Matrix y = IncrementalForward(block, p, x, {kContext}, state.get());
  EXPECT_TRUE(BitwiseEqual(AsConstMap(y), AsConstMap(FullForward(block, p, x))));
}

// One position per call (what generation does) and uneven chunks: the products have other shapes
// than Forward's, so Eigen sums them in another order; every other operation (RMSNorm, RoPE at
// the row's position, the softmax, SwiGLU) is Forward's own arithmetic. The bound is a few float
// ulps of values of order 1.
TEST(LlamaBlockIncrementalTest, EveryPositionMatchesForwardToRounding) {
  const LlamaBlock block(Config());
  const std::vector<Tensor> p = RandomParams(block, 5);
  const Matrix x = RandomMatrix(kContext, 32, 8);
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

// Without the rotation at the rows' own positions (every new row rotated as position 0) the
// outputs after the first position are far off: the test above sees RoPE's positions.
TEST(LlamaBlockIncrementalTest, RotaryPositionsMatter) {
  const RopeTable rope(8, kContext, 10000);
  Matrix a = RandomMatrix(3, 16, 1);
  Matrix b = a;
  rope.ApplyFrom(AsMap(a), 4);
  Matrix full = Matrix::Zero(kContext, 16);
  full.middleRows(4, 3) = b;
  rope.Apply(AsMap(full));
  // ApplyFrom(x, 4) is bitwise Apply on rows 4..6 of a full sample.
  EXPECT_TRUE(BitwiseEqual(AsConstMap(a), ConstMatrixMap(full.data() + 4 * 16, 3, 16)));
  rope.Apply(AsMap(b));  // positions 0..2 instead
  EXPECT_GT(MaxRelativeError(a, b), 1e-2);
}

// A row's output depends only on the positions up to it: the first k rows of Forward on a sample
// whose later rows are padding equal those of the incremental forward of k rows.
TEST(LlamaBlockIncrementalTest, PrefixOfAPaddedSampleMatches) {
  const LlamaBlock block(Config());
  const std::vector<Tensor> p = RandomParams(block, 21);
  Matrix x = RandomMatrix(kContext, 32, 4);
  Matrix padded = x;
  padded.bottomRows(kContext - 5).setConstant(0.25f);
  const Matrix a = FullForward(block, p, x);
  const Matrix b = FullForward(block, p, padded);
  EXPECT_TRUE(BitwiseEqual(ConstMatrixMap(a.data(), 5, 32), ConstMatrixMap(b.data(), 5, 32)));
  const std::unique_ptr<IncrementalState> state = block.NewIncrementalState();
  const Matrix first = x.topRows(5);
  const Matrix y = IncrementalForward(block, p, first, {5}, state.get());
  EXPECT_LE(MaxRelativeError(y, a.topRows(5)), 2e-6);
}

TEST(LlamaBlockIncrementalTest, ClearStartsOverWithTheSameBits) {
  const LlamaBlock block(Config());
  const std::vector<Tensor> p = RandomParams(block, 2);
  const Matrix x = RandomMatrix(kContext, 32, 6);
  const std::unique_ptr<IncrementalState> state = block.NewIncrementalState();
  const Matrix first =
      IncrementalForward(block, p, x, std::vector<int64_t>(kContext, 1), state.get());
  state->Clear();
  EXPECT_EQ(state->positions(), 0);
  const Matrix again =
      IncrementalForward(block, p, x, std::vector<int64_t>(kContext, 1), state.get());
  EXPECT_TRUE(BitwiseEqual(AsConstMap(first), AsConstMap(again)));
}

// Multi-head (kv_heads = heads) and multi-query (kv_heads = 1) attention decode too.
TEST(LlamaBlockIncrementalTest, MultiHeadAndMultiQuery) {
  for (const int64_t kv : {int64_t{4}, int64_t{1}}) {
    SCOPED_TRACE(::testing::Message() << "kv_heads " << kv);
    LlamaBlockConfig c = Config();
    c.kv_heads = kv;
    const LlamaBlock block(c);
    const std::vector<Tensor> p = RandomParams(block, 30 + kv);
    const Matrix x = RandomMatrix(kContext, 32, 7);
    const Matrix full = FullForward(block, p, x);
    const std::unique_ptr<IncrementalState> state = block.NewIncrementalState();
    EXPECT_EQ(state->bytes(), 2 * kContext * kv * 8 * 4);
    const Matrix y =
        IncrementalForward(block, p, x, std::vector<int64_t>(kContext, 1), state.get());
    EXPECT_LE(MaxRelativeError(y, full), 2e-6);
  }
}

// The blocks a Model runs are each instruction-set level's copies, reached through the Layer
// interface: theirs are incremental too, and a whole sample at once is that level's Forward.
// The RMSNorm layer is row-wise: Forward on the new rows, no state.
TEST(LlamaBlockIncrementalTest, EveryLevelsBlockAndRmsNormAreIncremental) {
  for (const Isa isa : SupportedIsas()) {
    SCOPED_TRACE(IsaName(isa));
    const Kernels& k = KernelsFor(isa);
    k.ConfigureEigen(1);
    const std::unique_ptr<Layer> block = k.MakeLlamaBlock(Config());
    ASSERT_TRUE(block->SupportsIncremental());
    const std::vector<Tensor> p = RandomParams(*block, 9);
    const Matrix x = RandomMatrix(kContext, 32, 10);
    const std::unique_ptr<IncrementalState> state = block->NewIncrementalState();
    const Matrix y = IncrementalForward(*block, p, x, {kContext}, state.get());
    EXPECT_TRUE(BitwiseEqual(AsConstMap(y), AsConstMap(FullForward(*block, p, x))));
    state->Clear();
    const Matrix steps =
        IncrementalForward(*block, p, x, std::vector<int64_t>(kContext, 1), state.get());
    EXPECT_LE(MaxRelativeError(steps, y), 2e-6);

    const std::unique_ptr<Layer> norm = k.MakeRmsNorm(32, 1e-5f);
    ASSERT_TRUE(norm->SupportsIncremental());
    EXPECT_EQ(norm->NewIncrementalState(), nullptr);
    std::vector<Tensor> np = RandomParams(*norm, 4);
    const Matrix full = FullForward(*norm, np, x);
    Stash scratch;
    Matrix row(1, 32);
    norm->ForwardIncremental(np, 7, ConstMatrixMap(x.data() + 7 * 32, 1, 32), nullptr, &scratch,
                             AsMap(row));
    EXPECT_TRUE(BitwiseEqual(AsConstMap(row), ConstMatrixMap(full.data() + 7 * 32, 1, 32)));
  }
}

}  // namespace
}  // namespace pipetrain::math
