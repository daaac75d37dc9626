#include "common/schedule/generator.h"

#include <algorithm>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/schedule/validator.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pipetrain::schedule {
namespace {

using ::testing::HasSubstr;

// The documented parameter rules, written out independently of CheckScheduleParams. Returns the
// phrase the refusal must contain, or "" if the combination is valid.
std::string ExpectedRefusal(ScheduleKind kind, int s, int m, int v) {
  switch (kind) {
    case ScheduleKind::kGPipe:
    case ScheduleKind::kOneFOneB:
    case ScheduleKind::kZbH1:
    case ScheduleKind::kOneFOneBOverlap:
      return v == 1 ? "" : "virtual stages must be 1";
    case ScheduleKind::kInterleaved:
    case ScheduleKind::kInterleavedOverlap:
      if (v < 2) return "needs virtual stages >= 2";
      if (m < s) return absl::StrCat("needs microbatches (", m, ") >= stages (", s, ")");
      if (m % s != 0) return "to be a multiple of stages";
      return "";
    case ScheduleKind::kZbV:
      return v == 2 ? "" : "virtual stages must be 2";
    case ScheduleKind::kDualPipeV:
      if (v != 2) return "virtual stages must be 2";
      if (m < 2 * s - 1) return ">= 2*stages-1";
      return "";
    case ScheduleKind::kDualPipe:
      if (v != 2) return "virtual stages must be 2";
      if (s % 2 != 0) return "needs an even number of stages";
      if (m % 2 != 0) return "needs an even number of microbatches";
      if (m < 2 * s - 2) return ">= 2*stages-2";
      return "";
  }
  return "?";
}

// Renders a worker's list as "F0 F1 B0 ..." (chunk appended as ".c" when `with_chunk`).
std::string Seq(const std::vector<Action>& actions, bool with_chunk = false) {
  std::vector<std::string> parts;
  for (const Action& a : actions) {
    parts.push_back(with_chunk ? absl::StrCat(OpLetter(a.op), a.mb, ".", a.chunk)
                               : absl::StrCat(OpLetter(a.op), a.mb));
  }
  return absl::StrJoin(parts, " ");
}

std::vector<Action> Worker(ScheduleKind kind, int s, int m, int v, int w) {
  absl::StatusOr<std::vector<Action>> actions = GenerateWorkerActions({kind, s, m, v}, w);
  EXPECT_TRUE(actions.ok()) << actions.status();
  return actions.ok() ? *actions : std::vector<Action>{};
}

// Every valid (kind, S, M, V) with S in 1..8, M in 1..32, V in 1..4 generates a plan that passes
// the validator (including the deadlock simulation); every invalid one is refused with the rule.
TEST(GeneratorTest, ExhaustiveValidity) {
  int valid = 0;
  int refused = 0;
  for (ScheduleKind kind : kAllScheduleKinds) {
    for (int s = 1; s <= 8; ++s) {
      for (int m = 1; m <= 32; ++m) {
        for (int v = 1; v <= 4; ++v) {
          SCOPED_TRACE(absl::StrCat(ScheduleKindName(kind), " S=", s, " M=", m, " V=", v));
          const ScheduleParams params{kind, s, m, v};
          const std::string refusal = ExpectedRefusal(kind, s, m, v);
          absl::StatusOr<Plan> plan = GenerateSchedule(params);
          if (!refusal.empty()) {
            ASSERT_FALSE(plan.ok());
            EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
            EXPECT_THAT(plan.status().message(), HasSubstr(refusal));
            ++refused;
            continue;
          }
          ASSERT_TRUE(plan.ok()) << plan.status();
          ASSERT_TRUE(ValidatePlan(*plan).ok()) << ValidatePlan(*plan);
          int64_t weight_grads = 0;
          for (const std::vector<Action>& list : plan->actions) {
            for (const Action& a : list) weight_grads += a.op == Op::kWeightGrad;
          }
          // Every micro-batch passes every chunk, except under dualpipe, where each passes
          // one of the two copies (S of the 2S chunks).
          const int64_t pairs =
              static_cast<int64_t>(m) * s * (kind == ScheduleKind::kDualPipe ? 1 : v);
          EXPECT_EQ(plan->NumActions(), 2 * pairs + weight_grads);
          if (kind == ScheduleKind::kZbH1 || kind == ScheduleKind::kZbV) {
            EXPECT_EQ(weight_grads, pairs);  // Every backward split.
          } else if (kind != ScheduleKind::kDualPipeV && kind != ScheduleKind::kDualPipe) {
            EXPECT_EQ(weight_grads, 0);  // No backward split.
          }
          ++valid;
        }
      }
    }
  }
  // 4 linear kinds x 256 + interleaved and interleaved-overlap (each: sum over S of
  // 3 * floor(32/S)) + zb-v 256 + dualpipe-v + dualpipe (S = 2, 4, 6, 8; even M >= 2S-2).
  EXPECT_EQ(valid, 4 * 256 + 2 * 3 * (32 + 16 + 10 + 8 + 6 + 5 + 4 + 4) + 256 +
                       (32 + 30 + 28 + 26 + 24 + 22 + 20 + 18) + (16 + 14 + 12 + 10));
  EXPECT_EQ(valid + refused, 9 * 8 * 32 * 4);
}

TEST(GeneratorTest, BadParametersNameTheRule) {
  auto message = [](ScheduleParams p) {
    return std::string(GenerateSchedule(p).status().message());
  };
  EXPECT_EQ(message({ScheduleKind::kOneFOneB, 0, 4, 1}), "stages must be >= 1 (got 0)");
  EXPECT_EQ(message({ScheduleKind::kOneFOneB, 4, 0, 1}), "microbatches must be >= 1 (got 0)");
  EXPECT_EQ(message({ScheduleKind::kInterleaved, 4, 4, 0}), "virtual stages must be >= 1 (got 0)");
  EXPECT_EQ(message({ScheduleKind::kInterleaved, 4, 3, 2}),
            "interleaved 1F1B needs microbatches (3) >= stages (4)");
  EXPECT_EQ(message({ScheduleKind::kInterleaved, 4, 6, 2}),
            "interleaved 1F1B needs microbatches (6) to be a multiple of stages (4): Megatron's "
            "order runs micro-batches in groups of S");
  EXPECT_EQ(message({ScheduleKind::kInterleaved, 4, 8, 1}),
            "interleaved 1F1B needs virtual stages >= 2 (got 1); with one chunk per rank use "
            "1f1b");
  EXPECT_EQ(message({ScheduleKind::kGPipe, 4, 8, 2}),
            "gpipe holds one chunk per rank: virtual stages must be 1 (got 2)");
  EXPECT_EQ(message({ScheduleKind::kZbV, 4, 8, 3}),
            "zb-v uses the V-shape placement: virtual stages must be 2 (got 3)");
  EXPECT_EQ(message({ScheduleKind::kDualPipeV, 4, 6, 2}),
            "dualpipe-v needs microbatches (6) >= 2*stages-1 (7)");
  EXPECT_EQ(message({ScheduleKind::kDualPipe, 3, 8, 2}),
            "dualpipe needs an even number of stages (got 3): it pairs rank w with rank S-1-w; "
            "for odd S use dualpipe-v");
  EXPECT_EQ(message({ScheduleKind::kDualPipe, 4, 7, 2}),
            "dualpipe needs an even number of microbatches (got 7): half enter from each end");
  EXPECT_EQ(message({ScheduleKind::kDualPipe, 4, 4, 2}),
            "dualpipe needs microbatches (4) >= 2*stages-2 (6)");
  EXPECT_EQ(message({ScheduleKind::kDualPipe, 4, 8, 1}),
            "dualpipe holds two chunks per rank: virtual stages must be 2 (got 1)");
  EXPECT_EQ(message({ScheduleKind::kInterleavedOverlap, 4, 6, 2}),
            "interleaved-overlap needs microbatches (6) to be a multiple of stages (4): "
            "Megatron's order runs micro-batches in groups of S");
  EXPECT_EQ(message({ScheduleKind::kInterleavedOverlap, 4, 8, 1}),
            "interleaved-overlap needs virtual stages >= 2 (got 1); with one chunk per rank use "
            "1f1b-overlap");
  EXPECT_EQ(message({ScheduleKind::kOneFOneBOverlap, 4, 8, 2}),
            "1f1b-overlap holds one chunk per rank: virtual stages must be 1 (got 2)");
  EXPECT_THAT(message({ScheduleKind::kOneFOneB, 1 << 14, 1 << 14, 1}), HasSubstr("exceeds"));
  // Factors whose product does not fit in 64 bits (found by the job_spec fuzzer: it overflowed).
  constexpr int kMax = std::numeric_limits<int>::max();
  EXPECT_THAT(message({ScheduleKind::kInterleaved, kMax, kMax, kMax}),
              HasSubstr("stages*virtual*microbatches (more than 2^63) exceeds the limit"));

  absl::StatusOr<std::vector<Action>> out_of_range =
      GenerateWorkerActions({ScheduleKind::kOneFOneB, 4, 8, 1}, 4);
  ASSERT_FALSE(out_of_range.ok());
  EXPECT_EQ(out_of_range.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(out_of_range.status().message(), "rank 4 is out of range [0, 4)");
  EXPECT_FALSE(GenerateWorkerActions({ScheduleKind::kOneFOneB, 4, 8, 1}, -1).ok());
}

TEST(GeneratorTest, WorkerActionsMatchThePlan) {
  for (ScheduleKind kind : kAllScheduleKinds) {
    const ScheduleParams params{kind, 4, 8, DefaultVirtualStages(kind)};
    absl::StatusOr<Plan> plan = GenerateSchedule(params);
    ASSERT_TRUE(plan.ok()) << plan.status();
    for (int w = 0; w < 4; ++w) {
      EXPECT_EQ(Worker(kind, 4, 8, params.virtual_stages, w), plan->actions[w]);
    }
  }
}

TEST(GeneratorTest, PlacementsFollowTheKind) {
  absl::StatusOr<Plan> interleaved = GenerateSchedule({ScheduleKind::kInterleaved, 4, 8, 3});
  ASSERT_TRUE(interleaved.ok());
  EXPECT_EQ(interleaved->placement.kind, PlacementKind::kLooped);
  EXPECT_EQ(interleaved->placement.ChunksOf(1), (std::vector<int>{1, 5, 9}));
  absl::StatusOr<Plan> zbv = GenerateSchedule({ScheduleKind::kZbV, 4, 8, 2});
  ASSERT_TRUE(zbv.ok());
  EXPECT_EQ(zbv->placement.kind, PlacementKind::kVShape);
  EXPECT_EQ(zbv->placement.ChunksOf(1), (std::vector<int>{1, 6}));
  EXPECT_EQ(zbv->placement.OwnerOf(7), 0);
  EXPECT_EQ(zbv->placement.OwnerOf(4), 3);
}

TEST(GeneratorTest, GPipeRunsAllForwardsThenAscendingBackwards) {
  EXPECT_EQ(Seq(Worker(ScheduleKind::kGPipe, 3, 4, 1, 1)), "F0 F1 F2 F3 B0 B1 B2 B3");
}

// Warm-up is S-w-1 forwards (seed 001's S-w is off by one).
TEST(GeneratorTest, OneFOneBWarmupIsStagesMinusRankMinusOne) {
  EXPECT_EQ(Seq(Worker(ScheduleKind::kOneFOneB, 4, 6, 1, 0)),
            "F0 F1 F2 F3 B0 F4 B1 F5 B2 B3 B4 B5");
  EXPECT_EQ(Seq(Worker(ScheduleKind::kOneFOneB, 4, 6, 1, 1)),
            "F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 B4 B5");
  EXPECT_EQ(Seq(Worker(ScheduleKind::kOneFOneB, 4, 6, 1, 3)),
            "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5");
  // Fewer micro-batches than warm-up slots: all forwards, then all backwards.
  EXPECT_EQ(Seq(Worker(ScheduleKind::kOneFOneB, 4, 2, 1, 0)), "F0 F1 B0 B1");
}

// Megatron's order: groups of S micro-batches per chunk, warm-up 2(S-w-1) + (V-1)S.
TEST(GeneratorTest, InterleavedFollowsMegatronOrder) {
  // S=2, M=4, V=2: worker 0 holds chunks 0 and 2, worker 1 chunks 1 and 3.
  EXPECT_EQ(Seq(Worker(ScheduleKind::kInterleaved, 2, 4, 2, 0), true),
            "F0.0 F1.0 F0.2 F1.2 F2.0 B0.2 F3.0 B1.2 F2.2 B0.0 F3.2 B1.0 B2.2 B3.2 B2.0 B3.0");
  EXPECT_EQ(Seq(Worker(ScheduleKind::kInterleaved, 2, 4, 2, 1), true),
            "F0.1 F1.1 F0.3 B0.3 F1.3 B1.3 F2.1 B0.1 F3.1 B1.1 F2.3 B2.3 F3.3 B3.3 B2.1 B3.1");
  // It is not GPipe over virtual stages (seed 000): backwards start before the last forward.
  const std::vector<Action> w0 = Worker(ScheduleKind::kInterleaved, 4, 8, 2, 0);
  int first_b = -1;
  int last_f = -1;
  for (int p = 0; p < static_cast<int>(w0.size()); ++p) {
    if (w0[p].op == Op::kBackward && first_b < 0) first_b = p;
    if (w0[p].op == Op::kForward) last_f = p;
  }
  EXPECT_LT(first_b, last_f);
  EXPECT_EQ(first_b, 2 * 3 + 4 + 1);  // After the 10 warm-up forwards and one steady forward.
}

// Why interleaved refuses M % S != 0: Megatron's table with a partial last group (the same rule
// with groups [0, S), [S, 2S), ..., [kS, M)) deadlocks under in-order execution for S=4, M=5, V=3.
TEST(GeneratorTest, InterleavedPartialGroupWouldDeadlock) {
  const int s = 4;
  const int m = 5;
  const int v = 3;
  Plan plan;
  plan.kind = ScheduleKind::kInterleaved;
  plan.microbatches = m;
  plan.placement = Placement{PlacementKind::kLooped, s, v};
  std::vector<std::pair<int, int>> table;  // (mb, local chunk)
  for (int group = 0; group < m; group += s) {
    for (int local = 0; local < v; ++local) {
      for (int mb = group; mb < std::min(group + s, m); ++mb) table.emplace_back(mb, local);
    }
  }
  const int total = m * v;
  for (int w = 0; w < s; ++w) {
    const int warmup = std::min(2 * (s - w - 1) + (v - 1) * s, total);
    std::vector<Action> list;
    auto f = [&](int k) {
      list.push_back({Op::kForward, table[k].first, table[k].second * s + w});
    };
    auto b = [&](int k) {
      list.push_back({Op::kBackward, table[k].first, (v - 1 - table[k].second) * s + w});
    };
    for (int k = 0; k < warmup; ++k) f(k);
    for (int k = warmup; k < total; ++k) {
      f(k);
      b(k - warmup);
    }
    for (int k = total - warmup; k < total; ++k) b(k);
    plan.actions.push_back(list);
  }
  EXPECT_TRUE(CheckPlanStructure(plan).ok()) << CheckPlanStructure(plan);
  EXPECT_THAT(ValidatePlan(plan).message(), HasSubstr("plan deadlocks"));
}

// ZB-H1 defers worker w's weight gradients by w steps (not W right after I, seed 000's flaw).
TEST(GeneratorTest, ZbH1DefersWeightGradients) {
  EXPECT_EQ(Seq(Worker(ScheduleKind::kZbH1, 4, 6, 1, 0)),
            "F0 F1 F2 F3 I0 W0 F4 I1 W1 F5 I2 W2 I3 W3 I4 W4 I5 W5");
  EXPECT_EQ(Seq(Worker(ScheduleKind::kZbH1, 4, 6, 1, 3)),
            "F0 I0 F1 I1 F2 I2 F3 I3 W0 F4 I4 W1 F5 I5 W2 W3 W4 W5");
  // The last worker runs its first W only after S-1 more input gradients.
  const std::vector<Action> last = Worker(ScheduleKind::kZbH1, 8, 16, 1, 7);
  int inputs_before_first_w = 0;
  for (const Action& a : last) {
    if (a.op == Op::kWeightGrad) break;
    inputs_before_first_w += a.op == Op::kInputGrad;
  }
  EXPECT_EQ(inputs_before_first_w, 8);
}

TEST(GeneratorTest, ZbVOrder) {
  // S=2: worker 0 holds chunks 0 and 3, worker 1 chunks 1 and 2.
  EXPECT_EQ(Seq(Worker(ScheduleKind::kZbV, 2, 4, 2, 0), true),
            "F0.0 F1.0 F2.0 F0.3 I0.3 W0.3 F1.3 I1.3 W1.3 F3.0 I0.0 W0.0 F2.3 I2.3 W2.3 I1.0 W1.0 "
            "F3.3 I3.3 W3.3 I2.0 W2.0 I3.0 W3.0");
  EXPECT_EQ(Seq(Worker(ScheduleKind::kZbV, 2, 4, 2, 1), true),
            "F0.1 F0.2 F1.1 F1.2 I0.2 W0.2 F2.1 I0.1 W0.1 F2.2 I1.2 W1.2 F3.1 I1.1 W1.1 F3.2 I2.2 "
            "W2.2 I2.1 I3.2 I3.1 W2.1 W3.2 W3.1");
}

TEST(GeneratorTest, DualPipeVOrder) {
  // S=2, M=4. Overlapped pairs (F, B) are consecutive actions. Expected orders come from an
  // independent prototype of the phase rules (checked by its own simulator).
  EXPECT_EQ(Seq(Worker(ScheduleKind::kDualPipeV, 2, 4, 2, 0), true),
            "F0.0 F1.0 F2.0 F0.3 I0.3 W0.3 F1.3 F3.0 B1.3 F2.3 B0.0 B2.3 F3.3 B1.0 B3.3 I2.0 W2.0 "
            "I3.0 W3.0");
  EXPECT_EQ(Seq(Worker(ScheduleKind::kDualPipeV, 2, 4, 2, 1), true),
            "F0.1 F0.2 F1.1 F1.2 F2.1 B0.2 F2.2 B0.1 F3.1 B1.2 F3.2 B1.1 B2.2 B2.1 I3.2 I3.1 W3.2 "
            "W3.1");
}

// 1F1B-overlap warms up with 2(S-w-1)+1 forwards, so that in each steady (F, B) pair the B's
// input gradient is in flight while the F computes; the order after the warm-up is 1F1B's.
TEST(GeneratorTest, OneFOneBOverlapPairsEachForwardWithAnOlderBackward) {
  EXPECT_EQ(Seq(Worker(ScheduleKind::kOneFOneBOverlap, 2, 6, 1, 0)),
            "F0 F1 F2 F3 B0 F4 B1 F5 B2 B3 B4 B5");
  EXPECT_EQ(Seq(Worker(ScheduleKind::kOneFOneBOverlap, 2, 6, 1, 1)),
            "F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 B5");
  // Capped at M: all forwards, then all backwards.
  EXPECT_EQ(Seq(Worker(ScheduleKind::kOneFOneBOverlap, 4, 3, 1, 1)), "F0 F1 F2 B0 B1 B2");
  // Plain 1F1B pairs F(k) with B(k-S+w+1); the overlap variant with B(k-2(S-w-1)-1), so the last
  // worker's pair never needs the gradient of its own F.
  for (int w = 0; w < 4; ++w) {
    const std::vector<Action> list = Worker(ScheduleKind::kOneFOneBOverlap, 4, 16, 1, w);
    const int warmup = 2 * (4 - w - 1) + 1;
    for (int p = warmup; p < warmup + 2 * (16 - warmup); p += 2) {
      ASSERT_EQ(list[p].op, Op::kForward);
      ASSERT_EQ(list[p + 1].op, Op::kBackward);
      EXPECT_EQ(list[p].mb - list[p + 1].mb, warmup);
    }
  }
}

// Interleaved-overlap is Megatron's order with one more warm-up forward.
TEST(GeneratorTest, InterleavedOverlapHasOneMoreWarmupForward) {
  EXPECT_EQ(Seq(Worker(ScheduleKind::kInterleavedOverlap, 2, 4, 2, 0), true),
            "F0.0 F1.0 F0.2 F1.2 F2.0 F3.0 B0.2 F2.2 B1.2 F3.2 B0.0 B1.0 B2.2 B3.2 B2.0 B3.0");
  EXPECT_EQ(Seq(Worker(ScheduleKind::kInterleavedOverlap, 2, 4, 2, 1), true),
            "F0.1 F1.1 F0.3 F1.3 B0.3 F2.1 B1.3 F3.1 B0.1 F2.3 B1.1 F3.3 B2.3 B3.3 B2.1 B3.1");
}

// DualPipe: the first M/2 micro-batches run down chunks 0..S-1 (worker c holds chunk c), the
// others up chunks S..2S-1 (worker 2S-1-c holds chunk c); worker w's early chunk comes first.
TEST(GeneratorTest, DualPipeOrder) {
  // S=2, M=4: worker 0 holds chunks 0 (down, mb 0-1) and 3 (up, mb 2-3); worker 1 holds 1 and 2.
  EXPECT_EQ(Seq(Worker(ScheduleKind::kDualPipe, 2, 4, 2, 0), true),
            "F0.0 F2.3 F1.0 B2.3 F3.3 B0.0 B3.3 I1.0 W1.0");
  EXPECT_EQ(Seq(Worker(ScheduleKind::kDualPipe, 2, 4, 2, 1), true),
            "F2.2 F0.1 F3.2 B0.1 F1.1 B2.2 B1.1 I3.2 W3.2");
  absl::StatusOr<Plan> plan = GenerateSchedule({ScheduleKind::kDualPipe, 4, 8, 2});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->placement.kind, PlacementKind::kBidirectional);
  // Micro-batches 0-3 pass chunks 0..3 only, 4-7 chunks 4..7 only.
  for (const std::vector<Action>& list : plan->actions) {
    for (const Action& a : list) EXPECT_EQ(a.mb < 4, a.chunk < 4) << ActionToString(a);
  }
  // Both ends take input: worker 0 starts with F(0, chunk 0), worker 3 with F(4, chunk 4).
  EXPECT_EQ(plan->actions[0].front(), (Action{Op::kForward, 0, 0}));
  EXPECT_EQ(plan->actions[3].front(), (Action{Op::kForward, 4, 4}));
}

// Only dualpipe is refused for execution; it needs two copies of every weight.
// Every kind runs, dualpipe included (on two copies of the stages).
TEST(GeneratorTest, EveryKindIsExecutable) {
  for (ScheduleKind kind : kAllScheduleKinds) {
    const absl::Status status = CheckExecutable(kind);
    EXPECT_TRUE(status.ok()) << ScheduleKindName(kind) << ": " << status;
  }
}

TEST(GeneratorTest, DefaultVirtualStages) {
  EXPECT_EQ(DefaultVirtualStages(ScheduleKind::kGPipe), 1);
  EXPECT_EQ(DefaultVirtualStages(ScheduleKind::kOneFOneB), 1);
  EXPECT_EQ(DefaultVirtualStages(ScheduleKind::kZbH1), 1);
  EXPECT_EQ(DefaultVirtualStages(ScheduleKind::kInterleaved), 2);
  EXPECT_EQ(DefaultVirtualStages(ScheduleKind::kZbV), 2);
  EXPECT_EQ(DefaultVirtualStages(ScheduleKind::kDualPipeV), 2);
  EXPECT_EQ(DefaultVirtualStages(ScheduleKind::kOneFOneBOverlap), 1);
  EXPECT_EQ(DefaultVirtualStages(ScheduleKind::kInterleavedOverlap), 2);
  EXPECT_EQ(DefaultVirtualStages(ScheduleKind::kDualPipe), 2);
}

TEST(IrTest, NamesRoundTrip) {
  for (ScheduleKind kind : kAllScheduleKinds) {
    absl::StatusOr<ScheduleKind> parsed = ParseScheduleKind(ScheduleKindName(kind));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, kind);
  }
  absl::StatusOr<ScheduleKind> bad = ParseScheduleKind("zb-h2");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("unknown schedule kind \"zb-h2\""));
  for (Op op : {Op::kForward, Op::kBackward, Op::kInputGrad, Op::kWeightGrad}) {
    absl::StatusOr<Op> parsed = ParseOp(OpLetter(op));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, op);
  }
  EXPECT_FALSE(ParseOp("X").ok());
  EXPECT_EQ(ActionToString({Op::kInputGrad, 3, 5}), "I(mb=3, chunk=5)");
}

TEST(IrTest, PlacementRules) {
  EXPECT_FALSE(MakePlacement(PlacementKind::kLinear, 4, 2).ok());
  EXPECT_FALSE(MakePlacement(PlacementKind::kVShape, 4, 3).ok());
  EXPECT_FALSE(MakePlacement(PlacementKind::kLooped, 0, 2).ok());
  absl::StatusOr<Placement> looped = MakePlacement(PlacementKind::kLooped, 3, 2);
  ASSERT_TRUE(looped.ok());
  EXPECT_EQ(looped->OwnerOf(4), 1);
  EXPECT_EQ(looped->LocalIndexOf(4), 1);
  absl::StatusOr<int> owner = CheckedOwnerOf(*looped, 6);
  ASSERT_FALSE(owner.ok());
  EXPECT_EQ(owner.status().message(), "chunk 6 is out of range [0, 6)");
}

}  // namespace
}  // namespace pipetrain::schedule
