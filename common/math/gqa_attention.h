// Causal scaled dot-product attention with grouped-query heads (GQA; Ainslie et al. 2023): `heads`
// query heads share `kv_heads` key/value heads, query head h reading key/value head
// h / (heads / kv_heads) (Hugging Face's repeat_kv order). kv_heads = heads is multi-head
// attention, kv_heads = 1 multi-query attention.
#ifndef PIPETRAIN_COMMON_MATH_GQA_ATTENTION_H_
#define PIPETRAIN_COMMON_MATH_GQA_ATTENTION_H_

#include <cstdint>

#include "common/math/tensor.h"

namespace pipetrain::math {

// Shapes of one attention: rows r = samples * context, rows s*context .. s*context+context-1 the
// tokens of sample s. Query head h uses columns h*head_dim .. h*head_dim+head_dim-1 of q (and of
// the output); key/value head j the same columns j*head_dim.. of k and v.
struct GqaShape {
  int64_t heads = 0;     // > 0, a multiple of kv_heads.
  int64_t kv_heads = 0;  // > 0.
  int64_t head_dim = 0;  // > 0.
  int64_t context = 0;   // > 0.
};

// Floats of the attention probabilities for `rows` rows: samples * heads * context^2.
int64_t GqaProbabilityFloats(const GqaShape& shape, int64_t rows);

// q [r, heads*hd], k, v [r, kv_heads*hd], out [r, heads*hd], probs GqaProbabilityFloats floats.
// Per sample s and query head h (kv head j = h / (heads/kv_heads)): CausalHeadForward with
// first = 0 (P kept in `probs` at [(s*heads + h), T, T], exactly 0 above the diagonal).
void GqaAttentionForward(const GqaShape& shape, ConstMatrixMap q, ConstMatrixMap k,
                         ConstMatrixMap v, float* probs, MatrixMap out);

// Given dout [r, heads*hd] and the forward's q, k, v, probs: writes dq [r, heads*hd],
// dk, dv [r, kv_heads*hd]. Per sample and query head, CausalHeadBackward; for each kv head the
// query heads of its group in increasing order, the first assigning dk_j, dv_j, the others adding.
// `scratch` holds context^2 floats.
void GqaAttentionBackward(const GqaShape& shape, ConstMatrixMap q, ConstMatrixMap k,
                          ConstMatrixMap v, const float* probs, ConstMatrixMap dout, float* scratch,
                          MatrixMap dq, MatrixMap dk, MatrixMap dv);

// Row-major float views with an explicit row stride: one head's columns of q, k, v or out.
using ConstStridedMap = Eigen::Map<const Matrix, 0, Eigen::OuterStride<>>;
using StridedMap = Eigen::Map<Matrix, 0, Eigen::OuterStride<>>;

// Query rows per tile of the causal products: a tile of rows i0 .. i0+b-1 computes the scores of
// keys 0 .. first+i0+b-1 only (docs/numerics.md, "Causal attention").
inline constexpr int64_t kCausalTileRows = 8;
// Query rows per pass of the forward (scores, softmax, context) and of the backward's first half,
// for cache locality. The bits do not depend on it.
inline constexpr int64_t kCausalBlock = 32;

// Score entries CausalHeadForward computes for one head and one sample of `context` tokens (first
// 0): the sum over tiles of kCausalTileRows rows of rows x keys, between context (context+1) / 2
// and context^2. Each backward product of the scores' shape has as many.
double CausalScoreEntries(int64_t context);

// One head's causal attention for one sample: the n rows of q [n, hd] are the queries at
// positions first .. first+n-1; k, v [>= first+n, hd] hold the keys and values of positions 0..
// Writes P [n, first+n] at `p` (row stride first+n): exactly 0 above the causal diagonal; and
// out [n, hd] = P v. Per query row i (position first+i), lanes of one vector per output column,
// each sum in increasing depth with a fused multiply-add per term at x86-64-v3/-v4 (a multiply and
// an add elsewhere), starting from 0:
//   S_ij = sum_d q_id k_jd               (j <= first+i; never the keys after first+i)
//   P_i  = CausalSoftmaxRows(S_i)
//   out_ic = sum_{j=0..first+i} P_ij v_jc
// A row's bits do not depend on n, first, the tiling or the vector width: the training forward
// (first 0, n = T) and a cached forward of any rows agree bitwise. Thread-safe: operands are packed
// into a buffer of the calling thread's, kept across calls.
void CausalHeadForward(ConstStridedMap q, ConstStridedMap k, ConstStridedMap v, int64_t first,
                       float scale, float* p, StridedMap out);

// The backward of CausalHeadForward(first = 0, n = T rows) given its P (`p`, T x T) and
// dout [T, hd]; `ds` is T x T floats of scratch. With the forward's arithmetic (sums in increasing
// index from 0):
//   dP_ij = sum_d dout_id v_jd (j <= i);  dS = CausalSoftmaxBackwardRows(dP)
//   dq_ic = sum_{j<=i} dS_ij k_jc
//   dv_jc (+)= sum_{i>=j} P_ij dout_ic,  dk_jc (+)= sum_{i>=j} dS_ij q_ic
// assigning when `accumulate` is false, adding the head's sum otherwise.
void CausalHeadBackward(ConstStridedMap q, ConstStridedMap k, ConstStridedMap v, const float* p,
                        ConstStridedMap dout, double scale, float* ds, bool accumulate,
                        StridedMap dq, StridedMap dk, StridedMap dv);

// The causal softmax of attention scores, shared by every attention (this one, the transformer
// block's, its cached forward). `rows` rows of `len` scores each, row i the query at position
// `first` + i: its columns 0..first+i are scaled by `scale` (float), then become exp(s - max) /
// sum (s - max in float, its exponential in float through PortableExpFloatArray; the sum in double
// in column order; each quotient in double, rounded to float); the columns after it become exactly
// 0 (the scores there are never read).
void CausalSoftmaxRows(int64_t rows, int64_t len, int64_t first, float scale, float* a);

// The softmax backward of CausalSoftmaxRows on the same rows: dP (in `d`, rows x len) becomes
// dS_ij = scale P_ij (dP_ij - sum_k P_ik dP_ik) for j <= first+i (the sum in double, increasing
// k), exactly 0 after it (dP there is never read).
void CausalSoftmaxBackwardRows(int64_t rows, int64_t len, int64_t first, double scale,
                               const float* a, float* d);

// Rough FLOPs per score entry (documented in docs/numerics.md).
inline constexpr double kGqaSoftmaxForwardFlopsPerScore = 8;   // scale, max, exp (~4), sum, div
inline constexpr double kGqaSoftmaxBackwardFlopsPerScore = 5;  // dot, subtract, 2 mul, scale

}  // namespace pipetrain::math

#endif  // PIPETRAIN_COMMON_MATH_GQA_ATTENTION_H_
