// The tied input/output embedding (ModelSpec.tie_embeddings): the last layer, a linear head
// without bias, uses the first layer's embedding token table as its weight. docs/numerics.md,
// "Tied embedding".
//
// One parameter, two holders: every Stage that holds the embedding or the head keeps a copy of the
// table in that layer's parameters. The copies start equal (both initialised as the embedding's
// table) and stay equal bit for bit, because every holder applies the same optimizer update to the
// same gradient: the tied gradient, SumTiedGradients(embedding's part, head's part), each part
// accumulated over the step's micro-batches by its own layer as any gradient is. Checkpoints hold
// the table once, as the embedding's "token.weight" (and its optimizer state); the head's copy is
// neither written nor expected (docs/checkpoints.md).
#ifndef PIPETRAIN_COMMON_MODEL_TIED_EMBEDDING_H_
#define PIPETRAIN_COMMON_MODEL_TIED_EMBEDDING_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "common/math/layer.h"
#include "common/math/tensor.h"
#include "pipetrain/v1/model.pb.h"

namespace pipetrain::model {

// One of a tie's two copies: the embedding's token table or the head's weight.
enum class TieEnd { kEmbedding, kHead };

// Where a tie's two copies live.
struct TiedEmbedding {
  // The index of the table in either layer's params(): the embedding's "token.weight" and the
  // head's "weight" both come first.
  static constexpr int kParam = 0;
  int64_t embedding_layer = 0;  // global layer of the embedding (0).
  int64_t head_layer = 0;       // global layer of the head (the last layer).
  std::vector<int64_t> shape;   // [vocab, dim]
};

// The tie of `spec` over its built `layers` (layers[i] built from spec.layers(i)): nullopt when
// spec.tie_embeddings is false. INVALID_ARGUMENT naming the layer when the tie is impossible: layer
// 0 is not an embedding, the last layer is not a linear, the head has a bias, or the head's weight
// shape [out_features, in_features] differs from the token table's [vocab_size, dim].
absl::StatusOr<std::optional<TiedEmbedding>> ResolveTiedEmbedding(
    const v1::ModelSpec& spec, const std::vector<std::unique_ptr<math::Layer>>& layers);

// The tied table's gradient: embedding_part[i] + head_part[i] for every element i, in this order
// (the embedding's part is the lower layer's, hence the "lower then upper" order every holder
// uses). A single float addition is commutative, so the sum is also what head + embedding gives;
// the order is fixed anyway so that the same code serves sums of more parts. INVALID_ARGUMENT when
// the shapes differ or a tensor's data does not match its shape.
absl::StatusOr<math::Tensor> SumTiedGradients(const math::Tensor& embedding_part,
                                              const math::Tensor& head_part);

}  // namespace pipetrain::model

#endif  // PIPETRAIN_COMMON_MODEL_TIED_EMBEDDING_H_
