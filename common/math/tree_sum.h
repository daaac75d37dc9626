// The pairwise order in which a step's micro-batch weight gradients are added (docs/numerics.md,
// "Accumulation order"): a perfect binary tree over 2^u leaves, each inner node the elementwise
// IEEE sum `lower + upper` of its two children. Header-only: the layers of every instruction-set
// level and the model's stages use the same two functions.
#ifndef PIPETRAIN_COMMON_MATH_TREE_SUM_H_
#define PIPETRAIN_COMMON_MATH_TREE_SUM_H_

#include <cassert>
#include <cstddef>
#include <cstdint>

#include "absl/types/span.h"

namespace pipetrain::math {

// lower[i] = lower[i] + upper[i] for every i: one float addition per element, `lower` the first
// operand. Sizes must be equal (asserted in debug builds). The result does not depend on the
// buffers' alignment or on vectorisation (each element is one correctly rounded addition).
inline void AddInTreeOrder(absl::Span<const float> upper, absl::Span<float> lower) {
  assert(upper.size() == lower.size());
  float* __restrict out = lower.data();
  const float* __restrict in = upper.data();
  const size_t n = lower.size();
  for (size_t i = 0; i < n; ++i) out[i] = out[i] + in[i];
}

// log2 of `n` if `n` is a power of two (>= 1), else -1.
inline int Log2OfPowerOfTwo(int64_t n) {
  if (n < 1 || (n & (n - 1)) != 0) return -1;
  int log = 0;
  while ((int64_t{1} << log) < n) ++log;
  return log;
}

// Evaluates the perfect binary tree over `leaves` leaves (a power of two, >= 1), left to right, on
// a stack of numbered slots; at the end slot 0 holds the root. The callbacks:
//   leaf(j, s):    computes leaf j into slot s (whatever slot s held before is overwritten);
//   fuse(j, s):    leaf j (odd: a right child) may instead be added to slot s, which holds its left
//                  sibling leaf j-1, giving their parent; returns false, having changed nothing,
//                  where it cannot do so with the bits of `leaf` and `combine`;
//   combine(s):    slot s = slot s + slot s+1 (elementwise, slot s the lower node).
// Uses slots 0 .. TreeSlots(leaves) - 1.
template <typename Leaf, typename Fuse, typename Combine>
void EvaluateTree(int64_t leaves, Leaf&& leaf, Fuse&& fuse, Combine&& combine) {
  assert(Log2OfPowerOfTwo(leaves) >= 0);
  int64_t size[64];  // size[s]: leaves under the node in slot s.
  int depth = 0;
  for (int64_t j = 0; j < leaves; ++j) {
    if ((j & 1) != 0 && fuse(j, depth - 1)) {
      size[depth - 1] = 2;
    } else {
      leaf(j, depth);
      size[depth++] = 1;
    }
    while (depth >= 2 && size[depth - 1] == size[depth - 2]) {
      combine(depth - 2);
      size[depth - 2] *= 2;
      --depth;
    }
  }
  assert(depth == 1);
}

// Slots EvaluateTree(leaves, ...) uses: log2(leaves) + 1.
inline int TreeSlots(int64_t leaves) { return Log2OfPowerOfTwo(leaves) + 1; }

}  // namespace pipetrain::math

#endif  // PIPETRAIN_COMMON_MATH_TREE_SUM_H_
