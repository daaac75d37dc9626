// Where the tensors of an evaluation run go in the data plane's key space (wire::TensorKey).
//
// An evaluation run (coordinator.proto, Evaluate) feeds one micro-batch per evaluation chunk, and
// may have more chunks than the job's M, while every Exchange stream accepts micro-batch indices
// in [0, M) only (wire::FrameValidation). So chunk i of a run whose keys start at step `first` is
// keyed (first + i / M, i % M): a run of K chunks uses steps first .. first + ceil(K / M) - 1,
// all of them far above any training step (kEvalStepBase).
#ifndef PIPETRAIN_COMMON_WIRE_EVAL_KEY_H_
#define PIPETRAIN_COMMON_WIRE_EVAL_KEY_H_

#include <cstdint>

#include "common/wire/tensor_key.h"

namespace pipetrain::wire {

// Keys of evaluation runs start here: far above any training step (< 2^53).
inline constexpr int64_t kEvalStepBase = int64_t{1} << 62;

// The key of chunk `index` (>= 0) of the evaluation run whose keys start at `first`, for a job
// of `per_step` (M >= 1) micro-batches, on `chunk` with `kind`.
inline TensorKey EvalKey(int64_t first, int64_t index, int32_t per_step, int32_t chunk,
                         TensorKind kind) {
  return TensorKey{first + index / per_step, static_cast<int32_t>(index % per_step), chunk, kind};
}

// Steps an evaluation run of `chunks` chunks uses, for a job of `per_step` micro-batches.
inline int64_t EvalSteps(int64_t chunks, int32_t per_step) {
  return (chunks + per_step - 1) / per_step;
}

}  // namespace pipetrain::wire

#endif  // PIPETRAIN_COMMON_WIRE_EVAL_KEY_H_
