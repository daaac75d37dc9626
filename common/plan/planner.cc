#include "common/plan/planner.h"

#include <algorithm>
#include <cmath>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/partition/partitioner.h"
#include "common/schedule/generator.h"
#include "common/schedule/simulator.h"
#include "common/util/status_macros.h"

namespace pipetrain::plan {
namespace {

absl::Status CheckPlannerOptions(const PlannerOptions& o) {
  if (o.batch < 1)
    return absl::InvalidArgumentError(absl::StrCat("batch must be >= 1, got ", o.batch));
  if (o.workers.empty()) return absl::InvalidArgumentError("the planner needs at least one worker");
  for (const WorkerResources& w : o.workers) {
    if (!(w.gflops >= partition::kMinSpeed && w.gflops <= partition::kMaxSpeed)) {
      return absl::InvalidArgumentError(absl::StrCat("worker ", w.name, ": gflops must be in [",
                                                     partition::kMinSpeed, ", ",
                                                     partition::kMaxSpeed, "], got ", w.gflops));
    }
    if (!(w.memory_bytes >= 0 && w.memory_bytes <= partition::kMaxMemoryBytes)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "worker ", w.name, ": memory must be in [0, 2^53] bytes, got ", w.memory_bytes));
    }
  }
  if (o.max_virtual < 2 || o.max_virtual > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_virtual must be in [2, 64], got ", o.max_virtual));
  }
  const double bw = o.link.bytes_per_second;
  if (!(o.link.latency_seconds >= 0 && o.link.latency_seconds <= 1e6) ||
      !(bw == 0 || (bw >= schedule::kMinBandwidth && bw <= schedule::kMaxBandwidth)) ||
      !(o.link.cpu_seconds_per_message >= 0 && o.link.cpu_seconds_per_message <= 1e6)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "link latency and CPU per message must be in [0, 1e6] s and bandwidth 0 (infinite) or in "
        "[1e-3, 1e30] bytes/s, got ",
        o.link.latency_seconds, " s, ", o.link.cpu_seconds_per_message, " s and ", bw, " bytes/s"));
  }
  if (o.host_cpus < 0 || o.threads < 1) {
    return absl::InvalidArgumentError(absl::StrCat("host CPUs must be >= 0 and threads >= 1, got ",
                                                   o.host_cpus, " and ", o.threads));
  }
  if (!(o.step_overhead_seconds >= 0 && o.step_overhead_seconds <= 1e6)) {
    return absl::InvalidArgumentError(
        absl::StrCat("step overhead must be in [0, 1e6] s, got ", o.step_overhead_seconds));
  }
  return absl::OkStatus();
}

// Tensors chunk c's F and backward send or receive across ranks (or from the coordinator).
struct MessageCounts {
  int forward = 0;
  int backward = 0;
};

MessageCounts CountMessages(const schedule::Placement& placement, int c) {
  const int owner = placement.OwnerOf(c);
  const int last = placement.num_chunks() - 1;
  const bool remote_prev = c == 0 || placement.OwnerOf(c - 1) != owner;
  const bool remote_next = c < last && placement.OwnerOf(c + 1) != owner;
  MessageCounts n;
  n.forward = (remote_prev ? 1 : 0) + (remote_next ? 1 : 0) + (c == last ? 1 : 0);
  n.backward = (remote_next ? 1 : 0) + (c > 0 && remote_prev ? 1 : 0);
  return n;
}

// Chunk c's seconds at costs.gflops: from options.chunk_timer, else its layers' sums.
absl::StatusOr<ChunkSeconds> ChunkCost(const partition::Partition& cut, int c,
                                       const ModelCosts& costs, const PlannerOptions& options,
                                       int microbatches) {
  const int first = cut.boundaries[c];
  const int last = cut.boundaries[c + 1];
  if (options.chunk_timer) return options.chunk_timer(first, last, microbatches);
  ChunkSeconds sum;
  for (int l = first; l < last; ++l) {
    sum.forward += costs.layers[l].forward;
    sum.backward_input += costs.layers[l].backward_input;
    sum.backward_weight += costs.layers[l].backward_weight;
    sum.optimizer += costs.layers[l].optimizer;
  }
  return sum;
}

