// JobShape: a job's stage and replica counts (R x S workers), and the one function that chooses
// the shape a job grows to when idle workers are registered (docs/scaling.md, "Jobs that change
// shape").
#ifndef PIPETRAIN_SERVER_COORDINATOR_JOB_SHAPE_H_
#define PIPETRAIN_SERVER_COORDINATOR_JOB_SHAPE_H_

#include <optional>
#include <string>

#include "pipetrain/v1/coordinator.pb.h"

namespace pipetrain::coordinator {

struct JobShape {
  int stages = 1;    // S, >= 1.
  int replicas = 1;  // R, >= 1.

  int workers() const { return stages * replicas; }
  bool operator==(const JobShape& o) const { return stages == o.stages && replicas == o.replicas; }
  bool operator!=(const JobShape& o) const { return !(*this == o); }
};

// The shape `spec` describes (spec.replicas 0 counts as 1).
JobShape ShapeOf(const v1::JobSpec& spec);

// "3 stages", or "2 replicas x 3 stages" when R > 1.
std::string ShapeText(const JobShape& shape);

// The largest shape job `spec` may grow to with `idle` more workers (idle >= 0), or nullopt when
// it cannot grow: the most stages S' <= spec.max_stages that R x S' workers allow, the replicas
// unchanged. (Growth in replicas, up to spec.max_replicas, is chosen here too once replicas
// are wired: this function is the only place that decides the next shape.) The caller tries
// fewer stages, down to S + 1, when the schedule or the model refuses S'.
std::optional<JobShape> NextShape(const v1::JobSpec& spec, int idle);

}  // namespace pipetrain::coordinator

#endif  // PIPETRAIN_SERVER_COORDINATOR_JOB_SHAPE_H_
