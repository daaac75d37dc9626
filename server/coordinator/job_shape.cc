#include "server/coordinator/job_shape.h"

#include <algorithm>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "common/model/grad_tree.h"

namespace pipetrain::coordinator {

std::string JobShape::ToString() const {
  const std::string s = absl::StrCat(stages, stages == 1 ? " stage" : " stages");
  if (replicas == 1) return s;
  return absl::StrCat(s, " x ", replicas, " replicas");
}

JobShape ShapeOf(const v1::JobSpec& spec) {
  return JobShape{std::max(spec.stages(), 1), std::max(spec.replicas(), 1)};
}

std::optional<JobShape> NextShape(const v1::JobSpec& spec, int idle) {
  const JobShape now = ShapeOf(spec);
  if (idle <= 0) return std::nullopt;
  const int workers = now.positions() + idle;
  const absl::StatusOr<model::GradTree> tree = model::GradTree::Create(spec.microbatches());
  int replicas = now.replicas;
  while (tree.ok() && replicas * 2 <= spec.max_replicas() && replicas * 2 * now.stages <= workers &&
         tree->SupportsReplicas(replicas * 2)) {
    replicas *= 2;
  }
  if (replicas > now.replicas) return JobShape{now.stages, replicas};
  // Every replica gets the same stage count: a stage more takes R workers.
  const int stages = std::min(spec.max_stages(), now.stages + idle / now.replicas);
  if (stages <= now.stages) return std::nullopt;
  return JobShape{stages, now.replicas};
}

std::vector<int> ArrangePositions(const std::vector<double>& speeds, JobShape shape) {
  const int n = static_cast<int>(speeds.size());
  std::vector<int> order(n);
  std::iota(order.begin(), order.end(), 0);
  if (shape.replicas <= 1) return order;
  std::stable_sort(order.begin(), order.end(),
                   [&speeds](int a, int b) { return speeds[a] > speeds[b]; });
  std::vector<int> positions(n);
  for (int rank = 0; rank < shape.stages; ++rank) {
    // The group's workers in their original order: replica q gets the q-th of them.
    std::vector<int> group(order.begin() + rank * shape.replicas,
                           order.begin() + (rank + 1) * shape.replicas);
    std::sort(group.begin(), group.end());
    for (int q = 0; q < shape.replicas; ++q) positions[shape.Position(q, rank)] = group[q];
  }
  return positions;
}

std::vector<double> RankSpeeds(const std::vector<double>& speeds, JobShape shape) {
  std::vector<double> ranks(shape.stages, 0.0);
  for (int rank = 0; rank < shape.stages; ++rank) {
    ranks[rank] = speeds[shape.Position(0, rank)];
    for (int q = 1; q < shape.replicas; ++q) {
      ranks[rank] = std::min(ranks[rank], speeds[shape.Position(q, rank)]);
    }
  }
  return ranks;
}

}  // namespace pipetrain::coordinator
