// ChunkRoutes: which chunks a micro-batch runs through, as a stage worker sees its job's chunks.
//
// A job's model is cut into C chunks. Usually one copy of the model: every micro-batch runs
// through chunks 0..C-1, chunk 0 takes the input and chunk C-1 computes the loss. Under the
// bidirectional DualPipe schedule (schedule::PlacementKind::kBidirectional) the C = 2S chunks are
// two copies of S stages: chunk c < S is stage c of the "down" copy, chunk S + k is stage k of the
// "up" copy (the same layers as chunk k). The first half of a step's M micro-batches, [0, M/2),
// runs down through chunks 0..S-1, the second half, [M/2, M), up through chunks S..2S-1; each copy
// adds the weight gradients of its half (its share, a node of the step's gradient tree
// model::GradTree), and the two copies of a stage sum their shares before the update
// (docs/schedules.md, "DualPipe").
//
// A plain value: copyable, thread-compatible.
#ifndef PIPETRAIN_SERVER_WORKER_CHUNK_ROUTES_H_
#define PIPETRAIN_SERVER_WORKER_CHUNK_ROUTES_H_

#include "absl/status/statusor.h"
#include "common/model/grad_tree.h"

namespace pipetrain::worker {

class ChunkRoutes {
 public:
  // One copy of the model in `num_chunks` (>= 1) chunks.
  static ChunkRoutes OneCopy(int num_chunks) { return ChunkRoutes(num_chunks, false); }
  // Two copies of `num_chunks` / 2 stages. INVALID_ARGUMENT unless num_chunks is even and >= 2.
  static absl::StatusOr<ChunkRoutes> TwoCopies(int num_chunks);

  int num_chunks() const { return num_chunks_; }
  bool two_copies() const { return two_copies_; }
  // Chunks of one copy: C, or S = C / 2 with two copies.
  int copy_chunks() const { return two_copies_ ? num_chunks_ / 2 : num_chunks_; }
  // The stage a chunk runs: its index within its copy (chunk mod S with two copies).
  int StageOf(int chunk) const { return two_copies_ ? chunk % copy_chunks() : chunk; }
  // Whether `chunk` is in the down copy (always, with one copy).
  bool IsDown(int chunk) const { return chunk < copy_chunks(); }
  // The same stage's chunk in the other copy, or -1 with one copy.
  int OtherCopy(int chunk) const;
  // Whether `chunk` takes its micro-batches' model inputs (kInput): chunk 0, and chunk S.
  bool IsFirst(int chunk) const { return StageOf(chunk) == 0; }
  // Whether `chunk` computes the loss (takes kTarget): chunk C-1, and chunk S-1.
  bool IsLast(int chunk) const { return StageOf(chunk) == copy_chunks() - 1; }
  // Whether micro-batch `mb` of a step of `microbatches` runs through `chunk`.
  bool OnRoute(int mb, int microbatches, int chunk) const;
  // The micro-batches of a step of `microbatches` that run through `chunk`: [0, M), or the
  // copy's half [0, M/2) / [M/2, M).
  model::MicrobatchRange Share(int chunk, int microbatches) const;
  // The chunk that takes micro-batch `mb`'s input, and the one that computes its loss.
  int FirstOf(int mb, int microbatches) const;
  int LastOf(int mb, int microbatches) const {
    return FirstOf(mb, microbatches) + copy_chunks() - 1;
  }

 private:
  ChunkRoutes(int num_chunks, bool two_copies) : num_chunks_(num_chunks), two_copies_(two_copies) {}

  int num_chunks_;
  bool two_copies_;
};

}  // namespace pipetrain::worker

#endif  // PIPETRAIN_SERVER_WORKER_CHUNK_ROUTES_H_
