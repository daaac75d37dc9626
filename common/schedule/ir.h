// The schedule IR: per rank, an ordered list of compute actions on model chunks.
//
// A model is cut into S*V chunks numbered in model order (chunk 0 takes the input, chunk S*V-1
// computes the loss). A Placement says which of the S ranks holds which chunk. Communication is
// implied by the placement: the activation of (mb, c) goes to the owner of chunk c+1 and the input
// gradient of (mb, c) goes to the owner of chunk c-1. Sends never block; a rank runs its actions
// strictly in order and waits only for the inputs of its next action.
//
// All types here are plain values: copyable, no internal synchronisation (thread-compatible).
#ifndef PIPETRAIN_COMMON_SCHEDULE_IR_H_
#define PIPETRAIN_COMMON_SCHEDULE_IR_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pipetrain::schedule {

// What an action computes for one (micro-batch, chunk).
enum class Op : uint8_t {
  kForward,     // F: forward; stashes the activations the backward needs.
  kBackward,    // B: full backward (input gradient and weight gradient).
  kInputGrad,   // I: input gradient only (zero-bubble split of B).
  kWeightGrad,  // W: weight gradient only; needs the I of the same (mb, chunk) first.
};

// "F", "B", "I" or "W".
absl::string_view OpLetter(Op op);

// Parses "F", "B", "I" or "W" (upper case). INVALID_ARGUMENT otherwise.
absl::StatusOr<Op> ParseOp(absl::string_view letter);

// One compute step of a rank: run `op` for micro-batch `mb` on model chunk `chunk`.
struct Action {
  Op op = Op::kForward;
  int32_t mb = 0;
  int32_t chunk = 0;

  friend bool operator==(const Action& a, const Action& b) {
    return a.op == b.op && a.mb == b.mb && a.chunk == b.chunk;
  }
  friend bool operator!=(const Action& a, const Action& b) { return !(a == b); }
};

// "F(mb=3, chunk=1)".
std::string ActionToString(const Action& action);

// How chunks map to ranks.
enum class PlacementKind : uint8_t {
  kLinear,  // V = 1: chunk w on rank w.
  kLooped,  // any V: chunk c on rank c mod S (interleaved 1F1B).
  kVShape,  // V = 2: rank w holds chunks w and 2S-1-w (ZB-V, DualPipeV).
  // V = 2, two copies of an S-stage model: chunk c < S is stage c of the "down" copy on rank c,
  // chunk S+k is stage k of the "up" copy on rank S-1-k (so rank w holds chunks w and
  // 2S-1-w, as in the V-shape). The first half of the micro-batches runs down through chunks
  // 0..S-1, the second half up through chunks S..2S-1 (bidirectional DualPipe). A job on it
  // holds two copies of every stage, whose gradients are summed before each update.
  kBidirectional,
};

// "linear", "looped", "v-shape" or "bidirectional".
absl::string_view PlacementKindName(PlacementKind kind);

// Chunk-to-rank map of S ranks holding V chunks each. A plain value; members are public so
// that tests can build broken plans, and ValidatePlacement() says whether a value is usable.
struct Placement {
  PlacementKind kind = PlacementKind::kLinear;
  int stages = 1;          // S: number of ranks.
  int virtual_stages = 1;  // V: chunks per rank.

  int num_chunks() const { return stages * virtual_stages; }

  // Rank holding `chunk`. Precondition: ValidatePlacement() is OK and 0 <= chunk < num_chunks().
  int OwnerOf(int chunk) const;

  // Index of `chunk` among its owner's chunks in model order (0..V-1). Same precondition.
  int LocalIndexOf(int chunk) const;

  // Chunks held by rank `worker`, in model order. Precondition: 0 <= worker < stages.
  std::vector<int> ChunksOf(int worker) const;

  // The chunks micro-batch `mb` of `microbatches` runs through, in order: [begin, end). Every
  // chunk for all placements but the bidirectional one, which sends the first ceil(M/2)
  // micro-batches through the down copy [0, S) and the others through the up copy [S, 2S).
  // Precondition: ValidatePlacement() is OK and 0 <= mb < microbatches.
  int RouteBegin(int mb, int microbatches) const;
  int RouteEnd(int mb, int microbatches) const;
};

