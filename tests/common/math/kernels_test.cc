// The per-level kernels: each level is bitwise-stable on its own; levels agree bit for bit where
// the math has no reduction whose order follows the vector width (initialisation, elementwise
// layers, the embedding's gathers and scatters) and differ in the last bits where it has one
// (GEMM, row sums), as docs/performance.md, "Instruction sets", says.
#include "common/math/kernels.h"

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/common/math/grad_check.h"

namespace pipetrain::math {
namespace {

using testing::BitwiseEqual;
using testing::ExpectBitwiseStableUnderRealignment;
using testing::RandomMatrix;
using testing::RunLayer;

// One layer of each kind with the input it takes.
struct LayerCase {
  std::string name;
  std::unique_ptr<Layer> layer;
  Matrix x;
};

std::vector<LayerCase> AllLayers(const Kernels& k) {
  std::vector<LayerCase> cases;
  cases.push_back({"linear", k.MakeLinear(96, 80, true), RandomMatrix(24, 96, 1)});
  cases.push_back({"relu", k.MakeRelu(40), RandomMatrix(16, 40, 2)});
  cases.push_back({"gelu", k.MakeGelu(40), RandomMatrix(16, 40, 3)});
  cases.push_back({"layer_norm", k.MakeLayerNorm(72, 1e-5f), RandomMatrix(16, 72, 4)});
  Matrix tokens(2 * 8, 1);
  for (int64_t r = 0; r < tokens.rows(); ++r) tokens(r, 0) = static_cast<float>((r * 7) % 29);
  cases.push_back({"embedding", k.MakeEmbedding(29, 48, 8, true), tokens});
  cases.push_back(
      {"transformer_block", k.MakeTransformerBlock(48, 4, 8, 4), RandomMatrix(2 * 8, 48, 5)});
  // Context 40: two causal query blocks (gqa_attention.h), the second one short.
  cases.push_back({"transformer_block_long", k.MakeTransformerBlock(64, 2, 40, 4),
                   RandomMatrix(2 * 40, 64, 8)});
  cases.push_back({"rms_norm", k.MakeRmsNorm(72, 1e-5f), RandomMatrix(16, 72, 6)});
  cases.push_back({"embedding_no_positions", k.MakeEmbedding(29, 48, 8, false), tokens});
  cases.push_back({"llama_block",
                   // dim 48, 4 heads, 2 kv heads, context 8, hidden 136.
                   k.MakeLlamaBlock({48, 4, 2, 8, 136, 10000.0, 1e-5f}),
                   RandomMatrix(2 * 8, 48, 7)});
  // Context 40: two causal query blocks; dim 64, 4 heads, 2 kv heads, hidden 172.
  cases.push_back({"llama_block_long", k.MakeLlamaBlock({64, 4, 2, 40, 172, 10000.0, 1e-5f}),
                   RandomMatrix(2 * 40, 64, 9)});
  return cases;
}

std::vector<Tensor> Init(const Layer& layer) {
  std::vector<Tensor> params;
  layer.Init(/*seed=*/11, /*layer_index=*/2, &params);
  return params;
}

TEST(KernelsTest, EachLevelReportsItselfAndMakesEveryKind) {
  for (Isa isa : BuiltIsas()) {
    const Kernels& k = KernelsFor(isa);
    EXPECT_EQ(k.isa(), isa);
    EXPECT_EQ(k.MakeLinear(3, 2, true)->kind(), "linear");
    EXPECT_EQ(k.MakeTransformerBlock(8, 2, 4, 4)->kind(), "transformer_block");
    EXPECT_EQ(k.MakeRmsNorm(8, 1e-5f)->kind(), "rms_norm");
    EXPECT_EQ(k.MakeLlamaBlock({8, 2, 1, 4, 16, 10000.0, 1e-5f})->kind(), "llama_block");
    EXPECT_EQ(k.MakeSoftmaxCrossEntropy()->kind(), "softmax_cross_entropy");
    EXPECT_EQ(k.MakeMse()->kind(), "mse");
  }
}

TEST(KernelsTest, EveryLayerIsBitwiseStableAtEverySupportedLevel) {
  for (Isa isa : SupportedIsas()) {
    const Kernels& k = KernelsFor(isa);
    k.ConfigureEigen(1);
    for (LayerCase& c : AllLayers(k)) {
      SCOPED_TRACE(std::string(IsaName(isa)) + " " + c.name);
      const Matrix dy = RandomMatrix(c.x.rows(), c.layer->out_features(), 9);
      ExpectBitwiseStableUnderRealignment(*c.layer, Init(*c.layer), c.x, dy);
    }
  }
}

// Every level's layers give the same bits with and without their parameter cache (a Linear's or
// a transformer or LLaMA block's packed weights), also after the parameters change and the cache is
// told.
TEST(KernelsTest, ParamCachesChangeNoBitAtEverySupportedLevel) {
  for (Isa isa : SupportedIsas()) {
    const Kernels& k = KernelsFor(isa);
    k.ConfigureEigen(1);
    for (LayerCase& c : AllLayers(k)) {
      SCOPED_TRACE(std::string(IsaName(isa)) + " " + c.name);
      std::unique_ptr<ParamCache> cache = c.layer->NewParamCache();
      // The layers with weight products: Linear and the two blocks.
      const bool packs = c.name == "linear" || c.name.rfind("transformer_block", 0) == 0 ||
                         c.name.rfind("llama_block", 0) == 0;
      EXPECT_EQ(cache != nullptr, packs);
      std::vector<Tensor> params = Init(*c.layer);
      for (int change = 0; change < 3; ++change) {
        const Matrix dy = RandomMatrix(c.x.rows(), c.layer->out_features(), 9 + change);
        Matrix y(c.x.rows(), c.layer->out_features()), y_cached = y;
        Matrix dx(c.x.rows(), c.layer->in_features()), dx_cached = dx;
        // Both zeroed at the size Forward gives them: a Stash leaves new floats uninitialised,
        // and the alignment gaps between a block's regions are never written.
        const size_t stash_floats =
            static_cast<size_t>(c.layer->StashBytes(c.x.rows())) / sizeof(float);
        Stash stash, stash_cached;
        stash.data.assign(stash_floats, 0.0f);
        stash_cached.data.assign(stash_floats, 0.0f);
        auto stash_map = [](const Stash& st) {
          return ConstMatrixMap(st.data.data(), 1, static_cast<int64_t>(st.data.size()));
        };
        c.layer->Forward(params, AsConstMap(c.x), AsMap(y), &stash);
        c.layer->BackwardInput(params, AsConstMap(c.x), AsConstMap(dy), &stash, AsMap(dx));
        for (int call = 0; call < 2; ++call) {
          c.layer->ForwardCached(params, cache.get(), AsConstMap(c.x), AsMap(y_cached),
                                 &stash_cached);
          c.layer->BackwardInputCached(params, cache.get(), AsConstMap(c.x), AsConstMap(dy),
                                       &stash_cached, AsMap(dx_cached));
          EXPECT_TRUE(BitwiseEqual(AsConstMap(y), AsConstMap(y_cached))) << change << call;
          EXPECT_TRUE(BitwiseEqual(AsConstMap(dx), AsConstMap(dx_cached))) << change << call;
          ASSERT_EQ(stash.data.size(), stash_cached.data.size());
          EXPECT_TRUE(BitwiseEqual(stash_map(stash), stash_map(stash_cached))) << change << call;
        }
        // An optimizer step: new values in the same buffers, and the cache is told.
        for (Tensor& p : params) {
          for (float& v : p.data) v = v * 0.5f + 0.125f;
        }
        if (cache != nullptr) {
          cache->ParamsChanged();
          // Rebuilt at once (as Stage::ApplyOptimizer does) after the first change, on first use
          // after the second.
          if (change == 0) cache->Refresh(params);
        }
      }
    }
  }
}

// BackwardWeightMany of several micro-batches gives bitwise the gradients of BackwardWeight on
// each in turn, at every level, for every kind (a Linear runs its blocked accumulation; one large
// enough for several passes over its gradient too), also when the last micro-batch is shorter.
TEST(KernelsTest, WeightGradientsOfManyMicrobatchesAreThoseOfOneAtATime) {
  for (Isa isa : SupportedIsas()) {
    const Kernels& k = KernelsFor(isa);
    k.ConfigureEigen(1);
    std::vector<LayerCase> cases = AllLayers(k);
    cases.push_back({"linear 512x512", k.MakeLinear(512, 512, true), RandomMatrix(32, 512, 6)});
    for (LayerCase& c : cases) {
      for (bool shorter_last : {false, true}) {
        SCOPED_TRACE(std::string(IsaName(isa)) + " " + c.name +
                     (shorter_last ? ", shorter last" : ""));
        const std::vector<Tensor> params = Init(*c.layer);
        const int64_t row_step = c.layer->row_multiple();
        std::vector<Matrix> xs, dys;
        std::vector<Stash> stashes;
        for (int mb = 0; mb < 4; ++mb) {
          Matrix x = c.x;
          if (mb > 0) {
            for (int64_t i = 0; i < x.size(); ++i) {
              if (c.name != "embedding") x.data()[i] = x.data()[i] * 0.75f + 0.01f * mb;
            }
          }
          if (shorter_last && mb == 3 && x.rows() > row_step) {
            x = Matrix(x.topRows(x.rows() - row_step));
          }
          const Matrix dy = RandomMatrix(x.rows(), c.layer->out_features(), 30 + mb);
          Matrix y(x.rows(), c.layer->out_features()), dx(x.rows(), c.layer->in_features());
          Stash stash;
          c.layer->Forward(params, AsConstMap(x), AsMap(y), &stash);
          c.layer->BackwardInput(params, AsConstMap(x), AsConstMap(dy), &stash, AsMap(dx));
          xs.push_back(std::move(x));
          dys.push_back(dy);
          stashes.push_back(std::move(stash));
        }
        auto zeros = [&] {
          std::vector<Tensor> g = params;
          for (Tensor& t : g) std::fill(t.data.begin(), t.data.end(), 0.0f);
          return g;
        };
        std::vector<Tensor> one_by_one = zeros(), many = zeros();
        std::vector<WeightGradInputs> inputs;
        for (size_t mb = 0; mb < xs.size(); ++mb) {
          c.layer->BackwardWeight(params, AsConstMap(xs[mb]), AsConstMap(dys[mb]), stashes[mb],
                                  absl::MakeSpan(one_by_one));
          inputs.push_back({AsConstMap(xs[mb]), AsConstMap(dys[mb]), &stashes[mb]});
        }
        c.layer->BackwardWeightMany(params, inputs, absl::MakeSpan(many));
        ASSERT_EQ(many.size(), one_by_one.size());
        for (size_t p = 0; p < many.size(); ++p) {
          EXPECT_TRUE(BitwiseEqual(many[p].data, one_by_one[p].data)) << "param " << p;
        }
      }
    }
  }
}

// A layer's own tree node (Layer::BackwardWeightNode; a Linear's blocked tree) gives, at every
// level, the bits of the gradient tree's definition: leaves BackwardWeight into zeros, nodes
// lower + upper, added to the gradients (zero or not); layers without one decline and change
// nothing. Four micro-batches as four leaves of one and as two leaves of two.
TEST(KernelsTest, WeightGradientTreeNodesAreTheirDefinitionAtEverySupportedLevel) {
  for (Isa isa : SupportedIsas()) {
    const Kernels& k = KernelsFor(isa);
    k.ConfigureEigen(1);
    std::vector<LayerCase> cases = AllLayers(k);
    cases.push_back({"linear 512x512", k.MakeLinear(512, 512, true), RandomMatrix(32, 512, 6)});
    for (LayerCase& c : cases) {
      const std::vector<Tensor> params = Init(*c.layer);
      std::vector<Matrix> xs, dys;
      std::vector<Stash> stashes(4);
      std::vector<WeightGradInputs> inputs;
      for (int mb = 0; mb < 4; ++mb) {
        xs.push_back(c.x);
        if (c.name.rfind("embedding", 0) != 0) xs.back() = c.x * (1.0f - 0.2f * mb);
        dys.push_back(RandomMatrix(c.x.rows(), c.layer->out_features(), 60 + mb));
        Matrix y(c.x.rows(), c.layer->out_features()), dx(c.x.rows(), c.layer->in_features());
        c.layer->Forward(params, AsConstMap(xs[mb]), AsMap(y), &stashes[mb]);
        c.layer->BackwardInput(params, AsConstMap(xs[mb]), AsConstMap(dys[mb]), &stashes[mb],
                               AsMap(dx));
      }
      for (int mb = 0; mb < 4; ++mb) {
        inputs.push_back({AsConstMap(xs[mb]), AsConstMap(dys[mb]), &stashes[mb]});
      }
      // The leaf of micro-batches [lo, hi), BackwardWeight one after another into zeros.
      auto leaf = [&](int lo, int hi) {
        std::vector<Tensor> g = params;
        for (Tensor& t : g) std::fill(t.data.begin(), t.data.end(), 0.0f);
        for (int mb = lo; mb < hi; ++mb) {
          c.layer->BackwardWeight(params, AsConstMap(xs[mb]), AsConstMap(dys[mb]), stashes[mb],
                                  absl::MakeSpan(g));
        }
        return g;
      };
      auto add = [](std::vector<Tensor> lower, const std::vector<Tensor>& upper) {
        for (size_t p = 0; p < lower.size(); ++p) {
          for (size_t e = 0; e < lower[p].data.size(); ++e) {
            lower[p].data[e] = lower[p].data[e] + upper[p].data[e];
          }
        }
        return lower;
      };
      for (int64_t leaf_size : {1, 2}) {
        const std::vector<Tensor> node =
            leaf_size == 1 ? add(add(leaf(0, 1), leaf(1, 2)), add(leaf(2, 3), leaf(3, 4)))
                           : add(leaf(0, 2), leaf(2, 4));
        for (bool zero_start : {true, false}) {
          SCOPED_TRACE(std::string(IsaName(isa)) + " " + c.name + ", leaves of " +
                       std::to_string(leaf_size) + (zero_start ? ", from zero" : ""));
          std::vector<Tensor> start = leaf(zero_start ? 0 : 3, zero_start ? 0 : 4);
          std::vector<Tensor> grads = start;
          const bool ran =
              c.layer->BackwardWeightNode(params, inputs, leaf_size, absl::MakeSpan(grads));
          const std::vector<Tensor> expected = ran ? add(start, node) : start;
          EXPECT_EQ(ran, c.name.rfind("linear", 0) == 0);
          for (size_t p = 0; p < grads.size(); ++p) {
            EXPECT_TRUE(BitwiseEqual(grads[p].data, expected[p].data)) << "param " << p;
          }
        }
      }
    }
  }
}

TEST(KernelsTest, LossesAreBitwiseStableAtEverySupportedLevel) {
  Matrix pred = RandomMatrix(32, 10, 21);
  Matrix labels(32, 1);
  for (int64_t r = 0; r < 32; ++r) labels(r, 0) = static_cast<float>(r % 10);
  for (Isa isa : SupportedIsas()) {
    SCOPED_TRACE(IsaName(isa));
    const Kernels& k = KernelsFor(isa);
    const std::unique_ptr<Loss> ce = k.MakeSoftmaxCrossEntropy();
    const std::unique_ptr<Loss> mse = k.MakeMse();
    Matrix d1(32, 10), d2(32, 10);
    const double l1 = ce->LossAndGrad(AsConstMap(pred), AsConstMap(labels), 1.0 / 32, AsMap(d1));
    const double l2 = ce->LossAndGrad(AsConstMap(pred), AsConstMap(labels), 1.0 / 32, AsMap(d2));
    EXPECT_EQ(l1, l2);
    EXPECT_TRUE(BitwiseEqual(AsConstMap(d1), AsConstMap(d2)));
    const Matrix target = RandomMatrix(32, 10, 22);
    const double m1 = mse->LossAndGrad(AsConstMap(pred), AsConstMap(target), 1.0, AsMap(d1));
    const double m2 = mse->LossAndGrad(AsConstMap(pred), AsConstMap(target), 1.0, AsMap(d2));
    EXPECT_EQ(m1, m2);
    EXPECT_TRUE(BitwiseEqual(AsConstMap(d1), AsConstMap(d2)));
  }
}

// The pairs of supported levels (empty on a CPU that runs one level only).
std::vector<std::pair<Isa, Isa>> LevelPairs() {
  const std::vector<Isa> levels = SupportedIsas();
  std::vector<std::pair<Isa, Isa>> pairs;
  for (size_t i = 0; i + 1 < levels.size(); ++i) pairs.emplace_back(levels[i], levels.back());
  return pairs;
}

TEST(KernelsTest, LevelsAgreeBitwiseOnInitialisationAndElementwiseLayers) {
  if (LevelPairs().empty()) GTEST_SKIP() << "this CPU runs one level only";
  for (auto [a, b] : LevelPairs()) {
    SCOPED_TRACE(std::string(IsaName(a)) + " vs " + std::string(IsaName(b)));
    std::vector<LayerCase> la = AllLayers(KernelsFor(a));
    std::vector<LayerCase> lb = AllLayers(KernelsFor(b));
    KernelsFor(a).ConfigureEigen(1);
    KernelsFor(b).ConfigureEigen(1);
    for (size_t i = 0; i < la.size(); ++i) {
      SCOPED_TRACE(la[i].name);
      // Weights depend only on (seed, layer): a checkpoint means the same at every level.
      const std::vector<Tensor> pa = Init(*la[i].layer);
      const std::vector<Tensor> pb = Init(*lb[i].layer);
      ASSERT_EQ(pa.size(), pb.size());
      for (size_t p = 0; p < pa.size(); ++p) EXPECT_TRUE(BitwiseEqual(pa[p].data, pb[p].data));
      if (la[i].name != "relu" && la[i].name != "gelu" && la[i].name != "embedding") continue;
      const Matrix dy = RandomMatrix(la[i].x.rows(), la[i].layer->out_features(), 9);
      const testing::LayerRun ra = RunLayer(*la[i].layer, pa, la[i].x, dy);
      const testing::LayerRun rb = RunLayer(*lb[i].layer, pb, lb[i].x, dy);
      EXPECT_TRUE(BitwiseEqual(AsConstMap(ra.y), AsConstMap(rb.y)));
      if (la[i].name != "embedding") {
        EXPECT_TRUE(BitwiseEqual(AsConstMap(ra.dx), AsConstMap(rb.dx)));
      }
      ASSERT_EQ(ra.grads.size(), rb.grads.size());
      for (size_t g = 0; g < ra.grads.size(); ++g) {
        EXPECT_TRUE(BitwiseEqual(ra.grads[g].data, rb.grads[g].data));
      }
    }
  }
}

TEST(KernelsTest, LevelsAgreeBitwiseOnTheLosses) {
  if (LevelPairs().empty()) GTEST_SKIP() << "this CPU runs one level only";
  const Matrix pred = RandomMatrix(32, 10, 21);
  const Matrix target = RandomMatrix(32, 10, 22);
  Matrix labels(32, 1);
  for (int64_t r = 0; r < 32; ++r) labels(r, 0) = static_cast<float>(r % 10);
  for (auto [a, b] : LevelPairs()) {
    SCOPED_TRACE(std::string(IsaName(a)) + " vs " + std::string(IsaName(b)));
    for (bool ce : {true, false}) {
      const std::unique_ptr<Loss> la =
          ce ? KernelsFor(a).MakeSoftmaxCrossEntropy() : KernelsFor(a).MakeMse();
      const std::unique_ptr<Loss> lb =
          ce ? KernelsFor(b).MakeSoftmaxCrossEntropy() : KernelsFor(b).MakeMse();
      const Matrix& t = ce ? labels : target;
      Matrix da(32, 10), db(32, 10);
      EXPECT_EQ(la->LossAndGrad(AsConstMap(pred), AsConstMap(t), 1.0 / 32, AsMap(da)),
                lb->LossAndGrad(AsConstMap(pred), AsConstMap(t), 1.0 / 32, AsMap(db)));
      EXPECT_TRUE(BitwiseEqual(AsConstMap(da), AsConstMap(db))) << la->kind();
    }
  }
}

// Where the levels differ: a product whose depth spans more than one vector register's worth of
// partial sums is summed in another order at another width. The results stay within float
// rounding of each other.
TEST(KernelsTest, LevelsDifferOnlyInRoundingOnProductsAndReductions) {
  if (LevelPairs().empty()) GTEST_SKIP() << "this CPU runs one level only";
  for (auto [a, b] : LevelPairs()) {
    SCOPED_TRACE(std::string(IsaName(a)) + " vs " + std::string(IsaName(b)));
    std::vector<LayerCase> la = AllLayers(KernelsFor(a));
    std::vector<LayerCase> lb = AllLayers(KernelsFor(b));
    for (size_t i = 0; i < la.size(); ++i) {
      SCOPED_TRACE(la[i].name);
      const std::vector<Tensor> params = Init(*la[i].layer);
      const Matrix dy = RandomMatrix(la[i].x.rows(), la[i].layer->out_features(), 9);
      const testing::LayerRun ra = RunLayer(*la[i].layer, params, la[i].x, dy);
      const testing::LayerRun rb = RunLayer(*lb[i].layer, params, lb[i].x, dy);
      int64_t differing = 0;
      for (int64_t e = 0; e < ra.y.size(); ++e) {
        const float ya = ra.y.data()[e];
        const float yb = rb.y.data()[e];
        EXPECT_NEAR(ya, yb, 1e-5f * (1.0f + std::abs(ya))) << "element " << e;
        differing += ya != yb;
      }
      // The linear layer's product (96 deep) rounds differently at the two widths: this also
      // proves that each level runs its own code, not one level's kernels for both.
      if (la[i].name == "linear") {
        EXPECT_GT(differing, 0);
      }
      std::printf("[ %s vs %s ] %-18s forward: %lld of %lld outputs differ in their bits\n",
                  std::string(IsaName(a)).c_str(), std::string(IsaName(b)).c_str(),
                  la[i].name.c_str(), static_cast<long long>(differing),
                  static_cast<long long>(ra.y.size()));
    }
  }
}

}  // namespace
}  // namespace pipetrain::math
