// StepExecutor's exchange between the two copies of a stage under bidirectional DualPipe
// (ExecutorOptions::two_copies; docs/schedules.md, "DualPipe").
#include <algorithm>
#include <numeric>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/util/status_macros.h"
#include "server/worker/executor.h"

namespace pipetrain::worker {
namespace {

// A stage's gradients travel as [rows, kCopyGradientCols] (padded with zeros) rather than one
// row, so that a stage of more than FrameValidation::max_dim parameters still fits the frame
// limits; the padding adds zeros to zeros and is dropped again.
constexpr int64_t kCopyGradientCols = 1024;

// `flat` ([1, n]) as [ceil(n / cols), cols], zero-padded.
math::Tensor PadToRows(math::Tensor flat) {
  const int64_t n = static_cast<int64_t>(flat.data.size());
  const int64_t rows = (n + kCopyGradientCols - 1) / kCopyGradientCols;
  flat.data.resize(static_cast<size_t>(rows * kCopyGradientCols), 0.0f);
  flat.shape = {rows, kCopyGradientCols};
  return flat;
}

}  // namespace

absl::Status StepExecutor::ExchangeCopyGradients(int64_t step, ExchangeTransport* transport) {
  if (!routes_.two_copies()) return absl::OkStatus();
  // The peer holds the other copies of the same stages (rank w and rank S-1-w hold stages w and
  // S-1-w): both go in increasing stage order, so each takes what the other has sent already.
  std::vector<int> order(chunks_.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [this](int a, int b) {
    return routes_.StageOf(chunks_[a].chunk) < routes_.StageOf(chunks_[b].chunk);
  });
  for (int local : order) {
    model::Stage& stage = chunks_[local].stage;
    const int chunk = chunks_[local].chunk;
    math::Tensor flat;
    stage.CopyGradsTo(&flat.data);
    const int64_t n = static_cast<int64_t>(flat.data.size());
    if (n == 0) continue;  // a stage without parameters (the other copy skips it too).
    flat.shape = {1, n};
    // The down copy added micro-batches [0, M/2), the lower node of the step's tree: first.
    absl::StatusOr<math::Tensor> sum = SumWithPeer(
        transport,
        wire::TensorKey{step, 0, routes_.OtherCopy(chunk), wire::TensorKind::kCopyGradient},
        wire::TensorKey{step, 0, chunk, wire::TensorKind::kCopyGradient},
        PadToRows(std::move(flat)),
        /*mine_is_lower=*/routes_.IsDown(chunk));
    if (!sum.ok()) {
      return absl::Status(
          sum.status().code(),
          absl::StrCat("step ", step, ": gradients of stage ", routes_.StageOf(chunk), " (chunk ",
                       chunk, ") with its copy ", routes_.OtherCopy(chunk), ": ",
                       sum.status().message()));
    }
    sum->data.resize(static_cast<size_t>(n));  // the padding dropped.
    PT_RETURN_IF_ERROR(stage.SetGradsFrom(sum->data));
  }
  return absl::OkStatus();
}

}  // namespace pipetrain::worker
