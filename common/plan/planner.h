// The planner: every plan the workers can run for a batch, each cut by the exact partitioner and
// timed by the simulator on measured costs, checked against the workers' memory and ranked by
// predicted throughput (docs/scaling.md).
//
// A plan is (replicas, stages, schedule, virtual stages, micro-batches). R replicas of an S-stage
// pipeline use R x S workers (replica r the workers [r S, (r + 1) S)); each runs M / R of the
// step's M micro-batches, then the workers of each rank reduce their gradients over the replicas
// (JobSpec.replicas, docs/scaling.md "Replicas in plans"). Pure functions; thread-safe.
#ifndef PIPETRAIN_COMMON_PLAN_PLANNER_H_
#define PIPETRAIN_COMMON_PLAN_PLANNER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/plan/layer_costs.h"
#include "common/schedule/ir.h"

namespace pipetrain::plan {

// A worker plans may use, in the order the coordinator gives ranks (a plan of S stages uses the
// first S).
struct WorkerResources {
  std::string name;
  double gflops = 0;        // its registered speed, in [1e-6, 1e9].
  double memory_bytes = 0;  // what a plan may fill on it; 0: unknown (not checked).
};

// The link between two workers: a message of n bytes takes latency + n / bandwidth.
struct LinkCosts {
  double latency_seconds = 0;   // >= 0.
  double bytes_per_second = 0;  // 0: infinite, else in [1e-3, 1e30].
  // CPU seconds a worker spends on each tensor it sends or receives (its link threads share its
  // CPUs with the compute), charged to the op that sends or receives it: F for the input (from
  // the coordinator or the previous chunk's owner), the targets (last chunk) and the output; B or
  // I for the gradients. >= 0.
  double cpu_seconds_per_message = 0;
};

// The seconds of one micro-batch on each of one worker's chunks (their layer ranges, in chunk
// order) when a step has `microbatches` of them and the worker keeps up to `in_flight` of them
// in flight (in [1, kMaxTimedInFlight]), at the speed ModelCosts::gflops, [k] for chunks[k]: timed
// together, as the worker runs them (e.g. MeasureWorkerChunkSeconds, memoized).
using ChunkTimer = std::function<absl::StatusOr<std::vector<ChunkSeconds>>(
    const std::vector<LayerRange>& chunks, int microbatches, int in_flight)>;

struct PlannerOptions {
  int64_t batch = 0;                     // B, samples per step, >= 1.
  std::vector<WorkerResources> workers;  // N >= 1: plans have 1..N stages.
  // Schedules to consider; empty: every schedule the workers run (schedule::CheckExecutable) but
  // dualpipe, which holds two copies of every weight (it is run when asked for by name).
  std::vector<schedule::ScheduleKind> kinds;
  int max_virtual = 4;  // interleaved plans try V = 2..max_virtual (each chunk needs a layer).
  LinkCosts link;
  // Optional, [a][b] for workers[a] and workers[b] (N x N; the diagonal unused): the latency and
  // bandwidth of the link between the two, in place of `link`'s (the CPU per message stays
  // `link`'s: it is the workers' own). A message between two ranks crosses the worst of their
  // workers' links over the replicas (the highest latency, the lowest bandwidth, each direction);
  // a rank's reduction the worst between its replicas' workers. Empty: `link` everywhere.
  std::vector<std::vector<LinkCosts>> pair_links;
  // Per worker ([w] for workers[w]; empty: none), the model's per-layer seconds measured on it
  // (the coordinator's ProfileWorkers), by micro-batch samples (ModelCosts::samples), each with
  // the model's layer count. A chunk of layers [a, b) on worker w then takes, op by op, its
  // seconds in the planner's ModelCosts (or chunk timer) times (w's seconds for layers [a, b)) /
  // (the ModelCosts' seconds for them), instead of times ModelCosts::gflops / w's gflops. A
  // worker with no entry at a plan's micro-batch size is scaled by its gflops.
  std::vector<std::map<int64_t, ModelCosts>> measured;
  // Set: each chunk's seconds come from it (a worker's chunks timed together, as it runs them,
  // with as many micro-batches in flight as the plan keeps on the worker at its peak, InFlightOf,
  // at most kMaxTimedInFlight and as many as kMaxTimedStashBytes of their stashes hold, at least
  // one); unset: the sums of the layers' seconds in the ModelCosts.
  ChunkTimer chunk_timer;
  // > 0: the workers share one host of this many CPUs with the coordinator and the client
  // (`pipetrain local`): a plan of R x S workers runs R x S x threads compute threads, and where
  // that is more than host_cpus every worker computes at host_cpus / (R x S x threads) of its
  // speed; where it is host_cpus or more, the coordinator's and the client's CPU seconds of the
  // step (CoordinatorSeconds) come out of the workers' while they compute and add that share
  // (1 - the bubble) to the step. 0: every worker has CPUs of its own, and the coordinator and
  // the client others.
  int host_cpus = 0;
  int threads = 1;  // compute threads per worker, >= 1 (used with host_cpus).
  // Fixed seconds per step beyond the simulated pipeline (the coordinator's RunStep, StepDone
  // and Commit round trips), >= 0.
  double step_overhead_seconds = 0;
  // Replica counts RankPlans tries: the powers of two R <= max_replicas with R x S <= workers
  // that the step's gradient tree supports (model::GradTree::SupportsReplicas), in [1, 2^20].
  int max_replicas = 1;
  // True: each plan is cut by LayerPartitionCosts of its own ModelCosts (the measured seconds of
  // each layer, what `--plan auto` sends as JobSpec.layer_costs and the coordinator then cuts
  // by); false: by `partition_costs` (the coordinator's default: FLOPs).
  bool partition_by_layer_costs = false;
};

// What a plan is cut by when PlannerOptions::partition_by_layer_costs is set: per layer, the
// nanoseconds of its F + I + W for one micro-batch at costs.gflops (a unit that keeps the
// partitioner's numbers well above its tolerance). Pure.
std::vector<double> LayerPartitionCosts(const ModelCosts& costs);

// One plan and what the planner predicts for it.
struct PlanChoice {
  int replicas = 1;
  int stages = 1;
  schedule::ScheduleKind kind = schedule::ScheduleKind::kOneFOneB;
  int virtual_stages = 1;
  int microbatches = 1;
  std::vector<int> boundaries;  // the partitioner's cut (S*V+1 layer indices).
  // What the cut was made by when partition_by_layer_costs (JobSpec.layer_costs), else empty.
  std::vector<double> layer_costs;
  double imbalance = 1;     // the cut's max/mean worker time (as the coordinator reports).
  double step_seconds = 0;  // simulated step (incl. optimizer updates) + overhead.
  double samples_per_second = 0;
  double bubble = 0;  // the simulated step's bubble fraction.
  // The slowest rank's gradient reduction over the replicas (0 for one replica); part of the step.
  double reduction_seconds = 0;
  // The coordinator's and the client's CPU seconds the step waits for (PlannerOptions::host_cpus;
  // 0 when they have CPUs of their own); part of the step.
  double coordinator_seconds = 0;
  std::vector<double> peak_memory_bytes;  // [rank] state + peak stashed activations.
  bool fits_memory = true;                // every rank's peak within its worker's memory.
};

// The CPU seconds the coordinator and the client spend on one step of `microbatches` over
// `workers` (R x S) workers at `cpu_seconds_per_message` per tensor end: the step's inputs and
// targets fed (2 M), RunStep, StepDone and Commit with each worker (3 R S), and the client's
// TrainStep request and answer at both ends (4). Pure.
double CoordinatorSeconds(int microbatches, int workers, double cpu_seconds_per_message);

// The most bytes of stashed activations a chunk timer is asked to hold at once (1 GiB).
inline constexpr double kMaxTimedStashBytes = double{1 << 30};

// Per rank of `plan`, the most micro-batches it keeps in flight at once: the peak count of
// (micro-batch, chunk) states alive (from F to the W, or B, that ends them) over the chunks it
// holds, rounded up; at least 1. Pure.
std::vector<int> InFlightOf(const schedule::Plan& plan);

// "4 stages x 2 virtual, interleaved, 8 micro-batches" style label for messages.
std::string PlanLabel(const PlanChoice& plan);

// The prediction for one plan of `replicas` x `stages` workers and a step of `microbatches`
// micro-batches (each replica runs microbatches / replicas of them). `partition_costs` ([layer],
// what the coordinator cuts by: F+B+W FLOPs of one sample, model::Model::LayerFlops(1); or
// LayerPartitionCosts(costs) with options.partition_by_layer_costs) and replica 0's workers'
// speeds give the cut the coordinator will make; `costs` (micro-batches of batch / microbatches
// samples) give each op's seconds at a worker of speed s as seconds * costs.gflops / s, or as
// scaled by the worker's measured seconds (PlannerOptions::measured), where a rank runs as slow
// (and with as little memory) as its slowest replica's worker, op by op; the optimizer update runs
// at the start of the step, and every message between workers crosses options.link. With R > 1
// replicas, each rank reduces its layers' gradient bytes G after its last action, by recursive
// halving/doubling: 2 log2 R rounds, each the link's latency and, per chunk the rank holds (per
// 4 MiB segment of it), a message sent and one received at the message CPU; and
// 2 (R - 1) / R x G bytes over its bandwidth. Each worker's RunStep, StepDone and Commit cost it
// the message CPU after its last action; the step ends with the last rank's; then
// coordinator_seconds (PlannerOptions::host_cpus) and options.step_overhead_seconds.
// Errors: INVALID_ARGUMENT for a plan the workers cannot run or numbers out of range (naming
// them), those of partition::PartitionLayers and schedule::Simulate.
absl::StatusOr<PlanChoice> EvaluatePlan(const std::vector<double>& partition_costs,
                                        const ModelCosts& costs, const PlannerOptions& options,
                                        int stages, schedule::ScheduleKind kind, int virtual_stages,
                                        int microbatches, int replicas = 1);

// Every plan of R replicas (options.max_replicas) x 1..N/R stages, options.kinds (virtual stages:
// the kind's, 2..max_virtual for interleaved ones) and micro-batch counts M among the keys of
// `costs_by_microbatches` (each dividing the batch), best first: plans that fit memory before
// those that do not, then higher predicted samples/s, then fewer workers, fewer stages, less peak
// memory, fewer micro-batches, the kinds' order. Plans a rule refuses (e.g. interleaved with M / R
// not a multiple of S, more chunks than layers, R not supported by M's gradient tree) are left
// out. INVALID_ARGUMENT for bad options, an M that does not divide the batch or costs of the
// wrong size; FAILED_PRECONDITION if no plan is possible.
absl::StatusOr<std::vector<PlanChoice>> RankPlans(
    const std::vector<double>& partition_costs,
    const std::map<int, ModelCosts>& costs_by_microbatches, const PlannerOptions& options);

}  // namespace pipetrain::plan

#endif  // PIPETRAIN_COMMON_PLAN_PLANNER_H_
