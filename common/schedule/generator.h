// Schedule generators: GPipe, 1F1B, interleaved 1F1B, ZB-H1, ZB-V, DualPipeV, the overlap variants
// of 1F1B and interleaved, and bidirectional DualPipe.
//
// Each generator is a closed-form rule per rank (no search, no fallback to another kind), so the
// coordinator can compile a plan for any rank on the fly. Every plan produced for parameters that
// pass CheckScheduleParams() passes ValidatePlan(); tests/common/schedule/generator_test.cc proves
// it exhaustively for S in 1..8, M in 1..32, V in 1..4. docs/schedules.md states each rule.
//
// All functions are pure and thread-safe.
#ifndef PIPETRAIN_COMMON_SCHEDULE_GENERATOR_H_
#define PIPETRAIN_COMMON_SCHEDULE_GENERATOR_H_

#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/schedule/ir.h"

namespace pipetrain::schedule {

// What to generate.
struct ScheduleParams {
  ScheduleKind kind = ScheduleKind::kOneFOneB;
  int stages = 1;          // S >= 1: number of ranks.
  int microbatches = 1;    // M >= 1: micro-batches per training step.
  int virtual_stages = 1;  // V >= 1: chunks per rank; see DefaultVirtualStages().
};

// The V a kind uses when the user gives none: 2 for interleaved, interleaved-overlap, zb-v,
// dualpipe-v and dualpipe, else 1.
int DefaultVirtualStages(ScheduleKind kind);

// Largest S*V*M accepted: bounds the memory of plans and of their validation (about 32 bytes per
// (micro-batch, chunk)) and keeps the int32 fields of Action in range.
inline constexpr long long kMaxChunkMicrobatches = 1LL << 24;

// OK if the parameters describe a schedule of `kind`; otherwise INVALID_ARGUMENT stating the
// broken rule, e.g. "interleaved 1F1B needs microbatches (3) >= stages (4)". Rules:
//   all kinds:   S >= 1, M >= 1, V >= 1, S*V*M <= kMaxChunkMicrobatches.
//   gpipe, 1f1b, zb-h1: V == 1.
//   interleaved: V >= 2, M >= S and M a multiple of S (Megatron's micro-batch groups of S; a
//                partial last group deadlocks under in-order execution for some S, M, V).
//   zb-v:        V == 2.
//   dualpipe-v:  V == 2 and M >= 2S-1.
//   1f1b-overlap: V == 1.   interleaved-overlap: as interleaved.
//   dualpipe:    V == 2, S even, M even and M >= 2S-2.
absl::Status CheckScheduleParams(const ScheduleParams& params);

// OK if the workers can execute plans of `kind` bitwise equal to the reference: every kind now
// (dualpipe runs on two copies of the stages whose gradients are summed before each update,
// docs/schedules.md "DualPipe"). Kept as the one place a kind the workers cannot run would be
// refused (INVALID_ARGUMENT).
absl::Status CheckExecutable(ScheduleKind kind);

// The placement of the plan for `params`. Errors as CheckScheduleParams().
absl::StatusOr<Placement> PlacementFor(const ScheduleParams& params);

// The ordered actions of rank `worker`. INVALID_ARGUMENT if the parameters are invalid (see
// CheckScheduleParams) or `worker` is outside [0, S).
absl::StatusOr<std::vector<Action>> GenerateWorkerActions(const ScheduleParams& params, int worker);

// The whole plan (every rank's actions). Errors as CheckScheduleParams().
absl::StatusOr<Plan> GenerateSchedule(const ScheduleParams& params);

}  // namespace pipetrain::schedule

#endif  // PIPETRAIN_COMMON_SCHEDULE_GENERATOR_H_
