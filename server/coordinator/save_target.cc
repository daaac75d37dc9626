#include "server/coordinator/save_target.h"

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace pipetrain::coordinator {
namespace {

// Whether `path` lies strictly inside the directory `dir`.
bool Inside(absl::string_view path, absl::string_view dir) {
  if (dir == "/") return path.size() > 1;
  return path.size() > dir.size() && absl::StartsWith(path, dir) && path[dir.size()] == '/';
}

// Whether `path` is a sibling a save into `dir` writes: "DIR.step-…" (a kept checkpoint) or
// "DIR.tmp-…" (its staging directory).
bool Sibling(absl::string_view path, absl::string_view dir) {
  if (!absl::StartsWith(path, dir)) return false;
  absl::string_view rest = path.substr(dir.size());
  return absl::StartsWith(rest, ".step-") || absl::StartsWith(rest, ".tmp-");
}

}  // namespace

std::string CheckpointOverlap(absl::string_view path, absl::string_view held) {
  if (path == held) return "is";
  if (Inside(path, held)) return "lies inside";
  if (Inside(held, path)) return "holds";
  if (Sibling(path, held)) return "is a kept checkpoint or staging directory of";
  if (Sibling(held, path)) return "has a kept checkpoint or staging directory at";
  return "";
}

absl::Status CheckDataPosition(const v1::DataPosition& position) {
  const std::pair<const char*, int64_t> counts[] = {{"batch_size", position.batch_size()},
                                                    {"cursor_epoch", position.cursor_epoch()},
                                                    {"cursor_batch", position.cursor_batch()}};
  for (const auto& [field, value] : counts) {
    if (value < 0 || value >= model::kMaxManifestCount) {
      return absl::InvalidArgumentError(
          absl::StrCat("Checkpoint: data_position.", field, " must be in [0, 2^53), got ", value));
    }
  }
  return absl::OkStatus();
}

void ApplyDataPosition(const v1::DataPosition& position, model::CheckpointManifest* manifest) {
  manifest->data = position.data();
  manifest->batch_size = position.batch_size();
  manifest->data_cursor.epoch = position.cursor_epoch();
  manifest->data_cursor.batch = position.cursor_batch();
}

}  // namespace pipetrain::coordinator
