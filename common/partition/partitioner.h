// Layer partitioning: cut a model's layers into S*V contiguous chunks placed on S ranks so that
// the slowest rank is as fast as possible.
//
// A rank's time is the sum of its chunks' layer costs divided by its speed, plus the transfer
// time of every cut between two of its chunks' neighbours on other ranks (optional). The
// objective is min over cuts of max over ranks of that time; the report adds the imbalance
// (max / mean rank time).
//
//  - Linear placement (V = 1): exact dynamic program over (rank, last layer), O(S*L^2); among the
//    optimal cuts it returns the one with the smallest sum of squared rank times.
//  - V-shape placement (V = 2, rank w holds chunks w and 2S-1-w, so its load is the sum of a
//    chunk near the input and a chunk near the loss): exact. Bisection on the bottleneck over the
//    64-bit patterns of doubles with a feasibility DP over the still-uncut middle range [a, b):
//    O(64*S*L^2) without memory caps, O(64*S*L^3) with them.
//  - Looped placement with V >= 2 (interleaved): the per-rank sum couples V non-adjacent
//    chunks. Start: the exact chunk-level min-max (each chunk at its owner's speed), improved by
//    single-layer boundary moves; then a depth-first branch and bound over the cuts (pruned by
//    memory, the incumbent and the perfectly balanced water level) with a budget of 2^21 nodes.
//    `proven_optimal` says whether the search finished (it does for small models; for large
//    ones the answer is the best cut found).
//
// Every number is bounded (the constants below; a real deployment stays far inside them): within
// the ranges every sum, quotient and square the searches form is finite, so no overflow to inf or
// NaN can steer a search or an index. Outside them the call is INVALID_ARGUMENT naming the value
// and its range.
//
// Pure functions; thread-safe.
#ifndef PIPETRAIN_COMMON_PARTITION_PARTITIONER_H_
#define PIPETRAIN_COMMON_PARTITION_PARTITIONER_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/schedule/ir.h"

namespace pipetrain::partition {

// A layer's cost (F+B+W FLOPs per micro-batch, or any unit): in [0, kMaxLayerCost].
inline constexpr double kMaxLayerCost = 1e30;
// A rank's speed (cost units per time unit; the coordinator passes GFLOP/s with costs in
// FLOPs): in [kMinSpeed, kMaxSpeed]. The low end admits the emulated slow workers of tests
// (stage_worker --emulate-gflops 0.0003).
inline constexpr double kMinSpeed = 1e-6;
inline constexpr double kMaxSpeed = 1e9;
// A layer's memory and a rank's memory cap, in bytes: in [0, kMaxMemoryBytes] = [0, 2^53]
// (9 PB), and the layers' memory together at most kMaxMemoryBytes too. Memory is counted in whole
// bytes: a layer's memory is rounded up and a cap down. Every sum and difference of byte counts
// below 2^53 is exact in a double, so a cut never exceeds a cap by rounding.
inline constexpr double kMaxMemoryBytes = 9007199254740992.0;
// A cut's transfer time (time units): in [0, kMaxBoundaryTime].
inline constexpr double kMaxBoundaryTime = 1e30;
// Most layers, and most chunks (stages x virtual stages; every chunk needs a layer).
inline constexpr int kMaxLayers = 1 << 16;

// OK if `layers` layers can be cut into `stages` x `virtual_stages` chunks: every chunk needs at
// least one layer. Otherwise INVALID_ARGUMENT saying what fits instead, e.g. "the model has 5
// layers, fewer than the 8 chunks of 4 stages x 2 virtual stages (every chunk needs a layer): use
// 2 stages or fewer, a schedule with one chunk per stage (gpipe, 1f1b, zb-h1; up to 5 stages), or
// a model with at least 8 layers". The one check of this rule: PartitionLayers, the coordinator's
// CreateJob (common/job) and the CLI's checks before a job starts all call it. Pure.
absl::Status CheckLayersCoverChunks(int64_t layers, int64_t stages, int64_t virtual_stages);

struct PartitionOptions {
  int stages = 1;  // S >= 1: ranks, in pipeline order (speeds and caps follow this order).
  schedule::PlacementKind placement = schedule::PlacementKind::kLinear;
  int virtual_stages = 1;  // V: chunks per rank (linear 1, V-shape 2, looped >= 1).
  // [rank] cost units per time unit, in [kMinSpeed, kMaxSpeed]. Empty: all 1.
  std::vector<double> speeds;
  // [layer] bytes, in [0, kMaxMemoryBytes]. Required with memory_caps.
  std::vector<double> layer_memory;
  std::vector<double> memory_caps;  // [rank] bytes, in [0, kMaxMemoryBytes]. Empty: no cap.
  // [cut after layer j, j in 0..L-2] time units to move the activation and its gradient across
  // that cut, in [0, kMaxBoundaryTime]; added to both ranks next to the cut when they differ.
  // Empty: free transfers.
  std::vector<double> boundary_times;
};

struct Partition {
  schedule::Placement placement;
  std::vector<int> boundaries;        // S*V+1 entries: chunk c holds layers [b[c], b[c+1]).
  std::vector<double> chunk_cost;     // [chunk] sum of its layer costs.
  std::vector<double> worker_cost;    // [rank] sum over its chunks.
  std::vector<double> worker_time;    // [rank] cost / speed + its boundary times.
  std::vector<double> worker_memory;  // [rank] sum of its layers' memory (0 without memory).
  double bottleneck = 0;              // max worker_time.
  int bottleneck_worker = 0;          // First rank reaching it.
  double imbalance = 1;               // bottleneck / mean worker_time (1 if all times are 0).
  bool proven_optimal = false;        // False only if the looped search ran out of budget.
};

// The best cut of `layer_costs` (per-layer cost, e.g. F+B+W FLOPs per micro-batch, in
// [0, kMaxLayerCost]) under `options`. Errors: INVALID_ARGUMENT for an empty cost list, a number
// outside its range (NaN and infinities included; the message names the value and the range), an
// invalid placement, fewer layers than chunks (every chunk needs a layer), option vectors of the
// wrong size, memory caps without layer memory; RESOURCE_EXHAUSTED if no cut fits the memory caps
// (the message says why when it can: a layer larger than every cap, or more memory than all
// caps), or if the exact V-shape search would be too large (S*L^2 > 6e7, or S*L^3 > 2e8 with
// memory caps). At most kMaxLayers layers.
absl::StatusOr<Partition> PartitionLayers(const std::vector<double>& layer_costs,
                                          const PartitionOptions& options);

// The figures of a given cut (`boundaries` as in Partition). Same argument checks as
// PartitionLayers plus: boundaries must start at 0, end at L and strictly increase. Memory caps
// are not enforced here (worker_memory reports the use); proven_optimal is false.
absl::StatusOr<Partition> EvaluatePartition(const std::vector<double>& layer_costs,
                                            const PartitionOptions& options,
                                            const std::vector<int>& boundaries);

}  // namespace pipetrain::partition

#endif  // PIPETRAIN_COMMON_PARTITION_PARTITIONER_H_
