#include "common/schedule/validator.h"

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/schedule/generator.h"
#include "common/schedule/plan_execution.h"
#include "common/util/status_macros.h"

namespace pipetrain::schedule {
namespace {

constexpr int32_t kAbsent = -1;

std::string At(int worker, int64_t position, const Action& action) {
  return absl::StrCat("rank ", worker, " position ", position, ": ", ActionToString(action));
}

}  // namespace

absl::Status CheckPlanStructure(const Plan& plan) {
  absl::Status placement_status = ValidatePlacement(plan.placement);
  if (!placement_status.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("plan placement: ", placement_status.message()));
  }
  const int s = plan.stages();
  const int c_count = plan.num_chunks();
  const int m = plan.microbatches;
  if (m < 1) {
    return absl::InvalidArgumentError(absl::StrCat("plan microbatches must be >= 1 (got ", m, ")"));
  }
  if (static_cast<int>(plan.actions.size()) != s) {
    return absl::InvalidArgumentError(
        absl::StrCat("plan has ", plan.actions.size(), " action lists for ", s, " ranks"));
  }
  if (static_cast<long long>(m) * c_count > kMaxChunkMicrobatches) {
    return absl::InvalidArgumentError(absl::StrCat("plan has ", static_cast<long long>(m) * c_count,
                                                   " (micro-batch, chunk) pairs; the limit is ",
                                                   kMaxChunkMicrobatches));
  }
  const size_t keys = static_cast<size_t>(m) * c_count;
  // Position of each action of (mb, chunk), by op; kAbsent if none.
  std::vector<int32_t> pos_f(keys, kAbsent), pos_b(keys, kAbsent), pos_i(keys, kAbsent),
      pos_w(keys, kAbsent);
  for (int w = 0; w < s; ++w) {
    const std::vector<Action>& list = plan.actions[w];
    if (list.size() > static_cast<size_t>(INT32_MAX)) {
      return absl::InvalidArgumentError(absl::StrCat("rank ", w, " has too many actions"));
    }
    for (size_t p = 0; p < list.size(); ++p) {
      const Action& a = list[p];
      if (a.mb < 0 || a.mb >= m) {
        return absl::InvalidArgumentError(
            absl::StrCat(At(w, p, a), " has micro-batch ", a.mb, " out of range [0, ", m, ")"));
      }
      if (a.chunk < 0 || a.chunk >= c_count) {
        return absl::InvalidArgumentError(
            absl::StrCat(At(w, p, a), " has chunk ", a.chunk, " out of range [0, ", c_count, ")"));
      }
      const int owner = plan.placement.OwnerOf(a.chunk);
      if (owner != w) {
        return absl::InvalidArgumentError(absl::StrCat(
            At(w, p, a), " runs chunk ", a.chunk, ", which the ",
            PlacementKindName(plan.placement.kind), " placement puts on rank ", owner));
      }
      if (a.chunk < plan.RouteBegin(a.mb) || a.chunk >= plan.RouteEnd(a.mb)) {
        return absl::InvalidArgumentError(
            absl::StrCat(At(w, p, a), " runs chunk ", a.chunk, ", which micro-batch ", a.mb,
                         " does not pass through: the ", PlacementKindName(plan.placement.kind),
                         " placement routes it through chunks [", plan.RouteBegin(a.mb), ", ",
                         plan.RouteEnd(a.mb), ")"));
      }
      const size_t k = static_cast<size_t>(a.mb) * c_count + a.chunk;
      std::vector<int32_t>& slots = a.op == Op::kForward     ? pos_f
                                    : a.op == Op::kBackward  ? pos_b
                                    : a.op == Op::kInputGrad ? pos_i
                                                             : pos_w;
      if (slots[k] != kAbsent) {
        return absl::InvalidArgumentError(
            absl::StrCat(At(w, p, a), " is a duplicate (first at position ", slots[k], ")"));
      }
      slots[k] = static_cast<int32_t>(p);
    }
  }

