// Token embedding, optionally plus a learned absolute position embedding (GPT-2 style).
#ifndef PIPETRAIN_COMMON_MATH_EMBEDDING_H_
#define PIPETRAIN_COMMON_MATH_EMBEDDING_H_

#include <cstdint>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/math/layer.h"
#include "common/math/tensor.h"

namespace pipetrain::math {

// x [r, 1]: one token id per row, stored as an exactly representable float, r a multiple of
// `context`; row i is position i % context of its sample. y [r, dim]:
//   y_i = token.weight[x_i] + position.weight[i % context]   (with a position table)
//   y_i = token.weight[x_i]                                  (without: for models whose attention
//                                                             encodes positions, e.g. RoPE)
// Token ids must be integral and in [0, vocab_size) (validated by the caller, not here).
// Params: "token.weight" [vocab, dim] N(0, 0.02), then (with a position table only)
// "position.weight" [context, dim] N(0, 0.01).
// Stash: empty. Token ids have no gradient: BackwardInput writes zeros into a requested dx.
// BackwardWeight scatters dy rows into the table(s) in increasing row order.
// FLOPs for r rows: F = r dim, B-input = 0, B-weight = 2 r dim (r dim without a position table).
class Embedding final : public Layer {
 public:
  // vocab_size, dim, context > 0. position_table: whether to add the learned position table.
  Embedding(int64_t vocab_size, int64_t dim, int64_t context, bool position_table = true);

  absl::string_view kind() const override { return "embedding"; }
  int64_t in_features() const override { return 1; }
  int64_t out_features() const override { return dim_; }
  int64_t row_multiple() const override { return context_; }
  int64_t vocab_size() const { return vocab_; }
  int64_t context() const { return context_; }
  bool position_table() const { return position_table_; }

  std::vector<ParamSpec> params() const override;
  void Init(uint64_t seed, int64_t layer_index, std::vector<Tensor>* params) const override;
  FlopCount Flops(int64_t rows) const override;
  int64_t StashBytes(int64_t rows) const override { return 0; }

  void Forward(absl::Span<const Tensor> params, ConstMatrixMap x, MatrixMap y,
               Stash* stash) const override;
  void BackwardInput(absl::Span<const Tensor> params, ConstMatrixMap x, ConstMatrixMap dy,
                     Stash* stash, MatrixMap dx) const override;
  // Row i of x is position `position` + i: y_i = token.weight[x_i] + position.weight[position +
  // i], bitwise Forward's row. No state; position + rows <= context.
  bool SupportsIncremental() const override { return true; }
  void ForwardIncremental(absl::Span<const Tensor> params, int64_t position, ConstMatrixMap x,
                          IncrementalState* state, Stash* scratch, MatrixMap y) const override;
  void BackwardWeight(absl::Span<const Tensor> params, ConstMatrixMap x, ConstMatrixMap dy,
                      const Stash& stash, absl::Span<Tensor> grads) const override;

 private:
  const int64_t vocab_;
  const int64_t dim_;
  const int64_t context_;
  const bool position_table_;
};

}  // namespace pipetrain::math

#endif  // PIPETRAIN_COMMON_MATH_EMBEDDING_H_
