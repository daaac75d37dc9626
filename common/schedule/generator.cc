#include "common/schedule/generator.h"

#include <algorithm>
#include <deque>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/util/checked_math.h"
#include "common/util/status_macros.h"

namespace pipetrain::schedule {
namespace {

// Appends actions to one rank's list.
class ActionList {
 public:
  explicit ActionList(size_t reserve) { actions_.reserve(reserve); }

  void Add(Op op, int mb, int chunk) { actions_.push_back(Action{op, mb, chunk}); }
  std::vector<Action> Take() { return std::move(actions_); }

 private:
  std::vector<Action> actions_;
};

// GPipe: every forward in micro-batch order, then every backward in micro-batch order (ascending,
// so that weight gradients accumulate in the same order under every schedule).
std::vector<Action> GPipeWorker(int m, int w) {
  ActionList list(2 * static_cast<size_t>(m));
  for (int mb = 0; mb < m; ++mb) list.Add(Op::kForward, mb, w);
  for (int mb = 0; mb < m; ++mb) list.Add(Op::kBackward, mb, w);
  return list.Take();
}

// 1F1B: `warmup` forwards (capped at M), then one forward and one backward per step until the
// forwards run out, then the remaining backwards. Plain 1F1B warms up with S-w-1 forwards;
// 1F1B-overlap with 2(S-w-1)+1, so that each steady (F, B) pair's B has its input gradient
// in flight while the F computes.
std::vector<Action> OneFOneBWorker(int m, int w, int warmup_forwards) {
  ActionList list(2 * static_cast<size_t>(m));
  const int warmup = std::min(warmup_forwards, m);
  int f = 0;
  int b = 0;
  for (int k = 0; k < warmup; ++k) list.Add(Op::kForward, f++, w);
  for (int k = warmup; k < m; ++k) {
    list.Add(Op::kForward, f++, w);
    list.Add(Op::kBackward, b++, w);
  }
  while (b < m) list.Add(Op::kBackward, b++, w);
  return list.Take();
}

// Megatron interleaved 1F1B on the looped placement (rank w holds chunks w, w+S, ...).
// Micro-batches run in groups of S: for each group, the forwards visit local chunk 0 for the S
// micro-batches of the group, then local chunk 1, ...; the backwards follow the same table with the
// local chunks reversed. Rank w runs min(2(S-w-1) + (V-1)S + extra_warmup, MV) warm-up
// forwards, then pairs (next forward, next backward), then drains the backwards. Requires
// M % S == 0. Interleaved-overlap is the same order with one more warm-up forward (extra_warmup
// 1), which makes every steady pair an overlapped (F, B) pair.
std::vector<Action> InterleavedWorker(int s, int m, int v, int w, int extra_warmup) {
  const int total = m * v;
  // Entry k of the table: (micro-batch, local chunk index).
  std::vector<std::pair<int, int>> table;
  table.reserve(total);
  for (int group = 0; group < m; group += s) {
    for (int local = 0; local < v; ++local) {
      for (int mb = group; mb < group + s; ++mb) table.emplace_back(mb, local);
    }
  }
  auto forward = [&](ActionList& list, int k) {
    list.Add(Op::kForward, table[k].first, table[k].second * s + w);
  };
  auto backward = [&](ActionList& list, int k) {
    list.Add(Op::kBackward, table[k].first, (v - 1 - table[k].second) * s + w);
  };
  const int warmup = std::min(2 * (s - w - 1) + (v - 1) * s + extra_warmup, total);
  ActionList list(2 * static_cast<size_t>(total));
  for (int k = 0; k < warmup; ++k) forward(list, k);
  for (int k = warmup; k < total; ++k) {
    forward(list, k);
    backward(list, k - warmup);
  }
  for (int k = total - warmup; k < total; ++k) backward(list, k);
  return list.Take();
}

// ZB-H1: 1F1B with every backward split into I and W. Rank w runs min(S-w-1, M) warm-up
// forwards, then steps (F, I) where step k also runs W(k-w) once k >= w, so rank w holds back w
// weight gradients; the cool-down runs (I, oldest W) pairs and then the deferred Ws, which fill
// the bubble that 1F1B leaves at the end. Peak stash stays at S (1F1B's worst rank).
std::vector<Action> ZbH1Worker(int s, int m, int w) {
  ActionList list(3 * static_cast<size_t>(m));
  const int warmup = std::min(s - w - 1, m);
  const int lag = w;
  int f = 0;
  int i = 0;
  int wg = 0;
  for (int k = 0; k < warmup; ++k) list.Add(Op::kForward, f++, w);
  for (int k = 0; k < m - warmup; ++k) {
    list.Add(Op::kForward, f++, w);
    list.Add(Op::kInputGrad, i++, w);
    if (k >= lag) list.Add(Op::kWeightGrad, wg++, w);
  }
  while (i < m) {
    list.Add(Op::kInputGrad, i++, w);
    list.Add(Op::kWeightGrad, wg++, w);
  }
  while (wg < m) list.Add(Op::kWeightGrad, wg++, w);
  return list.Take();
}

// Per-rank counters of a schedule over two chunks per rank. For the V-shape, local chunk 0 is
// chunk w (the way down) and local chunk 1 is chunk 2S-1-w (the way back up), and both run all M
// micro-batches. The second constructor names the two chunks and the micro-batches each runs
// (`m` of them from `first_mb[local]` on), for the bidirectional placement.
class VShapeWorker {
 public:
  VShapeWorker(int s, int m, int w) : VShapeWorker(m, {w, 2 * s - 1 - w}, {0, 0}) {}
  VShapeWorker(int m, std::pair<int, int> chunks, std::pair<int, int> first_mb)
      : m_(m),
        chunk_{chunks.first, chunks.second},
        first_mb_{first_mb.first, first_mb.second},
        list_(6 * size_t{1} * m) {}

