#include "common/math/loss.h"

#include <cassert>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/math/det_math.h"

namespace pipetrain::math {
namespace {

absl::Status CheckColumns(absl::string_view kind, ConstMatrixMap targets, int64_t want) {
  if (targets.cols() != want) {
    return absl::InvalidArgumentError(
        absl::StrCat(kind, " targets must have ", want, " column(s), got ", targets.cols()));
  }
  return absl::OkStatus();
}

class SoftmaxCrossEntropy final : public Loss {
 public:
  absl::string_view kind() const override { return "softmax_cross_entropy"; }
  int64_t target_features(int64_t pred_features) const override { return 1; }

  absl::Status CheckTargets(ConstMatrixMap targets, int64_t pred_features) const override {
    if (absl::Status s = CheckColumns(kind(), targets, 1); !s.ok()) return s;
    for (int64_t r = 0; r < targets.rows(); ++r) {
      const float t = targets(r, 0);
      if (!std::isfinite(t)) {
        return absl::InvalidArgumentError(
            absl::StrCat("target row ", r, ": class label ", t, " is not finite"));
      }
      if (t != std::floor(t)) {
        return absl::InvalidArgumentError(
            absl::StrCat("target row ", r, ": class label ", t, " is not an integer"));
      }
      if (t < 0 || t >= static_cast<float>(pred_features)) {
        return absl::InvalidArgumentError(absl::StrCat("target row ", r, ": class label ", t,
                                                       " out of range [0, ", pred_features, ")"));
      }
    }
    return absl::OkStatus();
  }

  double LossAndGrad(ConstMatrixMap pred, ConstMatrixMap targets, double scale,
                     MatrixMap dpred) const override {
    assert(targets.rows() == pred.rows() && targets.cols() == 1);
    const bool grad = dpred.rows() != 0;
    assert(!grad || (dpred.rows() == pred.rows() && dpred.cols() == pred.cols()));
    const int64_t c = pred.cols();
    double total = 0;
    for (int64_t r = 0; r < pred.rows(); ++r) {
      const float* p = pred.data() + r * c;
      const int64_t y = static_cast<int64_t>(targets(r, 0));
      float mx = p[0];
      for (int64_t j = 1; j < c; ++j) mx = p[j] > mx ? p[j] : mx;
      double sum = 0;
      for (int64_t j = 0; j < c; ++j) sum += PortableExp(static_cast<double>(p[j]) - mx);
      const double log_z = mx + PortableLog(sum);
      total += log_z - p[y];
      if (grad) {
        float* g = dpred.data() + r * c;
        for (int64_t j = 0; j < c; ++j) {
          const double prob = PortableExp(static_cast<double>(p[j]) - log_z);
          g[j] = static_cast<float>(scale * (j == y ? prob - 1.0 : prob));
        }
      }
    }
    return scale * total;
  }

  int64_t CountCorrect(ConstMatrixMap pred, ConstMatrixMap targets) const override {
    int64_t correct = 0;
    for (int64_t r = 0; r < pred.rows(); ++r) {
      int64_t best = 0;
      for (int64_t j = 1; j < pred.cols(); ++j) {
        if (pred(r, j) > pred(r, best)) best = j;
      }
      if (best == static_cast<int64_t>(targets(r, 0))) ++correct;
    }
    return correct;
  }

  double Flops(int64_t rows, int64_t pred_features) const override {
    // max 1, exp ~4 + sum 1 (twice: loss and gradient), subtract/scale 2.
    return 13.0 * static_cast<double>(rows) * static_cast<double>(pred_features);
  }
};

class Mse final : public Loss {
 public:
  absl::string_view kind() const override { return "mse"; }
  int64_t target_features(int64_t pred_features) const override { return pred_features; }

  absl::Status CheckTargets(ConstMatrixMap targets, int64_t pred_features) const override {
    if (absl::Status s = CheckColumns(kind(), targets, pred_features); !s.ok()) return s;
    for (int64_t r = 0; r < targets.rows(); ++r) {
      for (int64_t j = 0; j < targets.cols(); ++j) {
        if (!std::isfinite(targets(r, j))) {
          return absl::InvalidArgumentError(absl::StrCat(
              "target row ", r, " column ", j, ": value ", targets(r, j), " is not finite"));
        }
      }
    }
    return absl::OkStatus();
  }

  double LossAndGrad(ConstMatrixMap pred, ConstMatrixMap targets, double scale,
                     MatrixMap dpred) const override {
    assert(targets.rows() == pred.rows() && targets.cols() == pred.cols());
    const bool grad = dpred.rows() != 0;
    assert(!grad || (dpred.rows() == pred.rows() && dpred.cols() == pred.cols()));
    const int64_t f = pred.cols();
    const double inv_f = f > 0 ? 1.0 / static_cast<double>(f) : 0.0;
    const double gscale = 2.0 * scale * inv_f;
    double total = 0;
    for (int64_t r = 0; r < pred.rows(); ++r) {
      const float* p = pred.data() + r * f;
      const float* t = targets.data() + r * f;
      double sq = 0;
      for (int64_t j = 0; j < f; ++j) {
        const double e = static_cast<double>(p[j]) - t[j];
        sq += e * e;
      }
      total += sq * inv_f;
      if (grad) {
        float* g = dpred.data() + r * f;
        for (int64_t j = 0; j < f; ++j) {
          g[j] = static_cast<float>(gscale * (static_cast<double>(p[j]) - t[j]));
        }
      }
    }
    return scale * total;
  }

  int64_t CountCorrect(ConstMatrixMap pred, ConstMatrixMap targets) const override { return 0; }

  double Flops(int64_t rows, int64_t pred_features) const override {
    return 5.0 * static_cast<double>(rows) * static_cast<double>(pred_features);
  }
};

}  // namespace

std::unique_ptr<Loss> MakeSoftmaxCrossEntropy() { return std::make_unique<SoftmaxCrossEntropy>(); }
std::unique_ptr<Loss> MakeMse() { return std::make_unique<Mse>(); }

}  // namespace pipetrain::math