// The simulator's cost model of `cut` on the first S workers: each chunk's op seconds at its
// owner's speed, its stash and output bytes, the link, each rank's optimizer update first.
absl::StatusOr<schedule::CostModel> PlanCostModel(const partition::Partition& cut,
                                                  const ModelCosts& costs,
                                                  const PlannerOptions& options, int microbatches) {
  const schedule::Placement& placement = cut.placement;
  const double threads = static_cast<double>(placement.stages) * options.threads;
  const double share = options.host_cpus > 0 ? std::min(1.0, options.host_cpus / threads) : 1.0;
  schedule::CostModel model;
  model.worker_start.assign(placement.stages, 0.0);
  for (int c = 0; c < placement.num_chunks(); ++c) {
    const int owner = placement.OwnerOf(c);
    const double scale = costs.gflops / options.workers[owner].gflops / share;
    PT_ASSIGN_OR_RETURN(const ChunkSeconds seconds,
                        ChunkCost(cut, c, costs, options, microbatches));
    const MessageCounts messages = CountMessages(placement, c);
    const double cpu = options.link.cpu_seconds_per_message;
    schedule::OpCosts op{seconds.forward * scale + messages.forward * cpu, 0,
                         seconds.backward_input * scale + messages.backward * cpu,
                         seconds.backward_weight * scale};
    op.b = op.i + op.w;
    model.worker_start[owner] += seconds.optimizer * scale;
    double stash = 0;
    for (int l = cut.boundaries[c]; l < cut.boundaries[c + 1]; ++l) {
      stash += costs.layers[l].activation_bytes;
    }
    model.chunk_costs.push_back(op);
    model.activation_bytes.push_back(stash);
    model.boundary_bytes.push_back(costs.layers[cut.boundaries[c + 1] - 1].output_bytes);
  }
  model.link.latency = options.link.latency_seconds;
  model.link.bandwidth = options.link.bytes_per_second;
  return model;
}

// Fills the memory figures of `choice`: per rank, its layers' state and its peak stash.
void FillMemory(const partition::Partition& cut, const ModelCosts& costs,
                const schedule::TimelineStats& stats, const PlannerOptions& options,
                PlanChoice* choice) {
  const int S = cut.placement.stages;
  choice->peak_memory_bytes.assign(S, 0.0);
  for (int c = 0; c < cut.placement.num_chunks(); ++c) {
    for (int l = cut.boundaries[c]; l < cut.boundaries[c + 1]; ++l) {
      choice->peak_memory_bytes[cut.placement.OwnerOf(c)] += costs.layers[l].state_bytes;
    }
  }
  choice->fits_memory = true;
  for (int w = 0; w < S; ++w) {
    choice->peak_memory_bytes[w] += stats.workers[w].peak_activation_bytes;
    const double cap = options.workers[w].memory_bytes;
    if (cap > 0 && choice->peak_memory_bytes[w] > cap) choice->fits_memory = false;
  }
}

// The most memory a rank of `p` needs.
double PeakOf(const PlanChoice& p) {
  double peak = 0;
  for (double m : p.peak_memory_bytes) peak = std::max(peak, m);
  return peak;
}

// The virtual-stage counts to try for `kind`.
std::vector<int> VirtualChoices(schedule::ScheduleKind kind, int max_virtual) {
  const int v = schedule::DefaultVirtualStages(kind);
  if (schedule::PlacementKindFor(kind) != schedule::PlacementKind::kLooped) return {v};
  std::vector<int> out;
  for (int k = 2; k <= max_virtual; ++k) out.push_back(k);
  return out;
}

std::vector<schedule::ScheduleKind> KindsToTry(const PlannerOptions& options) {
  if (!options.kinds.empty()) return options.kinds;
  std::vector<schedule::ScheduleKind> kinds;
  for (schedule::ScheduleKind k : schedule::kAllScheduleKinds) {
    // dualpipe holds two copies of every weight: run only when asked for by name.
    if (schedule::CheckExecutable(k).ok() && k != schedule::ScheduleKind::kDualPipe) {
      kinds.push_back(k);
    }
  }
  return kinds;
}

// True if a plan of these parameters can run at all (the rules the coordinator checks).
bool Runnable(const schedule::ScheduleParams& p, int64_t layers) {
  return schedule::CheckScheduleParams(p).ok() && schedule::CheckExecutable(p.kind).ok() &&
         partition::CheckLayersCoverChunks(layers, p.stages, p.virtual_stages).ok();
}

}  // namespace

std::string PlanLabel(const PlanChoice& p) {
  return absl::StrCat(p.replicas, " replica", p.replicas == 1 ? "" : "s", " x ", p.stages,
                      p.stages == 1 ? " stage" : " stages", " x ", p.virtual_stages, " virtual, ",
                      schedule::ScheduleKindName(p.kind), ", ", p.microbatches, " micro-batches");
}

