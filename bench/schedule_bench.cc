// Plan compilation speed: generate + validate + simulate a schedule of S=64 workers and M=512
// micro-batches for every kind, as the coordinator would for a big pipeline on the fly.
//
// Prints milliseconds per phase (best of several runs) and, as the reference measured in the same
// run, the ratio of the total to one plain copy of the plan's action lists (the cheapest possible
// pass over the same data).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <vector>

#include "common/schedule/generator.h"
#include "common/schedule/simulator.h"
#include "common/schedule/validator.h"

namespace pipetrain::schedule {
namespace {

using Clock = std::chrono::steady_clock;

// Best-of-`reps` seconds of one call of `fn`, after a warm-up call.
double BestSeconds(const std::function<void()>& fn, int reps = 7) {
  fn();
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const auto start = Clock::now();
    fn();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - start).count());
  }
  return best;
}

int Main() {
  constexpr int kStages = 64;
  constexpr int kMicrobatches = 512;
  std::printf("schedule_bench: S=%d M=%d, per-stage costs F=1 B=2 I=1 W=1\n", kStages,
              kMicrobatches);
  std::printf("%-12s %3s %9s %9s %9s %9s %9s %9s %8s %10s\n", "kind", "V", "actions", "gen_ms",
              "valid_ms", "sim_ms", "total_ms", "ns/act", "x_copy", "bubble");
  bool all_fast = true;
  for (ScheduleKind kind : {ScheduleKind::kGPipe, ScheduleKind::kOneFOneB,
                            ScheduleKind::kInterleaved, ScheduleKind::kZbH1, ScheduleKind::kZbV,
                            ScheduleKind::kDualPipeV, ScheduleKind::kOneFOneBOverlap,
                            ScheduleKind::kInterleavedOverlap, ScheduleKind::kDualPipe}) {
    const ScheduleParams params{kind, kStages, kMicrobatches, DefaultVirtualStages(kind)};
    absl::StatusOr<Plan> plan = GenerateSchedule(params);
    if (!plan.ok()) {
      std::printf("%s: %s\n", std::string(ScheduleKindName(kind)).c_str(),
                  std::string(plan.status().message()).c_str());
      return 1;
    }
    const CostModel costs = UniformCostModel(plan->placement, {1, 2, 1, 1});
    absl::StatusOr<SimulationResult> sim = Simulate(*plan, costs);
    if (!sim.ok()) {
      std::printf("%s: %s\n", std::string(ScheduleKindName(kind)).c_str(),
                  std::string(sim.status().message()).c_str());
      return 1;
    }
    const double gen = BestSeconds([&] {
      absl::StatusOr<Plan> p = GenerateSchedule(params);
      if (!p.ok()) std::abort();
    });
    const double valid = BestSeconds([&] {
      if (!ValidatePlan(*plan).ok()) std::abort();
    });
    const double simulate = BestSeconds([&] {
      if (!Simulate(*plan, costs).ok()) std::abort();
    });
    const double total = BestSeconds([&] {
      absl::StatusOr<Plan> p = GenerateSchedule(params);
      if (!p.ok() || !ValidatePlan(*p).ok() || !Simulate(*p, costs).ok()) std::abort();
    });
    size_t sink = 0;
    const double copy = BestSeconds([&] {
      std::vector<std::vector<Action>> c = plan->actions;
      sink += c.back().size();
    });
    const int64_t actions = plan->NumActions();
    all_fast = all_fast && total < 0.25;
    std::printf("%-12s %3d %9lld %9.2f %9.2f %9.2f %9.2f %9.1f %8.1f %10.4f\n",
                std::string(ScheduleKindName(kind)).c_str(), params.virtual_stages,
                static_cast<long long>(actions), gen * 1e3, valid * 1e3, simulate * 1e3,
                total * 1e3, total * 1e9 / actions, total / copy, sim->stats.bubble_fraction);
    if (sink == 0) std::printf("(empty plan)\n");
  }
  std::printf("%s\n", all_fast ? "every kind compiles in well under a second"
                               : "SLOW: some kind took more than 250 ms");
  return all_fast ? 0 : 1;
}

}  // namespace
}  // namespace pipetrain::schedule

int main() { return pipetrain::schedule::Main(); }
