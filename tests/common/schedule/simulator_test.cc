#include "common/schedule/simulator.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/schedule/generator.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pipetrain::schedule {
namespace {

using ::testing::HasSubstr;

constexpr double kTol = 1e-9;

Plan Generated(ScheduleKind kind, int s, int m, int v) {
  absl::StatusOr<Plan> plan = GenerateSchedule({kind, s, m, v});
  EXPECT_TRUE(plan.ok()) << plan.status();
  return plan.ok() ? *plan : Plan{};
}

// Simulates with `per_stage` costs spread over the V chunks of each worker.
SimulationResult Simulated(const Plan& plan, const OpCosts& per_stage) {
  absl::StatusOr<SimulationResult> result =
      Simulate(plan, UniformCostModel(plan.placement, per_stage));
  EXPECT_TRUE(result.ok()) << result.status();
  return result.ok() ? *result : SimulationResult{};
}

// GPipe and 1F1B: makespan (M+S-1)(F+B), bubble (S-1)/(M+S-1) on every worker and overall.
TEST(SimulatorTest, GPipeAndOneFOneBClosedForm) {
  for (const OpCosts costs : {OpCosts{1, 1, 0, 0}, OpCosts{1, 2, 1, 1}, OpCosts{2, 3, 1, 2}}) {
    for (ScheduleKind kind : {ScheduleKind::kGPipe, ScheduleKind::kOneFOneB}) {
      for (int s = 1; s <= 8; ++s) {
        for (int m = 1; m <= 32; ++m) {
          SCOPED_TRACE(absl::StrCat(ScheduleKindName(kind), " S=", s, " M=", m, " F=", costs.f,
                                    " B=", costs.b));
          const SimulationResult r = Simulated(Generated(kind, s, m, 1), costs);
          const double bubble = (s - 1.0) / (m + s - 1.0);
          EXPECT_NEAR(r.stats.makespan, (m + s - 1) * (costs.f + costs.b), kTol);
          EXPECT_NEAR(r.stats.bubble_fraction, bubble, kTol);
          for (int w = 0; w < s; ++w) {
            EXPECT_NEAR(r.stats.workers[w].busy, m * (costs.f + costs.b), kTol);
            EXPECT_NEAR(r.stats.workers[w].bubble_fraction, bubble, kTol);
          }
        }
      }
    }
  }
}

// Peak stash: M for GPipe, min(S-w, M) for 1F1B worker w.
TEST(SimulatorTest, PeakActivationsGPipeAndOneFOneB) {
  for (int s = 1; s <= 8; ++s) {
    for (int m = 1; m <= 32; ++m) {
      const SimulationResult gpipe = Simulated(Generated(ScheduleKind::kGPipe, s, m, 1), {});
      const SimulationResult one = Simulated(Generated(ScheduleKind::kOneFOneB, s, m, 1), {});
      for (int w = 0; w < s; ++w) {
        EXPECT_EQ(gpipe.stats.workers[w].peak_activations, m);
        EXPECT_EQ(one.stats.workers[w].peak_activations, std::min(s - w, m))
            << "S=" << s << " M=" << m << " w=" << w;
      }
    }
  }
}

// Interleaved 1F1B with chunk costs F/V, B/V: makespan M(F+B) + (S-1)(F+B)/V, i.e. the 1F1B
// bubble time divided by V; bubble fraction (S-1)/(VM+S-1).
TEST(SimulatorTest, InterleavedReducesTheBubbleByV) {
  for (const OpCosts costs : {OpCosts{1, 1, 0, 0}, OpCosts{1, 2, 1, 1}, OpCosts{2, 3, 1, 2}}) {
    for (int s = 1; s <= 8; ++s) {
      for (int v = 2; v <= 4; ++v) {
        for (int m = s; m <= 32; m += s) {
          SCOPED_TRACE(absl::StrCat("S=", s, " V=", v, " M=", m, " F=", costs.f, " B=", costs.b));
          const SimulationResult r =
              Simulated(Generated(ScheduleKind::kInterleaved, s, m, v), costs);
          const double fb = costs.f + costs.b;
          EXPECT_NEAR(r.stats.makespan, m * fb + (s - 1) * fb / v, kTol);
          EXPECT_NEAR(r.stats.bubble_fraction, (s - 1.0) / (v * m + s - 1.0), kTol);
          const SimulationResult one =
              Simulated(Generated(ScheduleKind::kOneFOneB, s, m, 1), costs);
          EXPECT_NEAR((r.stats.makespan - m * fb) * v, one.stats.makespan - m * fb, kTol);
        }
      }
    }
  }
}

// ZB-H1 (B split into I + W): idle time per worker (S-1)(F+B-2W), i.e. makespan
// M(F+B) + (S-1)(F+I-W), for M >= S and W <= F (the zero-bubble paper's setting).
TEST(SimulatorTest, ZbH1ClosedForm) {
  for (const OpCosts c : {OpCosts{1, 2, 1, 1}, OpCosts{2, 3, 2, 1}, OpCosts{3, 3, 2, 1},
                          OpCosts{1, 3, 2, 1}, OpCosts{2, 2.5, 2, 0.5}}) {
    for (int s = 1; s <= 8; ++s) {
      for (int m = s; m <= 32; ++m) {
        SCOPED_TRACE(absl::StrCat("S=", s, " M=", m, " F=", c.f, " I=", c.i, " W=", c.w));
        const SimulationResult r = Simulated(Generated(ScheduleKind::kZbH1, s, m, 1), c);
        const double b = c.i + c.w;
        EXPECT_NEAR(r.stats.makespan, m * (c.f + b) + (s - 1) * (c.f + b - 2 * c.w), kTol);
        for (int w = 0; w < s; ++w) {
          EXPECT_NEAR(r.stats.makespan - r.stats.workers[w].busy, (s - 1) * (c.f + b - 2 * c.w),
                      kTol);
          // Same peak memory as 1F1B's worst worker.
          EXPECT_EQ(r.stats.workers[w].peak_activations, s);
        }
      }
    }
  }
  // Versus 1F1B with the same costs: the bubble shrinks from (S-1)(F+B) to (S-1)(F+B-2W).
  const SimulationResult zb = Simulated(Generated(ScheduleKind::kZbH1, 4, 8, 1), {1, 2, 1, 1});
  const SimulationResult one = Simulated(Generated(ScheduleKind::kOneFOneB, 4, 8, 1), {1, 2, 1, 1});
  EXPECT_DOUBLE_EQ(one.stats.makespan, 33);
  EXPECT_DOUBLE_EQ(zb.stats.makespan, 27);
}

// ZB-V with F = I = W per chunk and M >= 2S: makespan 6M + S-1 chunk steps, which is the lower
// bound of any V-shape plan (worker S-1 cannot start before S-1 chunk forwards and then has 6M
// steps of work); bubble fraction (S-1)/(6M+S-1) <= 1/13; at most 2S chunk activations stashed.
TEST(SimulatorTest, ZbVIsNearZeroBubble) {
  for (int s = 1; s <= 8; ++s) {
    for (int m = 2 * s; m <= 32; ++m) {
      SCOPED_TRACE(absl::StrCat("S=", s, " M=", m));
      // Per stage F=I=W=2, i.e. 1 per chunk.
      const SimulationResult r = Simulated(Generated(ScheduleKind::kZbV, s, m, 2), {2, 4, 2, 2});
      EXPECT_NEAR(r.stats.makespan, 6.0 * m + s - 1, kTol);
      EXPECT_NEAR(r.stats.bubble_fraction, (s - 1.0) / (6.0 * m + s - 1), kTol);
      EXPECT_LE(r.stats.bubble_fraction, 1.0 / 13);
      for (int w = 0; w < s; ++w) {
        EXPECT_NEAR(r.stats.workers[w].busy, 6.0 * m, kTol);
        EXPECT_LE(r.stats.workers[w].peak_activations, 2 * s);
      }
      // Half of ZB-H1's bubble with the same per-stage costs.
      if (s > 1) {
        const SimulationResult h1 =
            Simulated(Generated(ScheduleKind::kZbH1, s, m, 1), {2, 4, 2, 2});
        EXPECT_NEAR(h1.stats.makespan - 6.0 * m, 2 * (r.stats.makespan - 6.0 * m), kTol);
      }
    }
  }
}

// DualPipeV reaches the same V-shape lower bound (with full B = I + W in its overlapped pairs)
// and stashes 2S+1 chunk activations at most.
TEST(SimulatorTest, DualPipeVReachesTheVShapeBound) {
  for (int s = 1; s <= 8; ++s) {
    for (int m = 2 * s; m <= 32; ++m) {
      SCOPED_TRACE(absl::StrCat("S=", s, " M=", m));
      const SimulationResult r =
          Simulated(Generated(ScheduleKind::kDualPipeV, s, m, 2), {2, 4, 2, 2});
      EXPECT_NEAR(r.stats.makespan, 6.0 * m + s - 1, kTol);
      for (int w = 0; w < s; ++w) {
        EXPECT_LE(r.stats.workers[w].peak_activations, 2 * s + 1);
      }
    }
  }
}

// Simulates with `per_stage` costs and `latency` per message between workers.
SimulationResult SimulatedWithLatency(const Plan& plan, const OpCosts& per_stage, double latency) {
  CostModel costs = UniformCostModel(plan.placement, per_stage);
  costs.link.latency = latency;
  absl::StatusOr<SimulationResult> result = Simulate(plan, costs);
  EXPECT_TRUE(result.ok()) << result.status();
  return result.ok() ? *result : SimulationResult{};
}

// 1F1B-overlap's deeper warm-up puts every steady B's input gradient in flight while the paired F
// computes. Without link delay that gains nothing (1F1B's makespan is already the bound); with a
// latency L per message (up to F here) it keeps makespan (M+S-1)(F+B) + 2(S-1)L, the round trip
// only in the start-up, while plain 1F1B waits for a round trip in its steady state. The price is
// memory: min(2(S-w), M) stashed activations on worker w instead of min(S-w, M).
TEST(SimulatorTest, OneFOneBOverlapHidesLinkLatency) {
  const OpCosts costs{1, 2, 1, 1};
  for (int s = 1; s <= 8; ++s) {
    for (int m = 1; m <= 32; ++m) {
      const Plan overlap = Generated(ScheduleKind::kOneFOneBOverlap, s, m, 1);
      const Plan plain = Generated(ScheduleKind::kOneFOneB, s, m, 1);
      for (double latency : {0.0, 0.1, 0.25, 0.5, 1.0}) {
        SCOPED_TRACE(absl::StrCat("S=", s, " M=", m, " L=", latency));
        const SimulationResult r = SimulatedWithLatency(overlap, costs, latency);
        const SimulationResult p = SimulatedWithLatency(plain, costs, latency);
        if (m >= 2 * s - 1) {
          EXPECT_NEAR(r.stats.makespan, (m + s - 1) * 3.0 + 2 * (s - 1) * latency, kTol);
        }
        EXPECT_LE(r.stats.makespan, p.stats.makespan + kTol);
        if (latency == 0) {
          EXPECT_NEAR(r.stats.makespan, p.stats.makespan, kTol);
        } else if (s > 1 && m >= 2 * s) {
          EXPECT_LT(r.stats.makespan, p.stats.makespan);
        }
        for (int w = 0; w < s; ++w) {
          EXPECT_EQ(r.stats.workers[w].peak_activations, std::min(2 * (s - w), m));
        }
      }
    }
  }
}

// Interleaved-overlap: one more warm-up forward than Megatron's order. Interleaved's warm-up
// already holds (V-1)S extra forwards, so the two take the same time until the latency exceeds a
// chunk's compute; above that, the overlap variant is faster. Never slower, and it stashes at most
// one more chunk activation per worker.
TEST(SimulatorTest, InterleavedOverlapNeverSlower) {
  const OpCosts costs{1, 2, 1, 1};
  for (int s = 1; s <= 8; ++s) {
    for (int m = s; m <= 32; m += s) {
      for (int v = 2; v <= 4; ++v) {
        const Plan overlap = Generated(ScheduleKind::kInterleavedOverlap, s, m, v);
        const Plan plain = Generated(ScheduleKind::kInterleaved, s, m, v);
        for (double latency : {0.0, 0.1, 0.5, 1.0, 2.0}) {
          SCOPED_TRACE(absl::StrCat("S=", s, " M=", m, " V=", v, " L=", latency));
          const SimulationResult r = SimulatedWithLatency(overlap, costs, latency);
          const SimulationResult p = SimulatedWithLatency(plain, costs, latency);
          EXPECT_LE(r.stats.makespan, p.stats.makespan + kTol);
          if (latency == 0) {
            EXPECT_NEAR(r.stats.makespan, m * 3.0 + (s - 1) * 3.0 / v, kTol);
            EXPECT_NEAR(r.stats.makespan, p.stats.makespan, kTol);
          }
          for (int w = 0; w < s; ++w) {
            EXPECT_LE(r.stats.workers[w].peak_activations, p.stats.workers[w].peak_activations + 1);
          }
        }
      }
    }
  }
  // Where the latency exceeds a chunk's compute it gains: S=4, M=16, V=2, L=1 (chunk F=0.5).
  const double plain =
      SimulatedWithLatency(Generated(ScheduleKind::kInterleaved, 4, 16, 2), costs, 1.0)
          .stats.makespan;
  const double overlap =
      SimulatedWithLatency(Generated(ScheduleKind::kInterleavedOverlap, 4, 16, 2), costs, 1.0)
          .stats.makespan;
  EXPECT_LT(overlap, plain);
}

// Bidirectional DualPipe: each worker does M(F+B) of work (M/2 micro-batches on each of its two
// whole-stage chunks). With F=1, B=2, I=W=1 per stage and no link delay the makespan is
// 3M + S/2 - 1 (1F1B: 3(M+S-1); ZB-H1: 3M + S-1; DualPipeV, the one-copy V-shape: 3M + (S-1)/2),
// and a worker stashes at most min(S+1, M) stage activations (1F1B's worst worker: S) -- on top of
// holding two copies of the weights.
TEST(SimulatorTest, DualPipeBound) {
  for (int s = 2; s <= 8; s += 2) {
    for (int m = 2 * s - 2; m <= 32; m += 2) {
      SCOPED_TRACE(absl::StrCat("S=", s, " M=", m));
      const SimulationResult r =
          Simulated(Generated(ScheduleKind::kDualPipe, s, m, 2), {1, 2, 1, 1});
      EXPECT_NEAR(r.stats.makespan, 3.0 * m + s / 2 - 1, kTol);
      int peak = 0;
      for (int w = 0; w < s; ++w) {
        EXPECT_NEAR(r.stats.workers[w].busy, 3.0 * m, kTol);
        peak = std::max(peak, r.stats.workers[w].peak_activations);
      }
      EXPECT_EQ(peak, std::min(s + 1, m));
      // Why two copies cannot sum gradients in the reference's order without waiting: for every
      // stage k, the up copy (chunk S+k) accumulates its first weight gradient before the down
      // copy (chunk k) has accumulated its last.
      for (int k = 0; k < s; ++k) {
        double first_up = 1e300;
        double last_down = -1;
        for (const std::vector<TimedAction>& list : r.timeline.workers) {
          for (const TimedAction& t : list) {
            if (t.action.op != Op::kBackward && t.action.op != Op::kWeightGrad) continue;
            if (t.action.chunk == s + k) first_up = std::min(first_up, t.start);
            if (t.action.chunk == k) last_down = std::max(last_down, t.end);
          }
        }
        EXPECT_LT(first_up, last_down) << "stage " << k;
      }
      const SimulationResult v = Simulated(
          Generated(ScheduleKind::kDualPipeV, s, std::max(m, 2 * s - 1), 2), {1, 2, 1, 1});
      EXPECT_NEAR(v.stats.makespan, 3.0 * std::max(m, 2 * s - 1) + (s - 1) / 2.0, kTol);
    }
  }
}

// A bidirectional chunk is a whole stage: the uniform cost model does not divide it by V.
TEST(SimulatorTest, BidirectionalChunksCostAWholeStage) {
  const Plan plan = Generated(ScheduleKind::kDualPipe, 2, 2, 2);
  const CostModel costs = UniformCostModel(plan.placement, {1, 2, 1, 1});
  ASSERT_EQ(costs.chunk_costs.size(), 4u);
  for (const OpCosts& c : costs.chunk_costs) {
    EXPECT_EQ(c.f, 1);
    EXPECT_EQ(c.b, 2);
  }
  // S=2, M=2: micro-batch 0 enters at worker 0 and micro-batch 1 at worker 1 at the same time.
  const SimulationResult r = Simulated(plan, {1, 2, 1, 1});
  EXPECT_EQ(r.timeline.workers[0].front().action, (Action{Op::kForward, 0, 0}));
  EXPECT_EQ(r.timeline.workers[0].front().start, 0);
  EXPECT_EQ(r.timeline.workers[1].front().action, (Action{Op::kForward, 1, 2}));
  EXPECT_EQ(r.timeline.workers[1].front().start, 0);
  EXPECT_EQ(r.stats.makespan, 6);
}

TEST(SimulatorTest, TimelineOfOneFOneB) {
  // S=2, M=2, F=1, B=2. w1's F1 could start at 2 (w0's F1 is done) but w1 runs B0 until 4;
  // w0's B1 waits for w1's B1 until 7.
  const SimulationResult r = Simulated(Generated(ScheduleKind::kOneFOneB, 2, 2, 1), {1, 2, 1, 1});
  const std::vector<std::vector<std::pair<double, double>>> expected = {
      {{0, 1}, {1, 2}, {4, 6}, {7, 9}}, {{1, 2}, {2, 4}, {4, 5}, {5, 7}}};
  ASSERT_EQ(r.timeline.workers.size(), 2u);
  for (int w = 0; w < 2; ++w) {
    ASSERT_EQ(r.timeline.workers[w].size(), 4u);
    for (int p = 0; p < 4; ++p) {
      EXPECT_EQ(r.timeline.workers[w][p].start, expected[w][p].first) << w << " " << p;
      EXPECT_EQ(r.timeline.workers[w][p].end, expected[w][p].second) << w << " " << p;
    }
  }
  EXPECT_EQ(r.stats.makespan, 9);
}

TEST(SimulatorTest, LinkLatencyAndBandwidth) {
  const Plan plan = Generated(ScheduleKind::kOneFOneB, 2, 1, 1);
  CostModel costs = UniformCostModel(plan.placement, {1, 2, 1, 1});
  costs.link.latency = 0.5;
  absl::StatusOr<SimulationResult> r = Simulate(plan, costs);
  ASSERT_TRUE(r.ok()) << r.status();
  // F0 on w0 [0,1), arrives 1.5, F0 on w1 [1.5,2.5), B0 on w1 [2.5,4.5), arrives 5, B0 w0 [5,7).
  EXPECT_DOUBLE_EQ(r->stats.makespan, 7);
  costs.boundary_bytes = {1000, 0};
  costs.link.bandwidth = 500;  // 2 time units per message.
  r = Simulate(plan, costs);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_DOUBLE_EQ(r->stats.makespan, 11);
  // No delay between two chunks on the same worker: V-shape worker S-1 holds chunks S-1 and S.
  const Plan v = Generated(ScheduleKind::kZbV, 1, 1, 2);
  CostModel vc = UniformCostModel(v.placement, {2, 4, 2, 2});
  vc.link.latency = 100;
  r = Simulate(v, vc);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_DOUBLE_EQ(r->stats.makespan, 6);
}

// Each boundary may have a link of its own (workers joined by different networks): the same
// 1F1B step over 3 stages, the first boundary 0.5 + 1000 / 500 = 2.5 per message, the second
// free. F: [0,1) w0, arrives 3.5, [3.5,4.5) w1, [4.5,5.5) w2; B: [5.5,7.5) w2, [7.5,9.5) w1,
// arrives 12, [12,14) w0. Empty: `link` everywhere.
TEST(SimulatorTest, BoundaryLinksReplaceTheLinkPerBoundary) {
  const Plan plan = Generated(ScheduleKind::kOneFOneB, 3, 1, 1);
  CostModel costs = UniformCostModel(plan.placement, {1, 2, 1, 1});
  costs.boundary_bytes = {1000, 1000, 0};
  costs.boundary_links = {LinkModel{0.5, 500}, LinkModel{0, 0}, LinkModel{}};
  absl::StatusOr<SimulationResult> r = Simulate(plan, costs);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_DOUBLE_EQ(r->stats.makespan, 14);
  costs.boundary_links.clear();
  costs.link = LinkModel{0.5, 500};
  r = Simulate(plan, costs);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_DOUBLE_EQ(r->stats.makespan, 19);  // both boundaries 2.5 each way: 9 + 4 x 2.5.
}

TEST(SimulatorTest, CostsFromFlopsAndWorkerSpeeds) {
  const Plan plan = Generated(ScheduleKind::kGPipe, 2, 1, 1);
  absl::StatusOr<CostModel> costs =
      CostModelFromFlops(plan.placement, {{4, 8, 4, 4}, {4, 8, 4, 4}}, {2, 4});
  ASSERT_TRUE(costs.ok()) << costs.status();
  EXPECT_DOUBLE_EQ(costs->chunk_costs[0].f, 2);
  EXPECT_DOUBLE_EQ(costs->chunk_costs[1].b, 2);
  absl::StatusOr<SimulationResult> r = Simulate(plan, *costs);
  ASSERT_TRUE(r.ok());
  // w0 F [0,2); w1 F [2,3) B [3,5); w0 B [5,9).
  EXPECT_DOUBLE_EQ(r->stats.makespan, 9);

  EXPECT_THAT(CostModelFromFlops(plan.placement, {{1, 1, 1, 1}}, {1, 1}).status().message(),
              HasSubstr("chunk FLOPs has 1 entries; the placement has 2 chunks"));
  EXPECT_THAT(
      CostModelFromFlops(plan.placement, {{1, 1, 1, 1}, {1, 1, 1, 1}}, {1, 0}).status().message(),
      HasSubstr("speed of rank 1 must be in [0.001, 1e+18] (got 0)"));
  EXPECT_THAT(
      CostModelFromFlops(plan.placement, {{1, -1, 1, 1}, {1, 1, 1, 1}}, {1, 1}).status().message(),
      HasSubstr("chunk 0 FLOPs B must be in [0, 1e+30] (got -1)"));
}

// Every number of a cost model has a documented range (simulator.h); outside it, INVALID_ARGUMENT
// naming the value and the range. (Before: a speed of 1e-310 or FLOPs of 1e300 gave infinite
// durations and an infinite makespan that was reported as a result.)
TEST(SimulatorTest, NumbersOutsideTheirRangesAreRefused) {
  const Plan plan = Generated(ScheduleKind::kOneFOneB, 2, 2, 1);
  const OpCosts one{1, 1, 1, 1};
  auto from_flops = [&](const std::vector<OpCosts>& flops, const std::vector<double>& speeds) {
    absl::StatusOr<CostModel> costs = CostModelFromFlops(plan.placement, flops, speeds);
    EXPECT_EQ(costs.status().code(), absl::StatusCode::kInvalidArgument) << costs.status();
    return std::string(costs.status().message());
  };
  EXPECT_EQ(from_flops({one, one}, {1e-310, 1}),
            "speed of rank 0 must be in [0.001, 1e+18] (got 1e-310)");
  EXPECT_EQ(from_flops({one, one}, {1, 1e300}),
            "speed of rank 1 must be in [0.001, 1e+18] (got 1e+300)");
  EXPECT_EQ(from_flops({one, {1, 1e300, 1, 1}}, {1, 1}),
            "chunk 1 FLOPs B must be in [0, 1e+30] (got 1e+300)");
  // The extremes of the ranges are accepted and simulate to a finite makespan.
  absl::StatusOr<CostModel> extreme =
      CostModelFromFlops(plan.placement, {{1e30, 1e30, 1e30, 1e30}, one}, {1e-3, 1e18});
  ASSERT_TRUE(extreme.ok()) << extreme.status();
  extreme->link = {1e33, 1e-3};
  extreme->boundary_bytes = {1e30, 1e30};
  extreme->activation_bytes = {1e30, 1e30};
  absl::StatusOr<SimulationResult> r = Simulate(plan, *extreme);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(std::isfinite(r->stats.makespan));
  EXPECT_GT(r->stats.makespan, 4e33);

  auto simulate = [&](const CostModel& costs) {
    absl::StatusOr<SimulationResult> result = Simulate(plan, costs);
    EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument) << result.status();
    return std::string(result.status().message());
  };
  CostModel costs = UniformCostModel(plan.placement, {1, 1e300, 1, 1});
  EXPECT_EQ(simulate(costs), "chunk 0 cost B must be in [0, 1e+33] (got 1e+300)");
  costs = UniformCostModel(plan.placement, {1, 2, 1, 1});
  costs.link.latency = 1e300;
  EXPECT_EQ(simulate(costs), "link latency must be in [0, 1e+33] (got 1e+300)");
  costs.link.latency = std::numeric_limits<double>::quiet_NaN();
  EXPECT_EQ(simulate(costs), "link latency must be in [0, 1e+33] (got nan)");
  costs.link.latency = 0;
  costs.link.bandwidth = 1e-300;
  costs.boundary_bytes = {8, 8};
  EXPECT_EQ(simulate(costs),
            "link bandwidth must be 0 (infinite) or in [0.001, 1e+30] (got 1e-300)");
  costs.link.bandwidth = 1;
  costs.boundary_bytes = {8, 1e300};
  EXPECT_EQ(simulate(costs), "boundary bytes of chunk 1 must be in [0, 1e+30] (got 1e+300)");
  costs.boundary_bytes.clear();
  costs.activation_bytes = {std::numeric_limits<double>::infinity(), 1};
  EXPECT_EQ(simulate(costs), "activation bytes of chunk 0 must be in [0, 1e+30] (got inf)");
  costs.activation_bytes.clear();
  costs.worker_start = {0, 1e34};
  EXPECT_EQ(simulate(costs), "start time of rank 1 must be in [0, 1e+33] (got 1e+34)");
  costs.worker_start.clear();
  costs.boundary_links = {LinkModel{}};
  EXPECT_EQ(simulate(costs), "boundary links has 1 entries; the plan has 2 chunks");
  costs.boundary_links = {LinkModel{0, -1}, LinkModel{}};
  EXPECT_EQ(simulate(costs),
            "link after chunk 0 bandwidth must be 0 (infinite) or in [0.001, 1e+30] (got -1)");
  costs.boundary_links.clear();
  costs.action_durations = {{1, 1, 1, 1}, {1, 1, 1, 1e300}};
  EXPECT_EQ(simulate(costs),
            "measured duration of rank 1 position 3 must be in [0, 1e+33] (got 1e+300)");
}