absl::StatusOr<PlanChoice> EvaluatePlan(const std::vector<double>& partition_costs,
                                        const ModelCosts& costs, const PlannerOptions& options,
                                        int stages, schedule::ScheduleKind kind, int virtual_stages,
                                        int microbatches) {
  PT_RETURN_IF_ERROR(CheckPlannerOptions(options));
  if (stages < 1 || stages > static_cast<int>(options.workers.size())) {
    return absl::InvalidArgumentError(absl::StrCat("a plan of ", stages, " stages needs ", stages,
                                                   " workers; there are ", options.workers.size()));
  }
  if (costs.layers.size() != partition_costs.size() || !(costs.gflops > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("costs for ", costs.layers.size(), " layers at ", costs.gflops,
                     " GFLOP/s do not match the model's ", partition_costs.size(), " layers"));
  }
  if (microbatches < 1 || options.batch % microbatches != 0 ||
      costs.samples * microbatches != options.batch) {
    return absl::InvalidArgumentError(
        absl::StrCat(microbatches, " micro-batches of ", costs.samples,
                     " samples do not make the batch of ", options.batch));
  }
  const schedule::ScheduleParams params{kind, stages, microbatches, virtual_stages};
  PT_RETURN_IF_ERROR(schedule::CheckExecutable(kind));
  PT_ASSIGN_OR_RETURN(schedule::Plan plan, schedule::GenerateSchedule(params));
  partition::PartitionOptions popts;
  popts.stages = stages;
  popts.placement = plan.placement.kind;
  popts.virtual_stages = virtual_stages;
  for (int w = 0; w < stages; ++w) popts.speeds.push_back(options.workers[w].gflops);
  PT_ASSIGN_OR_RETURN(partition::Partition cut, partition::PartitionLayers(partition_costs, popts));
  PT_ASSIGN_OR_RETURN(const schedule::CostModel cost_model,
                      PlanCostModel(cut, costs, options, microbatches));
  PT_ASSIGN_OR_RETURN(schedule::SimulationResult sim, schedule::Simulate(plan, cost_model));
  PlanChoice choice;
  choice.stages = stages;
  choice.kind = kind;
  choice.virtual_stages = virtual_stages;
  choice.microbatches = microbatches;
  choice.boundaries = cut.boundaries;
  choice.imbalance = cut.imbalance;
  choice.step_seconds = sim.stats.makespan + options.step_overhead_seconds;
  choice.samples_per_second =
      choice.step_seconds > 0 ? static_cast<double>(options.batch) / choice.step_seconds : 0;
  choice.bubble = sim.stats.bubble_fraction;
  FillMemory(cut, costs, sim.stats, options, &choice);
  return choice;
}

absl::StatusOr<std::vector<PlanChoice>> RankPlans(
    const std::vector<double>& partition_costs,
    const std::map<int, ModelCosts>& costs_by_microbatches, const PlannerOptions& options) {
  PT_RETURN_IF_ERROR(CheckPlannerOptions(options));
  const std::vector<schedule::ScheduleKind> kinds = KindsToTry(options);
  std::vector<std::pair<PlanChoice, int>> plans;  // with the kind's position, for ties.
  const int64_t layers = static_cast<int64_t>(partition_costs.size());
  for (const auto& [m, costs] : costs_by_microbatches) {
    for (int s = 1; s <= static_cast<int>(options.workers.size()); ++s) {
      for (size_t k = 0; k < kinds.size(); ++k) {
        for (int v : VirtualChoices(kinds[k], options.max_virtual)) {
          if (!Runnable({kinds[k], s, m, v}, layers)) continue;
          PT_ASSIGN_OR_RETURN(PlanChoice choice,
                              EvaluatePlan(partition_costs, costs, options, s, kinds[k], v, m));
          plans.emplace_back(std::move(choice), static_cast<int>(k));
        }
      }
    }
  }
  if (plans.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("no plan runs ", layers, " layers on ", options.workers.size(),
                     " workers with the micro-batch counts given"));
  }
  // Throughput rounded to 1e-8 relative, so that plans predicted equal tie-break by the simpler.
  auto rate = [](const PlanChoice& p) {
    return p.samples_per_second > 0 ? std::round(std::log(p.samples_per_second) * 1e8) : -1e300;
  };
  std::stable_sort(plans.begin(), plans.end(), [&](const auto& a, const auto& b) {
    const PlanChoice& x = a.first;
    const PlanChoice& y = b.first;
    const auto kx = std::make_tuple(!x.fits_memory, -rate(x), x.stages, PeakOf(x), x.microbatches,
                                    a.second, x.virtual_stages);
    const auto ky = std::make_tuple(!y.fits_memory, -rate(y), y.stages, PeakOf(y), y.microbatches,
                                    b.second, y.virtual_stages);
    return kx < ky;
  });
  std::vector<PlanChoice> out;
  for (auto& p : plans) out.push_back(std::move(p.first));
  return out;
}

}  // namespace pipetrain::plan
