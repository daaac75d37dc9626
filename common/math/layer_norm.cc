#include "common/math/layer_norm.h"

#include <cassert>
#include <cmath>

#include "common/math/init.h"

namespace pipetrain::math {
namespace {

// The normalised input; every caller uses this one expression so F, B-input and B-weight agree
// bit for bit.
inline float Xhat(float x, float mean, float rstd) { return (x - mean) * rstd; }

}  // namespace

void LayerNormForward(ConstMatrixMap x, const float* gamma, const float* beta, float eps,
                      MatrixMap y, float* mean, float* rstd) {
  assert(y.rows() == x.rows() && y.cols() == x.cols());
  const int64_t f = x.cols();
  const double inv_f = 1.0 / static_cast<double>(f);
  for (int64_t r = 0; r < x.rows(); ++r) {
    const float* xr = x.data() + r * f;
    float* yr = y.data() + r * f;
    double sum = 0;
    for (int64_t j = 0; j < f; ++j) sum += xr[j];
    const double m = sum * inv_f;
    double sq = 0;
    for (int64_t j = 0; j < f; ++j) {
      const double d = xr[j] - m;
      sq += d * d;
    }
    const float mf = static_cast<float>(m);
    const float rf = static_cast<float>(1.0 / std::sqrt(sq * inv_f + static_cast<double>(eps)));
    mean[r] = mf;
    rstd[r] = rf;
    for (int64_t j = 0; j < f; ++j) yr[j] = Xhat(xr[j], mf, rf) * gamma[j] + beta[j];
  }
}

void LayerNormBackwardInput(ConstMatrixMap x, ConstMatrixMap dy, const float* gamma,
                            const float* mean, const float* rstd, bool accumulate, MatrixMap dx) {
  assert(dy.rows() == x.rows() && dx.rows() == x.rows() && dx.cols() == x.cols());
  const int64_t f = x.cols();
  const double inv_f = 1.0 / static_cast<double>(f);
  for (int64_t r = 0; r < x.rows(); ++r) {
    const float* xr = x.data() + r * f;
    const float* dyr = dy.data() + r * f;
    float* dxr = dx.data() + r * f;
    const float mf = mean[r];
    const float rf = rstd[r];
    double sum_g = 0;
    double sum_gx = 0;
    for (int64_t j = 0; j < f; ++j) {
      const float g = dyr[j] * gamma[j];
      sum_g += g;
      sum_gx += static_cast<double>(g) * static_cast<double>(Xhat(xr[j], mf, rf));
    }
    const double a = sum_g * inv_f;
    const double b = sum_gx * inv_f;
    const double rd = rf;
    for (int64_t j = 0; j < f; ++j) {
      const double g = dyr[j] * gamma[j];
      const double xh = Xhat(xr[j], mf, rf);
      const float v = static_cast<float>(rd * (g - a - xh * b));
      dxr[j] = accumulate ? dxr[j] + v : v;
    }
  }
}

void LayerNormBackwardWeight(ConstMatrixMap x, ConstMatrixMap dy, const float* mean,
                             const float* rstd, float* ggamma, float* gbeta) {
  assert(dy.rows() == x.rows() && dy.cols() == x.cols());
  const int64_t f = x.cols();
  for (int64_t r = 0; r < x.rows(); ++r) {
    const float* xr = x.data() + r * f;
    const float* dyr = dy.data() + r * f;
    const float mf = mean[r];
    const float rf = rstd[r];
    for (int64_t j = 0; j < f; ++j) {
      ggamma[j] += dyr[j] * Xhat(xr[j], mf, rf);
      gbeta[j] += dyr[j];
    }
  }
}

LayerNorm::LayerNorm(int64_t features, float eps) : features_(features), eps_(eps) {
  assert(features_ > 0 && eps_ > 0);
}

std::vector<ParamSpec> LayerNorm::params() const {
  return {{"weight", {features_}}, {"bias", {features_}}};
}

void LayerNorm::Init(uint64_t seed, int64_t layer_index, std::vector<Tensor>* params) const {
  AllocateParams(this->params(), params);
  FillConstant(1.0f, &(*params)[0]);
  FillConstant(0.0f, &(*params)[1]);
}

FlopCount LayerNorm::Flops(int64_t rows) const {
  const double n = static_cast<double>(rows) * static_cast<double>(features_);
  return {kLayerNormForwardFlopsPerElement * n, kLayerNormBackwardInputFlopsPerElement * n,
          kLayerNormBackwardWeightFlopsPerElement * n};
}

int64_t LayerNorm::StashBytes(int64_t rows) const {
  return 2 * rows * static_cast<int64_t>(sizeof(float));
}

void LayerNorm::Forward(absl::Span<const Tensor> params, ConstMatrixMap x, MatrixMap y,
                        Stash* stash) const {
  const size_t n = static_cast<size_t>(2 * x.rows());
  if (stash->data.size() != n) stash->data.resize(n);
  float* mean = stash->data.data();
  LayerNormForward(x, params[0].data.data(), params[1].data.data(), eps_, y, mean, mean + x.rows());
}

void LayerNorm::BackwardInput(absl::Span<const Tensor> params, ConstMatrixMap x, ConstMatrixMap dy,
                              Stash* stash, MatrixMap dx) const {
  if (dx.rows() == 0) return;
  const float* mean = stash->data.data();
  LayerNormBackwardInput(x, dy, params[0].data.data(), mean, mean + x.rows(),
                         /*accumulate=*/false, dx);
}

void LayerNorm::BackwardWeight(absl::Span<const Tensor> params, ConstMatrixMap x, ConstMatrixMap dy,
                               const Stash& stash, absl::Span<Tensor> grads) const {
  const float* mean = stash.data.data();
  LayerNormBackwardWeight(x, dy, mean, mean + x.rows(), grads[0].data.data(), grads[1].data.data());
}

}  // namespace pipetrain::math
