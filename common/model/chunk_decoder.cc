#include "common/model/chunk_decoder.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace pipetrain::model {

ChunkDecoder::ChunkDecoder(const Model* model, int64_t first, int64_t last, int64_t sequences)
    : model_(model), first_(first), last_(last), context_(model->tokens_per_sample()) {
  states_.resize(static_cast<size_t>(sequences));
  for (auto& layers : states_) {
    for (int64_t l = first; l < last; ++l) layers.push_back(model->layer(l).NewIncrementalState());
  }
  positions_.assign(static_cast<size_t>(sequences), 0);
  scratch_.resize(static_cast<size_t>(last - first));
  outputs_.resize(static_cast<size_t>(last - first));
  for (int64_t l = first; l < last; ++l) {
    outputs_[l - first].resize(context_, model->layer(l).out_features());
  }
}

absl::StatusOr<std::unique_ptr<ChunkDecoder>> ChunkDecoder::Create(const Model* model,
                                                                   int64_t first, int64_t last,
                                                                   int64_t sequences) {
  if (model == nullptr) return absl::InvalidArgumentError("ChunkDecoder: null model");
  if (first < 0 || first >= last || last > model->num_layers()) {
    return absl::InvalidArgumentError(absl::StrCat("ChunkDecoder: layers [", first, ", ", last,
                                                   ") of a model of ", model->num_layers()));
  }
  if (sequences < 1 || sequences > kMaxDecodeSequences) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ChunkDecoder: ", sequences, " sequences, outside [1, ", kMaxDecodeSequences, "]"));
  }
  for (int64_t l = first; l < last; ++l) {
    if (!model->layer(l).SupportsIncremental()) {
      return absl::InvalidArgumentError(
          absl::StrCat("layer ", l, " (", model->layer(l).kind(),
                       ") has no incremental forward for generation"));
    }
  }
  return std::unique_ptr<ChunkDecoder>(new ChunkDecoder(model, first, last, sequences));
}

absl::StatusOr<math::ConstMatrixMap> ChunkDecoder::Forward(
    absl::Span<const std::vector<math::Tensor>> params, int64_t seq, int64_t position,
    math::ConstMatrixMap x) {
  const int64_t n = x.rows();
  if (seq < 0 || seq >= sequences()) {
    return absl::InvalidArgumentError(
        absl::StrCat("decode: sequence ", seq, " outside [0, ", sequences(), ")"));
  }
  if (position != positions_[seq]) {
    return absl::InvalidArgumentError(absl::StrCat("decode: sequence ", seq, " holds ",
                                                   positions_[seq], " positions, not ", position));
  }
  if (n < 1 || position + n > context_) {
    return absl::InvalidArgumentError(absl::StrCat("decode: positions [", position, ", ",
                                                   position + n, ") of sequence ", seq,
                                                   " outside the context of ", context_));
  }
  if (x.cols() != model_->layer(first_).in_features()) {
    return absl::InvalidArgumentError(absl::StrCat("decode: input of ", x.cols(),
                                                   " columns, layer ", first_, " takes ",
                                                   model_->layer(first_).in_features()));
  }
  if (static_cast<int64_t>(params.size()) != last_ - first_) {
    return absl::InvalidArgumentError(
        absl::StrCat("decode: parameters of ", params.size(), " layers for ", last_ - first_));
  }
  const float* in = x.data();
  int64_t cols = x.cols();
  for (int64_t k = 0; k < last_ - first_; ++k) {
    math::Matrix& out = outputs_[k];
    model_->layer(first_ + k)
        .ForwardIncremental(params[k], position, math::ConstMatrixMap(in, n, cols),
                            states_[seq][k].get(), &scratch_[k],
                            math::MatrixMap(out.data(), n, out.cols()));
    in = out.data();
    cols = out.cols();
  }
  positions_[seq] = position + n;
  return math::ConstMatrixMap(in, n, cols);
}

void ChunkDecoder::Clear(int64_t seq) {
  if (seq < 0 || seq >= sequences()) return;
  for (auto& s : states_[seq]) {
    if (s != nullptr) s->Clear();
  }
  positions_[seq] = 0;
}

int64_t ChunkDecoder::positions(int64_t seq) const {
  return seq < 0 || seq >= sequences() ? 0 : positions_[seq];
}

int64_t ChunkDecoder::StateBytes() const {
  int64_t bytes = 0;
  for (const auto& layers : states_) {
    for (const auto& s : layers) {
      if (s != nullptr) bytes += s->bytes();
    }
  }
  return bytes;
}

}  // namespace pipetrain::model
