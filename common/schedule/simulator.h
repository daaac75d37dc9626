// Timed simulation of a plan under the executor's model (see plan_execution.h): each rank runs
// its actions in order, an action starts when its rank is free and its inputs have arrived, and
// sends never block. Costs are per chunk and op (uniform, from FLOPs and rank speeds, or
// measured per action); a link adds latency + bytes / bandwidth to every message between chunks on
// different ranks. Pure functions; thread-safe.
//
// Every number of a cost model is bounded (the constants below; a real deployment stays far inside
// them): within the ranges every start, end and delay the simulation computes is finite. Outside
// them Simulate and CostModelFromFlops are INVALID_ARGUMENT naming the value and its range.
#ifndef PIPETRAIN_COMMON_SCHEDULE_SIMULATOR_H_
#define PIPETRAIN_COMMON_SCHEDULE_SIMULATOR_H_

#include <vector>

#include "absl/status/statusor.h"
#include "common/schedule/ir.h"
#include "common/schedule/timeline.h"

namespace pipetrain::schedule {

// Any time the simulator takes (a duration, a link latency, a rank's start, an output time), in
// time units: in [0, kMaxSimulatedTime] (kMaxSimulatedFlops / kMinFlopsPerTime).
inline constexpr double kMaxSimulatedTime = 1e33;
// Bytes (activation bytes, boundary bytes): in [0, kMaxSimulatedBytes].
inline constexpr double kMaxSimulatedBytes = 1e30;
// A link's bandwidth in bytes per time unit: 0 (infinite) or in [kMinBandwidth, kMaxBandwidth].
inline constexpr double kMinBandwidth = 1e-3;
inline constexpr double kMaxBandwidth = 1e30;
// CostModelFromFlops: FLOPs of one op in [0, kMaxSimulatedFlops]; rank speeds in FLOPs per time
// unit in [kMinFlopsPerTime, kMaxFlopsPerTime] (the partitioner's 1e-6 to 1e9 GFLOP/s are 1e3 to
// 1e18 FLOP/s).
inline constexpr double kMaxSimulatedFlops = 1e30;
inline constexpr double kMinFlopsPerTime = 1e-3;
inline constexpr double kMaxFlopsPerTime = 1e18;

// Durations (or FLOPs, see CostModelFromFlops) of the four ops for one micro-batch on one chunk.
// With a split backward, I and W are used; with a full backward, B. Usually b == i + w.
struct OpCosts {
  double f = 1;
  double b = 2;
  double i = 1;
  double w = 1;

  double Of(Op op) const;
};

// Point-to-point link between two ranks.
struct LinkModel {
  double latency = 0;  // Time units per message, in [0, kMaxSimulatedTime].
  // Bytes per time unit, in [kMinBandwidth, kMaxBandwidth]; 0 means infinite (no size-dependent
  // term).
  double bandwidth = 0;
};

// Everything the simulator charges.
struct CostModel {
  // [chunk]: durations of F, B, I, W of one micro-batch on the chunk's owner. Size S*V.
  std::vector<OpCosts> chunk_costs;
  // [chunk]: bytes stashed per micro-batch from F until B (or W). Empty: only counts are reported.
  std::vector<double> activation_bytes;
  // [chunk]: bytes of chunk c's output, sent to chunk c+1; its gradient, sent back, has the same
  // size. Entry S*V-1 is unused. Empty: messages cost only the link latency.
  std::vector<double> boundary_bytes;
  LinkModel link;
  // Optional, [chunk c]: the link chunk c's output crosses to chunk c + 1 and its gradient back
  // (between the two chunks' owners), instead of `link`. Size S*V; entry S*V-1 is unused. Empty:
  // `link` for every boundary. (A boundary within one rank costs nothing either way.)
  std::vector<LinkModel> boundary_links;
  // Optional measured durations, [rank][position] with the plan's shape; when non-empty they
  // replace chunk_costs (e.g. to replay a measured step through a different link model).
  std::vector<std::vector<double>> action_durations;
  // Optional, with action_durations: [rank][position] time after an action's start at which its
  // output (activation, input gradient) is available, at most its duration. Empty: at its end. (A
  // rank's fused B hands on the input gradient before it adds the weight gradients.)
  std::vector<std::vector<double>> action_output_times;
  // Optional: [rank] the earliest start of its first action, for work a rank does at the
  // start of a step before it (a deferred optimizer update). Empty: 0.
  std::vector<double> worker_start;
};

// Every chunk gets `per_stage` divided by V: `per_stage` is the cost of one rank's share of the
// model (1/S of it), so that plans with different V do the same total work. A bidirectional chunk
// is a whole stage (each micro-batch passes one of the two copies) and gets `per_stage`.
CostModel UniformCostModel(const Placement& placement, const OpCosts& per_stage);

// Chunk costs from FLOPs: chunk_costs[c] = chunk_flops[c] / worker_speed[owner(c)].
// `chunk_flops` has S*V entries (FLOPs of F, B, I, W per micro-batch, each in
// [0, kMaxSimulatedFlops]), `worker_speed` S entries, one per rank (FLOPs per time unit, in
// [kMinFlopsPerTime, kMaxFlopsPerTime]). INVALID_ARGUMENT on wrong sizes or a number outside its
// range (NaN and infinities included), naming it.
absl::StatusOr<CostModel> CostModelFromFlops(const Placement& placement,
                                             const std::vector<OpCosts>& chunk_flops,
                                             const std::vector<double>& worker_speed);

// A simulated step: the timeline (start/end of every action) and its figures.
struct SimulationResult {
  Timeline timeline;
  TimelineStats stats;
};

// Simulates `plan` under `costs`. INVALID_ARGUMENT if the plan fails CheckPlanStructure(), if it
// deadlocks (naming the blocked ranks and actions), or if the cost model's sizes do not match
// the plan or it holds a number outside its range (see the constants above; NaN and infinities
// included), naming it. O(number of actions).
absl::StatusOr<SimulationResult> Simulate(const Plan& plan, const CostModel& costs);

}  // namespace pipetrain::schedule

#endif  // PIPETRAIN_COMMON_SCHEDULE_SIMULATOR_H_
