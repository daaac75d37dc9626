// Losses on the last stage's output: softmax cross-entropy and mean squared error.
#ifndef PIPETRAIN_COMMON_MATH_LOSS_H_
#define PIPETRAIN_COMMON_MATH_LOSS_H_

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "common/math/tensor.h"

namespace pipetrain::math {

// A per-row loss summed over rows. Implementations are stateless, deterministic and thread-safe.
// pred [r, pred_features]; targets [r, target_features(pred_features)].
class Loss {
 public:
  virtual ~Loss() = default;

  // Short name used in messages: "softmax_cross_entropy" or "mse".
  virtual absl::string_view kind() const = 0;

  // Columns of the targets for predictions with `pred_features` columns.
  virtual int64_t target_features(int64_t pred_features) const = 0;

  // OK iff `targets` has target_features(pred_features) columns and every value is valid for this
  // loss; otherwise INVALID_ARGUMENT naming the first offending row and value.
  virtual absl::Status CheckTargets(ConstMatrixMap targets, int64_t pred_features) const = 0;

  // Returns scale * sum_r loss_r, the per-row losses computed and summed in double in increasing
  // row order, and writes dpred = d(that value)/d(pred), rounded to float. With scale = 1/B (B the
  // rows of the whole batch) each micro-batch's gradient already carries the 1/B of the batch
  // mean. dpred is [r, pred_features], or has zero rows to skip the gradient (evaluation).
  // Targets must have passed CheckTargets. dpred must not alias pred.
  virtual double LossAndGrad(ConstMatrixMap pred, ConstMatrixMap targets, double scale,
                             MatrixMap dpred) const = 0;

  // Rows whose prediction is right (classification: the first index of the row maximum equals the
  // label); 0 for losses without a notion of accuracy.
  virtual int64_t CountCorrect(ConstMatrixMap pred, ConstMatrixMap targets) const = 0;

  // Approximate FLOPs of LossAndGrad for `rows` rows (documented in docs/numerics.md).
  virtual double Flops(int64_t rows, int64_t pred_features) const = 0;
};

// Softmax cross-entropy with one integer class per row, given as a float in targets[r, 0]:
//   loss_r = logsumexp_j(pred_rj) - pred_r,y   (stable: max-shifted, exp/log from det_math.h),
//   dpred_rj = scale (softmax_rj - [j == y]).
std::unique_ptr<Loss> MakeSoftmaxCrossEntropy();

// Mean squared error: loss_r = (1/F) sum_j (pred_rj - t_rj)^2, dpred_rj = scale 2 (p - t) / F.
// With scale = 1/B the total is the mean over rows and features.
std::unique_ptr<Loss> MakeMse();

}  // namespace pipetrain::math

#endif  // PIPETRAIN_COMMON_MATH_LOSS_H_