  int forwards(int local) const { return f_[local]; }
  int input_grads(int local) const { return i_[local]; }
  int weight_grads(int local) const { return w_[local]; }

  // F of the next micro-batch on `local`; no-op once all M ran.
  void F(int local) {
    if (f_[local] < m_) Add(Op::kForward, local, f_[local]++);
  }
  // I of the next micro-batch on `local` whose F ran; no-op if none. For the lower chunk, the I of
  // the upper chunk for the same micro-batch comes first (its gradient is this I's input).
  void I(int local) {
    if (local == 0 && i_[0] >= i_[1]) I(1);
    if (i_[local] < f_[local]) Add(Op::kInputGrad, local, i_[local]++);
  }
  // W of the oldest micro-batch on `local` whose I ran; no-op if none.
  void W(int local) {
    if (w_[local] < i_[local]) Add(Op::kWeightGrad, local, w_[local]++);
  }
  // Full backward of the next micro-batch on `local`.
  void B(int local) {
    Add(Op::kBackward, local, i_[local]);
    ++i_[local];
    ++w_[local];
  }
  // I of the next micro-batch on `local`, its W queued for PendingW().
  void DeferredI(int local) {
    pending_.emplace_back(first_mb_[local] + i_[local], chunk_[local]);
    Add(Op::kInputGrad, local, i_[local]++);
  }
  // W of the oldest I queued by DeferredI (over both chunks).
  void PendingW() {
    if (pending_.empty()) return;
    list_.Add(Op::kWeightGrad, pending_.front().first, pending_.front().second);
    pending_.pop_front();
  }
  std::vector<Action> Take() { return list_.Take(); }

 private:
  // Appends `op` for the `k`-th micro-batch of local chunk `local`.
  void Add(Op op, int local, int k) { list_.Add(op, first_mb_[local] + k, chunk_[local]); }

