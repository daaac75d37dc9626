// Small models and deterministic batches shared by the model tests.
#ifndef PIPETRAIN_TESTS_COMMON_MODEL_TEST_MODELS_H_
#define PIPETRAIN_TESTS_COMMON_MODEL_TEST_MODELS_H_

#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/io/dataset.h"
#include "common/model/model.h"
#include "gtest/gtest.h"

namespace pipetrain::model::testing {

inline constexpr char kMlpSpec[] = R"pb(
  name: "mlp"
  input_features: 6
  layers { linear { out_features: 8 } }
  layers { relu {} }
  layers { layer_norm {} }
  layers { linear { out_features: 8 } }
  layers { gelu {} }
  layers { linear { out_features: 4 } }
  loss { softmax_cross_entropy {} }
)pb";

inline constexpr char kGptSpec[] = R"pb(
  name: "gpt"
  input_features: 1
  layers { embedding { vocab_size: 11 dim: 8 context: 4 } }
  layers { transformer_block { heads: 2 } }
  layers { transformer_block { heads: 2 } }
  layers { layer_norm {} }
  layers { linear { out_features: 11 } }
  loss { softmax_cross_entropy {} }
)pb";

// kGptSpec with a tied input/output embedding: the head (layer 4) has no bias and shares the
// embedding's token table [11, 8].
inline constexpr char kTiedGptSpec[] = R"pb(
  name: "tied_gpt"
  input_features: 1
  layers { embedding { vocab_size: 11 dim: 8 context: 4 } }
  layers { transformer_block { heads: 2 } }
  layers { transformer_block { heads: 2 } }
  layers { layer_norm {} }
  layers { linear { out_features: 11 no_bias: true } }
  loss { softmax_cross_entropy {} }
  tie_embeddings: true
)pb";

// Deterministic parameters well away from Init's small scale, so the logits are far apart (a
// trained model's are) and no rounding difference can swap two of them.
inline std::vector<std::vector<math::Tensor>> RandomLmParams(const Model& model, uint64_t seed) {
  std::vector<std::vector<math::Tensor>> params(static_cast<size_t>(model.num_layers()));
  std::mt19937_64 g(seed);
  for (int64_t l = 0; l < model.num_layers(); ++l) {
    model.layer(l).Init(seed, l, &params[l]);
    const std::vector<math::ParamSpec> specs = model.layer(l).params();
    for (size_t i = 0; i < specs.size(); ++i) {
      const float bound = specs[i].shape.size() == 2 && model.layer(l).kind() != "embedding"
                              ? 2.0f / std::sqrt(static_cast<float>(specs[i].shape[1]))
                              : 1.0f;
      for (float& v : params[l][i].data) {
        v = bound * static_cast<float>(static_cast<double>(g() >> 11) * 0x1.0p-52 - 1.0);
      }
    }
  }
  return params;
}

inline std::unique_ptr<Model> BuildOrDie(const char* text) {
  auto spec = ParseModelSpecText(text, "test");
  EXPECT_TRUE(spec.ok()) << spec.status();
  auto model = Model::Build(*spec);
  EXPECT_TRUE(model.ok()) << model.status();
  return std::move(model).value();
}

// A deterministic batch of `samples` samples for `model`, varying with `salt`: smooth inputs
// (or token ids) and labels that depend on them.
inline io::Batch MakeBatch(const Model& model, int64_t samples, int salt) {
  io::Batch b;
  b.samples = samples;
  const int64_t rows = samples * model.tokens_per_sample();
  b.inputs.resize(rows, model.input_features());
  b.targets.resize(rows, 1);
  const bool tokens = model.spec().layers(0).has_embedding();
  const int64_t classes = model.output_features();
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < b.inputs.cols(); ++c) {
      b.inputs(r, c) = tokens ? static_cast<float>((r * 7 + salt * 3) % classes)
                              : std::sin(0.3f * static_cast<float>(r * 5 + c + salt));
    }
    b.targets(r, 0) = static_cast<float>((r * 3 + salt) % classes);
  }
  return b;
}

}  // namespace pipetrain::model::testing

#endif  // PIPETRAIN_TESTS_COMMON_MODEL_TEST_MODELS_H_