TEST(SimulatorTest, MeasuredDurationsReplaceChunkCosts) {
  const Plan plan = Generated(ScheduleKind::kOneFOneB, 2, 1, 1);
  CostModel costs;
  costs.action_durations = {{1.5, 4}, {0.5, 1}};  // w0: F0 B0; w1: F0 B0.
  absl::StatusOr<SimulationResult> r = Simulate(plan, costs);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_DOUBLE_EQ(r->timeline.workers[1][0].start, 1.5);
  EXPECT_DOUBLE_EQ(r->timeline.workers[1][1].end, 3);
  EXPECT_DOUBLE_EQ(r->stats.makespan, 7);
  costs.action_durations[1].pop_back();
  EXPECT_THAT(Simulate(plan, costs).status().message(),
              HasSubstr("measured durations of rank 1 have 1 entries; the rank has 2 actions"));
}

// Measured output times: worker 1's B hands the input gradient on 0.25 after it starts (then adds
// its weight gradients), so worker 0's B starts then, not at that B's end; a worker start time
// holds back the first action of that worker.
TEST(SimulatorTest, MeasuredOutputTimesAndWorkerStarts) {
  const Plan plan = Generated(ScheduleKind::kOneFOneB, 2, 1, 1);
  CostModel costs;
  costs.action_durations = {{1.5, 4}, {0.5, 1}};  // w0: F0 B0; w1: F0 B0.
  costs.action_output_times = {{1.5, 4}, {0.5, 0.25}};
  absl::StatusOr<SimulationResult> r = Simulate(plan, costs);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_DOUBLE_EQ(r->timeline.workers[1][1].end, 3);
  EXPECT_DOUBLE_EQ(r->timeline.workers[0][1].start, 2.25);  // 1.5 + 0.5 + 0.25
  EXPECT_DOUBLE_EQ(r->stats.makespan, 6.25);
  costs.worker_start = {0, 2.5};  // worker 1 busy until 2.5 before its first action.
  r = Simulate(plan, costs);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_DOUBLE_EQ(r->timeline.workers[1][0].start, 2.5);
  EXPECT_DOUBLE_EQ(r->timeline.workers[0][1].start, 3.25);  // 2.5 + 0.5 + 0.25
  EXPECT_DOUBLE_EQ(r->stats.makespan, 7.25);

  costs.action_output_times[1][1] = 1.5;  // after the action's end.
  EXPECT_THAT(Simulate(plan, costs).status().message(),
              HasSubstr("measured output time of rank 1 position 1 (1.5) is after the "
                        "action's end (1)"));
  costs.action_output_times[1].pop_back();
  EXPECT_THAT(Simulate(plan, costs).status().message(),
              HasSubstr("measured output times of rank 1 have 1 entries; its durations 2"));
  costs.action_output_times.clear();
  costs.worker_start = {0};
  EXPECT_THAT(Simulate(plan, costs).status().message(),
              HasSubstr("start times cover 1 ranks; the plan has 2"));
  costs.worker_start = {0, -1};
  EXPECT_THAT(Simulate(plan, costs).status().message(),
              HasSubstr("start time of rank 1 must be in [0, 1e+33] (got -1)"));
}

