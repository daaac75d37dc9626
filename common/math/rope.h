// Rotary position embeddings (RoPE, Su et al. 2021) in the "rotate half" layout of GPT-NeoX and
// Hugging Face's LLaMA: feature i of a head is paired with feature i + head_dim/2.
#ifndef PIPETRAIN_COMMON_MATH_ROPE_H_
#define PIPETRAIN_COMMON_MATH_ROPE_H_

#include <cstdint>
#include <vector>

#include "common/math/tensor.h"

namespace pipetrain::math {

// The cos/sin table of one (head_dim, context, theta) and the rotations it defines. With
// half = head_dim / 2, position p (a row's index modulo context) and i in [0, half):
//   inv_freq_i = theta^(-2i / head_dim),  angle = p inv_freq_i,
//   c = float(cos angle), s = float(sin angle)   (double, det_math.h; rounded once to float),
//   Apply:          x'_i = x_i c - x_{i+half} s,   x'_{i+half} = x_{i+half} c + x_i s   (float)
//   ApplyTranspose: x'_i = x_i c + x_{i+half} s,   x'_{i+half} = x_{i+half} c - x_i s
// ApplyTranspose is the rotation's transpose (its inverse, up to rounding): it maps the gradient
// of a rotated vector to the gradient of the vector. Immutable after construction; thread-safe.
class RopeTable {
 public:
  // head_dim > 0 and even, context > 0, theta > 1. Builds the table (context * head_dim floats)
  // with bits that depend only on the arguments.
  RopeTable(int64_t head_dim, int64_t context, double theta);

  int64_t head_dim() const { return head_dim_; }
  int64_t context() const { return context_; }
  // float(cos) / float(sin) of position p, frequency i (i < head_dim / 2).
  float Cos(int64_t p, int64_t i) const { return cos_[p * half_ + i]; }
  float Sin(int64_t p, int64_t i) const { return sin_[p * half_ + i]; }

  // Rotates x [r, heads * head_dim] in place, every head of row k at position k % context.
  void Apply(MatrixMap x) const;
  // The transpose rotation of x [r, heads * head_dim] in place (backward of Apply).
  void ApplyTranspose(MatrixMap x) const;
  // Apply for rows at positions first, first+1, ..., first+r-1 (first + r <= context): row k's
  // bits are those Apply gives a row at position first + k (an incremental forward's new rows).
  void ApplyFrom(MatrixMap x, int64_t first) const;

 private:
  // Row k at position (first + k) % context.
  void Rotate(MatrixMap x, float sign, int64_t first = 0) const;

  const int64_t head_dim_;
  const int64_t half_;
  const int64_t context_;
  std::vector<float> cos_;  // [context, half]
  std::vector<float> sin_;  // [context, half]
};

}  // namespace pipetrain::math

#endif  // PIPETRAIN_COMMON_MATH_ROPE_H_
