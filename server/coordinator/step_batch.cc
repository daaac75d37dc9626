#include "server/coordinator/step_batch.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/util/status_macros.h"

namespace pipetrain::coordinator {

absl::StatusOr<StepBatch> SplitBatch(const v1::TrainRequest& request, const model::Model& net,
                                     int microbatches) {
  const int M = microbatches;
  if (request.samples() <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("samples must be >= 1, got ", request.samples()));
  }
  if (request.samples() % M != 0) {
    return absl::InvalidArgumentError(absl::StrCat("a batch of ", request.samples(),
                                                   " samples is not divisible by the job's ", M,
                                                   " micro-batches"));
  }
  PT_ASSIGN_OR_RETURN(math::Matrix inputs, DenseTensorToMatrix(request.inputs(), "inputs"));
  PT_ASSIGN_OR_RETURN(math::Matrix targets, DenseTensorToMatrix(request.targets(), "targets"));
  if (request.samples() > inputs.rows()) {  // every sample has at least one row.
    return absl::InvalidArgumentError(
        absl::StrCat(request.samples(), " samples cannot fit in ", inputs.rows(), " input rows"));
  }
  PT_RETURN_IF_ERROR(
      net.ValidateBatch(math::AsConstMap(inputs), math::AsConstMap(targets), request.samples()));
  StepBatch batch;
  batch.samples = request.samples();
  batch.rows = inputs.rows();
  batch.mb_rows = batch.rows / M;
  for (int mb = 0; mb < M; ++mb) {
    batch.inputs.push_back(
        std::make_shared<const math::Matrix>(inputs.middleRows(mb * batch.mb_rows, batch.mb_rows)));
    batch.targets.push_back(std::make_shared<const math::Matrix>(
        targets.middleRows(mb * batch.mb_rows, batch.mb_rows)));
  }
  return batch;
}

absl::StatusOr<math::Matrix> DenseTensorToMatrix(const v1::DenseTensor& tensor,
                                                 const std::string& what) {
  if (tensor.dtype() != v1::DTYPE_F32 && tensor.dtype() != v1::DTYPE_UNSPECIFIED) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": dtype ", static_cast<int>(tensor.dtype()),
                     " is not supported (only DTYPE_F32 = 1, little-endian float32)"));
  }
  if (tensor.shape_size() != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": expected a rank-2 tensor, got rank ", tensor.shape_size()));
  }
  const int64_t rows = tensor.shape(0);
  const int64_t cols = tensor.shape(1);
  constexpr int64_t kMaxDim = int64_t{1} << 30;
  if (rows <= 0 || cols <= 0 || rows > kMaxDim || cols > kMaxDim || rows * cols > kMaxDim) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": bad shape [", rows, ", ", cols, "]"));
  }
  const int64_t bytes = rows * cols * static_cast<int64_t>(sizeof(float));
  if (static_cast<int64_t>(tensor.data().size()) != bytes) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": shape [", rows, ", ", cols, "] needs ",
                                                   bytes, " bytes, got ", tensor.data().size()));
  }
  math::Matrix m(rows, cols);
  std::memcpy(m.data(), tensor.data().data(), static_cast<size_t>(bytes));
  return m;
}

}  // namespace pipetrain::coordinator
