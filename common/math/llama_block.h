// LLaMA-style decoder block: pre-RMSNorm causal self-attention with rotary position embeddings
// and grouped-query heads, then a pre-RMSNorm SwiGLU MLP, each with a residual connection; no
// biases anywhere.
#ifndef PIPETRAIN_COMMON_MATH_LLAMA_BLOCK_H_
#define PIPETRAIN_COMMON_MATH_LLAMA_BLOCK_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/math/gqa_attention.h"
#include "common/math/layer.h"
#include "common/math/rope.h"
#include "common/math/tensor.h"

namespace pipetrain::math {

// The configuration of one LlamaBlock (defaults are applied by the model builder, not here).
struct LlamaBlockConfig {
  int64_t dim = 0;        // model width d, > 0, a multiple of heads.
  int64_t heads = 0;      // query heads H, > 0; head_dim hd = d / H must be even (RoPE pairs).
  int64_t kv_heads = 0;   // key/value heads K, > 0, divides H.
  int64_t context = 0;    // tokens per sample T, > 0.
  int64_t hidden = 0;     // SwiGLU hidden width, > 0.
  double rope_theta = 0;  // RoPE base, > 1.
  float norm_eps = 0;     // both RMSNorms' eps, > 0.
};

// x, y [r, d] with r = samples * T (rows s*T .. s*T+T-1 the tokens of sample s, in order):
//   a  = RMSNorm1(x)
//   q  = RoPE(a Wq^T) [r, d],  k = RoPE(a Wk^T) [r, K hd],  v = a Wv^T [r, K hd]
//   o  = causal GQA attention(q, k, v)   (gqa_attention.h; query head h reads kv head h/(H/K))
//   h  = x + o Wo^T
//   b  = RMSNorm2(h);  g = b Wg^T, u = b Wu^T [r, hidden];  m = silu(g) * u
//   y  = h + m Wd^T
// silu(g) = g / (1 + e^-g), in double with PortableExp, rounded to float; m = float product.
// RoPE: rope.h with (hd, T, rope_theta), position = row % T.
// Params (in this order): attn_norm.weight [d], attn.q.weight [d, d], attn.k.weight [K hd, d],
// attn.v.weight [K hd, d], attn.o.weight [d, d], mlp_norm.weight [d], mlp.gate.weight [hidden, d],
// mlp.up.weight [hidden, d], mlp.down.weight [d, hidden]. Init: norm weights 1, every matrix
// N(0, 0.02).
// Stash (floats, each region padded to a multiple of 16): Forward keeps both norms' rstd, a, the
// rotated q and k, v, the attention probabilities (samples*H*T^2), o, h, b, g, u and m;
// BackwardInput adds dg, du, dh, db, the pre-rotation dq and dk, dv and da, so BackwardWeight runs
// only weight-gradient GEMMs and the norms' reductions. Plus a T^2 scratch. Forward sizes the
// whole stash once (no reallocation when it already has the right size).
// FLOPs: docs/numerics.md (GEMMs exact, elementwise approximate; the causal products count
// CausalScoreEntries(T) scores per sample and head).
class LlamaBlock final : public Layer {
 public:
  explicit LlamaBlock(const LlamaBlockConfig& config);

  absl::string_view kind() const override { return "llama_block"; }
  int64_t in_features() const override { return config_.dim; }
  int64_t out_features() const override { return config_.dim; }
  int64_t row_multiple() const override { return config_.context; }
  const LlamaBlockConfig& config() const { return config_; }

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

  // The seven weights packed for their forward products, and attn.o, attn.q, mlp.gate and
  // mlp.down for their input-gradient products (packed_gemm.h), as a Linear's: bitwise the
  // uncached results.
  std::unique_ptr<ParamCache> NewParamCache() const override;
  void ForwardCached(absl::Span<const Tensor> params, ParamCache* cache, ConstMatrixMap x,
                     MatrixMap y, Stash* stash) const override;
  void BackwardInputCached(absl::Span<const Tensor> params, ParamCache* cache, ConstMatrixMap x,
                           ConstMatrixMap dy, Stash* stash, MatrixMap dx) const override;
  // Incremental forward (KV cache; docs/inference.md). The state holds the keys (after RoPE) and
  // values of the K key/value heads for up to context positions (2 * context * K hd floats,
  // allocated once): grouped-query heads cache only the kv heads. Rows of x are positions
  // position .. position+n-1 of one sequence; their q and k are rotated at those positions, and
  // row i attends to positions 0 .. position+i. With position == 0 and n == context the
  // products have Forward's shapes and y is bitwise Forward's for one sample; with other shapes
  // Eigen sums the same products in another order (a few float ulps; docs/inference.md,
  // "Numerics"). position + n <= context.
  bool SupportsIncremental() const override { return true; }
  std::unique_ptr<IncrementalState> NewIncrementalState() const override;
  void ForwardIncremental(absl::Span<const Tensor> params, int64_t position, ConstMatrixMap x,
                          IncrementalState* state, Stash* scratch, MatrixMap y) const override;

 private:
  // Float offsets of the stash regions for a micro-batch of `rows` rows.
  struct Layout {
    int64_t rstd1, a, q, k, v, att, o, h, rstd2, b, g, u, m;  // Forward.
    int64_t dg, du, dh, db, dq, dk, dv, da, scratch;          // BackwardInput (da first holds do).
    int64_t total;
  };
  Layout MakeLayout(int64_t rows) const;

  // `cache`: a LlamaBlockParamCache (the weights packed) or null.
  void AttentionForward(absl::Span<const Tensor> params, ConstMatrixMap x, const Layout& l,
                        float* s, ParamCache* cache = nullptr) const;
  // The SwiGLU half of the block on y.rows() rows: y = h + down(silu(gate(b)) * up(b)),
  // b = RMSNorm2(h). `L`: Layout or StepLayout (its offsets h, rstd2, b, g, u and m).
  template <typename L>
  void MlpForward(absl::Span<const Tensor> params, const L& l, float* s, MatrixMap y,
                  ParamCache* cache = nullptr) const;
  void MlpBackwardInput(absl::Span<const Tensor> params, ConstMatrixMap dy, const Layout& l,
                        float* s, ParamCache* cache = nullptr) const;
  void AttentionBackwardInput(absl::Span<const Tensor> params, int64_t rows, const Layout& l,
                              float* s, ParamCache* cache = nullptr) const;

  // Float offsets of ForwardIncremental's scratch regions for n new rows attending to `len`
  // positions.
  struct StepLayout {
    int64_t rstd1, a, q, att, o, h, rstd2, b, g, u, m;
    int64_t total;
  };
  StepLayout MakeStepLayout(int64_t n, int64_t len) const;
  // Causal GQA attention of the n rotated query rows `q` (positions position .. position+n-1)
  // over the first position+n rows of `keys` and `values` ([context, K hd] each); `att` holds
  // n * (position+n) floats of scratch.
  void AttentionIncremental(ConstMatrixMap q, int64_t position, const float* keys,
                            const float* values, float* att, MatrixMap out) const;

  const LlamaBlockConfig config_;
  const int64_t head_dim_;
  const int64_t kv_dim_;  // K hd
  const GqaShape shape_;
  const RopeTable rope_;
};

}  // namespace pipetrain::math

#endif  // PIPETRAIN_COMMON_MATH_LLAMA_BLOCK_H_
