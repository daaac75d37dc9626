#include "common/schedule/timeline.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"

namespace pipetrain::schedule {

double Timeline::Makespan() const {
  double makespan = 0;
  for (const std::vector<TimedAction>& list : workers) {
    for (const TimedAction& t : list) makespan = std::max(makespan, t.end);
  }
  return makespan;
}

absl::StatusOr<TimelineStats> SummarizeTimeline(const Timeline& timeline,
                                                const std::vector<double>& activation_bytes) {
  const int num_chunks = timeline.placement.num_chunks();
  if (!activation_bytes.empty() && static_cast<int>(activation_bytes.size()) != num_chunks) {
    return absl::InvalidArgumentError(absl::StrCat("activation bytes has ", activation_bytes.size(),
                                                   " entries; the placement has ", num_chunks,
                                                   " chunks"));
  }
  TimelineStats stats;
  stats.makespan = timeline.Makespan();
  stats.workers.resize(timeline.workers.size());
  double total_busy = 0;
  for (size_t w = 0; w < timeline.workers.size(); ++w) {
    WorkerStats& ws = stats.workers[w];
    int stashed = 0;
    double stashed_bytes = 0;
    for (size_t p = 0; p < timeline.workers[w].size(); ++p) {
      const TimedAction& t = timeline.workers[w][p];
      if (t.end < t.start) {
        return absl::InvalidArgumentError(absl::StrCat("rank ", w, " position ", p, ": ",
                                                       ActionToString(t.action), " ends (", t.end,
                                                       ") before it starts (", t.start, ")"));
      }
      const int chunk = t.action.chunk;
      if (chunk < 0 || chunk >= num_chunks) {
        return absl::InvalidArgumentError(
            absl::StrCat("rank ", w, " position ", p, ": ", ActionToString(t.action),
                         " names a chunk out of range [0, ", num_chunks, ")"));
      }
      ws.busy += t.end - t.start;
      const double bytes = activation_bytes.empty() ? 0.0 : activation_bytes[chunk];
      switch (t.action.op) {
        case Op::kForward:
          ++stashed;
          stashed_bytes += bytes;
          ws.peak_activations = std::max(ws.peak_activations, stashed);
          ws.peak_activation_bytes = std::max(ws.peak_activation_bytes, stashed_bytes);
          break;
        case Op::kBackward:
        case Op::kWeightGrad:
          --stashed;
          stashed_bytes -= bytes;
          break;
        case Op::kInputGrad:
          break;
      }
    }
    ws.bubble_fraction = stats.makespan > 0 ? 1.0 - ws.busy / stats.makespan : 0.0;
    total_busy += ws.busy;
  }
  const double capacity = stats.makespan * static_cast<double>(timeline.workers.size());
  stats.bubble_fraction = capacity > 0 ? 1.0 - total_busy / capacity : 0.0;
  return stats;
}

}  // namespace pipetrain::schedule
