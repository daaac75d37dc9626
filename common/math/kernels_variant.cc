// The Kernels of one instruction-set level. This file and the layer and loss sources are compiled
// once per level with that level's -march, PIPETRAIN_ISA_VARIANT_LEVEL (an Isa enumerator) and
// PIPETRAIN_ISA_VARIANT_ENTRY (the name of the level's entry function, the only global symbol
// left in the level's object; common/math/CMakeLists.txt).
#include <Eigen/Core>
#include <algorithm>
#include <chrono>
#include <memory>

#include "common/math/activations.h"
#include "common/math/det_math.h"
#include "common/math/embedding.h"
#include "common/math/kernels.h"
#include "common/math/layer_norm.h"
#include "common/math/linear.h"
#include "common/math/llama_block.h"
#include "common/math/loss.h"
#include "common/math/rms_norm.h"
#include "common/math/transformer_block.h"

#if !defined(PIPETRAIN_ISA_VARIANT_LEVEL) || !defined(PIPETRAIN_ISA_VARIANT_ENTRY)
#error "kernels_variant.cc is compiled only by the per-level rules of common/math/CMakeLists.txt"
#endif

namespace pipetrain::math {
namespace {

class VariantKernels final : public Kernels {
 public:
  Isa isa() const override { return PIPETRAIN_ISA_VARIANT_LEVEL; }

  std::unique_ptr<Layer> MakeLinear(int64_t in_features, int64_t out_features,
                                    bool bias) const override {
    return std::make_unique<Linear>(in_features, out_features, bias);
  }
  std::unique_ptr<Layer> MakeRelu(int64_t features) const override {
    return std::make_unique<Relu>(features);
  }
  std::unique_ptr<Layer> MakeGelu(int64_t features) const override {
    return std::make_unique<Gelu>(features);
  }
  std::unique_ptr<Layer> MakeLayerNorm(int64_t features, float eps) const override {
    return std::make_unique<LayerNorm>(features, eps);
  }
  std::unique_ptr<Layer> MakeRmsNorm(int64_t features, float eps) const override {
    return std::make_unique<RmsNorm>(features, eps);
  }
  std::unique_ptr<Layer> MakeEmbedding(int64_t vocab_size, int64_t dim, int64_t context,
                                       bool position_table) const override {
    return std::make_unique<Embedding>(vocab_size, dim, context, position_table);
  }
  std::unique_ptr<Layer> MakeTransformerBlock(int64_t dim, int64_t heads, int64_t context,
                                              int64_t mlp_ratio) const override {
    return std::make_unique<TransformerBlock>(dim, heads, context, mlp_ratio);
  }
  std::unique_ptr<Layer> MakeLlamaBlock(const LlamaBlockConfig& config) const override {
    return std::make_unique<LlamaBlock>(config);
  }
  std::unique_ptr<Loss> MakeSoftmaxCrossEntropy() const override {
    return math::MakeSoftmaxCrossEntropy();
  }
  std::unique_ptr<Loss> MakeMse() const override { return math::MakeMse(); }

  void ConfigureEigen(int threads) const override {
    PinEigenBlockingForReproducibility();
    Eigen::setNbThreads(std::max(threads, 1));
  }

  double MeasureGemmGflops(double seconds) const override {
    constexpr int kN = 256;
    Eigen::MatrixXf a = Eigen::MatrixXf::Constant(kN, kN, 0.5f);
    Eigen::MatrixXf b = Eigen::MatrixXf::Constant(kN, kN, 0.25f);
    Eigen::MatrixXf c(kN, kN);
    const int threads = Eigen::nbThreads();
    Eigen::setNbThreads(1);
    const auto t0 = std::chrono::steady_clock::now();
    const auto until = t0 + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                std::chrono::duration<double>(seconds));
    int64_t products = 0;
    auto now = t0;
    do {
      c.noalias() = a * b;
      a(0, 0) = c(kN - 1, kN - 1) * 1e-9f;  // keep the products observable.
      ++products;
      now = std::chrono::steady_clock::now();
    } while (now < until);
    Eigen::setNbThreads(threads);
    const double elapsed = std::chrono::duration<double>(now - t0).count();
    const double flops = 2.0 * kN * kN * kN * static_cast<double>(products);
    return std::max(1e-3, flops / std::max(elapsed, 1e-9) / 1e9);
  }
};

}  // namespace
}  // namespace pipetrain::math

// The level's entry: its Kernels, constructed on first use and never destroyed.
extern "C" const pipetrain::math::Kernels* PIPETRAIN_ISA_VARIANT_ENTRY() {
  static const pipetrain::math::Kernels* const kernels = new pipetrain::math::VariantKernels();
  return kernels;
}