  const int m_;
  const int chunk_[2];
  const int first_mb_[2];
  int f_[2] = {0, 0};
  int i_[2] = {0, 0};  // Input gradients done (by I or B).
  int w_[2] = {0, 0};  // Weight gradients done (by W or B).
  std::deque<std::pair<int, int>> pending_;
  ActionList list_;
};

// ZB-V (zero-bubble V schedule, every backward split into I and W). Rank w:
//   1. 2(S-w)-1 forwards on the lower chunk;
//   2. w times: F upper, F lower;
//   3. S-w times: F upper, I upper, W upper;
//   4. while forwards remain: F lower, I lower, W lower, F upper, I upper, W upper;
//   5. w times: I lower, I upper;   6. S-w times: I lower, W lower;
//   7. the remaining Is, then the remaining Ws (upper chunk first).
// An action with nothing left to run is skipped (e.g. step 4's last rounds have no forwards left
// on the lower chunk). With F = I = W per chunk and M >= 2S the makespan is 6M + S - 1 chunk
// steps, the lower bound of any V-shape plan; at most 2S chunk activations are stashed per rank
// (1F1B's S full-size ones).
std::vector<Action> ZbVWorker(int s, int m, int w) {
  VShapeWorker x(s, m, w);
  for (int k = 0; k < 2 * (s - w) - 1; ++k) x.F(0);
  for (int k = 0; k < w; ++k) {
    x.F(1);
    x.F(0);
  }
  for (int k = 0; k < s - w; ++k) {
    x.F(1);
    x.I(1);
    x.W(1);
  }
  while (x.forwards(1) < x.forwards(0) || x.forwards(0) < m) {
    x.F(0);
    x.I(0);
    x.W(0);
    x.F(1);
    x.I(1);
    x.W(1);
  }
  for (int k = 0; k < w; ++k) {
    x.I(0);
    x.I(1);
  }
  for (int k = 0; k < s - w; ++k) {
    x.I(0);
    x.W(0);
  }
  while (x.input_grads(1) < m) x.I(1);
  while (x.input_grads(0) < m) x.I(0);
  while (x.weight_grads(1) < m) x.W(1);
  while (x.weight_grads(0) < m) x.W(0);
  return x.Take();
}

// DeepSeek's DualPipe phases for one rank, `rank` of `ranks`, over its chunks 0 (reached first
// by its micro-batches) and 1; `steady` is the number of rounds of step 4. Each overlapped pair of
// the reference (a forward of one chunk computed with a backward of the other) is two
// consecutive actions, forward first:
//   1. 2(ranks-rank-1) F0;                 2. rank+1 times: F0, F1;
//   3. ranks-rank-1 times: I1, W1, F1;     4. `steady` times: (F0, B1), (F1, B0);
//   5. ranks-rank-1 times: B1, (F1, B0);   6. rank+1 times: B1, B0, where from the middle step
//      on the backwards are split (I now, W queued);
//   7. ranks-rank-1 times: queued W, I0 (W queued);   8. the queued Ws.
std::vector<Action> DualPipePhases(VShapeWorker x, int ranks, int rank, int steady) {
  for (int k = 0; k < 2 * (ranks - rank - 1); ++k) x.F(0);
  for (int k = 0; k < rank + 1; ++k) {
    x.F(0);
    x.F(1);
  }
  for (int k = 0; k < ranks - rank - 1; ++k) {
    x.DeferredI(1);
    x.PendingW();
    x.F(1);
  }
  for (int k = 0; k < steady; ++k) {
    x.F(0);
    x.B(1);
    x.F(1);
    x.B(0);
  }
  for (int k = 0; k < ranks - rank - 1; ++k) {
    x.B(1);
    x.F(1);
    x.B(0);
  }
  const int steps = rank + 1;
  bool split = false;
  for (int k = 0; k < steps; ++k) {
    if (k == steps / 2 && rank % 2 == 1) split = true;
    if (split) {
      x.DeferredI(1);
    } else {
      x.B(1);
    }
    if (k == steps / 2 && rank % 2 == 0) split = true;
    if (split) {
      x.DeferredI(0);
    } else {
      x.B(0);
    }
  }
  for (int k = 0; k < ranks - rank - 1; ++k) {
    x.PendingW();
    x.DeferredI(0);
  }
  for (int k = 0; k < rank + 1; ++k) x.PendingW();
  return x.Take();
}

// DualPipeV (DeepSeek's V-shape DualPipe): the phases above with ranks = S, rank = w, chunk 0 =
// the lower chunk w, chunk 1 = the upper chunk 2S-1-w, and M-2S+w+1 steady rounds, so it needs
// M >= 2S-1.
std::vector<Action> DualPipeVWorker(int s, int m, int w) {
  return DualPipePhases(VShapeWorker(s, m, w), s, w, m - 2 * s + w + 1);
}

// Bidirectional DualPipe (DeepSeek) on the bidirectional placement: the first M/2 micro-batches
// run down through chunks 0..S-1, the others up through chunks S..2S-1. Each rank has an
// "early" chunk (phase 0: down chunk w for w < S/2, else up chunk 2S-1-w) and a "late" one (phase
// 1), each passed by M/2 micro-batches, and runs the phases above with ranks = S/2, rank =
// min(w, S-1-w) and M/2-S+rank+1 steady rounds. Needs S even, M even and M >= 2S-2.
std::vector<Action> DualPipeWorker(int s, int m, int w) {
  const int half = m / 2;
  const int rank = std::min(w, s - 1 - w);
  const int down = w;
  const int up = 2 * s - 1 - w;
  VShapeWorker x = w < s / 2 ? VShapeWorker(half, {down, up}, {0, half})
                             : VShapeWorker(half, {up, down}, {half, 0});
  return DualPipePhases(std::move(x), s / 2, rank, half - s + rank + 1);
}

std::vector<Action> WorkerActions(const ScheduleParams& p, int w) {
  switch (p.kind) {
    case ScheduleKind::kGPipe:
      return GPipeWorker(p.microbatches, w);
    case ScheduleKind::kOneFOneB:
      return OneFOneBWorker(p.microbatches, w, p.stages - w - 1);
    case ScheduleKind::kOneFOneBOverlap:
      return OneFOneBWorker(p.microbatches, w, 2 * (p.stages - w - 1) + 1);
    case ScheduleKind::kInterleaved:
      return InterleavedWorker(p.stages, p.microbatches, p.virtual_stages, w, 0);
    case ScheduleKind::kInterleavedOverlap:
      return InterleavedWorker(p.stages, p.microbatches, p.virtual_stages, w, 1);
    case ScheduleKind::kZbH1:
      return ZbH1Worker(p.stages, p.microbatches, w);
    case ScheduleKind::kZbV:
      return ZbVWorker(p.stages, p.microbatches, w);
    case ScheduleKind::kDualPipeV:
      return DualPipeVWorker(p.stages, p.microbatches, w);
    case ScheduleKind::kDualPipe:
      return DualPipeWorker(p.stages, p.microbatches, w);
  }
  return {};
}

}  // namespace

int DefaultVirtualStages(ScheduleKind kind) {
  return PlacementKindFor(kind) == PlacementKind::kLinear ? 1 : 2;
}

absl::Status CheckScheduleParams(const ScheduleParams& p) {
  const absl::string_view name = ScheduleKindName(p.kind);
  const int s = p.stages;
  const int m = p.microbatches;
  const int v = p.virtual_stages;
  if (s < 1) return absl::InvalidArgumentError(absl::StrCat("stages must be >= 1 (got ", s, ")"));
  if (m < 1) {
    return absl::InvalidArgumentError(absl::StrCat("microbatches must be >= 1 (got ", m, ")"));
  }
  if (v < 1) {
    return absl::InvalidArgumentError(absl::StrCat("virtual stages must be >= 1 (got ", v, ")"));
  }
  // Each factor fits in an int; their product need not fit in 64 bits.
  const std::optional<int64_t> svm = util::CheckedProduct({s, v, m});
  if (!svm.has_value() || *svm > kMaxChunkMicrobatches) {
    return absl::InvalidArgumentError(absl::StrCat("stages*virtual*microbatches (",
                                                   util::CheckedToString(svm),
                                                   ") exceeds the limit ", kMaxChunkMicrobatches));
  }
  switch (p.kind) {
    case ScheduleKind::kGPipe:
    case ScheduleKind::kOneFOneB:
    case ScheduleKind::kZbH1:
    case ScheduleKind::kOneFOneBOverlap:
      if (v != 1) {
        return absl::InvalidArgumentError(absl::StrCat(
            name, " holds one chunk per rank: virtual stages must be 1 (got ", v, ")"));
      }
      break;
    case ScheduleKind::kInterleaved:
    case ScheduleKind::kInterleavedOverlap: {
      const absl::string_view title =
          p.kind == ScheduleKind::kInterleaved ? "interleaved 1F1B" : "interleaved-overlap";
      const absl::string_view plain =
          p.kind == ScheduleKind::kInterleaved ? "1f1b" : "1f1b-overlap";
      if (v < 2) {
        return absl::InvalidArgumentError(absl::StrCat(title, " needs virtual stages >= 2 (got ", v,
                                                       "); with one chunk per rank use ", plain));
      }
      if (m < s) {
        return absl::InvalidArgumentError(
            absl::StrCat(title, " needs microbatches (", m, ") >= stages (", s, ")"));
      }
      if (m % s != 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(title, " needs microbatches (", m, ") to be a multiple of stages (", s,
                         "): Megatron's order runs micro-batches in groups of S"));
      }
      break;
    }
    case ScheduleKind::kDualPipe:
      if (v != 2) {
        return absl::InvalidArgumentError(absl::StrCat(
            "dualpipe holds two chunks per rank: virtual stages must be 2 (got ", v, ")"));
      }
      if (s % 2 != 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("dualpipe needs an even number of stages (got ", s,
                         "): it pairs rank w with rank S-1-w; for odd S use dualpipe-v"));
      }
      if (m % 2 != 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("dualpipe needs an even number of microbatches (got ", m,
                         "): half enter from each end"));
      }
      if (m < 2 * s - 2) {
        return absl::InvalidArgumentError(
            absl::StrCat("dualpipe needs microbatches (", m, ") >= 2*stages-2 (", 2 * s - 2, ")"));
      }
      break;
    case ScheduleKind::kZbV:
    case ScheduleKind::kDualPipeV:
      if (v != 2) {
        return absl::InvalidArgumentError(absl::StrCat(
            name, " uses the V-shape placement: virtual stages must be 2 (got ", v, ")"));
      }
      if (p.kind == ScheduleKind::kDualPipeV && m < 2 * s - 1) {
        return absl::InvalidArgumentError(absl::StrCat("dualpipe-v needs microbatches (", m,
                                                       ") >= 2*stages-1 (", 2 * s - 1, ")"));
      }
      break;
  }
  return absl::OkStatus();
}

