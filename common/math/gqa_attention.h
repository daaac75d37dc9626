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

// Query rows per block of the causal products (docs/numerics.md, "Causal attention").
inline constexpr int64_t kCausalBlock = 32;

// Score entries CausalHeadForward computes for one head and one sample of `context` tokens (first
// 0): the sum over query blocks of rows x keys, between context (context+1) / 2 and context^2
// (context^2 exactly when context <= kCausalBlock). Each backward product has as many.
double CausalScoreEntries(int64_t context);

// One head's causal attention for one sample: the n rows of q [n, hd] are the queries at
// positions first .. first+n-1; k, v [>= first+n, hd] hold the keys and values of positions 0..
// Writes P [n, first+n] at `p` (row stride first+n): exactly 0 above the causal diagonal; and
// out [n, hd] = P v. Query rows go in blocks of kCausalBlock (the last one shorter); the block of
// rows r0 .. r0+b-1 sees keys 0 .. e-1, e = first+r0+b, and runs
//   S = q_block k[0:e]^T   (one GEMM, depth hd; never the keys after e)
//   CausalSoftmaxRows(b, first+n, first+r0, scale, P rows r0..)
//   out_block = P[block, 0:e] v[0:e]   (one GEMM, depth e; the zeros above the diagonal inside
//                                       the block are added as exact zeros)
// The same shapes give the same bits (Eigen's products, pinned blocking): the training forward
// (first 0, n = T) and a cached forward of a whole sample agree bitwise.
void CausalHeadForward(ConstStridedMap q, ConstStridedMap k, ConstStridedMap v, int64_t first,
                       float scale, float* p, StridedMap out);

// The backward of CausalHeadForward(first = 0, n = T rows) given its P (`p`, T x T) and
// dout [T, hd]; `ds` is T x T floats of scratch. Per query block (as the forward):
//   dP = dout_block v[0:e]^T;  dS = CausalSoftmaxBackwardRows(dP);  dq_block = dS[.., 0:e] k[0:e]
// then per key block c (columns c0 .. c0+b-1; rows i < c0 have P = dS = 0 there):
//   dv_c (+)= P[c0:T, c]^T dout[c0:T],  dk_c (+)= dS[c0:T, c]^T q[c0:T]   (depth T - c0)
// assigning when `accumulate` is false, adding otherwise.
void CausalHeadBackward(ConstStridedMap q, ConstStridedMap k, ConstStridedMap v, const float* p,
                        ConstStridedMap dout, double scale, float* ds, bool accumulate,
                        StridedMap dq, StridedMap dk, StridedMap dv);

// The causal softmax of attention scores, shared by every attention (this one, the transformer
// block's, its cached forward). `rows` rows of `len` scores each, row i the query at position
// `first` + i: its columns 0..first+i are scaled by `scale` (float), then become exp(s - max) /
// sum (PortableExpArray; the sum in double in column order; each quotient in double, rounded to
// float); the columns after it become exactly 0 (the scores there are never read).
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