TEST(SimulatorTest, PeakActivationBytes) {
  const Plan plan = Generated(ScheduleKind::kZbV, 2, 4, 2);
  CostModel costs = UniformCostModel(plan.placement, {2, 4, 2, 2});
  costs.activation_bytes = {100, 10, 1, 1000};  // Worker 0 holds chunks 0 and 3.
  absl::StatusOr<SimulationResult> r = Simulate(plan, costs);
  ASSERT_TRUE(r.ok()) << r.status();
  // Worker 0: F0.0 F1.0 F2.0 F0.3 -> 3 * 100 + 1000 stashed before the first W frees anything.
  EXPECT_EQ(r->stats.workers[0].peak_activations, 4);
  EXPECT_DOUBLE_EQ(r->stats.workers[0].peak_activation_bytes, 1300);
}

TEST(SimulatorTest, Errors) {
  Plan plan = Generated(ScheduleKind::kOneFOneB, 2, 2, 1);
  CostModel costs = UniformCostModel(plan.placement, {1, 2, 1, 1});
  costs.chunk_costs.pop_back();
  EXPECT_THAT(Simulate(plan, costs).status().message(),
              HasSubstr("cost model has 1 chunk costs; the plan has 2 chunks"));
  costs = UniformCostModel(plan.placement, {1, -2, 1, 1});
  EXPECT_THAT(Simulate(plan, costs).status().message(),
              HasSubstr("chunk 0 cost B must be in [0, 1e+33] (got -2)"));
  costs = UniformCostModel(plan.placement, {1, 2, 1, 1});
  costs.link.latency = -1;
  EXPECT_THAT(Simulate(plan, costs).status().message(), HasSubstr("link latency"));
  costs.link.latency = 0;
  costs.activation_bytes = {1};
  EXPECT_THAT(Simulate(plan, costs).status().message(),
              HasSubstr("activation bytes has 1 entries; the plan has 2 chunks"));
  costs.activation_bytes.clear();
  plan.actions[0].pop_back();
  absl::Status status = Simulate(plan, costs).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("missing the backward of (mb=1, chunk=0)"));
  // A deadlocking plan is refused with the validator's report.
  Plan dead = Generated(ScheduleKind::kOneFOneB, 2, 2, 1);
  dead.actions[1] = {
      {Op::kForward, 0, 1}, {Op::kForward, 1, 1}, {Op::kBackward, 0, 1}, {Op::kBackward, 1, 1}};
  dead.actions[0] = {
      {Op::kForward, 0, 0}, {Op::kBackward, 0, 0}, {Op::kForward, 1, 0}, {Op::kBackward, 1, 0}};
  EXPECT_THAT(Simulate(dead, UniformCostModel(dead.placement, {})).status().message(),
              HasSubstr("plan deadlocks"));
}

