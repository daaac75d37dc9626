// Pre-LN GPT-2 transformer block: multi-head causal self-attention and a GELU MLP, each with a
// residual connection.
#ifndef PIPETRAIN_COMMON_MATH_TRANSFORMER_BLOCK_H_
#define PIPETRAIN_COMMON_MATH_TRANSFORMER_BLOCK_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/math/layer.h"
#include "common/math/tensor.h"

namespace pipetrain::math {

// x, y [r, dim] with r = samples * context: rows s*context .. s*context+context-1 are the tokens
// of sample s in order. With d = dim, hidden = mlp_ratio * d, hd = d / heads:
//   a   = LN1(x)                          (eps 1e-5)
//   qkv = a Wqkv^T + bqkv                 [r, 3d]: q | k | v, head h in columns h*hd..h*hd+hd-1
//   per sample and head: P = causal_softmax(q k^T / sqrt(hd)), o = P v (CausalHeadForward)
//   h   = x + o Wproj^T + bproj
//   y   = h + fc2(GELU(LN2(h) Wfc^T + bfc)), fc2(g) = g Wfc2^T + bfc2
// Params (in this order): ln1.weight [d], ln1.bias [d], attn.qkv.weight [3d, d],
// attn.qkv.bias [3d], attn.proj.weight [d, d], attn.proj.bias [d], ln2.weight [d], ln2.bias [d],
// mlp.fc.weight [hidden, d], mlp.fc.bias [hidden], mlp.proj.weight [d, hidden], mlp.proj.bias [d].
// Init: LN weights 1, all biases 0, all matrices N(0, 0.02).
// Stash (floats, each region padded to a multiple of 16): Forward keeps LN1/LN2 mean and rstd,
// LN1 output, qkv, attention probabilities (samples*heads*context^2), attention output (before
// proj), h, LN2 output, MLP pre-activation and GELU output; BackwardInput fills the internal output
// gradients of mlp.fc, attn.proj (= dh), ln2, attn.qkv and ln1, so BackwardWeight runs only
// weight-gradient GEMMs and reductions. A context^2 scratch for one attention head is included.
// Forward sizes the whole stash once (no reallocation when it already has the right size).
// Attention: gqa_attention.h's CausalHeadForward/Backward per sample and head (the masked half of
// the scores is never computed).
// FLOPs: see docs/numerics.md (GEMMs exact, elementwise approximate; the causal products count
// CausalScoreEntries(context) scores per sample and head).
class TransformerBlock final : public Layer {
 public:
  // dim, heads, context, mlp_ratio > 0; heads divides dim.
  TransformerBlock(int64_t dim, int64_t heads, int64_t context, int64_t mlp_ratio);

  absl::string_view kind() const override { return "transformer_block"; }
  int64_t in_features() const override { return dim_; }
  int64_t out_features() const override { return dim_; }
  int64_t row_multiple() const override { return context_; }
  int64_t heads() const { return heads_; }
  int64_t context() const { return context_; }
  int64_t hidden() const { return hidden_; }

  std::vector<ParamSpec> params() const override;
  void Init(uint64_t seed, int64_t layer_index, std::vector<Tensor>* params) const override;
  FlopCount Flops(int64_t rows) const override;
  int64_t StashBytes(int64_t rows) const override;

  void Forward(absl::Span<const Tensor> params, ConstMatrixMap x, MatrixMap y,
               Stash* stash) const override;
  void BackwardInput(absl::Span<const Tensor> params, ConstMatrixMap x, ConstMatrixMap dy,
                     Stash* stash, MatrixMap dx) const override;
  void BackwardWeight(absl::Span<const Tensor> params, ConstMatrixMap x, ConstMatrixMap dy,
                      const Stash& stash, absl::Span<Tensor> grads) const override;

  // The four weights (attn.qkv, attn.proj, mlp.fc, mlp.proj) packed for their forward and
  // input-gradient products (packed_gemm.h), as a Linear's: bitwise the uncached results.
  std::unique_ptr<ParamCache> NewParamCache() const override;
  void ForwardCached(absl::Span<const Tensor> params, ParamCache* cache, ConstMatrixMap x,
                     MatrixMap y, Stash* stash) const override;
  void BackwardInputCached(absl::Span<const Tensor> params, ParamCache* cache, ConstMatrixMap x,
                           ConstMatrixMap dy, Stash* stash, MatrixMap dx) const override;

  // Incremental forward (KV cache; docs/inference.md). The state holds the keys and values of
  // every head for up to context() positions (2 * context * dim floats, allocated once). Rows of
  // x are positions position .. position+n-1 of one sequence; row i attends to positions
  // 0 .. position+i, whose keys and values the state holds after this call's own are appended.
  // The products have shapes [n, d] x [d, 3d], [n, hd] x [hd, position+n], ...: with
  // position == 0 and n == context() they are Forward's for one sample, and y is bitwise
  // Forward's; with other shapes Eigen sums the same products in another order (a few float
  // ulps; docs/inference.md, "Numerics"). position + n <= context().
  bool SupportsIncremental() const override { return true; }
  std::unique_ptr<IncrementalState> NewIncrementalState() const override;
  void ForwardIncremental(absl::Span<const Tensor> params, int64_t position, ConstMatrixMap x,
                          IncrementalState* state, Stash* scratch, MatrixMap y) const override;

 private:
  // Float offsets of the stash regions for a micro-batch of `rows` rows.
  struct Layout {
    int64_t mean1, rstd1, ln1, qkv, att, attn, h, mean2, rstd2, ln2, fc, gelu;  // Forward.
    int64_t dfc, dh, dln2, dqkv, dln1, scratch;  // BackwardInput (dln1 doubles as d(attn)).
    int64_t total;
  };
  Layout MakeLayout(int64_t rows) const;

  void AttentionForward(ConstMatrixMap qkv, float* att, MatrixMap out) const;
  // Float offsets of ForwardIncremental's scratch regions for n new rows attending to `len`
  // positions.
  struct StepLayout {
    int64_t mean1, rstd1, ln1, qkv, att, attn, h, mean2, rstd2, ln2, fc, gelu;
    int64_t total;
  };
  StepLayout MakeStepLayout(int64_t n, int64_t len) const;
  // Causal attention of the n rows of `qkv` (positions position .. position+n-1) over the first
  // position+n rows of `keys` and `values` ([context, dim] each); `att` holds n * (position+n)
  // floats of scratch.
  void AttentionIncremental(ConstMatrixMap qkv, int64_t position, const float* keys,
                            const float* values, float* att, MatrixMap out) const;
  void AttentionBackward(ConstMatrixMap qkv, const float* att, ConstMatrixMap dout, float* scratch,
                         MatrixMap dqkv) const;

  const int64_t dim_;
  const int64_t heads_;
  const int64_t context_;
  const int64_t hidden_;
  const int64_t head_dim_;
};

}  // namespace pipetrain::math

#endif  // PIPETRAIN_COMMON_MATH_TRANSFORMER_BLOCK_H_
