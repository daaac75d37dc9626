// Parameter-free elementwise activations: ReLU and GELU (tanh approximation, as GPT-2).
#ifndef PIPETRAIN_COMMON_MATH_ACTIVATIONS_H_
#define PIPETRAIN_COMMON_MATH_ACTIVATIONS_H_

#include <cstdint>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/math/layer.h"
#include "common/math/tensor.h"

namespace pipetrain::math {

// GELU, tanh approximation: gelu(x) = 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3),
// evaluated in double as the identical x / (1 + exp(-2u)) with PortableExp, rounded to float
// (bitwise portable).
float GeluScalar(float x);
// d gelu(x) / dx of the same formula, evaluated in double and rounded to float.
float GeluGradScalar(float x);

// Elementwise helpers over n contiguous floats. `out` may alias `dy` (in-place), not `x`.
void ReluForward(const float* x, int64_t n, float* y);                     // y = max(x, 0)
void ReluBackward(const float* x, const float* dy, int64_t n, float* dx);  // dx = dy [x > 0]
void GeluForward(const float* x, int64_t n, float* y);                     // y = gelu(x)
void GeluBackward(const float* x, const float* dy, int64_t n, float* dx);  // dx = dy gelu'(x)

// Rough FLOPs per element used in Flops() (documented in docs/numerics.md): exp counted as 4.
inline constexpr double kReluFlopsPerElement = 1;
inline constexpr double kGeluForwardFlopsPerElement = 10;
inline constexpr double kGeluBackwardFlopsPerElement = 16;

// y = max(x, 0); dx = dy where x > 0, else 0 (the subgradient at 0 is 0). No params, empty stash
// (backward reads x). FLOPs for r rows of f features: F = r f, B-input = r f, B-weight = 0.
class Relu final : public Layer {
 public:
  explicit Relu(int64_t features) : features_(features) {}

  absl::string_view kind() const override { return "relu"; }
  int64_t in_features() const override { return features_; }
  int64_t out_features() const override { return features_; }
  std::vector<ParamSpec> params() const override { return {}; }
  void Init(uint64_t seed, int64_t layer_index, std::vector<Tensor>* params) const override;
  FlopCount Flops(int64_t rows) const override;
  int64_t StashBytes(int64_t rows) const override { return 0; }

  void Forward(absl::Span<const Tensor> params, ConstMatrixMap x, MatrixMap y,
               Stash* stash) const override;
  void BackwardInput(absl::Span<const Tensor> params, ConstMatrixMap x, ConstMatrixMap dy,
                     Stash* stash, MatrixMap dx) const override;
  void BackwardWeight(absl::Span<const Tensor> params, ConstMatrixMap x, ConstMatrixMap dy,
                      const Stash& stash, absl::Span<Tensor> grads) const override {}

 private:
  const int64_t features_;
};

// y = gelu(x) (tanh approximation). No params, empty stash (backward recomputes from x).
// FLOPs for r rows of f features: F = 10 r f, B-input = 16 r f, B-weight = 0.
class Gelu final : public Layer {
 public:
  explicit Gelu(int64_t features) : features_(features) {}

  absl::string_view kind() const override { return "gelu"; }
  int64_t in_features() const override { return features_; }
  int64_t out_features() const override { return features_; }
  std::vector<ParamSpec> params() const override { return {}; }
  void Init(uint64_t seed, int64_t layer_index, std::vector<Tensor>* params) const override;
  FlopCount Flops(int64_t rows) const override;
  int64_t StashBytes(int64_t rows) const override { return 0; }

  void Forward(absl::Span<const Tensor> params, ConstMatrixMap x, MatrixMap y,
               Stash* stash) const override;
  void BackwardInput(absl::Span<const Tensor> params, ConstMatrixMap x, ConstMatrixMap dy,
                     Stash* stash, MatrixMap dx) const override;
  void BackwardWeight(absl::Span<const Tensor> params, ConstMatrixMap x, ConstMatrixMap dy,
                      const Stash& stash, absl::Span<Tensor> grads) const override {}

 private:
  const int64_t features_;
};

}  // namespace pipetrain::math

#endif  // PIPETRAIN_COMMON_MATH_ACTIVATIONS_H_
