#include "common/plan/planner.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/model/grad_tree.h"
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
  if (!o.measured.empty() && o.measured.size() != o.workers.size()) {
    return absl::InvalidArgumentError(absl::StrCat("measured costs for ", o.measured.size(),
                                                   " workers; there are ", o.workers.size()));
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
  if (!o.pair_links.empty()) {
    const size_t n = o.workers.size();
    if (o.pair_links.size() != n) {
      return absl::InvalidArgumentError(
          absl::StrCat("pair links for ", o.pair_links.size(), " workers; there are ", n));
    }
    for (size_t a = 0; a < n; ++a) {
      if (o.pair_links[a].size() != n) {
        return absl::InvalidArgumentError(absl::StrCat("pair links of worker ", o.workers[a].name,
                                                       ": ", o.pair_links[a].size(),
                                                       " entries; there are ", n, " workers"));
      }
      for (size_t b = 0; b < n; ++b) {
        const LinkCosts& l = o.pair_links[a][b];
        const double pbw = l.bytes_per_second;
        if (a != b &&
            (!(l.latency_seconds >= 0 && l.latency_seconds <= 1e6) ||
             !(pbw == 0 || (pbw >= schedule::kMinBandwidth && pbw <= schedule::kMaxBandwidth)))) {
          return absl::InvalidArgumentError(absl::StrCat(
              "the link from ", o.workers[a].name, " to ", o.workers[b].name,
              ": latency must be in [0, 1e6] s and bandwidth 0 (infinite) or in [1e-3, 1e30] "
              "bytes/s, got ",
              l.latency_seconds, " s and ", pbw, " bytes/s"));
        }
      }
    }
  }
  if (o.host_cpus < 0 || o.threads < 1) {
    return absl::InvalidArgumentError(absl::StrCat("host CPUs must be >= 0 and threads >= 1, got ",
                                                   o.host_cpus, " and ", o.threads));
  }
  if (!(o.step_overhead_seconds >= 0 && o.step_overhead_seconds <= 1e6)) {
    return absl::InvalidArgumentError(
        absl::StrCat("step overhead must be in [0, 1e6] s, got ", o.step_overhead_seconds));
  }
  if (o.max_replicas < 1 || o.max_replicas > (1 << 20)) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_replicas must be in [1, 2^20], got ", o.max_replicas));
  }
  return absl::OkStatus();
}

// `a` with `b`'s latency and bandwidth where they are worse (higher; lower, 0 being infinite).
void Worsen(LinkCosts* a, const LinkCosts& b) {
  a->latency_seconds = std::max(a->latency_seconds, b.latency_seconds);
  if (b.bytes_per_second > 0) {
    a->bytes_per_second = a->bytes_per_second > 0
                              ? std::min(a->bytes_per_second, b.bytes_per_second)
                              : b.bytes_per_second;
  }
}

// The link between ranks `x` and `y` (x != y) of `replicas` x `stages` workers: options.link, or
// with pair links the worst of their workers' links (both directions) over the replicas.
LinkCosts RankLink(const PlannerOptions& options, int stages, int replicas, int x, int y) {
  if (options.pair_links.empty()) return options.link;
  LinkCosts out{0, 0, options.link.cpu_seconds_per_message};
  for (int r = 0; r < replicas; ++r) {
    Worsen(&out, options.pair_links[r * stages + x][r * stages + y]);
    Worsen(&out, options.pair_links[r * stages + y][r * stages + x]);
  }
  return out;
}

