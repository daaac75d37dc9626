// Where a job's checkpoints go, as the coordinator checks it: which two checkpoint directories a
// save into one would touch in the other (one writer per directory, docs/checkpoints.md), and the
// client's data position a checkpoint's manifest carries (CheckpointRequest.data_position).
#ifndef PIPETRAIN_SERVER_COORDINATOR_SAVE_TARGET_H_
#define PIPETRAIN_SERVER_COORDINATOR_SAVE_TARGET_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "common/model/checkpoint.h"
#include "pipetrain/v1/coordinator.pb.h"

namespace pipetrain::coordinator {

// How a save into `path` would touch the files of a save into `held` (both normalised absolute
// paths, as io::ConfinePath returns them): "" if it would not; otherwise the words that say how,
// to follow the path in a message — "is", "lies inside", "holds" (`held` lies inside `path`),
// "is a kept checkpoint or staging directory of" (`path` is "HELD.step-…" or "HELD.tmp-…") or
// "has a kept checkpoint or staging directory at" (the other way round). A save replaces its
// directory whole and keeps earlier checkpoints beside it, so each of these would let one job's
// save delete or replace another's files. Pure; thread-safe.
std::string CheckpointOverlap(absl::string_view path, absl::string_view held);

// OK if every count of `position` lies in [0, 2^53) (what a manifest can hold); INVALID_ARGUMENT
// naming the field "data_position.FIELD" otherwise. Pure.
absl::Status CheckDataPosition(const v1::DataPosition& position);

// Writes `position` into the manifest's data, batch_size and data_cursor. Pure.
void ApplyDataPosition(const v1::DataPosition& position, model::CheckpointManifest* manifest);

}  // namespace pipetrain::coordinator

#endif  // PIPETRAIN_SERVER_COORDINATOR_SAVE_TARGET_H_