absl::Status CheckExecutable(ScheduleKind kind) {
  // Every schedule runs: dualpipe on two copies of the stages (docs/schedules.md, "DualPipe").
  (void)kind;
  return absl::OkStatus();
}

absl::StatusOr<Placement> PlacementFor(const ScheduleParams& params) {
  PT_RETURN_IF_ERROR(CheckScheduleParams(params));
  return MakePlacement(PlacementKindFor(params.kind), params.stages, params.virtual_stages);
}

absl::StatusOr<std::vector<Action>> GenerateWorkerActions(const ScheduleParams& params,
                                                          int worker) {
  PT_RETURN_IF_ERROR(CheckScheduleParams(params));
  if (worker < 0 || worker >= params.stages) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", worker, " is out of range [0, ", params.stages, ")"));
  }
  return WorkerActions(params, worker);
}

absl::StatusOr<Plan> GenerateSchedule(const ScheduleParams& params) {
  PT_ASSIGN_OR_RETURN(Placement placement, PlacementFor(params));
  Plan plan;
  plan.kind = params.kind;
  plan.microbatches = params.microbatches;
  plan.placement = placement;
  plan.actions.reserve(params.stages);
  for (int w = 0; w < params.stages; ++w) plan.actions.push_back(WorkerActions(params, w));
  return plan;
}

}  // namespace pipetrain::schedule
