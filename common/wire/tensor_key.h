// The identity of a tensor message on the data plane (domain type; the wire form is
// pipetrain.v1.FrameHeader, converted in common/wire only).
//
// Within one job and generation, a tensor is identified by (step, micro-batch, chunk, kind):
//   kActivation, chunk c: the input activation of chunk c (the output of chunk c-1's F).
//   kGradient,   chunk c: dL/d(output of chunk c) (the input gradient from chunk c+1's B or I).
//   kInput,      chunk 0: the micro-batch's model inputs (sent by the coordinator).
//   kTarget,     last chunk: the micro-batch's targets (sent by the coordinator).
//   kTiedGradient, chunk 0 or the last chunk (micro-batch 0): the other end's part of a tied
//                embedding table's gradient, for the owner of `chunk` (model/tied_embedding.h).
//   kReplicaGradient, chunk c: a data-parallel replica's message in the reduction of chunk c's
//                weight gradients (server/worker/replica_reducer.h), for the worker holding
//                chunk c in the round's partner replica. The micro-batch field is
//                segment * 2 log2(replicas) + round: the round of AllReduceSum
//                (server/worker/gradient_exchange.h) on one segment of the chunk's gradients.
//   kCopyGradient, any chunk of a job with two copies of its stages (bidirectional DualPipe):
//                a message of the 2-peer reduction of the stage's gradients with the other copy,
//                for the owner of `chunk` (server/worker/replica_reducer.h); the micro-batch
//                field is segment * 2 + round (docs/wire.md, "Gradient exchange").
#ifndef PIPETRAIN_COMMON_WIRE_TENSOR_KEY_H_
#define PIPETRAIN_COMMON_WIRE_TENSOR_KEY_H_

#include <cstdint>
#include <string>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"

namespace pipetrain::wire {

enum class TensorKind : uint8_t {
  kActivation = 1,
  kGradient = 2,
  kInput = 3,
  kTarget = 4,
  kTiedGradient = 5,
  kReplicaGradient = 6,
  kCopyGradient = 7,
};

inline const char* TensorKindName(TensorKind kind) {
  switch (kind) {
    case TensorKind::kActivation:
      return "activation";
    case TensorKind::kGradient:
      return "gradient";
    case TensorKind::kInput:
      return "input";
    case TensorKind::kTarget:
      return "target";
    case TensorKind::kTiedGradient:
      return "tied_gradient";
    case TensorKind::kReplicaGradient:
      return "replica_gradient";
    case TensorKind::kCopyGradient:
      return "copy_gradient";
  }
  return "unknown";
}

struct TensorKey {
  int64_t step = 0;
  int32_t microbatch = 0;
  int32_t chunk = 0;
  TensorKind kind = TensorKind::kActivation;

  friend bool operator==(const TensorKey& a, const TensorKey& b) {
    return std::tie(a.step, a.microbatch, a.chunk, a.kind) ==
           std::tie(b.step, b.microbatch, b.chunk, b.kind);
  }
  friend bool operator<(const TensorKey& a, const TensorKey& b) {
    return std::tie(a.step, a.microbatch, a.chunk, a.kind) <
           std::tie(b.step, b.microbatch, b.chunk, b.kind);
  }
  template <typename H>
  friend H AbslHashValue(H h, const TensorKey& k) {
    return H::combine(std::move(h), k.step, k.microbatch, k.chunk, static_cast<int>(k.kind));
  }
  // "activation(step=3, mb=1, chunk=2)".
  std::string ToString() const {
    return absl::StrCat(TensorKindName(kind), "(step=", step, ", mb=", microbatch,
                        ", chunk=", chunk, ")");
  }
};

}  // namespace pipetrain::wire

#endif  // PIPETRAIN_COMMON_WIRE_TENSOR_KEY_H_
