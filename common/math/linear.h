// Fully connected layer y = x W^T + b, plus the GEMM helpers every layer with a linear map reuses.
#ifndef PIPETRAIN_COMMON_MATH_LINEAR_H_
#define PIPETRAIN_COMMON_MATH_LINEAR_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/math/layer.h"
#include "common/math/tensor.h"

namespace pipetrain::math {

class PackedWeight;  // packed_gemm.h

// Helpers shared by Linear and TransformerBlock. Shapes: x [r, in], w [out, in] (PyTorch layout),
// b / gb: `out` floats (nullptr: no bias), y / dy [r, out], dx [r, in]. Outputs must not alias
// inputs. Deterministic for a given Eigen thread count and CPU-cache configuration (the GEMM
// blocking), independent of the buffers' addresses.

// `packed`: W's packing for that product, kept between calls (packed_gemm.h), or null.

// y = x W^T (+ b).
void LinearForward(ConstMatrixMap x, ConstMatrixMap w, const float* b, MatrixMap y,
                   PackedWeight* packed = nullptr);
// dx = dy W.
void LinearBackwardInput(ConstMatrixMap dy, ConstMatrixMap w, MatrixMap dx,
                         PackedWeight* packed = nullptr);
// gw += dy^T x (one GEMM accumulating into gw); gb += column sums of dy if gb != nullptr.
void LinearBackwardWeight(ConstMatrixMap x, ConstMatrixMap dy, MatrixMap gw, float* gb);
// LinearBackwardWeight of each (x, dy) of `inputs` in turn, bitwise, in fewer passes over gw
// where the micro-batches share a shape (packed_gemm.h, AccumulateDyTx).
void LinearBackwardWeightMany(absl::Span<const WeightGradInputs> inputs, MatrixMap gw, float* gb);
// gw = gw + N_w, gb = gb + N_b (if gb != nullptr) for N the node of the canonical accumulation
// tree over `inputs` (Layer::BackwardWeightNode): true; false, having changed nothing, where the
// weight's product cannot run block by block (packed_gemm.h, AccumulateDyTxNode).
bool LinearBackwardWeightNode(absl::Span<const WeightGradInputs> inputs, int64_t leaf_size,
                              MatrixMap gw, float* gb);
// g[j] += dy(r, j) for r = 0, 1, ..., rows-1 in that order (a fixed summation order per column).
void AccumulateColumnSums(ConstMatrixMap dy, float* g);

// FLOPs of the helpers for r rows (multiply-add = 2): GEMM 2 r in out, bias r out.
double LinearGemmFlops(int64_t rows, int64_t in, int64_t out);

// Params: "weight" [out, in], "bias" [out] (if bias), both initialised U(-1/sqrt(in), 1/sqrt(in))
// (PyTorch's default). Stash: empty (BackwardWeight reads x, which the caller keeps).
// FLOPs for r rows: F = 2 r in out (+ r out with bias), B-input = 2 r in out,
// B-weight = 2 r in out (+ r out with bias).
class Linear final : public Layer {
 public:
  // in_features, out_features > 0.
  Linear(int64_t in_features, int64_t out_features, bool bias);

  absl::string_view kind() const override { return "linear"; }
  int64_t in_features() const override { return in_; }
  int64_t out_features() const override { return out_; }
  bool has_bias() const { return bias_; }

  std::vector<ParamSpec> params() const override;
  void Init(uint64_t seed, int64_t layer_index, std::vector<Tensor>* params) const override;
  FlopCount Flops(int64_t rows) const override;
  int64_t StashBytes(int64_t rows) const override { return 0; }

  void Forward(absl::Span<const Tensor> params, ConstMatrixMap x, MatrixMap y,
               Stash* stash) const override;
  void BackwardInput(absl::Span<const Tensor> params, ConstMatrixMap x, ConstMatrixMap dy,
                     Stash* stash, MatrixMap dx) const override;
  void BackwardWeight(absl::Span<const Tensor> params, ConstMatrixMap x, ConstMatrixMap dy,
                      const Stash& stash, absl::Span<Tensor> grads) const override;
  void BackwardWeightMany(absl::Span<const Tensor> params,
                          absl::Span<const WeightGradInputs> inputs,
                          absl::Span<Tensor> grads) const override;
  bool BackwardWeightNode(absl::Span<const Tensor> params,
                          absl::Span<const WeightGradInputs> inputs, int64_t leaf_size,
                          absl::Span<Tensor> grads) const override;

  // Keeps the weight packed for the forward and the input-gradient products (packed_gemm.h):
  // about twice the weight's bytes, built on first use after each change of the weight.
  std::unique_ptr<ParamCache> NewParamCache() const override;
  void ForwardCached(absl::Span<const Tensor> params, ParamCache* cache, ConstMatrixMap x,
                     MatrixMap y, Stash* stash) const override;
  void BackwardInputCached(absl::Span<const Tensor> params, ParamCache* cache, ConstMatrixMap x,
                           ConstMatrixMap dy, Stash* stash, MatrixMap dx) const override;

 private:
  const int64_t in_;
  const int64_t out_;
  const bool bias_;
};

}  // namespace pipetrain::math

#endif  // PIPETRAIN_COMMON_MATH_LINEAR_H_
