// libFuzzer target: the partitioner (common/partition PartitionLayers, EvaluatePartition) over
// layer costs, worker speeds, memory caps, boundary times, stage and chunk counts, and the timed
// simulator (common/schedule CostModelFromFlops, Simulate) over FLOPs, speeds, link and byte
// figures, including values beyond their documented ranges (NaN, infinities, subnormals, 1e308).
// Input format: tests/fuzz/partition_input.h.
//
// Invariants: an error is INVALID_ARGUMENT or RESOURCE_EXHAUSTED (never INTERNAL); a cut is valid
// (S*V+1 strictly increasing boundaries from 0 to L), its figures are finite, it keeps every
// worker within its memory cap, and EvaluatePartition of it reports the same bottleneck; a
// simulation has a finite makespan and every action a finite [start, end) within it.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/partition/partitioner.h"
#include "common/schedule/generator.h"
#include "common/schedule/simulator.h"
#include "tests/fuzz/fuzz_check.h"
#include "tests/fuzz/partition_input.h"

namespace {

namespace partition = pipetrain::partition;
namespace schedule = pipetrain::schedule;
using pipetrain::fuzz::PartitionInputReader;

std::vector<double> Numbers(PartitionInputReader* in, int n) {
  std::vector<double> out(static_cast<size_t>(n));
  for (double& x : out) x = in->Number();
  return out;
}

// a <= b up to the rounding of sums of up to 24 terms in a different order.
bool AtMost(double a, double b) { return a <= b + 1e-9 * std::abs(b); }

void CheckPartition(const std::vector<double>& costs, const partition::PartitionOptions& options) {
  const absl::StatusOr<partition::Partition> p = partition::PartitionLayers(costs, options);
  if (!p.ok()) {
    PT_FUZZ_CHECK(p.status().code() == absl::StatusCode::kInvalidArgument ||
                  p.status().code() == absl::StatusCode::kResourceExhausted);
    return;
  }
  const int l = static_cast<int>(costs.size());
  const int s = options.stages;
  const int c_count = p->placement.num_chunks();
  PT_FUZZ_CHECK(p->placement.stages == s);
  PT_FUZZ_CHECK(static_cast<int>(p->boundaries.size()) == c_count + 1);
  PT_FUZZ_CHECK(p->boundaries.front() == 0 && p->boundaries.back() == l);
  for (int c = 0; c < c_count; ++c) PT_FUZZ_CHECK(p->boundaries[c] < p->boundaries[c + 1]);
  PT_FUZZ_CHECK(std::isfinite(p->bottleneck) && p->bottleneck >= 0);
  PT_FUZZ_CHECK(std::isfinite(p->imbalance) && p->imbalance >= 1 - 1e-9 &&
                p->imbalance <= s + 1e-9);
  PT_FUZZ_CHECK(p->bottleneck_worker >= 0 && p->bottleneck_worker < s);
  for (int w = 0; w < s; ++w) {
    PT_FUZZ_CHECK(std::isfinite(p->worker_time[w]) && p->worker_time[w] >= 0);
    PT_FUZZ_CHECK(p->worker_time[w] <= p->bottleneck);
    if (!options.memory_caps.empty()) {
      PT_FUZZ_CHECK(AtMost(p->worker_memory[w], options.memory_caps[w]));
    }
  }
  const absl::StatusOr<partition::Partition> again =
      partition::EvaluatePartition(costs, options, p->boundaries);
  PT_FUZZ_CHECK(again.ok());
  PT_FUZZ_CHECK(again->bottleneck == p->bottleneck);
}

void CheckSimulation(PartitionInputReader* in) {
  schedule::ScheduleParams params;
  constexpr int kKinds = static_cast<int>(sizeof(schedule::kAllScheduleKinds) /
                                          sizeof(schedule::kAllScheduleKinds[0]));
  params.kind = schedule::kAllScheduleKinds[in->Byte() % kKinds];
  params.stages = 1 + in->Byte() % 4;
  params.microbatches = 1 + in->Byte() % 8;
  params.virtual_stages = 1 + in->Byte() % 3;
  const absl::StatusOr<schedule::Plan> plan = schedule::GenerateSchedule(params);
  if (!plan.ok()) {
    PT_FUZZ_CHECK(plan.status().code() == absl::StatusCode::kInvalidArgument);
    return;
  }
  const int c_count = plan->num_chunks();
  std::vector<schedule::OpCosts> flops(static_cast<size_t>(c_count));
  for (schedule::OpCosts& f : flops) f = {in->Number(), in->Number(), in->Number(), in->Number()};
  const std::vector<double> speeds = Numbers(in, plan->placement.stages);
  const double latency = in->Number();
  const double bandwidth = in->Number();
  const uint8_t extras = in->Byte();
  const std::vector<double> boundary_bytes =
      (extras & 1) ? Numbers(in, c_count) : std::vector<double>();
  const std::vector<double> activation_bytes =
      (extras & 2) ? Numbers(in, c_count) : std::vector<double>();

  absl::StatusOr<schedule::CostModel> costs =
      schedule::CostModelFromFlops(plan->placement, flops, speeds);
  if (!costs.ok()) {
    PT_FUZZ_CHECK(costs.status().code() == absl::StatusCode::kInvalidArgument);
    return;
  }
  for (const schedule::OpCosts& c : costs->chunk_costs) {
    for (double x : {c.f, c.b, c.i, c.w}) {
      PT_FUZZ_CHECK(std::isfinite(x) && x >= 0 && x <= schedule::kMaxSimulatedTime);
    }
  }
  costs->link = {latency, bandwidth};
  costs->boundary_bytes = boundary_bytes;
  costs->activation_bytes = activation_bytes;
  const absl::StatusOr<schedule::SimulationResult> sim = schedule::Simulate(*plan, *costs);
  if (!sim.ok()) {
    PT_FUZZ_CHECK(sim.status().code() == absl::StatusCode::kInvalidArgument);
    return;
  }
  const double makespan = sim->stats.makespan;
  PT_FUZZ_CHECK(std::isfinite(makespan) && makespan >= 0);
  PT_FUZZ_CHECK(std::isfinite(sim->stats.bubble_fraction));
  for (const std::vector<schedule::TimedAction>& worker : sim->timeline.workers) {
    for (const schedule::TimedAction& a : worker) {
      PT_FUZZ_CHECK(std::isfinite(a.start) && std::isfinite(a.end));
      PT_FUZZ_CHECK(0 <= a.start && a.start <= a.end && a.end <= makespan);
    }
  }
  for (const schedule::WorkerStats& w : sim->stats.workers) {
    PT_FUZZ_CHECK(std::isfinite(w.busy) && std::isfinite(w.bubble_fraction));
    PT_FUZZ_CHECK(std::isfinite(w.peak_activation_bytes));
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  PartitionInputReader in(data, size);
  const uint8_t flags = in.Byte();
  partition::PartitionOptions options;
  options.stages = 1 + in.Byte() % 6;
  const int raw_virtual = 1 + in.Byte() % 3;
  const int layers = 1 + in.Byte() % 24;
  switch (flags & 3) {
    case 0:
      options.placement = schedule::PlacementKind::kLinear;
      options.virtual_stages = (flags & 64) ? raw_virtual : 1;
      break;
    case 2:
      options.placement = schedule::PlacementKind::kVShape;
      options.virtual_stages = (flags & 64) ? raw_virtual : 2;
      break;
    default:
      options.placement = schedule::PlacementKind::kLooped;
      options.virtual_stages = raw_virtual;
      break;
  }
  const std::vector<double> costs = Numbers(&in, layers);
  if (flags & 4) options.speeds = Numbers(&in, options.stages);
  if (flags & 8) {
    options.layer_memory = Numbers(&in, layers);
    options.memory_caps = Numbers(&in, options.stages);
  }
  if (flags & 16) options.boundary_times = Numbers(&in, layers - 1);
  CheckPartition(costs, options);
  if (flags & 32) CheckSimulation(&in);
  return 0;
}
