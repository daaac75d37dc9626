#include "server/worker/chunk_routes.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace pipetrain::worker {

absl::StatusOr<ChunkRoutes> ChunkRoutes::TwoCopies(int num_chunks) {
  if (num_chunks < 2 || num_chunks % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "two copies of the stages need an even number of chunks >= 2, got ", num_chunks));
  }
  return ChunkRoutes(num_chunks, true);
}

int ChunkRoutes::OtherCopy(int chunk) const {
  if (!two_copies_) return -1;
  return IsDown(chunk) ? chunk + copy_chunks() : chunk - copy_chunks();
}

bool ChunkRoutes::OnRoute(int mb, int microbatches, int chunk) const {
  if (!two_copies_) return true;
  return IsDown(chunk) == (mb < microbatches / 2);
}

model::MicrobatchRange ChunkRoutes::Share(int chunk, int microbatches) const {
  if (!two_copies_) return {0, microbatches};
  const int half = microbatches / 2;
  return IsDown(chunk) ? model::MicrobatchRange{0, half}
                       : model::MicrobatchRange{half, microbatches};
}

int ChunkRoutes::FirstOf(int mb, int microbatches) const {
  return two_copies_ && mb >= microbatches / 2 ? copy_chunks() : 0;
}

}  // namespace pipetrain::worker
