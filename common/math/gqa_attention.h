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
// Per sample s and query head h (kv head j = h / (heads/kv_heads)), with scale = float(1/sqrt(hd)):
//   S = q_h k_j^T (one T x T GEMM, every entry), then row i over columns 0..i: S_ij *= scale
//   (float), P_ij = exp(S_ij - max) / sum (exp and sum in double, increasing j), P_ij = 0 for
//   j > i;  out_h = P v_j (GEMM). P is kept in `probs` at [(s*heads + h), T, T].
void GqaAttentionForward(const GqaShape& shape, ConstMatrixMap q, ConstMatrixMap k,
                         ConstMatrixMap v, float* probs, MatrixMap out);

// Given dout [r, heads*hd] and the forward's q, k, v, probs: writes dq [r, heads*hd],
// dk, dv [r, kv_heads*hd]. Per sample and query head: dP = dout_h v_j^T;
// dS_ij = scale P_ij (dP_ij - sum_k P_ik dP_ik) (the sum in double, increasing k; 0 for j > i);
// dq_h = dS k_j; and for the kv head, in increasing query-head order (the first assigns, the
// others add): dv_j += P^T dout_h, dk_j += dS^T q_h. `scratch` holds context^2 floats.
void GqaAttentionBackward(const GqaShape& shape, ConstMatrixMap q, ConstMatrixMap k,
                          ConstMatrixMap v, const float* probs, ConstMatrixMap dout, float* scratch,
                          MatrixMap dq, MatrixMap dk, MatrixMap dv);

// Rough FLOPs per score entry (documented in docs/numerics.md).
// The causal softmax of attention scores, shared by every attention (this one, the transformer
// block's, its cached forward). `rows` rows of `len` scores each, row i the query at position
// `first` + i: its columns 0..first+i are scaled by `scale`, then become exp(s - max) / sum
// (PortableExp, the sum in double in column order); the columns after it become exactly 0.
void CausalSoftmaxRows(int64_t rows, int64_t len, int64_t first, float scale, float* a);

// The softmax backward of CausalSoftmaxRows(t, t, 0, ...): dP (in `d`, t x t) becomes
// dS_ij = scale P_ij (dP_ij - sum_k P_ik dP_ik) for j <= i, 0 above; the sum in double.
void CausalSoftmaxBackwardRows(int64_t t, double scale, const float* a, float* d);

inline constexpr double kGqaSoftmaxForwardFlopsPerScore = 8;   // scale, max, exp (~4), sum, div
inline constexpr double kGqaSoftmaxBackwardFlopsPerScore = 5;  // dot, subtract, 2 mul, scale

}  // namespace pipetrain::math

#endif  // PIPETRAIN_COMMON_MATH_GQA_ATTENTION_H_
