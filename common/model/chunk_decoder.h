// The incremental (KV-cache) forward of a contiguous range of a language model's layers for
// several sequences at once (docs/inference.md): the one-process Generator runs one over every
// layer, a stage worker one per model chunk it holds for a Generate request. Both therefore run
// the same arithmetic on the same rows, which makes pipelined decoding bitwise equal to the local
// generator's.
#ifndef PIPETRAIN_COMMON_MODEL_CHUNK_DECODER_H_
#define PIPETRAIN_COMMON_MODEL_CHUNK_DECODER_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/math/layer.h"
#include "common/math/tensor.h"
#include "common/model/model.h"

namespace pipetrain::model {

// Most sequences one ChunkDecoder holds (the service's prompts per Generate request).
inline constexpr int64_t kMaxDecodeSequences = 256;

// Holds, per sequence, the incremental states (keys and values) of layers [first, last) for the
// positions run so far, and scratch and output buffers shared by the sequences (one call at a
// time). Thread-compatible: one thread at a time.
class ChunkDecoder {
 public:
  // A decoder of layers [first, last) of `model` (which must outlive it) for `sequences`
  // sequences, none holding a position. INVALID_ARGUMENT for an empty or out-of-range layer range,
  // sequences outside [1, kMaxDecodeSequences], or a layer without an incremental forward (naming
  // it).
  static absl::StatusOr<std::unique_ptr<ChunkDecoder>> Create(const Model* model, int64_t first,
                                                              int64_t last, int64_t sequences);

  ChunkDecoder(const ChunkDecoder&) = delete;
  ChunkDecoder& operator=(const ChunkDecoder&) = delete;

  // Runs `x` ([n, in_features of layer first], n >= 1) as positions position .. position+n-1 of
  // sequence `seq` through the layers, with params[k] the parameters of layer first + k, and
  // returns their output [n, out_features of layer last - 1], valid until the next Forward.
  // INVALID_ARGUMENT (nothing run) for `seq` out of range, `position` other than the positions the
  // sequence holds, position + n beyond the model's context, x's columns or `params`' count not
  // the layers'.
  absl::StatusOr<math::ConstMatrixMap> Forward(absl::Span<const std::vector<math::Tensor>> params,
                                               int64_t seq, int64_t position,
                                               math::ConstMatrixMap x);

  // Forgets every position of sequence `seq` (keeps the memory); no-op when out of range.
  void Clear(int64_t seq);
  // Positions sequence `seq` holds: the position of its next Forward (0 when out of range).
  int64_t positions(int64_t seq) const;
  int64_t sequences() const { return static_cast<int64_t>(positions_.size()); }
  int64_t first_layer() const { return first_; }
  int64_t last_layer() const { return last_; }
  // Bytes the sequences' states hold now (their KV caches).
  int64_t StateBytes() const;

 private:
  ChunkDecoder(const Model* model, int64_t first, int64_t last, int64_t sequences);

  const Model* const model_;
  const int64_t first_;
  const int64_t last_;
  const int64_t context_;
  // [seq][layer - first] (null for a layer without state).
  std::vector<std::vector<std::unique_ptr<math::IncrementalState>>> states_;
  std::vector<int64_t> positions_;     // [seq]
  std::vector<math::Stash> scratch_;   // [layer - first]
  std::vector<math::Matrix> outputs_;  // [layer - first]: [context, out_features], first rows used.
};

}  // namespace pipetrain::model

#endif  // PIPETRAIN_COMMON_MODEL_CHUNK_DECODER_H_
