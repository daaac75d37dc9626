#include "common/math/rms_norm.h"

#include <cassert>
#include <cmath>

#include "common/math/init.h"

namespace pipetrain::math {
namespace {

// The normalised input; every caller uses this one expression so F, B-input and B-weight agree
// bit for bit.
inline float Xhat(float x, float rstd) { return x * rstd; }

}  // namespace

void RmsNormForward(ConstMatrixMap x, const float* gamma, float eps, MatrixMap y, float* rstd) {
  assert(y.rows() == x.rows() && y.cols() == x.cols());
  const int64_t f = x.cols();
  const double inv_f = 1.0 / static_cast<double>(f);
  for (int64_t r = 0; r < x.rows(); ++r) {
    const float* xr = x.data() + r * f;
    float* yr = y.data() + r * f;
    double sq = 0;
    for (int64_t j = 0; j < f; ++j) sq += static_cast<double>(xr[j]) * xr[j];
    const float rf = static_cast<float>(1.0 / std::sqrt(sq * inv_f + static_cast<double>(eps)));
    rstd[r] = rf;
    for (int64_t j = 0; j < f; ++j) yr[j] = Xhat(xr[j], rf) * gamma[j];
  }
}

void RmsNormBackwardInput(ConstMatrixMap x, ConstMatrixMap dy, const float* gamma,
                          const float* rstd, bool accumulate, MatrixMap dx) {
  assert(dy.rows() == x.rows() && dx.rows() == x.rows() && dx.cols() == x.cols());
  const int64_t f = x.cols();
  const double inv_f = 1.0 / static_cast<double>(f);
  for (int64_t r = 0; r < x.rows(); ++r) {
    const float* xr = x.data() + r * f;
    const float* dyr = dy.data() + r * f;
    float* dxr = dx.data() + r * f;
    const float rf = rstd[r];
    double sum_gx = 0;
    for (int64_t j = 0; j < f; ++j) {
      const float g = dyr[j] * gamma[j];
      sum_gx += static_cast<double>(g) * static_cast<double>(Xhat(xr[j], rf));
    }
    const double b = sum_gx * inv_f;
    const double rd = rf;
    for (int64_t j = 0; j < f; ++j) {
      const double g = dyr[j] * gamma[j];
      const double xh = Xhat(xr[j], rf);
      const float v = static_cast<float>(rd * (g - xh * b));
      dxr[j] = accumulate ? dxr[j] + v : v;
    }
  }
}

void RmsNormBackwardWeight(ConstMatrixMap x, ConstMatrixMap dy, const float* rstd, float* ggamma) {
  assert(dy.rows() == x.rows() && dy.cols() == x.cols());
  const int64_t f = x.cols();
  for (int64_t r = 0; r < x.rows(); ++r) {
    const float* xr = x.data() + r * f;
    const float* dyr = dy.data() + r * f;
    const float rf = rstd[r];
    for (int64_t j = 0; j < f; ++j) ggamma[j] += dyr[j] * Xhat(xr[j], rf);
  }
}

RmsNorm::RmsNorm(int64_t features, float eps) : features_(features), eps_(eps) {
  assert(features_ > 0 && eps_ > 0);
}

std::vector<ParamSpec> RmsNorm::params() const { return {{"weight", {features_}}}; }

void RmsNorm::Init(uint64_t seed, int64_t layer_index, std::vector<Tensor>* params) const {
  AllocateParams(this->params(), params);
  FillConstant(1.0f, &(*params)[0]);
}

FlopCount RmsNorm::Flops(int64_t rows) const {
  const double n = static_cast<double>(rows) * static_cast<double>(features_);
  return {kRmsNormForwardFlopsPerElement * n, kRmsNormBackwardInputFlopsPerElement * n,
          kRmsNormBackwardWeightFlopsPerElement * n};
}

int64_t RmsNorm::StashBytes(int64_t rows) const {
  return rows * static_cast<int64_t>(sizeof(float));
}

void RmsNorm::Forward(absl::Span<const Tensor> params, ConstMatrixMap x, MatrixMap y,
                      Stash* stash) const {
  const size_t n = static_cast<size_t>(x.rows());
  if (stash->data.size() != n) stash->data.resize(n);
  RmsNormForward(x, params[0].data.data(), eps_, y, stash->data.data());
}

void RmsNorm::BackwardInput(absl::Span<const Tensor> params, ConstMatrixMap x, ConstMatrixMap dy,
                            Stash* stash, MatrixMap dx) const {
  if (dx.rows() == 0) return;
  RmsNormBackwardInput(x, dy, params[0].data.data(), stash->data.data(), /*accumulate=*/false, dx);
}

void RmsNorm::BackwardWeight(absl::Span<const Tensor> params, ConstMatrixMap x, ConstMatrixMap dy,
                             const Stash& stash, absl::Span<Tensor> grads) const {
  RmsNormBackwardWeight(x, dy, stash.data.data(), grads[0].data.data());
}

}  // namespace pipetrain::math
