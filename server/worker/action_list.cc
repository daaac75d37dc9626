#include "server/worker/action_list.h"

#include <algorithm>
#include <array>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/util/status_macros.h"

namespace pipetrain::worker {
namespace {

using schedule::Action;
using schedule::Op;

// The positions of the F, B, I and W of one (micro-batch, local chunk) in the list; -1: not seen.
enum Slot { kF, kB, kI, kW };
using Positions = std::array<int64_t, 4>;

// Per local chunk: the micro-batch and position of the last action that accumulated weight
// gradients (B or W); -1: none yet.
struct LastWeight {
  int mb = -1;
  int64_t position = -1;
};

// INVALID_ARGUMENT "<ActionAt(i, a)>: <what>".
absl::Status ErrorAt(size_t i, const Action& a, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(ActionAt(i, a), ": ", what));
}

// Checks that every action is on a chunk held here and has a micro-batch in [0, number of
// actions); returns M, 1 + the largest micro-batch.
absl::StatusOr<int> CountMicrobatches(const std::vector<Action>& actions,
                                      const std::vector<int>& local_of_chunk) {
  const int num_chunks = static_cast<int>(local_of_chunk.size());
  // Every micro-batch needs an F per chunk, so M <= number of actions: bounds the tables of
  // CheckActionList.
  const int64_t mb_limit = static_cast<int64_t>(actions.size());
  int m = 0;
  for (size_t i = 0; i < actions.size(); ++i) {
    const Action& a = actions[i];
    if (a.chunk < 0 || a.chunk >= num_chunks || local_of_chunk[a.chunk] < 0) {
      return ErrorAt(i, a, absl::StrCat("chunk ", a.chunk, " is not held by this worker"));
    }
    if (a.mb < 0 || a.mb >= mb_limit) {
      return ErrorAt(i, a, absl::StrCat("micro-batch ", a.mb, " is outside [0, ", mb_limit, ")"));
    }
    m = std::max(m, a.mb + 1);
  }
  return m;
}

// Records action `i` (= `a`) in `p`, the positions of its (micro-batch, chunk): one F; then one
// B or one I; one W, after the I and only without a B.
absl::Status RecordPosition(size_t i, const Action& a, Positions* p) {
  Positions& pos = *p;
  const int64_t here = static_cast<int64_t>(i);
  switch (a.op) {
    case Op::kForward:
      if (pos[kF] >= 0) {
        return ErrorAt(i, a, absl::StrCat("second forward (first at position ", pos[kF], ")"));
      }
      pos[kF] = here;
      break;
    case Op::kBackward:
    case Op::kInputGrad:
      if (pos[kF] < 0) return ErrorAt(i, a, "runs before the forward of its micro-batch and chunk");
      if (pos[kB] >= 0 || pos[kI] >= 0) {
        return ErrorAt(
            i, a,
            absl::StrCat("second backward (first at position ", std::max(pos[kB], pos[kI]), ")"));
      }
      pos[a.op == Op::kBackward ? kB : kI] = here;
      break;
    case Op::kWeightGrad:
      if (pos[kB] >= 0) return ErrorAt(i, a, absl::StrCat("after a full B at position ", pos[kB]));
      if (pos[kI] < 0) return ErrorAt(i, a, "runs before the I of its micro-batch and chunk");
      if (pos[kW] >= 0) {
        return ErrorAt(i, a, absl::StrCat("second W (first at position ", pos[kW], ")"));
      }
      pos[kW] = here;
      break;
  }
  return absl::OkStatus();
}

// Checks that action `i` (= `a`, a B or a W) accumulates its chunk's weight gradients after
// those of every lower micro-batch, and records it in `last` (its chunk's).
absl::Status CheckWeightOrder(size_t i, const Action& a, LastWeight* last) {
  if (a.mb <= last->mb) {
    return ErrorAt(i, a,
                   absl::StrCat("accumulates weight gradients after micro-batch ", last->mb,
                                " did at position ", last->position,
                                "; they must accumulate in increasing micro-batch order for "
                                "bitwise equality"));
  }
  last->mb = a.mb;
  last->position = static_cast<int64_t>(i);
  return absl::OkStatus();
}

// Checks that every (micro-batch, local chunk) of [0, m) x chunk_of_local has an F, and a B or
// an I and a W; `pos` is indexed by mb * (number of local chunks) + local chunk.
absl::Status CheckComplete(const std::vector<Positions>& pos, int m,
                           const std::vector<int>& chunk_of_local, const ChunkRoutes* routes) {
  const size_t local_chunks = chunk_of_local.size();
  for (int mb = 0; mb < m; ++mb) {
    for (size_t local = 0; local < local_chunks; ++local) {
      if (routes != nullptr && !routes->OnRoute(mb, m, chunk_of_local[local])) continue;
      const Positions& p = pos[static_cast<size_t>(mb) * local_chunks + local];
      const std::string what = absl::StrCat("(mb=", mb, ", chunk=", chunk_of_local[local], ")");
      if (p[kF] < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("no F", what, " although the actions cover micro-batches [0, ", m, ")"));
      }
      if (p[kB] < 0 && p[kW] < 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            p[kI] < 0 ? "no B or I" : "no W", what, " after its ",
            p[kI] < 0 ? "F at position " : "I at position ", p[kI] < 0 ? p[kF] : p[kI]));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

std::string ActionAt(size_t position, const Action& action) {
  return absl::StrCat("position ", position, " ", schedule::ActionToString(action));
}

absl::StatusOr<int> CheckActionList(const std::vector<Action>& actions,
                                    const std::vector<int>& local_of_chunk,
                                    const ChunkRoutes* routes) {
  if (actions.empty()) return absl::InvalidArgumentError("the action list is empty");
  PT_ASSIGN_OR_RETURN(const int m, CountMicrobatches(actions, local_of_chunk));
  if (routes != nullptr && routes->two_copies() && m % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("the actions cover ", m,
                     " micro-batches; two copies of the stages (dualpipe) need an even number, "
                     "half for each copy"));
  }
  std::vector<int> chunk_of_local;  // [local chunk] -> global chunk.
  for (size_t c = 0; c < local_of_chunk.size(); ++c) {
    const int local = local_of_chunk[c];
    if (local < 0) continue;
    if (static_cast<size_t>(local) >= chunk_of_local.size()) chunk_of_local.resize(local + 1, -1);
    chunk_of_local[local] = static_cast<int>(c);
  }
  const size_t local_chunks = chunk_of_local.size();
  std::vector<Positions> pos(static_cast<size_t>(m) * local_chunks, Positions{-1, -1, -1, -1});
  std::vector<LastWeight> last_weight(local_chunks);
  for (size_t i = 0; i < actions.size(); ++i) {
    const Action& a = actions[i];
    const int local = local_of_chunk[a.chunk];
    if (routes != nullptr && !routes->OnRoute(a.mb, m, a.chunk)) {
      return ErrorAt(i, a,
                     absl::StrCat("is not on its micro-batch's route: micro-batch ", a.mb, " of ",
                                  m, " runs through chunks ", routes->FirstOf(a.mb, m), "..",
                                  routes->LastOf(a.mb, m)));
    }
    PT_RETURN_IF_ERROR(
        RecordPosition(i, a, &pos[static_cast<size_t>(a.mb) * local_chunks + local]));
    if (a.op == Op::kBackward || a.op == Op::kWeightGrad) {
      PT_RETURN_IF_ERROR(CheckWeightOrder(i, a, &last_weight[local]));
    }
  }
  PT_RETURN_IF_ERROR(CheckComplete(pos, m, chunk_of_local, routes));
  return m;
}

}  // namespace pipetrain::worker
