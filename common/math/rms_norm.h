// Root-mean-square normalisation over the features of each row, with a learned scale and no
// shift (LLaMA's RMSNorm).
#ifndef PIPETRAIN_COMMON_MATH_RMS_NORM_H_
#define PIPETRAIN_COMMON_MATH_RMS_NORM_H_

#include <cstdint>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/math/layer.h"
#include "common/math/tensor.h"

namespace pipetrain::math {

// Helpers shared by RmsNorm and LlamaBlock. Shapes: x, y, dy, dx [r, f]; gamma, ggamma: f floats;
// rstd: r floats. Per row (the sum in double, in increasing feature order; rstd rounded to float):
//   rstd = 1 / sqrt(sum_j x_j^2 / f + eps),  xhat_j = x_j rstd (float),  y_j = xhat_j gamma_j.
// xhat is recomputed bit-identically from (x, rstd) wherever it is needed.

// Fills y and rstd. y must not alias x.
void RmsNormForward(ConstMatrixMap x, const float* gamma, float eps, MatrixMap y, float* rstd);
// g_j = dy_j gamma_j; dx_j (+)= rstd (g_j - xhat_j mean_k(g_k xhat_k)) (the mean in double, in
// increasing k). With accumulate, adds to dx instead of overwriting it. dx must not alias x or dy.
void RmsNormBackwardInput(ConstMatrixMap x, ConstMatrixMap dy, const float* gamma,
                          const float* rstd, bool accumulate, MatrixMap dx);
// ggamma_j += dy_rj xhat_rj, rows in increasing order.
void RmsNormBackwardWeight(ConstMatrixMap x, ConstMatrixMap dy, const float* rstd, float* ggamma);

// Rough FLOPs per element (documented in docs/numerics.md).
inline constexpr double kRmsNormForwardFlopsPerElement = 4;
inline constexpr double kRmsNormBackwardInputFlopsPerElement = 7;
inline constexpr double kRmsNormBackwardWeightFlopsPerElement = 3;

// Params: "weight" (gamma) [f], init 1. Stash: per-row rstd (r floats).
// FLOPs for r rows: F = 4 r f, B-input = 7 r f, B-weight = 3 r f.
class RmsNorm final : public Layer {
 public:
  // features > 0, eps > 0.
  RmsNorm(int64_t features, float eps);

  absl::string_view kind() const override { return "rms_norm"; }
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

#endif  // PIPETRAIN_COMMON_MATH_RMS_NORM_H_