  for (int mb = 0; mb < m; ++mb) {
    for (int c = plan.RouteBegin(mb); c < plan.RouteEnd(mb); ++c) {
      const size_t k = static_cast<size_t>(mb) * c_count + c;
      const int w = plan.placement.OwnerOf(c);
      if (pos_f[k] == kAbsent) {
        return absl::InvalidArgumentError(
            absl::StrCat("rank ", w, ": missing ", ActionToString({Op::kForward, mb, c})));
      }
      if (pos_b[k] != kAbsent && (pos_i[k] != kAbsent || pos_w[k] != kAbsent)) {
        const int32_t other = pos_i[k] != kAbsent ? pos_i[k] : pos_w[k];
        const Op other_op = pos_i[k] != kAbsent ? Op::kInputGrad : Op::kWeightGrad;
        return absl::InvalidArgumentError(absl::StrCat(
            At(w, pos_b[k], {Op::kBackward, mb, c}), " repeats the backward already split into ",
            ActionToString({other_op, mb, c}), " at position ", other,
            "; use either B or I and W"));
      }
      if (pos_b[k] == kAbsent && pos_i[k] == kAbsent && pos_w[k] == kAbsent) {
        return absl::InvalidArgumentError(absl::StrCat("rank ", w, ": missing the backward of (mb=",
                                                       mb, ", chunk=", c, "): needs B or I and W"));
      }
      if (pos_i[k] != kAbsent && pos_w[k] == kAbsent) {
        return absl::InvalidArgumentError(absl::StrCat("rank ", w, ": missing ",
                                                       ActionToString({Op::kWeightGrad, mb, c}),
                                                       " for the I at position ", pos_i[k]));
      }
      if (pos_w[k] != kAbsent && pos_i[k] == kAbsent) {
        return absl::InvalidArgumentError(absl::StrCat(At(w, pos_w[k], {Op::kWeightGrad, mb, c}),
                                                       " has no I(mb=", mb, ", chunk=", c,
                                                       ") before it"));
      }
      const bool full = pos_b[k] != kAbsent;
      const int32_t backward = full ? pos_b[k] : pos_i[k];
      if (backward < pos_f[k]) {
        return absl::InvalidArgumentError(
            absl::StrCat(At(w, backward, {full ? Op::kBackward : Op::kInputGrad, mb, c}),
                         " runs before its F at position ", pos_f[k]));
      }
      if (!full && pos_w[k] < pos_i[k]) {
        return absl::InvalidArgumentError(absl::StrCat(At(w, pos_w[k], {Op::kWeightGrad, mb, c}),
                                                       " runs before its I at position ",
                                                       pos_i[k]));
      }
    }
  }

  // Per chunk, the micro-batch and position of the latest weight-gradient accumulation.
  std::vector<int32_t> last_mb(c_count, kAbsent);
  std::vector<int32_t> last_pos(c_count, kAbsent);
  std::vector<Op> last_op(c_count, Op::kBackward);
  for (int w = 0; w < s; ++w) {
    const std::vector<Action>& list = plan.actions[w];
    for (size_t p = 0; p < list.size(); ++p) {
      const Action& a = list[p];
      if (a.op != Op::kBackward && a.op != Op::kWeightGrad) continue;
      if (last_mb[a.chunk] > a.mb) {
        return absl::InvalidArgumentError(absl::StrCat(
            At(w, p, a), " accumulates weight gradients after ",
            ActionToString({last_op[a.chunk], last_mb[a.chunk], a.chunk}), " at position ",
            last_pos[a.chunk], "; per chunk, B and W must run in increasing micro-batch order"));
      }
      last_mb[a.chunk] = a.mb;
      last_pos[a.chunk] = static_cast<int32_t>(p);
      last_op[a.chunk] = a.op;
    }
  }
  return absl::OkStatus();
}

absl::Status ValidatePlan(const Plan& plan) {
  PT_RETURN_IF_ERROR(CheckPlanStructure(plan));
  std::vector<std::vector<double>> unit(plan.actions.size());
  for (size_t w = 0; w < plan.actions.size(); ++w) unit[w].assign(plan.actions[w].size(), 1.0);
  absl::StatusOr<std::vector<std::vector<TimedAction>>> run =
      internal::ExecuteInOrder(plan, unit, {});
  return run.status();
}

}  // namespace pipetrain::schedule