// Most chunks (S x V) a placement may have, so that num_chunks() and every chunk index fit in an
// int.
inline constexpr int64_t kMaxPlacementChunks = int64_t{1} << 24;

// OK if S >= 1, V >= 1, S x V <= kMaxPlacementChunks, linear has V == 1 and V-shape and
// bidirectional have V == 2; INVALID_ARGUMENT naming the broken rule otherwise.
absl::Status ValidatePlacement(const Placement& placement);

// Builds and validates a placement (see ValidatePlacement).
absl::StatusOr<Placement> MakePlacement(PlacementKind kind, int stages, int virtual_stages);

// Owner of `chunk`, with range checks: INVALID_ARGUMENT if the placement is invalid or the chunk is
// outside [0, S*V).
absl::StatusOr<int> CheckedOwnerOf(const Placement& placement, int chunk);

// The schedules this library generates.
enum class ScheduleKind : uint8_t {
  kGPipe,        // all forwards, then all backwards (ascending micro-batches).
  kOneFOneB,     // 1F1B: S-w-1 warm-up forwards, then alternate, then drain.
  kInterleaved,  // Megatron interleaved 1F1B on the looped placement.
  kZbH1,         // zero-bubble H1: B split into I and W, W deferred into the bubbles.
  kZbV,          // zero-bubble V on the V-shape placement.
  kDualPipeV,    // DeepSeek DualPipeV on the V-shape placement.
  // 1F1B with 2(S-w-1)+1 warm-up forwards; the steady state runs overlapped pairs (F of one
  // micro-batch, then B of another) so the B's input gradient arrives while the F computes.
  kOneFOneBOverlap,
  // Interleaved 1F1B with one more warm-up forward; the steady state runs overlapped (F, B) pairs.
  kInterleavedOverlap,
  // DeepSeek's bidirectional DualPipe on the bidirectional placement (two copies of the weights).
  kDualPipe,
};

// Every kind, in the order of the CLI's lists.
inline constexpr ScheduleKind kAllScheduleKinds[] = {ScheduleKind::kGPipe,
                                                     ScheduleKind::kOneFOneB,
                                                     ScheduleKind::kInterleaved,
                                                     ScheduleKind::kZbH1,
                                                     ScheduleKind::kZbV,
                                                     ScheduleKind::kDualPipeV,
                                                     ScheduleKind::kOneFOneBOverlap,
                                                     ScheduleKind::kInterleavedOverlap,
                                                     ScheduleKind::kDualPipe};

// CLI name: "gpipe", "1f1b", "interleaved", "zb-h1", "zb-v", "dualpipe-v", "1f1b-overlap",
// "interleaved-overlap" or "dualpipe".
absl::string_view ScheduleKindName(ScheduleKind kind);

// Parses a CLI name (see ScheduleKindName). INVALID_ARGUMENT listing the valid names otherwise.
absl::StatusOr<ScheduleKind> ParseScheduleKind(absl::string_view name);

// The placement a schedule kind runs on.
PlacementKind PlacementKindFor(ScheduleKind kind);

// A complete pipeline plan for one training step.
struct Plan {
  ScheduleKind kind = ScheduleKind::kOneFOneB;
  int microbatches = 0;                      // M.
  Placement placement;                       // S, V and the chunk map.
  std::vector<std::vector<Action>> actions;  // [rank][position], run in order.

  int stages() const { return placement.stages; }
  int virtual_stages() const { return placement.virtual_stages; }
  int num_chunks() const { return placement.num_chunks(); }
  // Total number of actions over all ranks.
  int64_t NumActions() const;
  // The chunks micro-batch `mb` runs through: see Placement::RouteBegin.
  int RouteBegin(int mb) const { return placement.RouteBegin(mb, microbatches); }
  int RouteEnd(int mb) const { return placement.RouteEnd(mb, microbatches); }
};

}  // namespace pipetrain::schedule

#endif  // PIPETRAIN_COMMON_SCHEDULE_IR_H_