// The link a rank's reduction crosses: options.link, or with pair links the worst between the
// rank's workers of different replicas.
LinkCosts ReductionLink(const PlannerOptions& options, int stages, int replicas, int rank) {
  if (options.pair_links.empty()) return options.link;
  LinkCosts out{0, 0, options.link.cpu_seconds_per_message};
  for (int r = 0; r < replicas; ++r) {
    for (int q = 0; q < replicas; ++q) {
      if (q != r) Worsen(&out, options.pair_links[r * stages + rank][q * stages + rank]);
    }
  }
  return out;
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

// The sums of layers [first, last)'s seconds in `costs`.
ChunkSeconds SumLayers(const ModelCosts& costs, int first, int last) {
  ChunkSeconds sum;
  for (int l = first; l < last; ++l) {
    sum.forward += costs.layers[l].forward;
    sum.backward_input += costs.layers[l].backward_input;
    sum.backward_weight += costs.layers[l].backward_weight;
    sum.optimizer += costs.layers[l].optimizer;
  }
  return sum;
}

// Chunk c's seconds at costs.gflops: from options.chunk_timer (given the chunks c's owner holds
// and the micro-batches it keeps in flight), else its layers' sums.
absl::StatusOr<ChunkSeconds> ChunkCost(const partition::Partition& cut, int c,
                                       const ModelCosts& costs, const PlannerOptions& options,
                                       int microbatches, int in_flight) {
  if (options.chunk_timer) {
    const schedule::Placement& placement = cut.placement;
    std::vector<LayerRange> held;
    size_t index = 0;
    for (int k = 0; k < placement.num_chunks(); ++k) {
      if (placement.OwnerOf(k) != placement.OwnerOf(c)) continue;
      if (k == c) index = held.size();
      held.push_back({cut.boundaries[k], cut.boundaries[k + 1]});
    }
    // At most kMaxTimedInFlight micro-batches, and no more than kMaxTimedStashBytes of their
    // stashes: the timer allocates them all.
    double stash = 0;
    for (const LayerRange& r : held) {
      for (int64_t l = r.first; l < r.last; ++l) stash += costs.layers[l].activation_bytes;
    }
    int timed = std::min(in_flight, kMaxTimedInFlight);
    if (stash > 0) {
      timed = static_cast<int>(std::max(1.0, std::min<double>(timed, kMaxTimedStashBytes / stash)));
    }
    PT_ASSIGN_OR_RETURN(std::vector<ChunkSeconds> seconds,
                        options.chunk_timer(held, microbatches, timed));
    if (seconds.size() != held.size()) {
      return absl::InternalError(absl::StrCat("the chunk timer gave ", seconds.size(),
                                              " figures for ", held.size(), " chunks"));
    }
    return seconds[index];
  }
  return SumLayers(costs, cut.boundaries[c], cut.boundaries[c + 1]);
}

// How many times its seconds in the ModelCosts one op of a chunk takes on a rank.
struct OpScales {
  double forward = 1;
  double backward_input = 1;
  double backward_weight = 1;
  double optimizer = 1;
};

// `there` / `here` when both are > 0, else `fallback`.
double Ratio(double there, double here, double fallback) {
  return there > 0 && here > 0 ? there / here : fallback;
}

// The scales of layers [first, last) on worker `w` of `options`, for `costs` (at costs.gflops):
// per op, w's measured seconds at costs.samples over costs' (for an op without seconds in
// either, the ratio of all four ops' sums), or costs.gflops / w's gflops when w has no
// measurement at that size. INVALID_ARGUMENT for a measurement of another layer count.
absl::StatusOr<OpScales> ScalesOn(const PlannerOptions& options, int worker,
                                  const ModelCosts& costs, int first, int last) {
  const WorkerResources& w = options.workers[worker];
  const double by_speed = costs.gflops / w.gflops;
  if (options.measured.empty()) return OpScales{by_speed, by_speed, by_speed, by_speed};
  const std::map<int64_t, ModelCosts>& measured = options.measured[worker];
  const auto it = measured.find(costs.samples);
  if (it == measured.end()) return OpScales{by_speed, by_speed, by_speed, by_speed};
  if (it->second.layers.size() != costs.layers.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("worker ", w.name, ": measured costs at ", costs.samples, " samples have ",
                     it->second.layers.size(), " layers; the model has ", costs.layers.size()));
  }
  const ChunkSeconds here = SumLayers(costs, first, last);
  const ChunkSeconds there = SumLayers(it->second, first, last);
  auto total = [](const ChunkSeconds& x) {
    return x.forward + x.backward_input + x.backward_weight + x.optimizer;
  };
  const double overall = Ratio(total(there), total(here), by_speed);
  return OpScales{Ratio(there.forward, here.forward, overall),
                  Ratio(there.backward_input, here.backward_input, overall),
                  Ratio(there.backward_weight, here.backward_weight, overall),
                  Ratio(there.optimizer, here.optimizer, overall)};
}

