// The two weight products of a linear map (y = x W^T and dx = dy W) with the weight packed once
// for Eigen's GEMM kernel and reused across calls, instead of repacked by every product.
//
// Eigen's GEMM copies ("packs") both operands into the layout its micro-kernel reads before every
// product. A layer's weight is the large operand of its forward and input-gradient products, and
// with micro-batches of a few dozen rows packing it costs about a third of those products
// (docs/performance.md, "Where a training step goes"). The weight only changes at an optimizer
// step, so it can be packed once per step instead of once per micro-batch.
//
// The results are bitwise those of Eigen's own product expression (`y.noalias() = x *
// w.transpose()`, `dx.noalias() = dy * w`): the same blocking, packing and kernel in the same
// order. Where Eigen would not run its blocked GEMM (tiny or vector-shaped products, or several
// Eigen threads), the functions run Eigen's expression itself.
#ifndef PIPETRAIN_COMMON_MATH_PACKED_GEMM_H_
#define PIPETRAIN_COMMON_MATH_PACKED_GEMM_H_

#include <Eigen/Core>
#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "common/math/tensor.h"

namespace pipetrain::math {

// A weight packed for one of the two products. Holds a copy (about the weight's size): the caller
// calls Invalidate() whenever the weight's values change; a moved or resized weight is noticed.
// Not thread-safe: one caller at a time.
class PackedWeight {
 public:
  void Invalidate() { valid_ = false; }
  // Bytes held (0 before first use).
  int64_t bytes() const {
    return static_cast<int64_t>((data_.capacity() + rhs_block_.capacity()) * sizeof(float));
  }

 private:
  friend class PackedWeightAccess;

  bool valid_ = false;
  const float* source_ = nullptr;  // the weight packed.
  Eigen::Index rows_ = 0, depth_ = 0, kc_ = 0, mc_ = 0;
  std::vector<float, Eigen::aligned_allocator<float>> data_;
  std::vector<float, Eigen::aligned_allocator<float>> rhs_block_;  // the other operand's block.
};

// y = x W^T for x [r, in], w [out, in], y [r, out]; `packed` (or null: none) keeps w's packing
// for the forward product. Bitwise equal to `y.noalias() = x * w.transpose()`.
void ProductXWt(ConstMatrixMap x, ConstMatrixMap w, MatrixMap y, PackedWeight* packed);

// dx = dy W for dy [r, out], w [out, in], dx [r, in]; `packed` (or null) keeps w's packing for
// the input gradient (a different one from the forward's). Bitwise equal to `dx.noalias() = dy *
// w`.
void ProductDyW(ConstMatrixMap dy, ConstMatrixMap w, MatrixMap dx, PackedWeight* packed);

// Packs `w` into `packed` again for the product it was last used with (ProductXWt, respectively
// ProductDyW, with the same row count), unless it holds that packing already; nothing if it was
// never used with a weight of w's shape. For packing a changed weight right after the change,
// while it is in cache, instead of in the next product. The products' results do not change.
void RepackXWt(ConstMatrixMap w, PackedWeight* packed);
void RepackDyW(ConstMatrixMap w, PackedWeight* packed);

// One micro-batch's operands of a weight-gradient product gw += dy^T x: dy [r, out], x [r, in].
struct DyTxTerm {
  ConstMatrixMap dy;
  ConstMatrixMap x;
};

// gw [out, in] += dy_t^T x_t for every term t, in order. Bitwise equal to running
// `gw.noalias() += t.dy.transpose() * t.x` for each term in turn. Where the terms are several
// micro-batches of one shape whose product Eigen runs as one depth block, it runs Eigen's GEMM
// loop for all of them block by block of gw, each block taking every term's update while it is
// in cache (one pass over gw instead of one per term); otherwise it runs the expressions. Returns
// whether it ran the blocked loop (for tests and benchmarks; the result is the same).
bool AccumulateDyTx(absl::Span<const DyTxTerm> terms, MatrixMap gw);

// gw [out, in] = gw + N elementwise, N the node of the canonical accumulation tree over the terms
// (docs/numerics.md, "Accumulation order"): terms.size() / leaf_size leaves (a power of two) of
// `leaf_size` consecutive terms each, a leaf the product of its first term (`N_j = dy^T x`)
// with each later one accumulated (`N_j += dy^T x`), inner nodes lower + upper. Where the terms
// share one shape and Eigen runs their product as its sequential GEMM with one depth block, it
// computes N block by block of gw in cache and returns true; elsewhere (or on bad counts) it
// returns false having changed nothing, and the caller computes N by its leaves.
bool AccumulateDyTxNode(absl::Span<const DyTxTerm> terms, int64_t leaf_size, MatrixMap gw);

}  // namespace pipetrain::math

#endif  // PIPETRAIN_COMMON_MATH_PACKED_GEMM_H_
