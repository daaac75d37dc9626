#include "common/model/tied_embedding.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace pipetrain::model {
namespace {

std::string TieShapeText(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

absl::Status TieError(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("tie_embeddings: ", what));
}

}  // namespace

absl::StatusOr<std::optional<TiedEmbedding>> ResolveTiedEmbedding(
    const v1::ModelSpec& spec, const std::vector<std::unique_ptr<math::Layer>>& layers) {
  if (!spec.tie_embeddings()) return std::optional<TiedEmbedding>();
  if (layers.empty()) return TieError("the model has no layers");
  const math::Layer& embedding = *layers.front();
  if (embedding.kind() != "embedding") {
    return TieError(absl::StrCat("layer 0 is ", embedding.kind(),
                                 ", not an embedding (the tie shares the embedding's token table "
                                 "with the last layer)"));
  }
  const int64_t last = static_cast<int64_t>(layers.size()) - 1;
  const math::Layer& head = *layers.back();
  if (last == 0 || head.kind() != "linear") {
    return TieError(absl::StrCat("the last layer ", last, " is ", head.kind(),
                                 ", not a linear head (the layer that shares the embedding's "
                                 "token table as its weight)"));
  }
  const std::vector<math::ParamSpec> table = embedding.params();
  const std::vector<math::ParamSpec> weight = head.params();
  if (weight.size() != 1) {
    return TieError(absl::StrCat("the head (layer ", last,
                                 ", linear) has a bias; a tied head must set no_bias: true"));
  }
  if (table.empty() || weight[0].shape != table[TiedEmbedding::kParam].shape) {
    return TieError(absl::StrCat(
        "the head's weight (layer ", last,
        ", [out_features, in_features] = ", TieShapeText(weight[0].shape),
        ") differs from the embedding's token table (layer 0, [vocab_size, "
        "dim] = ",
        table.empty() ? std::string("none") : TieShapeText(table[TiedEmbedding::kParam].shape),
        ")"));
  }
  TiedEmbedding tie;
  tie.embedding_layer = 0;
  tie.head_layer = last;
  tie.shape = weight[0].shape;
  return std::optional<TiedEmbedding>(tie);
}

absl::StatusOr<math::Tensor> SumTiedGradients(const math::Tensor& embedding_part,
                                              const math::Tensor& head_part) {
  if (embedding_part.shape != head_part.shape) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tied gradient parts differ in shape: the embedding's is ",
        TieShapeText(embedding_part.shape), ", the head's ", TieShapeText(head_part.shape)));
  }
  const size_t n = static_cast<size_t>(math::NumElements(embedding_part.shape));
  if (embedding_part.data.size() != n || head_part.data.size() != n) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tied gradient parts of shape ", TieShapeText(embedding_part.shape), " hold ",
        embedding_part.data.size(), " and ", head_part.data.size(), " floats, expected ", n));
  }
  math::Tensor sum{embedding_part.shape, std::vector<float>(n)};
  for (size_t i = 0; i < n; ++i) sum.data[i] = embedding_part.data[i] + head_part.data[i];
  return sum;
}

}  // namespace pipetrain::model