TEST(TimelineTest, SummarizeAMeasuredTimeline) {
  Timeline t;
  t.placement = Placement{PlacementKind::kLinear, 2, 1};
  t.workers = {{{{Op::kForward, 0, 0}, 0, 2}, {{Op::kBackward, 0, 0}, 6, 10}},
               {{{Op::kForward, 0, 1}, 2.5, 3.5}, {{Op::kBackward, 0, 1}, 3.5, 5.5}}};
  absl::StatusOr<TimelineStats> stats = SummarizeTimeline(t, {8, 16});
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_DOUBLE_EQ(stats->makespan, 10);
  EXPECT_DOUBLE_EQ(stats->workers[0].busy, 6);
  EXPECT_DOUBLE_EQ(stats->workers[0].bubble_fraction, 0.4);
  EXPECT_DOUBLE_EQ(stats->workers[1].bubble_fraction, 0.7);
  EXPECT_DOUBLE_EQ(stats->bubble_fraction, 0.55);
  EXPECT_EQ(stats->workers[1].peak_activations, 1);
  EXPECT_DOUBLE_EQ(stats->workers[1].peak_activation_bytes, 16);
  t.workers[0][1].end = 5;
  EXPECT_THAT(SummarizeTimeline(t, {}).status().message(),
              HasSubstr("rank 0 position 1: B(mb=0, chunk=0) ends (5) before it starts (6)"));
}

}  // namespace
}  // namespace pipetrain::schedule
