// The canonical gradient tree: its shape for each micro-batch count, the replica shares it allows,
// the combine function, and that a Stage's gradients are the tree's bits — by the definition
// (leaves BackwardWeight into zeros, nodes lower + upper), whether W are deferred or added one by
// one, in order or not, and whether one stage runs the whole step or R replicas run its shares and
// their partial gradients are combined pairwise.
#include "common/model/grad_tree.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "common/math/tensor.h"
#include "common/math/tree_sum.h"
#include "common/model/stage.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/model/test_models.h"

namespace pipetrain::model {
namespace {

using testing::BuildOrDie;
using ::testing::HasSubstr;
using testing::MakeBatch;

TEST(GradTreeTest, LeavesAreTheOddPartOfTheMicrobatchCount) {
  const std::vector<std::pair<int64_t, int64_t>> leaf_of = {
      {1, 1}, {2, 1}, {3, 3}, {4, 1}, {6, 3}, {8, 1}, {10, 5}, {12, 3}, {16, 1}, {24, 3}};
  for (auto [m, leaf] : leaf_of) {
    auto tree = GradTree::Create(m);
    ASSERT_TRUE(tree.ok()) << tree.status();
    EXPECT_EQ(tree->leaf_size(), leaf) << m;
    EXPECT_EQ(tree->leaves(), m / leaf) << m;
  }
  EXPECT_EQ(GradTree::Create(0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(GradTree::Create(-3).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(GradTreeTest, NodesAreTheHalvingTreesRanges) {
  auto twelve = GradTree::Create(12);  // leaves [0,3) [3,6) [6,9) [9,12).
  ASSERT_TRUE(twelve.ok());
  for (MicrobatchRange r :
       std::vector<MicrobatchRange>{{0, 12}, {0, 6}, {6, 12}, {0, 3}, {3, 6}, {6, 9}, {9, 12}}) {
    EXPECT_TRUE(twelve->IsNode(r)) << r.lo << " " << r.hi;
  }
  for (MicrobatchRange r : std::vector<MicrobatchRange>{
           {0, 1}, {3, 9}, {0, 9}, {2, 5}, {6, 18}, {-6, 0}, {0, 4}, {4, 8}, {5, 5}}) {
    EXPECT_FALSE(twelve->IsNode(r)) << r.lo << " " << r.hi;
  }
}

TEST(GradTreeTest, ReplicaSharesArePowersOfTwoUpToTheLeaves) {
  auto twelve = GradTree::Create(12);
  ASSERT_TRUE(twelve.ok());
  EXPECT_TRUE(twelve->SupportsReplicas(1));
  EXPECT_TRUE(twelve->SupportsReplicas(2));
  EXPECT_TRUE(twelve->SupportsReplicas(4));
  EXPECT_FALSE(twelve->SupportsReplicas(3));  // divides 12, but [0,4) is not a node.
  EXPECT_FALSE(twelve->SupportsReplicas(8));
  EXPECT_FALSE(twelve->SupportsReplicas(0));
  auto share = twelve->ReplicaShare(4, 2);
  ASSERT_TRUE(share.ok()) << share.status();
  EXPECT_EQ(share->lo, 6);
  EXPECT_EQ(share->hi, 9);
  auto bad = twelve->ReplicaShare(3, 0);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()),
              HasSubstr("3 replicas cannot share a step of 12 micro-batches"));
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("a power of two dividing 4"));
  EXPECT_EQ(twelve->ReplicaShare(4, 4).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(twelve->ReplicaShare(4, -1).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(GradTreeTest, CombineAddsUpperToLowerAndChecksShapes) {
  std::vector<math::Tensor> lower = {{{2}, {1.0f, 0.1f}}, {{1}, {3.0f}}};
  const std::vector<math::Tensor> upper = {{{2}, {2.0f, 0.2f}}, {{1}, {-3.0f}}};
  ASSERT_TRUE(CombinePartialGradients(&lower, upper).ok());
  EXPECT_EQ(lower[0].data, (std::vector<float>{3.0f, 0.1f + 0.2f}));
  EXPECT_EQ(lower[1].data, (std::vector<float>{0.0f}));
  EXPECT_FALSE(std::signbit(lower[1].data[0]));
  std::vector<math::Tensor> other = {{{3}, {1, 2, 3}}, {{1}, {0}}};
  const auto status = CombinePartialGradients(&lower, other);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), HasSubstr("tensor 0 has shape [2]"));
  EXPECT_EQ(lower[0].data, (std::vector<float>{3.0f, 0.1f + 0.2f}));  // unchanged.
  EXPECT_EQ(CombinePartialGradients(&lower, {upper[0]}).code(), absl::StatusCode::kInvalidArgument);
}

// Buffers the folder holds with W in increasing order, one fold per W: at most log2(leaves).
TEST(GradTreeTest, InOrderFoldsHoldLogarithmicallyManyBuffers) {
  for (int64_t m : {1, 2, 4, 8, 16, 6, 12}) {
    auto tree = GradTree::Create(m);
    ASSERT_TRUE(tree.ok());
    auto folder = GradTreeFolder::Create(*tree, {0, m});
    ASSERT_TRUE(folder.ok());
    for (int64_t i = 0; i < m; ++i) {
      std::vector<int64_t> consumed;
      folder->Fold({i}, &consumed);
      EXPECT_EQ(consumed, std::vector<int64_t>{i});
      EXPECT_EQ(folder->complete(), i == m - 1);
    }
    EXPECT_LE(folder->buffers_used(), 1 + math::Log2OfPowerOfTwo(tree->leaves())) << m;
  }
}

// A leaf's later micro-batch waits for its earlier ones; a node waits for both children.
TEST(GradTreeTest, OutOfOrderMicrobatchesWaitForTheirLeafAndSibling) {
  auto six = GradTree::Create(6);  // leaves [0,3) [3,6).
  ASSERT_TRUE(six.ok());
  auto folder = GradTreeFolder::Create(*six, {0, 6});
  ASSERT_TRUE(folder.ok());
  std::vector<int64_t> consumed;
  EXPECT_TRUE(folder->Fold({4, 5}, &consumed).empty());  // leaf [3,6) needs 3 first.
  EXPECT_TRUE(consumed.empty());
  auto ops = folder->Fold({3, 4, 5}, &consumed);
  EXPECT_EQ(consumed, (std::vector<int64_t>{3, 4, 5}));
  ASSERT_EQ(ops.size(), 1u);
  EXPECT_EQ(ops[0].kind, FoldOp::Kind::kAccumulate);
  EXPECT_NE(ops[0].dest, 0);  // not the leftmost node: a spare buffer.
  EXPECT_FALSE(folder->complete());
  ops = folder->Fold({0, 1, 2}, &consumed);
  ASSERT_EQ(ops.size(), 2u);
  EXPECT_EQ(ops[0].dest, 0);
  EXPECT_EQ(ops[1].kind, FoldOp::Kind::kCombine);
  EXPECT_TRUE(folder->complete());
  EXPECT_EQ(GradTreeFolder::Create(*six, {0, 4}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// ---- The gradients of stages against the tree's definition. ----

// A stage over a whole small model and the micro-batches of one step.
struct Step {
  const Model* model;
  std::vector<math::Matrix> x;
  std::vector<math::Matrix> dy;
};

Step MakeStep(const Model& model, int64_t m) {
  Step step{&model, {}, {}};
  for (int64_t i = 0; i < m; ++i) {
    step.x.push_back(MakeBatch(model, 2, 100 + static_cast<int>(i)).inputs);
    math::Matrix dy(step.x.back().rows(), model.output_features());
    for (int64_t e = 0; e < dy.size(); ++e) {
      dy.data()[e] = 0.01f * static_cast<float>((e * 37 + i * 11) % 89) - 0.44f;
    }
    step.dy.push_back(std::move(dy));
  }
  return step;
}

// Every layer's gradients, in layer order.
using Grads = std::vector<std::vector<math::Tensor>>;

// F and I of micro-batch i on `stage` into `state`.
void ForwardBackwardInput(const Step& step, Stage* stage, int64_t i, MicrobatchState* state) {
  stage->Forward(math::AsConstMap(step.x[i]), state);
  stage->BackwardInput(math::AsConstMap(step.dy[i]), /*need_input_grad=*/false, state);
}

// The gradients of a stage over micro-batches [share) of a step of M, W in `order` (indices in
// the share), deferring up to `defer_bytes` (-1: the default).
Grads RunShare(const Step& step, int64_t m, MicrobatchRange share, std::vector<int64_t> order,
               int64_t defer_bytes) {
  auto stage = Stage::Create(step.model, 0, step.model->num_layers(), 5, math::OptimizerConfig{});
  EXPECT_TRUE(stage.ok()) << stage.status();
  auto tree = GradTree::Create(m);
  EXPECT_TRUE(tree.ok());
  EXPECT_TRUE(stage->SetGradTree(*tree, share).ok());
  if (defer_bytes >= 0) stage->set_weight_grad_defer_bytes(defer_bytes);
  std::vector<MicrobatchState> states(m);
  for (int64_t i : order) ForwardBackwardInput(step, &*stage, i, &states[i]);
  std::vector<double> norms;
  for (size_t n = 0; n < order.size(); ++n) {
    const bool last = n + 1 == order.size();
    EXPECT_TRUE(stage->BackwardWeightAt(order[n], &states[order[n]], last ? &norms : nullptr).ok());
  }
  EXPECT_EQ(stage->DeferredWeightGradBytes(), 0);
  Grads grads;
  for (int64_t l = 0; l < step.model->num_layers(); ++l) grads.push_back(stage->grads(l));
  EXPECT_EQ(norms, stage->GradNormSqPerLayer());
  return grads;
}

// Bytes one deferred micro-batch of `step` holds in a stage.
int64_t OneDeferredMicrobatchBytes(const Step& step) {
  auto stage = Stage::Create(step.model, 0, step.model->num_layers(), 5, math::OptimizerConfig{});
  EXPECT_TRUE(stage.ok());
  stage->set_weight_grad_defer_bytes(int64_t{1} << 40);
  MicrobatchState state;
  ForwardBackwardInput(step, &*stage, 0, &state);
  stage->BackwardWeight(&state);
  return stage->DeferredWeightGradBytes();
}

// The node [lo, hi) of layer l's gradient by the definition: a leaf is the layer's BackwardWeight
// of its micro-batches one after another into zeros; a node is lower + upper.
std::vector<math::Tensor> NodeByDefinition(const Step& step, const GradTree& tree, int64_t l,
                                           int64_t lo, int64_t hi) {
  const math::Layer& layer = step.model->layer(l);
  if (hi - lo == tree.leaf_size()) {
    auto stage = Stage::Create(step.model, 0, step.model->num_layers(), 5, math::OptimizerConfig{});
    EXPECT_TRUE(stage.ok());
    std::vector<math::Tensor> out = stage->params(l);
    for (math::Tensor& t : out) std::fill(t.data.begin(), t.data.end(), 0.0f);
    for (int64_t i = lo; i < hi; ++i) {
      MicrobatchState s;
      ForwardBackwardInput(step, &*stage, i, &s);
      layer.BackwardWeight(stage->params(l), math::AsConstMap(s.inputs[l]),
                           math::AsConstMap(s.grads[l + 1]), s.stashes[l], absl::MakeSpan(out));
    }
    return out;
  }
  const int64_t mid = lo + (hi - lo) / 2;
  std::vector<math::Tensor> lower = NodeByDefinition(step, tree, l, lo, mid);
  const std::vector<math::Tensor> upper = NodeByDefinition(step, tree, l, mid, hi);
  for (size_t p = 0; p < lower.size(); ++p) {
    for (size_t e = 0; e < lower[p].data.size(); ++e) {
      lower[p].data[e] = lower[p].data[e] + upper[p].data[e];
    }
  }
  return lower;
}

bool BitwiseEqual(const Grads& a, const Grads& b) {
  if (a.size() != b.size()) return false;
  for (size_t l = 0; l < a.size(); ++l) {
    if (a[l].size() != b[l].size()) return false;
    for (size_t p = 0; p < a[l].size(); ++p) {
      if (a[l][p].data.size() != b[l][p].data.size() ||
          std::memcmp(a[l][p].data.data(), b[l][p].data.data(),
                      a[l][p].data.size() * sizeof(float)) != 0) {
        return false;
      }
    }
  }
  return true;
}

std::vector<int64_t> Range(int64_t lo, int64_t hi) {
  std::vector<int64_t> out;
  for (int64_t i = lo; i < hi; ++i) out.push_back(i);
  return out;
}

// The partial gradients of R replicas combined pairwise in the tree: (0+1) + (2+3), ...
Grads CombinedReplicas(const Step& step, const GradTree& tree, int64_t replicas) {
  std::vector<Grads> partials;
  for (int64_t r = 0; r < replicas; ++r) {
    auto share = tree.ReplicaShare(replicas, r);
    EXPECT_TRUE(share.ok()) << share.status();
    partials.push_back(
        RunShare(step, tree.microbatches(), *share, Range(share->lo, share->hi), -1));
  }
  for (int64_t width = 1; width < replicas; width *= 2) {
    for (int64_t r = 0; r < replicas; r += 2 * width) {
      for (size_t l = 0; l < partials[r].size(); ++l) {
        EXPECT_TRUE(CombinePartialGradients(&partials[r][l], partials[r + width][l]).ok());
      }
    }
  }
  return partials[0];
}

constexpr char kNormMlp[] = R"pb(
  name: "norm_mlp"
  input_features: 24
  layers { linear { out_features: 40 } }
  layers { layer_norm {} }
  layers { relu {} }
  layers { linear { out_features: 40 } }
  layers { linear { out_features: 6 } }
  loss { softmax_cross_entropy {} }
)pb";

constexpr char kLlama[] = R"pb(
  name: "llama"
  input_features: 1
  layers { embedding { vocab_size: 13 dim: 16 context: 4 positions: NONE } }
  layers { llama_block { heads: 4 kv_heads: 2 hidden: 24 } }
  layers { rms_norm {} }
  layers { linear { out_features: 13 no_bias: true } }
  loss { softmax_cross_entropy {} }
)pb";

// For M in {1, 2, 3, 4, 6, 8, 12, 16}: the whole step's gradients are the definition's, the same
// with every W added at once (deferred), one by one, in groups of 2 and 3 (the deferral limit),
// in reverse and in a shuffled order, and
// equal to every supported replica count's partials combined. Linear (the blocked tree and a
// right leaf added by the kernel), LayerNorm, RMSNorm, the embedding's scatter, the GPT
// transformer block and the LLaMA block (their leaves through the generic tree).
TEST(GradTreeStageTest, EveryOrderAndReplicaCountGivesTheTreesBits) {
  for (const char* spec : {kNormMlp, testing::kGptSpec, kLlama}) {
    auto model = BuildOrDie(spec);
    ASSERT_NE(model, nullptr);
    model->kernels().ConfigureEigen(1);
    for (int64_t m : {1, 2, 3, 4, 6, 8, 12, 16}) {
      SCOPED_TRACE(::testing::Message() << model->spec().name() << ", M = " << m);
      const Step step = MakeStep(*model, m);
      auto tree = GradTree::Create(m);
      ASSERT_TRUE(tree.ok());
      const Grads whole = RunShare(step, m, {0, m}, Range(0, m), int64_t{1} << 40);
      Grads definition;
      for (int64_t l = 0; l < model->num_layers(); ++l) {
        definition.push_back(NodeByDefinition(step, *tree, l, 0, m));
      }
      EXPECT_TRUE(BitwiseEqual(whole, definition)) << "deferred vs definition";
      EXPECT_TRUE(BitwiseEqual(whole, RunShare(step, m, {0, m}, Range(0, m), 0))) << "one by one";
      const int64_t one = OneDeferredMicrobatchBytes(step);
      for (int64_t group : {2, 3}) {
        EXPECT_TRUE(BitwiseEqual(whole, RunShare(step, m, {0, m}, Range(0, m), group * one - 1)))
            << "in groups of " << group;
      }
      std::vector<int64_t> reverse = Range(0, m);
      std::reverse(reverse.begin(), reverse.end());
      EXPECT_TRUE(BitwiseEqual(whole, RunShare(step, m, {0, m}, reverse, 0))) << "reversed";
      std::vector<int64_t> shuffled;
      for (int64_t i = 0; i < m; ++i) shuffled.push_back((i * 5 + 3) % m);  // 5 is prime to M.
      if (m % 5 != 0) {
        EXPECT_TRUE(BitwiseEqual(whole, RunShare(step, m, {0, m}, shuffled, 0))) << "shuffled";
      }
      for (int64_t r = 2; r <= tree->leaves(); r *= 2) {
        EXPECT_TRUE(BitwiseEqual(whole, CombinedReplicas(step, *tree, r))) << r << " replicas";
      }
    }
  }
}

// BackwardWeightAt refuses a micro-batch outside the share and a repeated one.
TEST(GradTreeStageTest, BackwardWeightAtChecksTheMicrobatch) {
  auto model = BuildOrDie(testing::kMlpSpec);
  ASSERT_NE(model, nullptr);
  const Step step = MakeStep(*model, 4);
  auto stage = Stage::Create(model.get(), 0, model->num_layers(), 5, math::OptimizerConfig{});
  ASSERT_TRUE(stage.ok());
  auto tree = GradTree::Create(4);
  ASSERT_TRUE(tree.ok());
  ASSERT_TRUE(stage->SetGradTree(*tree, {2, 4}).ok());
  EXPECT_EQ(stage->SetGradTree(*tree, {1, 3}).code(), absl::StatusCode::kInvalidArgument);
  MicrobatchState state;
  ForwardBackwardInput(step, &*stage, 0, &state);
  const absl::Status outside = stage->BackwardWeightAt(0, &state);
  EXPECT_EQ(outside.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(outside.message()), HasSubstr("outside the stage's share [2, 4)"));
  ASSERT_TRUE(stage->BackwardWeightAt(3, &state).ok());
  ForwardBackwardInput(step, &*stage, 3, &state);
  EXPECT_EQ(stage->BackwardWeightAt(3, &state).code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace pipetrain::model
