#include "common/schedule/plan_execution.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace pipetrain::schedule::internal {
namespace {

constexpr double kNotYet = -1.0;  // Every real time is >= 0.
constexpr int kMaxReportedWorkers = 8;

}  // namespace

absl::StatusOr<std::vector<std::vector<TimedAction>>> ExecuteInOrder(
    const Plan& plan, const std::vector<std::vector<double>>& durations,
    const std::vector<double>& boundary_delay, const std::vector<std::vector<double>>& output_times,
    const std::vector<double>& worker_start) {
  const int s = plan.stages();
  const int c_count = plan.num_chunks();
  const Placement& placement = plan.placement;
  const size_t keys = static_cast<size_t>(plan.microbatches) * c_count;
  // End of F(mb, c), and end of the B or I of (mb, c) (which produces the input gradient).
  std::vector<double> f_end(keys, kNotYet);
  std::vector<double> g_end(keys, kNotYet);
  auto key = [c_count](const Action& a, int chunk) {
    return static_cast<size_t>(a.mb) * c_count + chunk;
  };
  auto delay = [&](int lower_chunk, int from, int to) {
    if (from == to || boundary_delay.empty()) return 0.0;
    return boundary_delay[lower_chunk];
  };

  std::vector<size_t> pos(s, 0);
  std::vector<double> free_at = worker_start.empty() ? std::vector<double>(s, 0.0) : worker_start;
  std::vector<std::vector<TimedAction>> out(s);
  for (int w = 0; w < s; ++w) out[w].reserve(plan.actions[w].size());
  std::vector<int> queue;
  std::vector<char> queued(s, 1);
  for (int w = s - 1; w >= 0; --w) queue.push_back(w);

  while (!queue.empty()) {
    const int w = queue.back();
    queue.pop_back();
    queued[w] = 0;
    auto wake = [&](int other) {
      if (other != w && !queued[other] && pos[other] < plan.actions[other].size()) {
        queued[other] = 1;
        queue.push_back(other);
      }
    };
    const std::vector<Action>& list = plan.actions[w];
    while (pos[w] < list.size()) {
      const Action& a = list[pos[w]];
      const int c = a.chunk;
      double ready = free_at[w];
      bool available = true;
      switch (a.op) {
        case Op::kForward:
          if (c > plan.RouteBegin(a.mb)) {
            const double e = f_end[key(a, c - 1)];
            available = e != kNotYet;
            ready = std::max(ready, e + delay(c - 1, placement.OwnerOf(c - 1), w));
          }
          break;
        case Op::kBackward:
        case Op::kInputGrad: {
          const double e = f_end[key(a, c)];
          available = e != kNotYet;
          ready = std::max(ready, e);
          if (available && c + 1 < plan.RouteEnd(a.mb)) {
            const double g = g_end[key(a, c + 1)];
            available = g != kNotYet;
            ready = std::max(ready, g + delay(c, placement.OwnerOf(c + 1), w));
          }
          break;
        }
        case Op::kWeightGrad: {
          const double e = g_end[key(a, c)];
          available = e != kNotYet;
          ready = std::max(ready, e);
          break;
        }
      }
      if (!available) break;
      const double end = ready + durations[w][pos[w]];
      const double output = output_times.empty() ? end : ready + output_times[w][pos[w]];
      out[w].push_back(TimedAction{a, ready, end});
      free_at[w] = end;
      ++pos[w];
      if (a.op == Op::kForward) {
        f_end[key(a, c)] = output;
        if (c + 1 < plan.RouteEnd(a.mb)) wake(placement.OwnerOf(c + 1));
      } else if (a.op != Op::kWeightGrad) {
        g_end[key(a, c)] = output;
        if (c > plan.RouteBegin(a.mb)) wake(placement.OwnerOf(c - 1));
      }
    }
  }

  std::vector<std::string> blocked;
  int blocked_count = 0;
  for (int w = 0; w < s; ++w) {
    if (pos[w] >= plan.actions[w].size()) continue;
    ++blocked_count;
    if (blocked_count > kMaxReportedWorkers) continue;
    const Action& a = plan.actions[w][pos[w]];
    const int c = a.chunk;
    std::string waits;
    if (a.op == Op::kForward) {
      waits = absl::StrCat("the activation of ", ActionToString({Op::kForward, a.mb, c - 1}),
                           " on rank ", placement.OwnerOf(c - 1));
    } else if (a.op == Op::kWeightGrad) {
      waits = absl::StrCat(ActionToString({Op::kInputGrad, a.mb, c}), " on rank ", w);
    } else if (f_end[key(a, c)] == kNotYet) {
      waits = absl::StrCat(ActionToString({Op::kForward, a.mb, c}), " on rank ", w);
    } else {
      waits = absl::StrCat("the input gradient of B or I(mb=", a.mb, ", chunk=", c + 1,
                           ") on rank ", placement.OwnerOf(c + 1));
    }
    blocked.push_back(absl::StrCat("rank ", w, " blocked at position ", pos[w], " on ",
                                   ActionToString(a), ", waiting for ", waits));
  }
  if (blocked_count > 0) {
    std::string more;
    if (blocked_count > kMaxReportedWorkers) {
      more = absl::StrCat("; and ", blocked_count - kMaxReportedWorkers, " more ranks");
    }
    return absl::InvalidArgumentError(absl::StrCat(
        "plan deadlocks under in-order execution with non-blocking sends: ", blocked_count, " of ",
        s, " ranks cannot finish: ", absl::StrJoin(blocked, "; "), more));
  }
  return out;
}

}  // namespace pipetrain::schedule::internal