// The scales of layers [first, last) on rank `rank` of `replicas` x `stages`: the largest of its
// replicas' workers (replica r's are [r S, (r + 1) S)), op by op.
absl::StatusOr<OpScales> RankScales(const PlannerOptions& options, const ModelCosts& costs,
                                    int stages, int replicas, int rank, int first, int last) {
  OpScales out{0, 0, 0, 0};
  for (int r = 0; r < replicas; ++r) {
    PT_ASSIGN_OR_RETURN(const OpScales s, ScalesOn(options, r * stages + rank, costs, first, last));
    out.forward = std::max(out.forward, s.forward);
    out.backward_input = std::max(out.backward_input, s.backward_input);
    out.backward_weight = std::max(out.backward_weight, s.backward_weight);
    out.optimizer = std::max(out.optimizer, s.optimizer);
  }
  return out;
}

// The simulator's cost model of `cut` on the first R x S workers: each chunk's op seconds on
// its owner (RankScales), its stash and output bytes, the link, each rank's optimizer update
// first.
absl::StatusOr<schedule::CostModel> PlanCostModel(const partition::Partition& cut,
                                                  const ModelCosts& costs,
                                                  const PlannerOptions& options, int microbatches,
                                                  int replicas, const std::vector<int>& in_flight) {
  const schedule::Placement& placement = cut.placement;
  const double threads = static_cast<double>(placement.stages) * replicas * options.threads;
  const double share = options.host_cpus > 0 ? std::min(1.0, options.host_cpus / threads) : 1.0;
  schedule::CostModel model;
  model.worker_start.assign(placement.stages, 0.0);
  for (int c = 0; c < placement.num_chunks(); ++c) {
    const int owner = placement.OwnerOf(c);
    PT_ASSIGN_OR_RETURN(const OpScales scale,
                        RankScales(options, costs, placement.stages, replicas, owner,
                                   cut.boundaries[c], cut.boundaries[c + 1]));
    PT_ASSIGN_OR_RETURN(const ChunkSeconds seconds,
                        ChunkCost(cut, c, costs, options, microbatches, in_flight[owner]));
    const MessageCounts messages = CountMessages(placement, c);
    const double cpu = options.link.cpu_seconds_per_message;
    schedule::OpCosts op{
        seconds.forward * scale.forward / share + messages.forward * cpu, 0,
        seconds.backward_input * scale.backward_input / share + messages.backward * cpu,
        seconds.backward_weight * scale.backward_weight / share};
    op.b = op.i + op.w;
    model.worker_start[owner] += seconds.optimizer * scale.optimizer / share;
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
  if (!options.pair_links.empty()) {
    for (int c = 0; c < placement.num_chunks(); ++c) {
      const int from = placement.OwnerOf(c);
      const int to = c + 1 < placement.num_chunks() ? placement.OwnerOf(c + 1) : from;
      const LinkCosts link =
          from == to ? LinkCosts{} : RankLink(options, placement.stages, replicas, from, to);
      model.boundary_links.push_back({link.latency_seconds, link.bytes_per_second});
    }
  }
  return model;
}

// Fills the memory figures of `choice`: per rank, its layers' state and its peak stash.
void FillMemory(const partition::Partition& cut, const ModelCosts& costs,
                const schedule::TimelineStats& stats, const std::vector<WorkerResources>& ranks,
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
    const double cap = ranks[w].memory_bytes;
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

// Rank k of a plan of `replicas` x `stages`: the slowest speed and the least memory (0: unknown)
// among the workers holding rank k in the replicas (replica r's are [r S, (r + 1) S)); no
// measurements (RankScales reads them).
std::vector<WorkerResources> RankResources(const PlannerOptions& options, int stages,
                                           int replicas) {
  std::vector<WorkerResources> ranks;
  for (int k = 0; k < stages; ++k) {
    const WorkerResources& w = options.workers[k];
    ranks.push_back({w.name, w.gflops, w.memory_bytes});
  }
  for (int r = 1; r < replicas; ++r) {
    for (int k = 0; k < stages; ++k) {
      const WorkerResources& w = options.workers[r * stages + k];
      ranks[k].gflops = std::min(ranks[k].gflops, w.gflops);
      if (w.memory_bytes > 0 &&
          (ranks[k].memory_bytes == 0 || w.memory_bytes < ranks[k].memory_bytes)) {
        ranks[k].memory_bytes = w.memory_bytes;
      }
    }
  }
  return ranks;
}

// INVALID_ARGUMENT unless `replicas` x `stages` workers exist and the gradient tree of a step of
// `microbatches` supports `replicas` (a power of two dividing M's largest power-of-two factor).
absl::Status CheckReplicas(const PlannerOptions& options, int stages, int microbatches,
                           int replicas) {
  if (replicas < 1 || stages < 1 ||
      static_cast<int64_t>(replicas) * stages > static_cast<int64_t>(options.workers.size())) {
    return absl::InvalidArgumentError(absl::StrCat("a plan of ", replicas, " replicas x ", stages,
                                                   " stages needs that many workers; there are ",
                                                   options.workers.size()));
  }
  PT_ASSIGN_OR_RETURN(const model::GradTree tree, model::GradTree::Create(microbatches));
  if (!tree.SupportsReplicas(replicas)) {
    return absl::InvalidArgumentError(
        absl::StrCat(replicas, " replicas cannot share a step of ", microbatches,
                     " micro-batches (a power of two up to ", tree.leaves(), " can)"));
  }
  return absl::OkStatus();
}

// Most bytes of one message of the replicas' reduction: the worker's segments of 2^20 floats
// (worker::kReplicaSegmentFloats).
constexpr double kReductionSegmentBytes = 4.0 * (1 << 20);

// The seconds a rank's workers take to reduce their chunks' gradients (`chunk_bytes`, one entry
// per chunk the rank holds) over `replicas` by recursive halving/doubling: each chunk's
// gradient travels in segments of at most kReductionSegmentBytes, every segment through
// 2 log2 R rounds of one message sent and one received (each the link's message CPU); the rounds'
// latencies (once per round: the segments are pipelined) and 2 (R - 1) / R of the bytes over the
// link's bandwidth.
double ReductionSeconds(const std::vector<double>& chunk_bytes, int replicas,
                        const LinkCosts& link) {
  if (replicas <= 1) return 0;
  const double rounds = 2 * std::log2(static_cast<double>(replicas));
  double bytes = 0;
  double segments = 0;
  for (const double b : chunk_bytes) {
    bytes += b;
    segments += std::max(1.0, std::ceil(b / kReductionSegmentBytes));
  }
  const double volume = 2.0 * (replicas - 1) / replicas * bytes;
  return rounds * (link.latency_seconds + 2 * segments * link.cpu_seconds_per_message) +
         (link.bytes_per_second > 0 ? volume / link.bytes_per_second : 0);
}

// Messages every worker exchanges with the coordinator in a step: RunStep, StepDone, Commit.
constexpr int kControlMessagesPerStep = 3;

// The end of the step on the ranks of `cut`: each rank's last action (or its optimizer update)
// followed by its gradients' reduction over the replicas and its control messages' CPU; the
// largest such reduction goes to *reduction.
double StepEnd(const partition::Partition& cut, const ModelCosts& costs,
               const schedule::SimulationResult& sim, const schedule::CostModel& model,
               const PlannerOptions& options, int replicas, double* reduction) {
  const int S = cut.placement.stages;
  std::vector<std::vector<double>> chunk_bytes(S);
  for (int c = 0; c < cut.placement.num_chunks(); ++c) {
    double bytes = 0;
    for (int l = cut.boundaries[c]; l < cut.boundaries[c + 1]; ++l) {
      bytes += costs.layers[l].gradient_bytes;
    }
    chunk_bytes[cut.placement.OwnerOf(c)].push_back(bytes);
  }
  const double control = kControlMessagesPerStep * options.link.cpu_seconds_per_message;
  double end = sim.stats.makespan;
  *reduction = 0;
  for (int k = 0; k < S; ++k) {
    const auto& actions = sim.timeline.workers[k];
    const double last = actions.empty() ? model.worker_start[k] : actions.back().end;
    const double reduce =
        ReductionSeconds(chunk_bytes[k], replicas, ReductionLink(options, S, replicas, k));
    *reduction = std::max(*reduction, reduce);
    end = std::max(end, last + reduce + control);
  }
  return end;
}
}  // namespace

std::vector<int> InFlightOf(const schedule::Plan& plan) {
  std::vector<int> out;
  for (const std::vector<schedule::Action>& actions : plan.actions) {
    std::set<int> chunks;
    int alive = 0;
    int peak = 0;
    for (const schedule::Action& a : actions) {
      chunks.insert(a.chunk);
      if (a.op == schedule::Op::kForward) peak = std::max(peak, ++alive);
      if (a.op == schedule::Op::kBackward || a.op == schedule::Op::kWeightGrad) --alive;
    }
    const int held = std::max<int>(1, static_cast<int>(chunks.size()));
    out.push_back(std::max(1, (peak + held - 1) / held));
  }
  return out;
}

double CoordinatorSeconds(int microbatches, int workers, double cpu_seconds_per_message) {
  return (2.0 * microbatches + 3.0 * workers + 4.0) * cpu_seconds_per_message;
}

std::string PlanLabel(const PlanChoice& p) {
  return absl::StrCat(p.replicas, " replica", p.replicas == 1 ? "" : "s", " x ", p.stages,
                      p.stages == 1 ? " stage" : " stages", " x ", p.virtual_stages, " virtual, ",
                      schedule::ScheduleKindName(p.kind), ", ", p.microbatches, " micro-batches");
}

std::vector<double> LayerPartitionCosts(const ModelCosts& costs) {
  std::vector<double> out;
  out.reserve(costs.layers.size());
  for (const LayerCost& l : costs.layers) {
    out.push_back((l.forward + l.backward_input + l.backward_weight) * 1e9);
  }
  return out;
}

absl::StatusOr<PlanChoice> EvaluatePlan(const std::vector<double>& partition_costs,
                                        const ModelCosts& costs, const PlannerOptions& options,
                                        int stages, schedule::ScheduleKind kind, int virtual_stages,
                                        int microbatches, int replicas) {
  PT_RETURN_IF_ERROR(CheckPlannerOptions(options));
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
  PT_RETURN_IF_ERROR(CheckReplicas(options, stages, microbatches, replicas));
  const schedule::ScheduleParams params{kind, stages, microbatches / replicas, virtual_stages};
  PT_RETURN_IF_ERROR(schedule::CheckExecutable(kind));
  PT_ASSIGN_OR_RETURN(schedule::Plan plan, schedule::GenerateSchedule(params));
  partition::PartitionOptions popts;
  popts.stages = stages;
  popts.placement = plan.placement.kind;
  popts.virtual_stages = virtual_stages;
  for (int w = 0; w < stages; ++w) popts.speeds.push_back(options.workers[w].gflops);
  PlanChoice choice;
  if (options.partition_by_layer_costs) choice.layer_costs = LayerPartitionCosts(costs);
  PT_ASSIGN_OR_RETURN(
      partition::Partition cut,
      partition::PartitionLayers(
          options.partition_by_layer_costs ? choice.layer_costs : partition_costs, popts));
  const std::vector<WorkerResources> ranks = RankResources(options, stages, replicas);
  PT_ASSIGN_OR_RETURN(const schedule::CostModel cost_model,
                      PlanCostModel(cut, costs, options, microbatches, replicas, InFlightOf(plan)));
  PT_ASSIGN_OR_RETURN(schedule::SimulationResult sim, schedule::Simulate(plan, cost_model));
  choice.replicas = replicas;
  choice.stages = stages;
  choice.kind = kind;
  choice.virtual_stages = virtual_stages;
  choice.microbatches = microbatches;
  choice.boundaries = cut.boundaries;
  choice.imbalance = cut.imbalance;
  // On a host whose CPUs the workers' threads fill, the coordinator's and the client's CPU
  // seconds are taken from the workers' while they compute: the busy share of the step.
  const int workers = replicas * stages;
  if (options.host_cpus > 0 && workers * options.threads >= options.host_cpus) {
    choice.coordinator_seconds =
        CoordinatorSeconds(microbatches, workers, options.link.cpu_seconds_per_message) *
        (1 - sim.stats.bubble_fraction);
  }
  choice.step_seconds =
      StepEnd(cut, costs, sim, cost_model, options, replicas, &choice.reduction_seconds) +
      choice.coordinator_seconds + options.step_overhead_seconds;
  choice.samples_per_second =
      choice.step_seconds > 0 ? static_cast<double>(options.batch) / choice.step_seconds : 0;
  choice.bubble = sim.stats.bubble_fraction;
  FillMemory(cut, costs, sim.stats, ranks, &choice);
  return choice;
}

absl::StatusOr<std::vector<PlanChoice>> RankPlans(
    const std::vector<double>& partition_costs,
    const std::map<int, ModelCosts>& costs_by_microbatches, const PlannerOptions& options) {
  PT_RETURN_IF_ERROR(CheckPlannerOptions(options));
  const std::vector<schedule::ScheduleKind> kinds = KindsToTry(options);
  std::vector<std::pair<PlanChoice, int>> plans;  // with the kind's position, for ties.
  const int64_t layers = static_cast<int64_t>(partition_costs.size());
  const int n = static_cast<int>(options.workers.size());
  for (const auto& [m, costs] : costs_by_microbatches) {
    for (int r = 1; r <= options.max_replicas && r <= n; r *= 2) {
      if (m % r != 0 || !CheckReplicas(options, 1, m, r).ok()) continue;
      for (int s = 1; s * r <= n; ++s) {
        for (size_t k = 0; k < kinds.size(); ++k) {
          for (int v : VirtualChoices(kinds[k], options.max_virtual)) {
            // One stage has no bubble for more chunks to fill: they only add actions (gpt_char's
            // 3 chunks of one worker ran 8 % more compute than one, where the timer saw none).
            if (s == 1 && v > 1) continue;
            if (!Runnable({kinds[k], s, m / r, v}, layers)) continue;
            PT_ASSIGN_OR_RETURN(PlanChoice choice, EvaluatePlan(partition_costs, costs, options, s,
                                                                kinds[k], v, m, r));
            plans.emplace_back(std::move(choice), static_cast<int>(k));
          }
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
    const auto kx = std::make_tuple(!x.fits_memory, -rate(x), x.replicas * x.stages, x.stages,
                                    PeakOf(x), x.microbatches, a.second, x.virtual_stages);
    const auto ky = std::make_tuple(!y.fits_memory, -rate(y), y.replicas * y.stages, y.stages,
                                    PeakOf(y), y.microbatches, b.second, y.virtual_stages);
    return kx < ky;
  });
  std::vector<PlanChoice> out;
  for (auto& p : plans) out.push_back(std::move(p.first));
  return out;
}

}  // namespace pipetrain::plan
