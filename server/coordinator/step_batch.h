// StepBatch: a client's batch, checked and split into the micro-batches a step feeds.
#ifndef PIPETRAIN_SERVER_COORDINATOR_STEP_BATCH_H_
#define PIPETRAIN_SERVER_COORDINATOR_STEP_BATCH_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/math/tensor.h"
#include "common/model/model.h"
#include "pipetrain/v1/coordinator.pb.h"

namespace pipetrain::coordinator {

struct StepBatch {
  int64_t samples = 0;
  int64_t rows = 0;     // input rows (a sample may span several, e.g. a sequence).
  int64_t mb_rows = 0;  // rows per micro-batch.
  std::vector<std::shared_ptr<const math::Matrix>> inputs;   // [micro-batch]
  std::vector<std::shared_ptr<const math::Matrix>> targets;  // [micro-batch]
};

// `request`'s batch split into `microbatches` equal micro-batches of consecutive rows, after
// checking it against `net` (shapes, values, samples). INVALID_ARGUMENT saying what is wrong.
absl::StatusOr<StepBatch> SplitBatch(const v1::TrainRequest& request, const model::Model& net,
                                     int microbatches);

// Converts a client DenseTensor to a matrix: INVALID_ARGUMENT (naming `what`) unless its dtype is
// DTYPE_F32 (or unset, meaning it) and it is rank 2 with positive dims and exactly rows * cols * 4
// bytes.
absl::StatusOr<math::Matrix> DenseTensorToMatrix(const v1::DenseTensor& tensor,
                                                 const std::string& what);

}  // namespace pipetrain::coordinator

#endif  // PIPETRAIN_SERVER_COORDINATOR_STEP_BATCH_H_
