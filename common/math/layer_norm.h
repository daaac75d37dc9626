// Layer normalisation over the features of each row, with a learned scale and shift.
#ifndef PIPETRAIN_COMMON_MATH_LAYER_NORM_H_
#define PIPETRAIN_COMMON_MATH_LAYER_NORM_H_

#include <cstdint>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/math/layer.h"
#include "common/math/tensor.h"

namespace pipetrain::math {

// Helpers shared by LayerNorm and TransformerBlock. Shapes: x, y, dy, dx [r, f]; gamma, beta,
// ggamma, gbeta: f floats; mean, rstd: r floats. Per row (sums in double, in increasing feature
// order; results rounded to float):
//   mean = sum_j x_j / f,  var = sum_j (x_j - mean)^2 / f (biased),  rstd = 1 / sqrt(var + eps),
//   xhat_j = (x_j - mean) rstd (float),  y_j = xhat_j gamma_j + beta_j.
// xhat is recomputed bit-identically from (x, mean, rstd) wherever it is needed.

// Fills y, mean and rstd. y must not alias x.
void LayerNormForward(ConstMatrixMap x, const float* gamma, const float* beta, float eps,
                      MatrixMap y, float* mean, float* rstd);
// g_j = dy_j gamma_j; dx_j (+)= rstd (g_j - mean_k(g_k) - xhat_j mean_k(g_k xhat_k)).
// With accumulate, adds to dx instead of overwriting it. dx must not alias x or dy.
void LayerNormBackwardInput(ConstMatrixMap x, ConstMatrixMap dy, const float* gamma,
                            const float* mean, const float* rstd, bool accumulate, MatrixMap dx);
// ggamma_j += dy_rj xhat_rj and gbeta_j += dy_rj, rows in increasing order.
void LayerNormBackwardWeight(ConstMatrixMap x, ConstMatrixMap dy, const float* mean,
                             const float* rstd, float* ggamma, float* gbeta);

// Rough FLOPs per element (documented in docs/numerics.md).
inline constexpr double kLayerNormForwardFlopsPerElement = 7;
inline constexpr double kLayerNormBackwardInputFlopsPerElement = 10;
inline constexpr double kLayerNormBackwardWeightFlopsPerElement = 5;

// Params: "weight" (gamma) [f] init 1, "bias" (beta) [f] init 0. Stash: per-row mean and rstd
// (2 r floats). FLOPs for r rows: F = 7 r f, B-input = 10 r f, B-weight = 5 r f.
class LayerNorm final : public Layer {
 public:
  // features > 0, eps > 0.
  LayerNorm(int64_t features, float eps);

  absl::string_view kind() const override { return "layer_norm"; }
  int64_t in_features() const override { return features_; }
  int64_t out_features() const override { return features_; }
  float eps() const { return eps_; }

  std::vector<ParamSpec> params() const override;
  void Init(uint64_t seed, int64_t layer_index, std::vector<Tensor>* params) const override;
  FlopCount Flops(int64_t rows) const override;
  int64_t StashBytes(int64_t rows) const override;

  void Forward(absl::Span<const Tensor> params, ConstMatrixMap x, MatrixMap y,
               Stash* stash) const override;
  void BackwardInput(absl::Span<const Tensor> params, ConstMatrixMap x, ConstMatrixMap dy,
                     Stash* stash, MatrixMap dx) const override;
  void BackwardWeight(absl::Span<const Tensor> params, ConstMatrixMap x, ConstMatrixMap dy,
                      const Stash& stash, absl::Span<Tensor> grads) const override;

 private:
  const int64_t features_;
  const float eps_;
};

}  // namespace pipetrain::math

#endif  // PIPETRAIN_COMMON_MATH_LAYER_NORM_H_
