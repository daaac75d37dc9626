#include "common/schedule/ir.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

namespace pipetrain::schedule {

absl::string_view OpLetter(Op op) {
  switch (op) {
    case Op::kForward:
      return "F";
    case Op::kBackward:
      return "B";
    case Op::kInputGrad:
      return "I";
    case Op::kWeightGrad:
      return "W";
  }
  return "?";
}

absl::StatusOr<Op> ParseOp(absl::string_view letter) {
  if (letter == "F") return Op::kForward;
  if (letter == "B") return Op::kBackward;
  if (letter == "I") return Op::kInputGrad;
  if (letter == "W") return Op::kWeightGrad;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown op \"", letter, "\": expected F, B, I or W"));
}

std::string ActionToString(const Action& action) {
  return absl::StrCat(OpLetter(action.op), "(mb=", action.mb, ", chunk=", action.chunk, ")");
}

absl::string_view PlacementKindName(PlacementKind kind) {
  switch (kind) {
    case PlacementKind::kLinear:
      return "linear";
    case PlacementKind::kLooped:
      return "looped";
    case PlacementKind::kVShape:
      return "v-shape";
    case PlacementKind::kBidirectional:
      return "bidirectional";
  }
  return "?";
}

int Placement::OwnerOf(int chunk) const {
  switch (kind) {
    case PlacementKind::kLinear:
      return chunk;
    case PlacementKind::kLooped:
      return chunk % stages;
    case PlacementKind::kVShape:
    case PlacementKind::kBidirectional:
      return chunk < stages ? chunk : 2 * stages - 1 - chunk;
  }
  return 0;
}

int Placement::LocalIndexOf(int chunk) const {
  switch (kind) {
    case PlacementKind::kLinear:
      return 0;
    case PlacementKind::kLooped:
      return chunk / stages;
    case PlacementKind::kVShape:
    case PlacementKind::kBidirectional:
      return chunk < stages ? 0 : 1;
  }
  return 0;
}

std::vector<int> Placement::ChunksOf(int worker) const {
  std::vector<int> chunks;
  switch (kind) {
    case PlacementKind::kLinear:
      chunks.push_back(worker);
      break;
    case PlacementKind::kLooped:
      for (int v = 0; v < virtual_stages; ++v) chunks.push_back(v * stages + worker);
      break;
    case PlacementKind::kVShape:
    case PlacementKind::kBidirectional:
      chunks.push_back(worker);
      chunks.push_back(2 * stages - 1 - worker);
      break;
  }
  return chunks;
}

int Placement::RouteBegin(int mb, int microbatches) const {
  if (kind != PlacementKind::kBidirectional) return 0;
  return mb < (microbatches + 1) / 2 ? 0 : stages;
}

int Placement::RouteEnd(int mb, int microbatches) const {
  if (kind != PlacementKind::kBidirectional) return num_chunks();
  return mb < (microbatches + 1) / 2 ? stages : 2 * stages;
}

absl::Status ValidatePlacement(const Placement& placement) {
  if (placement.stages < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("stages must be >= 1 (got ", placement.stages, ")"));
  }
  if (placement.virtual_stages < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("virtual stages must be >= 1 (got ", placement.virtual_stages, ")"));
  }
  const int64_t chunks = int64_t{placement.stages} * placement.virtual_stages;
  if (chunks > kMaxPlacementChunks) {
    return absl::InvalidArgumentError(absl::StrCat(
        placement.stages, " stages x ", placement.virtual_stages, " virtual stages = ", chunks,
        " chunks, more than the limit of ", kMaxPlacementChunks));
  }
  if (placement.kind == PlacementKind::kLinear && placement.virtual_stages != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the linear placement holds one chunk per rank: virtual stages must be 1 (got ",
        placement.virtual_stages, ")"));
  }
  if ((placement.kind == PlacementKind::kVShape ||
       placement.kind == PlacementKind::kBidirectional) &&
      placement.virtual_stages != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("the ", PlacementKindName(placement.kind),
                     " placement holds two chunks per rank: virtual stages must be 2 (got ",
                     placement.virtual_stages, ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<Placement> MakePlacement(PlacementKind kind, int stages, int virtual_stages) {
  Placement placement{kind, stages, virtual_stages};
  absl::Status status = ValidatePlacement(placement);
  if (!status.ok()) return status;
  return placement;
}

absl::StatusOr<int> CheckedOwnerOf(const Placement& placement, int chunk) {
  absl::Status status = ValidatePlacement(placement);
  if (!status.ok()) return status;
  if (chunk < 0 || chunk >= placement.num_chunks()) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk ", chunk, " is out of range [0, ", placement.num_chunks(), ")"));
  }
  return placement.OwnerOf(chunk);
}

absl::string_view ScheduleKindName(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::kGPipe:
      return "gpipe";
    case ScheduleKind::kOneFOneB:
      return "1f1b";
    case ScheduleKind::kInterleaved:
      return "interleaved";
    case ScheduleKind::kZbH1:
      return "zb-h1";
    case ScheduleKind::kZbV:
      return "zb-v";
    case ScheduleKind::kDualPipeV:
      return "dualpipe-v";
    case ScheduleKind::kOneFOneBOverlap:
      return "1f1b-overlap";
    case ScheduleKind::kInterleavedOverlap:
      return "interleaved-overlap";
    case ScheduleKind::kDualPipe:
      return "dualpipe";
  }
  return "?";
}

absl::StatusOr<ScheduleKind> ParseScheduleKind(absl::string_view name) {
  for (ScheduleKind kind : kAllScheduleKinds) {
    if (name == ScheduleKindName(kind)) return kind;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown schedule kind \"", name,
                   "\": expected gpipe, 1f1b, interleaved, zb-h1, zb-v, dualpipe-v, 1f1b-overlap, "
                   "interleaved-overlap or dualpipe"));
}

PlacementKind PlacementKindFor(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::kGPipe:
    case ScheduleKind::kOneFOneB:
    case ScheduleKind::kZbH1:
    case ScheduleKind::kOneFOneBOverlap:
      return PlacementKind::kLinear;
    case ScheduleKind::kInterleaved:
    case ScheduleKind::kInterleavedOverlap:
      return PlacementKind::kLooped;
    case ScheduleKind::kZbV:
    case ScheduleKind::kDualPipeV:
      return PlacementKind::kVShape;
    case ScheduleKind::kDualPipe:
      return PlacementKind::kBidirectional;
  }
  return PlacementKind::kLinear;
}

int64_t Plan::NumActions() const {
  int64_t n = 0;
  for (const std::vector<Action>& list : actions) n += static_cast<int64_t>(list.size());
  return n;
}

}  // namespace pipetrain::schedule
