#include "common/math/activations.h"

#include "common/math/det_math.h"

namespace pipetrain::math {
namespace {

constexpr double kSqrt2OverPi = 0.79788456080286535588;  // sqrt(2 / pi)
constexpr double kGeluCubic = 0.044715;

}  // namespace

// 0.5 x (1 + tanh(u)) = x sigmoid(2u): one exp, no cancellation for negative x.
float GeluScalar(float x) {
  const double xd = x;
  const double u = kSqrt2OverPi * (xd + kGeluCubic * xd * xd * xd);
  return static_cast<float>(xd / (1.0 + PortableExp(-2.0 * u)));
}

// d/dx [x s(2u)] = s + x s (1 - s) 2 u', s = sigmoid(2u), u' = sqrt(2/pi) (1 + 3 0.044715 x^2).
float GeluGradScalar(float x) {
  const double xd = x;
  const double x2 = xd * xd;
  const double u = kSqrt2OverPi * (xd + kGeluCubic * x2 * xd);
  const double s = 1.0 / (1.0 + PortableExp(-2.0 * u));
  const double du = kSqrt2OverPi * (1.0 + 3.0 * kGeluCubic * x2);
  return static_cast<float>(s + xd * s * (1.0 - s) * 2.0 * du);
}

void ReluForward(const float* x, int64_t n, float* y) {
  // NaN propagates (NaN < 0 is false) so a diverged input stays visible downstream.
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] < 0.0f ? 0.0f : x[i];
}

void ReluBackward(const float* x, const float* dy, int64_t n, float* dx) {
  for (int64_t i = 0; i < n; ++i) dx[i] = x[i] > 0.0f ? dy[i] : 0.0f;
}

void GeluForward(const float* x, int64_t n, float* y) {
  for (int64_t i = 0; i < n; ++i) y[i] = GeluScalar(x[i]);
}

void GeluBackward(const float* x, const float* dy, int64_t n, float* dx) {
  for (int64_t i = 0; i < n; ++i) dx[i] = dy[i] * GeluGradScalar(x[i]);
}

void Relu::Init(uint64_t seed, int64_t layer_index, std::vector<Tensor>* params) const {
  params->clear();
}

FlopCount Relu::Flops(int64_t rows) const {
  const double n = static_cast<double>(rows) * static_cast<double>(features_);
  return {kReluFlopsPerElement * n, kReluFlopsPerElement * n, 0.0};
}

void Relu::Forward(absl::Span<const Tensor> params, ConstMatrixMap x, MatrixMap y,
                   Stash* stash) const {
  stash->data.clear();
  ReluForward(x.data(), x.size(), y.data());
}

void Relu::BackwardInput(absl::Span<const Tensor> params, ConstMatrixMap x, ConstMatrixMap dy,
                         Stash* stash, MatrixMap dx) const {
  if (dx.rows() == 0) return;
  ReluBackward(x.data(), dy.data(), x.size(), dx.data());
}

void Gelu::Init(uint64_t seed, int64_t layer_index, std::vector<Tensor>* params) const {
  params->clear();
}

FlopCount Gelu::Flops(int64_t rows) const {
  const double n = static_cast<double>(rows) * static_cast<double>(features_);
  return {kGeluForwardFlopsPerElement * n, kGeluBackwardFlopsPerElement * n, 0.0};
}

void Gelu::Forward(absl::Span<const Tensor> params, ConstMatrixMap x, MatrixMap y,
                   Stash* stash) const {
  stash->data.clear();
  GeluForward(x.data(), x.size(), y.data());
}

void Gelu::BackwardInput(absl::Span<const Tensor> params, ConstMatrixMap x, ConstMatrixMap dy,
                         Stash* stash, MatrixMap dx) const {
  if (dx.rows() == 0) return;
  GeluBackward(x.data(), dy.data(), x.size(), dx.data());
}

}  // namespace pipetrain::math
