#include "common/math/activations.h"

#include <algorithm>

#include "common/math/det_math.h"

namespace pipetrain::math {
namespace {

constexpr double kSqrt2OverPi = 0.79788456080286535588;  // sqrt(2 / pi)
constexpr double kGeluCubic = 0.044715;
// Elements per chunk of the GELU passes: their exponentials go through PortableExpFloatArray from
// a buffer of this many floats on the stack.
constexpr int64_t kGeluChunk = 256;

// -2u of GeluScalar, and of GeluGradScalar (whose x^3 is rounded in another order): in double,
// rounded to float (the argument of the float exponential).
float GeluExpArg(double xd) {
  return static_cast<float>(-2.0 * (kSqrt2OverPi * (xd + kGeluCubic * xd * xd * xd)));
}
float GeluGradExpArg(double xd) {
  const double x2 = xd * xd;
  return static_cast<float>(-2.0 * (kSqrt2OverPi * (xd + kGeluCubic * x2 * xd)));
}

// GeluGradScalar given e = PortableExpFloat(GeluGradExpArg(x)).
float GeluGradFromExp(float x, double e) {
  const double xd = x;
  const double x2 = xd * xd;
  const double s = 1.0 / (1.0 + e);
  const double du = kSqrt2OverPi * (1.0 + 3.0 * kGeluCubic * x2);
  return static_cast<float>(s + xd * s * (1.0 - s) * 2.0 * du);
}

}  // namespace

// 0.5 x (1 + tanh(u)) = x sigmoid(2u): one exp, no cancellation for negative x.
float GeluScalar(float x) {
  const double xd = x;
  return static_cast<float>(xd / (1.0 + PortableExpFloat(GeluExpArg(xd))));
}

// d/dx [x s(2u)] = s + x s (1 - s) 2 u', s = sigmoid(2u), u' = sqrt(2/pi) (1 + 3 0.044715 x^2).
float GeluGradScalar(float x) { return GeluGradFromExp(x, PortableExpFloat(GeluGradExpArg(x))); }

void ReluForward(const float* x, int64_t n, float* y) {
  // NaN propagates (NaN < 0 is false) so a diverged input stays visible downstream.
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] < 0.0f ? 0.0f : x[i];
}

void ReluBackward(const float* x, const float* dy, int64_t n, float* dx) {
  for (int64_t i = 0; i < n; ++i) dx[i] = x[i] > 0.0f ? dy[i] : 0.0f;
}

// Bitwise GeluScalar per element; the exponentials a chunk at a time through
// PortableExpFloatArray.
void GeluForward(const float* x, int64_t n, float* y) {
  float e[kGeluChunk];
  for (int64_t start = 0; start < n; start += kGeluChunk) {
    const int64_t len = std::min(kGeluChunk, n - start);
    for (int64_t i = 0; i < len; ++i) e[i] = GeluExpArg(x[start + i]);
    PortableExpFloatArray(e, len, e);
    for (int64_t i = 0; i < len; ++i) {
      y[start + i] = static_cast<float>(static_cast<double>(x[start + i]) / (1.0 + e[i]));
    }
  }
}

// Bitwise dy * GeluGradScalar per element, chunked as GeluForward.
void GeluBackward(const float* x, const float* dy, int64_t n, float* dx) {
  float e[kGeluChunk];
  for (int64_t start = 0; start < n; start += kGeluChunk) {
    const int64_t len = std::min(kGeluChunk, n - start);
    for (int64_t i = 0; i < len; ++i) e[i] = GeluGradExpArg(x[start + i]);
    PortableExpFloatArray(e, len, e);
    for (int64_t i = 0; i < len; ++i) {
      dx[start + i] = dy[start + i] * GeluGradFromExp(x[start + i], e[i]);
    }
  }
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
